"""Items session 52 left: the exact wait of Weir's own 503s (a pool whose every endpoint is ejected, a shed
request) in retry-after-ms; the access log naming which allow-list (the tenant's or the API key's) refused a
model; ..."""

from __future__ import annotations

import json
import math
import sqlite3

import httpx

from conftest import free_port, wait_until
from httpwire import RawConn, request
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

