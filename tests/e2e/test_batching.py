"""Micro-batching of /v1/completions (docs/batching.md) against real weir-mock upstreams: compatible
requests within the window share one upstream request with a prompt list, and each client gets
exactly its own stream, byte-identical to what the same request gets unbatched apart from
`created`; failures, clients that leave, and the log line of every member."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading

import httpx
import openai
import pytest

from conftest import wait_until

FAST = ("--ttft-ms", "20", "--itl-ms", "2", "--max-tokens", "8")
# `created`, and the suffix Weir adds to a client's x-request-id upstream (vLLM's ids carry it: "cmpl-ID-<28 hex>",
# where the reference, asked straight with ID, says "cmpl-ID").
CREATED = re.compile(rb'"created":\d+|-[0-9a-f]{28}(?:-\d+)?(?=")')  # (-N: a retry's or fallback's own id)


# Tests that mean a batch of several send exactly max_size members at once (a barrier): the batch leaves when it is
# full, so the window (1 s, the most allowed) only bounds how far apart a loaded machine may start them.
def batch_config(*mocks, window="1s", max_size=4, **pool_extra) -> dict:
    return {
        "pools": {"gpu": {"endpoints": [m.base_url for m in mocks],
                          "batch": {"window": window, "max_size": max_size}, **pool_extra}},
        "default_pool": "gpu",
    }


def upstream_requests(*mocks) -> float:
    return sum(m.metric("vllm:e2e_request_latency_seconds_count") for m in mocks)


def completion_lines(w, n: int) -> list[dict]:
    """The access-log lines of the first `n` completions."""
    def mine(es):
        return [e for e in es if e["path"] == "/v1/completions"]
    return mine(w.wait_log(lambda es: len(mine(es)) >= n))


# One client for the module's requests: httpx.post() builds a client (and its TLS context, ~50 ms of CPU) per call,
# which members started together at a barrier then spend before they send, one after another under the GIL.
_http = httpx.Client(timeout=30)


def raw_completion(base_url: str, body: dict, request_id: str) -> tuple[int, bytes]:
    r = _http.post(base_url + "/v1/completions", json=body, headers={"x-request-id": request_id})
    return r.status_code, r.content


def in_parallel(fn, args: list) -> list:
    """Runs fn(*a) for every a at once (all started before any can finish: a barrier)."""
    barrier = threading.Barrier(len(args))

    def run(a):
        barrier.wait()
        return fn(*a)

    with cf.ThreadPoolExecutor(len(args)) as ex:
        return list(ex.map(run, args))


@pytest.mark.parametrize("stream", [True, False])
def test_members_get_exactly_their_unbatched_bytes(mock, weir, stream):
    up = mock(*FAST)
    reference = mock(*FAST)
    w = weir(config=batch_config(up, max_size=4), workers=1)
    bodies = [{"model": "mock-model", "prompt": f"prompt number {i} " + "word " * i, "max_tokens": 5,
               "stream": stream, "temperature": 0} for i in range(4)]
    if stream:
        for b in bodies:
            b["stream_options"] = {"include_usage": True}
    got = in_parallel(raw_completion, [(w.base_url, b, f"req-{stream}-{i}") for i, b in enumerate(bodies)])
    want = [raw_completion(reference.base_url, b, f"req-{stream}-{i}") for i, b in enumerate(bodies)]
    for (gs, gb), (ws, wb) in zip(got, want):
        assert gs == ws == 200
        assert CREATED.sub(b"", gb) == CREATED.sub(b"", wb)
    # one upstream request for the four
    assert upstream_requests(up) == 1
    assert w.metric("weir_batches_total") == 1
    assert w.metric("weir_batched_requests_total") == 4
    entries = completion_lines(w, 4)
    assert len({e["batch"]["id"] for e in entries}) == 1
    assert sorted(e["batch"]["slot"] for e in entries) == [0, 1, 2, 3]
    for e, b in zip(sorted(entries, key=lambda e: e["request_id"]), bodies):
        assert e["batch"]["size"] == 4
        assert e["status"] == 200
        # each member's own usage: prompts differ in length
        assert e["completion_tokens"] == 5
    assert len({e["prompt_tokens"] for e in entries}) == 4


def test_sixty_four_sdk_clients_over_four_endpoints(mock, weir):
    ups = [mock(*FAST) for _ in range(4)]
    reference = mock(*FAST)
    w = weir(config=batch_config(*ups, window="1s", max_size=16), workers=2)
    c = w.client()
    direct = openai.OpenAI(base_url=reference.v1, api_key="x", max_retries=0)

    def one(i: int) -> tuple[str, str, int]:
        prompt = f"client {i} asks about " + "rivers " * (i % 7)
        if i % 2:
            text = "".join(ch.choices[0].text for ch in c.completions.create(
                model="mock-model", prompt=prompt, max_tokens=6, stream=True) if ch.choices)
        else:
            text = c.completions.create(model="mock-model", prompt=prompt, max_tokens=6).choices[0].text
        want = direct.completions.create(model="mock-model", prompt=prompt, max_tokens=6).choices[0].text
        return text, want, i

    results = in_parallel(one, [(i,) for i in range(64)])
    for text, want, i in results:
        assert text == want, f"client {i}"
    assert w.metric("weir_batched_requests_total") == 64
    assert upstream_requests(*ups) < 64 / 2  # merged: at most half as many upstream requests
    entries = completion_lines(w, 64)
    assert all(e["status"] == 200 and "batch" in e for e in entries)


def test_incompatible_requests_are_not_merged(mock, weir):
    up = mock(*FAST)
    w = weir(config=batch_config(up, window="100ms"), workers=1)
    base = {"model": "mock-model", "prompt": "same", "max_tokens": 3}
    variants = [
        {**base, "temperature": 0},
        {**base, "temperature": 0.5},  # other sampling parameters: another batch
        {**base, "stream": True},  # streamed: another batch
        {**base, "n": 2},  # never merged
        {**base, "echo": True},  # never merged
        {**base, "prompt": ["a", "b"]},  # already a list: never merged
    ]
    got = in_parallel(raw_completion, [(w.base_url, b, f"var-{i}") for i, b in enumerate(variants)])
    assert [s for s, _ in got] == [200] * len(variants)
    entries = {e["request_id"]: e for e in completion_lines(w, len(variants))}
    batches = [entries[f"var-{i}"].get("batch") for i in range(len(variants))]
    assert [b is not None for b in batches] == [True, True, True, False, False, False]
    assert len({b["id"] for b in batches[:3]}) == 3
    assert all(b["size"] == 1 for b in batches[:3])
    # n=2 got both choices, the list both prompts
    assert len(json.loads(got[3][1])["choices"]) == 2
    assert len(json.loads(got[5][1])["choices"]) == 2


def test_a_member_that_leaves_does_not_disturb_the_others(mock, weir):
    up = mock("--ttft-ms", "20", "--itl-ms", "20", "--max-tokens", "30")
    reference = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "30")
    w = weir(config=batch_config(up, max_size=3), workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"leaver {i}", "max_tokens": 30, "stream": True}

    def member(i: int) -> bytes | None:
        with _http.stream("POST", w.base_url + "/v1/completions", json=body(i),
                          headers={"x-request-id": f"leave-{i}"}, timeout=30) as r:
            if i == 1:
                for _ in r.iter_raw():
                    return None  # leaves after its first bytes
            return r.read()

    got = in_parallel(member, [(i,) for i in range(3)])
    for i in (0, 2):
        _, want = raw_completion(reference.base_url, body(i), f"leave-{i}")
        assert CREATED.sub(b"", got[i]) == CREATED.sub(b"", want)
    entries = {e["request_id"]: e for e in completion_lines(w, 3)}
    assert entries["leave-1"]["status"] == 499
    assert entries["leave-0"]["status"] == entries["leave-2"]["status"] == 200
    assert up.aborts() == 0  # the batch went on for the others


def test_when_every_member_leaves_the_upstream_request_is_aborted(mock, weir):
    up = mock("--ttft-ms", "10", "--itl-ms", "50", "--max-tokens", "200")
    w = weir(config=batch_config(up, max_size=2), workers=1)

    def member(i: int) -> None:
        with _http.stream("POST", w.base_url + "/v1/completions",
                          json={"model": "mock-model", "prompt": f"gone {i}", "max_tokens": 200, "stream": True},
                          timeout=30) as r:
            for _ in r.iter_raw():
                return

    in_parallel(member, [(0,), (1,)])
    wait_until(lambda: up.aborts() >= 1, timeout=10, message="the mock saw the batch aborted")
    assert w.metric("weir_batches_aborted_total") == 1
    entries = completion_lines(w, 2)
    assert [e["status"] for e in entries] == [499, 499]


def test_an_upstream_error_before_the_first_token_reaches_every_member(mock, weir):
    up = mock(*FAST, "--error-rate", "1", "--error-status", "500")
    w = weir(config=batch_config(up, max_size=3), workers=1)
    got = in_parallel(raw_completion, [(w.base_url, {"model": "mock-model", "prompt": f"e {i}", "stream": s},
                                        f"err-{i}") for i, s in enumerate([True, False, True])])
    assert [s for s, _ in got] == [500, 500, 500]
    for _, b in got:
        assert "error" in json.loads(b)
    assert upstream_requests(up) <= 2  # one batch per stream flag: never one per member


def test_a_reset_after_tokens_ends_each_stream_in_band(mock, weir):
    up = mock(*FAST, "--reset-after", "3")
    w = weir(config=batch_config(up, max_size=2), workers=1)

    def member(i: int) -> list[str]:
        with _http.stream("POST", w.base_url + "/v1/completions",
                          json={"model": "mock-model", "prompt": f"reset {i}", "stream": True, "max_tokens": 8},
                          timeout=30) as r:
            assert r.status_code == 200
            return [l for l in r.iter_lines() if l.startswith("data: ")]

    for events in in_parallel(member, [(0,), (1,)]):
        texts = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
        assert any("error" in t for t in texts)  # the failure, in-band
        tokens = [t for t in texts if "choices" in t]
        assert 1 <= len(tokens) <= 3
        assert all(t["choices"][0]["index"] == 0 for t in tokens)


# --- request coalescing (pools.X.coalesce) ---

def coalesce_config(*mocks, **pool_extra) -> dict:
    return {"pools": {"gpu": {"endpoints": [m.base_url for m in mocks], "coalesce": True, **pool_extra}},
            "default_pool": "gpu"}


def raw_chat(base_url: str, body: dict, request_id: str) -> tuple[int, bytes]:
    r = _http.post(base_url + "/v1/chat/completions", json=body, headers={"x-request-id": request_id})
    return r.status_code, r.content


def chat_lines(w, n: int) -> list[dict]:
    def mine(es):
        return [e for e in es if e["path"] == "/v1/chat/completions"]
    return mine(w.wait_log(lambda es: len(mine(es)) >= n))


@pytest.mark.parametrize("stream", [True, False])
def test_identical_deterministic_chats_share_one_generation(mock, weir, stream):
    # a long first token: the followers arrive while the leader's generation is in flight (3 s: on a loaded
    # machine too, from the leader seen running)
    up = mock("--ttft-ms", "3000", "--itl-ms", "5", "--max-tokens", "6")
    reference = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")
    w = weir(config=coalesce_config(up), workers=1)
    base = {"model": "mock-model", "messages": [{"role": "user", "content": "the same question"}],
            "temperature": 0, "stream": stream}
    bodies = []
    for i in range(4):
        b = dict(base, user=f"user-{i}")  # client-only members differ
        if stream and i % 2:
            b["stream_options"] = {"include_usage": True}
        bodies.append(b)
    with cf.ThreadPoolExecutor(4) as ex:
        leader = ex.submit(raw_chat, w.base_url, bodies[0], f"co-{stream}-0")
        wait_until(lambda: up.metric("vllm:num_requests_running") >= 1, timeout=10, message="the leader in flight")
        followers = [ex.submit(raw_chat, w.base_url, b, f"co-{stream}-{i}") for i, b in enumerate(bodies) if i]
        got = [leader.result()] + [f.result() for f in followers]
    want = [raw_chat(reference.base_url, b, f"co-{stream}-{i}") for i, b in enumerate(bodies)]
    for (gs, gb), (ws, wb) in zip(got, want):
        assert gs == ws == 200
        assert CREATED.sub(b"", gb) == CREATED.sub(b"", wb)  # its own id, its own usage chunk or none
    assert upstream_requests(up) == 1
    assert w.metric("weir_coalesced_requests_total") == 3
    entries = chat_lines(w, 4)
    assert len({e["batch"]["id"] for e in entries}) == 1
    assert all(e["batch"]["coalesced"] is True and e["status"] == 200 for e in entries)
    assert all(e["completion_tokens"] == 6 for e in entries)


def test_a_late_joiner_gets_the_events_already_sent_then_the_rest(mock, weir):
    # 40 tokens 40 ms apart: the late joiner, sent once the leader's first token is in, has 1.5 s to arrive
    up = mock("--ttft-ms", "5", "--itl-ms", "40", "--max-tokens", "40")
    w = weir(config=coalesce_config(up), workers=1)
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "late"}], "seed": 7, "stream": True}
    first: dict = {}

    def leader():
        with _http.stream("POST", w.base_url + "/v1/chat/completions", json=body,
                          headers={"x-request-id": "lead"}, timeout=30) as r:
            chunks = []
            for part in r.iter_raw():
                chunks.append(part)
                if b'"content":' in b"".join(chunks):
                    first["started"] = True
            return b"".join(chunks)

    with cf.ThreadPoolExecutor(2) as ex:
        lead = ex.submit(leader)
        wait_until(lambda: first.get("started"), timeout=10, message="the leader's first token")
        late = ex.submit(raw_chat, w.base_url, body, "lead")  # same request id: the same stream but for its id
        lead_bytes, (status, late_bytes) = lead.result(), late.result()
    assert status == 200
    # The whole stream, from the role chunk to [DONE]; each member's id its own (the client's with a suffix).
    assert CREATED.sub(b"", late_bytes) == CREATED.sub(b"", lead_bytes)
    assert late_bytes != lead_bytes
    assert upstream_requests(up) == 1


def test_non_deterministic_or_different_requests_are_not_coalesced(mock, weir):
    up = mock(*FAST)
    w = weir(config=coalesce_config(up), workers=1)
    msgs = [{"role": "user", "content": "q"}]
    variants = [
        {"model": "mock-model", "messages": msgs, "temperature": 0.7},  # sampled: never shared
        {"model": "mock-model", "messages": msgs, "temperature": 0.7},
        {"model": "mock-model", "messages": msgs, "temperature": 0, "max_tokens": 3},
        {"model": "mock-model", "messages": msgs, "temperature": 0, "max_tokens": 4},  # another body
    ]
    got = in_parallel(raw_chat, [(w.base_url, b, f"nc-{i}") for i, b in enumerate(variants)])
    assert [s for s, _ in got] == [200] * 4
    assert upstream_requests(up) == 4
    assert w.metric("weir_coalesced_requests_total") == 0


def test_the_leader_leaving_does_not_end_the_followers_stream(mock, weir):
    up = mock("--ttft-ms", "1000", "--itl-ms", "20", "--max-tokens", "20")
    reference = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "20")
    w = weir(config=coalesce_config(up), workers=1)
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "stay"}], "temperature": 0,
            "stream": True}

    def member(i: int):
        with _http.stream("POST", w.base_url + "/v1/chat/completions", json=body,
                          headers={"x-request-id": f"stay-{i}"}, timeout=30) as r:
            if i == 0:
                for _ in r.iter_raw():
                    return None
            return r.read()

    got = in_parallel(member, [(0,), (1,), (2,)])
    for i in (1, 2):
        _, want = raw_chat(reference.base_url, body, f"stay-{i}")
        assert CREATED.sub(b"", got[i]) == CREATED.sub(b"", want)
    assert up.aborts() == 0
    assert upstream_requests(up) == 1


def test_a_batch_refused_for_one_prompt_is_resent_member_by_member(mock, weir):
    # vLLM refuses a whole prompt list when one prompt is too long for the model
    up = mock(*FAST, "--max-model-len", "40")
    reference = mock(*FAST, "--max-model-len", "40")
    w = weir(config=batch_config(up, max_size=3), workers=1)
    bodies = [{"model": "mock-model", "prompt": p, "max_tokens": 5, "stream": True}
              for p in ("short one", "word " * 60, "short two")]
    got = in_parallel(raw_completion, [(w.base_url, b, f"split-{i}") for i, b in enumerate(bodies)])
    want = [raw_completion(reference.base_url, b, f"split-{i}") for i, b in enumerate(bodies)]
    assert [s for s, _ in got] == [200, 400, 200]
    for (gs, gb), (ws, wb) in zip(got, want):
        assert gs == ws
        if gs == 400:
            # vLLM's own error, in OpenAI's shape: its integer code is null (docs/protocols.md, stop 60), and as
            # it refuses the prompt's length, OpenAI's code for that (stop 61).
            want_error = json.loads(wb)
            want_error["error"].update(code="context_length_exceeded", type="invalid_request_error", param="prompt")
            assert json.loads(gb) == want_error
        else:
            assert CREATED.sub(b"", gb) == CREATED.sub(b"", wb)
    assert w.metric("weir_batches_split_total") == 1
    entries = {e["request_id"]: e for e in completion_lines(w, 3)}
    for i, status in enumerate([200, 400, 200]):
        e = entries[f"split-{i}"]
        assert e["status"] == status
        assert [a["status"] for a in e["attempts"]] == [400, status]
        assert e["retries"] == 1
