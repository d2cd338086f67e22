"""Small edges (stop 51).

1. Host: with an explicit allow list (server.allowed_hosts, admin.allowed_hosts) an EMPTY Host, or none at all
   (HTTP/1.0), passed as if it were listed. A list names the hosts served: "" is none of them, so such a request
   now gets 421 host_not_allowed like any unlisted host (the defaults, which no list set, still answer it: no
   browser sends an empty Host or none). RFC 9112 §3.2's 400 for an HTTP/1.1 request without Host or any request
   with two Host fields was already right on both listeners; it is pinned here with a list configured too.
"""
from __future__ import annotations

import hashlib
import socket

import httpx
import pytest

from conftest import free_port, wait_until
from httpwire import RawConn, assert_openai_error

KEY = "sk-edges-51"
AUTH = {"authorization": f"Bearer {KEY}"}
ADMIN_TOKEN = "edges-51-admin-token-0123456789"


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def raw(port: int, request: bytes):
    with RawConn(port) as c:
        c.send(request)
        return c.read_response(request.split(b" ", 1)[0].decode())


# --- 1. Host ---------------------------------------------------------------------------------------


def host_stack(mock, weir, listed: bool):
    """Weir with both listeners: with `listed`, both allow lists name api.example only."""
    admin_port = free_port()
    admin = {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}
    cfg = {"pools": {"p": {"endpoints": [mock().base_url]}}, "default_pool": "p"}
    if listed:
        admin["allowed_hosts"] = ["api.example"]
        cfg["server"] = {"allowed_hosts": ["api.example"]}
    cfg["admin"] = admin
    w = weir(config=cfg, env={"WEIR_TEST_ADMIN_TOKEN": ADMIN_TOKEN})
    wait_until(lambda: listening(admin_port), 5, message="admin listener")
    return w.port, admin_port


def refused_421(r, listener: str) -> None:
    err = assert_openai_error(r, 421, "host_not_allowed")
    assert err["type"] == "invalid_request_error", err
    assert ("admin.allowed_hosts" if listener == "admin" else "server.allowed_hosts") in err["message"], err
    assert "without a host name" in err["message"], err


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_a_list_answers_an_empty_or_missing_host_421(mock, weir, listener):
    client_port, admin_port = host_stack(mock, weir, listed=True)
    port = client_port if listener == "client" else admin_port
    path = b"/health" if listener == "client" else b"/ready"
    # An empty Host (RFC 9112 §3.2 allows it when the target URI has no authority), on 1.1 and 1.0, with
    # or without whitespace; and none at all on 1.0.
    for req in (b"GET " + path + b" HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
                b"GET " + path + b" HTTP/1.1\r\nHost:   \r\nConnection: close\r\n\r\n",
                b"GET " + path + b" HTTP/1.0\r\nHost: \r\n\r\n",
                b"GET " + path + b" HTTP/1.0\r\n\r\n"):
        refused_421(raw(port, req), listener)
    # /metrics too (what a list protects), and on the client listener the API.
    refused_421(raw(port, b"GET /metrics HTTP/1.0\r\n\r\n"), listener)
    if listener == "client":
        refused_421(raw(port, b"GET /v1/models HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n"), listener)
    # The listed name still passes, on 1.0 as on 1.1.
    assert raw(port, b"GET " + path + b" HTTP/1.0\r\nHost: API.example:8080\r\n\r\n").status == 200
    assert raw(port, b"GET " + path + b" HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n").status == 200


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_without_a_list_an_empty_or_missing_host_is_answered(mock, weir, listener):
    # The defaults (loopback: IP literals and localhost for /metrics and the admin listener) take a request
    # without a name: only a browser's request rebinds a name, and a browser always names one.
    client_port, admin_port = host_stack(mock, weir, listed=False)
    port = client_port if listener == "client" else admin_port
    for path in (b"/metrics", b"/ready"):
        assert raw(port, b"GET " + path + b" HTTP/1.0\r\n\r\n").status == 200
        assert raw(port, b"GET " + path + b" HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n").status == 200


@pytest.mark.parametrize("listed", [False, True], ids=["default", "listed"])
@pytest.mark.parametrize("listener", ["client", "admin"])
def test_rfc9112_host_count_is_400_before_the_host_check(mock, weir, listener, listed):
    # RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host, and for any request with two (1.0 included),
    # whether or not a list is configured (the malformed request is refused as such, not as a host).
    client_port, admin_port = host_stack(mock, weir, listed=listed)
    port = client_port if listener == "client" else admin_port
    for req in (b"GET /ready HTTP/1.1\r\nConnection: close\r\n\r\n",
                b"GET /ready HTTP/1.1\r\nHost: api.example\r\nHost: api.example\r\nConnection: close\r\n\r\n",
                b"GET /ready HTTP/1.1\r\nHost: api.example\r\nHost:\r\nConnection: close\r\n\r\n",
                b"GET /ready HTTP/1.0\r\nHost: api.example\r\nHost: api.example\r\n\r\n"):
        err = assert_openai_error(raw(port, req), 400)
        assert "Host" in err["message"], err

