"""Observability fixes of stop 49: the tracer's stderr line about dropped spans names only the reasons that
moved, one failed attempt counts one failure, a scrape's interim 100 Continue stays out of the byte counters,
bytes_in is what Weir took of the request from the connection, and the admin API's request-log reader follows
a database file that was renamed."""

from __future__ import annotations

import httpx
import pytest

from conftest import free_port, wait_until
from otlp import Collector

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4", "--model", "m-up")


def chat(w, request_id: str, **kw) -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": request_id}, timeout=10,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, **kw)


# --- 1. the tracer's drop line -------------------------------------------------------------------------------------

# DEFECT: the tracer's stderr line about dropped spans summed every reason and added "; last error: ..." whenever
# an export had ever failed: spans a full queue dropped minutes after one refused batch were blamed on the
# collector ("... answered 400"). The line names each reason of weir_tracing_spans_dropped_total that moved since
# the last one, and the collector's error only with the drops it caused.
def test_spans_a_full_queue_dropped_are_not_blamed_on_an_old_export_error(mock, weir):
    m = mock(*MOCK_FLAGS)
    c = Collector()
    try:
        w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                         "models": {"m": {"pool": "p", "upstream_model": "m-up"}},
                         "tracing": {"otlp_endpoint": c.url, "flush_interval": "10ms", "queue": 16, "batch": 1,
                                     "timeout": "30s"}}, workers=1)
        with c.lock:
            c.script = [400]  # final: the batch is dropped at once
        assert chat(w, "refused").status_code == 200
        wait_until(lambda: w.metric("weir_tracing_spans_dropped_total", reason="export_failed") > 0, 10,
                   message="the refused batch")
        wait_until(lambda: "answered 400" in w.process.log(), 5, message="the refused batch said at once")
        said = [ln for ln in w.process.log().splitlines() if "spans dropped" in ln]
        assert "answered 400" in said[0] and "queue full" not in said[0], said
        # The collector now holds every answer: the exporter's one POST waits, the worker's queue fills.
        c.gate.clear()
        n = 0
        while w.metric("weir_tracing_spans_dropped_total", reason="queue_full") == 0:
            assert chat(w, f"fill-{n}").status_code == 200
            n += 1
            assert n < 200, "the queue never filled"
        c.gate.set()
        assert w.process.stop(15) == 0  # the drain's report says the rest
        said = [ln for ln in w.process.log().splitlines() if "spans dropped" in ln]
        assert len(said) >= 2, w.process.log()
        for line in said[1:]:
            assert "queue full" in line, line
            assert "400" not in line and "could not be exported" not in line and "last error" not in line, line
    finally:
        c.gate.set()
        c.close()


# --- 2. one failed attempt, one failure count ----------------------------------------------------------------------

_ERR = b'{"error":{"message":"no","type":"x"}}'
BROKEN_5XX = {
    # a chunked body whose chunk size is no number
    "bad_chunk": b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                 b"transfer-encoding: chunked\r\n\r\nzz\r\n" + _ERR + b"\r\n0\r\n\r\n",
    # a coding the client did not accept, which Weir cannot decode for it
    "undecodable": b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                   b"content-encoding: br\r\ncontent-length: %d\r\n\r\n%s" % (len(_ERR), _ERR),
}


# DEFECT: a 5xx head counted kind="status" in weir_upstream_failures_total at once; a body of it that then failed
# to parse (or to decode) counted again, kind="protocol": two failures for one attempt, so failures ÷ attempts
# passed 1. One attempt counts once, by its first cause (the status); unbatched and as a micro-batch's answer.
@pytest.mark.parametrize("answer", sorted(BROKEN_5XX))
@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batch"])
def test_a_5xx_whose_body_breaks_is_one_failure(weir, answer, batched):
    from test_defect_fixes import RawUpstream
    up = RawUpstream(lambda h, b: [BROKEN_5XX[answer], None])
    try:
        pool = {"endpoints": [up.url], "retry": {"attempts": 1}}
        if batched:
            pool["batch"] = {"window": "5ms", "max_size": 4}
        w = weir(config={"pools": {"p": pool}, "default_pool": "p"}, workers=1)
        r = httpx.post(w.v1 + "/completions", timeout=10, headers={"accept-encoding": "identity"},
                       json={"model": "m", "prompt": "hi", "max_tokens": 5})
        assert r.status_code >= 500, r.text
        assert w.metric("weir_upstream_attempts_total") == 1
        assert w.metric("weir_upstream_failures_total", kind="status") == 1
        failures = [ln for ln in w.metrics_text().splitlines() if ln.startswith("weir_upstream_failures_total{")]
        assert w.metric("weir_upstream_failures_total") == 1, [ln for ln in failures if not ln.endswith(" 0")]
    finally:
        up.close()


