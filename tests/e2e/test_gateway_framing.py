"""Request framing and the head checks RFC 9112 asks of a server, on both listeners (client and admin):
read buffers bounded against endless chunk extensions and chunk-size lines (the class of
CVE-2024-22019 / CVE-2023-39326), Transfer-Encoding that is not a single final chunked refused and the
connection closed (request smuggling, RFC 9112 §6.1, §6.3), absolute-form targets served by their path
and never forwarded as they came (§3.2.2), Host required on HTTP/1.1 (§3.2), 431 for an oversized head on
both listeners; and an upstream whose chunk framing never ends (502, memory bounded).
"""

from __future__ import annotations

import json
import socket
import threading
import uuid

import pytest

from conftest import free_port, wait_until
from httpwire import RawConn, Response, assert_openai_error, request

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
TOKEN = "admin-test-token-framing-0123456789"
SMUGGLED = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    admin_port = free_port()
    w = module_weir(config={
        "pools": {"main": {"endpoints": [m.base_url]}},
        "models": {"mock-model": {"pool": "main"}},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
    }, env={"WEIR_TEST_ADMIN_TOKEN": TOKEN})

    def admin_ready():
        try:
            return roundtrip_raw(admin_port, b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").status == 200
        except OSError:
            return False

    wait_until(admin_ready, 5, message="admin listener")
    return m, w, admin_port


def roundtrip_raw(port: int, data: bytes, method: str = "GET") -> Response:
    with RawConn(port) as c:
        c.send(data)
        return c.read_response(method)


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def parse_response(data: bytes) -> Response:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = []
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers.append((k.strip().lower(), v.strip()))
    length = int(dict(headers).get("content-length", len(body)))
    return Response(version="1.1", status=status, reason="", headers=headers, body=body[:length])


def flood(port: int, head: bytes, filler: bytes, total: int) -> tuple[bytes, int]:
    """Sends `head`, then `filler` repeated up to `total` bytes while reading what comes back;
    returns (the bytes received until the server closed, the bytes sent)."""
    s = socket.create_connection(("127.0.0.1", port))
    got = bytearray()
    closed = threading.Event()

    def reader():
        while True:
            try:
                d = s.recv(65536)
            except OSError:
                break
            if not d:
                break
            got.extend(d)
        closed.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    sent = 0
    piece = filler * ((1 << 20) // len(filler))
    try:
        s.sendall(head)
        while sent < total and not closed.is_set():
            s.sendall(piece)
            sent += len(piece)
    except OSError:
        pass
    t.join(10)
    s.close()
    return bytes(got), sent


# --- 1. bounded read buffers ---------------------------------------------------------------------


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("line", ["extension", "zeros"])
def test_endless_chunk_line_is_refused_with_memory_bounded(stack, listener, line):
    """64 MiB of one chunk's extension (or of leading zeros on its size line) is refused with a 400
    that arrives, the connection is closed, and Weir's peak RSS grows by far less than what was sent."""
    _, w, admin_port = stack
    port = w.port if listener == "client" else admin_port
    path = "/v1/chat/completions" if listener == "client" else "/admin/v1/keys"
    request_id = "ext-" + uuid.uuid4().hex[:8]
    # (With the admin token: the admin listener refuses a request without one on its head, before its body.)
    auth = f"Authorization: Bearer {TOKEN}\r\n" if listener == "admin" else ""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
            f"x-request-id: {request_id}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    head += b"4c;e=" if line == "extension" else b""
    before = peak_rss(w.process.pid)
    got, sent = flood(port, head, b"a" if line == "extension" else b"0", 64 << 20)
    grown = peak_rss(w.process.pid) - before
    assert got, f"no answer after {sent} bytes"
    r = parse_response(got)
    err = assert_openai_error(r, 400)
    assert "framing" in err["message"], err
    assert r.header("connection") == "close"
    assert grown < 32 << 20, f"peak RSS grew {grown >> 20} MiB for {sent >> 20} MiB sent"
    assert sent < 64 << 20, "Weir read the whole flood instead of refusing it"
    if listener == "client":
        assert w.log_for(request_id)["status"] == 400  # exactly one access-log line


def test_chunk_extensions_spread_over_many_chunks_are_counted(stack):
    """Extensions are counted against server.max_header over the whole body, not per chunk."""
    _, w, _ = stack
    body = json.dumps(CHAT).encode()
    chunks = b"".join(b"1;e=%s\r\n%s\r\n" % (b"a" * 1000, body[i:i + 1]) for i in range(len(body)))
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + chunks * 2 + b"0\r\n\r\n")
    with RawConn(w.port) as c:
        c.send(raw)
        assert_openai_error(c.read_response("POST"), 400)
        assert c.closed_by_peer()
    # A few short extensions are fine.
    few = b"".join(b"%x;n=v\r\n%s\r\n" % (len(body[i:i + 16]), body[i:i + 16]) for i in range(0, len(body), 16))
    r = roundtrip_raw(w.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n" + few + b"0\r\n\r\n", "POST")
    assert r.status == 200 and r.json()["object"] == "chat.completion"


@pytest.mark.parametrize("ext", [b'a="x\ny"', b'a="x\x00y"', b'a="x\x01y"', b'a="x\x7fy"', b"a=x\x01y"],
                         ids=["quoted-lf", "quoted-nul", "quoted-soh", "quoted-del", "bare-soh"])
def test_a_control_byte_in_a_chunk_extension_is_refused_on_both_listeners(stack, ext):
    """A bare LF (or any control byte) inside a quoted chunk extension: Beast skips quoted strings
    unchecked, and a proxy in front that ends the line at the LF frames the body differently (the
    class of CVE-2025-22871, CVE-2025-55315). RFC 9112 §7.1.1 allows none: 400, the connection closed,
    and the request pipelined after it never served."""
    _, w, admin_port = stack
    for port, path, body, auth in ((w.port, b"/v1/chat/completions", json.dumps(CHAT).encode(), b""),
                                   (admin_port, b"/admin/v1/keys", b"{}", b"Authorization: Bearer " +
                                    TOKEN.encode() + b"\r\n")):
        raw = (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + auth +
               b"Transfer-Encoding: chunked\r\n\r\n%x;" % len(body) + ext + b"\r\n" + body + b"\r\n0\r\n\r\n" +
               SMUGGLED)
        with RawConn(port) as c:
            c.send(raw)
            r = c.read_response("POST")
            assert r.status == 400, (port, r.status, r.body[:200])
            assert c.closed_by_peer()


class EndlessChunkUpstream:
    """A raw upstream: GETs get a model list; a POST gets a chunked 200 whose first chunk-size line
    never ends (an extension of up to 64 MiB)."""

    def __init__(self, answer: bytes | None = None):
        self.answer = answer  # a POST's whole answer instead of the endless chunk line
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.request_lines: list[bytes] = []
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = conn.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                self.request_lines.append(lines[0])
                length = 0
                for h in lines[1:]:
                    k, _, v = h.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                if lines[0].startswith(b"GET"):
                    body = b'{"object":"list","data":[{"id":"mock-model","object":"model"}]}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(body), body))
                    continue
                if self.answer is not None:
                    conn.sendall(self.answer)
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n4c;e=")
                piece = b"a" * (1 << 20)
                while self.sent < 64 << 20:
                    conn.sendall(piece)
                    self.sent += len(piece)
                return
        except OSError:
            return
        finally:
            conn.close()

    def close(self):
        self.listener.close()


def test_upstream_endless_chunk_extension_is_502_with_memory_bounded(weir):
    up = EndlessChunkUpstream()
    try:
        w = weir(upstream=f"http://127.0.0.1:{up.port}", workers=1)
        before = peak_rss(w.process.pid)
        r = roundtrip_raw(w.port, request("POST", "/v1/chat/completions", CHAT), "POST")
        grown = peak_rss(w.process.pid) - before
        assert_openai_error(r, 502)
        assert grown < 32 << 20, f"peak RSS grew {grown >> 20} MiB"
        assert up.sent < 64 << 20, "Weir read the whole endless chunk line"
    finally:
        up.close()


def test_upstream_transfer_encoding_with_content_length_is_502(weir):
    """RFC 9112 §6.3: Transfer-Encoding overrides Content-Length and the message ought to be handled
    as an error; Beast would frame a non-chunked coding by Content-Length (a split response)."""
    body = b'{"id":"x","object":"chat.completion","choices":[]}'
    up = EndlessChunkUpstream(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip\r\n"
                              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        w = weir(upstream=f"http://127.0.0.1:{up.port}", workers=1)
        assert_openai_error(roundtrip_raw(w.port, request("POST", "/v1/chat/completions", CHAT), "POST"), 502)
    finally:
        up.close()


# --- 2. Transfer-Encoding: smuggling -------------------------------------------------------------


FRAMING_CASES = [
    ("chunked-identity+cl", "1.1", "chunked, identity", True, 400),
    ("xchunked+cl", "1.1", "xchunked", True, 400),
    ("gzip+cl", "1.1", "gzip", True, 400),
    ("chunked-identity", "1.1", "chunked, identity", False, 400),
    ("identity", "1.1", "identity", False, 400),
    ("chunked-twice", "1.1", "chunked, chunked", False, 400),
    ("gzip-chunked", "1.1", "gzip, chunked", False, 501),
    ("http10-chunked", "1.0", "chunked", False, 400),
]


def framing_request(path: str, version: str, te: str, with_cl: bool) -> bytes:
    body = json.dumps(CHAT).encode()
    payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = f"POST {path} HTTP/{version}\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: {te}\r\n"
    if with_cl:
        head += f"Content-Length: {len(payload)}\r\n"
    return head.encode() + b"\r\n" + payload + SMUGGLED


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("name,version,te,with_cl,status", FRAMING_CASES, ids=[c[0] for c in FRAMING_CASES])
def test_transfer_encoding_not_a_single_final_chunked_is_refused_and_closes(stack, listener, name, version, te,
                                                                             with_cl, status):
    """RFC 9112 §6.3: Transfer-Encoding with Content-Length, or not ending in chunked → 400; §6.1: a
    coding Weir does not implement → 501; either way the connection closes, so the bytes after the
    head (a smuggled request) are never served."""
    _, w, admin_port = stack
    port = w.port if listener == "client" else admin_port
    path = "/v1/chat/completions" if listener == "client" else "/admin/v1/keys"
    with RawConn(port) as c:
        c.send(framing_request(path, version, te, with_cl))
        r = c.read_response("POST")
        err = assert_openai_error(r, status)
        if status == 501:
            assert err["code"] == "unsupported_transfer_coding"
        assert r.header("connection") == "close"
        assert c.closed_by_peer()
        assert not c.buf, c.buf[:200]


# --- 3. absolute-form targets ---------------------------------------------------------------------


def test_absolute_form_is_routed_and_forwarded_by_its_path(weir):
    up = EndlessChunkUpstream()  # its GETs answer; the request line it got is recorded
    try:
        w = weir(upstream=f"http://127.0.0.1:{up.port}", workers=1)
        # (An IP literal: on a loopback listener without credential checks, a name is refused, 421, as
        # server.allowed_hosts' default holds what needs no credential: test_client_hosts_50.)
        r = roundtrip_raw(w.port, b"GET http://127.0.0.77/v1/models?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert r.status == 200, r.body[:300]
        lines = [line for line in up.request_lines if b"/v1/models" in line]
        assert lines and all(line.split(b" ")[1].startswith(b"/") for line in lines), up.request_lines
        assert not any(b"127.0.0.77" in line for line in up.request_lines)
    finally:
        up.close()


def test_absolute_form_chat_reaches_the_upstream_in_origin_form(stack):
    m, w, _ = stack
    request_id = "abs-" + uuid.uuid4().hex[:8]
    data = request("POST", "http://127.0.0.77/v1/chat/completions", CHAT, {"x-request-id": request_id})
    r = roundtrip_raw(w.port, data, "POST")
    # The mock 404s any other path: a 200 means its request line carried the origin-form.
    assert r.status == 200 and r.json()["object"] == "chat.completion", r.body[:300]
    assert w.log_for(request_id)["path"] == "/v1/chat/completions"


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("target", ["*", "evil.example:443", "ftp://evil.example/v1/chat/completions"])
def test_asterisk_and_authority_form_are_400(stack, listener, target):
    _, w, admin_port = stack
    port = w.port if listener == "client" else admin_port
    with RawConn(port) as c:
        c.send(f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{{}}".encode())
        err = assert_openai_error(c.read_response("POST"), 400)
        assert "target" in err["message"]
        assert c.closed_by_peer()


def test_admin_absolute_form_is_served_by_its_path(stack):
    _, _, admin_port = stack
    assert roundtrip_raw(admin_port, b"GET http://127.0.0.1/ready HTTP/1.1\r\nHost: x\r\n\r\n").status == 200
    # Its authority is the request's host (RFC 9112 §3.2.2), which admin.allowed_hosts checks: test_admin_host_49.
    assert roundtrip_raw(admin_port, b"GET http://evil.example/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").status == 421


# --- 4. Host ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("hosts", [[], ["a", "b"], ["a", "a"], ["a b/c"]], ids=["none", "two", "twice", "invalid"])
def test_http11_without_exactly_one_valid_host_is_400(stack, listener, hosts):
    _, w, admin_port = stack
    port = w.port if listener == "client" else admin_port
    raw = b"GET /health HTTP/1.1\r\n" if listener == "client" else b"GET /ready HTTP/1.1\r\n"
    raw += b"".join(b"Host: %s\r\n" % h.encode() for h in hosts) + b"\r\n"
    with RawConn(port) as c:
        c.send(raw)
        r = c.read_response("GET")
        err = assert_openai_error(r, 400)
        assert "Host" in err["message"]
        assert c.closed_by_peer()


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_http10_without_host_is_served(stack, listener):
    _, w, admin_port = stack
    port = w.port if listener == "client" else admin_port
    raw = b"GET /health HTTP/1.0\r\n\r\n" if listener == "client" else b"GET /ready HTTP/1.0\r\n\r\n"
    assert roundtrip_raw(port, raw).status == 200


# --- 5. 431 on both listeners ---------------------------------------------------------------------


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_oversized_head_is_431_on_both_listeners(stack, listener):
    _, w, admin_port = stack
    port = w.port if listener == "client" else admin_port
    path = "/health" if listener == "client" else "/ready"
    with RawConn(port) as c:
        c.send(request("GET", path, None, {"x-big": "a" * 70_000}))
        err = assert_openai_error(c.read_response("GET"), 431)
        assert err["code"] == "request_header_too_large", err   # the same code on both listeners
        assert c.closed_by_peer()
