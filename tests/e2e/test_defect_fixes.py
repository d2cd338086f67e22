"""Regression tests for defects found by black-box testing (each failed on the build before
the fix): an upstream's 101, an upstream's own x-ratelimit-* beside Weir's, two credentials
in one request, the client port's 401 without WWW-Authenticate, x-ratelimit-* missing on
answers given before admission, empty lines before a request line, the access log's reason
for a server.write_timeout cut, requests still in flight at the drain deadline, limits changed
while streams are in flight (stream caps and budgets), a JWKS that withdrew every key, and
x-ratelimit-reset-* with more than one worker. Real weir and weir-mock processes on free
ports, raw sockets where the bytes on the wire matter."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import signal
import socket
import socketserver
import threading
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import free_port, to_yaml, wait_until
from httpwire import ConnectionClosed, RawConn, assert_openai_error, request, roundtrip, sse_data
from test_admission import JwksServer

MSG = [{"role": "user", "content": "hello there"}]
FAST = ("--ttft-ms", "2", "--itl-ms", "2", "--max-tokens", "8")
ADMIN_TOKEN = "admin-defects-token-0123456789"
ADMIN_ENV = {"WEIR_DEFECTS_ADMIN_TOKEN": ADMIN_TOKEN}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def raw_request(method: str, path: str, body: dict | bytes | None = None,
                headers: list[tuple[str, str]] = ()) -> bytes:
    """One request's bytes with a header *list*: a name may repeat (httpwire.request takes a dict)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if data is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (data or b"")


def ratelimit_lines(r) -> dict[str, list[str]]:
    """Every x-ratelimit-* field of a raw response: name (lowercased) -> its values in order."""
    out: dict[str, list[str]] = {}
    for k, v in r.headers:
        if k.lower().startswith("x-ratelimit-"):
            out.setdefault(k.lower(), []).append(v)
    return out


def reset_seconds(value: str) -> float:
    """OpenAI's reset duration ("6ms", "9.998s", "1m0s", "1h2m3s") in seconds."""
    if value.endswith("ms") and value[:-2].isdigit():
        return int(value[:-2]) / 1000
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(\d+(?:\.\d+)?)s", value)
    assert m, f"not a reset duration: {value!r}"
    return int(m.group(1) or 0) * 3600 + int(m.group(2) or 0) * 60 + float(m.group(3))


# ---------------------------------------------------------------------------- a raw upstream

class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class RawUpstream:
    """An HTTP/1.1 upstream on a free port: each request (keep-alive) gets the bytes
    ``answer(headers, body)`` returns (headers: lowercased names); None closes the connection.
    A list is a script: its bytes are sent in turn, a float pauses that many seconds, a threading.Event waits
    until the test sets it (30 s at most), None closes."""

    def __init__(self, answer):
        self.answer = answer
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                sock: socket.socket = self.request
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        got = sock.recv(65536)
                        if not got:
                            return
                        buf += got
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    headers = {}
                    for line in head.decode("latin-1").split("\r\n")[1:]:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                    length = int(headers.get("content-length", "0"))
                    while len(buf) < length:
                        got = sock.recv(65536)
                        if not got:
                            return
                        buf += got
                    body, buf = buf[:length], buf[length:]
                    out = outer.answer(headers, body)
                    for step in out if isinstance(out, list) else [out]:
                        if step is None:
                            return
                        if isinstance(step, float):
                            time.sleep(step)
                        elif isinstance(step, threading.Event):
                            step.wait(30)
                        else:
                            sock.sendall(step)

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# A hosted provider's own limits (on Weir's account), values Weir never computes for its tenants.
UPSTREAM_RL = {"x-ratelimit-limit-requests": "10000", "x-ratelimit-remaining-requests": "9999",
               "x-ratelimit-reset-requests": "6ms", "x-ratelimit-limit-tokens": "2000000",
               "x-ratelimit-remaining-tokens": "1999990", "x-ratelimit-reset-tokens": "7m12s"}
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def completion_answer(stream: bool) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in UPSTREAM_RL.items())
    if not stream:
        body = json.dumps({"id": "chatcmpl-raw", "object": "chat.completion", "created": 1, "model": "m",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                        "finish_reason": "stop"}], "usage": USAGE}).encode()
        return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    def chunk(delta, finish=None, usage=None):
        c = {"id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else [],
             **({"usage": usage} if usage else {})}
        return b"data: " + json.dumps(c).encode() + b"\n\n"

    sse = (chunk({"role": "assistant", "content": ""}) + chunk({"content": "ok"}) + chunk({}, "stop")
           + chunk({}, usage=USAGE) + b"data: [DONE]\n\n")
    return (f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{extra}"
            f"Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(sse), sse)


def scripted_answer(headers: dict, body: bytes) -> bytes:
    stream = bool(json.loads(body or b"{}").get("stream"))
    if headers.get("x-scenario") == "upgrade":
        # Switching Protocols to a request that never asked to upgrade, then bytes of another protocol.
        return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                b"\x81\x05hello")
    return completion_answer(stream)


