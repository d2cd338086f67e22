"""What of a client's request reaches the upstream (stop 59: /tmp/h59/task-fix-inject.md).

I1. DEFECT: a body that repeats a member Weir reads (``{"model":"secret","model":"plain"}``) was routed,
    authorized and reserved by the last copy, and went upstream as it came with both: a first-wins parser
    (gjson, simdjson) ran ``secret`` for a tenant allowed only ``plain``, or generated 100000 tokens where
    Weir reserved 1. Now such a body is a 400 on every JSON route, naming the member.
I2. DEFECT: a client's RFC 7239 ``Forwarded`` (host=, proto=, by=) went upstream from any peer, though the
    same claims as ``X-Forwarded-Host``/``-Proto`` are dropped from untrusted ones; an unclosed quote
    swallowed the ``for=`` element Weir appended; a ``Forwarded`` named in ``Connection`` still got one added.
I3. DEFECT: a form part named ``<model>`` (python-multipart < 0.0.30 reads ``model``, 0.0.30 and later
    ``<model>``) or with a space before a header's colon (refused by 0.0.30 and later) was routed by one
    reading while the upstream may run the other: now a 400.
I4. DEFECT: an endpoint's query parameter (Azure's ``api-version``) was overridden by a client's
    ``API-VERSION=`` or ``x=1;api-version=``, which servers matching names in any case, or splitting at ';',
    read as the endpoint's.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading

import httpx
import pytest

CHAT_ANSWER = json.dumps({
    "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
TEXT_ANSWER = b'{"text":"hello","usage":{"type":"duration","seconds":1}}'


class Capture:
    """An upstream that records each request's line, headers ((name, value), names lower-cased) and body,
    and answers a chat completion (a transcription on /v1/audio/)."""

    def __init__(self):
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def last(self) -> dict:
        with self._lock:
            return self.requests[-1]

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
                    lines = head.decode("latin-1").split("\r\n")
                    headers = []
                    for line in lines[1:]:
                        name, _, value = line.partition(":")
                        headers.append((name.strip().lower(), value.strip()))
                    length = int(dict(headers).get("content-length", "0"))
                    while len(buf) < length:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    body, buf = buf[:length], buf[length:]
                    with self._lock:
                        self.requests.append({"line": lines[0], "headers": headers, "body": body})
                    answer = TEXT_ANSWER if "/audio/" in lines[0] else CHAT_ANSWER
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(answer), answer))
            except OSError:
                return

    def close(self):
        self._sock.close()


@pytest.fixture
def upstream():
    u = Capture()
    yield u
    u.close()


def raw(w, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request on its own connection, sent as written (fields httpx would add or refuse: Connection)."""
    port = int(w.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode("latin-1") + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    status = int(out.split(b" ", 2)[1])
    return status, out.split(b"\r\n\r\n", 1)[1]


# --- I1: a member Weir reads, given twice --------------------------------------------------------------------

KEY = "sk-weir-client-59"
MSG = '[{"role":"user","content":"hi"}]'


def tenant_gateway(weir, upstream):
    return weir(config={
        "pools": {"p": {"endpoints": [upstream.url], "retry": {"attempts": 1}}},
        "models": {"plain": {"pool": "p"}, "secret": {"pool": "p"}},
        "tenants": {"t1": {"models": ["plain"]}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t1"}]},
    }, workers=1)


def post(w, path: str, body: str, **headers) -> httpx.Response:
    return httpx.post(w.base_url + path, content=body.encode(), timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json", **headers})


# DEFECT: the tenant may use only `plain`; Weir authorized by the last `model` and sent both copies upstream,
# where a first-wins parser runs `secret`. Now a 400 naming the member, and nothing reaches the upstream.
@pytest.mark.parametrize("body,param", [
    ('{"model":"secret","model":"plain","messages":%s}' % MSG, "model"),
    ('{"max_tokens":100000,"model":"plain","max_tokens":1,"messages":%s}' % MSG, "max_tokens"),
    ('{"model":"plain","messages":[],"messages":%s}' % MSG, "messages"),
    ('{"model":"plain","stream":false,"messages":%s,"stream":true}' % MSG, "stream"),
    ('{"model":"plain","messages":%s,"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}'
     % MSG, "stream_options.include_usage"),
    ('{"model":"plain","m\\u006fdel":"secret","messages":%s}' % MSG, "model"),
], ids=["model", "max_tokens", "messages", "stream", "include_usage", "escaped"])
def test_a_repeated_member_weir_reads_is_refused_on_chat(weir, upstream, body, param):
    w = tenant_gateway(weir, upstream)
    r = post(w, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert f"'{param}' appears more than once" in err["message"], err
    assert upstream.count() == 0


# Every other JSON route refuses it too (the translated ones, whose every member is read: any member).
@pytest.mark.parametrize("path,body", [
    ("/v1/completions", '{"model":"secret","prompt":"x","model":"plain"}'),
    ("/v1/embeddings", '{"model":"secret","input":"x","model":"plain"}'),
    ("/tokenize", '{"model":"secret","prompt":"x","model":"plain"}'),
    ("/v1/responses", '{"model":"secret","input":"x","model":"plain"}'),
    ("/v1/messages", '{"model":"secret","max_tokens":5,"messages":%s,"model":"plain"}' % MSG),
    ("/v1/messages/count_tokens", '{"model":"secret","messages":%s,"model":"plain"}' % MSG),
    ("/v1/responses", '{"model":"plain","input":"x","instructions":"a","instructions":"b"}'),
], ids=["completions", "embeddings", "tokenize", "responses", "messages", "count_tokens", "responses_any"])
def test_a_repeated_member_is_refused_on_every_json_route(weir, upstream, path, body):
    w = tenant_gateway(weir, upstream)
    r = post(w, path, body)
    assert r.status_code == 400, r.text
    assert "appears more than once" in r.text, r.text
    assert upstream.count() == 0


# A member Weir does not read may repeat: the body goes upstream byte for byte, as it came.
def test_a_repeated_member_weir_does_not_read_passes_as_it_came(weir, upstream):
    w = tenant_gateway(weir, upstream)
    body = '{"model":"plain","metadata":{"a":1},"messages":%s,"metadata":{"a":2},"x":{"model":1,"model":2}}' % MSG
    r = post(w, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert upstream.last()["body"] == body.encode()


# --- I2: Forwarded -------------------------------------------------------------------------------------------

def forwarded_gateway(weir, upstream, trusted=None):
    config = {"pools": {"p": {"endpoints": [upstream.url], "retry": {"attempts": 1}}}, "models": {"m": {"pool": "p"}}}
    if trusted is not None:
        config["server"] = {"trusted_proxies": trusted}
    return weir(config=config, workers=1)


CHAT = '{"model":"m","messages":%s}' % MSG


def sent_forwarded(w, upstream, lines: str) -> list[str]:
    status, body = raw(w, "POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
                       + lines, CHAT.encode())
    assert status == 200, body
    return [v for n, v in upstream.last()["headers"] if n == "forwarded"]


# DEFECT: from a peer not in server.trusted_proxies the client's host=/proto=/by= reached the upstream (its
# X-Forwarded-Host and -Proto were dropped). Now only Weir's own element goes.
def test_an_untrusted_clients_forwarded_is_replaced_by_weirs_element(weir, upstream):
    w = forwarded_gateway(weir, upstream)
    lines = ("X-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\n"
             "Forwarded: host=evil.example;proto=https;by=10.0.0.1\r\n")
    assert sent_forwarded(w, upstream, lines) == ["for=127.0.0.1"]
    names = [n for n, _ in upstream.last()["headers"]]
    assert "x-forwarded-host" not in names and "x-forwarded-proto" not in names


# DEFECT: an unclosed quote (from any peer) swallowed Weir's `for=` element into the client's quoted string.
# Now a Forwarded line that does not parse (RFC 7239 §4) is dropped, even from a trusted proxy; a well-formed
# one from a trusted proxy goes before Weir's element, each line judged on its own: a malformed line a client
# sent before the front's own (haproxy's `add-header Forwarded`) does not take the front's away.
@pytest.mark.parametrize("value", ['for="6.6.6.6', 'for=6.6.6.6;host="x', 'for=6.6.6.6;x="\\', "for"])
def test_a_malformed_forwarded_never_swallows_weirs_element(weir, upstream, value):
    w = forwarded_gateway(weir, upstream, trusted=["127.0.0.1"])
    assert sent_forwarded(w, upstream, f"Forwarded: {value}\r\n") == ["for=127.0.0.1"]
    assert sent_forwarded(w, upstream, f"Forwarded: {value}\r\nForwarded: for=5.5.5.5;proto=https\r\n") == [
        "for=5.5.5.5;proto=https, for=127.0.0.1"]
    assert sent_forwarded(w, upstream, f"Forwarded: for=5.5.5.5\r\nForwarded: {value}\r\n") == [
        "for=5.5.5.5, for=127.0.0.1"]
    assert sent_forwarded(w, upstream, "Forwarded: for=5.5.5.5;proto=https\r\n") == [
        "for=5.5.5.5;proto=https, for=127.0.0.1"]


# DEFECT: a Forwarded named in Connection (hop-by-hop: never forwarded) still made Weir add one, though the
# README says "none sent: none added".
def test_a_hop_by_hop_forwarded_is_none_sent(weir, upstream):
    w = forwarded_gateway(weir, upstream, trusted=["127.0.0.1"])
    status, body = raw(w, "POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
                       "Forwarded: for=6.6.6.6\r\nConnection: forwarded\r\n", CHAT.encode())
    assert status == 200, body
    assert [v for n, v in upstream.last()["headers"] if n == "forwarded"] == []


# --- I3: multipart names python-multipart's versions read differently ----------------------------------------

FILE = b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n'


def audio(w, model_part: bytes) -> httpx.Response:
    body = FILE + b"--B\r\n" + model_part + b"\r\n\r\nallowed\r\n--B--\r\n"
    return httpx.post(w.v1 + "/audio/transcriptions", content=body, timeout=30,
                      headers={"content-type": "multipart/form-data; boundary=B"})


@pytest.mark.parametrize("head", [
    b"Content-Disposition: form-data; name=<model>",
    b'Content-Disposition : form-data; name="model"',
    b'Content-Disposition: form-data; name="model"\xa0',
    b"Content-Disposition: form-data; name=\"model\"; filename*=utf-8''x.txt",
], ids=["angle_brackets", "space_before_colon", "nbsp", "filename_star"])
def test_a_part_the_two_python_multipart_readings_differ_on_is_refused(weir, upstream, head):
    w = weir(config={"pools": {"stt": {"endpoints": [upstream.url], "retry": {"attempts": 1}}},
                     "models": {"allowed": {"pool": "stt", "upstream_model": "UP"}}}, workers=1)
    r = audio(w, head)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error", r.text
    assert upstream.count() == 0
    # The plain spelling is served.
    ok = audio(w, b'Content-Disposition: form-data; name="model"')
    assert ok.status_code == 200, ok.text
    assert b'name="model"\r\n\r\nUP\r\n' in upstream.last()["body"]


# --- I4: the endpoint's query parameters --------------------------------------------------------------------

@pytest.mark.parametrize("query", ["API-VERSION=evil", "Api-Version=evil&x=1", "x=1;api-version=evil",
                                   "x=1;API%2Dversion=evil", "api-version=evil"])
def test_a_client_query_parameter_never_overrides_the_endpoints(weir, upstream, query):
    w = weir(config={
        "pools": {"az": {"endpoints": [upstream.url + "/openai/deployments/gpt?api-version=2024-10-21"],
                         "retry": {"attempts": 1}}},
        "models": {"k": {"pool": "az"}}}, workers=1)
    r = httpx.post(w.v1 + "/chat/completions?" + query, content=b'{"model":"k","messages":%s}' % MSG.encode(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    line = upstream.last()["line"]
    assert line.startswith("POST /openai/deployments/gpt/chat/completions?"), line
    assert "evil" not in line, line
    assert line.endswith("api-version=2024-10-21 HTTP/1.1"), line
