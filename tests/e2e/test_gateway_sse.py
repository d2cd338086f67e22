"""The SSE relay against an upstream that frames streams the way real servers
may: events split at every byte, CRLF line ends, comments and fields, very
large events, a body delimited by close, no [DONE] (a broken stream), a truncated stream.

The upstream is a tiny raw-socket server in the test (weir-mock always frames
the same way), answering per the request's x-case header.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time

import pytest

from httpwire import RawConn, request, sse_data


def sse_event(data: str, crlf=False, extra="") -> bytes:
    nl = "\r\n" if crlf else "\n"
    lines = extra + "".join(f"data: {line}{nl}" for line in data.split("\n"))
    return (lines + nl).encode()


def chunk_json(i: int, text: str) -> str:
    return json.dumps({"id": "cmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "raw",
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


SPLIT_BODY = (
    b": keep-alive comment\n\n"
    + sse_event(chunk_json(0, " one"), crlf=True)
    + sse_event(chunk_json(1, " two"), extra="event: message\nid: 7\n")
    + sse_event(chunk_json(2, " three"))
    + sse_event("[DONE]")
)
BIG = chunk_json(0, "x" * (1 << 20))
HUGE = chunk_json(0, "y" * (5 << 20))


def chunked(data: bytes, piece: int) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + piece]), data[i:i + piece]) for i in range(0, len(data), piece))
    return out + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"


def answer(case: str) -> tuple[bytes, int]:
    """(bytes to send, write size) for a case; the server closes after sending."""
    if case == "split":
        return HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(SPLIT_BODY, 7), 3
    if case == "big":
        body = sse_event(BIG) + sse_event("[DONE]")
        return HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(body, 100_000), 65536
    if case == "huge":
        body = sse_event(HUGE) + sse_event("[DONE]")
        return HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(body, 100_000), 65536
    if case == "close-delimited":
        return HEAD + b"connection: close\r\n\r\n" + SPLIT_BODY, 5
    if case == "no-done":
        body = sse_event(chunk_json(0, " a")) + sse_event(chunk_json(1, " b"))
        return HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(body, 1000), 1000
    if case == "gzip-stream":  # an upstream that compresses its stream although asked for identity
        body = gzip.compress(SPLIT_BODY)
        return HEAD + b"content-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(body, 50), 1000
    if case == "truncated":
        body = sse_event(chunk_json(0, " a")) + sse_event(chunk_json(1, " b"))[:40]
        return HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(body), body), 1000
    raise ValueError(case)


class RawUpstream:
    """Accepts connections; reads one request; writes the case's bytes in small writes; closes."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.stop = False
        self.accepted = 0
        self.served_done_then_end = 0
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while not self.stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while self.serve_one(conn):
                pass
        except OSError:
            pass
        finally:
            conn.close()

    def serve_one(self, conn: socket.socket) -> bool:
        """Answers one request; False once the connection is done."""
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return False
            buf += data
        head, _, body = buf.partition(b"\r\n\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.decode().partition(":") for line in head.split(b"\r\n")[1:])}
        need = int(headers.get("content-length", "0"))
        while len(body) < need:
            body += conn.recv(65536)
        if headers.get("x-case") == "done-then-end":
            # [DONE] at once, the body's last chunk only later: a client that
            # stops at [DONE] (the openai SDK does) has left by then. Keep-alive.
            body = sse_event(chunk_json(0, " a")) + sse_event("[DONE]")
            conn.sendall(HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(body), body))
            time.sleep(0.3)
            conn.sendall(b"0\r\n\r\n")
            self.served_done_then_end += 1
            return True
        data, piece = answer(headers.get("x-case", "split"))
        for i in range(0, len(data), piece):
            conn.sendall(data[i:i + piece])
            if piece < 64:
                time.sleep(0.0005)  # separate segments: Weir sees the stream in pieces
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(65536):
            pass
        return False

    def close(self):
        self.stop = True
        self.listener.close()


@pytest.fixture(scope="module")
def upstream():
    up = RawUpstream()
    yield up
    up.close()