@pytest.fixture(scope="module")
def raw_gw(module_weir):
    up = RawUpstream(scripted_answer)
    w = module_weir(config={
        "pools": {"raw": {"endpoints": [up.url], "timeouts": {"first_byte": "3s", "idle": "3s"},
                          "outlier": {"consecutive_failures": 0}, "eject_for": "1ms"}},
        "models": {"m": {"pool": "raw"}},
        "tenants": {"limited": {"limits": {"requests_per_minute": 1000, "tokens_per_minute": 100000}},
                    "free": {}},
        "auth": {"api_keys": [{"id": "limited-1", "sha256": sha("sk-limited"), "tenant": "limited"},
                              {"id": "free-1", "sha256": sha("sk-free"), "tenant": "free"}]},
    })
    yield w
    up.close()


def raw_chat(w, key: str, request_id: str, stream: bool = False, **headers):
    with RawConn(w.port, timeout=10) as c:
        c.send(request("POST", "/v1/chat/completions", {"model": "m", "messages": MSG, "stream": stream},
                       {"authorization": f"Bearer {key}", "x-request-id": request_id, **headers}))
        # 1xx included: a relayed 101 is what the defect looked like.
        return c.read_response("POST", skip_interim=False)


# ---------------------------------------------------------------------------- 1. upstream 101

@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_upstream_101_switching_protocols_is_a_502(raw_gw, stream):
    w = raw_gw
    rid = f"upgrade-{int(stream)}"
    r = raw_chat(w, "sk-free", rid, stream=stream, **{"x-scenario": "upgrade"})
    assert r.status != 101, f"the upstream's 101 was relayed: {r.headers}"
    err = assert_openai_error(r, 502, "upstream_unavailable")
    assert err["type"] == "upstream_error", err
    assert r.header("upgrade") is None
    entry = w.log_for(rid)
    assert entry["status"] == 502, entry
    assert entry["error"] and entry["error"]["source"] == "upstream", entry


# ---------------------------------------------------------------------------- 2. upstream x-ratelimit-*

@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_weirs_ratelimit_headers_replace_the_upstreams(raw_gw, stream):
    w = raw_gw
    # A tenant without limits: Weir sends no x-ratelimit-* of its own, and the upstream's (the provider
    # account's limits) are no tenant's either (helper xlate55: they used to pass here).
    r = raw_chat(w, "sk-free", f"rl-free-{int(stream)}", stream=stream)
    assert r.status == 200, r.body[:300]
    assert ratelimit_lines(r) == {}
    # A tenant with limits: each name once, with Weir's value.
    r = raw_chat(w, "sk-limited", f"rl-limited-{int(stream)}", stream=stream)
    assert r.status == 200, r.body[:300]
    if stream:
        assert sse_data(r.body)[-1] == "[DONE]"
    rl = ratelimit_lines(r)
    assert set(rl) == set(UPSTREAM_RL), rl
    for name, values in rl.items():
        assert len(values) == 1, f"{name} sent {len(values)} times: {values}"
    assert rl["x-ratelimit-limit-requests"] == ["1000"]
    assert rl["x-ratelimit-limit-tokens"] == ["100000"]
    assert int(rl["x-ratelimit-remaining-requests"][0]) < 1000
    assert int(rl["x-ratelimit-remaining-tokens"][0]) < 100000
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
        assert rl[name] != [UPSTREAM_RL[name]], rl
        reset_seconds(rl[name][0])


# ---------------------------------------------------------------------------- 3-6. one gateway

