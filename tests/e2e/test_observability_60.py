"""Stop 60's observability defects end to end (each test fails on the build before its fix):

- a client's string with U+0000 (a model "a\\u0000b") reached the access-log line, and so the PostgreSQL request
  log's `record`, as the escape \\u0000, which PostgreSQL's json and jsonb refuse: one such row failed every
  `record::json ->> 'spend_usd'` (the query docs/observability.md recommends) and `record::jsonb` over the table.
  A captured body holding a NUL byte did the same to `bodies`. The line writes U+FFFD for U+0000 (in every
  store, and as its `model` column already held it); such a body is stored as base64;
- the request span's name and http.request.method took any method token a client sent, unauthenticated: span
  names without bound. An unknown method is `_OTHER` (the token in http.request.method_original), its span
  named `HTTP ...` (OpenTelemetry's HTTP semantic conventions);
- `tracing.resource` naming an attribute Weir sets (host.name, service.version, ...) exported the key twice;
- a collector's Retry-After too large to parse was ignored (a retry after 0.5 s), not capped at 5 s;
- `otlp_endpoint: http://host/otlp/` posted to /otlp: a path is the target as written."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import uuid

import httpx
import pytest

from conftest import wait_until
from otlp import Collector, attrs
from pg import Postgres

KEY = "sk-acme-0123456789abcdef"
MOCK = ("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "4", "--model", "openai/whisper-small")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def raw_request(port: int, head: bytes, body: bytes = b"") -> bytes:
    """One request on its own connection (Connection: close); the whole answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(head + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out
    finally:
        s.close()


# --- 1. U+0000 in the request log ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pg():
    p = Postgres()
    p.start()
    yield p
    p.stop()


def test_a_nul_in_a_clients_string_leaves_postgres_json_queries_working(pg, mock, weir):
    db = pg.new_database()
    m = mock(*MOCK)
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "openai/whisper-small", "default_max_tokens": 4},
                   "whisper-1": {"pool": "p", "upstream_model": "openai/whisper-small"}},
        "tenants": {"acme": {}},
        "auth": {"api_keys": [{"id": "acme-1", "sha256": sha(KEY), "tenant": "acme"}]},
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "request_log": {"url": pg.url(db), "flush_interval": "10ms", "capture_bodies": {"tenants": ["acme"]}},
    })
    auth = {"authorization": f"Bearer {KEY}"}
    ids = {k: "nul-" + uuid.uuid4().hex[:10] for k in ("ok", "anon", "unknown", "audio")}
    r = httpx.post(w.v1 + "/chat/completions", timeout=30, headers={**auth, "x-request-id": ids["ok"]},
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    evil = b'{"model":"a\\u0000b","messages":[{"role":"user","content":"hi"}]}'
    # Without credentials (a 401) and with them (an unknown model's 404): both logged with the client's model.
    r = httpx.post(w.v1 + "/chat/completions", timeout=30, content=evil,
                   headers={"content-type": "application/json", "x-request-id": ids["anon"]})
    assert r.status_code == 401, r.text
    r = httpx.post(w.v1 + "/chat/completions", timeout=30, content=evil,
                   headers={**auth, "content-type": "application/json", "x-request-id": ids["unknown"]})
    assert r.status_code == 404, r.text
    # A captured upload that is ASCII with NUL bytes (a WAV header): valid UTF-8, but not text PostgreSQL holds.
    audio = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00"
    r = httpx.post(w.v1 + "/audio/transcriptions", timeout=30, headers={**auth, "x-request-id": ids["audio"]},
                   files={"file": ("a.wav", audio, "audio/wav")}, data={"model": "whisper-1"})
    assert r.status_code == 200, r.text

    # The line: U+FFFD where the client's U+0000 was, as the model column has it. (The 401's model is there
    # when its body came with its head, read before the refusal: docs/observability.md, bytes_in.)
    assert w.log_for(ids["unknown"])["model"] == "a\ufffdb"
    assert w.log_for(ids["anon"])["model"] in (None, "a\ufffdb")
    assert "\\u0000" not in w.access_log_path.read_text()

    wait_until(lambda: pg.psql("SELECT count(*) FROM requests", db).strip() == "4", 10, message="4 rows")
    # Every row's record reads as json and jsonb: the docs' query works over the whole table.
    assert pg.psql("SELECT count(record::json ->> 'spend_usd') FROM requests", db).strip() == "3"
    assert pg.psql("SELECT sum((record::jsonb ->> 'status')::int) FROM requests", db).strip() == str(200 + 401 + 404 + 200)
    got = pg.psql("SELECT request_id, model, record::jsonb ->> 'model' FROM requests ORDER BY id", db)
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in got.splitlines()}
    assert rows[ids["unknown"]] == ["a\ufffdb", "a\ufffdb"], rows  # the column says what the line says
    assert rows[ids["anon"]] in (["", ""], ["a\ufffdb", "a\ufffdb"]), rows
    # The captured bodies read as jsonb too; the upload's bytes as they came (base64), not as text.
    counts = pg.psql("SELECT count(bodies::jsonb), count(bodies) FROM requests", db).split()
    assert counts[0] == counts[1] and int(counts[0]) >= 2, counts
    req = json.loads(pg.psql(f"SELECT bodies::jsonb -> 'request' FROM requests WHERE request_id = '{ids['audio']}'",
                             db))
    assert "text" not in req and "base64" in req, req
    assert audio in base64.b64decode(req["base64"])


