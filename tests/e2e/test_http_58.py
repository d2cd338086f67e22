"""HTTP front and upstream parsing (stop 58: a parser differential, ~250 crafted requests and upstream answers).

H1. DEFECT: Weir read interim (1xx) upstream heads without end: an upstream sending 103 Early Hints as fast as it
    could for 4 s had Weir read 11.5 million of them (~460 MB, ~2 s of a worker's CPU), then serve its 200; each
    head was checked on its own, their number never. Now the interim heads count together against the response
    head limit (64 KiB, as Go counts them against MaxResponseHeaderBytes): past it the attempt fails as an
    oversized head does (502 upstream_unavailable), and the connection is not reused.
H2. DEFECT: a malformed HTTP-version got 505 for the digit after the slash (``HTTP/01.1`` → "HTTP/0 is not
    supported", ``HTTP/2``); RFC 9112 §2.3: HTTP-version = "HTTP/" DIGIT "." DIGIT, a malformed one is a 400. And
    ``HTTP/1.2`` was refused (400) where RFC 9110 §2.5 says to process it as the highest minor of that major the
    server speaks: now read as HTTP/1.1, on both listeners.
H3. DEFECT: an obs-folded trailer line in a request was accepted where the same fold in the head is refused (and
    the README said trailer fields are all dropped, while a Content-Length or Transfer-Encoding trailer is a 400).
    Now a request's trailer lines follow the head's rules where they could frame or fold: 400, as the README says.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest

from conftest import free_port, wait_until
from httpwire import RawConn

HINT = b"HTTP/1.1 103 Early Hints\r\n\r\n"


def chat_answer(content: str) -> bytes:
    body = json.dumps({"id": "chatcmpl-58", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


class HintingUpstream:
    """A raw HTTP/1.1 upstream (keep-alive, a thread per connection). A request for model ``flood`` is answered
    with ``hints`` 103 heads, then a 200 whose content is "after-flood"; any other with a 200 of "fresh".
    ``served`` lists (connection number, model) per request."""

    def __init__(self, hints: int):
        self.hints = hints
        self.served: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(c)
                n = len(self.conns)
            threading.Thread(target=self._serve, args=(c, n), daemon=True).start()

    def _serve(self, c: socket.socket, n: int) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = c.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(buf) < length:
                    data = c.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                model = json.loads(body)["model"]
                with self.lock:
                    self.served.append((n, model))
                if model == "flood":
                    c.sendall(HINT * self.hints + chat_answer("after-flood"))
                else:
                    c.sendall(chat_answer("fresh"))
        except OSError:
            return
        finally:
            c.close()

    def stop(self) -> None:
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.close()
                except OSError:
                    pass


@pytest.fixture
def hinting():
    ups: list[HintingUpstream] = []

    def make(hints: int) -> HintingUpstream:
        ups.append(HintingUpstream(hints))
        return ups[-1]

    yield make
    for u in ups:
        u.stop()


def hint_gateway(weir, up: HintingUpstream):
    return weir(config={"pools": {"p": {"endpoints": [f"http://127.0.0.1:{up.port}"]}},
                        "models": {"flood": {"pool": "p"}, "ok": {"pool": "p"}}}, workers=1)


def test_interim_heads_over_the_head_limit_in_all_are_a_502_and_the_connection_is_not_reused(weir, hinting):
    # 3,000 heads of 27 bytes: 81 KB, past the 64 KiB a response head may have (a few thousand, not millions).
    up = hinting(3000)
    w = hint_gateway(weir, up)
    client = w.client()
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="flood", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 502
    err = exc.value.body if isinstance(exc.value.body, dict) else {}
    assert err.get("code") == "upstream_unavailable", exc.value.body
    assert "response head larger than 65536 bytes" in err.get("message", ""), exc.value.body
    flood_conns = {n for n, model in up.served if model == "flood"}
    assert flood_conns
    # The pool's next request: answered on a fresh connection with its own answer, not the flood's leftover 200.
    r = client.chat.completions.create(model="ok", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "fresh"
    assert up.served[-1][1] == "ok" and up.served[-1][0] not in flood_conns, up.served


def test_interim_heads_within_the_head_limit_are_skipped(weir, hinting):
    up = hinting(64 * 1024 // len(HINT))  # (2,427 heads: 65,529 bytes in all)
    w = hint_gateway(weir, up)
    r = w.client().chat.completions.create(model="flood", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "after-flood"
    r = w.client().chat.completions.create(model="ok", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "fresh"


def gateway(weir, mock):
    m = mock()
    return weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"mock-model": {"pool": "p"}}},
                workers=1)


@pytest.fixture(scope="module")
def module_gateway(module_weir, module_mock):
    return gateway(module_weir, module_mock)


def models_request(version: bytes) -> bytes:
    return b"GET /v1/models " + version + b"\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test\r\n\r\n"


@pytest.mark.parametrize("version", [b"HTTP/01.1", b"HTTP/001.1", b"HTTP/2", b"HTTP/10.1", b"HTTP/1", b"HTTP/1.1.1",
                                     b"HTTP/2.0.0", b"HTTP/1.x", b"http/1.1"])
def test_a_malformed_http_version_is_a_400(module_gateway, version):
    with RawConn(module_gateway.port) as raw:
        raw.send(models_request(version))
        r = raw.read_response("GET")
    assert r.status == 400, (version, r.status, r.body)
    assert r.version == "HTTP/1.1"


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/3.0", b"HTTP/0.9"])
def test_a_well_formed_version_of_another_major_is_a_505(module_gateway, version):
    with RawConn(module_gateway.port) as raw:
        raw.send(models_request(version))
        r = raw.read_response("GET")
    assert r.status == 505, (version, r.status, r.body)
    assert json.loads(r.body)["error"]["code"] == "http_version_not_supported"


@pytest.mark.parametrize("version", [b"HTTP/1.2", b"HTTP/1.9"])
def test_a_higher_minor_of_http1_is_served_as_http11(module_gateway, version):
    with RawConn(module_gateway.port) as raw:
        # Twice on the connection: the first is kept alive as an HTTP/1.1 request is.
        body = b'{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
        req = (b"POST /v1/chat/completions " + version + b"\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
               b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        for _ in range(2):
            raw.send(req)
            r = raw.read_response("POST")
            assert r.status == 200, (version, r.status, r.body)
            assert r.version == "HTTP/1.1"
            assert r.json()["object"] == "chat.completion"
            assert not r.closed
    # The request line split right after the version: the same answer once it comes whole.
    with RawConn(module_gateway.port) as raw:
        raw.send(models_request(version)[:len(b"GET /v1/models ") + len(version)])
        raw.send(models_request(version)[len(b"GET /v1/models ") + len(version):])
        assert raw.read_response("GET").status == 200


def chunked_post(trailers: bytes) -> bytes:
    body = b'{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailers))


def test_a_trailer_field_is_dropped(module_gateway):
    with RawConn(module_gateway.port) as raw:
        raw.send(chunked_post(b"X-Checksum: abc\r\n"))
        r = raw.read_response("POST")
    assert r.status == 200, r.body


@pytest.mark.parametrize("trailers", [b"X-Checksum: a\r\n b\r\n", b"X-Checksum:\r\n\tb\r\n",
                                      b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_a_trailer_line_that_folds_or_frames_is_a_400_as_in_the_head(module_gateway, trailers):
    with RawConn(module_gateway.port) as raw:
        raw.send(chunked_post(trailers))
        r = raw.read_response("POST")
        assert r.status == 400, (trailers, r.status, r.body)
        if b"\r\n " in trailers or b"\r\n\t" in trailers:
            assert "obs-fold" in json.loads(r.body)["error"]["message"]
        assert r.header("connection") == "close"


ADMIN_ENV = {"WEIR_TEST_ADMIN_TOKEN": "admin-token-for-http58-tests-0123456789"}


@pytest.fixture(scope="module")
def admin_port(module_weir):
    port = free_port()
    # (Tenants: the admin API's key routes take a request to its body, where a trailer comes.)
    module_weir(config={"pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}}, "models": {"m": {"pool": "p"}},
                        "tenants": {"acme": {"models": ["m"]}},
                        "auth": {"required": True, "api_keys": [{"id": "acme-cfg", "sha256": "0" * 64,
                                                                 "tenant": "acme"}]},
                        "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
                env=ADMIN_ENV)

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False

    wait_until(ready, 5, message="admin listener")
    return port


@pytest.mark.parametrize("version,statuses", [(b"HTTP/1.2", (200, 503)), (b"HTTP/01.1", (400,)), (b"HTTP/2", (400,)),
                                              (b"HTTP/2.0", (505,))])
def test_the_admin_listener_reads_versions_alike(admin_port, version, statuses):
    with RawConn(admin_port) as raw:
        raw.send(b"GET /ready " + version + b"\r\nHost: 127.0.0.1\r\n\r\n")
        r = raw.read_response("GET")
    assert r.status in statuses, (version, r.status, r.body)  # (/ready: 503 until the pool's endpoint is up)
    assert r.version == "HTTP/1.1"


def test_the_admin_listener_refuses_a_folded_trailer_line(admin_port):
    with RawConn(admin_port) as raw:
        raw.send(b"POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                 + ADMIN_ENV["WEIR_TEST_ADMIN_TOKEN"].encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Checksum: a\r\n b\r\n\r\n")
        r = raw.read_response("POST")
    assert r.status == 400 and b"obs-fold" in r.body, (r.status, r.body)