@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    m = module_mock(*FAST)
    admin_port = free_port()
    w = module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "mock-model", "default_max_tokens": 8},
                   "other": {"pool": "p", "upstream_model": "mock-model", "default_max_tokens": 8}},
        "tenants": {"acme": {"models": ["m"],
                             "limits": {"requests_per_minute": 1000, "tokens_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "acme-1", "sha256": sha("sk-acme"), "tenant": "acme"}]},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_DEFECTS_ADMIN_TOKEN"},
    }, env=ADMIN_ENV)
    wait_until(lambda: admin_ready(admin_port), 5, message="admin listener")
    return w, admin_port


def admin_ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


CHAT = {"model": "m", "messages": MSG, "max_tokens": 4}


@pytest.mark.parametrize("name,first,second", [
    ("authorization", "Bearer sk-acme", "Bearer sk-wrong"),
    ("authorization", "Bearer sk-wrong", "Bearer sk-acme"),
    ("authorization", "Bearer sk-acme", "Bearer sk-acme"),
    ("x-api-key", "sk-acme", "sk-wrong"),
    ("x-api-key", "sk-wrong", "sk-acme"),
], ids=["auth-good-bad", "auth-bad-good", "auth-same-twice", "xkey-good-bad", "xkey-bad-good"])
def test_two_credentials_on_the_client_port_are_a_400(gw, name, first, second):
    w, _ = gw
    rid = f"two-creds-{name}-{first[-4:]}-{second[-4:]}"
    r = roundtrip(w.port, raw_request("POST", "/v1/chat/completions", CHAT,
                                      [(name, first), (name, second), ("x-request-id", rid)]))
    err = assert_openai_error(r, 400)
    assert err["type"] == "invalid_request_error", err
    assert w.log_for(rid)["status"] == 400


@pytest.mark.parametrize("first,second", [(ADMIN_TOKEN, "wrong-token"), ("wrong-token", ADMIN_TOKEN)],
                         ids=["good-bad", "bad-good"])
def test_two_authorization_headers_on_the_admin_port_are_a_400(gw, first, second):
    _, admin_port = gw
    r = roundtrip(admin_port, raw_request("GET", "/admin/v1/keys", None,
                                          [("Authorization", f"Bearer {first}"),
                                           ("Authorization", f"Bearer {second}")]), "GET")
    assert r.status == 400, (r.status, r.body[:300])
    assert r.json()["error"]["type"] == "invalid_request_error", r.body


# (A refused credential adds RFC 6750 §3.1's error="invalid_token"; none with no credential or another scheme.)
@pytest.mark.parametrize("headers,challenge", [
    ([], 'Bearer realm="weir"'),
    ([("Authorization", "Basic dXNlcjpwYXNz")], 'Bearer realm="weir"'),
    ([("Authorization", "Bearer sk-nope")], 'Bearer realm="weir", error="invalid_token"'),
    ([("x-api-key", "sk-nope")], 'Bearer realm="weir", error="invalid_token"'),
], ids=["missing", "basic", "bad-bearer", "bad-x-api-key"])
def test_client_port_401_names_the_bearer_scheme(gw, headers, challenge):
    w, _ = gw
    r = roundtrip(w.port, raw_request("POST", "/v1/chat/completions", CHAT, headers))
    assert_openai_error(r, 401, "invalid_api_key")
    assert r.header_all("www-authenticate") == [challenge], r.headers


@pytest.mark.parametrize("method,path,body,status,code", [
    ("POST", "/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model_not_found"),
    ("POST", "/v1/chat/completions", b'{"model": "m",', 400, None),
    ("POST", "/v1/chat/completions", {**CHAT, "model": "other"}, 404, "model_not_found"),  # not allowed: as unknown
    ("GET", "/v1/models", None, 200, None),
], ids=["404-model", "400-bad-json", "404-refused-model", "models-list"])
def test_answers_before_admission_carry_the_tenants_ratelimit_headers(gw, method, path, body, status, code):
    w, _ = gw
    r = roundtrip(w.port, raw_request(method, path, body, [("Authorization", "Bearer sk-acme")]), method)
    if status == 200:
        assert r.status == 200, r.body[:300]
    else:
        assert_openai_error(r, status, code)
    rl = ratelimit_lines(r)
    assert set(rl) == {f"x-ratelimit-{x}-{kind}" for x in ("limit", "remaining", "reset")
                       for kind in ("requests", "tokens")}, r.headers
    assert all(len(v) == 1 for v in rl.values()), rl
    assert rl["x-ratelimit-limit-requests"] == ["1000"] and rl["x-ratelimit-limit-tokens"] == ["100000"]
    assert 0 <= int(rl["x-ratelimit-remaining-requests"][0]) <= 1000
    reset_seconds(rl["x-ratelimit-reset-requests"][0])


