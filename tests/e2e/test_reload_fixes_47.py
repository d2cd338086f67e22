"""Configuration reloads, defects found in stop 47's black-box rounds (docs/operations.md, "Reloading"):
a reload applies the JWT key set (a rotated jwks_file at once, a jwks_url fetched at once), and a
SIGHUP during a drain says that it reloads nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
import time

import httpx

from conftest import wait_until
from test_admission import JwksServer
from test_config_reload import sighup, write
from test_gateway_lifecycle import start_stream

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
S1 = b"k1-secret-0123456789abcdef0123456789"
S2 = b"k2-secret-0123456789abcdef0123456789"


def b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def jwks(kid: str, secret: bytes) -> dict:
    return {"keys": [{"kty": "oct", "k": b64(secret), "kid": kid, "alg": "HS256"}]}


def token(kid: str, secret: bytes, sub: str) -> str:
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = b64(json.dumps({"exp": int(time.time()) + 600, "tenant": "acme", "sub": sub}).encode())
    sig = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


def chat(w, tok: str) -> int:
    return httpx.post(w.v1 + "/chat/completions", headers={"Authorization": f"Bearer {tok}"}, timeout=10,
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}).status_code


def jwt_config(m, source: dict) -> dict:
    # Long refetch intervals: nothing but the reload may bring the new set in.
    return {"pools": {"p": {"endpoints": [m.base_url]}},
            "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
            "tenants": {"acme": {}},
            "auth": {"jwt": {**source, "tenant_claim": "tenant", "refresh_interval": "10m",
                             "min_refetch_interval": "10m"}}}


def test_a_reload_installs_a_rotated_jwks_file_on_every_worker_before_it_is_said_applied(mock, weir, tmp_path):
    m = mock(*FAST)
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks("k1", S1)))
    cfg = jwt_config(m, {"jwks_file": str(path)})
    w = weir(config=cfg)
    old = token("k1", S1, "a")
    for _ in range(6):  # verified (and cached) on both workers
        assert chat(w, old) == 200
    # k1 withdrawn (compromised), k2 published; the configuration text is the same.
    path.write_text(json.dumps(jwks("k2", S2)))
    write(w, cfg)
    sighup(w)
    for _ in range(6):  # a token verified before, on either worker, and a fresh one
        assert chat(w, old) == 401
        assert chat(w, token("k1", S1, "b")) == 401
    assert chat(w, token("k2", S2, "c")) == 200
    assert "auth.jwt.jwks_file: key set ~ (1 key)" in w.process.log(), w.process.log()
    # The same file again: no change said.
    sighup(w)
    last = [line for line in w.process.log().splitlines() if "configuration reloaded" in line][-1]
    assert "no change to" in last and "jwks" not in last, last


def test_a_reload_refetches_a_jwks_url_past_min_refetch_interval(mock, weir):
    m = mock(*FAST)
    server = JwksServer()
    try:
        server.jwks = jwks("k1", S1)
        w = weir(config=jwt_config(m, {"jwks_url": server.url}))
        wait_until(lambda: server.hits >= 1, 5, message="the first JWKS fetch")
        assert chat(w, token("k1", S1, "a")) == 200
        server.jwks = jwks("k2", S2)
        hits = server.hits
        os.kill(w.process.pid, signal.SIGHUP)
        wait_until(lambda: "weir: JWKS refetched from" in w.process.log(), 10, message="the reload's refetch")
        assert server.hits > hits
        log = w.process.log()
        assert "auth.jwt.jwks_url: key set being refetched" in log, log
        assert "1 key, a new key set in use" in log, log
        for _ in range(4):
            assert chat(w, token("k1", S1, "b")) == 401
        assert chat(w, token("k2", S2, "c")) == 200
    finally:
        server.close()


def test_a_sighup_during_a_drain_says_it_reloads_nothing(mock, weir):
    m = mock("--ttft-ms", "1", "--max-tokens", "1000")
    cfg = {"server": {"drain_timeout": "60s"}, "pools": {"p": {"endpoints": [m.base_url]}},
           "models": {"mock-model": {"pool": "p"}}}
    w = weir(config=cfg)
    stream = start_stream(w, tokens=1000, itl_ms=20, request_id="held")
    next(stream.iter_chunks())
    os.kill(w.process.pid, signal.SIGTERM)
    wait_until(lambda: "draining" in w.process.log(), 5, message="the drain began")
    write(w, {**cfg, "server": {"drain_timeout": "1s"}})
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: "SIGHUP received while draining: the configuration is not reloaded" in w.process.log(), 5,
               message="the line that says the SIGHUP reloaded nothing")
    assert "configuration reloaded" not in w.process.log()
    os.kill(w.process.pid, signal.SIGTERM)  # the second signal ends the drain at once
    assert w.process.popen.wait(10) == 0
