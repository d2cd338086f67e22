"""Operations as the documentation has them: a zero-downtime restart with admin: configured, a configuration
read from a pipe and SIGHUP, ${VAR} left in the file, the admin API's /ready during a drain, its numbers, a
key's unknown created_at, /v1/models/, --help."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess

import httpx

from conftest import binary, free_port, to_yaml, wait_until
from httpwire import RawConn, request

TOKEN = "ops-admin-token-0123456789abcdef"
ENV = {"WEIR_OPS_ADMIN": TOKEN}
AUTH = {"authorization": f"Bearer {TOKEN}"}


def admin_config(m, aport: int, **extra) -> dict:
    return {"server": {"drain_timeout": "30s"}, "pools": {"p": {"endpoints": [m.base_url]}},
            "models": {"mock-model": {"pool": "p"}},
            "admin": {"listen": f"127.0.0.1:{aport}", "token_env": "WEIR_OPS_ADMIN"}, **extra}


def start_stream(port: int, request_id: str) -> RawConn:
    conn = RawConn(port, timeout=30)
    conn.send(request("POST", "/v1/chat/completions",
                      {"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "stream": True,
                       "max_tokens": 400},
                      {"x-mock-itl-ms": "50", "x-request-id": request_id}))
    assert conn.read_head().status == 200
    return conn


def admin_ready(aport: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{aport}/ready", headers={"connection": "close"}, timeout=10)


def admin_up(aport: int) -> bool:
    try:
        return admin_ready(aport).status_code == 200
    except httpx.TransportError:
        return False


# --- 1. --reuse-port with admin: ----------------------------------------------------------------------------------

def test_a_restart_with_reuse_port_shares_the_admin_port_and_the_draining_one_hands_it_over(mock, weir, processes):
    # The new instance could not bind admin.listen (Address already in use) while the old one ran.
    m = mock()
    aport = free_port()
    old = weir(config=admin_config(m, aport), workers=1, env=ENV)
    wait_until(lambda: admin_up(aport), 5, message="the old instance's admin listener")
    stream = start_stream(old.port, "held-by-the-old-one")  # keeps the old one draining
    new = processes.start([binary("weir"), "--config", old.config_path, "--reuse-port"], old.port,
                          name="weir-new", env=ENV)
    wait_until(lambda: "listening on" in new.log() or not new.alive(), 10, message="the new instance's start-up")
    assert new.alive(), new.log()
    assert "admin API on" in new.log(), new.log()

    os.kill(old.process.pid, signal.SIGTERM)
    wait_until(lambda: "admin API closed" in old.process.log(), 5, message="the old instance's admin hand-over")
    assert old.process.alive()  # still draining its stream
    # Every new admin connection now reaches the new instance (the draining one would answer 503).
    for _ in range(20):
        r = admin_ready(aport)
        assert r.status_code == 200, r.text
    stream.close()


def test_without_reuse_port_a_taken_admin_port_is_refused_by_name(mock, weir):
    m = mock()
    aport = free_port()
    weir(config=admin_config(m, aport), workers=1, env=ENV)
    wait_until(lambda: admin_up(aport), 5, message="admin listener")
    cfg = admin_config(m, aport)
    cfg["listen"] = f"127.0.0.1:{free_port()}"
    cfg["server"]["access_log"] = "off"
    r = subprocess.run([str(binary("weir")), "--config", "/dev/stdin"], input=to_yaml(cfg), capture_output=True,
                       text=True, timeout=10, env={**os.environ, **ENV})
    assert r.returncode == 1, r.stderr
    assert f"admin.listen: 127.0.0.1:{aport} is already in use by another process" in r.stderr, r.stderr
    assert "--reuse-port" in r.stderr


# --- 2. a configuration read from a pipe -----------------------------------------------------------------------

def pipe_config(m, port: int, access_log, **server) -> str:
    return to_yaml({"listen": f"127.0.0.1:{port}", "workers": 1,
                    "server": {"access_log": str(access_log), **server},
                    "pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p"})


def test_sighup_with_a_piped_configuration_reopens_the_log_and_is_no_refused_reload(mock, processes, tmp_path):
    # Every SIGHUP was "configuration reload refused: /dev/fd/63: the configuration must be a YAML mapping",
    # and weir_config_last_reload_successful went to 0 (the logrotate setup set off the reload alert).
    m = mock()
    port = free_port()
    log = tmp_path / "access.log"
    src = tmp_path / "weir.yaml"
    src.write_text(pipe_config(m, port, log))
    w = processes.start(["bash", "-c", f"exec {binary('weir')} -c <(cat {src})"], port, name="weir-pipe")
    httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    wait_until(lambda: log.exists() and log.read_text(), 5, message="an access-log line")
    os.rename(log, tmp_path / "access.log.1")
    for n in (1, 2):
        os.kill(w.pid, signal.SIGHUP)
        wait_until(lambda: w.log().count("reopened") == n, 5, message=f"SIGHUP {n}'s reopen")
    out = w.log()
    assert out.count("the configuration is not read again") == 1, out  # said once
    assert "refused" not in out, out
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert re.search(r"^weir_config_last_reload_successful 1$", metrics, re.M), metrics
    assert re.search(r'^weir_config_reloads_total\{result="failure"\} 0$', metrics, re.M), metrics
    httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    wait_until(lambda: log.exists() and log.read_text(), 5, message="a line in the new access log")


def test_watch_config_on_a_piped_configuration_is_refused(mock, tmp_path):
    m = mock()
    src = tmp_path / "weir.yaml"
    src.write_text(pipe_config(m, free_port(), "off", watch_config=True))
    for check in (["--check"], []):
        r = subprocess.run(["bash", "-c", f"exec {binary('weir')} -c <(cat {src}) {' '.join(check)}"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2, r.stderr
        assert "server.watch_config: the configuration is not a regular file" in r.stderr, r.stderr


# --- 3. ${VAR} left in the file ------------------------------------------------------------------------------------

def test_an_unexpanded_variable_in_a_secret_or_url_is_refused(mock, tmp_path):
    # api_key: ${UPSTREAM_KEY} was sent upstream as "Bearer ${UPSTREAM_KEY}".
    m = mock()
    path = tmp_path / "weir.yaml"
    path.write_text(f"listen: 127.0.0.1:{free_port()}\nserver: {{access_log: \"off\"}}\n"
                    f"pools:\n  a:\n    endpoints: [{m.base_url}]\n    api_key: ${{UPSTREAM_KEY}}\ndefault_pool: a\n")
    for check in (["--check"], []):
        r = subprocess.run([str(binary("weir")), "-c", str(path), *check], capture_output=True, text=True,
                           timeout=10, env={**os.environ, "UPSTREAM_KEY": "real"})
        assert r.returncode == 2, r.stderr
        assert ("pools.a.api_key: ${UPSTREAM_KEY} is an environment variable reference" in r.stderr
                and "api_key_env: UPSTREAM_KEY" in r.stderr and "envsubst" in r.stderr), r.stderr


# --- 4. the admin API's /ready during a drain ----------------------------------------------------------------------

def test_admin_ready_while_draining_answers_as_the_client_port(mock, weir):
    m = mock()
    aport = free_port()
    w = weir(config=admin_config(m, aport), workers=1, env=ENV)
    wait_until(lambda: admin_up(aport), 5, message="admin listener")
    stream = start_stream(w.port, "keeps-it-draining")
    with httpx.Client(base_url=f"http://127.0.0.1:{aport}", timeout=10) as kept:
        assert kept.get("/ready").status_code == 200
        os.kill(w.process.pid, signal.SIGTERM)
        wait_until(lambda: "draining" in w.process.log(), 5, message="the drain")
        r = kept.get("/ready")
    assert r.status_code == 503, r.text
    assert r.json()["error"] == {"message": "Weir is draining.", "type": "server_error", "param": None,
                                 "code": "service_unavailable"}, r.text
    assert r.headers["retry-after"] == "1"
    stream.close()


# --- 5. the admin API's numbers, created_at, /v1/models/, --help ---------------------------------------------------

EXPONENT = re.compile(r"[:\[,]\s*-?[0-9.]+[eE][+-]?[0-9]")  # a JSON number in exponent form (not a hex id's "0e1")


def test_admin_numbers_are_plain_decimals_and_an_unknown_created_at_is_null(mock, weir, tmp_path):
    m = mock()
    aport = free_port()
    keys = tmp_path / "keys.json"
    # A key as scripts/weir-key or a hand writes it: no created_at.
    keys.write_text(json.dumps({"version": 1, "keys": [
        {"id": "vk_00000000000000aa", "tenant": "acme", "sha256": hashlib.sha256(b"sk-x").hexdigest()}]}))
    cfg = admin_config(m, aport, tenants={"acme": {"limits": {"requests_per_minute": 1000}}}, pricing={"*": {"input": 1.25, "output": 2.0}})
    cfg["admin"]["keys_file"] = str(keys)
    weir(config=cfg, workers=1, env=ENV)
    wait_until(lambda: admin_up(aport), 5, message="admin listener")
    base = f"http://127.0.0.1:{aport}/admin/v1"
    r = httpx.post(base + "/keys", headers=AUTH, timeout=10,
                   json={"tenant": "acme", "budget": {"usd": 25, "period": "day"}})
    assert r.status_code == 201, r.text
    assert '"usd":25.0' in r.text, r.text
    stats = httpx.get(base + "/stats", headers=AUTH, timeout=10).text
    assert '"ttft_buckets_s":[0.001,' in stats, stats
    listed = httpx.get(base + "/keys", headers=AUTH, timeout=10)
    for text in (r.text, stats, listed.text, httpx.get(base + "/tenants", headers=AUTH, timeout=10).text,
                 httpx.get(base + "/pools", headers=AUTH, timeout=10).text):
        assert not EXPONENT.search(text), text
    by_id = {k["id"]: k for k in listed.json()["data"]}
    assert by_id["vk_00000000000000aa"]["created_at"] is None, listed.text
    assert isinstance(by_id[r.json()["id"]]["created_at"], int)


def test_v1_models_with_a_trailing_slash_is_an_unknown_path(mock, weir):
    # It answered "The model `` does not exist".
    m = mock()
    w = weir(upstream=m)
    r = httpx.get(w.v1 + "/models/", timeout=10)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "not_found", r.text
    assert "/v1/models/" in r.json()["error"]["message"]


def test_help_says_upstream_takes_https_and_a_base_path():
    r = subprocess.run([str(binary("weir")), "--help"], capture_output=True, text=True, timeout=10)
    assert "https://host[:port][/base]" in r.stdout, r.stdout
