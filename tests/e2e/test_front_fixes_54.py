"""Weir behind a front proxy (stop 54: /tmp/h54/front-report.md's F2, F3, F5).

F2. DEFECT: no record named the client's address: the access log, the request log and the admin
    listener's lines had none, and there was no way to believe a front proxy's X-Forwarded-For. Now every
    line has ``client``: the connection's peer, or, from a peer in ``server.trusted_proxies``, the
    right-most X-Forwarded-For entry that is not a trusted proxy (nginx's ``real_ip_recursive on``).
F3. DEFECT: a client's own ``Forwarded`` and ``X-Real-IP`` reached the upstream as they came, as if Weir
    vouched for them. Now Weir appends its ``for=`` element to ``Forwarded`` (RFC 7239 §4), as it appends
    the peer to X-Forwarded-For, and sends its own ``X-Real-IP`` (stop 57: the client it resolved; the
    client's own never, from any peer).
F5. DEFECT: a request head with obs-fold (a line starting with SP or HTAB: ``Transfer-Encoding:\\r\\n
    chunked``) was unfolded and served, and ``Content-Length`` twice or as ``n, n`` was taken: a proxy in
    front that reads either otherwise frames the body otherwise. Now both are a 400 and a close, on the
    client and admin listeners. An upstream's folded response field is unfolded (RFC 9112 §5.2), except in
    ``Content-Length`` and ``Transfer-Encoding``, where it is an invalid response (502).

The upstream here is a raw HTTP/1.1 server that records each request's head and answers from a script
(``x-answer``), so the test sees exactly what Weir sent and can send heads no HTTP library would.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from conftest import free_port, wait_until
from httpwire import RawConn, request

TOKEN = "front-54-admin-token-0123456789"

CHAT = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                                "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()

# Response heads the upstream sends by the request's x-answer (the body: CHAT, framed as each says).
ANSWERS = {
    "plain": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(CHAT) + CHAT,
    # A folded end-to-end field: unfolded, each fold one SP.
    "fold-field": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-folded: a\r\n b\r\n"
                  b"content-length: %d\r\n\r\n" % len(CHAT) + CHAT,
    # A folded Transfer-Encoding: Beast would read it as chunked; the framing must not come from a fold.
    "fold-te": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"
               + b"%x\r\n" % len(CHAT) + CHAT + b"\r\n0\r\n\r\n",
    "fold-cl": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length:\r\n %d\r\n\r\n" % len(CHAT)
               + CHAT,
}


class Upstream:
    """Records every request's headers ((name, value) pairs, names lower-cased) by its x-probe."""

    def __init__(self):
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def headers(self, probe: str) -> list[tuple[str, str]]:
        with self._lock:
            reqs = [r for r in self.requests if r["probe"] == probe]
        assert len(reqs) == 1, (probe, reqs)
        return reqs[0]["headers"]

    def values(self, probe: str, name: str) -> list[str]:
        return [v for n, v in self.headers(probe) if n == name]

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            buf = b""
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    headers = []
                    for line in head.decode("latin-1").split("\r\n")[1:]:
                        name, _, value = line.partition(":")
                        headers.append((name.strip().lower(), value.strip()))
                    length = int(dict(headers).get("content-length", "0"))
                    while len(buf) < length:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    buf = buf[length:]
                    fields = dict(headers)
                    with self._lock:
                        self.requests.append({"probe": fields.get("x-probe", ""), "headers": headers})
                    conn.sendall(ANSWERS[fields.get("x-answer", "plain")])
            except OSError:
                return

    def close(self):
        self._sock.close()


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


def gateway(weir, upstream, trusted=None, admin_port=None):
    config = {"pools": {"p": {"endpoints": [upstream.url], "retry": {"attempts": 1}}},
              "models": {"m": {"pool": "p"}}}
    if trusted is not None:
        config["server"] = {"trusted_proxies": trusted}
    if admin_port is not None:
        config["admin"] = {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}
    return weir(config=config, workers=1, env={"WEIR_TEST_ADMIN_TOKEN": TOKEN})


