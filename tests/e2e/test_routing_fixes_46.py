"""Defects found in stop 46's black-box rounds: routing on large pools, the access log's attempts, the admin
listener's 405s, the request duration of requests without a model."""
from __future__ import annotations

import httpx
import pytest

from conftest import free_port, wait_until
from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hi"}]
ADMIN_TOKEN = "admin-token-stop46-0123456789"


def _answer(status: int) -> bytes:
    if status == 200:
        body = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
                b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
                b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    body = b'{"error":{"message":"busy","type":"server_error"}}'
    return (b"HTTP/1.1 %d Busy\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(body), body))


def _chat(w, rid: str, model: str = "m") -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", json={"model": model, "messages": MSG},
                      headers={"x-request-id": rid}, timeout=30)


@pytest.fixture
def raw_upstreams():
    made = []

    def make(status: int) -> RawUpstream:
        up = RawUpstream(lambda h, b: _answer(status))
        made.append(up)
        return up

    yield make
    for up in made:
        up.close()


# DEFECT: the endpoints a request had tried, and those a resume or a held stream's retry must avoid, were
# 64-bit masks (bit i = endpoint i): in a pool of more than 64 endpoints a retry could go back to an endpoint
# from 64 on that the same request had already tried (docs/routing.md: "never an endpoint already tried"),
# and a held stream on one of them was not retried on its pool at all. Here the first 64 endpoints refuse
# (and are ejected), so every request lands on endpoints 64, 65 and 66, each answering 503: its three
# attempts must take one each. (The old build went back to its first endpoint on about half of them.)
def test_a_retry_never_goes_back_to_an_endpoint_from_64_on(weir, raw_upstreams):
    dead = free_port()  # nothing listens: each connect is refused and ejects the endpoint
    live = [raw_upstreams(503).url for _ in range(3)]
    endpoints = [f"http://127.0.0.1:{dead}/v1?i={i}" for i in range(64)] + live
    w = weir(config={"pools": {"p": {"endpoints": endpoints, "eject_for": "60s",
                                     "retry": {"attempts": 3, "backoff": "0ms", "max_backoff": "1ms",
                                               "min_concurrent": 100},
                                     "outlier": {"consecutive_failures": 0}}},
                     "models": {"m": {"pool": "p"}}}, workers=1)
    # Warm-up: connect failover walks through the refusing endpoints until all 64 are ejected.
    for i in range(200):
        assert _chat(w, f"warm-{i}").status_code in (502, 503)
        if w.metric("weir_upstream_available_endpoints", pool="p") == 3:
            break
    assert w.metric("weir_upstream_available_endpoints", pool="p") == 3
    for i in range(16):
        rid = f"retry-{i}"
        assert _chat(w, rid).status_code == 503
        line = w.log_for(rid)
        tried = [a["endpoint"] for a in line["attempts"]]
        assert len(tried) == 3 and set(tried) == set(live), line


# DEFECT: the access log's `attempts` stopped at 8 entries: later attempts were dropped, the one that
# answered too (the line's own `endpoint` was not the last one listed), and nothing said so, though the
# README said the log lists every attempt. Now the first 7 and the last are listed, with
# "attempts_dropped" counting those between.
def test_the_attempts_list_keeps_the_answering_attempt_and_counts_those_left_out(weir, raw_upstreams):
    busy, good = raw_upstreams(503), raw_upstreams(200)
    w = weir(config={"pools": {"busy": {"endpoints": [busy.url], "outlier": {"consecutive_failures": 0},
                                        "retry": {"attempts": 10, "backoff": "0ms", "max_backoff": "1ms",
                                                  "min_concurrent": 100}},
                               "busy3": {"endpoints": [busy.url], "outlier": {"consecutive_failures": 0},
                                         "retry": {"attempts": 3, "backoff": "0ms", "max_backoff": "1ms",
                                                   "min_concurrent": 100}},
                               "good": {"endpoints": [good.url]}},
                     "models": {"m": {"pool": "busy", "fallbacks": [{"pool": "good"}]},
                                "m3": {"pool": "busy3", "fallbacks": [{"pool": "good"}]}}}, workers=1)
    r = _chat(w, "many")
    assert r.status_code == 200, r.text
    line = w.log_for("many")
    assert line["retries"] == 10, line
    attempts = line["attempts"]
    assert len(attempts) == 8, line
    assert [a["status"] for a in attempts] == [503] * 7 + [200], line
    assert attempts[-1]["pool"] == "good" and attempts[-1]["endpoint"] == line["endpoint"], line
    assert line["attempts_dropped"] == 3, line
    # A request whose attempts fit has no such field.
    assert _chat(w, "few", model="m3").status_code == 200
    few = w.log_for("few")
    assert [a["status"] for a in few["attempts"]] == [503, 503, 503, 200] and "attempts_dropped" not in few, few