def chat_bytes(rid: str, **headers) -> bytes:
    return request("POST", "/v1/chat/completions", CHAT,
                   {"authorization": "Bearer sk-acme", "x-request-id": rid, **headers})


@pytest.mark.parametrize("prefix", [b"\r\n", b"\r\n\r\n\r\n"], ids=["one-crlf", "three-crlf"])
def test_empty_lines_before_the_request_line_are_ignored(gw, prefix):
    w, _ = gw
    rid = f"lead-{len(prefix)}"
    with RawConn(w.port) as c:
        c.send(prefix + chat_bytes(rid))
        r = c.read_response("POST")
    assert r.status == 200, (r.status, r.body[:300])
    assert r.header("x-request-id") == rid and r.json()["object"] == "chat.completion"
    assert w.log_for(rid)["status"] == 200


@pytest.mark.parametrize("pipelined", [False, True], ids=["after-response", "pipelined"])
def test_an_extra_crlf_after_a_body_on_keep_alive(gw, pipelined):
    w, _ = gw
    first, second = f"crlf-a-{int(pipelined)}", f"crlf-b-{int(pipelined)}"
    with RawConn(w.port, timeout=5) as c:
        if pipelined:
            c.send(chat_bytes(first) + b"\r\n" + chat_bytes(second))
            r1 = c.read_response("POST")
        else:
            c.send(chat_bytes(first) + b"\r\n")  # a client that ends its body with a CRLF (one write)
            r1 = c.read_response("POST")
            c.send(chat_bytes(second))  # the next request, later
        try:
            r2 = c.read_response("POST")
        except (TimeoutError, ConnectionClosed) as e:
            c.close()
            pytest.fail(f"no answer to the second request ({e!r}); its log line: {w.log_for(second)}")
    assert [r1.status, r2.status] == [200, 200], (r1.body[:200], r2.body[:200])
    assert [r1.header("x-request-id"), r2.header("x-request-id")] == [first, second]
    assert w.log_for(first)["status"] == 200 and w.log_for(second)["status"] == 200


# ---------------------------------------------------------------------------- 7. write timeout

def test_write_timeout_is_logged_as_client_write_timeout(mock, weir):
    # 1000 inputs of 1024 floats: ~10 MB of JSON, more than the sockets' buffers take.
    m = mock("--ttft-ms", "1", "--embedding-dim", "1024")
    w = weir(config={"server": {"write_timeout": "1s"}, "pools": {"p": {"endpoints": [m.base_url]}},
                     "models": {"mock-model": {"pool": "p"}}}, workers=1)
    with RawConn(w.port, timeout=10, rcvbuf=4096) as c:  # never reads
        c.send(request("POST", "/v1/embeddings",
                       {"model": "mock-model", "input": [f"word {i}" for i in range(1000)]},
                       {"x-request-id": "never-reads"}))
        entry = w.log_for("never-reads", timeout=10)
    assert entry["status"] == 499, entry
    assert entry["error"] == {"source": "client", "code": "client_write_timeout"}, entry
    assert entry["bytes_out"] > 0


# ---------------------------------------------------------------------------- 8. drain deadline

def read_stream_body(conn: RawConn) -> tuple[bytes, bool]:
    """The rest of a chunked body and whether it ended with the last chunk (False: cut)."""
    parts = []
    try:
        for chunk in conn.iter_chunks():
            parts.append(chunk)
    except (ConnectionClosed, OSError):
        return b"".join(parts), False
    return b"".join(parts), True


