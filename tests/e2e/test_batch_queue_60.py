"""Micro-batching and coalescing with the pool's admission queue (docs/batching.md, docs/reliability.md#overload):
where the batcher, the queue, the circuit breaker and the drain meet.

DEFECT (stop 60, high): with `queue:` and `batch:` (or `coalesce: true`) on a pool whose every endpoint's breaker
was open, the queue let a batchable request pass without a place (the attempts answer such a pool at once), and
the batching path asked the queue again, at once, for as long as the breakers stayed open: the worker spun at
100 % CPU, every connection on it (other pools' streams, /metrics) waited, for the whole open period (up to
16 × eject_for). Now the request goes to its attempts: a 503 with Retry-After, or its fallback.

DEFECT (stop 60, low): during a drain, a batch opened by a request let in from the queue was sent at once, before
the compatible requests waiting in the queue (let out to join it) could: each then went alone, one after another,
at max_concurrent, so the drain served its backlog as single requests."""

from __future__ import annotations

import concurrent.futures
import os
import signal

import httpx
import pytest

from conftest import wait_until

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")


def _open_breakers(w, url: str, body: dict) -> None:
    # Five 503s in a row eject the only endpoint (its breaker opens).
    for _ in range(5):
        assert httpx.post(url, json=body, timeout=10).status_code == 503
    wait_until(lambda: w.metric("weir_upstream_endpoint_state", pool="a", state="open") == 1, 5,
               message="the endpoint's breaker open")


@pytest.mark.parametrize("mode", ["batch", "coalesce"])
def test_a_batching_pool_whose_every_breaker_is_open_answers_at_once_and_the_worker_serves_on(mock, weir, mode):
    failing = mock("--error-rate", "1", "--error-status", "503")
    healthy = mock(*FAST)
    pool = {"endpoints": [failing.base_url], "retry": {"attempts": 1}, "eject_for": "30s", "breaker": True,
            "queue": {"size": 10, "max_concurrent": 4}}
    pool.update({"batch": {"window": "20ms", "max_size": 4}} if mode == "batch" else {"coalesce": True})
    w = weir(config={"pools": {"a": pool, "b": {"endpoints": [healthy.base_url]}},
                     "models": {"m1": {"pool": "a", "upstream_model": "mock-model"},
                                "m2": {"pool": "a", "upstream_model": "mock-model",
                                       "fallbacks": [{"pool": "b", "upstream_model": "mock-model"}]}}},
             workers=1)
    if mode == "batch":
        url = f"http://127.0.0.1:{w.port}/v1/completions"
        body = {"model": "m1", "prompt": "hi", "max_tokens": 4}
    else:
        url = f"http://127.0.0.1:{w.port}/v1/chat/completions"
        body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    _open_breakers(w, url, body)
    # Every endpoint open: Weir's own 503 with Retry-After, at once (the worker spun here before).
    r = httpx.post(url, json=body, timeout=10)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"], r.text
    assert "retry-after" in r.headers, r.headers
    # The same worker still serves: /metrics, and a model with a fallback on a healthy pool.
    assert w.metric("weir_upstream_endpoint_state", pool="a", state="open") == 1
    r = httpx.post(url, json={**body, "model": "m2"}, headers={"x-request-id": f"fb-{mode}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert w.log_for(f"fb-{mode}")["model"] == "m2"


def test_a_drain_sends_the_queued_compatible_requests_in_one_batch(mock, weir):
    up = mock("--ttft-ms", "50", "--itl-ms", "50", "--max-tokens", "20")
    w = weir(config={"pools": {"a": {"endpoints": [up.base_url], "batch": {"window": "300ms", "max_size": 8},
                                     "queue": {"size": 10, "max_concurrent": 1, "timeout": "20s"}}},
                     "models": {"m1": {"pool": "a", "upstream_model": "mock-model"}},
                     "server": {"drain_timeout": "20s"}},
             workers=1)
    url = f"http://127.0.0.1:{w.port}/v1/completions"

    def post(i: int, stream: bool) -> int:
        r = httpx.post(url, json={"model": "m1", "prompt": f"p{i}", "max_tokens": 20, "stream": stream},
                       headers={"x-request-id": f"drain-{i}"}, timeout=30)
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(5) as ex:
        # A stream holds the queue's only place (20 tokens at 50 ms: about a second); four compatible requests
        # wait behind it.
        holder = ex.submit(post, 0, True)
        wait_until(lambda: up.metric("vllm:num_requests_running") == 1, 10, message="the holder's generation")
        waiting = [ex.submit(post, i, False) for i in range(1, 5)]
        wait_until(lambda: w.metric("weir_queue_waiting", pool="a") == 4, 10,
                   message="four requests waiting in the queue")
        os.kill(w.process.pid, signal.SIGTERM)
        assert holder.result() == 200
        assert [f.result() for f in waiting] == [200] * 4
    sizes = [w.log_for(f"drain-{i}")["batch"]["size"] for i in range(1, 5)]
    # Let out of the queue together into the batch the first of them opened (before: four batches of one).
    assert sizes == [4] * 4, sizes
