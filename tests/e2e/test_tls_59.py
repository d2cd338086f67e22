"""TLS upstream defects found in round 59 (docs/upstreams.md#tls).

Each test runs Weir against a TLS server of its own (Python's ssl on blocking sockets, one thread per
connection) with certificates from a throwaway CA made here (the ``cryptography`` package), so a test
decides exactly what the server does: answer early and close, close after a certificate request, send
no subjectAltName, record the SNI name.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import json
import os
import pathlib
import socket
import ssl
import struct
import subprocess
import termios
import threading

import httpx
import pytest

from conftest import binary, free_port, wait_until

pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

MODEL = "m"


# ---------------------------------------------------------------------------
# Certificates


class CA:
    def __init__(self, directory: pathlib.Path, name: str):
        self.dir = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Weir test CA {name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = directory / f"ca-{name}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, dns=(), ips=(), *, cn: str | None = None, san: bool = True, client: bool = False,
              passphrase: bytes | None = None) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn or name)]))
             .issuer_name(self.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if san and sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        c, k = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        enc = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
        return str(c), str(k)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = CA(d, "trusted"), CA(d, "other")
    return {
        "dir": d,
        "ca": ca,
        "other_client": other.issue("other-client", dns=["weir-client"], client=True),
        "server": ca.issue("server", dns=["weir-test.internal"], ips=["127.0.0.1"]),
        "client": ca.issue("client", dns=["weir-client"], client=True),
    }


# ---------------------------------------------------------------------------
# A TLS server that does what the test says


def server_ctx(cert: tuple[str, str], *, max_tls12: bool = False, client_ca: str | None = None,
               sni: list | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*cert)
    ctx.set_alpn_protocols(["http/1.1"])
    if max_tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if client_ca:
        ctx.verify_mode = ssl.CERT_OPTIONAL  # nginx's ssl_verify_client optional
        ctx.load_verify_locations(client_ca)
    if sni is not None:
        ctx.sni_callback = lambda sock, name, c: sni.append(name)
    return ctx


class TlsServer:
    """Accepts TLS connections on 127.0.0.1; handler(server, ssl_socket) runs in a thread per connection."""

    def __init__(self, ctx: ssl.SSLContext, handler):
        self.ctx, self.handler = ctx, handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.connections = 0
        self.requests: list[bytes] = []  # each request's body, as read
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._one, args=(raw,), daemon=True).start()

    def _one(self, raw):
        try:
            s = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        try:
            self.handler(self, s)
        except (ssl.SSLError, OSError):
            pass
        finally:
            s.close()

    def close(self):
        self.listener.close()


@pytest.fixture
def servers():
    made: list[TlsServer] = []

    def make(ctx, handler) -> TlsServer:
        s = TlsServer(ctx, handler)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def read_head(s) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        if not got:
            return None
        data += got
    return data


def read_request(s) -> tuple[bytes, bytes] | None:
    data = read_head(s)
    if data is None:
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        got = s.recv(65536)
        if not got:
            break
        body += got
    return head, body


DOC = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                               "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


def answers(server: TlsServer, s) -> None:
    while (r := read_request(s)) is not None:
        with server.lock:
            server.requests.append(r[1])
        s.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(DOC) + DOC)


def config(endpoints, tls: dict | None = None, **pool) -> dict:
    p = {"endpoints": endpoints if isinstance(endpoints, list) else [endpoints], **pool}
    if tls is not None:
        p["tls"] = tls
    return {"pools": {"hosted": p}, "models": {MODEL: {"pool": "hosted"}}}


def chat(w, content: str = "hi", timeout: float = 30, headers: dict | None = None) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return httpx.post(w.v1 + "/chat/completions", json=body, timeout=timeout, headers=headers)


# ---------------------------------------------------------------------------
# 1. An early answer (a 413 before the body was read, and a close) is relayed over TLS as over TCP


TOO_LARGE = b'{"error":{"message":"Request Entity Too Large","type":"invalid_request_error","code":"too_large"}}'


def answers_early(server: TlsServer, s) -> None:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if read_head(s) is None:
        return
    s.sendall(b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: %d\r\n\r\n" % len(TOO_LARGE) + TOO_LARGE)
    # Closed with the body unread: the kernel answers Weir's next bytes with a reset. A close with unread bytes
    # also drops what it has not sent yet, so first Weir's kernel has the answer (acknowledged: nothing unsent).
    wait_until(lambda: unacknowledged(s) == 0, 10, message="the answer acknowledged")


def unacknowledged(s) -> int:
    """Bytes of the socket's not yet acknowledged by the peer (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