def test_drain_deadline_answers_what_is_in_flight(mock, weir):
    m = mock("--ttft-ms", "20", "--itl-ms", "100", "--max-tokens", "200")
    w = weir(config={"server": {"drain_timeout": "1s"},
                     "pools": {"p": {"endpoints": [m.base_url],
                                     "queue": {"size": 8, "max_concurrent": 1, "timeout": "30s"}}},
                     "models": {"mock-model": {"pool": "p"}}}, workers=1)  # max_concurrent is per worker
    stream = RawConn(w.port, timeout=15)
    stream.send(request("POST", "/v1/chat/completions",
                        {"model": "mock-model", "messages": MSG, "stream": True},
                        {"x-request-id": "drain-stream"}))
    assert stream.read_head().status == 200
    first = next(stream.iter_chunks())
    queued = RawConn(w.port, timeout=15)
    queued.send(request("POST", "/v1/chat/completions", {"model": "mock-model", "messages": MSG},
                        {"x-request-id": "drain-queued"}))
    wait_until(lambda: w.metric("weir_queue_waiting", pool="p") == 1, 5, message="the second request queued")

    os.kill(w.process.pid, signal.SIGTERM)
    try:
        r = queued.read_response("POST")
    except ConnectionClosed:
        pytest.fail("the queued request's connection closed without an HTTP answer")
    err = assert_openai_error(r, 503, "drain_timeout")
    assert err["type"] == "server_error", err
    assert r.header("retry-after") == "1", r.headers
    rest, complete = read_stream_body(stream)
    events = sse_data(first + rest)
    assert complete, f"the stream was cut without its end; last events: {events[-2:]}"
    assert events[-1] == "[DONE]", events[-3:]
    assert json.loads(events[-2])["error"]["code"] == "drain_timeout", events[-2]
    queued.close()
    stream.close()
    assert w.process.popen.wait(10) == 0

    entries = {e["request_id"]: e for e in w.log_entries()}
    assert {"drain-stream", "drain-queued"} <= set(entries), entries
    q, s = entries["drain-queued"], entries["drain-stream"]
    assert q["status"] == 503, q
    assert s["status"] == 200, s
    for e in (q, s):
        assert e["error"] == {"source": "internal", "code": "drain_timeout"}, e


# ---------------------------------------------------------------------------- 9. limits changed mid-flight

