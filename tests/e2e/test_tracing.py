"""OpenTelemetry traces end to end: real weir and weir-mock, the official openai SDK as the client, and an
OTLP/HTTP receiver in the test. W3C traceparent/tracestate continued or ignored, a new span id per upstream
attempt, the request's child spans with their semantic-convention attributes, parent-based sampling, and a
collector that is down or answers 503."""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess

import httpx
import pytest

from conftest import binary, connections_to, free_port, wait_until
from otlp import Collector, attrs, parse_traceparent

MOCK_FLAGS = ("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "8", "--model", "m-up")
SERVER, CLIENT, INTERNAL = 2, 3, 1


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def base_config(mock, collector_url: str, **tracing) -> dict:
    return {
        "pools": {
            "p": {"endpoints": [mock.base_url]},
            "dead": {"endpoints": [f"http://127.0.0.1:{free_port()}"]},
            "b": {"endpoints": [mock.base_url], "batch": {"window": "5ms", "max_size": 8}},
        },
        "models": {
            "m": {"pool": "p", "upstream_model": "m-up", "default_max_tokens": 8},
            "m-fallback": {"pool": "dead", "upstream_model": "m-up", "default_max_tokens": 8,
                           "fallbacks": [{"pool": "p", "upstream_model": "m-up"}]},
            "m-batch": {"pool": "b", "upstream_model": "m-up", "default_max_tokens": 8},
        },
        "tenants": {"acme": {}, "tiny": {"limits": {"requests_per_minute": 1}}},
        "auth": {"api_keys": [
            {"id": "acme-1", "sha256": sha("sk-acme-0123456789"), "tenant": "acme"},
            {"id": "tiny-1", "sha256": sha("sk-tiny-0123456789"), "tenant": "tiny"},
        ]},
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "tracing": {"otlp_endpoint": collector_url, "flush_interval": "10ms", "service_name": "weir-e2e",
                    **tracing},
    }


def new_ids() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def traced(module_mock, module_weir, collector):
    """weir with tracing (sample_ratio 1) and the mock behind it, shared by the module's tests."""
    m = module_mock(*MOCK_FLAGS)
    return module_weir(config=base_config(m, collector.url, resource={"deployment.environment": "e2e"}))


def by_name(spans: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in spans:
        out.setdefault(s["name"], []).append(s)
    return out


def test_a_valid_parent_continues_its_trace_with_a_new_span_upstream(traced, collector):
    trace_id, parent = new_ids()
    client = traced.client(api_key="sk-acme-0123456789")
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
        extra_headers={"traceparent": f"00-{trace_id}-{parent}-01", "tracestate": "congo=t61rcWkgMzE,rojo=00f067",
                       "x-mock-echo": "1", "x-request-id": "trace-stream-1"})
    chunks = list(raw.parse())
    assert chunks and chunks[-1].usage.completion_tokens == 8
    # The upstream saw the same trace, Weir's attempt span as its parent, the caller's tracestate.
    up_trace, up_span, up_flags = parse_traceparent(raw.headers["x-mock-traceparent"])
    assert up_trace == trace_id and up_span != parent and up_flags == "01"
    assert raw.headers["x-mock-tracestate"] == "congo=t61rcWkgMzE,rojo=00f067"

    spans = collector.wait_trace(trace_id, n=5)
    names = by_name(spans)
    root = names["POST /v1/chat/completions"][0]
    assert root["kind"] == SERVER and root["parentSpanId"] == parent
    assert root["traceState"] == "congo=t61rcWkgMzE,rojo=00f067"
    a = attrs(root)
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/chat/completions"
    assert a["http.response.status_code"] == 200 and a["url.path"] == "/v1/chat/completions"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "m"
    assert a["gen_ai.usage.output_tokens"] == 8 and a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert a["weir.request_id"] == "trace-stream-1" and a["weir.tenant"] == "acme" and a["weir.key_id"] == "acme-1"
    assert a["weir.stream"] is True and a["user_agent.original"].startswith("OpenAI/Python")
    assert root["_resource"]["service.name"] == "weir-e2e"
    assert root["_resource"]["deployment.environment"] == "e2e"
    assert root.get("status", {}).get("code", 0) == 0
    # One child per step, each under the request span and inside it in time.
    assert set(names) >= {"authenticate", "admit", "POST", "stream"}
    start, end = int(root["startTimeUnixNano"]), int(root["endTimeUnixNano"])
    for s in spans:
        if s is root:
            continue
        assert s["parentSpanId"] == root["spanId"] and s["traceId"] == trace_id
        assert start <= int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"]) <= end, s["name"]
    (attempt,) = names["POST"]
    assert attempt["kind"] == CLIENT and attempt["spanId"] == up_span  # the id the upstream was sent
    aa = attrs(attempt)
    assert aa["http.response.status_code"] == 200 and aa["server.address"] == "127.0.0.1"
    assert aa["weir.pool"] == "p" and aa["url.full"].startswith("http://127.0.0.1:")
    (stream,) = names["stream"]
    sa = attrs(stream)
    assert stream["kind"] == INTERNAL and sa["gen_ai.usage.output_tokens"] == 8 and sa["weir.sse_events"] >= 8
    assert sa["gen_ai.request.model"] == "m"
    # TTFT on the span is the access log's.
    line = traced.log_for("trace-stream-1")
    assert abs(sa["gen_ai.response.time_to_first_chunk"] * 1000 - line["ttft_ms"]) < 0.01


@pytest.mark.parametrize("bad", [
    "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",   # upper case
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",   # zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",   # zero span id
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   # version ff
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",      # short
    "not a traceparent at all",
])
def test_an_invalid_traceparent_is_ignored_never_an_error(traced, collector, bad):
    r = httpx.post(traced.v1 + "/chat/completions", timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"authorization": "Bearer sk-acme-0123456789", "traceparent": bad,
                            "tracestate": "congo=t61rcWkgMzE", "x-mock-echo": "1"})
    assert r.status_code == 200, r.text
    trace_id, span_id, flags = parse_traceparent(r.headers["x-mock-traceparent"])
    assert trace_id.lower() not in bad.lower() and flags == "01"  # a new trace, sampled at ratio 1
    assert "x-mock-tracestate" not in r.headers  # a tracestate without a valid parent goes nowhere
    spans = collector.wait_trace(trace_id)
    root = next(s for s in spans if s["kind"] == SERVER)
    assert "parentSpanId" not in root and "traceState" not in root