@pytest.fixture(scope="module")
def stack(module_weir, upstream):
    return module_weir(upstream=f"http://127.0.0.1:{upstream.port}")


def stream(w, case: str):
    with RawConn(w.port, timeout=20) as c:
        c.send(request("POST", "/v1/chat/completions",
                       {"model": "raw", "messages": [{"role": "user", "content": "x"}], "stream": True},
                       {"x-case": case, "x-request-id": f"sse-{case}"}))
        r = c.read_response("POST")
    assert r.status == 200 and r.chunked
    return r


@pytest.mark.parametrize("case", ["split", "close-delimited"])
def test_events_split_at_every_byte_pass_through_intact(stack, case):
    r = stream(stack, case)
    assert r.body == SPLIT_BODY  # comments, fields, CRLF and all
    entry = stack.log_for(f"sse-{case}")
    assert entry["status"] == 200 and entry["error"] is None


def test_one_mib_event(stack):
    r = stream(stack, "big")
    assert sse_data(r.body) == [BIG, "[DONE]"]


def test_stream_without_done_is_broken_after_its_tokens(stack):
    # vLLM always ends with [DONE]: a body that just stops without it was cut short (test_gateway_stream_end.py).
    r = stream(stack, "no-done")
    events = sse_data(r.body)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-2]] == [" a", " b"]
    assert "ended the stream before it was complete" in json.loads(events[-2])["error"]["message"]
    entry = stack.log_for("sse-no-done")
    assert entry["status"] == 200 and entry["error"] == {"source": "upstream", "code": "upstream_unavailable"}


@pytest.mark.parametrize("case", ["truncated", "huge"])
def test_broken_stream_ends_with_in_band_error_and_done(stack, case):
    r = stream(stack, case)
    events = sse_data(r.body)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if case == "truncated":
        assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-2]] == [" a"]


@pytest.mark.parametrize("accept", ["gzip", "identity"])
def test_compressed_stream_matches_its_headers(stack, accept):
    """Weir asks for streams uncompressed; if the upstream compresses anyway, what the client gets
    must still decode per its headers, and never be gzip for a client that did not accept it."""
    with RawConn(stack.port, timeout=20) as c:
        c.send(request("POST", "/v1/chat/completions",
                       {"model": "raw", "messages": [{"role": "user", "content": "x"}], "stream": True},
                       {"x-case": "gzip-stream", "accept-encoding": accept}))
        r = c.read_response("POST")
    encoding = (r.header("content-encoding") or "identity").lower()
    if accept == "identity":
        assert encoding == "identity"
    if r.status == 200:
        assert r.decoded() == SPLIT_BODY
    else:  # refusing the stream is acceptable, in OpenAI's shape
        assert r.status == 502 and json.loads(r.decoded())["error"]["message"]


def test_client_that_leaves_at_done_completes_and_a_late_upstream_end_is_not_waited_for(weir, upstream):
    """The openai SDK closes its connection as soon as it reads [DONE]; the upstream's last
    bytes may come later. That is a complete stream (200, no error). The stream ended at the
    [DONE] (docs/reliability.md, "How a stream ends"): the upstream's body end, 0.3 s later,
    is not waited for, so that connection is closed, not pooled, and the next request opens
    another."""
    stack = weir(upstream=f"http://127.0.0.1:{upstream.port}", workers=1)  # one worker: one upstream pool
    accepted = upstream.accepted
    for i in range(2):
        with RawConn(stack.port, timeout=20) as c:
            c.send(request("POST", "/v1/chat/completions",
                           {"model": "raw", "messages": [{"role": "user", "content": "x"}], "stream": True},
                           {"x-case": "done-then-end", "x-request-id": f"sse-done-then-end-{i}"}))
            c.read_until(b"data: [DONE]")
        entry = stack.log_for(f"sse-done-then-end-{i}")
        assert entry["status"] == 200 and entry["error"] is None, entry
        assert entry["events"] == 2
    assert upstream.accepted == accepted + 2
