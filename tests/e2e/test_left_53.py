"""Items session 52 left: the exact wait of Weir's own 503s (a pool whose every endpoint is ejected, a shed
request) in retry-after-ms; the access log naming which allow-list (the tenant's or the API key's) refused a
model; the series of a model, pool, endpoint, tenant or key a reload removed leaving /metrics; the request log's reader hint and
stderr line when its -wal is replaced by a directory."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import subprocess

import httpx

from conftest import binary, free_port, parse_prometheus, wait_until
from httpwire import RawConn, request
from test_config_reload import sighup, write
from test_reqlog_storage_52 import AUTH, chat as logged_chat, start as start_logged
from test_tenancy_52 import FAST as ANY_MODEL, answer, send, tenancy_config

MSG = [{"role": "user", "content": "hello"}]
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": MSG, "max_tokens": 4, **extra}


# --- 1. retry-after-ms says the real wait -------------------------------------------------------------------------

# DEFECT: the 503 of a pool whose every endpoint was ejected sent retry-after-ms as its Retry-After's whole
# seconds × 1000: an endpoint ejected for 2.5 s said `retry-after-ms: 3000`, and an SDK (which reads
# retry-after-ms first) waited up to a second past the ejection. It is now the time left until the first
# ejection ends, to the millisecond, with Retry-After that time rounded up.
def test_a_pool_with_every_endpoint_ejected_sends_the_time_left_in_retry_after_ms(weir):
    dead = f"http://127.0.0.1:{free_port()}"
    w = weir(config={"pools": {"p": {"endpoints": [dead], "eject_for": "2500ms", "breaker": {}}},
                     "models": {"m": {"pool": "p", "upstream_model": "mock-model"}}}, workers=1)
    c = httpx.Client(base_url=w.v1, timeout=10)
    assert c.post("/chat/completions", json=chat("m")).status_code == 502  # refused: its breaker opens
    r = c.post("/chat/completions", json=chat("m"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_unavailable", r.text
    ms = int(r.headers["retry-after-ms"])
    assert 0 < ms <= 2500, r.headers  # the ejection's 2.5 s less what has passed, never rounded up to 3000
    assert int(r.headers["retry-after"]) == max(1, math.ceil(ms / 1000)), r.headers


# DEFECT: a shed request's retry-after-ms was queue.retry_after rounded up to whole seconds × 1000
# (`retry_after: 1500ms` sent 2000). It is the configured wait exactly; Retry-After rounds it up.
def test_a_shed_request_sends_queue_retry_after_exactly_in_retry_after_ms(mock, weir):
    m = mock(*FAST)
    w = weir(config={"pools": {
        "p": {"endpoints": [m.base_url], "queue": {"size": 0, "max_concurrent": 1, "retry_after": "1500ms",
                                                  "saturation": False}},
        "q": {"endpoints": [m.base_url], "queue": {"size": 0, "max_concurrent": 1, "retry_after": "2.25s",
                                                  "shed_status": 429, "saturation": False}}},
        "models": {"a": {"pool": "p", "upstream_model": "mock-model"},
                   "b": {"pool": "q", "upstream_model": "mock-model"}}}, workers=1)
    held = []
    try:
        # Each pool's one place is taken by a stream that waits upstream until its client leaves.
        for model in "ab":
            conn = RawConn(w.port)
            conn.send(request("POST", "/v1/chat/completions", chat(model, stream=True), {"x-mock-ttft-ms": "60000"}))
            held.append(conn)
        wait_until(lambda: m.metric("vllm:num_requests_running") == 2, message="both occupants run")
        c = httpx.Client(base_url=w.v1, timeout=10)
        for model, status, seconds, ms in (("a", 503, "2", "1500"), ("b", 429, "3", "2250")):
            r = c.post("/chat/completions", json=chat(model))
            assert r.status_code == status and r.json()["error"]["code"] == "overloaded", r.text
            assert (r.headers["retry-after"], r.headers["retry-after-ms"]) == (seconds, ms), r.headers
    finally:
        for conn in held:
            conn.close()


# --- 2. whose allow-list refused the model ------------------------------------------------------------------------

# DEFECT: a model refused by an allow-list was logged `model_not_allowed` alone: the operator could not tell whether
# the tenant's list (tenants.NAME.models) or the API key's own (auth.api_keys[].models) refused it. The log's error
# now says `refused_by: tenant|key`; the client's answer is still exactly an unknown model's.
def test_the_access_log_names_the_allow_list_that_refused_the_model(weir, mock, tmp_path):
    db = tmp_path / "requests.db"
    w = weir(config=tenancy_config(mock(*ANY_MODEL), request_log={"url": f"sqlite:{db}", "flush_interval": "10ms"}),
             workers=1)
    body = {"model": "secret-model", "prompt": "x", "max_tokens": 2}
    unknown = send(w, "key-beta-b", "/v1/completions", {**body, "model": "no-such-model"}, "unknown")
    for key, by in (("key-beta-b", "tenant"), ("key-acme-narrow", "key")):
        r = send(w, key, "/v1/completions", body, f"refused-{by}")
        assert answer(r, "secret-model") == answer(unknown, "no-such-model"), (r.text, unknown.text)
        line = w.log_for(f"refused-{by}")
        assert line["status"] == 404 and line["error"] == {"source": "client", "code": "model_not_allowed",
                                                           "refused_by": by}, line
    assert w.log_for("unknown")["error"] == {"source": "client", "code": "model_not_found"}
    # The request log's record is the same line.
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 3, 10, message="the records written")
    with sqlite3.connect(db, timeout=5) as c:
        records = {rid: json.loads(rec) for rid, rec in c.execute("SELECT request_id, record FROM requests")}
    assert records["refused-key"]["error"]["refused_by"] == "key", records
    assert records["refused-tenant"]["error"]["refused_by"] == "tenant", records
    # A request without a model, refused (403) for the same lists, says whose too.
    w2 = weir(config=tenancy_config(mock(*ANY_MODEL), default_pool="gpu"), workers=1)
    for key, by in (("key-beta-b", "tenant"), ("key-acme-narrow", "key")):
        r = send(w2, key, "/v1/completions", {"prompt": "x", "max_tokens": 2}, f"nomodel-{by}")
        assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed", r.text
        assert w2.log_for(f"nomodel-{by}")["error"] == {"source": "client", "code": "model_not_allowed",
                                                        "refused_by": by}
    assert send(w2, "key-acme-a", "/v1/completions", {"prompt": "x", "max_tokens": 2}, "ok").status_code == 200
    assert w2.log_for("ok")["error"] is None


# --- 3. a reload's removed objects leave /metrics -----------------------------------------------------------------

def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def removable_config(a, b, with_b: bool) -> dict:
    cfg = {"server": {"metrics": {"key_id_label": True, "client_port": True}},
           "pools": {"a": {"endpoints": [a.base_url], "breaker": {}, "queue": {"size": 4}}},
           "models": {"m1": {"pool": "a", "upstream_model": "mock-model"}},
           "tenants": {"t1": {}},
           "auth": {"api_keys": [{"id": "k1", "sha256": sha("key-1"), "tenant": "t1"}]}}
    if with_b:
        cfg["pools"]["b"] = {"endpoints": [b.base_url], "breaker": {}, "queue": {"size": 4}}
        cfg["models"]["m2"] = {"pool": "b", "upstream_model": "mock-model"}
        cfg["tenants"]["t2"] = {}
        cfg["auth"]["api_keys"].append({"id": "k2", "sha256": sha("key-2"), "tenant": "t2"})
    return cfg


# DEFECT: the series of a model, pool or endpoint a reload removed (and of a tenant or API key) stayed in /metrics
# with their last values until restart: a dashboard summing by model or endpoint went on showing what no longer
# exists. They now leave with it; the series of what remains keep their counts (never reset), and one named
# again comes back with its count.
def test_a_reload_removes_the_series_of_what_it_removed_and_keeps_the_rest(mock, weir):
    a, b = mock(*FAST), mock(*FAST)
    w = weir(config=removable_config(a, b, True), workers=2)

    def ask(key: str, model: str) -> None:
        r = httpx.post(w.v1 + "/chat/completions", json=chat(model), timeout=10,
                       headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text

    for _ in range(3):
        ask("key-1", "m1")
        ask("key-2", "m2")
    wait_until(lambda: w.metric("weir_requests_total", route="/v1/chat/completions", model="m2", status="200",
                                tenant="t2", key_id="k2") == 3, message="the requests counted")
    removed = {("model", "m2"), ("pool", "b"), ("tenant", "t2"), ("key_id", "k2"), ("endpoint", b.base_url)}

    def series(text: str) -> dict:
        return {(n, tuple(sorted(l.items()))): v for n, l, v in parse_prometheus(text)}

    def of_removed(s: dict) -> list:
        return [k for k in s if any(label in removed for label in k[1])]

    before = series(w.metrics_text())
    assert len(of_removed(before)) > 10, "the removed objects had series"
    write(w, removable_config(a, b, False), workers=2)
    sighup(w)
    # (Each worker takes the new labels as it installs the generation: the scrape answers with its own.)
    wait_until(lambda: of_removed(series(w.metrics_text())) == [], 10, message="the removed series gone")
    after = series(w.metrics_text())
    # What remains keeps its series, never reset.
    counters = ("weir_requests_total", "weir_prompt_tokens_total", "weir_completion_tokens_total",
                "weir_upstream_attempts_total", "weir_upstream_failures_total", "weir_requests_shed_total",
                "weir_upstream_pool_unavailable_total", "weir_upstream_ejections_total",
                "weir_time_to_first_token_seconds_count", "weir_tenant_time_to_first_token_seconds_count")
    kept = [k for k in before if k[0] in counters and k not in of_removed(before)]
    assert kept
    for k in kept:
        assert k in after and after[k] >= before[k], (k, before[k], after.get(k))
    # Named again: its series come back with their counts.
    write(w, removable_config(a, b, True), workers=2)
    sighup(w)
    wait_until(lambda: w.metric("weir_requests_total", route="/v1/chat/completions", model="m2", status="200",
                                tenant="t2", key_id="k2") == 3, 10, message="m2's count back")


# --- 4. the request log's -wal replaced by a directory ------------------------------------------------------------

# DEFECT: with PATH-wal replaced by a directory while Weir ran, the admin API and `weir requests` said SQLite must
# create PATH-shm (to be read as a user who may write there: wrong advice, root could not read it either), and
# the writer's stderr line said the rows were copied and the log was "opening it again" although the new log
# could never open ("unable to open database file" alone, after). Both now name the directory, and the writer
# says the new log cannot be opened, why, and what happens to records meanwhile.
def test_a_wal_replaced_by_a_directory_is_named_by_the_reader_and_the_writer(tmp_path, mock, weir):
    db = tmp_path / "requests.db"
    w, admin = start_logged(mock, weir, db)
    for i in range(5):
        assert logged_chat(w, f"before-{i}") == 200
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 5, 10, message="the first rows")
    assert httpx.get(admin, headers=AUTH, timeout=10).status_code == 200  # the reader has the log open
    os.remove(f"{db}-wal")
    os.mkdir(f"{db}-wal")
    assert logged_chat(w, "during-0") == 200
    wait_until(lambda: w.metric("weir_request_log_open") == 0, 10, message="the writer's store closed")
    # Said after the store is marked closed and its open is tried again (on the writer's SCHED_IDLE thread):
    # waited for, not read at the gauge.
    wait_until(lambda: "write-ahead log" in w.process.log(), 10, message="the write-ahead log's line")
    said = [line for line in w.process.log().splitlines() if "write-ahead log" in line]
    assert len(said) == 1, w.process.log()
    assert f"{db}-wal was replaced by a directory (its rows were copied into the file)" in said[0], said
    assert "opening it again" not in said[0] and "cannot be opened again" in said[0], said
    assert f"{db}-wal, where SQLite keeps the file's write-ahead log, is a directory: remove it" in said[0], said
    # The readers: the admin API and the CLI name the directory, and never ask for -shm.
    r = httpx.get(admin, headers=AUTH, timeout=10)
    assert r.status_code == 503, r.text
    cli = subprocess.run([binary("weir"), "requests", "--db", str(db), "--limit", "10"], capture_output=True,
                         text=True, timeout=30)
    assert cli.returncode != 0
    for text in (r.json()["error"]["message"], cli.stderr):
        assert "-shm" not in text, text
        assert f"{db}-wal, where SQLite keeps the file's write-ahead log, is a directory: remove it" in text, text
    # Removed: the writer opens a new log, and every row is there.
    os.rmdir(f"{db}-wal")
    wait_until(lambda: w.metric("weir_request_log_open") == 1, 10, message="the store open again")
    wait_until(lambda: httpx.get(admin, headers=AUTH, timeout=10).status_code == 200, 10, message="readable")
    assert w.process.stop(15) == 0
    with sqlite3.connect(db, timeout=5) as c:
        rows = {r[0] for r in c.execute("SELECT request_id FROM requests")}
    assert rows == {f"before-{i}" for i in range(5)} | {"during-0"}, rows