def test_two_traceparent_lines_start_a_new_trace(traced, collector):
    t1, p1 = new_ids()
    t2, p2 = new_ids()
    # Raw lines: httpx would join a header given twice.
    import socket
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nauthorization: Bearer sk-acme-0123456789\r\n"
           f"content-type: application/json\r\nx-mock-echo: 1\r\nconnection: close\r\n"
           f"traceparent: 00-{t1}-{p1}-01\r\ntraceparent: 00-{t2}-{p2}-01\r\n"
           f"content-length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", traced.port), timeout=10) as s:
        s.sendall(req)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode()
    assert head.startswith("HTTP/1.1 200")
    up = next(line.split(": ", 1)[1] for line in head.split("\r\n") if line.lower().startswith("x-mock-traceparent:"))
    assert parse_traceparent(up)[0] not in (t1, t2)


def test_every_upstream_attempt_is_a_client_span_with_its_own_id(traced, collector):
    trace_id, parent = new_ids()
    r = httpx.post(traced.v1 + "/chat/completions", timeout=30,
                   json={"model": "m-fallback", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"authorization": "Bearer sk-acme-0123456789", "x-mock-echo": "1",
                            "traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200, r.text
    _, up_span, _ = parse_traceparent(r.headers["x-mock-traceparent"])
    spans = collector.wait_trace(trace_id)
    attempts = sorted((s for s in spans if s["kind"] == CLIENT), key=lambda s: int(s["startTimeUnixNano"]))
    assert len(attempts) >= 2
    first, last = attrs(attempts[0]), attrs(attempts[-1])
    assert first["error.type"] == "connect_refused" and first["weir.pool"] == "dead"
    assert attempts[0]["status"]["code"] == 2
    assert last["http.response.status_code"] == 200 and last["weir.pool"] == "p"
    assert last["http.request.resend_count"] == len(attempts) - 1
    assert attempts[-1]["spanId"] == up_span
    assert len({s["spanId"] for s in attempts}) == len(attempts)
    root = next(s for s in spans if s["kind"] == SERVER)
    assert attrs(root)["weir.retries"] >= 1


def test_refusals_mark_their_step(traced, collector):
    # A wrong key: the authenticate span is the error; a 4xx leaves the server span's status unset.
    trace_id, parent = new_ids()
    r = httpx.post(traced.v1 + "/chat/completions", json={"model": "m", "messages": []}, timeout=30,
                   headers={"authorization": "Bearer sk-wrong-0123456789", "traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 401
    spans = collector.wait_trace(trace_id)
    names = by_name(spans)
    root = names["POST /v1/chat/completions"][0]
    assert attrs(root)["http.response.status_code"] == 401 and root.get("status", {}).get("code", 0) == 0
    assert attrs(root)["weir.error.code"] == "invalid_api_key"
    assert names["authenticate"][0]["status"]["code"] == 2
    assert "admit" not in names and "POST" not in names
    # Over the limit: the admit span is the error.
    ids = []
    for _ in range(2):
        trace_id, parent = new_ids()
        ids.append(trace_id)
        httpx.post(traced.v1 + "/chat/completions", timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"authorization": "Bearer sk-tiny-0123456789",
                            "traceparent": f"00-{trace_id}-{parent}-01"})
    names = by_name(collector.wait_trace(ids[1]))
    assert attrs(names["POST /v1/chat/completions"][0])["http.response.status_code"] == 429
    admit = names["admit"][0]
    assert admit["status"]["code"] == 2 and attrs(admit)["weir.error.code"] == "rate_limit_exceeded"


def test_a_batch_member_waits_in_a_batch_wait_span(traced, collector):
    trace_id, parent = new_ids()
    r = httpx.post(traced.v1 + "/completions", timeout=30,
                   json={"model": "m-batch", "prompt": "hello", "max_tokens": 4},
                   headers={"authorization": "Bearer sk-acme-0123456789", "x-mock-echo": "1",
                            "traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200, r.text
    up_trace, up_span, _ = parse_traceparent(r.headers["x-mock-traceparent"])
    assert up_trace == trace_id
    names = by_name(collector.wait_trace(trace_id))
    (wait,) = names["batch wait"]
    assert attrs(wait)["weir.batch.id"]
    (attempt,) = names["POST"]
    assert attempt["spanId"] == up_span
    assert int(wait["endTimeUnixNano"]) <= int(attempt["startTimeUnixNano"]) + 1000
    root = names["POST /v1/completions"][0]
    assert attrs(root)["gen_ai.operation.name"] == "text_completion"


def test_sampling_is_parent_based_and_unsampled_requests_still_propagate(module_mock, weir, collector):
    m = module_mock(*MOCK_FLAGS)
    w = weir(config=base_config(m, collector.url, sample_ratio=0))
    headers = {"authorization": "Bearer sk-acme-0123456789", "x-mock-echo": "1"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    # No parent, ratio 0: not recorded, but the upstream still gets a traceparent (flags 00).
    r = httpx.post(w.v1 + "/chat/completions", json=body, headers=headers, timeout=30)
    root_trace, _, flags = parse_traceparent(r.headers["x-mock-traceparent"])
    assert flags == "00"
    # An unsampled parent: its trace continues upstream, unsampled.
    t_off, p_off = new_ids()
    r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=30,
                   headers={**headers, "traceparent": f"00-{t_off}-{p_off}-00"})
    assert parse_traceparent(r.headers["x-mock-traceparent"])[::2] == (t_off, "00")
    # A sampled parent wins over the ratio (parent-based).
    t_on, p_on = new_ids()
    r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=30,
                   headers={**headers, "traceparent": f"00-{t_on}-{p_on}-01"})
    assert parse_traceparent(r.headers["x-mock-traceparent"])[::2] == (t_on, "01")
    collector.wait_trace(t_on)
    assert w.process.stop() == 0  # the drain exports anything still queued
    assert collector.trace(root_trace) == [] and collector.trace(t_off) == []
    # parent_based: false: the ratio decides for every request; the caller's trace still continues upstream.
    w = weir(config=base_config(m, collector.url, sample_ratio=0, parent_based=False))
    t_forced, p_forced = new_ids()
    r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=30,
                   headers={**headers, "traceparent": f"00-{t_forced}-{p_forced}-01"})
    assert parse_traceparent(r.headers["x-mock-traceparent"])[::2] == (t_forced, "00")
    assert w.process.stop() == 0
    assert collector.trace(t_forced) == []


def test_a_collector_that_is_down_never_slows_requests(module_mock, weir):
    m = module_mock(*MOCK_FLAGS)
    w = weir(config=base_config(m, f"http://127.0.0.1:{free_port()}", queue=16, timeout="200ms"))
    client = w.client(api_key="sk-acme-0123456789")
    for _ in range(40):
        assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices
    wait_until(lambda: w.metric("weir_tracing_export_errors_total") >= 1, 10, message="export errors counted")
    wait_until(lambda: w.metric("weir_tracing_spans_dropped_total", reason="export_failed")
               + w.metric("weir_tracing_spans_dropped_total", reason="queue_full") > 0, 10, message="drops counted")
    assert w.metric("weir_tracing_spans_exported_total") == 0
    wait_until(lambda: "weir: tracing:" in w.process.log(), 5, message="the failure said on stderr at once")
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup installs Debian's prometheus package"
    r = subprocess.run([promtool, "check", "metrics"], input=w.metrics_text(), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_sigterm_exits_within_the_drain_when_the_collector_never_answers(module_mock, weir):
    # A collector that accepts and never answers, tracing.timeout 30 s: the exporter's step retried it three
    # times (90 s) before the drain's 5 s began, so SIGTERM took minutes (a pod's grace period is 30 s).
    import signal
    import socket
    import time
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        m = module_mock(*MOCK_FLAGS)
        w = weir(config=base_config(m, f"http://127.0.0.1:{silent.getsockname()[1]}", timeout="30s"))
        client = w.client(api_key="sk-acme-0123456789")
        for _ in range(20):
            assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices
        wait_until(lambda: connections_to(silent.getsockname()[1]) >= 1, 10,
                   message="the exporter's first POST under way, unanswered")
        started = time.monotonic()
        w.process.popen.send_signal(signal.SIGTERM)
        assert w.process.popen.wait(20) == 0
        assert time.monotonic() - started < 10, "SIGTERM waited on the silent collector"
    finally:
        silent.close()


def test_a_503_from_the_collector_is_retried_and_sigterm_drains(module_mock, weir, collector):
    m = module_mock(*MOCK_FLAGS)
    # A long flush interval: the spans are still queued when SIGTERM comes; the first POST gets 503.
    w = weir(config=base_config(m, collector.url, flush_interval="30s"))
    with collector.lock:
        collector.script = [503]
    trace_id, parent = new_ids()
    r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"authorization": "Bearer sk-acme-0123456789", "traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200
    assert w.process.stop() == 0
    assert collector.wait_trace(trace_id, timeout=1)


def test_tracing_off_passes_the_callers_trace_context_through(module_mock, weir):
    m = module_mock(*MOCK_FLAGS)
    w = weir(upstream=m)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                   json={"model": "m-up", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"traceparent": tp, "tracestate": "congo=1", "x-mock-echo": "1"})
    assert r.status_code == 200
    assert r.headers["x-mock-traceparent"] == tp and r.headers["x-mock-tracestate"] == "congo=1"
    assert "weir_tracing" not in w.metrics_text()


@pytest.mark.parametrize("tracing, message", [
    ({"sample_ratio": 2}, "tracing.sample_ratio"),
    ({"otlp_endpoint": "grpc://c:4317"}, "tracing.otlp_endpoint"),
    ({"headers_env": {"x-key": "WEIR_TEST_UNSET_VAR"}}, 'environment variable "WEIR_TEST_UNSET_VAR" is not set'),
    ({"otlp_endpoint": None}, "tracing.otlp_endpoint: missing"),
])
def test_bad_tracing_configuration_is_refused_at_load(tmp_path, tracing, message):
    t = {"otlp_endpoint": "http://127.0.0.1:4318", **tracing}
    t = {k: v for k, v in t.items() if v is not None}
    import json
    cfg = tmp_path / "weir.yaml"
    cfg.write_text(json.dumps({"pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}}, "default_pool": "p",
                               "tracing": t}))
    r = subprocess.run([binary("weir"), "--config", str(cfg), "--check"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2, r
    assert message in r.stderr