def test_an_early_answer_over_tls_is_relayed_not_taken_for_a_reset(pki, servers, weir):
    # RFC 9112 §9.3: a client sending a body watches for an early error response. Over TLS Weir answered 502
    # "reset" and, with retry.attempts, sent the whole 30 MB body again per attempt.
    srv = servers(server_ctx(pki["server"]), answers_early)
    cfg = config(srv.url, {"ca_file": str(pki["ca"].pem)}, retry={"attempts": 3})
    cfg["server"] = {"max_body": "64MiB"}
    w = weir(config=cfg, workers=1)
    r = chat(w, content="x" * (30 * 1024 * 1024), timeout=60, headers={"x-request-id": "early413"})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "too_large"
    assert srv.connections == 1  # the body went once
    assert w.metric("weir_upstream_failures_total", kind="reset") == 0
    assert w.log_for("early413")["status"] == 413


# ---------------------------------------------------------------------------
# 2. A close after an optional certificate request is a reset, not a refused client certificate


def runs_then_dies(ending: str):
    def handler(server: TlsServer, s) -> None:
        r = read_request(s)
        if r is None:
            return
        with server.lock:
            server.requests.append(r[1])
        if ending == "rst":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # no answer, no alert
    return handler


@pytest.mark.parametrize("ending", ["close", "rst"])
@pytest.mark.parametrize("version", ["tls13", "tls12"])
def test_a_close_after_an_optional_certificate_request_is_a_reset_not_a_free_resend(pki, servers, weir, ending,
                                                                                    version):
    # A server asking for a certificate optionally (nginx's ssl_verify_client optional) that ran the request
    # and died: it was taken for a refused client certificate (a failed handshake, "check client_cert" in the
    # log) and the POST resent free to the other endpoint, run twice.
    ctx = server_ctx(pki["server"], max_tls12=version == "tls12", client_ca=str(pki["ca"].pem))
    dying, good = servers(ctx, runs_then_dies(ending)), servers(server_ctx(pki["server"]), answers)
    w = weir(config=config([dying.url, good.url], {"ca_file": str(pki["ca"].pem)}), workers=1)
    statuses = []
    # (The picker chooses between the two at random: requests go on until one reached the dying server.)
    while not dying.requests and len(statuses) < 40:
        statuses.append(chat(w, content=f"request {len(statuses)}").status_code)
    assert dying.requests, "no request reached the dying server"
    ran = dying.requests[0]
    assert statuses[-1] == 502, statuses
    assert ran not in good.requests  # not run twice
    assert w.metric("weir_upstream_failures_total", kind="tls") == 0
    assert w.metric("weir_upstream_failures_total", kind="reset") >= 1
    assert "client certificate" not in w.process.log()


def refuses_at_first_read(server: TlsServer, s) -> None:
    answers(server, s)  # (the handshake's refusal of the certificate comes as an alert on Weir's first read)


@pytest.mark.parametrize("certificate", ["none", "untrusted"])
def test_a_client_certificate_refused_with_an_alert_after_a_tls13_handshake_fails_over(pki, servers, weir,
                                                                                      certificate):
    # Under TLS 1.3 a server refuses the client's certificate (or its absence) after the client's Finished, with
    # an alert (certificate_required, unknown_ca) Weir reads on the first read: a failed handshake, the request
    # never reached the server, so the next endpoint takes it (kind="tls").
    ctx = server_ctx(pki["server"], client_ca=str(pki["ca"].pem))
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    needs_cert, good = servers(ctx, refuses_at_first_read), servers(server_ctx(pki["server"]), answers)
    tls = {"ca_file": str(pki["ca"].pem)}
    if certificate == "untrusted":
        cert, key = pki["other_client"]
        tls.update(client_cert=cert, client_key=key)
    w = weir(config=config([needs_cert.url, good.url], tls), workers=1)
    statuses = []
    while len(statuses) < 40 and w.metric("weir_upstream_failures_total", kind="tls") == 0:
        statuses.append(chat(w).status_code)
    assert statuses == [200] * len(statuses), statuses
    assert w.metric("weir_upstream_failures_total", kind="tls") >= 1
    assert w.metric("weir_upstream_failures_total", kind="reset") == 0
    assert not needs_cert.requests
    assert "asking for a client certificate" in w.process.log()


# ---------------------------------------------------------------------------
# 3. An encrypted client_key is a configuration error, never a passphrase prompt


def test_an_encrypted_client_key_is_refused_not_prompted_for(pki, tmp_path):
    # OpenSSL prompted on the terminal (a hung --check, start-up or reload) or, with none, read stdin.
    cert, key = pki["ca"].issue("client-enc", dns=["weir-client"], client=True, passphrase=b"secret")
    path = tmp_path / "c.yaml"
    path.write_text(f"listen: 127.0.0.1:{free_port()}\npools:\n  hosted:\n    endpoints: [https://127.0.0.1:9]\n"
                    f"    tls: {{client_cert: {cert}, client_key: {key}}}\ndefault_pool: hosted\n")
    for args in (["--check"], []):
        r = subprocess.run([str(binary("weir")), "--config", str(path), *args], input="secret\n",
                           capture_output=True, text=True, timeout=20, start_new_session=True)  # no terminal
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert f"client_key '{key}' is encrypted" in r.stderr, r.stderr
        assert "pass phrase" not in r.stderr.lower(), r.stderr