class HeldStreams:
    """A vLLM-like chat stream upstream whose streams asked for a held ``max_tokens`` send their head, role and
    first token, then wait until the test releases them (``release(tokens)``); the others run to the end at once.
    Each stream is ``max_tokens`` content tokens, the finish (length), its usage and [DONE], then the upstream
    closes the connection (``Connection: close``: no pooled connection it closed is ever reused)."""

    def __init__(self, held: set[int]):
        self.gates = {n: threading.Event() for n in held}
        self.up = RawUpstream(self.answer)
        self.url = self.up.url

    def release(self, tokens: int) -> None:
        self.gates[tokens].set()

    def close(self) -> None:
        for g in self.gates.values():
            g.set()
        self.up.close()

    def answer(self, headers, body) -> list:
        n = json.loads(body)["max_tokens"]

        def event(delta, finish=None, usage=None) -> bytes:
            o = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
                 "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage:
                o["usage"] = usage
            data = b"data: " + json.dumps(o).encode() + b"\n\n"
            return b"%x\r\n%s\r\n" % (len(data), data)

        head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n")
        first = event({"role": "assistant", "content": ""}) + event({"content": "t0"})
        rest = b"".join(event({"content": f" t{i}"}) for i in range(1, n)) + event({}, "length") + event(
            None, usage={"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3})
        rest += b"%x\r\n%s\r\n0\r\n\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")
        steps = [head + first]
        if n in self.gates:
            steps.append(self.gates[n])
        return steps + [rest, None]


def stream_request(w, key: str, rid: str, tokens: int, itl_ms: int) -> tuple[RawConn | None, object]:
    """Starts a stream; (connection, head) when admitted (200), (None, response) when refused."""
    c = RawConn(w.port, timeout=20)
    c.send(request("POST", "/v1/chat/completions",
                   {"model": "m", "messages": MSG, "stream": True, "max_tokens": tokens},
                   {"authorization": f"Bearer {key}", "x-request-id": rid, "x-mock-itl-ms": str(itl_ms)}))
    head = c.read_head()
    if head.status == 200:
        return c, head
    head.body = c.read_exact(int(head.header("content-length")))
    c.close()
    return None, head


def finish(conn: RawConn) -> None:
    body, complete = read_stream_body(conn)
    conn.close()
    assert complete and sse_data(body)[-1] == "[DONE]", body[-300:]


def write_config(w, cfg: dict) -> None:
    full = json.loads(json.dumps(cfg))
    full["listen"] = f"127.0.0.1:{w.port}"
    full["workers"] = 2
    full.setdefault("server", {})["access_log"] = str(w.access_log_path)
    tmp = w.config_path.with_suffix(".next")
    tmp.write_text(to_yaml(full) + "\n")
    os.replace(tmp, w.config_path)


@pytest.fixture
def held_streams():
    up = HeldStreams({30, 60, 5})  # A's, B's and D's max_tokens
    yield up
    up.close()


@pytest.mark.parametrize("change", ["key-patch", "tenant-reload"])
def test_limits_changed_mid_flight_keep_the_stream_cap_and_the_spend(held_streams, weir, change):
    m = held_streams
    admin_port = free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    caps = {"max_concurrent_streams": 2, "requests_per_minute": 1000}

    def config(rpm: int) -> dict:
        return {
            "pools": {"p": {"endpoints": [m.url]}},
            "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
            "tenants": {"acme": {}, "t2": {"limits": {**caps, "requests_per_minute": rpm}, "budget": {"usd": 1.0}}},
            "auth": {"api_keys": [{"id": "t2-1", "sha256": sha("sk-t2"), "tenant": "t2"}]},
            "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_DEFECTS_ADMIN_TOKEN"},
            "pricing": {"*": {"input": 1000, "output": 1000}},  # USD per 1M tokens: a spend one can see
        }

    w = weir(config=config(1000), env=ADMIN_ENV, workers=2)
    wait_until(lambda: admin_ready(admin_port), 5, message="admin listener")
    if change == "key-patch":
        r = httpx.post(admin + "/admin/v1/keys", headers=auth, timeout=10,
                       json={"tenant": "acme", "limits": caps, "budget": {"usd": 1.0}})
        assert r.status_code == 201, r.text
        key, view = r.json()["key"], f"/admin/v1/keys/{r.json()['id']}"
    else:
        key, view = "sk-t2", "/admin/v1/tenants/t2"

    def usage() -> dict:
        r = httpx.get(admin + view, headers=auth, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    # A and B (and D below) are held open by the upstream until the test lets them end: both run across the
    # change, however long it takes (a reload took 3 s on a loaded machine, as long as the 3 s stream A was:
    # its slot was free again when C asked, and C rightly admitted).
    a, ha = stream_request(w, key, f"{change}-a", 30, 100)
    b, hb = stream_request(w, key, f"{change}-b", 60, 100)
    assert a and b, (ha.status, hb.status)
    assert usage()["streams"]["in_flight"] == 2

    if change == "key-patch":
        r = httpx.patch(admin + view, headers=auth, timeout=10,
                        json={"limits": {**caps, "requests_per_minute": 999}})
        assert r.status_code == 200, r.text
    else:
        before = w.metric("weir_config_reloads_total", result="success")
        write_config(w, config(999))
        os.kill(w.process.pid, signal.SIGHUP)
        wait_until(lambda: w.metric("weir_config_reloads_total", result="success") > before, 10,
                   message="the reload applied")
        assert httpx.get(admin + view, headers=auth).json()["limits"]["requests_per_minute"] == 999

    c, hc = stream_request(w, key, f"{change}-c", 4, 10)
    if c:
        finish(c)
    assert hc.status == 429, f"a third stream was admitted beside two in flight (cap 2): {hc.status}"
    assert json.loads(hc.body)["error"]["code"] == "rate_limit_exceeded", hc.body
    assert usage()["streams"]["in_flight"] == 2, "the admin view no longer counts the streams in flight"

    m.release(30)
    finish(a)
    w.log_for(f"{change}-a")  # logged: its slot is back
    d, hd = stream_request(w, key, f"{change}-d", 5, 100)
    extra, he = stream_request(w, key, f"{change}-e", 4, 10)
    if extra:
        finish(extra)
    assert d is not None, f"no stream admitted with one slot free: {hd.status} {hd.body[:200]!r}"
    assert he.status == 429, f"a stream beyond the cap was admitted: {he.status}"
    m.release(5)
    finish(d)
    m.release(60)
    finish(b)

    logged = [w.log_for(f"{change}-{x}") for x in "abcde"]
    assert [x["status"] for x in logged] == [200, 200, 429, 200, 429], logged
    spent_logged = sum(x["spend_usd"] or 0 for x in logged)
    assert all(logged[i]["spend_usd"] > 0 for i in (0, 1, 3)), logged
    budget = usage()["budget"]
    assert budget["spent_usd"] == pytest.approx(spent_logged, rel=1e-6, abs=1e-9), (budget, spent_logged)


# ---------------------------------------------------------------------------- 10. JWKS withdrew its keys

# (test_admission.JwksServer: a JWKS endpoint on a free port whose key set the test can change)


@pytest.fixture
def jwks_server():
    s = JwksServer()
    yield s
    s.close()


def test_a_jwks_that_withdrew_every_key_makes_tokens_401_not_503(mock, weir, jwks_server):
    m = mock(*FAST)
    k1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k1.public_key()))
    jwk.update({"kid": "k1", "alg": "RS256", "use": "sig"})
    jwks_server.jwks = {"keys": [jwk]}
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
        "tenants": {"acme": {}},
        "auth": {"jwt": {"jwks_url": jwks_server.url, "issuer": "https://idp.test/", "audience": "weir",
                         "min_refetch_interval": "100ms", "refresh_interval": "1s"}},
    }, workers=1)
    n = [0]

    def chat() -> httpx.Response:
        n[0] += 1  # a new subject each time: never a token Weir verified (and cached) before
        now = int(time.time())
        tok = jwt.encode({"iss": "https://idp.test/", "aud": "weir", "sub": f"user-{n[0]}", "tenant": "acme",
                          "iat": now, "exp": now + 600}, k1, algorithm="RS256", headers={"kid": "k1"})
        return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {tok}"}, timeout=10,
                          json={"model": "m", "messages": MSG, "max_tokens": 2})

    wait_until(lambda: chat().status_code == 200, 5, interval=0.05, message="the key set loaded")
    hits = jwks_server.hits
    jwks_server.jwks = {"keys": []}  # the issuer withdrew every key
    wait_until(lambda: jwks_server.hits > hits, 5, message="Weir refetched the key set")
    seen: list[httpx.Response] = []
    wait_until(lambda: seen.append(chat()) or seen[-1].status_code != 200, 5, interval=0.05,
               message="the empty key set in use")
    r = seen[-1]
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.json()["error"]["code"] == "invalid_api_key", r.text
    assert chat().status_code == 401