def chat(w, probe: str, headers=None, source: str = "127.0.0.1", answer: str = "plain") -> httpx.Response:
    """A chat request from local address `source` (any 127.x.y.z reaches a loopback listener)."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as c:
        return c.post(w.v1 + "/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                      headers=[("x-probe", probe), ("x-request-id", probe), ("x-answer", answer),
                               *(headers or [])])


# --- F2: the client's address -----------------------------------------------------------------------------

# DEFECT: no line named an address. Without server.trusted_proxies the client is the peer, whatever its
# X-Forwarded-For says; refused requests (a 404, a malformed head) have it too.
def test_the_access_log_names_the_peer_by_default(weir, upstream):
    w = gateway(weir, upstream)
    assert chat(w, "peer-1", source="127.0.0.2", headers=[("X-Forwarded-For", "6.6.6.6")]).status_code == 200
    assert w.log_for("peer-1")["client"] == "127.0.0.2"
    # The X-Forwarded-For sent upstream still ends with the peer (as before).
    assert upstream.values("peer-1", "x-forwarded-for") == ["6.6.6.6, 127.0.0.2"]
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"), timeout=30) as c:
        assert c.get(w.base_url + "/nowhere", headers={"x-request-id": "peer-404"}).status_code == 404
    assert w.log_for("peer-404")["client"] == "127.0.0.3"
    with RawConn(w.port, host="127.0.0.1") as raw:
        raw.send(b"NOT HTTP\r\n\r\n")
        bad = raw.read_response("GET")
    assert bad.status == 400
    assert w.log_for(bad.header("x-request-id"))["client"] == "127.0.0.1"


# With trusted proxies: the right-most X-Forwarded-For entry that is not one of them, walked from the peer.
def test_trusted_proxies_take_the_client_from_x_forwarded_for(weir, upstream):
    w = gateway(weir, upstream, trusted=["127.0.0.1", "10.0.0.0/8", "fd00::/8"])
    cases = [
        # (probe, source, X-Forwarded-For lines, client)
        ("t-one", "127.0.0.1", ["203.0.113.7"], "203.0.113.7"),
        ("t-forged", "127.0.0.1", ["6.6.6.6, 203.0.113.7"], "203.0.113.7"),
        ("t-chain", "127.0.0.1", ["6.6.6.6, 203.0.113.7, 10.1.2.3", "fd00::9"], "203.0.113.7"),
        ("t-v6", "127.0.0.1", ["2001:DB8::7"], "2001:db8::7"),
        ("t-all-trusted", "127.0.0.1", ["10.0.0.5, 10.0.0.4"], "10.0.0.5"),
        # A garbage entry ends the walk: the last trusted hop's view of its client.
        ("t-garbage", "127.0.0.1", ["203.0.113.7, unknown"], "127.0.0.1"),
        ("t-garbage-2", "127.0.0.1", ["6.6.6.6, 1.2.3.4:80, 10.0.0.9"], "10.0.0.9"),
        ("t-none", "127.0.0.1", [], "127.0.0.1"),
        # An untrusted peer is believed about nothing.
        ("t-untrusted", "127.0.0.2", ["203.0.113.7"], "127.0.0.2"),
    ]
    for probe, source, xff, client in cases:
        r = chat(w, probe, source=source, headers=[("X-Forwarded-For", v) for v in xff])
        assert r.status_code == 200, (probe, r.text)
        assert w.log_for(probe)["client"] == client, probe
    # What goes upstream is unchanged: the client's list, then the peer.
    assert upstream.values("t-forged", "x-forwarded-for") == ["6.6.6.6, 203.0.113.7, 127.0.0.1"]


# The admin listener's lines name the peer too.
def test_the_admin_listener_logs_the_peer(weir, upstream):
    port = free_port()
    w = gateway(weir, upstream, admin_port=port)

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_until(up, 10, message="admin listener")
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4"), timeout=30) as c:
        assert c.get(f"http://127.0.0.1:{port}/admin/v1/keys").status_code == 401
    lines = w.wait_log(lambda es: any(e.get("listener") == "admin" for e in es))
    admin = [e for e in lines if e.get("listener") == "admin"]
    assert admin[-1]["client"] == "127.0.0.4", admin


# --- F3: Forwarded and X-Real-IP ----------------------------------------------------------------------------

# DEFECT: both went upstream as the client wrote them.
def test_forwarded_gets_weirs_element_and_x_real_ip_is_weirs_own(weir, upstream):
    w = gateway(weir, upstream, trusted=["127.0.0.1"])
    forged = [("Forwarded", "for=6.6.6.6"), ("X-Real-IP", "6.6.6.6")]
    assert chat(w, "f-direct", source="127.0.0.2", headers=forged).status_code == 200
    # (From a peer not in trusted_proxies the client's own elements are dropped: Weir's goes alone, stop 59.)
    assert upstream.values("f-direct", "forwarded") == ["for=127.0.0.2"]
    assert upstream.values("f-direct", "x-real-ip") == ["127.0.0.2"]
    # From a trusted front proxy too, X-Real-IP is the client Weir resolved (here, with no X-Forwarded-For,
    # the proxy itself), as nginx's proxy_set_header X-Real-IP $remote_addr: never the client's (stop 57).
    assert chat(w, "f-proxy", source="127.0.0.1", headers=forged).status_code == 200
    assert upstream.values("f-proxy", "x-real-ip") == ["127.0.0.1"]
    assert upstream.values("f-proxy", "forwarded") == ["for=6.6.6.6, for=127.0.0.1"]
    # No Forwarded from the client: none added (X-Forwarded-For carries the address).
    assert chat(w, "f-none", source="127.0.0.2").status_code == 200
    assert upstream.values("f-none", "forwarded") == []


def test_without_trusted_proxies_the_clients_x_real_ip_never_goes_up(weir, upstream):
    w = gateway(weir, upstream)
    assert chat(w, "r-default", headers=[("X-Real-IP", "6.6.6.6")]).status_code == 200
    assert upstream.values("r-default", "x-real-ip") == ["127.0.0.1"]


# --- F5: obs-fold and repeated Content-Length ----------------------------------------------------------------

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def raw_post(port: int, fields: bytes, body: bytes = BODY, refused: bool = True):
    """POSTs a chat request with the header lines `fields` as written; returns the response and whether
    Weir closed the connection after it."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + fields + b"\r\n")
    with RawConn(port) as raw:
        raw.send(head + body)
        r = raw.read_response("POST")
        return r, refused and raw.closed_by_peer(timeout=10)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


