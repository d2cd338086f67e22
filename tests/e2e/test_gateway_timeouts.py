"""Downstream timeouts: a client that sends its head or body too slowly, idles
on a keep-alive connection, or stops reading a large answer is dropped within
the configured bound (small here; the bounds below are generous multiples).
"""

from __future__ import annotations

import time

import pytest

from conftest import wait_until
from httpwire import RawConn, assert_openai_error, request


@pytest.fixture
def stack(mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(workers=1, config={
        "server": {"header_timeout": "300ms", "body_timeout": "300ms", "keepalive_timeout": "300ms",
                   "write_timeout": "300ms"},
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"mock-model": {"pool": "p"}},
    })
    return m, w


def test_slow_head_gets_408(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")  # and nothing more
        t0 = time.monotonic()
        r = c.read_response("POST")
        assert time.monotonic() - t0 < 5
        assert_openai_error(r, 408)
        assert c.closed_by_peer()


def test_slow_body_gets_408(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", None, {"content-length": "100",
                                                              "x-request-id": "slow-body"}) + b'{"model"')
        r = c.read_response("POST")
        assert_openai_error(r, 408)
    assert w.log_for("slow-body")["status"] == 408


def test_idle_keepalive_connection_is_closed(stack):
    _, w = stack
    with RawConn(w.port) as c:
        c.send(request("GET", "/health"))
        assert c.read_response("GET").status == 200
        assert c.closed_by_peer(5)
    wait_until(lambda: w.metric("weir_active_connections") == 1, 5,  # the /metrics reader's own
               message="the idle connection gone from weir_active_connections")


def test_client_that_stops_reading_a_large_answer_is_dropped(stack):
    m, w = stack
    body = {"model": "mock-model", "input": [f"text {i}" for i in range(64)], "dimensions": 4096,
            "encoding_format": "float"}
    c = RawConn(w.port, rcvbuf=4096, timeout=10)
    c.send(request("POST", "/v1/embeddings", body, {"x-request-id": "stopped-reading"}))
    entry = w.log_for("stopped-reading", timeout=10)  # logged once Weir gives up writing
    assert entry["status"] == 499 and entry["bytes_out"] < 5_000_000
    received = c.read_to_eof()
    c.close()
    assert len(received) < 5_000_000
