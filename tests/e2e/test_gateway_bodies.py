"""Field cases (/work/shared/cases/README.md): request body sizes and framing,
the body limit, large responses, and compressed upstream bodies.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import socket
import threading
import uuid

import httpx
import pytest

from httpwire import RawConn, assert_openai_error, chunked, request, roundtrip

MiB = 1 << 20


def chat_body(size: int, model: str = "mock-model") -> bytes:
    """A valid chat request of exactly ``size`` bytes (the user message pads it)."""
    empty = json.dumps({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": ""}]},
                       separators=(",", ":")).encode()
    pad = size - len(empty)
    assert pad >= 0
    content = ("lorem " * (pad // 6 + 1))[:pad]
    body = json.dumps({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]},
                      separators=(",", ":")).encode()
    assert len(body) == size
    return body


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "8", "--max-model-len", "100000000")
    w = module_weir(upstream=m)
    return m, w


def rid() -> str:
    return "b-" + uuid.uuid4().hex[:16]


def check_echo(r, sent: bytes):
    assert r.status == 200, (r.status, r.body[:300])
    assert int(r.header("x-mock-body-bytes")) == len(sent)
    assert r.header("x-mock-body-sha256") == hashlib.sha256(sent).hexdigest()
    names = r.header("x-mock-headers").split(",")
    assert "transfer-encoding" not in names and "expect" not in names
    assert names.count("content-length") == 1
    body = r.json()
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 2


# --- body sizes ---------------------------------------------------------------

@pytest.mark.parametrize("size", [32_769, MiB, int(3.9 * MiB)], ids=["32769B", "1MiB", "3.9MiB"])
def test_body_sizes_reach_upstream_intact(stack, size):
    _, w = stack
    body = chat_body(size)
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", body, {"x-mock-echo": "1"}))
    check_echo(r, body)


def test_body_1mib_with_the_sdk(stack):
    _, w = stack
    content = "token " * (MiB // 6)
    request_id = rid()
    out = w.client().chat.completions.create(model="mock-model", max_tokens=2,
                                             messages=[{"role": "user", "content": content}],
                                             extra_headers={"x-request-id": request_id})
    assert out.usage.prompt_tokens == 4 + MiB // 6
    entry = w.log_for(request_id)
    assert entry["status"] == 200 and entry["bytes_in"] > MiB


@pytest.mark.parametrize("piece", [1, 1000, 65536])
def test_chunked_body_without_content_length(stack, piece):
    _, w = stack
    body = chat_body(300_000 if piece > 1 else 2_000)
    data = request("POST", "/v1/chat/completions", None, {"x-mock-echo": "1", "transfer-encoding": "chunked",
                                                          "content-type": "application/json"})
    r = roundtrip(w.port, data + chunked(body, piece))
    check_echo(r, body)


def test_chunked_body_with_the_sdk_client_library(stack):
    """httpx sends an iterator body chunked; the upstream gets it whole with a Content-Length."""
    _, w = stack
    body = chat_body(MiB)
    r = httpx.post(w.base_url + "/v1/chat/completions", content=iter([body[:1000], body[1000:]]), timeout=30,
                   headers={"content-type": "application/json", "x-mock-echo": "1"})
    assert r.status_code == 200
    assert r.headers["x-mock-body-sha256"] == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_expect_100_continue(stack, framing):
    _, w = stack
    body = chat_body(200_000)
    hdrs = {"x-mock-echo": "1", "expect": "100-continue"}
    if framing == "chunked":
        hdrs["transfer-encoding"] = "chunked"
        head = request("POST", "/v1/chat/completions", None, hdrs | {"content-type": "application/json"})
        payload = chunked(body)
    else:
        head = request("POST", "/v1/chat/completions", body, hdrs)[:-len(body)]
        payload = body
    with RawConn(w.port) as c:
        c.send(head)
        interim = c.read_head()  # the client waits for it before sending the body
        assert interim.status == 100
        c.send(payload)
        r = c.read_response("POST")
    check_echo(r, body)


# --- the body limit -------------------------------------------------------------

def test_over_limit_413_without_reading_the_body(stack):
    """A huge Content-Length gets 413 although only a little of the body was sent."""
    _, w = stack
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 104857600\r\n\r\n")
    with RawConn(w.port) as c:
        c.send(head + b'{"model":"mock-model","messages":[' + b" " * 1000)
        r = c.read_response("POST")
        assert_openai_error(r, 413)
        assert (r.header("connection") or "").lower() == "close"
        assert c.closed_by_peer()


def test_over_limit_with_expect_gets_413_and_no_100(stack):
    _, w = stack
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 4194305\r\nexpect: 100-continue\r\n\r\n")
    with RawConn(w.port) as c:
        c.send(head)
        r = c.read_response("POST", skip_interim=False)
    assert_openai_error(r, 413)


def test_over_limit_chunked_gets_413(stack):
    """Chunked bodies have no length up front: the limit still holds, and without the whole body."""
    _, w = stack
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    with RawConn(w.port) as c:
        c.send(head + b"a00000\r\n" + b"x" * 5000)  # a 10 MiB chunk, barely begun
        r = c.read_response("POST")
    assert_openai_error(r, 413)


def test_at_the_default_limit_is_accepted(stack):
    _, w = stack
    body = chat_body(4 * MiB)
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", body, {"x-mock-echo": "1"}))
    check_echo(r, body)


@pytest.fixture(scope="module")
def small_limit(module_mock, module_weir):
    m = module_mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "8", "--max-model-len", "100000000")
    w = module_weir(config={"server": {"max_body": "64KiB"}, "pools": {"p": {"endpoints": [m.base_url]}},
                            "models": {"mock-model": {"pool": "p"}}})
    return m, w


def test_configured_max_body_boundary(small_limit):
    _, w = small_limit
    ok = chat_body(64 * 1024)
    check_echo(roundtrip(w.port, request("POST", "/v1/chat/completions", ok, {"x-mock-echo": "1"})), ok)
    over = chat_body(64 * 1024 + 1)
    request_id = rid()
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", over, {"x-request-id": request_id}))
    err = assert_openai_error(r, 413)
    assert "65536" in err["message"]
    assert w.log_for(request_id)["status"] == 413
    # chunked, over the configured limit
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", None, {"transfer-encoding": "chunked"})
                  + chunked(over, 4096))
    assert_openai_error(r, 413)


def test_configured_limit_413_with_the_sdk(small_limit):
    import openai
    _, w = small_limit
    with pytest.raises(openai.APIStatusError) as e:
        w.client().chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x" * 70000}])
    assert e.value.status_code == 413
    assert e.value.body["type"] and e.value.body["message"]


# --- large responses ---------------------------------------------------------------

def test_5mb_response_arrives_untruncated_on_the_wire(stack):
    _, w = stack
    body = {"model": "mock-model", "input": [f"text {i}" for i in range(64)], "dimensions": 4096,
            "encoding_format": "float"}
    r = roundtrip(w.port, request("POST", "/v1/embeddings", body, {"connection": "close"}), timeout=30)
    assert r.status == 200
    assert int(r.header("content-length")) == len(r.body) > 5_000_000
    doc = json.loads(r.body)
    assert len(doc["data"]) == 64 and all(len(d["embedding"]) == 4096 for d in doc["data"])


# --- content-encoding -----------------------------------------------------------------

def gz_request(headers: dict[str, str], accept: str | None) -> bytes:
    hdrs = {"x-mock-gzip": "1", **headers}
    if accept is not None:
        hdrs["accept-encoding"] = accept
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
    return request("POST", "/v1/chat/completions", body, hdrs)


def encoding_of(r) -> str:
    return (r.header("content-encoding") or "identity").lower()


@pytest.mark.parametrize("accept,gzip_ok", [("gzip", True), ("gzip, deflate, br", True), ("identity", False),
                                            ("br", False), ("gzip;q=0, identity", False), (None, False)])
def test_gzip_upstream_body_matches_headers(stack, accept, gzip_ok):
    _, w = stack
    request_id = rid()
    r = roundtrip(w.port, gz_request({"x-request-id": request_id}, accept))
    assert r.status == 200
    assert int(r.header("content-length")) == len(r.body)
    if gzip_ok:
        assert encoding_of(r) == "gzip"
        assert r.body[:2] == b"\x1f\x8b"
    else:
        assert encoding_of(r) == "identity", r.headers  # a client that did not accept gzip never gets it
    doc = r.json()  # decodes per the headers
    assert doc["usage"] == {"prompt_tokens": 6, "total_tokens": 9, "completion_tokens": 3,
                            "prompt_tokens_details": None}
    entry = w.log_for(request_id)
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (6, 3)


@pytest.mark.parametrize("accept", ["gzip", "identity"])
def test_gzip_error_body_stays_readable(stack, accept):
    m, w = stack
    request_id = rid()
    r = roundtrip(w.port, gz_request({"x-mock-status": "400", "x-request-id": request_id}, accept))
    assert r.status == 400
    assert int(r.header("content-length")) == len(r.body)
    # vLLM's integer code makes it no OpenAI error object: rewritten into one (code null), so written plain
    # (docs/protocols.md, "Upstream errors on the OpenAI routes"); a gzip body in OpenAI's shape stays gzip below.
    assert encoding_of(r) == "identity"
    err = r.json()["error"]
    assert err["code"] is None and "injected error" in err["message"]
    assert w.log_for(request_id)["status"] == 400


@pytest.mark.parametrize("accept", ["gzip", "identity", None])
def test_gzip_labelled_empty_body_stays_empty_200(stack, accept):
    _, w = stack
    r = roundtrip(w.port, gz_request({"x-mock-empty-body": "1"}, accept))
    assert r.status == 200, r.body
    assert r.header("content-length") == "0" and r.body == b""
    if accept != "gzip":
        assert encoding_of(r) == "identity", r.headers
    # and an ordinary HTTP client reads it without a decoding error
    hdrs = {"x-mock-gzip": "1", "x-mock-empty-body": "1"} | ({"accept-encoding": accept} if accept else {})
    h = httpx.post(w.v1 + "/chat/completions", timeout=10, headers=hdrs,
                   json={"model": "mock-model", "messages": [{"role": "user", "content": "x"}]})
    assert h.status_code == 200 and h.content == b""


# A tiny upstream for the exact case: a gzipped chat.completion with usage 3/1/4.

COMPLETION_314 = json.dumps({
    "id": "chatcmpl-314", "object": "chat.completion", "created": 1, "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
# OpenAI's error object: passes as it came, gzip to a client that accepts it.
ERROR_400 = json.dumps({"error": {"message": "bad things", "type": "invalid_request_error", "param": None,
                                  "code": "bad_things"}}).encode()
VLLM_ERROR_400 = json.dumps({"error": {"message": "bad things", "type": "BadRequestError", "param": None,
                                       "code": 400}}).encode()


class TinyUpstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        case = self.headers.get("x-case", "ok")
        status, body, encoding = {
            "ok": (200, gzip.compress(COMPLETION_314), "gzip"),
            "error": (400, gzip.compress(ERROR_400), "gzip"),
            "vllm-error": (400, gzip.compress(VLLM_ERROR_400), "gzip"),
            "empty": (200, b"", "gzip"),
            "corrupt": (200, b"\x1f\x8b\x08\x00 this is not gzip", "gzip"),
            "br": (200, b"\x0b\x02\x80brotli-ish bytes", "br"),
        }[case]
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-encoding", encoding)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def tiny(module_weir):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TinyUpstream)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    w = module_weir(upstream=f"http://127.0.0.1:{server.server_address[1]}")
    yield w
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("accept", ["gzip", "identity"])
def test_gzip_usage_3_1_4_recorded_either_way(tiny, accept):
    w = tiny
    request_id = rid()
    before = w.metric("weir_prompt_tokens_total")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", body,
                                  {"accept-encoding": accept, "x-request-id": request_id}))
    assert r.status == 200
    assert int(r.header("content-length")) == len(r.body)
    assert encoding_of(r) == ("gzip" if accept == "gzip" else "identity")
    assert r.decoded() == COMPLETION_314
    entry = w.log_for(request_id)
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (3, 1)
    assert w.metric("weir_prompt_tokens_total") == before + 3


def test_gzip_usage_with_the_sdk(tiny):
    """The SDK (httpx accepts gzip) gets a body it can decode, with usage 3/1/4."""
    out = tiny.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (3, 1, 4)


@pytest.mark.parametrize("accept", ["gzip", "identity"])
def test_tiny_gzip_error_and_empty(tiny, accept):
    w = tiny
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", body, {"accept-encoding": accept,
                                                                         "x-case": "error"}))
    assert r.status == 400 and int(r.header("content-length")) == len(r.body)
    assert r.decoded() == ERROR_400
    assert encoding_of(r) == ("gzip" if accept == "gzip" else "identity")
    # (vLLM's own, with its integer code: rewritten into OpenAI's shape, plain.)
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", body, {"accept-encoding": accept,
                                                                         "x-case": "vllm-error"}))
    assert r.status == 400 and encoding_of(r) == "identity"
    assert json.loads(r.body) == {"error": {**json.loads(VLLM_ERROR_400)["error"], "code": None}}
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", body, {"accept-encoding": accept,
                                                                         "x-case": "empty"}))
    assert r.status == 200 and r.body == b"" and r.header("content-length") == "0"
    if accept != "gzip":
        assert encoding_of(r) == "identity", r.headers


@pytest.mark.parametrize("case", ["corrupt", "br"])
def test_undecodable_completion_never_reaches_a_client(tiny, case):
    """Weir cannot decode it, so it cannot read its usage: an OpenAI-shaped 502 whether or not
    the client accepts the encoding (passed on, the answer would escape limits and budgets), and
    never a body in an encoding the client refused."""
    w = tiny
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    encoding = "gzip" if case == "corrupt" else "br"
    for accept in (encoding, "identity"):
        r = roundtrip(w.port, request("POST", "/v1/chat/completions", body,
                                      {"accept-encoding": accept, "x-case": case}))
        assert encoding_of(r) == "identity"
        # One code for every body that is no answer, undecodable or not.
        assert_openai_error(r, 502, "upstream_invalid_response")
