"""Defects found in stop 46's black-box rounds."""
from __future__ import annotations

import json
import threading
import time

import httpx

MSG = [{"role": "user", "content": "hi"}]


# DEFECT: with `breaker:`, a half-open endpoint whose trial request was a stream stayed half-open until the
# whole stream ended (its verdict was given at the stream's end), so every other request of the pool got
# 503 "every endpoint's circuit breaker is open" for as long as that first generation ran (minutes for a
# long one). A stream is judged at its first token (docs/reliability.md): its first token closes the breaker.
def test_a_half_open_endpoints_trial_stream_closes_the_breaker_at_its_first_token(mock, weir):
    m = mock("--ttft-ms", "20", "--itl-ms", "100", "--max-tokens", "40")  # a 4 s stream
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url], "eject_for": "1s",
                                     "outlier": {"consecutive_failures": 1},
                                     "breaker": {"half_open_trials": 1}}},
                     "default_pool": "p"}, workers=1)
    body = {"model": "mock-model", "messages": MSG, "max_tokens": 1}
    r = httpx.post(w.v1 + "/chat/completions", json=body, headers={"x-mock-status": "503"}, timeout=10)
    assert r.status_code == 503
    r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_unavailable", r.text
    time.sleep(1.1)  # eject_for: half-open now
    first_token = threading.Event()
    tokens = []

    def trial():
        with httpx.stream("POST", w.v1 + "/chat/completions", timeout=30,
                          json={"model": "mock-model", "messages": MSG, "stream": True, "max_tokens": 40}) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    if delta.get("content"):
                        tokens.append(delta["content"])
                        first_token.set()
    t = threading.Thread(target=trial)
    t.start()
    try:
        assert first_token.wait(10)
        # The trial's stream runs on for seconds: the pool serves beside it.
        r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=10)
        assert r.status_code == 200, r.text
        assert len(tokens) < 40
    finally:
        t.join(15)
    assert len(tokens) == 40
