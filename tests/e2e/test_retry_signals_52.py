"""Retry signals as the openai (2.x) and anthropic Python SDKs read them, found in stop 52's black-box round. The
SDKs retry a 408, 409, 429 or 5xx twice more unless told `x-should-retry: false`; they read `retry-after-ms`
before `Retry-After`, and wait out at most 120 s (openai) or 60 s (anthropic) of it, else retry after their own
short backoff:
- D1: a request's own deadline (x-weir-timeout-ms) ended in 504 deadline_exceeded with no `x-should-retry:
  false`: the SDK started the generation twice more, three times the caller's bound;
- D2: a pool's own retry ignored an upstream's `x-should-retry: false` (a spent quota): three upstream requests
  for one; a fallback to another pool still runs;
- D3: an upstream's 503 with Retry-After: 300 was relayed with no `x-should-retry: false`: the anthropic SDK
  retried it at once, twice;
- D4: Weir's rate-limit refusals said only whole seconds: the SDK waited a second for a bucket that refills in
  100 ms; `retry-after-ms` now says the bucket's wait;
- D5: a pool with retry.response_timeout: false answered its 504 without `x-should-retry: false`: the SDK
  started the generation over, which the option exists to prevent;
- D6: the bound for a long Retry-After was the anthropic SDK's 60 s on every route: 120 s on OpenAI's routes."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

KEY = "sk-retry-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "a b c d e f g h i j k l m n o p q r s t"}]


def governed(pools: dict, models: dict | None = None, limits: dict | None = None) -> dict:
    tenant: dict = {"budget": {"usd": 100000}}
    if limits:
        tenant["limits"] = limits
    return {"pools": pools, "pricing": {"*": {"input": 1000000, "output": 1000000}}, "tenants": {"t": tenant},
            "auth": {"required": True,
                     "api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
            "models": models or {"m": {"pool": next(iter(pools)), "upstream_model": "mock-model"}}}


def log_lines(w) -> list[dict]:
    try:
        txt = w.access_log_path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in txt.splitlines() if line.strip()]


class Up:
    """A tiny OpenAI-style upstream that counts requests and answers as `mode` says."""

    ANSWERS = {
        # What OpenAI's API sends for a spent quota.
        "quota": (429, {"x-should-retry": "false"},
                  {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                             "param": None, "code": "insufficient_quota"}}),
        "503long": (503, {"retry-after": "300"},
                    {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}),
        "503long-may-retry": (503, {"retry-after": "300", "x-should-retry": "true"},
                              {"error": {"message": "overloaded", "type": "server_error", "param": None,
                                         "code": None}}),
        "503-90s": (503, {"retry-after": "90"},
                    {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}),
        "ok": (200, {}, {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "mock-model",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}),
    }

    def __init__(self, mode: str):
        self.mode = mode
        self.seen = 0
        up = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                up.seen += 1
                status, hdrs, body = Up.ANSWERS[up.mode]
                b = json.dumps(body).encode()
                self.send_response(status)
                for k, v in hdrs.items():
                    self.send_header(k, v)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.base_url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def up():
    made: list[Up] = []

    def make(mode: str) -> Up:
        made.append(Up(mode))
        return made[-1]

    yield make
    for u in made:
        u.close()


def test_d1_a_passed_deadline_tells_the_sdk_not_to_retry(mock, weir):
    import openai
    m = mock("--ttft-ms", "3000", "--itl-ms", "0")
    w = weir(config=governed({"p": {"endpoints": [m.base_url]}}), workers=1)
    c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=2, timeout=30)
    with pytest.raises(openai.APIStatusError) as ei:
        c.chat.completions.create(model="m", messages=MSG, max_tokens=4, extra_headers={"x-weir-timeout-ms": "500"})
    assert ei.value.status_code == 504 and ei.value.response.headers.get("x-should-retry") == "false"
    assert ei.value.response.json()["error"]["code"] == "deadline_exceeded"
    w.wait_log(lambda es: len(es) >= 1)
    assert len(log_lines(w)) == 1, "the SDK retried a request whose own deadline had passed"


def test_d2_an_upstreams_x_should_retry_false_stops_the_pools_retry(up, weir):
    u = up("quota")
    w = weir(config=governed({"p": {"endpoints": [u.base_url], "retry": {"attempts": 3}}}), workers=1)
    r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                   json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 429 and r.headers.get("x-should-retry") == "false", (r.status_code, r.headers)
    assert r.json()["error"]["code"] == "insufficient_quota"
    assert u.seen == 1, f"the pool retried an answer that said x-should-retry: false ({u.seen} requests)"


def test_d2_a_fallback_to_another_pool_still_runs(up, weir):
    # One provider's spent quota is a reason to try the other: only the same pool's retries stop.
    spent, other = up("quota"), up("ok")
    pools = {"p": {"endpoints": [spent.base_url], "retry": {"attempts": 3}},
             "fb": {"endpoints": [other.base_url]}}
    models = {"m": {"pool": "p", "upstream_model": "mock-model", "fallbacks": [{"pool": "fb"}]}}
    w = weir(config=governed(pools, models), workers=1)
    r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                   json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert (spent.seen, other.seen) == (1, 1)


def test_d3_a_relayed_long_retry_after_tells_the_sdk_not_to_retry(up, weir):
    import anthropic
    u = up("503long")
    w = weir(config=governed({"p": {"endpoints": [u.base_url]}}), workers=1)
    c = anthropic.Anthropic(base_url=w.v1.rsplit("/v1", 1)[0], api_key=KEY, max_retries=2, timeout=30)
    with pytest.raises(anthropic.APIStatusError) as ei:
        c.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    h = ei.value.response.headers
    assert ei.value.status_code == 503 and h.get("retry-after") == "300", h  # (the upstream's wait, as it said)
    assert h.get("x-should-retry") == "false", h
    assert u.seen == 1, f"the SDK retried a 503 that asked for 300 s ({u.seen} requests)"
    # The same on an OpenAI route.
    r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                   json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 503 and r.headers.get("x-should-retry") == "false", r.headers


def test_d3_an_upstreams_own_x_should_retry_is_never_overridden(up, weir):
    u = up("503long-may-retry")
    w = weir(config=governed({"p": {"endpoints": [u.base_url]}}), workers=1)
    r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                   json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 503 and r.headers.get_list("x-should-retry") == ["true"], r.headers


def test_d4_a_rate_limit_refusal_says_its_wait_in_milliseconds(mock, weir):
    import openai
    m = mock("--ttft-ms", "0", "--itl-ms", "0")
    # 60 a minute, one at a time: the bucket refills in 1 s (100 ms let a busy host's second request through).
    w = weir(config=governed({"p": {"endpoints": [m.base_url]}},
                             limits={"requests_per_minute": 60, "requests_burst": 1}), workers=1)
    body = {"model": "m", "messages": MSG, "max_tokens": 2}
    httpx.post(w.v1 + "/chat/completions", headers=AUTH, json=body, timeout=10)
    r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, json=body, timeout=10)
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1", r.headers  # (whole seconds, as before)
    assert 0 < int(r.headers["retry-after-ms"]) <= 1000, r.headers
    assert "x-should-retry" not in r.headers
    # The SDK reads it and its retry passes (whether this call found the bucket refilled or not).
    c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=2, timeout=30)
    assert c.chat.completions.with_raw_response.create(**body).retries_taken <= 1


def test_d4_every_own_retry_after_has_retry_after_ms(mock, weir):
    # max_concurrent_streams: Retry-After 1, so retry-after-ms 1000.
    m = mock("--ttft-ms", "2000", "--itl-ms", "0")
    w = weir(config=governed({"p": {"endpoints": [m.base_url]}}, limits={"max_concurrent_streams": 1}), workers=1)
    with httpx.stream("POST", w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                      json={"model": "m", "messages": MSG, "max_tokens": 2, "stream": True}) as first:
        assert first.status_code == 200
        r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                       json={"model": "m", "messages": MSG, "max_tokens": 2})
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after-ms"]) == int(r.headers["retry-after"]) * 1000, r.headers


def test_d5_a_pool_that_does_not_retry_a_response_timeout_tells_the_sdk_not_to(mock, weir):
    import openai
    m = mock("--ttft-ms", "0", "--itl-ms", "400")
    pool = {"endpoints": [m.base_url], "timeouts": {"response": "1s"},
            "retry": {"attempts": 2, "response_timeout": False}}
    w = weir(config=governed({"p": pool}), workers=1)
    c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=2, timeout=30)
    with pytest.raises(openai.APIStatusError) as ei:
        c.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    assert ei.value.status_code == 504 and ei.value.response.headers.get("x-should-retry") == "false"
    w.wait_log(lambda es: len(es) >= 1)
    assert len(log_lines(w)) == 1, "the SDK started over a generation that may still be running"


def test_d5_a_pool_that_retries_a_response_timeout_leaves_the_sdk_its_rule(mock, weir):
    m = mock("--ttft-ms", "0", "--itl-ms", "400")
    pool = {"endpoints": [m.base_url], "timeouts": {"response": "1s"}, "retry": {"attempts": 1}}
    w = weir(config=governed({"p": pool}), workers=1)
    r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                   json={"model": "m", "messages": MSG, "max_tokens": 8})
    assert r.status_code == 504 and "x-should-retry" not in r.headers, r.headers


def _tokens_refusal(w, path: str, body: dict) -> httpx.Response:
    httpx.post(w.v1 + path, headers=AUTH, json=body, timeout=10)
    return httpx.post(w.v1 + path, headers=AUTH, json=body, timeout=10)


@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_d6_a_retry_after_between_60_and_120_s_is_left_to_the_openai_sdks(mock, weir, route):
    # A tokens bucket of 60 a minute (burst 130): the second request waits about 95 s. The openai SDKs wait
    # out up to 120 s: no x-should-retry. The anthropic SDK waits out 60 s at most: told not to retry.
    m = mock("--ttft-ms", "0", "--itl-ms", "0")
    w = weir(config=governed({"p": {"endpoints": [m.base_url]}}, limits={"tokens_per_minute": 60,
                                                                         "tokens_burst": 130}), workers=1)
    body = {"model": "m", "messages": MSG, "max_tokens": 90}
    r = _tokens_refusal(w, "/chat/completions" if route == "openai" else "/messages", body)
    assert r.status_code == 429, r.text
    assert 60 < int(r.headers["retry-after"]) <= 120, r.headers
    assert r.headers.get("x-should-retry") == (None if route == "openai" else "false"), r.headers


def test_d6_a_relayed_retry_after_between_60_and_120_s(up, weir):
    u = up("503-90s")
    w = weir(config=governed({"p": {"endpoints": [u.base_url]}}), workers=1)
    r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                   json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 503 and "x-should-retry" not in r.headers, r.headers
    r = httpx.post(w.v1 + "/messages", headers={**AUTH, "anthropic-version": "2023-06-01"}, timeout=10,
                   json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 503 and r.headers.get("x-should-retry") == "false", r.headers
