"""`Expect: 100-continue` on both listeners (RFC 9110 §10.1.1; docs/operations.md): a client that sends it
waits for `HTTP/1.1 100 Continue` before its body (curl waits 1 s for it). Both listeners send it once the
head has passed every check that does not need the body, credentials included; a head refused on its own
gets its final answer instead (401, 413, ...) and the connection then closes (the unread body is drained,
not answered); an expectation other than 100-continue gets 417. Raw sockets: the test sends the head,
asserts what comes back before it sends any body byte, then the body.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import free_port, wait_until
from httpwire import RawConn, chunked, request

TOKEN = "admin-expect-token-0123456789"
KEY = "sk-expect"


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "3", "--model", "m")
    admin_port = free_port()
    w = module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p"}},
        "tenants": {"acme": {}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": sha(KEY), "tenant": "acme"}]},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_EXPECT_ADMIN_TOKEN"},
    }, env={"WEIR_TEST_EXPECT_ADMIN_TOKEN": TOKEN})

    def admin_up():
        try:
            with RawConn(admin_port, timeout=2) as c:
                c.send(request("GET", "/ready"))
                return c.read_response().status == 200
        except OSError:
            return False
    wait_until(admin_up, 5, message="admin listener")
    return w, admin_port


CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
KEY_BODY = json.dumps({"tenant": "acme", "name": "expect"}).encode()


def head_only(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The request's head (Content-Length for `body`), without the body."""
    return request("POST", path, body, headers)[:-len(body)]


def listeners(stack):
    w, admin_port = stack
    return {"client": (w.port, "/v1/chat/completions", CHAT, {"authorization": f"Bearer {KEY}"}, 200),
            "admin": (admin_port, "/admin/v1/keys", KEY_BODY, {"authorization": f"Bearer {TOKEN}"}, 201)}


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_100_continue_comes_before_the_body_is_sent(stack, listener, framing):
    port, path, body, auth, status = listeners(stack)[listener]
    hdrs = {**auth, "expect": "100-continue"}
    if framing == "chunked":
        head = request("POST", path, None, {**hdrs, "content-type": "application/json",
                                            "transfer-encoding": "chunked"})
        payload = chunked(body)
    else:
        head, payload = head_only(path, body, hdrs), body
    with RawConn(port) as c:
        c.send(head)
        interim = c.read_head()  # nothing of the body sent yet
        assert (interim.version, interim.status) == ("HTTP/1.1", 100)
        c.send(payload)
        r = c.read_response("POST")
        assert r.status == status, r.body
        # The connection serves the next request, with Expect again.
        c.send(head)
        assert c.read_head().status == 100
        c.send(payload)
        assert c.read_response("POST").status == status


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("credential", ["missing", "wrong"])
def test_an_unauthenticated_head_gets_401_without_100_and_the_connection_closes(stack, listener, credential):
    port, path, body, auth, _ = listeners(stack)[listener]
    hdrs = {"expect": "100-continue"}
    if credential == "wrong":
        hdrs["authorization"] = "Bearer not-the-right-one"
    with RawConn(port) as c:
        c.send(head_only(path, body, hdrs))
        r = c.read_response("POST", skip_interim=False)  # the first answer is the final one
        assert r.status == 401, r.body
        assert json.loads(r.body)["error"]["type"] in ("invalid_request_error", "authentication_error")
        assert (r.header("connection") or "").lower() == "close"
        # A client that sends its body anyway gets nothing more: it is drained, never taken as a request.
        c.send(body)
        assert c.closed_by_peer()
        assert c.buf == b""


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("expect", ["something-else", "100-continue, x-more", "200-ok"])
def test_an_unknown_expectation_gets_417(stack, listener, expect):
    port, path, body, auth, _ = listeners(stack)[listener]
    with RawConn(port) as c:
        c.send(head_only(path, body, {**auth, "expect": expect}))
        r = c.read_response("POST", skip_interim=False)
        assert r.status == 417, r.body
        assert json.loads(r.body)["error"]["code"] == "expectation_failed"
        assert (r.header("connection") or "").lower() == "close"
        assert c.closed_by_peer()


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_a_body_over_the_limit_gets_413_without_100(stack, listener):
    port, path, _, auth, _ = listeners(stack)[listener]
    with RawConn(port) as c:
        c.send(request("POST", path, None, {**auth, "content-type": "application/json",
                                            "content-length": str(64 << 20), "expect": "100-continue"}))
        r = c.read_response("POST", skip_interim=False)
        assert r.status == 413, r.body


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_an_http10_expectation_is_ignored(stack, listener):
    # RFC 9110 §10.1.1: a server MUST ignore a 100-continue expectation in an HTTP/1.0 request.
    port, path, body, auth, status = listeners(stack)[listener]
    with RawConn(port) as c:
        c.send(request("POST", path, body, {**auth, "expect": "100-continue"}, version="1.0"))
        r = c.read_response("POST", skip_interim=False)
        assert r.status == status, r.body


def test_the_refused_request_is_logged_once(stack):
    w, _ = stack
    head = head_only("/v1/chat/completions", CHAT, {"expect": "100-continue", "x-request-id": "expect-401"})
    with RawConn(w.port) as c:
        c.send(head)
        assert c.read_response("POST", skip_interim=False).status == 401
    entry = w.log_for("expect-401")
    assert entry["status"] == 401 and entry["bytes_in"] == len(head)  # the head alone: its body was never read
