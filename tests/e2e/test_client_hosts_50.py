"""The client listener's Host check, server.allowed_hosts (stop 50; docs/operations.md, "Host names and DNS
rebinding").

DEFECT: the client listener answered requests naming any host. A page on any site could rebind its own name to
127.0.0.1 and, from a developer's browser, read what that listener gives without a credential: /metrics (tenants,
key ids, models), /health, /ready; and, when Weir checks no credential, the API itself. It now answers only the
hosts server.allowed_hosts lists (every request, the API's included); without the option, on a loopback listener,
/metrics is answered for IP literals and localhost only and every other request for any host (clients, proxies and
health checkers reach the API, /health and /ready by any name; /health and /ready say only up or not, and an API
without credential checks can be posted to by any page anyway); elsewhere any host. Others get 421 host_not_allowed (RFC 9110 §15.5.20), in OpenAI's error shape. The option reloads.
"""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess

import httpx
import pytest

from conftest import binary, free_port, to_yaml, wait_until
from test_config_reload import sighup, write

KEY = "sk-hosts-50"
AUTH = {"authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "hi"}]


def config(m, server: dict | None = None, auth: bool = True, listen: str | None = None) -> dict:
    cfg: dict = {"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p"}
    if auth:
        cfg["tenants"] = {"t": {}}
        cfg["auth"] = {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]}
    if server:
        cfg["server"] = server
    if listen:
        cfg["listen"] = listen
    return cfg


def req(port: int, method: str, path: str, host: str | None, **kw) -> httpx.Response:
    headers = dict(kw.pop("headers", {}))
    if host is not None:
        headers["host"] = host
    return httpx.request(method, f"http://127.0.0.1:{port}{path}", headers=headers, timeout=10, **kw)


def chat(port: int, host: str | None, key: bool = True) -> httpx.Response:
    return req(port, "POST", "/v1/chat/completions", host, headers=AUTH if key else {},
               json={"model": "mock-model", "messages": MSG, "max_tokens": 2})


def refused(r: httpx.Response) -> bool:
    if r.status_code != 421:
        return False
    if r.request.method == "HEAD":
        return True
    e = r.json()["error"]
    return e["code"] == "host_not_allowed" and e["type"] == "invalid_request_error" and "param" in e


def raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Sends one request as written (the connection closes after); its status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


REBOUND = ["attacker.example", "ATTACKER.example.", "localhost.attacker.example", "127.0.0.1.nip.io", "127.1",
           "foo.localhost"]
# What the loopback default holds: /metrics (tenants, key ids, models, pools' addresses).
FREE = [("GET", "/metrics"), ("HEAD", "/metrics")]
# What it does not: up-or-not answers and a path Weir does not serve.
OPEN = [("GET", "/health", 200), ("GET", "/ready", 200), ("HEAD", "/health", 200), ("GET", "/nowhere", 404)]


def test_a_rebound_name_is_refused_on_metrics_by_default(mock, weir):
    w = weir(config=config(mock()))
    for name in REBOUND:
        for host in (name, f"{name}:{w.port}"):
            for method, path in FREE:
                r = req(w.port, method, path, host)
                assert refused(r), (host, method, path, r.status_code, r.text)
                if method != "HEAD":
                    assert "server.allowed_hosts" in r.json()["error"]["message"], r.text
                    assert "tenant" not in r.text and "k1" not in r.text, r.text
    # An absolute-form target names the host, whatever Host says (RFC 9112 §3.2.2).
    status, body = raw(w.port, b"GET http://attacker.example/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Connection: close\r\n\r\n")
    assert status == 421 and b"host_not_allowed" in body, body
    # Refused with its own access-log line.
    w.wait_log(lambda es: any(e.get("status") == 421 and e.get("path") == "/metrics" for e in es),
               message="the refusal's access-log line")
    assert "only IP literals and localhost for /metrics (server.allowed_hosts)" in w.process.log()


def test_health_ready_and_unknown_paths_answer_any_host_by_default(mock, weir):
    w = weir(config=config(mock()))
    for name in REBOUND:
        for method, path, status in OPEN:
            r = req(w.port, method, path, name)
            assert r.status_code == status, (name, method, path, r.status_code, r.text)


def test_ip_literals_and_localhost_are_answered_by_default(mock, weir):
    w = weir(config=config(mock()))
    for host in (f"localhost:{w.port}", "LocalHost", "localhost.", f"127.0.0.1:{w.port}", "127.0.0.1",
                 f"[::1]:{w.port}", "[::1]", "[0:0:0:0:0:0:0:1]", "192.0.2.7:80"):
        for method, path in (("GET", "/metrics"), ("GET", "/health"), ("GET", "/ready"), ("HEAD", "/metrics")):
            r = req(w.port, method, path, host)
            assert r.status_code == 200, (host, method, path, r.status_code, r.text)
        assert req(w.port, "GET", "/nowhere", host).status_code == 404, host
    # HTTP/1.0 without Host: no browser sends that (no rebinding); health checkers may.
    status, body = raw(w.port, b"GET /health HTTP/1.0\r\n\r\n")
    assert status == 200, body
    status, body = raw(w.port, f"GET http://127.0.0.1:{w.port}/ready HTTP/1.1\r\nHost: attacker.example\r\n"
                               f"Connection: close\r\n\r\n".encode())
    assert status == 200, body


