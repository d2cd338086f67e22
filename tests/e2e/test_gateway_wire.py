"""HTTP/1.x on the wire: pipelining, HTTP/1.0 clients, HEAD."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from httpwire import RawConn, request, sse_data

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "2", "--itl-ms", "2", "--max-tokens", "6")
    w = module_weir(upstream=m)
    return m, w


def chat(request_id: str, stream=False, **headers) -> bytes:
    return request("POST", "/v1/chat/completions", {"model": "mock-model", "messages": MSG, "stream": stream},
                   {"x-request-id": request_id, **headers})


def test_pipelined_requests_answer_in_order(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(chat("p1") + chat("p2") + request("GET", "/health", None, {"x-request-id": "p3"}))
        r1, r2 = c.read_response("POST"), c.read_response("POST")
        r3 = c.read_response("GET")
    assert [r.status for r in (r1, r2, r3)] == [200, 200, 200]
    assert [r.header("x-request-id") for r in (r1, r2, r3)] == ["p1", "p2", "p3"]
    # (vLLM's id is its x-request-id's: the client's with Weir's generated one after it.)
    assert r1.json()["id"].startswith("chatcmpl-p1-") and r2.json()["id"].startswith("chatcmpl-p2-")


def test_pipelined_after_a_stream(stack):
    """A request pipelined behind a stream waits for the stream's end, then gets its answer."""
    _, w = stack
    with RawConn(w.port) as c:
        c.send(chat("s1", stream=True) + chat("s2") + chat("s3", stream=True, connection="close"))
        r1 = c.read_response("POST")
        r2 = c.read_response("POST")
        r3 = c.read_response("POST")
        assert c.closed_by_peer()
    assert r1.chunked and sse_data(r1.body)[-1] == "[DONE]" and r1.header("x-request-id") == "s1"
    assert r2.json()["id"].startswith("chatcmpl-s2-")
    assert r3.chunked and sse_data(r3.body)[-1] == "[DONE]" and r3.header("x-request-id") == "s3"
    assert (r3.header("connection") or "").lower() == "close"


def test_pipelined_bodies_split_across_packets(stack):
    """Request boundaries inside one segment and requests split over many sends."""
    _, w = stack
    data = chat("q1") + chat("q2")
    with RawConn(w.port) as c:
        for i in range(0, len(data), 37):
            c.send(data[i:i + 37])
        r1, r2 = c.read_response("POST"), c.read_response("POST")
    assert r1.json()["id"].startswith("chatcmpl-q1-") and r2.json()["id"].startswith("chatcmpl-q2-")


def test_http10_client_streams_without_chunked(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", {"model": "mock-model", "messages": MSG, "stream": True},
                       version="1.0"))
        r = c.read_response("POST")
    assert r.status == 200
    assert r.header("transfer-encoding") is None and r.header("content-length") is None
    assert r.closed  # the body ends when the connection closes
    assert r.body.startswith(b"data: {")
    events = sse_data(r.body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for ch in chunks if ch["choices"][0]["delta"].get("content")) == 6


def test_http10_client_non_streaming(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", {"model": "mock-model", "messages": MSG}, version="1.0"))
        r = c.read_response("POST")
        assert r.status == 200 and int(r.header("content-length")) == len(r.body)
        assert r.json()["usage"]["completion_tokens"] == 6
        assert c.closed_by_peer()  # HTTP/1.0 without keep-alive


def test_head_health(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(request("HEAD", "/health"))
        r = c.read_response("HEAD")
        assert r.status == 200 and r.body == b""
        # nothing but the head was sent: the next response on the connection parses cleanly
        c.send(request("GET", "/health", None, {"x-request-id": "after-head"}))
        r2 = c.read_response("GET")
        assert r2.status == 200 and r2.header("x-request-id") == "after-head"
        assert json.loads(r2.body) == {"status": "ok"}
        assert c.buf == b""


def test_head_proxied_models(stack):
    """Quick mode proxies /v1/models; a HEAD there returns the upstream's head only."""
    _, w = stack
    with RawConn(w.port) as c:
        c.send(request("HEAD", "/v1/models") + request("GET", "/health"))
        r = c.read_response("HEAD")
        assert r.status == 200 and r.body == b""
        r2 = c.read_response("GET")
        assert r2.status == 200 and json.loads(r2.body) == {"status": "ok"}


# --- empty lines before a request-line (RFC 9112 §2.2) ----------------------------------

def test_empty_lines_before_a_request_are_skipped(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(b"\r\n\r\n\n" + chat("crlf-1"))  # CRLFs and a bare LF, in the request's own write
        assert c.read_response("POST").status == 200
        c.send(b"\r\n")  # a CRLF after the body, alone, then the next request in another write
        c.send(chat("crlf-2"))
        assert c.read_response("POST").status == 200


def test_a_bare_cr_is_not_an_empty_line_however_it_arrives(stack):
    _, w = stack
    for pieces in ([b"\rGET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"], [b"\r", b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"]):
        with RawConn(w.port) as c:
            for p in pieces:
                c.send(p)
                time.sleep(0.05)  # (separate segments)
            assert c.read_response("GET").status == 400, pieces


def test_a_connection_that_sent_only_empty_lines_is_idle(module_mock, weir):
    m = module_mock("--ttft-ms", "2", "--itl-ms", "2", "--max-tokens", "6")
    w = weir(config={"server": {"keepalive_timeout": "500ms", "drain_timeout": "10s"},
                     "pools": {"p": {"endpoints": [m.base_url]}}, "models": {"mock-model": {"pool": "p"}}})
    with RawConn(w.port) as c:
        c.send(chat("before-idle") + b"\r\n")
        assert c.read_response("POST").status == 200
        # Idle for keepalive_timeout: closed without a 408 and without a log line.
        assert c.closed_by_peer(5)
        assert c.read_to_eof() == b""
    with RawConn(w.port) as c:
        c.send(chat("then-drain") + b"\r\n")
        assert c.read_response("POST").status == 200
        os.kill(w.process.pid, signal.SIGTERM)  # an idle connection: closed at once, not at the drain deadline
        assert w.process.popen.wait(7) == 0  # (drain_timeout is 10 s: room for a loaded machine, and short of it)
    ids = [e.get("request_id") for e in w.log_entries()]
    assert ids == ["before-idle", "then-drain"], ids
