"""Endpoint health (docs/reliability.md): the circuit breaker opening, failing fast, half-open
trials and closing again; a pool whose breakers are open sending requests to its fallback at once;
a slow-TTFT endpoint ejected; the first-token timeout; /ready and /metrics merging every worker's
view. Real weir-mock upstreams with faults injected per request (x-mock-*)."""

from __future__ import annotations

import shutil
import subprocess
import threading

import httpx
import openai

from conftest import free_port, metric_value, wait_until
from httpwire import RawConn, request, sse_data

MSG = [{"role": "user", "content": "hello"}]


def promtool_accepts(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup installs Debian's prometheus package"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout, r.stderr)
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")
BODY = {"model": "mock-model", "messages": MSG, "max_tokens": 4}


def state(w, endpoint: str, s: str) -> float:
    return w.metric("weir_upstream_endpoint_state", endpoint=endpoint, state=s)


def test_a_breaker_opens_fails_fast_half_opens_one_trial_at_a_time_and_closes(mock, weir):
    m = mock(*FAST)
    # (2 s: the checks of the open state fit in it on a loaded machine.)
    w = weir(config={"pools": {"gpu": {"endpoints": [m.base_url], "eject_for": "2s",
                                       "outlier": {"consecutive_failures": 2},
                                       "breaker": {"half_open_trials": 1}}},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    c = httpx.Client(base_url=w.base_url, timeout=10)
    fault = {"x-mock-status": "500"}
    assert [c.post("/v1/chat/completions", json=BODY, headers=fault).status_code for _ in range(2)] == [500, 500]
    # Open: answered at once by Weir, the endpoint is not asked.
    r = c.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 503 and r.headers["retry-after"] in ("1", "2")  # until it turns half-open
    err = r.json()["error"]
    assert err["code"] == "upstream_unavailable" and "circuit breaker" in err["message"]
    ready = c.get("/ready")
    ms = w.metrics()
    assert ready.status_code == 503 and "`gpu`" in ready.json()["error"]["message"]
    assert metric_value(ms, "weir_upstream_endpoint_state", endpoint=m.base_url, state="open") == 1
    assert metric_value(ms, "weir_upstream_ejections_total", cause="failures") == 1
    assert metric_value(ms, "weir_upstream_pool_unavailable_total", pool="gpu") == 1
    assert metric_value(ms, "weir_upstream_available_endpoints", pool="gpu") == 0
    assert m.metric("weir_mock_injected_errors_total") == 2 and m.metric("vllm:request_success_total") == 0

    # Half-open after eject_for: one trial at a time (a stream is judged at its first token), and its
    # success closes it. (A failed trial opening it again, for longer: tests/unit/routing/health_test.cpp.)
    wait_until(lambda: state(w, m.base_url, "half_open") == 1, timeout=10, interval=0.02, message="half-open")
    assert c.get("/ready").status_code == 200
    promtool_accepts(w.metrics_text())
    trial: dict = {}

    def run_trial():
        with c.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True},
                      headers={"x-mock-ttft-ms": "1500"}) as s:
            trial["status"] = s.status_code
            trial["body"] = s.read().decode()

    t = threading.Thread(target=run_trial)
    t.start()
    # Its head is in (no fallback: it goes out at once); its first token is 1.5 s away.
    wait_until(lambda: "status" in trial, timeout=10, message="the trial's head")
    assert "body" not in trial
    second = c.post("/v1/chat/completions", json=BODY)
    assert second.status_code == 503, "the one trial slot is taken"
    t.join(10)
    assert trial["status"] == 200 and "[DONE]" in trial["body"]
    assert state(w, m.base_url, "closed") == 1
    assert w.metric("weir_upstream_recoveries_total", endpoint=m.base_url) == 1
    assert c.post("/v1/chat/completions", json=BODY).status_code == 200
    entries = w.wait_log(lambda es: len(es) >= 8)
    breaker = [e for e in entries if e["status"] == 503 and e["path"] == "/v1/chat/completions"]
    assert len(breaker) == 2
    for e in breaker:
        assert e["error"]["code"] == "upstream_unavailable" and e["endpoint"] is None and e["retries"] == 0


def test_an_open_pool_sends_its_requests_to_the_fallback_at_once(mock, weir):
    primary = mock(*FAST, "--error-rate", "1", "--error-status", "503")
    backup = mock(*FAST, "--model", "small-model")
    w = weir(config={"pools": {"gpu": {"endpoints": [primary.base_url], "eject_for": "60s",
                                       "outlier": {"consecutive_failures": 1}, "breaker": {}},
                               "backup": {"endpoints": [backup.base_url]}},
                     "models": {"big": {"pool": "gpu", "upstream_model": "mock-model",
                                        "fallbacks": [{"pool": "backup", "upstream_model": "small-model"}]}}},
             workers=1)
    c = w.client()
    for _ in range(3):
        assert c.chat.completions.create(model="big", messages=MSG).model == "small-model"
    assert primary.metric("weir_mock_injected_errors_total") == 1, "asked once, then skipped"
    entries = w.wait_log(lambda es: len(es) >= 3)
    assert [(a["pool"], a["status"]) for a in entries[0]["attempts"]] == [("gpu", 503), ("backup", 200)]
    for e in entries[1:]:
        assert [(a["pool"], a["failure"]) for a in e["attempts"]] == [("gpu", "breaker_open"), ("backup", None)]
    assert w.metric("weir_upstream_fallbacks_total") == 3


def test_an_endpoint_whose_ttft_is_far_above_the_pools_is_ejected(mock, weir):
    fast = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "3")
    slow = mock("--ttft-ms", "100", "--itl-ms", "1", "--max-tokens", "3")
    w = weir(config={"pools": {"gpu": {"endpoints": [fast.base_url, slow.base_url], "eject_for": "60s",
                                       "outlier": {"ttft_factor": 4, "ttft_min_samples": 3}}},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    c = w.client()

    def stream():
        return "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(model="mock-model", messages=MSG, stream=True) if ch.choices)

    for _ in range(60):
        assert stream()
        if w.metric("weir_upstream_ejections_total", cause="ttft") >= 1:
            break
    assert w.metric("weir_upstream_ejections_total", endpoint=slow.base_url, cause="ttft") == 1
    assert w.metric("weir_upstream_ejections_total", endpoint=fast.base_url, cause="ttft") == 0
    before = slow.metric("vllm:request_success_total")
    for _ in range(10):
        assert stream()
    assert slow.metric("vllm:request_success_total") == before, "the slow endpoint gets nothing while ejected"
    assert state(w, slow.base_url, "open") == 1


def test_a_stall_before_the_first_token_is_caught_by_the_first_token_timeout(mock, weir):
    stalled = mock("--ttft-ms", "5000", "--itl-ms", "1", "--max-tokens", "6")
    backup = mock(*FAST, "--model", "small-model")
    w = weir(config={"pools": {"gpu": {"endpoints": [stalled.base_url],
                                       "timeouts": {"first_token": "300ms", "idle": "60s"}},
                               "backup": {"endpoints": [backup.base_url]}},
                     "models": {"big": {"pool": "gpu", "upstream_model": "mock-model",
                                        "fallbacks": [{"pool": "backup", "upstream_model": "small-model"}]},
                                "alone": {"pool": "gpu", "upstream_model": "mock-model"}}}, workers=1)
    # With a fallback the head is held: the stream fails over with nothing sent twice.
    chunks = list(w.client().chat.completions.create(model="big", messages=MSG, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[0].model == "small-model"
    # Without one the head went out at once: the timeout ends the stream in-band.
    with RawConn(w.port) as conn:
        conn.send(request("POST", "/v1/chat/completions", {"model": "alone", "messages": MSG, "stream": True}))
        resp = conn.read_response("POST")
    assert resp.status == 200
    data = sse_data(resp.decoded())
    assert data[-1] == "[DONE]" and '"upstream_timeout"' in data[-2]
    entries = w.wait_log(lambda es: len(es) >= 2)
    assert entries[0]["attempts"][0]["failure"] == "timeout" and entries[0]["status"] == 200
    assert entries[1]["error"]["code"] == "upstream_timeout"
    assert w.metric("weir_upstream_first_token_timeouts_total") == 2
    wait_until(lambda: stalled.aborts() == 2, message="both stalled generations were cancelled upstream")


def test_ready_turns_503_while_a_pool_has_no_endpoint_available(weir):
    dead = f"http://127.0.0.1:{free_port()}"
    for ready_pools, want in (("all", 503), ("off", 200)):
        admin = f"http://127.0.0.1:{free_port()}"
        w = weir(config={"server": {"ready_pools": ready_pools},
                         "admin": {"listen": admin.removeprefix("http://"), "token_env": "WEIR_TEST_ADMIN_TOKEN"},
                         "pools": {"gpu": {"endpoints": [dead], "eject_for": "60s", "breaker": {}}},
                         "models": {"mock-model": {"pool": "gpu"}}}, workers=2,
                 env={"WEIR_TEST_ADMIN_TOKEN": "t" * 32})
        assert httpx.get(w.base_url + "/ready").status_code == 200
        wait_until(lambda: _status(admin + "/ready") == 200, message="the admin listener")

        # Each worker that tries it finds it refusing; its first refusal opens the breaker there
        # (new connections: the kernel spreads them over both workers).
        def open_on_both():
            assert httpx.post(w.base_url + "/v1/chat/completions", json=BODY).status_code in (502, 503)
            return w.metric("weir_upstream_endpoint_state", state="open") == 2

        wait_until(open_on_both, message="open on both workers")
        for url in (w.base_url + "/ready", admin + "/ready"):  # the client port and the admin port
            r = httpx.get(url)
            assert r.status_code == want, (url, r.text)
            if want == 503:
                assert r.json()["error"]["message"] == "No endpoint of pool `gpu` is available (all ejected)."
                assert r.json()["error"]["code"] == "service_unavailable" and r.headers["retry-after"] == "1"
        try:
            w.client().chat.completions.create(model="mock-model", messages=MSG)
            raise AssertionError("expected a 503")
        except openai.InternalServerError as e:
            assert e.status_code == 503 and e.response.headers["retry-after"]


def _status(url: str) -> int:
    try:
        return httpx.get(url).status_code
    except httpx.TransportError:
        return 0