# --- 2.-5. traces -----------------------------------------------------------------------------------------------------

def traced(m, c_url: str, **tracing) -> dict:
    return {
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "openai/whisper-small", "default_max_tokens": 4}},
        "tracing": {"otlp_endpoint": c_url, "flush_interval": "10ms", **tracing},
    }


def test_an_unknown_method_is_other_and_never_a_span_name(mock, weir):
    m = mock(*MOCK)
    c = Collector()
    try:
        w = weir(config=traced(m, c.url))
        sent = {}
        for method in [f"M{uuid.uuid4().hex[:8].upper()}" for _ in range(6)] + ["get", "X" * 200, "PROPFIND"]:
            rid = "m-" + uuid.uuid4().hex[:10]
            answer = raw_request(w.port, f"{method} /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                         f"x-request-id: {rid}\r\nConnection: close\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 "), answer[:100]
            sent[rid] = method
        rid = "m-" + uuid.uuid4().hex[:10]
        r = httpx.post(w.v1 + "/chat/completions", timeout=30, headers={"x-request-id": rid},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        sent[rid] = "POST"

        def servers():
            spans = {attrs(s).get("weir.request_id"): s for s in list(c.spans) if s["kind"] == 2}
            return spans if all(k in spans for k in sent) else None
        spans = wait_until(servers, 10, interval=0.02, message="every request's span")
        names = set()
        for rid, method in sent.items():
            s = spans[rid]
            a = attrs(s)
            names.add(s["name"])
            if method == "POST":
                assert s["name"] == "POST /v1/chat/completions" and a["http.request.method"] == "POST"
                assert "http.request.method_original" not in a
            else:
                assert s["name"] == "HTTP /v1/chat/completions", s["name"]
                assert a["http.request.method"] == "_OTHER", a
                assert a["http.request.method_original"] == method, a
        # However many methods clients invent: two names.
        assert names == {"POST /v1/chat/completions", "HTTP /v1/chat/completions"}, names
        # An unknown path is no route: the method alone, never the client's path.
        rid = "p-" + uuid.uuid4().hex[:10]
        raw_request(w.port, f"GET /v1/unknown-{uuid.uuid4().hex} HTTP/1.1\r\nHost: x\r\nx-request-id: {rid}\r\n"
                            "Connection: close\r\n\r\n".encode())
        s = wait_until(lambda: next((s for s in list(c.spans) if attrs(s).get("weir.request_id") == rid), None), 10,
                       interval=0.02, message="the unknown path's span")
        assert s["name"] == "GET" and "http.route" not in attrs(s), s
    finally:
        c.close()


def test_a_configured_resource_attribute_replaces_weirs_own(mock, weir):
    m = mock(*MOCK)
    c = Collector()
    try:
        w = weir(config=traced(m, c.url, resource={"host.name": "node-7", "service.instance.id": "pod-uid-1",
                                                   "service.version": "2.3.4", "deployment.environment": "prod"}))
        r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        wait_until(lambda: c.requests, 10, interval=0.02, message="an export")
        doc = json.loads(c.requests[0]["body"])
        pairs = [(a["key"], a["value"]["stringValue"]) for a in doc["resourceSpans"][0]["resource"]["attributes"]]
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys  # OTLP: keys are unique
        got = dict(pairs)
        assert got["host.name"] == "node-7" and got["service.instance.id"] == "pod-uid-1"
        assert got["service.version"] == "2.3.4" and got["deployment.environment"] == "prod"
        assert got["service.name"] == "weir" and got["telemetry.sdk.name"] == "weir"
    finally:
        c.close()


def test_a_retry_after_too_large_to_read_waits_the_cap_and_a_path_keeps_its_slash(mock, weir):
    m = mock(*MOCK)
    c = Collector()
    try:
        c.script = [503]
        c.retry_after = "99999999999999999999"
        w = weir(config=traced(m, c.url + "/otlp/"))
        r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        wait_until(lambda: len(c.requests) >= 2, 15, interval=0.05, message="the retried export")
        first, second = c.requests[0], c.requests[1]
        # "Very long" is capped at the documented 5 s, not read as none (the 0.5 s backoff).
        assert second["t"] - first["t"] >= 4.5, second["t"] - first["t"]
        assert first["path"] == "/otlp/" and second["path"] == "/otlp/", (first["path"], second["path"])
    finally:
        c.close()
