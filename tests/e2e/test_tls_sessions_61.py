"""Stop 61 (tlsobs61): a kept TLS session is offered only while the certificate it was verified with is valid.

A resumed connection skips certificate verification, and TLS 1.3 gives every resumed connection a fresh ticket:
kept as they came, one full handshake vouched for the server forever, past its certificate's expiry (RFC 8446
§4.6.1 bounds that; Go's client drops a session whose certificate has expired)."""
from __future__ import annotations

import datetime
import time

import httpx
import pytest

pytest.importorskip("cryptography")
from test_mock_tls import https, metric, trust  # noqa: E402
from test_tls_upstreams import CA  # noqa: E402

MODEL = "mock-model"
LIFETIME_S = 4


def test_a_session_of_a_certificate_that_has_expired_is_not_resumed(mock, weir, tmp_path):
    ca = CA(tmp_path, "expiring")
    server = ca.issue("short-lived", dns=["localhost"], ips=["127.0.0.1"],
                      lifetime=datetime.timedelta(seconds=LIFETIME_S))
    expires_at = time.time() + LIFETIME_S
    m = mock("--tls-cert", server.cert, "--tls-key", server.key, "--no-keep-alive")
    w = weir(config={"pools": {"p": {"endpoints": [https(m)], "tls": {"ca_file": str(ca.pem)}}},
                     "models": {MODEL: {"pool": "p"}}}, workers=1)

    def chat() -> httpx.Response:
        return httpx.post(f"{w.base_url}/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})

    # While the certificate is valid: a full handshake, then a resumed one (a new connection each time).
    assert chat().status_code == 200
    assert chat().status_code == 200
    if time.time() >= expires_at:
        pytest.skip("the machine took longer than the certificate's lifetime for two requests")
    assert metric_after(m, ca, expires_at, resumed="true") == 1
    # Expired: the kept session is not offered; the full handshake verifies the certificate and fails.
    while time.time() < expires_at + 1:
        time.sleep(0.2)
    r = chat()
    assert r.status_code == 502, r.text
    assert "certificate has expired" in w.process.log()


def metric_after(m, ca: CA, expires_at: float, **labels) -> float:
    """The mock's handshake count, scraped while its certificate still verifies (skip if it no longer does)."""
    try:
        return metric(m, ca, "weir_mock_tls_handshakes_total", **labels)
    except httpx.HTTPError:
        if time.time() >= expires_at:
            pytest.skip("the certificate expired before the mock's metrics were read")
        raise


def test_a_collector_200_with_a_body_too_large_to_read_is_an_export_not_a_retry(mock, weir):
    # A 2xx is the collector's acceptance whatever its body (OTLP/HTTP retries only 429, 502, 503, 504 and
    # failed connections): a body past the exporter's 64 KiB read limit made it a "failed" export, sent twice
    # more and counted as dropped, duplicating the spans at the backend.
    from otlp import Collector
    from test_tracing import MOCK_FLAGS, base_config
    c = Collector()
    try:
        c.ok_body = b'{"partialSuccess":{},"padding":"' + b"x" * 100_000 + b'"}'
        m = mock(*MOCK_FLAGS)
        w = weir(config=base_config(m, c.url))
        r = w.client(api_key="sk-acme-0123456789").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.choices[0].message.content
        from conftest import wait_until
        wait_until(lambda: w.metric("weir_tracing_spans_exported_total") > 0, 10, message="the export")
        assert w.metric("weir_tracing_export_errors_total") == 0
        assert w.metric("weir_tracing_spans_dropped_total", reason="export_failed") == 0
        with c.lock:
            assert len(c.requests) == 1, [len(r["body"]) for r in c.requests]
    finally:
        c.close()