# ---------------------------------------------------------------------------- 11. reset with workers

def test_ratelimit_reset_is_when_every_shard_is_full_with_two_workers(mock, weir):
    # (This read 10 s for one request at 6 a minute with two workers, the whole bucket's rate. But each
    # worker's shard holds 3 and refills at 3 a minute, and a full shard gains nothing: the bucket is
    # full again only in 20 s, and a request that needed all 6 was refused until then. The reset is now
    # the slowest shard's; docs/admission.md.)
    m = mock(*FAST)
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "mock-model", "default_max_tokens": 8}},
        "tenants": {"rpm": {"limits": {"requests_per_minute": 6}}},
        "auth": {"api_keys": [{"id": "rpm-1", "sha256": sha("sk-rpm"), "tenant": "rpm"}]},
    }, workers=2)

    def chat() -> httpx.Response:
        # A new connection each time: either worker may take it.
        r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": "Bearer sk-rpm", "connection": "close"},
                       json={"model": "m", "messages": MSG}, timeout=10)
        assert r.status_code == 200, r.text
        return r

    r = chat()
    assert r.headers["x-ratelimit-remaining-requests"] == "5"
    # The shard that gave it refills 1 of its 3 at 3 a minute: 20 s.
    assert 19.0 <= reset_seconds(r.headers["x-ratelimit-reset-requests"]) <= 20.0, r.headers
    r = chat()
    assert r.headers["x-ratelimit-remaining-requests"] == "4"
    # One from each shard: 20 s (2 short at the whole rate); both from one: 40 s (2 of its 3 at 3 a minute).
    reset = reset_seconds(r.headers["x-ratelimit-reset-requests"])
    assert 18.0 <= reset <= 20.0 or 38.0 <= reset <= 40.0, r.headers
