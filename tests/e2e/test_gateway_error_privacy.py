"""Upstream failures as a client sees them (issue 8, defect 4): the error
body or in-band SSE error names the pool, the model and the request id, and
never the endpoint's address or port (the access log's `endpoint` field has
it).
"""

from __future__ import annotations

import json
import random
import string

import pytest

from conftest import free_port
from httpwire import RawConn, assert_openai_error, request, roundtrip, sse_data

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}
FAST = {"connect": "300ms", "first_byte": "400ms", "response": "400ms", "idle": "400ms"}


def rid(tag: str) -> str:
    # Letters only: the request id must not contain the port by chance.
    return f"priv-{tag}-" + "".join(random.choice(string.ascii_lowercase) for _ in range(12))


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "2", "--itl-ms", "2", "--max-tokens", "8")
    dead = free_port()
    w = module_weir(config={
        "server": {"max_response": "200B"},
        "pools": {
            "live-pool": {"endpoints": [m.base_url], "timeouts": FAST},
            "dead-pool": {"endpoints": [f"http://127.0.0.1:{dead}"]},
        },
        "models": {
            "mock-model": {"pool": "live-pool"},
            "gone": {"pool": "dead-pool", "upstream_model": "mock-model"},
        },
    })
    return m, w, dead


def assert_private(message: str, pool: str, model: str, request_id: str, ports: list[int]):
    assert "127.0.0.1" not in message and "http://" not in message, message
    for p in ports:
        assert str(p) not in message, message
    assert f"`{pool}`" in message, message
    assert f"`{model}`" in message, message
    assert request_id in message, message


def failing(w, model, headers, status, *, stream=False, path="/v1/chat/completions", body=None):
    i = rid(model)
    r = roundtrip(w.port, request("POST", path, body or {**CHAT, "model": model, "stream": stream},
                                  {"x-request-id": i, **headers}))
    err = assert_openai_error(r, status)
    assert r.header("x-request-id") == i
    return err["message"], i


def test_refused_names_the_pool_not_the_address(stack):
    m, w, dead = stack
    for stream in (False, True):
        msg, i = failing(w, "gone", {}, 502, stream=stream)
        assert "refused" in msg
        assert_private(msg, "dead-pool", "gone", i, [dead, m.process.port])
        assert w.log_for(i)["endpoint"] == f"http://127.0.0.1:{dead}"  # the address is in the log


def test_reset_before_the_response(stack):
    m, w, dead = stack
    msg, i = failing(w, "mock-model", {"x-mock-reset-after": "0"}, 502)
    assert_private(msg, "live-pool", "mock-model", i, [dead, m.process.port])
    assert w.log_for(i)["endpoint"] == m.base_url


def test_first_byte_timeout(stack):
    m, w, dead = stack
    msg, i = failing(w, "mock-model", {"x-mock-ttft-ms": "3000"}, 504)
    assert "timed out" in msg
    assert_private(msg, "live-pool", "mock-model", i, [dead, m.process.port])


def test_response_too_large(stack):
    m, w, dead = stack
    msg, i = failing(w, "mock-model", {}, 502)  # a chat.completion is larger than server.max_response (200 B)
    assert "larger than 200 bytes" in msg
    assert_private(msg, "live-pool", "mock-model", i, [dead, m.process.port])


@pytest.mark.parametrize("fault", [{"x-mock-reset-after": "3"},
                                   {"x-mock-stall-after": "3", "x-mock-stall-ms": "3000"}],
                         ids=["reset", "idle-timeout"])
def test_stream_that_fails_midway(stack, fault):
    m, w, dead = stack
    i = rid("stream")
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", {**CHAT, "model": "mock-model", "stream": True},
                       {"x-request-id": i, **fault}))
        r = c.read_response("POST")
    assert r.status == 200
    events = sse_data(r.body)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert "while streaming" in err["message"]
    assert_private(err["message"], "live-pool", "mock-model", i, [dead, m.process.port])
    assert w.log_for(i)["endpoint"] == m.base_url


def test_a_redirect_to_the_upstream_itself_is_made_relative(stack):
    # A model server that builds absolute redirects from the Host header
    # (uvicorn's trailing-slash redirect) names its own address: the client
    # gets the same path through the gateway instead.
    m, w, dead = stack
    i = rid("redirect")
    r = roundtrip(w.port, request("POST", "/v1/chat/completions", {**CHAT, "model": "mock-model"},
                                  {"x-request-id": i, "x-mock-redirect": "/v1/chat/completions/?a=1"}))
    assert r.status == 307
    assert r.header("location") == "/v1/chat/completions/?a=1"
    assert not [v for k, v in r.headers if str(m.process.port) in v], r.headers
    assert w.log_for(i)["endpoint"] == m.base_url
