"""The admin listener's log line for a head it refuses or never gets whole, as the client listener's.

Before: `bytes_in` counted only what Beast's parser had taken (0 for `GARBAGE`, the first lines of a head with a
bad field or over the limit, 22 of a head left part-way), the method and path of a request line that parsed were
lost when a later line failed (`"-"` and `""`), and an HTTP/2 request line got 400, not 505 (RFC 9110 §15.6.6).
docs/observability.md: `bytes_in` counts a refused head to its blank line where that came, else all of it that
came, on both listeners.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from conftest import free_port, wait_until

ENV = {"WEIR_TEST_ADMIN_TOKEN": "admin-token-for-log-tests-0123456789"}


@pytest.fixture(scope="module")
def admin(module_weir):
    port = free_port()
    w = module_weir(config={"pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}}, "models": {"m": {"pool": "p"}},
                            "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
                    env=ENV)

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False

    wait_until(ready, 5, message="admin listener")
    return w, port


def send(port: int, data: bytes, close_early: bool = False) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        if close_early:
            return b""
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def admin_line(w, predicate) -> dict:
    entries = w.wait_log(lambda es: any(e.get("listener") == "admin" and predicate(e) for e in es))
    return [e for e in entries if e.get("listener") == "admin" and predicate(e)][-1]


def test_garbage_counts_what_came(admin):
    w, port = admin
    data = b"GARBAGE-56\r\n\r\n"
    assert send(port, data).startswith(b"HTTP/1.1 400")
    e = admin_line(w, lambda e: e["status"] == 400 and e["bytes_in"] == len(data))
    assert e["method"] == "-"


def test_a_bad_field_keeps_the_request_line_and_counts_the_head(admin):
    w, port = admin
    data = b"GET /health?bad-field-56 HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n"
    assert send(port, data).startswith(b"HTTP/1.1 400")
    e = admin_line(w, lambda e: e["path"] == "/health" and e["status"] == 400)
    assert e["method"] == "GET"
    assert e["bytes_in"] == len(data)


def test_http2_request_line_is_505(admin):
    w, port = admin
    data = b"GET /ready HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n"
    out = send(port, data)
    assert out.startswith(b"HTTP/1.1 505"), out[:200]
    assert b"http_version_not_supported" in out
    e = admin_line(w, lambda e: e["status"] == 505)
    assert e["bytes_in"] == len(data)


def test_a_head_left_part_way_is_a_499_with_its_request_line(admin):
    w, port = admin
    data = b"GET /metrics?left-56 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Partial: a"
    send(port, data, close_early=True)
    e = admin_line(w, lambda e: e["status"] == 499 and e["path"] == "/metrics")
    assert e["method"] == "GET"
    assert e["bytes_in"] == len(data)
