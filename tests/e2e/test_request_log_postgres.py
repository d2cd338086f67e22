"""The request-log store in PostgreSQL (request_log: {url: postgres://...}) end to end: a real postgres
server started here on a free port (an unprivileged cluster in a temp dir), real weir and weir-mock. One row
per access-log line with the same fields, the admin API's and `weir requests`' queries over it, captured
bodies through COPY, retention, and a database that is down when Weir starts."""

from __future__ import annotations

import hashlib
import json
import subprocess
import uuid

import httpx
import pytest

from conftest import binary, free_port, wait_until
from pg import Postgres

MOCK_FLAGS = ("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "8", "--model", "m-up")
TOKEN = "admin-test-token-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def pg():
    p = Postgres()
    p.start()
    yield p
    p.stop()


def config(mock, url: str, admin_port: int | None = None, **request_log) -> dict:
    cfg = {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "m-up", "default_max_tokens": 8}},
        "tenants": {"acme": {}, "tiny": {"limits": {"requests_per_minute": 1}}},
        "auth": {"api_keys": [
            {"id": "acme-1", "sha256": sha("sk-acme-0123456789"), "tenant": "acme"},
            {"id": "tiny-1", "sha256": sha("sk-tiny-0123456789"), "tenant": "tiny"},
        ]},
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "request_log": {"url": url, "flush_interval": "10ms", **request_log},
    }
    if admin_port:
        cfg["admin"] = {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}
    return cfg


def rid() -> str:
    return "pg-" + uuid.uuid4().hex[:12]


def chat(w, key, request_id, stream=False, **body):
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": stream, **body}
    return httpx.post(w.v1 + "/chat/completions", json=payload, timeout=30,
                      headers={"x-request-id": request_id, "authorization": f"Bearer {key}"})


def rows(pg, db) -> list[dict]:
    out = []
    for line in pg.psql("SELECT json_build_object('id', id, 'ts_us', ts_us, 'request_id', request_id, "
                        "'tenant', tenant, 'key_id', key_id, 'model', model, 'status', status, "
                        "'record', record, 'bodies', bodies) FROM requests ORDER BY id", db).splitlines():
        out.append(json.loads(line))
    return out


def test_one_row_per_access_log_line_in_postgres(pg, mock, weir):
    db = pg.new_database()
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, pg.url(db)))
    ids = {k: rid() for k in ("ok", "stream", "401", "429a", "429b", "odd")}
    assert chat(w, "sk-acme-0123456789", ids["ok"]).status_code == 200
    assert chat(w, "sk-acme-0123456789", ids["stream"], stream=True).status_code == 200
    assert chat(w, "sk-wrong-0123456789", ids["401"]).status_code == 401
    assert chat(w, "sk-tiny-0123456789", ids["429a"]).status_code == 200
    assert chat(w, "sk-tiny-0123456789", ids["429b"]).status_code == 429
    # A model name COPY's text format must escape: tab, newline, backslash, and a NUL byte.
    r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                   content=b'{"model":"we\\tird\\n\\\\ \\u0000 \xc3\xa9","messages":[{"role":"user","content":"x"}]}',
                   headers={"x-request-id": ids["odd"], "authorization": "Bearer sk-acme-0123456789",
                            "content-type": "application/json"})
    assert r.status_code == 404  # no such model
    w.wait_log(lambda es: {e["request_id"] for e in es} >= set(ids.values()), timeout=10)
    wait_until(lambda: len(rows(pg, db)) == len(w.log_entries()), 10, message="a row for every access-log line")
    entries = {e["request_id"]: e for e in w.log_entries()}
    got = rows(pg, db)
    assert len({r["request_id"] for r in got}) == len(got) == len(entries)
    for row in got:
        e = entries[row["request_id"]]
        assert json.loads(row["record"]) == e
        assert row["status"] == e["status"] and row["tenant"] == e.get("tenant")
        assert row["key_id"] == e.get("key_id") and row["bodies"] is None
        assert row["ts_us"] // 1000 % 1000 == int(e["ts"][20:23])
    odd = next(r for r in got if r["request_id"] == ids["odd"])
    assert odd["model"] == "we\tird\n\\ \ufffd é"  # NUL cannot be stored in text: U+FFFD
    # (Counted after the commit that made the rows visible, on the writer's SCHED_IDLE thread: waited for.)
    wait_until(lambda: w.metric("weir_request_log_written_total") >= len(got), 10, message="the rows counted")
    assert w.metric("weir_request_log_errors_total") == 0
    assert w.metric("weir_request_log_open") == 1


