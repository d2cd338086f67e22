"""Items session 52 left: the exact wait of Weir's own 503s (a pool whose every endpoint is ejected, a shed
request) in retry-after-ms; ..."""

from __future__ import annotations

import math

import httpx

from conftest import free_port, wait_until
from httpwire import RawConn, request

MSG = [{"role": "user", "content": "hello"}]
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": MSG, "max_tokens": 4, **extra}


# --- 1. retry-after-ms says the real wait -------------------------------------------------------------------------

# DEFECT: the 503 of a pool whose every endpoint was ejected sent retry-after-ms as its Retry-After's whole
# seconds × 1000: an endpoint ejected for 2.5 s said `retry-after-ms: 3000`, and an SDK (which reads
# retry-after-ms first) waited up to a second past the ejection. It is now the time left until the first
# ejection ends, to the millisecond, with Retry-After that time rounded up.
def test_a_pool_with_every_endpoint_ejected_sends_the_time_left_in_retry_after_ms(weir):
    dead = f"http://127.0.0.1:{free_port()}"
    w = weir(config={"pools": {"p": {"endpoints": [dead], "eject_for": "2500ms", "breaker": {}}},
                     "models": {"m": {"pool": "p", "upstream_model": "mock-model"}}}, workers=1)
    c = httpx.Client(base_url=w.v1, timeout=10)
    assert c.post("/chat/completions", json=chat("m")).status_code == 502  # refused: its breaker opens
    r = c.post("/chat/completions", json=chat("m"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_unavailable", r.text
    ms = int(r.headers["retry-after-ms"])
    assert 0 < ms <= 2500, r.headers  # the ejection's 2.5 s less what has passed, never rounded up to 3000
    assert int(r.headers["retry-after"]) == max(1, math.ceil(ms / 1000)), r.headers


# DEFECT: a shed request's retry-after-ms was queue.retry_after rounded up to whole seconds × 1000
# (`retry_after: 1500ms` sent 2000). It is the configured wait exactly; Retry-After rounds it up.
def test_a_shed_request_sends_queue_retry_after_exactly_in_retry_after_ms(mock, weir):
    m = mock(*FAST)
    w = weir(config={"pools": {
        "p": {"endpoints": [m.base_url], "queue": {"size": 0, "max_concurrent": 1, "retry_after": "1500ms",
                                                  "saturation": False}},
        "q": {"endpoints": [m.base_url], "queue": {"size": 0, "max_concurrent": 1, "retry_after": "2.25s",
                                                  "shed_status": 429, "saturation": False}}},
        "models": {"a": {"pool": "p", "upstream_model": "mock-model"},
                   "b": {"pool": "q", "upstream_model": "mock-model"}}}, workers=1)
    held = []
    try:
        # Each pool's one place is taken by a stream that waits upstream until its client leaves.
        for model in "ab":
            conn = RawConn(w.port)
            conn.send(request("POST", "/v1/chat/completions", chat(model, stream=True), {"x-mock-ttft-ms": "60000"}))
            held.append(conn)
        wait_until(lambda: m.metric("vllm:num_requests_running") == 2, message="both occupants run")
        c = httpx.Client(base_url=w.v1, timeout=10)
        for model, status, seconds, ms in (("a", 503, "2", "1500"), ("b", 429, "3", "2250")):
            r = c.post("/chat/completions", json=chat(model))
            assert r.status_code == status and r.json()["error"]["code"] == "overloaded", r.text
            assert (r.headers["retry-after"], r.headers["retry-after-ms"]) == (seconds, ms), r.headers
    finally:
        for conn in held:
            conn.close()

