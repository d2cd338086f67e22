"""weir-mock's own TLS listener (--tls-cert/--tls-key, --tls-no-resume) and --no-keep-alive, and Weir's
https pool against it: what `bench/run tls` measures, checked for behaviour.

test_tls_upstreams.py covers Weir's TLS client against a Python relay in front of the plain mock (SNI, ALPN,
bad certificates, mutual TLS, ...); this module checks the mock's native listener with the same throwaway CA
(test_tls_upstreams.CA): HTTPS answers, the openai SDK through Weir's https pool (streamed and not), one
connection for sequential requests, Weir's resumed session on a new connection, and no resumption where the
mock refuses it.
"""

from __future__ import annotations

import json
import ssl
import subprocess

import httpx
import pytest

from conftest import binary

pytest.importorskip("cryptography")
from test_tls_upstreams import CA, Issued  # noqa: E402

MODEL = "mock-model"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tuple[CA, Issued]:
    ca = CA(tmp_path_factory.mktemp("mock-pki"), "mock")
    return ca, ca.issue("mock-server", dns=["localhost"], ips=["127.0.0.1"])


def tls_mock(mock, certs, *flags):
    ca, server = certs
    return mock("--tls-cert", server.cert, "--tls-key", server.key, *flags)


def trust(ca: CA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca.pem))


def https(m) -> str:
    return m.base_url.replace("http://", "https://")


def metric(m, ca: CA, name: str, **labels) -> float:
    from conftest import metric_value, parse_prometheus
    text = httpx.get(https(m) + "/metrics", verify=trust(ca), timeout=5).text
    return metric_value(parse_prometheus(text), name, **labels)


def https_pool(m, ca: CA) -> dict:
    return {"pools": {"mock": {"endpoints": [https(m)], "tls": {"ca_file": str(ca.pem)}}},
            "models": {MODEL: {"pool": "mock"}}}


def test_serves_https_and_refuses_plain_http(mock, certs):
    ca, _ = certs
    m = tls_mock(mock, certs)
    r = httpx.get(https(m) + "/health", verify=trust(ca), timeout=5)
    assert r.status_code == 200
    models = httpx.get(https(m) + "/v1/models", verify=trust(ca), timeout=5).json()
    assert models["data"][0]["id"] == MODEL
    with pytest.raises(httpx.HTTPError):
        httpx.get(m.base_url + "/health", timeout=3)   # plain HTTP to the TLS port
    assert metric(m, ca, "weir_mock_tls_handshakes_total", resumed="false") >= 2
    assert metric(m, ca, "weir_mock_tls_handshake_failures_total") >= 1


def test_openai_sdk_through_weirs_https_pool_streamed_and_not(mock, certs, weir):
    ca, _ = certs
    m = tls_mock(mock, certs, "--ttft-ms", 5, "--itl-ms", 1, "--max-tokens", 8)
    w = weir(config=https_pool(m, ca), workers=1)
    client = w.client()
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert r.choices[0].message.content and r.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens == 8
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    # Sequential requests on one worker: one TLS connection, kept alive (the /metrics scrape above is the test's).
    assert metric(m, ca, "weir_mock_tls_handshakes_total", resumed="false") == 2
    assert metric(m, ca, "vllm:request_success_total") == 2


def test_no_keep_alive_closes_each_connection_and_weir_resumes_the_session(mock, certs, weir):
    ca, _ = certs
    m = tls_mock(mock, certs, "--no-keep-alive")
    w = weir(config=https_pool(m, ca), workers=1)
    client = w.client()
    for i in range(3):
        r = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.http_response.status_code == 200
    # Three upstream connections (the mock said `connection: close` each time); the first a full handshake,
    # the other two resumed from the ticket Weir kept.
    assert w.metric("weir_upstream_connects_total") == 3
    assert metric(m, ca, "weir_mock_tls_handshakes_total", resumed="true") == 2
    r = httpx.get(https(m) + "/health", verify=trust(ca), timeout=5)
    assert r.headers["connection"] == "close"


def test_tls_no_resume_makes_every_handshake_a_full_one(mock, certs, weir):
    ca, _ = certs
    m = tls_mock(mock, certs, "--no-keep-alive", "--tls-no-resume")
    w = weir(config=https_pool(m, ca), workers=1)
    client = w.client()
    for _ in range(3):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert metric(m, ca, "weir_mock_tls_handshakes_total", resumed="true") == 0
    assert metric(m, ca, "weir_mock_tls_handshakes_total", resumed="false") >= 3


def test_plain_mock_says_connection_close_with_no_keep_alive(mock):
    m = mock("--no-keep-alive")
    r = httpx.get(m.base_url + "/health", timeout=5)
    assert r.status_code == 200 and r.headers["connection"] == "close"
    assert "weir_mock_tls_handshakes_total" not in m.metrics_text()


def test_tls_cert_without_key_is_a_usage_error(certs):
    _, server = certs
    p = subprocess.run([binary("weir-mock"), "--listen", "127.0.0.1:0", "--tls-cert", server.cert],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode != 0
    assert "--tls-key" in p.stderr


def test_a_key_that_does_not_match_is_refused(certs):
    ca, server = certs
    other = ca.issue("other-server", dns=["localhost"])
    p = subprocess.run([binary("weir-mock"), "--listen", "127.0.0.1:0", "--tls-cert", server.cert,
                        "--tls-key", other.key], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2
    assert "weir-mock: --tls-cert/--tls-key:" in p.stderr


def test_many_concurrent_streams_over_tls_arrive_whole(mock, certs, weir, tmp_path):
    # 16 streams in flight on one worker, records arriving back to back: Weir's TLS body reads once landed in
    # the worker's shared scratch and completed later (Asio's SSL stream defers a read OpenSSL could serve at
    # once), so another exchange overwrote them: ~1 % of streams ended in an SSE error (kind="protocol").
    ca, _ = certs
    m = tls_mock(mock, certs, "--ttft-ms", 5, "--itl-ms", 2, "--max-tokens", 64)
    w = weir(config=https_pool(m, ca), workers=1)
    out = tmp_path / "bench.json"
    subprocess.run([binary("weir-bench"), w.v1 + "/chat/completions", "--rate", "2000", "--duration", "2s",
                    "--warmup", "0.2s", "--payload", "seed000", "--max-tokens", "2", "--stream", "--model", MODEL,
                    "--json", str(out), "-q"], check=True, timeout=60, capture_output=True)
    report = json.loads(out.read_text())
    failures = w.metric("weir_upstream_failures_total")
    assert report["ok"] > 500 and report["errors_total"] == 0 and failures == 0, (
        report["ok"], report["errors"], failures, report.get("saturation_reasons"))
