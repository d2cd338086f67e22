"""The request-log store (request_log: sqlite:...) end to end: real weir and
weir-mock, requests of every kind, then the SQLite file read with Python's
sqlite3: exactly one row per access-log line, with the same fields. And a
store that cannot be written: Weir serves on and counts."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid

import httpx
from conftest import wait_until

MOCK_FLAGS = ("--ttft-ms", "5", "--itl-ms", "2", "--max-tokens", "8", "--model", "m-up")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(mock, db_url: str, **request_log) -> dict:
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "m-up", "default_max_tokens": 8}},
        "tenants": {"acme": {}, "tiny": {"limits": {"requests_per_minute": 1}}},
        "auth": {"api_keys": [
            {"id": "acme-1", "sha256": sha("sk-acme"), "tenant": "acme"},
            {"id": "tiny-1", "sha256": sha("sk-tiny"), "tenant": "tiny"},
        ]},
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "request_log": {"url": db_url, "flush_interval": "10ms", **request_log},
    }


def rid() -> str:
    return "rl-" + uuid.uuid4().hex[:12]


def chat(w, key, request_id, stream=False, headers=None, client: httpx.Client | None = None, **body):
    h = {"x-request-id": request_id, **(headers or {})}
    if key:
        h["authorization"] = f"Bearer {key}"
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": stream, **body}
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return (client or httpx).post(w.v1 + "/chat/completions", json=payload, headers=h, timeout=30)


def rows(db: str) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM requests ORDER BY id")]
    finally:
        con.close()


def test_one_row_per_access_log_line_with_matching_fields(tmp_path, mock, weir):
    m = mock(*MOCK_FLAGS)
    db = str(tmp_path / "requests.db")
    w = weir(config=config(m, f"sqlite:{db}"))
    ids = {k: rid() for k in ("ok", "stream", "401", "429a", "429b", "400", "5xx", "leave")}
    assert chat(w, "sk-acme", ids["ok"]).status_code == 200
    r = chat(w, "sk-acme", ids["stream"], stream=True)
    assert r.status_code == 200 and "[DONE]" in r.text
    assert chat(w, "sk-wrong", ids["401"]).status_code == 401
    assert chat(w, "sk-tiny", ids["429a"]).status_code == 200
    assert chat(w, "sk-tiny", ids["429b"]).status_code == 429
    assert httpx.post(w.v1 + "/chat/completions", content=b"{not json", timeout=30,
                      headers={"authorization": "Bearer sk-acme", "x-request-id": ids["400"],
                               "content-type": "application/json"}).status_code == 400
    assert chat(w, "sk-acme", ids["5xx"], headers={"x-mock-status": "500"}).status_code >= 500
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8}
    with httpx.stream("POST", w.v1 + "/chat/completions", json=payload, timeout=30,
                      headers={"authorization": "Bearer sk-acme", "x-request-id": ids["leave"],
                               "x-mock-itl-ms": "200"}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                break  # leave mid-stream
    w.wait_log(lambda es: {e["request_id"] for e in es} >= set(ids.values()), timeout=10)
    # Nothing else runs now: wait until the store holds as many rows as the log has lines.
    wait_until(lambda: {r["request_id"] for r in rows(db)} >= set(ids.values())
               and len(rows(db)) == len(w.log_entries()), 5, message="a row for every access-log line")
    entries = w.log_entries()
    got = rows(db)
    by_id = {}
    for r in got:
        assert r["request_id"] not in by_id, f"two rows for {r['request_id']}"
        by_id[r["request_id"]] = r
    assert set(by_id) == {e["request_id"] for e in entries}
    assert len(got) == len(entries)
    for e in entries:
        row = by_id[e["request_id"]]
        assert json.loads(row["record"]) == e  # the whole line, as JSON
        assert row["status"] == e["status"]
        assert row["tenant"] == e.get("tenant")
        assert row["key_id"] == e.get("key_id")
        assert row["model"] == e.get("model")
        assert row["ts_us"] // 1000 % 1000 == int(e["ts"][20:23])  # the same millisecond
    rec = {k: json.loads(by_id[v]["record"]) for k, v in ids.items()}
    assert rec["ok"]["status"] == 200 and rec["ok"]["prompt_tokens"] > 0 and rec["ok"]["completion_tokens"] == 8
    assert rec["ok"]["cached_tokens"] == 0 and rec["ok"]["spend_usd"] > 0
    assert rec["stream"]["stream"] is True and rec["stream"]["completion_tokens"] == 8
    assert rec["stream"]["ttft_ms"] is not None
    assert rec["401"]["status"] == 401 and by_id[ids["401"]]["tenant"] is None
    assert rec["429b"]["status"] == 429 and by_id[ids["429b"]]["tenant"] == "tiny"
    assert by_id[ids["429b"]]["key_id"] == "tiny-1"
    assert rec["400"]["status"] == 400
    assert rec["5xx"]["status"] >= 500
    assert rec["leave"]["status"] == 499
    # (Counted after the commit that made the rows visible, on the writer's SCHED_IDLE thread: waited for.)
    wait_until(lambda: w.metric("weir_request_log_written_total") >= len(entries), 10, message="the rows counted")
    assert w.metric("weir_request_log_dropped_total", reason="queue_full") == 0
    assert w.metric("weir_request_log_errors_total") == 0
    assert w.metric("weir_request_log_open") == 1
    # WAL mode.
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


def test_sigterm_drains_the_queue_into_the_store(tmp_path, mock, weir):
    m = mock(*MOCK_FLAGS)
    db = str(tmp_path / "requests.db")
    # A long flush interval: the records are still queued when SIGTERM comes.
    w = weir(config=config(m, f"sqlite:{db}", flush_interval="10s"))
    ids = [rid() for _ in range(20)]
    for i in ids:
        assert chat(w, "sk-acme", i).status_code == 200
    assert w.process.stop() == 0
    stored = {r["request_id"] for r in rows(db)}
    assert set(ids) <= stored
    assert len(rows(db)) == len(w.log_entries())


def test_unwritable_store_serves_on_and_counts(tmp_path, mock, weir):
    m = mock(*MOCK_FLAGS)
    # A store SQLite cannot use: a file that is no database (a directory there is a configuration error;
    # permission bits do not stop root).
    (tmp_path / "requests.db").write_bytes(b"this is not an SQLite database\n" * 512)
    w = weir(config=config(m, f"sqlite:{tmp_path}/requests.db", queue=16))
    for _ in range(40):
        assert chat(w, "sk-acme", rid()).status_code == 200
    wait_until(lambda: w.metric("weir_request_log_dropped_total", reason="queue_full") >= 1, 5,
               message="drops counted")
    assert w.metric("weir_request_log_errors_total") >= 1
    assert w.metric("weir_request_log_open") == 0
    assert w.metric("weir_request_log_written_total") == 0
    assert f"request log {tmp_path}/requests.db" in w.process.log()
    assert w.process.stop() == 0


def test_missing_directory_is_a_configuration_error(tmp_path, mock):
    from conftest import binary
    import subprocess
    m = mock(*MOCK_FLAGS)
    cfg = tmp_path / "weir.yaml"
    cfg.write_text(f"pools: {{p: {{endpoints: ['{m.base_url}']}}}}\ndefault_pool: p\n"
                   f"request_log: {{url: 'sqlite:{tmp_path}/nowhere/requests.db'}}\n")
    r = subprocess.run([binary("weir"), "--config", str(cfg), "--check"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2, r
    assert f"request_log.url: directory \"{tmp_path}/nowhere\" does not exist" in r.stderr


def test_weir_requests_cli_filters_and_pages(tmp_path, mock, weir):
    import subprocess
    from conftest import binary
    m = mock(*MOCK_FLAGS)
    db = str(tmp_path / "requests.db")
    w = weir(config=config(m, f"sqlite:{db}"))
    acme = [rid() for _ in range(7)]
    for i in acme:
        assert chat(w, "sk-acme", i).status_code == 200
    denied = rid()
    assert chat(w, "sk-nope", denied).status_code == 401
    wait_until(lambda: {r["request_id"] for r in rows(db)} >= set(acme) | {denied}, 5, message="rows stored")

    def cli(*args):
        r = subprocess.run([binary("weir"), "requests", "--db", db, *args], capture_output=True, text=True,
                           timeout=10)
        return r.returncode, r.stdout, r.stderr

    seen, cursor = [], None
    while True:
        rc, out, err = cli("--tenant", "acme", "--limit", "3", *(["--cursor", cursor] if cursor else []))
        assert rc == 0, err
        page = json.loads(out)
        assert page["object"] == "list" and len(page["data"]) <= 3
        seen += [r["request_id"] for r in page["data"]]
        cursor = page["next_cursor"]
        assert page["has_more"] == (cursor is not None)
        if not cursor:
            break
    assert seen == list(reversed(acme))  # newest first, each once
    rc, out, _ = cli("--status", "4xx")
    assert rc == 0 and [r["request_id"] for r in json.loads(out)["data"]] == [denied]
    rc, out, _ = cli("--id", acme[2])
    assert rc == 0 and json.loads(out)["request_id"] == acme[2]
    rc, _, err = cli("--id", "no-such-request")
    assert rc == 1 and "no request with id" in err
    rc, _, err = cli("--limit", "0")
    assert rc == 2 and "--limit" in err


def test_a_locked_store_never_slows_requests_and_catches_up(tmp_path, mock, weir):
    import time
    m = mock(*MOCK_FLAGS)
    db = str(tmp_path / "requests.db")
    w = weir(config=config(m, f"sqlite:{db}"))
    first = rid()
    assert chat(w, "sk-acme", first).status_code == 200
    wait_until(lambda: first in {r["request_id"] for r in rows(db)}, 5, message="first row")
    # Another process holds the write lock for 3 s: the writer's BEGIN waits (busy_timeout 2 s) and
    # fails, the records stay queued; the request path does not notice.
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    ids, slowest = [rid() for _ in range(30)], 0.0
    client = httpx.Client()  # (one, made before the clock: making a client costs more CPU than the request)
    try:
        for i in ids:
            t0 = time.monotonic()
            assert chat(w, "sk-acme", i, client=client).status_code == 200
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.05)  # (the clients' pace: the writer's flushes meet the lock between requests)
        wait_until(lambda: w.metric("weir_request_log_errors_total") >= 1, 5, message="a busy store counted")
    finally:
        lock.execute("ROLLBACK")
        lock.close()
        client.close()
    # The mock takes ~25 ms; a request waiting on the lock would take at least busy_timeout, 2 s. (The client's
    # clock: a worker blocked on the store would delay the requests after it before Weir's clock starts.)
    assert slowest < 1.9, slowest
    wait_until(lambda: set(ids) <= {r["request_id"] for r in rows(db)}, 10, message="rows after the lock")
    assert w.metric("weir_request_log_dropped_total", reason="queue_full") == 0
    assert w.metric("weir_request_log_dropped_total", reason="write_error") == 0
