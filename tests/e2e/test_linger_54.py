"""An answer given before the request body was read, then a close: the client that writes its whole body before
it reads (what nginx does when it forwards a body) must read the answer, not a reset (RFC 9112 §9.6).

Weir's lingering close stopped discarding after a count of bytes (max_body, or 1 MiB) and closed with the rest
unread: the kernel reset the connection, and nginx answered its client 502 for Weir's 413 or 401 (the openai SDK
then uploaded the body again). It now discards until the client closes, a 2 s silence, or server.body_timeout.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import pytest

MB = 1 << 20


def config(m, **extra) -> dict:
    return {"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
            "server": {"max_body": "64KiB", "body_timeout": "20s"}, **extra}


def write_all_then_read(port: int, head: bytes, body_parts) -> bytes:
    """Sends the head and every body part (blocking, the whole of it), then reads the answer to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        s.sendall(head)
        for part in body_parts:
            s.sendall(part)  # a reset here is what the client (nginx) takes for a failed upstream
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return answer
            answer += chunk


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def big_body(size: int):
    piece = b"x" * (256 * 1024)
    sent = 0
    while sent < size:
        n = min(len(piece), size - sent)
        yield piece[:n]
        sent += n


@pytest.mark.parametrize("case", ["413-by-length", "401-from-head", "404-path", "413-chunked"])
def test_an_early_answer_reaches_a_client_that_writes_its_whole_body_first(case, weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    extra = {}
    if case == "401-from-head":
        extra = {"tenants": {"t": {}}, "auth": {"required": True, "api_keys": [
            {"id": "k", "sha256": hashlib.sha256(b"sk-good").hexdigest(), "tenant": "t"}]}}
    w = weir(config=config(m, **extra))
    size = 3 * MB
    path = b"/v1/nope" if case == "404-path" else b"/v1/chat/completions"
    if case == "413-chunked":
        head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
               b"Transfer-Encoding: chunked\r\n\r\n"

        def chunks():
            for part in big_body(size):
                yield b"%x\r\n" % len(part) + part + b"\r\n"
            yield b"0\r\n\r\n"

        parts = chunks()
        want = 413
    else:
        head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
               b"Content-Length: " + str(size).encode() + b"\r\n\r\n"
        parts = big_body(size)
        want = {"413-by-length": 413, "401-from-head": 401, "404-path": 404}[case]
    answer = write_all_then_read(w.port, head, parts)
    assert status_of(answer) == want, answer[:300]


def test_a_client_that_never_stops_sending_is_still_cut_off(weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    cfg = config(m)
    cfg["server"]["body_timeout"] = "2s"
    w = weir(config=cfg)
    with socket.create_connection(("127.0.0.1", w.port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
        assert status_of(got) == 413, got
        stop = threading.Event()
        ended = {}

        def keep_sending():
            piece = b"y" * 65536
            try:
                while not stop.is_set():
                    s.sendall(piece)
            except OSError as e:
                ended["at"] = time.monotonic()
                ended["error"] = e

        started = time.monotonic()
        t = threading.Thread(target=keep_sending, daemon=True)
        t.start()
        t.join(20)
        stop.set()
        # Cut within body_timeout's bound (generously: a busy host), not left open for good.
        assert "at" in ended, "the connection was never closed"
        assert ended["at"] - started < 15
