"""Overload (docs/reliability.md#overload): shedding when the pool's own vLLM metrics say it is
saturated (waiting requests, KV cache), with Retry-After; the admission queue's priority order
(tenants' priorities, lowered but never raised by x-weir-priority) and its lowest-priority-first
shedding; the per-request deadline (x-weir-timeout-ms) across queueing, retries and a stream."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import threading
import time

import httpx
import openai
import pytest

from conftest import connections_to, wait_until
from httpwire import RawConn, request, sse_data

MSG = [{"role": "user", "content": "hello"}]


def promtool_accepts(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup installs Debian's prometheus package"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout, r.stderr)
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
LOAD = {"interval": "50ms", "timeout": "40ms"}


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": MSG, "max_tokens": 4, **extra}


def hold(port: int, body: dict, headers: dict | None = None) -> RawConn:
    """A stream sent and left unread: it runs (or waits) upstream until the connection closes."""
    conn = RawConn(port)
    conn.send(request("POST", "/v1/chat/completions", {**body, "stream": True}, headers))
    return conn


def test_a_saturated_pool_sheds_with_retry_after_from_its_vllm_metrics(mock, weir):
    # One sequence at a time: a second stream waits (vllm:num_requests_waiting = 1).
    seqs = mock("--max-num-seqs", "1", "--ttft-ms", "1", "--itl-ms", "50", "--max-tokens", "400")
    # A 32-token KV cache: one running stream of a long prompt fills it (vllm:kv_cache_usage_perc = 1).
    kv = mock("--prefix-cache-tokens", "32", "--ttft-ms", "1", "--itl-ms", "50", "--max-tokens", "400")
    w = weir(config={"pools": {
        "seqs": {"endpoints": [seqs.base_url], "load_metrics": LOAD, "queue": {"size": 0, "saturation": {"waiting": 1}}},
        "seqs429": {"endpoints": [seqs.base_url], "load_metrics": LOAD,
                    "queue": {"size": 0, "shed_status": 429, "retry_after": "3s", "saturation": {"waiting": 1}}},
        "kv": {"endpoints": [kv.base_url], "load_metrics": LOAD, "queue": {"size": 0}}},
        "models": {"a": {"pool": "seqs", "upstream_model": "mock-model"},
                   "b": {"pool": "seqs429", "upstream_model": "mock-model"},
                   "c": {"pool": "kv", "upstream_model": "mock-model"}}}, workers=1)
    c = httpx.Client(base_url=w.base_url, timeout=10)
    for model in "abc":
        assert c.post("/v1/chat/completions", json=chat(model)).status_code == 200
    held = [hold(seqs.process.port, chat("mock-model", max_tokens=400)) for _ in range(2)]
    long_prompt = [{"role": "user", "content": " ".join(["word"] * 40)}]
    held.append(hold(kv.process.port, {"model": "mock-model", "messages": long_prompt, "max_tokens": 400}))
    try:
        wait_until(lambda: w.metric("weir_pool_saturated", pool="seqs") == 1
                   and w.metric("weir_pool_saturated", pool="kv") == 1, message="saturated from the scrapes")
        r = c.post("/v1/chat/completions", json=chat("a"))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded" and "saturated" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json=chat("b"))
        assert r.status_code == 429 and r.headers["retry-after"] == "3"
        with pytest.raises(openai.InternalServerError) as e:
            w.client().chat.completions.create(model="c", messages=MSG)
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
        assert w.metric("weir_requests_shed_total", pool="seqs", reason="saturated") == 1
        assert w.metric("weir_requests_shed_total", pool="seqs429", reason="saturated") == 1
        assert w.metric("weir_requests_shed_total", pool="kv", reason="saturated") == 1
        assert seqs.metric("vllm:num_requests_waiting") == 1, "nothing shed reached the upstream"
        promtool_accepts(w.metrics_text())
    finally:
        for conn in held:
            conn.close()
    wait_until(lambda: w.metric("weir_pool_saturated", pool="seqs") == 0
               and w.metric("weir_pool_saturated", pool="kv") == 0, message="no longer saturated")
    for model in "abc":
        assert c.post("/v1/chat/completions", json=chat(model)).status_code == 200
    entries = w.wait_log(lambda es: len(es) >= 9)
    assert [e["status"] for e in entries] == [200, 200, 200, 503, 429, 503, 200, 200, 200]
    assert all(e["error"]["code"] == "overloaded" for e in entries[3:6])


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_the_queue_serves_higher_priorities_first_and_sheds_the_lowest(mock, weir):
    m = mock(*FAST)
    w = weir(config={
        "tenants": {"low": {"priority": 1}, "high": {"priority": 9}},
        "auth": {"api_keys": [{"id": "low", "sha256": sha("sk-low"), "tenant": "low"},
                              {"id": "high", "sha256": sha("sk-high"), "tenant": "high"}]},
        "pools": {"gpu": {"endpoints": [m.base_url],
                          "queue": {"max_concurrent": 1, "size": 2, "timeout": "20s", "saturation": False}}},
        "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    key = {"low": {"authorization": "Bearer sk-low"}, "high": {"authorization": "Bearer sk-high"}}
    # The one place is taken by a stream that waits upstream until its client leaves.
    occupant = hold(w.port, chat("mock-model"), {**key["high"], "x-mock-ttft-ms": "60000"})
    wait_until(lambda: m.metric("vllm:num_requests_running") == 1, message="the occupant runs")
    done: dict[str, tuple[int, float]] = {}

    def send(name: str, who: str, extra: dict | None = None):
        r = httpx.post(w.base_url + "/v1/chat/completions", json=chat("mock-model"),
                       headers={**key[who], **(extra or {})}, timeout=30)
        done[name] = (r.status_code, time.monotonic(), r)

    def waiting(n: int):
        wait_until(lambda: w.metric("weir_queue_waiting", pool="gpu") == n, message=f"{n} waiting")

    # A waiting client that leaves gives its place up at once.
    gone = hold(w.port, chat("mock-model"), {**key["low"], "x-request-id": "gone-1"})
    waiting(1)
    gone.close()
    waiting(0)
    assert w.log_for("gone-1")["status"] == 499
    threads = []
    for name, who, extra in (("L", "low", None), ("H", "high", {"x-request-id": "order-H"})):
        threads.append(threading.Thread(target=send, args=(name, who, extra)))
        threads[-1].start()
        waiting(len(threads))
    # Full. A low-tenant request cannot raise itself with the header: at priority 1 it is no
    # higher than the lowest waiting one, so it is the one shed.
    send("X", "low", {"x-weir-priority": "100"})
    assert done["X"][0] == 503 and done["X"][2].headers["retry-after"] == "1"
    assert done["X"][2].json()["error"]["code"] == "overloaded"
    # A high-tenant request that lowers itself to 5 still outranks L, which is shed for it.
    lowered = {"x-weir-priority": "5", "x-request-id": "order-M"}
    threads.append(threading.Thread(target=send, args=("M", "high", lowered)))
    threads[-1].start()
    wait_until(lambda: "L" in done, message="L shed")
    assert done["L"][0] == 503
    waiting(2)
    bad = httpx.post(w.base_url + "/v1/chat/completions", json=chat("mock-model"),
                     headers={**key["high"], "x-weir-priority": "urgent"})
    assert bad.status_code == 400 and "x-weir-priority" in bad.json()["error"]["message"]
    occupant.close()  # its place goes to H, then M
    for t in threads:
        t.join(30)
    assert done["H"][0] == 200 and done["M"][0] == 200
    # Served in priority order: H's request ended (its log line) before M's. Not the clients'
    # clocks: M starts as H's last bytes go out, and two client threads read their answers in
    # whatever order they are scheduled.
    w.log_for("order-M")
    ids = [e.get("request_id") for e in w.log_entries()]
    assert ids.index("order-H") < ids.index("order-M")
    assert w.metric("weir_requests_shed_total", pool="gpu", reason="queue_full") == 2
    assert w.metric("weir_queued_requests_total", pool="gpu") == 4
    assert w.metric("weir_queue_waiting", pool="gpu") == 0


def test_the_deadline_header_bounds_queueing_retries_and_streams(mock, weir):
    slow = mock("--ttft-ms", "2000", "--itl-ms", "100", "--max-tokens", "30")
    failing = mock(*FAST, "--error-rate", "1", "--error-status", "503")
    w = weir(config={"pools": {
        "slow": {"endpoints": [slow.base_url], "queue": {"max_concurrent": 1, "saturation": False}},
        "failing": {"endpoints": [failing.base_url],
                    "retry": {"attempts": 10, "backoff": "300ms", "max_backoff": "300ms", "min_concurrent": 10}}},
        "models": {"s": {"pool": "slow", "upstream_model": "mock-model"},
                   "f": {"pool": "failing", "upstream_model": "mock-model"}}}, workers=1)
    c = httpx.Client(base_url=w.base_url, timeout=10)
    deadline = {"x-weir-timeout-ms": "300"}

    def expect_deadline(r: httpx.Response):
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "deadline_exceeded" and "300 ms" in r.json()["error"]["message"]

    # (How long each took is read on Weir's clock at the end, the access log's duration_ms: a client's
    # stopwatch counts its own delays on a loaded machine.)
    # Waiting for the upstream's answer.
    expect_deadline(c.post("/v1/chat/completions", json=chat("s"), headers=deadline))
    wait_until(lambda: slow.aborts() == 1, message="the generation was cancelled upstream")
    # Retries: 10 attempts up to 300 ms apart; a retry whose backoff would end past the deadline is
    # not made, so the attempts end before it, with the last answer (no fallback is left): not a 504
    # for a deadline that has not passed.
    r = c.post("/v1/chat/completions", json=chat("f"), headers=deadline)
    assert r.status_code == 503, r.text
    assert 1 <= failing.metric("weir_mock_injected_errors_total") < 10
    # Queueing: the pool's one place is taken.
    occupant = hold(w.port, chat("s"))
    wait_until(lambda: slow.metric("vllm:num_requests_running") == 1, message="the occupant runs")
    expect_deadline(c.post("/v1/chat/completions", json=chat("s"), headers=deadline))
    assert slow.metric("vllm:num_requests_running") == 1, "the queued request never went upstream"
    occupant.close()
    wait_until(lambda: slow.metric("vllm:num_requests_running") == 0, message="the occupant left")
    # A stream past its commit point ends in-band, with the same error, and the upstream is cancelled.
    with RawConn(w.port) as conn:
        conn.send(request("POST", "/v1/chat/completions", chat("s", stream=True, max_tokens=30),
                          {"x-weir-timeout-ms": "400", "x-mock-ttft-ms": "1"}))
        resp = conn.read_response("POST")
    assert resp.status == 200
    data = sse_data(resp.decoded())
    assert data[-1] == "[DONE]" and '"deadline_exceeded"' in data[-2]
    assert any('"content"' in d for d in data[:-2]), "some tokens came before the deadline"
    wait_until(lambda: slow.aborts() == 3, message="the stream was cancelled upstream (after the occupant)")
    # A bad value is the client's mistake.
    for v in ("0", "soon", "-5", "86400001"):
        r = c.post("/v1/chat/completions", json=chat("s"), headers={"x-weir-timeout-ms": v})
        assert r.status_code == 400 and "x-weir-timeout-ms" in r.json()["error"]["message"]
    assert w.metric("weir_deadline_exceeded_total") == 3
    entries = w.wait_log(lambda es: len(es) >= 9)
    assert [e["status"] for e in entries] == [504, 503, 504, 499, 200, 400, 400, 400, 400]
    assert [entries[i]["error"]["code"] for i in (0, 2, 4)] == ["deadline_exceeded"] * 3
    # The three bounded by the 300 ms deadline ended near it, far before what they would have waited for without
    # it (a 2 s first token; ten attempts 300 ms apart; a place in the queue held by a 2 s request).
    assert all(entries[i]["duration_ms"] < 1500 for i in (0, 1, 2)), entries[:3]


def lowest_free_fd(pid: int) -> int:
    used = {int(n) for n in os.listdir(f"/proc/{pid}/fd")}
    return next(i for i in range(len(used) + 1) if i not in used)


def test_out_of_descriptors_is_the_gateways_503_and_never_held_against_the_endpoint(mock, weir):
    # Weir cannot open an upstream socket (EMFILE): a 503 of its own with Retry-After, the attempt in the
    # access log, and the endpoint neither ejected nor counted as refusing: the next request goes through.
    m = mock(*FAST)
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url], "max_idle_per_endpoint": 0}},
                     "models": {"mock-model": {"pool": "p"}}}, workers=1)
    c = httpx.Client(base_url=w.base_url, timeout=10)  # one kept-alive connection: no new descriptor to serve it
    assert c.post("/v1/chat/completions", json=chat("mock-model")).status_code == 200
    pid = w.process.pid
    # The first request's upstream connection is closed (max_idle_per_endpoint 0) after its answer went out:
    # once it is gone, the descriptors below the limit set next stay taken.
    mock_port = int(m.base_url.rsplit(":", 1)[1].split("/")[0])
    wait_until(lambda: connections_to(mock_port) == 0, message="the first upstream connection closed")
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    # Every descriptor below the limit is taken: the next socket(2) fails with EMFILE.
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free_fd(pid), hard))
    try:
        for stream in (False, True):
            r = c.post("/v1/chat/completions", json=chat("mock-model", stream=stream))
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            err = r.json()["error"]
            assert err["code"] == "gateway_overloaded" and err["type"] == "server_error", err
            assert "out of file descriptors" in err["message"] and m.base_url not in err["message"], err
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert c.post("/v1/chat/completions", json=chat("mock-model")).status_code == 200
    entries = w.wait_log(lambda es: len(es) >= 4)
    failed = [e for e in entries if e["status"] == 503]
    assert len(failed) == 2, entries
    for e in failed:
        assert e["error"] == {"source": "internal", "code": "gateway_overloaded"}, e
    assert w.metric("weir_upstream_failures_total", kind="local_resources") == 2
    assert w.metric("weir_upstream_failures_total", kind="connect_refused") == 0
