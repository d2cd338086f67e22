"""Errors: OpenAI's shape {"error":{"message","type","param","code"}} with the right status,
for client mistakes, upstream failures before the response head, and in-band
errors (then [DONE]) once a stream has started.
"""

from __future__ import annotations

import json
import socket
import uuid

import httpx
import openai
import pytest

from conftest import free_port, wait_until
from httpwire import RawConn, assert_openai_error, request, roundtrip, sse_data

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def blackhole():
    """A listener whose accept queue is full: further SYNs are dropped, so connects time out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(2):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    probe = socket.socket()
    probe.settimeout(0.3)
    with pytest.raises(OSError):
        probe.connect(("127.0.0.1", port))  # the accept queue is full
    probe.close()
    yield port
    for s in fillers:
        s.close()
    listener.close()


@pytest.fixture(scope="module")
def stack(module_mock, module_weir, blackhole):
    m = module_mock("--ttft-ms", "2", "--itl-ms", "2", "--max-tokens", "8")
    dead = free_port()
    fast = {"connect": "300ms", "first_byte": "400ms", "response": "400ms", "idle": "400ms"}
    w = module_weir(config={
        "pools": {
            "main": {"endpoints": [m.base_url]},
            "strict": {"endpoints": [m.base_url], "timeouts": fast},
            "dead": {"endpoints": [f"http://127.0.0.1:{dead}"]},
            "blackhole": {"endpoints": [f"http://127.0.0.1:{blackhole}"], "timeouts": fast},
        },
        "models": {
            "mock-model": {"pool": "main"},
            "strict": {"pool": "strict", "upstream_model": "mock-model"},
            "dead": {"pool": "dead", "upstream_model": "mock-model"},
            "blackhole": {"pool": "blackhole", "upstream_model": "mock-model"},
        },
    })
    return m, w


def post(w, body, headers=None, path="/v1/chat/completions"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return roundtrip(w.port, request("POST", path, data, headers))


# --- client mistakes ----------------------------------------------------------------

@pytest.mark.parametrize("body", [b'{"model": "mock-model",', b"not json", b"",
                                  b'{"model":"mock-model","messages":[]} trailing', b"\xff\xfe{}"])
def test_malformed_json_400(stack, body):
    _, w = stack
    assert_openai_error(post(w, body), 400)


def test_missing_model_400(stack):
    _, w = stack
    err = assert_openai_error(post(w, {"messages": [{"role": "user", "content": "x"}]}), 400)
    assert err["param"] == "model"
    for bad in ({"model": None, "messages": []}, {"model": 5, "messages": []}, {"model": "", "messages": []}):
        assert assert_openai_error(post(w, bad), 400)["param"] == "model"


@pytest.mark.parametrize("body", [b"[]", b'"a string"', b"null", b"42", b"[{\"model\":\"mock-model\"}]"])
def test_non_object_body_400(stack, body):
    _, w = stack
    assert_openai_error(post(w, body), 400)


def test_unknown_model_404_model_not_found(stack):
    _, w = stack
    with pytest.raises(openai.NotFoundError) as e:
        w.client().chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    err = assert_openai_error(post(w, {**CHAT, "model": "gpt-nope"}), 404, "model_not_found")
    assert "gpt-nope" in err["message"]
    # embeddings and completions too
    assert_openai_error(post(w, {"model": "x", "input": "a"}, path="/v1/embeddings"), 404, "model_not_found")
    assert_openai_error(post(w, {"model": "x", "prompt": "a"}, path="/v1/completions"), 404, "model_not_found")


@pytest.mark.parametrize("method,path,allow", [
    ("GET", "/v1/chat/completions", "POST"), ("PUT", "/v1/completions", "POST"),
    ("DELETE", "/v1/embeddings", "POST"), ("POST", "/v1/models", "GET, HEAD"), ("POST", "/health", "GET, HEAD"),
    ("PATCH", "/metrics", "GET, HEAD")])
def test_wrong_method_405_with_allow(stack, method, path, allow):
    _, w = stack
    r = roundtrip(w.port, request(method, path, b"{}" if method != "GET" else None), method)
    assert_openai_error(r, 405)
    assert r.header("allow") == allow


@pytest.mark.parametrize("method,path", [("GET", "/"), ("GET", "/v2/models"), ("POST", "/v1/assistants"),
                                         ("POST", "/v1/chat/completions/x"), ("GET", "/v1/chat")])
def test_unknown_path_404(stack, method, path):
    _, w = stack
    r = roundtrip(w.port, request(method, path, b"{}" if method == "POST" else None), method)
    assert_openai_error(r, 404)


def test_huge_header_431(stack):
    _, w = stack
    r = roundtrip(w.port, request("GET", "/health", None, {"x-big": "a" * 70_000}), "GET")
    assert_openai_error(r, 431)
    many = {f"x-h{i}": "v" * 100 for i in range(700)}
    assert_openai_error(roundtrip(w.port, request("GET", "/health", None, many), "GET"), 431)


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.1\r\nthis is not a header\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /health HTTP/01.1\r\n\r\n",  # (malformed: a major version other than 1 is 505, test_front_fixes_55)
], ids=["garbage", "bad-header", "bad-length", "two-lengths", "bad-chunk", "bad-version"])
def test_malformed_http_400(stack, raw):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(raw)
        r = c.read_response("POST")
        assert_openai_error(r, 400)
        assert c.closed_by_peer()


def test_content_length_and_chunked_together_is_not_smuggled(stack):
    """CL + TE in one request: rejected with 400, or the chunked framing wins; never CL."""
    _, w = stack
    body = json.dumps(CHAT).encode()
    smuggled = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"
    payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(payload)) + payload + smuggled
    with RawConn(w.port) as c:
        c.send(raw)
        r = c.read_response("POST")
        if r.status == 400:
            assert_openai_error(r, 400)
        else:
            assert r.status == 200 and r.json()["object"] == "chat.completion"
            second = c.read_response("GET")  # the bytes after the chunked body are a request of their own
            assert second.status == 200 and b"weir_requests_total" in second.body


# --- upstream failures before the response head ----------------------------------

def test_upstream_refused_502(stack):
    _, w = stack
    with pytest.raises(openai.APIStatusError) as e:
        w.client().chat.completions.create(model="dead", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 502
    err = assert_openai_error(post(w, {**CHAT, "model": "dead", "stream": True}), 502)
    assert "refused" in err["message"]


def test_upstream_refused_502_quick_mode(weir):
    w = weir(upstream=f"http://127.0.0.1:{free_port()}")
    assert_openai_error(post(w, CHAT), 502)
    assert_openai_error(roundtrip(w.port, request("GET", "/v1/models"), "GET"), 502)


def test_connect_timeout_504(stack):
    _, w = stack
    request_id = "ct-" + uuid.uuid4().hex[:8]
    err = assert_openai_error(post(w, {**CHAT, "model": "blackhole"}, {"x-request-id": request_id}), 504)
    assert "timed out" in err["message"]
    entry = w.log_for(request_id)
    assert entry["status"] == 504 and entry["error"]["source"] == "upstream"


def test_first_byte_timeout_504_and_upstream_aborted(stack):
    m, w = stack
    aborts = m.aborts()
    with pytest.raises(openai.APIStatusError) as e:
        w.client().chat.completions.create(model="strict", messages=[{"role": "user", "content": "x"}],
                                           extra_headers={"x-mock-ttft-ms": "5000"})
    assert e.value.status_code == 504
    assert e.value.body["message"] and e.value.body["type"]
    # Weir gave up on the request: the model server must stop generating it.
    wait_until(lambda: m.aborts() > aborts, 10, message="mock abort after the first-byte timeout")


def stream_raw(w, body, headers=None):
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", {**body, "stream": True}, headers))
        r = c.read_response("POST")
    assert r.status == 200 and r.chunked, r
    return sse_data(r.body)


def assert_in_band_error(events, tokens_before: int | None = None):
    assert events[-1] == "[DONE]", events[-3:]
    err = json.loads(events[-2])
    assert set(err) == {"error"} and set(err["error"]) == {"message", "type", "param", "code"}, err
    assert err["error"]["message"]
    chunks = [json.loads(e) for e in events[:-2]]
    assert all("error" not in c for c in chunks)
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    if tokens_before is not None:
        assert len(content) == tokens_before
    return err["error"]


def test_idle_timeout_mid_stream_in_band_error(stack):
    m, w = stack
    aborts = m.aborts()
    events = stream_raw(w, {**CHAT, "model": "strict", "max_tokens": 8},
                        {"x-mock-stall-after": "3", "x-mock-stall-ms": "5000"})
    err = assert_in_band_error(events, tokens_before=3)
    assert "timed out" in err["message"]
    wait_until(lambda: m.aborts() > aborts, 10, message="mock abort after the idle timeout")


def test_idle_timeout_before_first_token_in_band_error(stack):
    """vLLM sends the stream head at once; a first token that never comes is an idle timeout."""
    _, w = stack
    events = stream_raw(w, {**CHAT, "model": "strict"}, {"x-mock-ttft-ms": "5000"})
    assert_in_band_error(events, tokens_before=0)


def test_idle_timeout_with_the_sdk(stack):
    _, w = stack
    stream = w.client().chat.completions.create(
        model="strict", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=8,
        extra_headers={"x-mock-stall-after": "2", "x-mock-stall-ms": "5000"})
    got = []
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            got.append(chunk)
    assert sum(1 for c in got if c.choices and c.choices[0].delta.content) == 2
    assert "timed out" in str(e.value.message)


def test_reset_mid_stream_in_band_error(stack):
    m, w = stack
    events = stream_raw(w, CHAT, {"x-mock-reset-after": "3"})
    assert_in_band_error(events, tokens_before=3)


def test_reset_before_response_502(stack):
    m, w = stack
    resets = m.metric("weir_mock_injected_resets_total")
    assert_openai_error(post(w, CHAT, {"x-mock-reset-after": "0"}), 502)
    assert m.metric("weir_mock_injected_resets_total") > resets


@pytest.mark.parametrize("status", [400, 404, 422, 429, 500, 503])
def test_upstream_status_passes_through_with_vllms_body(stack, status):
    m, w = stack
    hdrs = {"x-mock-status": str(status)}
    via = post(w, CHAT, hdrs)
    ref = roundtrip(m.process.port, request("POST", "/v1/chat/completions", CHAT, hdrs))
    assert via.status == ref.status == status
    # vLLM's body, its integer code null: OpenAI's code is a string or null (openai-java's code() throws on a
    # number; docs/protocols.md, "Upstream errors on the OpenAI routes").
    assert via.json() == {"error": {**ref.json()["error"], "code": None}}, via.body
    assert via.header("content-type") == ref.header("content-type")
    # streams too: vLLM answers a failed request with a plain JSON error, not SSE
    via = post(w, {**CHAT, "stream": True}, hdrs)
    assert via.status == status and via.json() == {"error": {**ref.json()["error"], "code": None}}


def test_upstream_status_with_the_sdk(stack):
    _, w = stack
    with pytest.raises(openai.RateLimitError):
        w.client().chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}],
                                           extra_headers={"x-mock-status": "429"})
    with pytest.raises(openai.InternalServerError) as e:
        w.client().chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}],
                                           stream=True, extra_headers={"x-mock-status": "500"})
    assert e.value.status_code == 500


def test_vllm_validation_error_passes_through(stack):
    """A request Weir forwards but vLLM rejects (bad field): vLLM's 400 body arrives with its words (its integer
    code null)."""
    m, w = stack
    bad = {**CHAT, "messages": "not a list"}
    via = post(w, bad)
    ref = roundtrip(m.process.port, request("POST", "/v1/chat/completions", bad))
    assert via.status == 400 == ref.status and via.json() == {"error": {**ref.json()["error"], "code": None}}
