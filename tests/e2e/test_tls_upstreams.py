"""TLS upstreams (issue 12, part 4) and hosted-provider credentials (issue 13, part 3).

weir-mock speaks plain HTTP; each test puts a TLS-terminating relay in front
of it (Python's ssl over asyncio, in a thread of the test process) with
certificates made here by a throwaway CA (the ``cryptography`` package). The
relay counts the TLS connections it accepted, records the SNI name and ALPN
protocol of each, and keeps every byte Weir sent, so a test can read the
upstream request heads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import pathlib
import ssl
import subprocess
import threading

import httpx
import pytest

from conftest import binary, connections_to, wait_until

crypto = pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

MODEL = "mock-model"


# ---------------------------------------------------------------------------
# Certificates


@dataclasses.dataclass
class Issued:
    cert: pathlib.Path
    key: pathlib.Path


class CA:
    """A self-signed CA in `directory` that issues leaf certificates."""

    def __init__(self, directory: pathlib.Path, name: str):
        self.dir = directory
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Weir test CA {name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = directory / f"ca-{name}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, dns: list[str] = (), ips: list[str] = (), *, expired: bool = False,
              client: bool = False, lifetime: datetime.timedelta | None = None) -> Issued:
        """`lifetime`: valid from a day ago until that long from now (default 30 days)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        if expired:
            before, after = now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)
        elif lifetime is not None:
            before, after = now - datetime.timedelta(days=1), now + lifetime
        else:
            before, after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(before)
            .not_valid_after(after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        out = Issued(self.dir / f"{name}.pem", self.dir / f"{name}.key")
        out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        return out


@dataclasses.dataclass
class Pki:
    ca: CA          # the CA the pools trust
    other_ca: CA    # one they do not
    server: Issued  # 127.0.0.1 and weir-test.internal, by `ca`
    wrong_name: Issued
    expired: Issued
    untrusted: Issued  # 127.0.0.1, by `other_ca`
    client: Issued     # a client certificate by `ca` (mutual TLS)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = CA(d, "trusted"), CA(d, "other")
    return Pki(
        ca=ca,
        other_ca=other,
        server=ca.issue("server", dns=["weir-test.internal"], ips=["127.0.0.1"]),
        wrong_name=ca.issue("wrong-name", dns=["other.example"]),
        expired=ca.issue("expired", dns=["weir-test.internal"], ips=["127.0.0.1"], expired=True),
        untrusted=other.issue("untrusted", dns=["weir-test.internal"], ips=["127.0.0.1"]),
        client=ca.issue("weir-client", dns=["weir-client"], client=True),
    )


# ---------------------------------------------------------------------------
# The relay


class TlsRelay:
    """TLS on 127.0.0.1:port in front of a plain HTTP server at 127.0.0.1:upstream_port."""

    def __init__(self, server: Issued, upstream_port: int, client_ca: pathlib.Path | None = None):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(server.cert, server.key)
        self.ctx.set_alpn_protocols(["http/1.1"])
        if client_ca is not None:
            self.ctx.verify_mode = ssl.CERT_REQUIRED
            self.ctx.load_verify_locations(client_ca)
        self.sni: list[str | None] = []
        self.ctx.sni_callback = lambda sock, name, ctx: self.sni.append(name)
        self.upstream_port = upstream_port
        self.connections = 0         # TLS handshakes completed
        self.alpn: list[str | None] = []
        self.resumed: list[bool] = []  # per connection: the client resumed a session (a ticket)
        self.received = bytearray()  # every byte the clients sent, in order
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(5)
        self.url = f"https://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ctx, ssl_handshake_timeout=5))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_obj = writer.get_extra_info("ssl_object")
        with self.lock:
            self.connections += 1
            self.alpn.append(ssl_obj.selected_alpn_protocol() if ssl_obj else None)
            self.resumed.append(bool(ssl_obj and ssl_obj.session_reused))
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return

        async def pipe(src, dst, record: bool):
            try:
                while data := await src.read(65536):
                    if record:
                        with self.lock:
                            self.received += data
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                try:
                    dst.close()
                except Exception:  # noqa: BLE001 - closing an already broken transport
                    pass

        await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False))

    def text(self) -> str:
        with self.lock:
            return self.received.decode("latin-1")

    def close(self) -> None:
        def stop():
            self.server.close()
            self.loop.stop()
        self.loop.call_soon_threadsafe(stop)
        self.thread.join(5)