def _admin(port: int, method: str, path: str, token: str | None = ADMIN_TOKEN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"http://127.0.0.1:{port}{path}", headers=headers, timeout=10,
                         follow_redirects=False)


# DEFECT: on the admin listener, `GET /` redirects to the console, but DELETE, POST, OPTIONS... on `/` were a
# 404 unknown_url (401 without a token) instead of 405 with Allow: GET, HEAD, as the console's own paths
# answer (docs/admin-api.md: "405 | a method the path does not take (Allow lists those it does)").
def test_admin_root_answers_405_with_allow_for_other_methods(weir, raw_upstreams):
    port = free_port()
    weir(config={"pools": {"p": {"endpoints": [raw_upstreams(200).url]}}, "default_pool": "p",
                 "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
         workers=1, env={"WEIR_TEST_ADMIN_TOKEN": ADMIN_TOKEN})
    wait_until(lambda: _admin(port, "GET", "/ready", token=None).status_code == 200, 5, message="admin listener")
    for token in (ADMIN_TOKEN, None):
        r = _admin(port, "GET", "/", token)
        assert r.status_code == 302 and r.headers["location"] == "/console/"
        assert _admin(port, "HEAD", "/", token).status_code == 302
        for method in ("DELETE", "POST", "PUT", "PATCH", "OPTIONS"):
            for path in ("/", "/console/", "/console"):
                r = _admin(port, method, path, token)
                assert r.status_code == 405, (method, path, token, r.status_code, r.text)
                assert r.headers["allow"] == "GET, HEAD", (method, path, r.headers)
            # /metrics and /ready need no token either: a 405 with or without one.
            r = _admin(port, method, "/metrics", token)
            assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD", (method, r.status_code)
    # The API's paths check the token first, then the method.
    assert _admin(port, "DELETE", "/admin/v1/stats", None).status_code == 401
    r = _admin(port, "DELETE", "/admin/v1/stats")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD", r.headers
    r = _admin(port, "PUT", "/admin/v1/keys/some-id")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, PATCH, DELETE", r.headers
    assert _admin(port, "DELETE", "/nothing-here").status_code == 404


# DEFECT: requests answered before a model was known (a 404 for an unknown model or path, a 400 for a body
# that is not JSON, a 401) were counted in weir_requests_total{model=""} but observed in no
# weir_request_duration_seconds series: the histogram's "" slot was recorded and never rendered, so its
# _count fell short of the requests counted. It is rendered now, under model="", once used.
def test_requests_without_a_model_have_a_request_duration(weir, raw_upstreams):
    w = weir(config={"pools": {"p": {"endpoints": [raw_upstreams(200).url]}}, "models": {"m": {"pool": "p"}}},
             workers=1)
    assert _chat(w, "unknown-model", model="nope").status_code == 404
    assert httpx.post(w.v1 + "/chat/completions", content=b"{not json", timeout=10,
                      headers={"content-type": "application/json"}).status_code == 400
    assert httpx.get(w.base_url + "/no/such/path", timeout=10).status_code == 404
    assert _chat(w, "fine").status_code == 200
    w.wait_log(lambda es: len(es) >= 4)
    samples = w.metrics()
    no_model = sum(v for n, l, v in samples if n == "weir_requests_total" and l.get("model") == "")
    assert no_model >= 3
    # (One scrape: a scrape of /metrics is itself a request without a model, counted once it ends.)
    assert sum(v for n, l, v in samples
               if n == "weir_request_duration_seconds_count" and l.get("model") == "") == no_model
    total = sum(v for n, l, v in samples if n == "weir_requests_total")
    assert sum(v for n, l, v in samples if n == "weir_request_duration_seconds_count") == total
