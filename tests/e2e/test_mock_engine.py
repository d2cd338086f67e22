"""weir-mock's engine model: the prefix cache (--prefix-cache-tokens, --prefill-us-per-token) and the bounded
running batch (--max-num-seqs), seen through the openai SDK and vLLM's metric names."""

from __future__ import annotations

import concurrent.futures as cf
import time

import openai

from conftest import metric_value, parse_prometheus, wait_until

FAST = {"x-mock-ttft-ms": "0", "x-mock-itl-ms": "1"}


def client(mock) -> openai.OpenAI:
    return openai.OpenAI(base_url=mock.v1, api_key="test", max_retries=0, timeout=30)


def words(n: int, salt: str) -> str:
    return " ".join(f"{salt}{i}" for i in range(n))


def ttft_s(mock, content: str, system: str = "") -> float:
    """Seconds from the request to its first streamed content."""
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    c = client(mock)  # (made before the clock starts: a busy host took ~0.5 s to make one)
    t0 = time.perf_counter()
    stream = c.chat.completions.create(model="mock-model", messages=msgs, stream=True, max_tokens=2,
                                                  extra_headers=FAST)
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
    assert first is not None
    return first


def test_prefill_is_charged_only_for_the_uncached_prompt(mock):
    m = mock("--prefix-cache-tokens", "4096", "--prefill-us-per-token", "1000")
    shared = words(480, "s")  # ~480 tokens: 480 ms of prefill (wide margins: the machine is shared)
    cold = ttft_s(m, "question one", system=shared)
    warm = ttft_s(m, "question two", system=shared)  # ~18 uncached tokens
    assert cold > 0.48, cold
    assert warm < cold / 3, (cold, warm)
    q, h = m.metric("vllm:prefix_cache_queries_total"), m.metric("vllm:prefix_cache_hits_total")
    # Two prompts of ~490 tokens each; the second finds the 30 full blocks of the system prompt.
    assert 950 <= q <= 1000, q
    assert 30 * 16 - 16 <= h <= 30 * 16 + 16, h
    # Another prefix: a miss, charged again.
    assert ttft_s(m, "question", system=words(480, "t")) > 0.48


def test_the_cache_evicts_least_recently_used_blocks(mock):
    m = mock("--prefix-cache-tokens", "1024", "--prefill-us-per-token", "100")  # 64 blocks
    a, b = words(640, "a"), words(640, "b")  # 40 blocks each: both do not fit
    ttft_s(m, "x", system=a)
    h0 = m.metric("vllm:prefix_cache_hits_total")
    ttft_s(m, "x", system=b)   # evicts most of a
    ttft_s(m, "y", system=a)   # a's first blocks are gone: a miss from the start
    assert m.metric("vllm:prefix_cache_hits_total") == h0
    ttft_s(m, "z", system=a)   # now it is the recent one: a hit
    assert m.metric("vllm:prefix_cache_hits_total") >= h0 + 600


def test_without_a_cache_the_counters_stay_zero(mock):
    """As vLLM with --no-enable-prefix-caching: nothing is queried; the series are still there."""
    m = mock()
    ttft_s(m, "hello there", system=words(100, "s"))
    ttft_s(m, "hello there", system=words(100, "s"))
    text = m.metrics_text()
    assert "vllm:prefix_cache_queries_total{" in text and "vllm:prefix_cache_hits_total{" in text
    assert m.metric("vllm:prefix_cache_queries_total") == 0
    assert m.metric("vllm:prefix_cache_hits_total") == 0


def test_max_num_seqs_bounds_the_batch_and_the_rest_waits(mock):
    m = mock("--max-num-seqs", "2", "--max-tokens", "4")
    # Waves of 1.5 s: the test must see 2 running and 3 waiting during the first, on a loaded machine too.
    slow = {"x-mock-ttft-ms": "1500", "x-mock-itl-ms": "1"}

    # One client, made and used once before the clock starts (an SDK client's making and first request cost
    # far more CPU than the next ones: on a loaded machine, more than a wave).
    c = client(m)
    c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "warm"}], max_tokens=1,
                              extra_headers={"x-mock-ttft-ms": "0", "x-mock-itl-ms": "0"})

    def one(i):
        t0 = time.perf_counter()
        c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": f"q{i}"}],
                                  extra_headers=slow)
        return time.perf_counter() - t0

    with cf.ThreadPoolExecutor(5) as ex:
        futs = [ex.submit(one, i) for i in range(5)]

        def seen():
            s = m.metrics()
            return (metric_value(s, "vllm:num_requests_running") == 2
                    and metric_value(s, "vllm:num_requests_waiting") == 3)
        wait_until(seen, 30, message="2 running and 3 waiting")
        times = sorted(f.result() for f in futs)
    # Three waves of 1.5 s: two, two, one. The lower bounds cannot be beaten; a loaded machine delays every
    # answer alike, so the waves are told apart by the gaps between them, not by a deadline for the first.
    assert times[2] > 2.95 and times[4] > 4.45, times
    assert times[2] - times[1] > 1.2 and times[4] - times[3] > 1.2, times
    s = m.metrics()
    assert metric_value(s, "vllm:num_requests_running") == 0
    assert metric_value(s, "vllm:num_requests_waiting") == 0


def test_a_waiting_request_whose_client_leaves_gives_up_its_place(mock):
    m = mock("--max-num-seqs", "1", "--max-tokens", "2")
    # The first holds the one slot for 2 s: the second, sent once it runs, waits (and leaves after 0.2 s).
    long = {"x-mock-ttft-ms": "2000", "x-mock-itl-ms": "1"}
    with cf.ThreadPoolExecutor(2) as ex:
        first = ex.submit(lambda: client(m).chat.completions.create(
            model="mock-model", messages=[{"role": "user", "content": "a"}], extra_headers=long))
        wait_until(lambda: m.metric("vllm:num_requests_running") == 1, 30)
        c = openai.OpenAI(base_url=m.v1, api_key="t", max_retries=0, timeout=0.2)
        try:
            c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "b"}],
                                      extra_headers=long)
        except openai.APITimeoutError:
            pass
        wait_until(lambda: m.metric("vllm:num_requests_waiting") == 0, 5, message="the waiter left")
        first.result()
    # The slot is free again: the next request runs at once (a slot kept by the waiter that left would block
    # it for good; the bound is generous for a loaded machine, and the client is made before the clock starts).
    c = client(m)
    t0 = time.perf_counter()
    c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "c"}], extra_headers=FAST)
    assert time.perf_counter() - t0 < 5.0
    assert m.metric("vllm:request_success_total", finished_reason="abort") >= 1


def test_kv_cache_usage_is_relative_to_the_cache_capacity(mock):
    m = mock("--prefix-cache-tokens", "1000", "--max-tokens", "4")
    slow = {"x-mock-ttft-ms": "1500", "x-mock-itl-ms": "1"}  # (1.5 s to read the gauge while it runs, loaded too)
    with cf.ThreadPoolExecutor(1) as ex:
        f = ex.submit(lambda: client(m).chat.completions.create(
            model="mock-model", messages=[{"role": "user", "content": words(496, "w")}], extra_headers=slow))
        def usage_while_running():  # (the gauge read in the scrape that shows the request running)
            s = m.metrics()
            return metric_value(s, "vllm:num_requests_running") == 1 and (metric_value(s, "vllm:kv_cache_usage_perc"),)
        (usage,) = wait_until(usage_while_running, 30, message="the request running")
        f.result()
    assert 0.45 <= usage <= 0.55, usage  # 500 prompt tokens of 1000
    assert "vllm:prefix_cache_queries_total{" in m.metrics_text()