# --- 3. a scrape's 100 Continue --------------------------------------------------------------------------------------

def raw_exchange(port: int, head: bytes, body: bytes) -> bytes:
    """Sends `head`, waits for the interim 100 Continue, sends `body`; returns everything read until the close."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), got
        s.sendall(body)
        while chunk := s.recv(65536):
            got += chunk
        return got


# DEFECT: /metrics scrapes on the client port were left out of weir_response_bytes_total (they write no access-log
# line), but only from serve_own on: a scrape that expects 100-continue (a body of its own) got its interim
# "HTTP/1.1 100 Continue" counted, 25 bytes per scrape no log line has. (The admin listener counts no bytes.)
def test_a_scrapes_100_continue_stays_out_of_the_byte_counters(mock, weir):
    m = mock(*MOCK_FLAGS)
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                     "models": {"m": {"pool": "p", "upstream_model": "m-up"}}}, workers=1)
    before = w.metric("weir_response_bytes_total")
    for _ in range(3):
        got = raw_exchange(w.port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n"
                                   b"Expect: 100-continue\r\nConnection: close\r\n\r\n", b"{}")
        assert b"\r\n\r\nHTTP/1.1 200 " in got, got[:200]
    assert w.metric("weir_response_bytes_total") == before
    assert w.metric("weir_request_bytes_total") == 0


# --- 5. the request-log reader after a rename ------------------------------------------------------------------------

ADMIN_TOKEN = "admin-test-token-0123456789"


# DEFECT: the admin API's reader of the SQLite request log kept its connection to the file it first opened: after
# logrotate renamed it (the writer then opens a new file at the path), GET /admin/v1/requests went on listing the
# renamed file's rows and never the new ones (and read the new file's WAL, at the old name, against the old pages).
# It opens the path again once the file it holds has moved.
def test_the_request_log_reader_follows_a_renamed_database(mock, weir, tmp_path):
    import sqlite3
    m = mock(*MOCK_FLAGS)
    db = tmp_path / "requests.db"
    port = free_port()
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                     "models": {"m": {"pool": "p", "upstream_model": "m-up"}},
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"},
                     "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
             env={"WEIR_TEST_ADMIN_TOKEN": ADMIN_TOKEN}, workers=1)
    admin = f"http://127.0.0.1:{port}/admin/v1/requests"
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}

    def listed() -> set[str]:
        r = httpx.get(admin, params={"limit": 100}, headers=auth, timeout=10)
        return {rec["request_id"] for rec in r.json()["data"]} if r.status_code == 200 else set()

    def rows(path) -> set[str]:
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
                return {r[0] for r in c.execute("SELECT request_id FROM requests")}
        except sqlite3.OperationalError:  # not made yet
            return set()

    before = {f"before-{i}" for i in range(3)}
    for rid in sorted(before):
        assert chat(w, rid).status_code == 200
    wait_until(lambda: listed() == before, 10, message="the first rows listed")  # (the reader is open now)
    db.rename(tmp_path / "requests.db.1")
    after = {f"after-{i}" for i in range(3)}
    for rid in sorted(after):
        assert chat(w, rid).status_code == 200
    wait_until(lambda: after <= rows(db), 10, message="the later rows in a new file")
    # The new file's rows checkpointed into it (as SQLite does as its WAL grows): the WAL at the path, which a
    # reader of the old file shared, no longer holds them.
    with sqlite3.connect(db, isolation_level=None, timeout=5) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert listed() == after
    r = httpx.get(f"{admin}/after-0", headers=auth, timeout=10)
    assert r.status_code == 200, r.text
    assert httpx.get(f"{admin}/before-0", headers=auth, timeout=10).status_code == 404


# --- 4. bytes_in: what Weir took of the request from the connection ---------------------------------------------

KEY = "sk-obs49-0123456789abcdef"


def raw_request(port: int, head: bytes, body: bytes, together: bool) -> bytes:
    """Sends `head` and `body` (in one write, or the head alone: its body never comes); returns the answer."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body if together else head)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        return got


