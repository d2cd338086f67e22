"""The admin listener's Host check, admin.allowed_hosts (stop 49; docs/admin-api.md, "Host names and DNS rebinding").

DEFECT: the admin listener answered requests naming any host. A page on any site could rebind its own name to
127.0.0.1 and, from the operator's browser, read what the admin listener gives without a token: /metrics
(tenants, key ids, spend), /ready, the console. It now answers only the hosts admin.allowed_hosts lists; without
the option, on a loopback address only IP literals and localhost (the names no other site can be served
under), elsewhere any host. Others get 421 host_not_allowed (RFC 9110 §15.5.20) before anything else.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess

import httpx
import pytest

from conftest import binary, free_port, to_yaml, wait_until

TOKEN = "admin-host-49-token-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
AUTH = {"authorization": f"Bearer {TOKEN}"}


def config(listen: str, **admin_extra) -> dict:
    return {
        "pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}},
        "models": {"m": {"pool": "p"}},
        "tenants": {"acme": {"models": ["m"]}},
        "auth": {"required": False},
        "admin": {"listen": listen, "token_env": "WEIR_TEST_ADMIN_TOKEN", **admin_extra},
        # The tests' w.metric() scrapes the client port (with tenants and admin.listen /metrics is otherwise
        # the admin listener's only, and its allowed_hosts here may refuse an IP literal).
        "server": {"metrics": {"client_port": True}},
    }


def start(weir, bind: str = "127.0.0.1", **admin_extra):
    port = free_port()
    w = weir(config=config(f"{bind}:{port}", **admin_extra), env=ENV)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_until(listening, 5, message="admin listener")
    return w, port


def raw(port: int, request: bytes) -> tuple[int, bytes, bytes]:
    """Sends one request as written; returns its status, head and body (the connection closed after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        out = b""
        while b"\r\n\r\n" not in out:
            d = s.recv(65536)
            if not d:
                break
            out += d
        head, _, body = out.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            d = s.recv(65536)
            if not d:
                break
            body += d
    return int(head.split(b" ", 2)[1]), head, body


def get(port: int, path: str, host: str | None, **kw) -> httpx.Response:
    headers = dict(kw.pop("headers", {}))
    if host is not None:
        headers["host"] = host
    return httpx.request(kw.pop("method", "GET"), f"http://127.0.0.1:{port}{path}", headers=headers, timeout=10, **kw)


def refused(r: httpx.Response) -> bool:
    return r.status_code == 421 and r.json()["error"]["code"] == "host_not_allowed"


# The class: every path of the listener, with or without a token, the console's sign-in call included.
PATHS = [("GET", "/metrics", {}), ("GET", "/ready", {}), ("GET", "/", {}), ("GET", "/console/", {}),
         ("GET", "/console/js/app.js", {}), ("HEAD", "/metrics", {}), ("GET", "/admin/v1/tenants", AUTH),
         ("GET", "/admin/v1/keys", {}), ("POST", "/admin/v1/keys", AUTH), ("GET", "/nowhere", {})]


def test_a_rebound_name_is_refused_on_the_loopback_default(weir):
    w, port = start(weir)
    for host in (f"attacker.example:{port}", "attacker.example", f"ATTACKER.example.:{port}",
                 f"localhost.attacker.example:{port}", f"127.0.0.1.nip.io:{port}"):
        for method, path, headers in PATHS:
            r = get(port, path, host, method=method, headers=headers,
                    **({"json": {"tenant": "acme"}} if method == "POST" else {}))
            assert r.status_code == 421, (host, method, path, r.status_code, r.text)
            if method != "HEAD":
                e = r.json()["error"]
                assert e["code"] == "host_not_allowed" and e["type"] == "invalid_request_error", r.text
                assert "admin.allowed_hosts" in e["message"], r.text
            assert r.headers["content-type"] == "application/json"
            assert r.headers["x-frame-options"] == "DENY"
    # No key was made by the refused POSTs.
    keys = get(port, "/admin/v1/keys", None, headers=AUTH).json()["data"]
    assert not [k for k in keys if k.get("source") == "admin"], keys
    # Refused with its own access-log line, as other admin requests.
    lines = w.wait_log(lambda es: any(e.get("listener") == "admin" and e.get("status") == 421
                                      and e.get("path") == "/metrics" for e in es),
                       message="the refusal's access-log line")
    assert any(e.get("path") == "/console/" and e.get("status") == 421 for e in lines), lines
    # A head that expects 100-continue gets the 421 instead of the 100.
    status, head, _ = raw(port, b"POST /admin/v1/keys HTTP/1.1\r\nHost: attacker.example\r\n"
                                b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 18\r\nExpect: 100-continue\r\n\r\n")
    assert status == 421 and b"100 Continue" not in head, head
    assert "IP literals and localhost only (admin.allowed_hosts)" in w.process.log(), w.process.log()


def test_ip_literals_and_localhost_are_served_on_the_loopback_default(weir):
    _, port = start(weir)
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LocalHost", f"localhost.:{port}",
                 f"[::1]:{port}", "[0:0:0:0:0:0:0:1]", "192.0.2.7:80"):
        assert get(port, "/metrics", host).status_code == 200, host
        assert get(port, "/console/", host).status_code == 200, host
        assert get(port, "/admin/v1/tenants", host, headers=AUTH).status_code == 200, host
    # Names that only look like an address are names.
    for host in ("127.1", "0x7f.0.0.1", "2130706433", "foo.localhost", "%6Cocalhost"):
        assert refused(get(port, "/metrics", host)), host


def test_http_1_0_without_host_is_served_and_the_targets_authority_wins(weir):
    _, port = start(weir)
    # No Host (HTTP/1.0): no browser sends that, so no rebinding; health checkers may.
    status, _, body = raw(port, b"GET /ready HTTP/1.0\r\n\r\n")
    assert status == 200, body
    status, _, body = raw(port, b"GET /ready HTTP/1.0\r\nHost: attacker.example\r\n\r\n")
    assert status == 421 and b"host_not_allowed" in body, body
    # RFC 9112 §3.2.2: an absolute-form target's authority is the one, whatever Host says.
    status, _, body = raw(port, b"GET http://attacker.example/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                b"Connection: close\r\n\r\n")
    assert status == 421 and b"host_not_allowed" in body, body
    status, _, body = raw(port, f"GET http://127.0.0.1:{port}/ready HTTP/1.1\r\nHost: attacker.example\r\n"
                                f"Connection: close\r\n\r\n".encode())
    assert status == 200, body


def test_an_explicit_list(weir):
    _, port = start(weir, allowed_hosts=["Weir-Admin.internal", "[::1]", "10.0.0.5"])
    for host in (f"weir-admin.internal:{port}", "WEIR-ADMIN.INTERNAL", "weir-admin.internal.", "[::1]:1",
                 "10.0.0.5"):
        assert get(port, "/metrics", host).status_code == 200, host
        assert get(port, "/admin/v1/tenants", host, headers=AUTH).status_code == 200, host
    # The list replaces the default: 127.0.0.1 and localhost are not on it.
    for host in (f"127.0.0.1:{port}", "localhost", "admin.internal", "attacker.example"):
        assert refused(get(port, "/metrics", host)), host
        assert refused(get(port, "/admin/v1/tenants", host, headers=AUTH)), host


def test_star_allows_any_host(weir):
    _, port = start(weir, allowed_hosts=["*"])
    assert get(port, "/metrics", "attacker.example").status_code == 200
    assert get(port, "/console/", f"anything.example:{port}").status_code == 200


def test_a_listener_off_loopback_answers_any_host_by_default(weir):
    w, port = start(weir, bind="0.0.0.0")
    # (Kubernetes scrapes by service name.)
    assert get(port, "/metrics", f"weir.monitoring.svc:{port}").status_code == 200
    assert get(port, "/admin/v1/tenants", "attacker.example", headers=AUTH).status_code == 200
    assert "IP literals and localhost only" not in w.process.log()
    # Unless the option says otherwise.
    _, port = start(weir, bind="0.0.0.0", allowed_hosts=["weir.monitoring.svc"])
    assert get(port, "/metrics", f"weir.monitoring.svc:{port}").status_code == 200
    assert refused(get(port, "/metrics", "attacker.example"))


BAD = [
    ("empty", "[]", "admin.allowed_hosts", "empty: no request naming a host"),
    ("star-among-names", "[a.example, '*']", "admin.allowed_hosts[1]", "list it alone"),
    ("wildcard-name", "['*.example.com']", "admin.allowed_hosts[0]", "wildcard"),
    ("with-port", "[admin.example:8081]", "admin.allowed_hosts[0]", "has a port"),
    ("not-v6", "['[nope]']", "admin.allowed_hosts[0]", "no IPv6 address"),
    ("not-a-name", "['a/b']", "admin.allowed_hosts[0]", "no host name"),
    ("empty-entry", "['']", "admin.allowed_hosts[0]", "empty entry"),
    ("a-mapping", "{a: b}", "admin.allowed_hosts", "expected a list"),
]


@pytest.mark.parametrize("name,value,key,why", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_a_bad_allowed_hosts_exits_2_naming_file_line_and_key(tmp_path, name, value, key, why, check):
    port = free_port()
    admin_port = free_port()
    cfg = to_yaml({"listen": f"127.0.0.1:{port}", "pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}},
                   "models": {"m": {"pool": "p"}},
                   "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}})
    text = cfg + "\n" + f"  allowed_hosts: {value}\n"  # (admin: is the last section)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    line = text.splitlines().index(f"  allowed_hosts: {value}") + 1
    env = {**os.environ, **ENV}
    r = subprocess.run([str(binary("weir")), "--config", str(path), *(["--check"] if check else [])],
                       capture_output=True, text=True, timeout=10, env=env)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{path}:{line}:" in r.stderr and f" {key}: " in r.stderr and why in r.stderr, r.stderr


def test_a_reload_that_changes_allowed_hosts_is_refused_as_every_admin_change(weir):
    w, port = start(weir, allowed_hosts=["admin.example"])
    cfg = config(f"127.0.0.1:{port}", allowed_hosts=["attacker.example"])
    cfg.update({"listen": f"127.0.0.1:{w.port}", "workers": 2,
                "server": {**cfg["server"], "access_log": str(w.access_log_path)}})
    w.config_path.write_text(to_yaml(cfg) + "\n")
    w.sighup("failure")
    assert "changes only at restart" in w.process.log() and "admin" in w.process.log(), w.process.log()[-2000:]
    assert refused(get(port, "/metrics", "attacker.example"))
    assert get(port, "/metrics", "admin.example").status_code == 200
    # The same names in another spelling are no change.
    before = w.metric("weir_config_reloads_total", result="success")
    cfg["admin"]["allowed_hosts"] = ["ADMIN.example."]
    w.config_path.write_text(to_yaml(cfg) + "\n")
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: w.metric("weir_config_reloads_total", result="success") > before, 10,
               message="the reload applied")