def test_admin_api_and_cli_read_postgres(pg, mock, weir):
    db = pg.new_database()
    m = mock(*MOCK_FLAGS)
    port = free_port()
    w = weir(config=config(m, pg.url(db), admin_port=port), env=ENV)
    acme = [rid() for _ in range(7)]
    for i in acme:
        assert chat(w, "sk-acme-0123456789", i).status_code == 200
    denied = rid()
    assert chat(w, "sk-nope-0123456789", denied).status_code == 401
    wait_until(lambda: {r["request_id"] for r in rows(pg, db)} >= set(acme) | {denied}, 10, message="rows")
    base = f"http://127.0.0.1:{port}/admin/v1/requests"
    auth = {"authorization": f"Bearer {TOKEN}"}
    seen, cursor = [], None
    while True:
        r = httpx.get(base, params={"tenant": "acme", "limit": 3, **({"cursor": cursor} if cursor else {})},
                      headers=auth, timeout=10)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [x["request_id"] for x in page["data"]]
        cursor = page["next_cursor"]
        assert page["has_more"] == (cursor is not None)
        if not cursor:
            break
    assert seen == list(reversed(acme))
    r = httpx.get(base, params={"status": "4xx"}, headers=auth, timeout=10)
    assert [x["request_id"] for x in r.json()["data"]] == [denied]
    r = httpx.get(f"{base}/{acme[3]}", headers=auth, timeout=10)
    assert r.status_code == 200 and r.json()["request_id"] == acme[3]
    assert httpx.get(f"{base}/nope", headers=auth, timeout=10).status_code == 404
    # The CLI reads the same store through the same queries.
    cli = subprocess.run([binary("weir"), "requests", "--url", pg.url(db), "--key-id", "acme-1", "--limit", "2"],
                         capture_output=True, text=True, timeout=10)
    assert cli.returncode == 0, cli.stderr
    out = json.loads(cli.stdout)
    assert [x["request_id"] for x in out["data"]] == list(reversed(acme))[:2] and out["has_more"] is True
    cli = subprocess.run([binary("weir"), "requests", "--url", pg.url(db), "--id", acme[0]],
                         capture_output=True, text=True, timeout=10)
    assert cli.returncode == 0 and json.loads(cli.stdout)["request_id"] == acme[0]


def test_a_database_down_at_start_is_retried_and_catches_up(pg, mock, weir):
    db = "t_late_" + uuid.uuid4().hex[:8]  # does not exist yet: every connection fails
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, f"postgres://weir:s3cret-pw@127.0.0.1:{pg.port}/{db}"))
    ids = [rid() for _ in range(5)]
    for i in ids:
        assert chat(w, "sk-acme-0123456789", i).status_code == 200
    wait_until(lambda: w.metric("weir_request_log_errors_total") >= 1, 5, message="a failed open counted")
    assert w.metric("weir_request_log_open") == 0
    log = w.process.log()
    assert f"request log postgres://127.0.0.1:{pg.port}/{db}" in log and "s3cret-pw" not in log
    pg.psql(f"CREATE DATABASE {db}")

    def stored() -> set[str]:
        try:
            return {r["request_id"] for r in rows(pg, db)}
        except AssertionError:  # the table is not there until the writer opened the database
            return set()
    # The writer opens again every second; the queued records are then stored.
    wait_until(lambda: set(ids) <= stored(), 10, message="rows after the database came")
    assert w.metric("weir_request_log_dropped_total", reason="queue_full") == 0
    assert w.metric("weir_request_log_open") == 1


def test_retention_keeps_the_newest_rows(pg, mock, weir):
    db = pg.new_database()
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, pg.url(db), retention={"max_rows": 5, "interval": "100ms"}))
    ids = [rid() for _ in range(12)]
    for i in ids:
        assert chat(w, "sk-acme-0123456789", i).status_code == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 12, 10, message="rows written")
    wait_until(lambda: [r["request_id"] for r in rows(pg, db)] == ids[-5:], 10, message="the newest 5 rows")
    # (Counted after the deletes are committed, on the writer's SCHED_IDLE thread: waited for.)
    wait_until(lambda: w.metric("weir_request_log_deleted_total") == 7, 10, message="7 rows counted deleted")


def test_captured_bodies_survive_copy(pg, mock, weir):
    db = pg.new_database()
    m = mock(*MOCK_FLAGS)
    port = free_port()
    w = weir(config=config(m, pg.url(db), admin_port=port, capture_bodies={"tenants": ["acme"]}), env=ENV)
    i = rid()
    content = "tab\there\nnew line \\ backslash é 漢字"
    assert chat(w, "sk-acme-0123456789", i, messages=[{"role": "user", "content": content}]).status_code == 200
    wait_until(lambda: any(r["request_id"] == i for r in rows(pg, db)), 10, message="the row")
    r = httpx.get(f"http://127.0.0.1:{port}/admin/v1/requests/{i}", headers={"authorization": f"Bearer {TOKEN}"},
                  timeout=10)
    bodies = r.json()["bodies"]
    assert json.loads(bodies["request"]["text"])["messages"][0]["content"] == content
    assert bodies["response"]["truncated"] is False and '"chat.completion"' in bodies["response"]["text"]