@pytest.fixture
def relay():
    made: list[TlsRelay] = []

    def make(server: Issued, upstream, client_ca: pathlib.Path | None = None) -> TlsRelay:
        r = TlsRelay(server, upstream.process.port, client_ca)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def https_config(url: str, tls: dict | None = None, **pool) -> dict:
    p = {"endpoints": [url], **pool}
    if tls is not None:
        p["tls"] = tls
    return {"pools": {"hosted": p}, "models": {MODEL: {"pool": "hosted"}}}


def chat(w, headers: dict | None = None, **kw) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}
    return httpx.post(w.v1 + "/chat/completions", json=body, headers=headers, timeout=20)


def weir_stderr(w) -> str:
    return w.process.log()


# ---------------------------------------------------------------------------
# Tests


def test_https_pool_with_ca_file_streams_and_answers(pki, mock, relay, weir):
    r = relay(pki.server, mock())
    w = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem)}), workers=1)
    client = w.client()
    done = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert done.choices[0].message.content
    text = ""
    for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=5, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text
    assert r.connections >= 1
    assert set(r.alpn) == {"http/1.1"}  # ALPN offered and agreed
    assert set(r.sni) == {None}         # an IP-literal endpoint sends no SNI (RFC 6066 §3), verified by IP SAN
    assert "POST /v1/chat/completions HTTP/1.1" in r.text()


def test_server_name_sets_sni_and_the_verified_name(pki, mock, relay, weir):
    r = relay(pki.server, mock())
    w = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem), "server_name": "weir-test.internal"}))
    assert chat(w).status_code == 200
    assert r.sni and set(r.sni) == {"weir-test.internal"}


def test_sequential_requests_reuse_one_tls_connection(pki, mock, relay, weir):
    r = relay(pki.server, mock())
    w = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem)}), workers=1)
    for i in range(6):
        assert chat(w, stream=i % 2 == 1).status_code == 200
    assert r.connections == 1
    assert w.metric("weir_upstream_connects_total") == 1


@pytest.mark.parametrize("case,reason", [
    ("unknown_ca", "certificate verification failed: unable to get local issuer certificate"),
    ("wrong_name", "certificate verification failed: IP address mismatch"),
    ("expired", "certificate verification failed: certificate has expired"),
])
def test_bad_certificate_is_a_502_naming_the_pool(pki, mock, relay, weir, case, reason):
    cert = {"unknown_ca": pki.untrusted, "wrong_name": pki.wrong_name, "expired": pki.expired}[case]
    r = relay(cert, mock())
    w = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem)}))
    resp = chat(w)
    assert resp.status_code == 502, resp.text
    body = resp.json()
    assert "hosted" in body["error"]["message"] and "TLS" in body["error"]["message"]
    assert str(r.port) not in resp.text and "127.0.0.1" not in resp.text  # never the internal URL
    wait_until(lambda: reason in weir_stderr(w), 5, message=f"'{reason}' in weir's log")
    assert w.metric("weir_upstream_failures_total", pool="hosted", kind="tls") >= 1


def test_plain_http_to_a_tls_endpoint_is_a_tls_failure(mock, weir):
    m = mock()
    w = weir(config=https_config(f"https://127.0.0.1:{m.process.port}"))  # weir-mock speaks plain HTTP
    resp = chat(w)
    assert resp.status_code == 502
    wait_until(lambda: "TLS connect failed" in weir_stderr(w), 5, message="TLS failure in weir's log")


def test_verify_false_accepts_any_certificate_and_warns(pki, mock, relay, weir):
    r = relay(pki.untrusted, mock())
    w = weir(config=https_config(r.url, {"verify": False}))
    assert chat(w).status_code == 200
    assert "pools.hosted.tls.verify: false: the certificates" in weir_stderr(w)


def test_a_tls_failure_fails_over_to_the_next_endpoint(pki, mock, relay, weir):
    m = mock()
    bad, good = relay(pki.untrusted, m), relay(pki.server, m)
    cfg = https_config(bad.url, {"ca_file": str(pki.ca.pem)})
    cfg["pools"]["hosted"]["endpoints"] = [bad.url, good.url]
    w = weir(config=cfg, workers=1)
    for _ in range(4):
        assert chat(w).status_code == 200  # a connect failure is retried on the other endpoint


def test_mutual_tls(pki, mock, relay, weir):
    m = mock()
    r = relay(pki.server, m, client_ca=pki.ca.pem)
    with_cert = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem), "client_cert": str(pki.client.cert),
                                                 "client_key": str(pki.client.key)}))
    assert chat(with_cert).status_code == 200
    without = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem)}))
    assert chat(without).status_code == 502


