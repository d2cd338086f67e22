"""Stop 61 (sdkb61): behind a front proxy, requests of different end users still merge.

X-Forwarded-For and Forwarded describe the client, not the request: behind nginx (`$proxy_add_x_forwarded_for`)
every end user's differs, and compared as part of the batch key they kept each micro-batch and each coalesced
generation to one client address -- batching was off in a standard front-proxy deployment, silently."""
from __future__ import annotations

import threading

import httpx

MODEL = "mock-model"


def _config(m, **pool) -> dict:
    return {"pools": {"p": {"endpoints": [m.base_url], **pool}}, "models": {MODEL: {"pool": "p"}}}


def _concurrently(*calls) -> list:
    out: list = [None] * len(calls)

    def run(i, f):
        out[i] = f()
    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_members_with_different_forwarded_addresses_share_a_micro_batch(mock, weir):
    m = mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(config=_config(m, batch={"window": "500ms", "max_size": 3}), workers=1)

    def post(addr: str, forwarded: str):
        return lambda: httpx.post(f"{w.base_url}/v1/completions", timeout=30,
                                  headers={"x-forwarded-for": addr, "forwarded": forwarded},
                                  json={"model": MODEL, "prompt": f"hello from {addr}", "max_tokens": 4})
    rs = _concurrently(post("203.0.113.7", "for=203.0.113.7;proto=https"),
                       post("198.51.100.9", "for=198.51.100.9;proto=https"),
                       post("192.0.2.33", "for=192.0.2.33;proto=https"))
    assert [r.status_code for r in rs] == [200, 200, 200], [r.text for r in rs]
    assert w.metric("weir_batches_total") == 1
    assert w.metric("weir_batched_requests_total") == 3
    assert m.metric("vllm:request_success_total") == 1  # one upstream request with three prompts


def test_identical_requests_of_different_forwarded_addresses_share_a_generation(mock, weir):
    m = mock("--ttft-ms", "800", "--itl-ms", "5", "--max-tokens", "4")
    w = weir(config=_config(m, coalesce=True), workers=1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "same"}], "max_tokens": 4, "temperature": 0}
    first_sent = threading.Event()

    def post(addr: str, wait: bool):
        def call():
            if wait:
                first_sent.wait(10)
            else:
                first_sent.set()
            return httpx.post(f"{w.base_url}/v1/chat/completions", timeout=30,
                              headers={"x-forwarded-for": addr}, json=body)
        return call
    rs = _concurrently(post("203.0.113.7", False), post("198.51.100.9", True))
    assert [r.status_code for r in rs] == [200, 200], [r.text for r in rs]
    assert rs[0].json()["choices"][0]["message"]["content"] == rs[1].json()["choices"][0]["message"]["content"]
    assert w.metric("weir_coalesced_requests_total") == 1