FOLDED = {
    "te-folded": (b"Transfer-Encoding:\r\n chunked\r\n", chunk(BODY)),
    "te-folded-tab": (b"Transfer-Encoding: \r\n\tchunked\r\n", chunk(BODY)),
    "cl-folded": (b"Content-Length:\r\n %d\r\n" % len(BODY), BODY),
    "field-folded": (b"Content-Length: %d\r\nX-Foo: a\r\n b\r\n" % len(BODY), BODY),
    "cl-twice": (b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(BODY), len(BODY)), BODY),
    "cl-list": (b"Content-Length: %d, %d\r\n" % (len(BODY), len(BODY)), BODY),
}


# DEFECT: each was served (200): the fold unfolded, the repeated length taken.
@pytest.mark.parametrize("case", sorted(FOLDED))
def test_obs_fold_and_a_repeated_content_length_are_refused(weir, upstream, case):
    w = gateway(weir, upstream)
    fields, body = FOLDED[case]
    r, closed = raw_post(w.port, fields, body)
    assert r.status == 400, (case, r.status, r.body)
    assert r.header("connection", "").lower() == "close"
    assert closed
    err = json.loads(r.body)["error"]
    assert ("obs-fold" in err["message"]) == ("folded" in case), err
    assert upstream.count() == 0
    # The control: the same request on one line is served.
    ok, _ = raw_post(w.port, b"Content-Length: %d\r\nX-Foo: a b\r\n" % len(BODY), refused=False)
    assert ok.status == 200, ok.body


def test_the_admin_listener_refuses_obs_fold_and_a_repeated_content_length(weir, upstream):
    port = free_port()
    gateway(weir, upstream, admin_port=port)

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_until(up, 10, message="admin listener")
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    for fields in (b"X-Foo: a\r\n b\r\n", b"Content-Length: 2\r\nContent-Length: 2\r\n", b"Content-Length: 2, 2\r\n",
                   b"Transfer-Encoding:\r\n chunked\r\n"):
        body = b"{}" if b"Transfer" not in fields else chunk(b"{}")
        head = (b"POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + auth
                + fields + (b"" if b"Content-Length" in fields or b"Transfer" in fields else b"Content-Length: 2\r\n")
                + b"\r\n")
        with RawConn(port) as raw:
            raw.send(head + body)
            r = raw.read_response("POST")
        assert r.status == 400, (fields, r.status, r.body)
        assert r.header("connection", "").lower() == "close", fields
    with RawConn(port) as raw:
        raw.send(request("GET", "/admin/v1/keys", None, {"authorization": f"Bearer {TOKEN}", "x-foo": "a b"}))
        assert raw.read_response("GET").status == 200


# An upstream's folded field comes back on one line (RFC 9112 §5.2: a proxy replaces each fold with SP); in
# the fields that frame the body a fold is an invalid response, never the framing. (DEFECT for the framing
# fields: a folded Transfer-Encoding was read as chunked.)
def test_an_upstreams_obs_fold_is_unfolded_but_never_frames_a_body(weir, upstream):
    w = gateway(weir, upstream)
    r = chat(w, "u-field", answer="fold-field")
    assert r.status_code == 200 and r.headers["x-folded"] == "a b", (r.status_code, r.headers)
    assert r.json()["choices"][0]["message"]["content"] == "done"
    for answer in ("fold-te", "fold-cl"):
        r = chat(w, "u-" + answer, answer=answer)
        assert r.status_code == 502, (answer, r.status_code, r.text)
        assert w.log_for("u-" + answer)["status"] == 502
