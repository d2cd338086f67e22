"""Raw HTTP/1.x over sockets for tests about bytes on the wire.

``RawConn(port)`` is one client TCP connection; ``send`` writes bytes,
``read_response`` parses one response (status line, headers, body framed by
Content-Length, chunked encoding or close) and keeps any bytes after it for
the next response (pipelining). ``iter_chunks`` reads a chunked body
piece by piece, for streams a test wants to cut short.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import socket


def request(method: str, path: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None,
            version: str = "1.1", content_length: bool = True) -> bytes:
    """The bytes of one request; a dict body is JSON-encoded; Host is added if missing."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    # (An IP literal: the admin listener on loopback answers no other names, admin.allowed_hosts.)
    hdrs = {"host": "127.0.0.1"}
    if data is not None:
        hdrs["content-type"] = "application/json"
        if content_length:
            hdrs["content-length"] = str(len(data))
    for k, v in (headers or {}).items():
        hdrs = {h: x for h, x in hdrs.items() if h.lower() != k.lower()}
        hdrs[k] = v
    head = f"{method} {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    return head.encode() + (data or b"")


def chunked(data: bytes, piece: int = 65536) -> bytes:
    """``data`` in chunked transfer coding (pieces of ``piece`` bytes, then the last chunk)."""
    out = []
    for i in range(0, len(data), piece):
        part = data[i:i + piece]
        out.append(b"%x\r\n%s\r\n" % (len(part), part))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


@dataclasses.dataclass
class Response:
    version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes                 # the body as framed on the wire, de-chunked (still content-encoded)
    chunked: bool = False
    closed: bool = False        # the server closed the connection after it (or reset it)

    def header(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return default

    def header_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def decoded(self) -> bytes:
        """The body after undoing Content-Encoding (gzip only)."""
        enc = (self.header("content-encoding") or "identity").lower()
        if enc in ("gzip", "x-gzip"):
            return gzip.decompress(self.body)
        assert enc == "identity", enc
        return self.body

    def json(self):
        return json.loads(self.decoded())


class ConnectionClosed(Exception):
    pass


class RawConn:
    """One client connection. ``rcvbuf`` shrinks SO_RCVBUF before connecting (a slow reader)."""

    def __init__(self, port: int, timeout: float = 10.0, rcvbuf: int | None = None, host: str = "127.0.0.1"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buf = b""
        self.eof = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self, reset: bool = False) -> None:
        if reset:
            import struct
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def _fill(self) -> bool:
        """Reads more bytes; False at EOF (or reset)."""
        if self.eof:
            return False
        try:
            data = self.sock.recv(262144)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            if not self._fill():
                raise ConnectionClosed(f"closed before {marker!r}; have {self.buf[:300]!r}")
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionClosed(f"closed after {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_to_eof(self) -> bytes:
        while self._fill():
            pass
        out, self.buf = self.buf, b""
        return out

    def read_head(self) -> Response:
        head = self.read_until(b"\r\n\r\n").decode("latin-1")
        lines = head[:-4].split("\r\n")
        version, status, *reason = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.append((k.strip(), v.strip()))
        return Response(version, int(status), reason[0] if reason else "", headers, b"")

    def read_response(self, method: str = "GET", skip_interim: bool = True) -> Response:
        """One response; for HEAD (``method``) and 1xx/204/304 there is no body."""
        while True:
            r = self.read_head()
            if not (skip_interim and 100 <= r.status < 200):
                break
        if method == "HEAD" or 100 <= r.status < 200 or r.status in (204, 304):
            return r
        te = (r.header("transfer-encoding") or "").lower()
        if "chunked" in te:
            r.chunked = True
            r.body = b"".join(self.iter_chunks())
        elif r.header("content-length") is not None:
            r.body = self.read_exact(int(r.header("content-length")))
        else:
            r.body = self.read_to_eof()
            r.closed = True
        return r

    def iter_chunks(self):
        """Yields each chunk's data of a chunked body until the last chunk (trailers skipped)."""
        while True:
            size_line = self.read_until(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while self.read_until(b"\r\n") != b"\r\n":
                    pass
                return
            data = self.read_exact(size)
            assert self.read_exact(2) == b"\r\n", "chunk not followed by CRLF"
            yield data

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True if the server closes (EOF or RST) within ``timeout`` s with nothing more to read."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
        if data:
            self.buf += data
            return False
        return True


def sse_data(body: bytes | str) -> list[str]:
    """The data of each SSE event in a complete body (``data: X`` lines, events split by a blank line)."""
    text = body.decode() if isinstance(body, bytes) else body
    out = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        lines = [ln[5:].lstrip(" ") if ln.startswith("data:") else None for ln in event.split("\n") if ln]
        data = [ln for ln in lines if ln is not None]
        if data:
            out.append("\n".join(data))
    return out


def roundtrip(port: int, data: bytes, method: str = "POST", timeout: float = 10.0) -> Response:
    """Sends one request on a new connection and returns its response."""
    with RawConn(port, timeout=timeout) as c:
        c.send(data)
        return c.read_response(method)


def assert_openai_error(r: Response, status: int, code: str | None = None) -> dict:
    """The response is ``status`` with an OpenAI-shaped error body; returns error{}."""
    assert r.status == status, (r.status, r.body[:500])
    assert (r.header("content-type") or "").startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    if code is not None:
        assert err["code"] == code, err
    return err
