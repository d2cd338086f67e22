"""Stop 57's request-log defects end to end (each test fails on the build before its fix):

- a captured body of quotes (JSON-escaped as \\") cost the writer thread O(n²) in the pattern redaction: one
  such request stalled every tenant's records behind it for minutes, dropped as queue_full;
- a PostgreSQL connection the server closed while idle (a restart, idle_session_timeout, pg_terminate_backend,
  a pooler) lost the next batch (and the whole queue at a shutdown drain), and failed the admin API's next read;
- with request_log.url a symbolic link, SQLite's write-ahead log is beside the link's target, but Weir watched
  PATH-wal beside the link: a removed log went unnoticed (rows lost at a crash); a file made through a dangling
  link was 0644, not 0600; a link re-pointed while Weir ran was not followed;
- `--check` (and start-up) accepted PostgreSQL URLs libpq refuses at every connection;
- a failed COPY's DETAIL (the failing row: a record) was printed on stderr."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import uuid

import httpx
import pytest

from conftest import binary, free_port, wait_until
from pg import Postgres

TOKEN = "admin-test-token-reqlog57-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
AUTH = {"authorization": f"Bearer {TOKEN}"}
ACME = "sk-acme-0123456789abcdef"
TINY = "sk-tiny-0123456789abcdef"
MOCK_FLAGS = ("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "4", "--model", "m-up")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(mock, url: str, admin_port: int | None = None, **request_log) -> dict:
    cfg = {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "m-up", "default_max_tokens": 4}},
        "tenants": {"acme": {}, "tiny": {}},
        "auth": {"api_keys": [{"id": "acme-1", "sha256": sha(ACME), "tenant": "acme"},
                              {"id": "tiny-1", "sha256": sha(TINY), "tenant": "tiny"}]},
        "request_log": {"url": url, "flush_interval": "10ms", **request_log},
    }
    if admin_port:
        cfg["admin"] = {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}
    return cfg


def chat(w, request_id: str, key: str = ACME, content: str = "hello") -> int:
    return httpx.post(w.v1 + "/chat/completions", timeout=60,
                      headers={"x-request-id": request_id, "authorization": f"Bearer {key}"},
                      json={"model": "m", "messages": [{"role": "user", "content": content}]}).status_code


def rid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


# --- 1. the pattern redaction is linear --------------------------------------------------------------------------

def test_a_body_of_quotes_does_not_hold_other_tenants_records(tmp_path, mock, weir):
    # 1 MB of '"' is 2 MB of \" in the JSON body: the quadratic pass took many minutes on it (260 KB: 12.6 s).
    db = tmp_path / "requests.db"
    m = mock(*MOCK_FLAGS)
    port = free_port()
    w = weir(config=config(m, f"sqlite:{db}", admin_port=port,
                           capture_bodies={"tenants": ["acme"], "max_request_bytes": "4MiB"}), env=ENV)
    poison = rid("quotes")
    body = {"model": "m", "api_key": "sk-not-a-real-one", "messages": [{"role": "user", "content": '"' * 1_000_000}]}
    r = httpx.post(w.v1 + "/chat/completions", content=json.dumps(body).encode(), timeout=60,
                   headers={"x-request-id": poison, "authorization": f"Bearer {ACME}",
                            "content-type": "application/json"})
    assert r.status_code == 200, r.text
    others = [rid("other") for _ in range(5)]
    for i in others:
        assert chat(w, i, key=TINY) == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 6, 20,
               message="the other tenant's records written behind the body of quotes")
    assert w.metric("weir_request_log_dropped_total", reason="queue_full") == 0
    got = httpx.get(f"http://127.0.0.1:{port}/admin/v1/requests/{poison}", headers=AUTH, timeout=30)
    assert got.status_code == 200, got.text
    stored = json.loads(got.json()["bodies"]["request"]["text"])
    assert stored["messages"][0]["content"] == '"' * 1_000_000  # redaction changed nothing else
    assert stored["api_key"] == "[REDACTED]"


# --- 2. PostgreSQL connections the server closed while idle -------------------------------------------------------

@pytest.fixture(scope="module")
def pg():
    p = Postgres()
    p.start()
    yield p
    p.stop()


def rows(pg, db) -> list[str]:
    return pg.psql("SELECT request_id FROM requests ORDER BY id", db).split()


def weir_backends(pg, db) -> int:
    return int(pg.psql(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' "
                       "AND application_name = 'weir'").strip())


def close_weirs_connections(pg, db) -> None:
    """pg_terminate_backend on every connection Weir has to `db` (the writer's, the admin reader's), as a
    restart, idle_session_timeout or a pooler closes them; returns once they are gone."""
    pg.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}' "
            "AND application_name = 'weir'")
    wait_until(lambda: weir_backends(pg, db) == 0, 10, message="weir's connections closed")


@pytest.mark.parametrize("how", ["terminated", "idle_session_timeout"])
def test_a_connection_closed_while_idle_loses_no_batch_and_no_read(pg, mock, weir, how):
    db = pg.new_database()
    if how == "idle_session_timeout":
        pg.psql(f"ALTER DATABASE {db} SET idle_session_timeout = '300ms'")
    m = mock(*MOCK_FLAGS)
    port = free_port()
    w = weir(config=config(m, pg.url(db), admin_port=port), env=ENV)
    admin = f"http://127.0.0.1:{port}/admin/v1/requests"
    first = rid("first")
    assert chat(w, first) == 200
    wait_until(lambda: first in rows(pg, db), 10, message="the first row")
    listed = httpx.get(admin, params={"limit": 10}, headers=AUTH, timeout=30)
    assert listed.status_code == 200 and [x["request_id"] for x in listed.json()["data"]] == [first]
    for round in range(2):
        if how == "terminated":
            close_weirs_connections(pg, db)
        else:  # the server ends the sessions idle for 300 ms: the writer's and the admin reader's
            wait_until(lambda: weir_backends(pg, db) == 0, 10, message="the idle sessions ended")
        ids = [rid(f"after{round}") for _ in range(5)]
        for i in ids:
            assert chat(w, i) == 200
        wait_until(lambda: set(ids) <= set(rows(pg, db)), 10, message="the rows sent after the close")
        if how == "terminated":
            close_weirs_connections(pg, db)
        else:
            wait_until(lambda: weir_backends(pg, db) == 0, 10, message="the idle sessions ended")
        # The admin API's first read after: answered, not a 503.
        r = httpx.get(admin, params={"limit": 100}, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
        assert set(ids) <= {x["request_id"] for x in r.json()["data"]}
        if how == "terminated":
            close_weirs_connections(pg, db)
        one = httpx.get(f"{admin}/{ids[0]}", headers=AUTH, timeout=30)
        assert one.status_code == 200 and one.json()["request_id"] == ids[0], one.text
    assert w.metric("weir_request_log_dropped_total", reason="write_error") == 0
    assert w.metric("weir_request_log_errors_total") == 0
    assert len(rows(pg, db)) == 11


def test_the_shutdown_drain_after_a_closed_connection_stores_the_queue(pg, mock, weir):
    db = pg.new_database()
    m = mock(*MOCK_FLAGS)
    # flush_interval 10 s, the most: the records wait in the queue until SIGTERM's drain.
    w = weir(config=config(m, pg.url(db), flush_interval="10s"))
    wait_until(lambda: w.metric("weir_request_log_open") == 1 and weir_backends(pg, db) == 1, 10,
               message="the writer connected")
    close_weirs_connections(pg, db)
    ids = [rid("queued") for _ in range(20)]
    for i in ids:
        assert chat(w, i) == 200
    wait_until(lambda: w.metric("weir_request_log_queued") >= 20, 10, message="the records queued")
    assert w.process.stop(20) == 0
    assert set(ids) <= set(rows(pg, db)), w.process.log()
    assert "not written at shutdown" not in w.process.log()


def test_a_failed_copy_does_not_print_the_failing_row(pg, mock, weir):
    db = pg.new_database()
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, pg.url(db)))
    wait_until(lambda: w.metric("weir_request_log_open") == 1, 10, message="the schema made")
    wait_until(lambda: "requests" in pg.psql("SELECT tablename FROM pg_tables", db).split(), 10, message="the table")
    # A column no COPY of Weir's fills: every batch fails on its NOT NULL, and PostgreSQL's DETAIL quotes the row.
    pg.psql("ALTER TABLE requests ADD COLUMN extra text NOT NULL", db)
    secret_id = rid("row-data-never-printed")
    assert chat(w, secret_id) == 200
    wait_until(lambda: w.metric("weir_request_log_errors_total") >= 1, 10, message="the failed COPY counted")
    w.process.stop(20)
    log = w.process.log()
    assert "violates not-null constraint" in log, log
    assert secret_id not in log and "Failing row" not in log, log


# --- 3. SQLite through a symbolic link ----------------------------------------------------------------------------

def sqlite_rows(path) -> set[str]:
    with sqlite3.connect(path, isolation_level=None, timeout=5) as c:
        return {r[0] for r in c.execute("SELECT request_id FROM requests")}


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_file_made_through_a_dangling_link_is_0600(tmp_path, mock, weir, umask022):
    data = tmp_path / "data"
    data.mkdir()
    link = tmp_path / "requests.db"
    link.symlink_to("data/requests.db")  # relative: from the link's directory
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, f"sqlite:{link}"))
    i = rid("a")
    assert chat(w, i) == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 1, 10, message="the row")
    assert link.is_symlink()
    for name in ("requests.db", "requests.db-wal", "requests.db-shm"):
        assert (data / name).stat().st_mode & 0o777 == 0o600, name
    assert not (tmp_path / "requests.db-wal").exists()
    assert w.process.stop(15) == 0
    assert sqlite_rows(data / "requests.db") == {i}


def test_a_removed_log_beside_a_links_target_is_noticed(tmp_path, mock, weir):
    data = tmp_path / "data"
    data.mkdir()
    real = data / "requests.db"
    link = tmp_path / "requests.db"
    link.symlink_to(real)
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, f"sqlite:{link}"))
    before = [rid("before") for _ in range(5)]
    for i in before:
        assert chat(w, i) == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 5, 10, message="the first rows")
    os.remove(f"{real}-wal")  # an operator's cleanup of a "stale" log
    wait_until(lambda: w.metric("weir_request_log_errors_total") >= 1, 10, message="the removed log noticed")
    after = [rid("after") for _ in range(5)]
    for i in after:
        assert chat(w, i) == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 10, 10, message="the later rows")
    w.process.popen.kill()  # a crash: what only the unlinked log held would be lost
    w.process.popen.wait(10)
    assert sqlite_rows(real) == set(before) | set(after)
    assert f"{real}-wal was deleted or replaced" in w.process.log()


def test_a_link_re_pointed_while_running_is_followed(tmp_path, mock, weir, umask022):
    link = tmp_path / "requests.db"
    link.symlink_to(tmp_path / "one.db")
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, f"sqlite:{link}"))
    first = [rid("one") for _ in range(3)]
    for i in first:
        assert chat(w, i) == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 3, 10, message="the first rows")
    tmp = tmp_path / "requests.db.new"
    tmp.symlink_to(tmp_path / "two.db")  # a file not made yet
    os.rename(tmp, link)  # re-pointed at once, as `ln -sfn` does
    second = [rid("two") for _ in range(3)]
    for i in second:
        assert chat(w, i) == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 6, 10, message="the later rows")
    assert w.process.stop(15) == 0
    assert sqlite_rows(tmp_path / "one.db") == set(first)
    assert sqlite_rows(tmp_path / "two.db") == set(second)
    assert (tmp_path / "two.db").stat().st_mode & 0o777 == 0o600


# --- 4. PostgreSQL URLs libpq refuses -----------------------------------------------------------------------------

def check_config(url: str) -> dict:
    return {"listen": f"127.0.0.1:{free_port()}", "pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}},
            "models": {"m": {"pool": "p"}}, "request_log": {"url": url}}


@pytest.mark.parametrize("url, said", [
    ("postgres://[::1", "IPv6"),
    ("postgres://weir:pw-sekrit-57@127.0.0.1:99999/db", "port 99999"),
    ("postgres://weir@127.0.0.1:5432,127.0.0.1:0/db", "port 0"),
    ("postgres://weir@127.0.0.1/db?sslmode=bogus", "sslmode=bogus"),
    ("postgres://weir@127.0.0.1/db?nosuchparam=1", "nosuchparam"),
    ("postgres://weir@127.0.0.1/db?connect_timeout=soon", "connect_timeout=soon"),
    ("postgres://weir:pw-sekrit-57@[::1/db", "IPv6"),
])
@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_a_postgres_url_libpq_refuses_is_a_config_error(tmp_path, url, said, check):
    path = tmp_path / "weir.yaml"
    path.write_text(json.dumps(check_config(url)))
    r = subprocess.run([binary("weir"), "--config", str(path), *(["--check"] if check else [])],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    out = r.stdout + r.stderr
    assert "request_log.url" in out and "libpq cannot connect with this URL" in out and said in out, out
    assert "pw-sekrit-57" not in out, out


def test_postgres_urls_libpq_takes_pass_check(tmp_path):
    for url in ("postgres://weir@127.0.0.1:5432/db?sslmode=verify-full&connect_timeout=3&target_session_attrs=any",
                "postgresql://weir:pw@[::1]:6432,127.0.0.1/db?application_name=x&keepalives_idle=60",
                "postgres:///db?host=/run/postgresql", "postgres://h1:,h2:5433/db"):
        path = tmp_path / "weir.yaml"
        path.write_text(json.dumps(check_config(url)))
        r = subprocess.run([binary("weir"), "--config", str(path), "--check"], capture_output=True, text=True,
                           timeout=20)
        assert r.returncode == 0, (url, r.stdout, r.stderr)