# A client certificate refused after a TLS 1.3 handshake (an alert on the first read): test_tls_59.py, whose
# servers send the alert as OpenSSL's own (nginx's) do; asyncio's ssl here closes without it.


def test_api_key_env_replaces_the_clients_authorization(pki, mock, relay, weir):
    r = relay(pki.server, mock())
    w = weir(config=https_config(r.url + "/v1", {"ca_file": str(pki.ca.pem)}, api_key_env="WEIR_TEST_HOSTED_KEY"),
             env={"WEIR_TEST_HOSTED_KEY": "sk-hosted-123"})
    client = w.client(api_key="client-secret-456")
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert out.choices[0].message.content
    sent = r.text()
    assert "Authorization: Bearer sk-hosted-123\r\n" in sent
    assert "client-secret-456" not in sent
    # The endpoint's /v1 base and the request's /v1 are one.
    assert "POST /v1/chat/completions HTTP/1.1" in sent and "/v1/v1/" not in sent


def test_azure_style_base_path_and_query(pki, mock, relay, weir):
    r = relay(pki.server, mock())
    url = r.url + "/openai/deployments/gpt-4o?api-version=2024-10-21"
    w = weir(config=https_config(url, {"ca_file": str(pki.ca.pem)}))
    resp = chat(w)
    # weir-mock has no such route: its 404 comes back; what matters is the target Weir sent.
    assert resp.status_code == 404
    assert "POST /openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21 HTTP/1.1" in r.text()


def test_metrics_scrape_and_health_probe_over_https(pki, mock, relay, weir):
    r = relay(pki.server, mock())
    cfg = https_config(r.url, {"ca_file": str(pki.ca.pem)}, balance="least_load",
                       load_metrics={"interval": "200ms", "timeout": "1s"}, health={"interval": "200ms"})
    w = weir(config=cfg, workers=1)
    wait_until(lambda: "GET /metrics HTTP/1.1" in r.text() and "GET /health HTTP/1.1" in r.text(), 5,
               message="scrape and probe through the relay")
    assert "User-Agent: weir-load" in r.text() and "User-Agent: weir-health" in r.text()
    assert chat(w).status_code == 200
    assert w.metric("weir_upstream_health_transitions_total") == 0  # the probes succeed


def test_health_probe_over_https_with_a_bad_certificate_marks_the_endpoint_down(pki, mock, relay, weir):
    r = relay(pki.untrusted, mock())
    cfg = https_config(r.url, {"ca_file": str(pki.ca.pem)}, health={"interval": "100ms", "unhealthy_after": 1})
    w = weir(config=cfg, workers=1)
    wait_until(lambda: w.metric("weir_upstream_health_transitions_total") >= 1, 5,
               message="the probe marks the endpoint unhealthy")
    assert "unhealthy" in weir_stderr(w)
    # The probe's log says why, as a request's does.
    assert "TLS: certificate verification failed: unable to get local issuer certificate" in weir_stderr(w)
    assert "TLS connect failed: certificate verification failed" in weir_stderr(w)


def test_bad_ca_file_is_refused_at_start(pki, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    cfg = tmp_path / "weir.yaml"
    cfg.write_text("listen: 127.0.0.1:0\npools:\n  hosted:\n    endpoints: [https://127.0.0.1:9]\n"
                   f"    tls: {{ca_file: {bad}}}\ndefault_pool: hosted\n")
    for check in (["--check"], []):  # --check refuses what start-up would
        p = subprocess.run([binary("weir"), "--config", cfg, *check], capture_output=True, text=True, timeout=20)
        assert p.returncode == 2, p.stderr
        assert "pools.hosted.tls: cannot load ca_file" in p.stderr, p.stderr


def closed_by_the_server(r: TlsRelay) -> None:
    """Waits until the relay's side of Weir's idle connection closed it (after the mock's 1 s keep-alive, longer
    on a loaded machine): Weir's socket to it got the FIN (after the close_notify), so no longer ESTABLISHED."""
    wait_until(lambda: connections_to(r.port) == 0, 15, message="the server closed the idle connection")


def test_a_tls_connection_the_server_closed_is_not_reused(pki, mock, relay, weir):
    # weir-mock closes idle keep-alive connections after 1 s; the relay then closes its TLS side
    # (close_notify). Weir keeps idle connections 10 s here, so only its stale check can notice.
    r = relay(pki.server, mock("--keep-alive-s", 1))
    w = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem)}, idle_keepalive="10s"), workers=1)
    assert chat(w).status_code == 200
    wait_until(lambda: r.connections == 1, 5)
    closed_by_the_server(r)
    for i in range(3):
        assert chat(w, stream=i == 1).status_code == 200
    assert r.connections == 2  # one new connection, then reused
    assert w.metric("weir_upstream_connects_total") == 2