# ---------------------------------------------------------------------------
# 4. A certificate naming the host only in its subject's CN is refused (RFC 9525 §6.3)


def test_a_certificate_without_a_matching_subject_alt_name_is_refused(pki, servers, weir):
    cn_only = pki["ca"].issue("cn-only", dns=["weir-cn.test"], cn="weir-cn.test", san=False)
    srv = servers(server_ctx(cn_only), answers)
    w = weir(config=config(srv.url, {"ca_file": str(pki["ca"].pem), "server_name": "weir-cn.test"}), workers=1)
    r = chat(w)
    assert r.status_code == 502, r.text
    assert w.metric("weir_upstream_failures_total", kind="tls") >= 1
    wait_until(lambda: "hostname mismatch" in w.process.log(), 5, message="the reason in weir's log")
    assert not srv.requests
    # The same name in a subjectAltName passes.
    with_san = pki["ca"].issue("san", dns=["weir-cn.test"], cn="weir-cn.test")
    srv2 = servers(server_ctx(with_san), answers)
    w2 = weir(config=config(srv2.url, {"ca_file": str(pki["ca"].pem), "server_name": "weir-cn.test"}), workers=1)
    assert chat(w2).status_code == 200


# ---------------------------------------------------------------------------
# 5. tls.server_name: a trailing dot, a wildcard, an IPv6 literal


def test_a_server_name_with_a_trailing_dot_is_sent_and_verified_without_it(pki, servers, weir):
    sni: list = []
    srv = servers(server_ctx(pki["server"], sni=sni), answers)
    w = weir(config=config(srv.url, {"ca_file": str(pki["ca"].pem), "server_name": "weir-test.internal."}),
             workers=1)
    assert chat(w).status_code == 200
    assert sni and set(sni) == {"weir-test.internal"}  # RFC 6066 §3: no trailing dot in SNI


def check(tmp_path, pool: str) -> subprocess.CompletedProcess:
    path = tmp_path / "c.yaml"
    path.write_text(f"listen: 127.0.0.1:{free_port()}\npools:\n  p: {pool}\ndefault_pool: p\n")
    return subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                          timeout=20)


@pytest.mark.parametrize("name,ok", [
    ("'*.internal'", False),       # a certificate's pattern, no host to connect to
    ("'vllm.*'", False),
    ("'a..internal'", False),      # an empty label
    ("'vllm.internal:443'", False),  # a port
    ("'::1'", True),               # an IPv6 literal: verified against the IP SANs, no SNI
    ("'[2001:db8::5]'", True),
    ("'vllm.internal.'", True),    # fully qualified
])
def test_server_name_forms_at_check(tmp_path, name, ok):
    r = check(tmp_path, f"{{endpoints: ['https://127.0.0.1:9'], tls: {{server_name: {name}}}}}")
    assert (r.returncode == 0) == ok, (r.returncode, r.stderr)
    if not ok:
        assert "pools.p.tls.server_name: expected a host name" in r.stderr, r.stderr


def test_an_ipv6_server_name_is_verified_as_an_address(pki, servers, weir):
    # The endpoint is an IPv4 address; the certificate names ::1 in an IP SAN, so verification must match the
    # IPv6 server_name against IP SANs (not refuse it at start-up, not take it for a DNS name).
    cert = pki["ca"].issue("v6", ips=["::1"])
    sni: list = []
    srv = servers(server_ctx(cert, sni=sni), answers)
    w = weir(config=config(srv.url, {"ca_file": str(pki["ca"].pem), "server_name": "::1"}), workers=1)
    assert chat(w).status_code == 200
    assert set(sni) == {None}  # no SNI for an address


# ---------------------------------------------------------------------------
# 6. A key sent in cleartext to a pool's http:// endpoint is warned about


def test_an_api_key_for_a_pool_mixing_https_and_http_endpoints_is_warned(tmp_path):
    r = check(tmp_path, "{endpoints: ['https://127.0.0.1:9', 'http://127.0.0.1:10'], api_key: sk-x}")
    assert r.returncode == 0, r.stderr
    assert "warning" in r.stderr and "pools.p.endpoints[1]" in r.stderr, r.stderr
    assert "http://127.0.0.1:10" in r.stderr and "cleartext" in r.stderr, r.stderr
    assert "sk-x" not in r.stderr
    # A pool of http:// endpoints alone (a model server on a private network) is not warned, nor an https one.
    for pool in ("{endpoints: ['http://127.0.0.1:10'], api_key: sk-x}",
                 "{endpoints: ['https://127.0.0.1:9'], api_key: sk-x}"):
        r = check(tmp_path, pool)
        assert r.returncode == 0 and "cleartext" not in r.stderr, (pool, r.stderr)
