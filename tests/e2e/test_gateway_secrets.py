"""Secrets in URLs (issue 8, defect 3): an endpoint URL with credentials is
refused without echoing them; a query with a secret is accepted (and never
sent) but shows as REDACTED in the access log, error bodies and stderr.
"""

from __future__ import annotations

import json
import subprocess

from conftest import binary, free_port, to_yaml
from httpwire import RawConn, request, roundtrip, sse_data

SECRET = "S3CR3T-9f1c2e"
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def weir_run(*args, timeout=10) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("weir")), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_a_secret_in_an_endpoint_query_is_never_shown(mock, weir):
    m = mock("--ttft-ms", "2", "--itl-ms", "2", "--max-tokens", "6")
    dead = free_port()
    w = weir(workers=1, config={
        "pools": {
            "live": {"endpoints": [f"{m.base_url}/?api_key={SECRET}&region=eu"]},
            "dead": {"endpoints": [f"http://127.0.0.1:{dead}?token={SECRET}"]},
        },
        "models": {"mock-model": {"pool": "live"}, "gone": {"pool": "dead", "upstream_model": "mock-model"}},
    })
    bodies = []

    def post(body, headers=None):
        r = roundtrip(w.port, request("POST", "/v1/chat/completions", body, headers))
        bodies.append(r.body)
        return r

    assert post(CHAT, {"x-request-id": "ok-1"}).status == 200
    assert post({**CHAT, "stream": True}, {"x-request-id": "ok-2"}).status == 200
    assert post({**CHAT, "model": "gone"}, {"x-request-id": "refused-1"}).status == 502
    assert post({**CHAT, "model": "gone", "stream": True}).status == 502
    assert post(CHAT, {"x-mock-reset-after": "0"}).status == 502       # reset before the response
    assert post({**CHAT, "model": "nope"}).status == 404
    with RawConn(w.port) as c:                                          # reset mid-stream: in-band error
        c.send(request("POST", "/v1/chat/completions", {**CHAT, "stream": True}, {"x-mock-reset-after": "2"}))
        r = c.read_response("POST")
        bodies.append(r.body)
        assert "error" in json.loads(sse_data(r.body)[-2])

    for b in bodies:
        assert SECRET.encode() not in b, b
    entry = w.log_for("ok-1")
    assert entry["endpoint"] == f"{m.base_url}/?api_key=REDACTED&region=eu"
    assert w.log_for("refused-1")["endpoint"] == f"http://127.0.0.1:{dead}?token=REDACTED"
    w.wait_log(lambda es: len(es) >= 7)
    assert SECRET not in w.access_log_path.read_text()
    assert SECRET not in w.process.log()


def test_check_refuses_credentials_in_endpoint_urls(tmp_path):
    for url in ("http://user:pass@127.0.0.1:9", "https://user:pass@127.0.0.1:9/", "http://pass@127.0.0.1:9"):
        path = tmp_path / "creds.yaml"
        path.write_text(to_yaml({"pools": {"p": {"endpoints": [url]}}, "default_pool": "p"}) + "\n")
        for check in (["--check"], []):
            r = weir_run("--config", path, *check)
            out = r.stdout + r.stderr
            assert r.returncode == 2, out
            assert "pass" not in out, out
            assert f"{path}:4:" in r.stderr and "pools.p.endpoints[0]" in r.stderr, r.stderr
            assert "api_key" in r.stderr, r.stderr  # where an upstream's secret goes instead


def test_quick_mode_refuses_credentials_in_the_upstream_url():
    r = weir_run("--listen", f"127.0.0.1:{free_port()}", "--upstream", "http://user:pass@127.0.0.1:9", "--check")
    assert r.returncode == 2 and "--upstream" in r.stderr, r.stderr
    assert "pass" not in r.stdout + r.stderr


def test_jwks_url_with_credentials_is_refused_without_echoing_them(tmp_path):
    path = tmp_path / "jwks.yaml"
    path.write_text(to_yaml({
        "listen": f"127.0.0.1:{free_port()}",
        "pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}},
        "default_pool": "p",
        "tenants": {"a": {}},
        "auth": {"jwt": {"jwks_url": "https://user:pass@idp.example.com/jwks.json", "default_tenant": "a"}},
    }) + "\n")
    r = weir_run("--config", path)
    assert r.returncode == 2, r.stderr
    assert "auth.jwt.jwks_url" in r.stderr and "idp.example.com" in r.stderr, r.stderr
    assert "pass" not in r.stdout + r.stderr