# DEFECT: a request refused on its head (a 401) logged bytes_in = its body's size when the body came in the same read
# as the head (Weir read it first) and 0 when it came later, for the same request; and bytes_in never had the head,
# so a refused request read whole looked like one that sent nothing. bytes_in is now what Weir took from the
# connection: the head, and what of the body it read (framing included), on both listeners;
# weir_request_bytes_total adds up to the client listener's lines.
def test_bytes_in_is_the_head_and_the_body_weir_read(mock, weir):
    import hashlib
    m = mock(*MOCK_FLAGS)
    admin_port = free_port()
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                     "models": {"m": {"pool": "p", "upstream_model": "m-up"}},
                     "tenants": {"t": {}},
                     "auth": {"api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                                            "tenant": "t"}]},
                     "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
             env={"WEIR_TEST_ADMIN_TOKEN": ADMIN_TOKEN}, workers=1)
    before = w.metric("weir_request_bytes_total")
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'

    def head(rid: str, key: str, extra: bytes = b"") -> bytes:
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + key.encode() + b"\r\nx-request-id: " + rid.encode() + b"\r\n" + extra +
                b"Content-Length: %d\r\n\r\n" % len(body))

    cases = {}
    # Refused on its head, its body in the same read: read first, counted (the connection stays open).
    h = head("in-401-whole", "sk-wrong")
    assert raw_request(w.port, h, body, True).startswith(b"HTTP/1.1 401 ")
    cases["in-401-whole"] = len(h) + len(body)
    # Refused on its head, its body not here: never read, the connection closes: the head alone.
    h = head("in-401-head", "sk-wrong")
    assert raw_request(w.port, h, body, False).startswith(b"HTTP/1.1 401 ")
    cases["in-401-head"] = len(h)
    # Answered: head and body.
    h = head("in-200", KEY)
    assert raw_request(w.port, h, body, True).startswith(b"HTTP/1.1 200 ")
    cases["in-200"] = len(h) + len(body)
    # A chunked body: as it came, its framing included.
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    h = head("in-chunked", KEY).replace(b"Content-Length: %d\r\n" % len(body), b"Transfer-Encoding: chunked\r\n")
    assert raw_request(w.port, h, chunked, True).startswith(b"HTTP/1.1 200 ")
    cases["in-chunked"] = len(h) + len(chunked)
    # A 413 by its Content-Length: refused before the body, the head alone.
    h = head("in-413", KEY).replace(b"Content-Length: %d" % len(body), b"Content-Length: %d" % (1 << 40))
    assert raw_request(w.port, h, b"", False).startswith(b"HTTP/1.1 413 ")
    cases["in-413"] = len(h)
    got = {rid: w.log_for(rid)["bytes_in"] for rid in cases}
    assert got == cases
    assert w.metric("weir_request_bytes_total") - before == sum(cases.values())
    # The admin listener: the same rule.
    admin_body = b'{"tenant":"t"}'
    for token, rid, whole in ((ADMIN_TOKEN, "admin-ok", True), ("wrong-token-0123456789", "admin-401", False)):
        h = (b"POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(admin_body))
        raw_request(admin_port, h, admin_body, whole)
        cases[rid] = len(h) + (len(admin_body) if whole else 0)
    lines = w.wait_log(lambda es: sum(1 for e in es if e.get("listener") == "admin") >= 2, 5, message="admin lines")
    admin = [e for e in lines if e.get("listener") == "admin"]
    assert [e["bytes_in"] for e in admin] == [cases["admin-ok"], cases["admin-401"]], admin