def test_a_new_connection_resumes_the_tls_session(pki, mock, relay, weir):
    # As above, the server closes idle connections after 1 s: the next connection offers the ticket
    # the first one received (TLS 1.3 resumption), so it costs no certificate exchange.
    r = relay(pki.server, mock("--keep-alive-s", 1))
    w = weir(config=https_config(r.url, {"ca_file": str(pki.ca.pem)}, idle_keepalive="10s"), workers=1)
    assert chat(w).status_code == 200
    closed_by_the_server(r)
    assert chat(w).status_code == 200
    assert r.connections == 2
    assert r.resumed == [False, True]


# ---------------------------------------------------------------------------
# Traces to an https:// OTLP endpoint (the exporter's client: http/probe.hpp's KeptConnection)


def traced_config(mock, otlp_url: str, ca_file: pathlib.Path) -> dict:
    return {"pools": {"p": {"endpoints": [mock.base_url]}}, "models": {MODEL: {"pool": "p"}},
            "tracing": {"otlp_endpoint": otlp_url, "ca_file": str(ca_file), "flush_interval": "10ms",
                        "timeout": "2s"}}


def test_traces_go_to_an_https_collector_on_one_kept_alive_connection(pki, mock, weir):
    from otlp import Collector
    collector = Collector()
    r = TlsRelay(pki.server, collector.port)
    try:
        w = weir(config=traced_config(mock(), r.url, pki.ca.pem), workers=1)
        for i in range(3):  # one export each: the next request waits for the last one's spans
            assert chat(w).status_code == 200
            wait_until(lambda: w.metric("weir_tracing_exports_total") >= i + 1, 10, message="an export")
        # (The spans are counted after the export is, on the exporter's SCHED_IDLE thread: waited for.)
        wait_until(lambda: w.metric("weir_tracing_spans_exported_total") >= 3, 10, message="the spans counted")
        assert w.metric("weir_tracing_export_errors_total") == 0
        assert r.connections == 1  # the connection is kept alive between exports
        assert r.text().count("POST /v1/traces HTTP/1.1\r\n") == 3
        assert "Content-Type: application/json\r\n" in r.text()
    finally:
        r.close()
        collector.close()


@pytest.mark.parametrize("case,reason", [
    ("unknown_ca", "certificate verification failed: unable to get local issuer certificate"),
    ("wrong_name", "certificate verification failed: IP address mismatch"),
])
def test_an_https_collector_with_a_bad_certificate_gets_no_spans(pki, mock, weir, case, reason):
    from otlp import Collector
    collector = Collector()
    r = TlsRelay({"unknown_ca": pki.untrusted, "wrong_name": pki.wrong_name}[case], collector.port)
    try:
        w = weir(config=traced_config(mock(), r.url, pki.ca.pem), workers=1)
        assert chat(w).status_code == 200
        wait_until(lambda: w.metric("weir_tracing_export_errors_total") >= 1, 10, message="export errors counted")
        wait_until(lambda: reason in weir_stderr(w), 5, message=f"'{reason}' said on stderr")
        assert w.metric("weir_tracing_spans_exported_total") == 0
        assert collector.requests == []
    finally:
        r.close()
        collector.close()


@pytest.mark.parametrize("close_notify", [True, False], ids=["close_notify", "bare-close"])
def test_a_close_delimited_body_cut_by_a_tls_close_without_close_notify_is_no_answer(pki, weir, close_notify):
    # An answer with no length, ended by the close (RFC 9112 §6.3): over TLS a close without close_notify is
    # the one sign the body was cut (RFC 8446 §6.1). It was read as the body's end: a cut chat completion
    # went out as a 200. With close_notify the close is the end.
    import socket
    import threading
    doc = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
           b'"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}')
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server.cert, pki.server.key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                s = ctx.wrap_socket(raw, server_side=True)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += s.recv(65536)
                s.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n" + doc)
                if close_notify:
                    s.unwrap()
                s.close()  # (Python's close of an SSLSocket sends no close_notify)
            except (OSError, ssl.SSLError):
                pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        w = weir(config=https_config(f"https://127.0.0.1:{listener.getsockname()[1]}", {"ca_file": str(pki.ca.pem)}),
                 workers=1)
        r = chat(w, headers={"x-request-id": "tls-cut"})
        if close_notify:
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello", r.text
        else:
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unavailable", r.text
            assert w.log_for("tls-cut")["status"] == 502
    finally:
        listener.close()