def test_the_api_with_a_valid_key_answers_any_host_by_default(mock, weir):
    w = weir(config=config(mock()))
    for host in ("api.example.com", f"weir.internal:{w.port}", "attacker.example", "localhost"):
        r = chat(w.port, host)
        assert r.status_code == 200, (host, r.status_code, r.text)
        r = req(w.port, "GET", "/v1/models", host, headers=AUTH)
        assert r.status_code == 200, (host, r.status_code, r.text)
        # Without a key the credential check answers (a page that rebinds a name knows no key).
        assert chat(w.port, host, key=False).status_code == 401, host


def test_without_a_credential_check_the_api_answers_any_host_by_default_and_a_list_holds_it(mock, weir):
    m = mock()
    for cfg in (config(m, auth=False),  # no auth: every request is anonymous
                {**config(m), "auth": {"required": False}}):  # auth.required false: so is one without a key
        w = weir(config=cfg)
        assert chat(w.port, "weir.internal", key=False).status_code == 200, cfg.get("auth")
        assert req(w.port, "GET", "/v1/models", "weir.internal").status_code == 200
        assert refused(req(w.port, "GET", "/metrics", "weir.internal"))
        held = weir(config={**cfg, "server": {"allowed_hosts": ["localhost"]}})
        assert refused(chat(held.port, "attacker.example", key=False)), cfg.get("auth")
        assert chat(held.port, f"localhost:{held.port}", key=False).status_code == 200


def test_an_explicit_list_applies_to_every_request(mock, weir):
    w = weir(config=config(mock(), server={"allowed_hosts": ["API.example.", "127.0.0.1"]}))
    # An unlisted host: refused whatever the route, a valid key or not.
    for host in ("attacker.example", "localhost", f"[::1]:{w.port}", "api.example.com"):
        assert refused(chat(w.port, host)), host
        assert refused(req(w.port, "GET", "/v1/models", host, headers=AUTH)), host
        assert refused(req(w.port, "GET", "/metrics", host)), host
    # Listed (any case, any port, a trailing dot): answered.
    for host in ("api.example", f"API.EXAMPLE:{w.port}", "api.example.", f"127.0.0.1:{w.port}"):
        assert chat(w.port, host).status_code == 200, host
        assert req(w.port, "GET", "/metrics", host).status_code == 200, host
    assert "for /metrics (server.allowed_hosts)" not in w.process.log()


def test_star_answers_every_host(mock, weir):
    w = weir(config=config(mock(), server={"allowed_hosts": "*"}, auth=False))
    for host in ("attacker.example", f"anything.example:{w.port}"):
        assert req(w.port, "GET", "/metrics", host).status_code == 200, host
        assert req(w.port, "GET", "/health", host).status_code == 200, host
        assert chat(w.port, host, key=False).status_code == 200, host


def test_a_listener_off_loopback_answers_any_host_by_default(mock, weir):
    port = free_port()
    w = weir(config=config(mock(), listen=f"0.0.0.0:{port}"))
    assert req(w.port, "GET", "/metrics", f"weir.default.svc:{w.port}").status_code == 200
    assert req(w.port, "GET", "/health", "attacker.example").status_code == 200
    assert "for /metrics (server.allowed_hosts)" not in w.process.log()


def test_the_option_reloads(mock, weir):
    m = mock()
    w = weir(config=config(m), workers=2)
    assert refused(req(w.port, "GET", "/metrics", "attacker.example"))
    assert chat(w.port, "attacker.example").status_code == 200
    # A list: the API's requests are held to it from the next request on.
    write(w, config(m, server={"allowed_hosts": ["api.example", "127.0.0.1"]}))
    sighup(w)
    assert "server +allowed_hosts" in w.process.log(), w.process.log()[-2000:]
    for _ in range(4):  # (each worker)
        assert refused(chat(w.port, "attacker.example"))
        assert chat(w.port, "api.example").status_code == 200
    # "*": any host, /metrics included.
    write(w, config(m, server={"allowed_hosts": "*"}))
    sighup(w)
    for _ in range(4):
        assert req(w.port, "GET", "/metrics", "attacker.example").status_code == 200
    # Back to the default.
    write(w, config(m))
    sighup(w)
    assert refused(req(w.port, "GET", "/metrics", "attacker.example"))
    assert chat(w.port, "attacker.example").status_code == 200


BAD = [
    ("empty", "[]", "server.allowed_hosts", "empty: no request naming a host"),
    ("with-port", "[api.example:8080]", "server.allowed_hosts[0]", "has a port"),
    ("wildcard-name", "['*.example.com']", "server.allowed_hosts[0]", "wildcard"),
    ("star-among-names", "[a.example, '*']", "server.allowed_hosts[1]", "list it alone"),
]


@pytest.mark.parametrize("name,value,key,why", BAD, ids=[b[0] for b in BAD])
def test_a_bad_allowed_hosts_exits_2_naming_file_line_and_key(tmp_path, name, value, key, why):
    cfg = to_yaml({"listen": f"127.0.0.1:{free_port()}", "pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}},
                   "default_pool": "p", "server": {"access_log": "off"}})
    text = cfg + "\n" + f"  allowed_hosts: {value}\n"  # (server: is the last section)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    line = text.splitlines().index(f"  allowed_hosts: {value}") + 1
    r = subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                       timeout=10, env=dict(os.environ))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{path}:{line}:" in r.stderr and f" {key}: " in r.stderr and why in r.stderr, r.stderr
