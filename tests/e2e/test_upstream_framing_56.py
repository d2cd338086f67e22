"""An upstream's Transfer-Encoding that Weir cannot frame soundly (RFC 9112 §6.1, §6.3, §7.1).

- `Transfer-Encoding: chunked, chunked` (chunked applied twice, which a sender MUST NOT do): Beast read it as no
  chunked framing and the body up to the close, so a client got the chunk-size lines as content (a chat stream
  with `97\\r\\n` before its events, logged as a clean 200), and a kept-alive upstream held the request until
  `timeouts.idle`. Now refused at the head like any coding Weir does not decode: 502, a retry may answer.
- An HTTP/1.0 answer with Transfer-Encoding has faulty framing: its connection is closed after it, never
  pooled for the next request.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from httpwire import chunked

EMB = (b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"m",'
       b'"usage":{"prompt_tokens":1,"total_tokens":1}}')
EVENT = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
         b'"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n')


class RawUpstream:
    """Answers every request on a connection with `answer(path)`; records (connection, request) numbers."""

    def __init__(self, answer):
        self.answer = answer
        self.log: list[tuple[int, int, str]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self):
        n = 0
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            n += 1
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c, n), daemon=True).start()

    def _serve(self, c: socket.socket, cno: int):
        buf = b""
        k = 0
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(rest) < length:
                    rest += c.recv(65536)
                buf = rest[length:]
                k += 1
                path = head.split(b" ")[1].decode()
                self.log.append((cno, k, path))
                data, close = self.answer(path)
                c.sendall(data)
                if close:
                    c.close()
                    return
        except OSError:
            return

    def close(self):
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def answer_twice_chunked(path: str):
    if path.endswith("/chat/completions"):
        body = b"%x\r\n%s\r\n" % (len(EVENT), EVENT) + chunked(b"data: [DONE]\n\n")
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
                + body, True)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
            + chunked(EMB), False)  # kept alive: a body read to the close would wait out timeouts.idle


@pytest.fixture
def twice(weir):
    up = RawUpstream(answer_twice_chunked)
    w = weir(config={"pools": {"p": {"endpoints": [up.url], "retry": {"attempts": 1},
                                     "timeouts": {"idle": "20s"}}},
                     "models": {"m": {"pool": "p"}}})
    yield up, w
    up.close()


def test_chunked_applied_twice_is_refused_not_relayed(twice):
    up, w = twice
    r = httpx.post(f"{w.v1}/chat/completions", json={"model": "m", "stream": True, "messages": [
        {"role": "user", "content": "hi"}]}, timeout=15)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_unavailable", r.text
    assert "\r\n" not in r.text
    r = httpx.post(f"{w.v1}/embeddings", json={"model": "m", "input": "x"}, timeout=15)
    assert r.status_code == 502, r.text  # at once, not after timeouts.idle (the client's timeout is 15 s)
    assert r.json()["error"]["code"] == "upstream_unavailable", r.text


def answer_http10_chunked(path: str):
    return (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EMB), False)


def test_an_http10_answer_with_transfer_encoding_is_not_pooled(weir):
    up = RawUpstream(answer_http10_chunked)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}})
        with httpx.Client(timeout=15) as c:
            for _ in range(3):
                r = c.post(f"{w.v1}/embeddings", json={"model": "m", "input": "x"})
                assert r.status_code == 200, r.text
                assert r.json()["data"][0]["embedding"] == [0.1]
        assert [k for _, k, _ in up.log] == [1, 1, 1], up.log  # a new upstream connection each time
    finally:
        up.close()
