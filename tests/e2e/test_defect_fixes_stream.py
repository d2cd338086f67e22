"""Regression tests for defects black-box testing found in stop 30 (each failed on the build before
the fix): an upstream's in-band error event recorded as a success and never counted against its
endpoint; a chunk that is no JSON (or a 2xx page that is no completion) committed instead of failing
over; an upstream SSE event over a fixed 4 MiB reported as invalid HTTP, with no setting; max_tokens
refused where vLLM takes it (2.0, or larger than 2^32 - 1); trailer fields of a chunked request taken as
its headers; and /metrics on the client port with no way to serve it only on the admin listener.
Real weir and weir-mock processes on free ports, a raw scripted upstream where the bytes matter."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from conftest import free_port, wait_until
from httpwire import assert_openai_error, roundtrip
from test_defect_fixes import RawUpstream

CHAT = {"model": "raw", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
VLLM_ERROR = {"error": {"object": "error", "message": "EngineCore encountered an issue.", "type": "InternalServerError",
                        "param": None, "code": 500}}
ROLE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}


def sse(*events: bytes) -> bytes:
    body = b"".join(events)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


def data(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def answer(headers, body):
    script = headers.get("x-script", "")
    if script == "error-first":
        return sse(data(ROLE), data(VLLM_ERROR), b"data: [DONE]\n\n")
    if script == "garbage-first":
        return sse(data(ROLE), b"data: {not json at all\n\n", b"data: [DONE]\n\n")
    if script == "html":
        page = b"<html>502 Bad Gateway from a load balancer</html>"
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)
    if script.startswith("huge-"):
        content = "x" * int(script[5:])
        chunk = dict(ROLE, choices=[{"index": 0, "delta": {"content": content}, "finish_reason": None}])
        stop = dict(ROLE, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
        return sse(data(ROLE), data(chunk), data(stop), b"data: [DONE]\n\n")
    return None


@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    raw = RawUpstream(answer)
    good = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    w = module_weir(config={
        "pools": {"raw": {"endpoints": [raw.url]},
                  "good": {"endpoints": [good.base_url]},
                  "both": {"endpoints": [raw.url, good.base_url], "outlier": {"consecutive_failures": 2},
                           "eject_for": "60s"}},
        "models": {"raw": {"pool": "raw"}, "raw-fb": {"pool": "raw", "fallbacks": [{"model": "good"}]},
                   "good": {"pool": "good"}, "both": {"pool": "both"}}},
        workers=1)  # one worker: one view of the endpoints' health
    w.raw, w.good = raw, good
    return w


def stream_lines(gw, path: str, body: dict, script: str) -> tuple[str, str]:
    rid = f"{script}-{path.rsplit('/', 1)[1]}-{body['model']}"
    with httpx.stream("POST", gw.base_url + path, json=body, timeout=10,
                      headers={"x-script": script, "x-request-id": rid}) as r:
        assert r.status_code == 200, r.read()
        return r.read().decode(), rid


# ---------------------------------------------------------------------------- an in-band error event

def test_an_in_band_error_reaches_the_client_once_and_is_logged_as_one(gw):
    text, rid = stream_lines(gw, "/v1/chat/completions", CHAT, "error-first")
    datas = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    # The role chunk and the upstream's error (in OpenAI's shape: vLLM's integer code null, stop 60), then the
    # end: no second error of Weir's, no token.
    reshaped = {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "param": None,
                          "code": None}}
    assert datas[0] == json.dumps(ROLE) and json.loads(datas[1]) == reshaped and datas[2:] == ["[DONE]"], text
    e = gw.log_for(rid)
    assert e["status"] == 200 and e["error"] and e["error"]["source"] == "upstream", e
    # `events` counts the data events the client got, the error and [DONE] too (docs/observability.md);
    # the error is no token: no completion tokens, no first token.
    assert e["events"] == len(datas) and not e["completion_tokens"] and e["ttft_ms"] is None, e
    # The openai SDK raises the upstream's error.
    with pytest.raises(openai.APIError, match="EngineCore"):
        for _ in gw.client().chat.completions.create(**dict(CHAT, stream=True), extra_headers={"x-script": "error-first"}):
            pass
    # An Anthropic client gets one error event, and the log says so too.
    text, rid = stream_lines(gw, "/v1/messages", CHAT, "error-first")
    assert text.count("event: error") == 1 and "EngineCore" in text, text
    e = gw.log_for(rid)
    assert e["error"] and e["error"]["source"] == "upstream", e


def test_an_endpoint_that_answers_only_in_band_errors_is_ejected(gw):
    client = gw.client()
    raw = gw.raw.url

    def one() -> str:
        try:
            for _ in client.chat.completions.create(**dict(CHAT, model="both"), extra_headers={"x-script": "error-first"}):
                pass
            return "ok"
        except openai.APIError:
            return "error"

    def ejected() -> bool:
        return (gw.metric("weir_upstream_ejections_total", pool="both", endpoint=raw, cause="failures") or 0) >= 1

    # The balancer picks between the two endpoints, so how many requests the bad one takes before its second
    # failure in a row varies: send until it is ejected (2 in a row with 40 requests: certain).
    outcomes = []
    while not ejected() and len(outcomes) < 40:
        outcomes.append(one())
    assert ejected(), outcomes
    assert outcomes.count("error") >= 2, outcomes
    assert gw.metric("weir_upstream_failures_total", pool="both", endpoint=raw, kind="protocol") >= 2
    # Once it is out (for 60 s), every stream goes to the good endpoint.
    after = [one() for _ in range(6)]
    assert after == ["ok"] * 6, (outcomes, after)


# ---------------------------------------------------------------------------- invalid answers fail over

@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", dict(CHAT, model="raw-fb")),
    ("/v1/messages", dict(CHAT, model="raw-fb")),
    ("/v1/responses", {"model": "raw-fb", "max_output_tokens": 8, "stream": True, "input": "hi"}),
])
def test_a_chunk_that_is_no_json_before_the_first_token_fails_over(gw, path, body):
    text, rid = stream_lines(gw, path, body, "garbage-first")
    assert "not json" not in text and "not a JSON object" not in text, text
    e = gw.log_for(rid)
    assert e["pool"] == "good" and e["error"] is None, e
    assert [a["failure"] for a in e["attempts"]] == ["protocol", None], e


def test_a_2xx_page_that_is_no_completion_fails_over_or_is_a_502(gw):
    body = {"model": "raw-fb", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(gw.v1 + "/chat/completions", json=body, headers={"x-script": "html"}, timeout=10)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text
    r = httpx.post(gw.v1 + "/chat/completions", json=dict(body, model="raw"), headers={"x-script": "html"}, timeout=10)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_invalid_response" and "html" not in r.text.lower(), r.text


# ---------------------------------------------------------------------------- server.max_event

def test_an_event_over_server_max_event_names_the_limit(gw, weir):
    size = 5 << 20
    text, rid = stream_lines(gw, "/v1/chat/completions", CHAT, f"huge-{size}")
    assert "server.max_event" in text and "invalid HTTP" not in text, text[-400:]
    # Raised, the same event passes whole.
    big = weir(config={"server": {"max_event": "8MiB"}, "pools": {"raw": {"endpoints": [gw.raw.url]}},
                       "models": {"raw": {"pool": "raw"}}})
    text, _ = stream_lines(big, "/v1/chat/completions", CHAT, f"huge-{size}")
    assert text.count("x" * 1000) >= size // 1000 - 1 and text.rstrip().endswith("data: [DONE]"), text[-300:]


# ---------------------------------------------------------------------------- max_tokens as vLLM takes it

@pytest.mark.parametrize("value", [2.0, 1e3, 4294967296, 99999999999])
def test_max_tokens_reaches_the_upstream_as_vllm_would_take_it(gw, value):
    body = {"model": "good", "max_tokens": value, "messages": [{"role": "user", "content": "hi"}]}
    via = httpx.post(gw.v1 + "/chat/completions", json=body, timeout=10)
    # weir-mock answers as vLLM does: what it says directly, Weir passes on.
    direct = httpx.post(gw.good.v1 + "/chat/completions", json=body, timeout=10)
    assert via.status_code == direct.status_code, (via.text, direct.text)
    if via.status_code != 200:
        assert "positive integer" not in via.text, via.text


# ---------------------------------------------------------------------------- trailers are not headers

def test_trailer_fields_are_not_taken_as_headers(weir):
    seen = []

    def record(headers, body):
        seen.append(headers)
        out = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                       "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(out), out)

    up = RawUpstream(record)
    w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"})
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    wire = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nx-request-id: trailers-1\r\n\r\n"
            b"%x\r\n%s\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nx-weir-timeout-ms: 1\r\nContent-Encoding: gzip\r\n"
            b"x-trailer-probe: yes\r\n\r\n") % (len(body), body)
    r = roundtrip(w.port, wire)
    assert r.status == 200, r.body
    assert seen and "x-trailer-probe" not in seen[-1] and seen[-1].get("x-forwarded-for") != "6.6.6.6", seen[-1]
    assert w.log_for("trailers-1")["status"] == 200


# ---------------------------------------------------------------------------- /metrics off the client port

def test_metrics_can_be_served_on_the_admin_listener_only(weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    admin_port = free_port()
    w = weir(env={"WEIR_TEST_METRICS_ADMIN_TOKEN": "metrics-admin-token-0123456789"}, config={"server": {"metrics": {"client_port": False}},
                     "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_METRICS_ADMIN_TOKEN"},
                     "pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p"})
    r = roundtrip(w.port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nx-request-id: metrics-off\r\n\r\n")
    assert_openai_error(r, 404)
    assert w.log_for("metrics-off")["status"] == 404
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{admin_port}/ready", timeout=5).status_code == 200, 5,
               message="admin listener")
    text = httpx.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).text
    assert "weir_requests_total" in text, text[:300]
