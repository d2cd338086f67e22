"""Configuration reloads (docs/operations.md, "Reloading") with real weir and weir-mock processes:
SIGHUP (and server.watch_config) applies a changed file on every worker, a bad file or a change that
needs a restart is refused with its file:line:key reason while the running configuration keeps
serving, a stream in flight across a reload completes untouched on the configuration it started with,
and runtime keys and admission state survive."""

from __future__ import annotations

import json
import os
import signal

import httpx
import openai
import pytest

from conftest import connections_to, free_port, to_yaml, wait_until

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")
MSG = [{"role": "user", "content": "hello"}]
TOKEN = "admin-reload-token-0123456789"


def write(w, cfg: dict, workers: int = 2) -> None:
    """Replaces the weir's configuration file with `cfg` (atomically, as an editor or a ConfigMap does)."""
    full = json.loads(json.dumps(cfg))
    full.setdefault("listen", f"127.0.0.1:{w.port}")
    full.setdefault("workers", workers)
    full.setdefault("server", {}).setdefault("access_log", str(w.access_log_path))
    tmp = w.config_path.with_suffix(".next")
    tmp.write_text(to_yaml(full) + "\n")
    os.replace(tmp, w.config_path)


def reloads(w, result: str) -> float:
    return w.metric("weir_config_reloads_total", result=result)


def sighup(w, expect: str = "success") -> None:
    """SIGHUP, then waits until the reload was counted with `expect`."""
    w.sighup(expect)


def status(w, model: str, **kw) -> int:
    return httpx.post(w.v1 + "/chat/completions", json={"model": model, "messages": MSG, **kw}, timeout=10).status_code


def two_pools(a, b=None) -> dict:
    cfg = {"pools": {"a": {"endpoints": [a.base_url]}},
           "models": {"m1": {"pool": "a", "upstream_model": "mock-model"}}}
    if b is not None:
        cfg["pools"]["b"] = {"endpoints": [b.base_url]}
        cfg["models"]["m2"] = {"pool": "b", "upstream_model": "mock-model", "aliases": ["m2-alias"]}
    return cfg


def test_sighup_applies_new_pools_models_and_aliases_and_counts_it(mock, weir):
    a, b = mock(*FAST), mock(*FAST)
    w = weir(config=two_pools(a))
    assert status(w, "m1") == 200
    assert status(w, "m2") == 404
    assert w.metric("weir_config_generation") == 1
    assert w.metric("weir_config_last_reload_success_timestamp_seconds") > 0
    write(w, two_pools(a, b))
    sighup(w)
    # Every worker has it: ask enough times that both workers answer.
    for _ in range(8):
        assert status(w, "m2") == 200
        assert status(w, "m2-alias") == 200
    assert b.metric("vllm:request_success_total") == 16
    assert w.metric("weir_config_generation") == 2
    assert w.metric("weir_config_last_reload_successful") == 1
    assert "configuration reloaded from" in w.process.log() and "pools +b" in w.process.log()
    # /v1/models lists the new model; its metric series appear.
    ids = [m.id for m in w.client().models.list().data]
    assert "m2" in ids and "m2-alias" in ids
    assert w.metric("weir_requests_total", model="m2", status="200") == 16  # the alias counts as its model


def test_a_bad_file_is_refused_with_its_reason_and_the_old_configuration_serves_on(mock, weir):
    a = mock(*FAST)
    w = weir(config=two_pools(a))
    good = w.config_path.read_text()
    # A wrong type, with its file, line and key.
    bad = two_pools(a)
    bad["pools"]["a"]["timeouts"] = {"idle": "soon"}
    bad["models"]["m3"] = {"pool": "a"}
    write(w, bad)
    sighup(w, "failure")
    log = w.process.log()
    assert f"{w.config_path}:" in log and "pools.a.timeouts.idle" in log and "configuration reload refused" in log
    assert status(w, "m1") == 200
    assert status(w, "m3") == 404  # nothing of the refused file applied
    assert w.metric("weir_config_last_reload_successful") == 0
    assert w.metric("weir_config_generation") == 1
    # Not YAML at all.
    w.config_path.write_text("pools: [unclosed\n")
    sighup(w, "failure")
    assert "YAML syntax error" in w.process.log()
    assert status(w, "m1") == 200
    # A good file again: applied.
    w.config_path.write_text(good.replace('"m1":', '"m9":'))
    sighup(w)
    assert status(w, "m9") == 200 and status(w, "m1") == 404
    assert w.metric("weir_config_last_reload_successful") == 1


def test_a_change_that_needs_a_restart_is_refused_whole_naming_the_key(mock, weir):
    a = mock(*FAST)
    w = weir(config=two_pools(a))
    nxt = two_pools(a)
    nxt["models"]["m3"] = {"pool": "a", "upstream_model": "mock-model"}
    nxt["listen"] = f"127.0.0.1:{free_port()}"
    write(w, nxt)
    sighup(w, "failure")
    log = w.process.log()
    assert "listen: changes only at restart" in log, log[-2000:]
    assert status(w, "m3") == 404  # the rest of the file was not applied either
    nxt = two_pools(a)
    nxt["workers"] = 3
    write(w, nxt)
    sighup(w, "failure")
    assert "workers: changes only at restart" in w.process.log()
    assert status(w, "m1") == 200


def test_a_restart_only_key_spelled_with_its_running_value_reloads(mock, weir):
    # A file that writes out a restart-only key's default (or the value it already has) changes nothing:
    # the reload was refused and weir_config_last_reload_successful dropped to 0.
    a = mock(*FAST)
    w = weir(config=two_pools(a))
    for server in ({"reuse_port": False}, {"metrics": {"tenant_label": True, "max_tenants": 100}},
                   {"metrics": {"client_port": True}}):
        nxt = two_pools(a)
        nxt["models"]["m3"] = {"pool": "a", "upstream_model": "mock-model"}
        nxt["server"] = dict(server)
        write(w, nxt)
        sighup(w, "success")
        assert status(w, "m3") == 200
    # A real change is still refused.
    nxt = two_pools(a)
    nxt["server"] = {"metrics": {"tenant_label": False}}
    write(w, nxt)
    sighup(w, "failure")
    refused = [line for line in w.process.log().splitlines() if "changes only at restart" in line]
    assert refused and "server.metrics" in refused[-1], refused


def test_a_stream_in_flight_across_a_reload_completes_untouched(mock, weir):
    slow = mock("--ttft-ms", "1", "--itl-ms", "15", "--max-tokens", "40")
    other = mock(*FAST)
    reference = mock("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "40")
    w = weir(config=two_pools(slow))
    want = "".join(c.choices[0].delta.content or "" for c in openai.OpenAI(
        base_url=reference.v1, api_key="x").chat.completions.create(model="mock-model", messages=MSG, stream=True)
        if c.choices)
    stream = w.client().chat.completions.create(model="m1", messages=MSG, stream=True,
                                                extra_headers={"x-request-id": "across-reload"})
    text, chunks = "", 0
    for c in stream:
        chunks += 1
        if c.choices:
            text += c.choices[0].delta.content or ""
        if text:
            break
    # Mid-stream: pool a and model m1 go away, b and m2 come.
    cfg = two_pools(other)
    del cfg["pools"]["a"]
    cfg["pools"]["b"] = {"endpoints": [other.base_url]}
    cfg["models"] = {"m2": {"pool": "b", "upstream_model": "mock-model"}}
    write(w, cfg)
    sighup(w)
    assert status(w, "m1") == 404 and status(w, "m2") == 200
    for c in stream:
        if c.choices:
            text += c.choices[0].delta.content or ""
    assert text == want  # nothing lost, nothing repeated
    entry = w.log_for("across-reload")
    assert entry["status"] == 200 and entry["pool"] == "a" and entry["model"] == "m1"
    assert entry["completion_tokens"] == 40
    # The removed endpoint's connection closes once its last request is done.
    wait_until(lambda: connections_to(slow.process.port) == 0, 5, message="connections to the removed endpoint closed")


def test_an_open_breaker_stays_open_when_a_reload_changes_its_pool(mock, weir):
    live = mock(*FAST)
    dead = f"http://127.0.0.1:{free_port()}"
    pool = {"endpoints": [dead], "eject_for": "60s", "breaker": {}}
    cfg = {"pools": {"a": pool}, "models": {"m1": {"pool": "a", "upstream_model": "mock-model"}}}
    w = weir(config=cfg, workers=1)
    assert status(w, "m1") == 502  # refused: its breaker opens
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "m1", "messages": MSG}, timeout=10)
    assert r.status_code == 503 and "circuit breaker is open" in r.text, r.text
    assert httpx.get(w.base_url + "/ready").status_code == 503
    # The pool changes (a live endpoint joins): the dead one keeps its open breaker in the new pool.
    write(w, {"pools": {"a": {**pool, "endpoints": [dead, live.base_url]}}, "models": cfg["models"]}, workers=1)
    sighup(w)
    assert w.metric("weir_upstream_endpoint_state", endpoint=dead, state="open") == 1  # before any request
    for _ in range(6):
        assert status(w, "m1") == 200
    assert live.metric("vllm:request_success_total") == 6
    assert w.metric("weir_upstream_attempts_total", endpoint=dead) == 1, "nothing more went to the open endpoint"
    assert w.metric("weir_upstream_ejections_total", endpoint=dead, cause="connect") == 1
    assert httpx.get(w.base_url + "/ready").status_code == 200


def test_watch_config_reloads_on_a_file_change_and_not_again_for_a_refused_one(mock, weir):
    a, b = mock(*FAST), mock(*FAST)
    cfg = two_pools(a)
    cfg["server"] = {"watch_config": "100ms"}
    w = weir(config=cfg)
    nxt = two_pools(a, b)
    nxt["server"] = {"watch_config": "100ms"}
    write(w, nxt)
    wait_until(lambda: status(w, "m2") == 200, 10, message="the watched file's new model")
    assert "the configuration file changed: configuration reloaded" in w.process.log()
    bad = two_pools(a, b)
    bad["server"] = {"watch_config": "100ms", "max_body": "huge"}
    write(w, bad)
    wait_until(lambda: reloads(w, "failure") == 1, 10, message="the bad file refused")
    # Looked at again and again, the same bad file is not tried again.
    wait_until(lambda: "server.max_body" in w.process.log(), 5)
    before = w.process.log().count("configuration reload refused")
    nxt["models"]["m3"] = {"pool": "b", "upstream_model": "mock-model"}
    write(w, nxt)
    wait_until(lambda: status(w, "m3") == 200, 10, message="the next good file")
    assert w.process.log().count("configuration reload refused") == before
    assert reloads(w, "failure") == 1 and reloads(w, "success") == 2


def admin_config(mock, admin_port: int, rpm_a: int) -> dict:
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "mock-model", "default_max_tokens": 8}},
        "tenants": {"a": {"limits": {"requests_per_minute": rpm_a}}, "b": {"limits": {"requests_per_minute": 2}}},
        "auth": {"required": True,
                 "api_keys": [{"id": "b-cfg", "tenant": "b",
                               "sha256": "5a4e5b1a1ad5bd4a2b8a3c6de3a4e6c9e1c9b95d5d2e6c0b0f45f1a3a1d2c3b4"}]},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_RELOAD_ADMIN_TOKEN"},
    }


def test_runtime_keys_survive_and_bucket_levels_carry_over(mock, weir):
    a = mock(*FAST)
    port = free_port()
    w = weir(config=admin_config(a, port, 3), env={"WEIR_RELOAD_ADMIN_TOKEN": TOKEN}, workers=1)
    admin = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(admin + "/ready").status_code == 200, 5, message="admin listener")
    auth = {"authorization": f"Bearer {TOKEN}"}
    key_a = httpx.post(admin + "/admin/v1/keys", json={"tenant": "a"}, headers=auth).json()["key"]
    key_b = httpx.post(admin + "/admin/v1/keys", json={"tenant": "b"}, headers=auth).json()["key"]

    def chat(key: str) -> int:
        return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=10,
                          json={"model": "m", "messages": MSG}).status_code

    assert [chat(key_a) for _ in range(3)] == [200, 200, 200]  # tenant a's bucket (3) is empty now
    assert chat(key_b) == 200  # b has 1 of 2 left
    # a's limit goes up to 4 a minute: its bucket carries over (empty), it does not refill to 4.
    write(w, admin_config(a, port, 4), workers=1)
    sighup(w)
    assert chat(key_a) == 429  # the runtime key still works, and its tenant's bucket is still empty
    assert chat(key_b) == 200  # b unchanged: same state (its last request)
    assert chat(key_b) == 429
    keys = httpx.get(admin + "/admin/v1/keys", headers=auth).json()["data"]
    assert sorted(k.get("source") for k in keys) == ["admin", "admin", "config"]
    tenant_a = httpx.get(admin + "/admin/v1/tenants/a", headers=auth).json()
    assert tenant_a["limits"]["requests_per_minute"] == 4


def test_a_reload_refuses_a_configured_key_with_a_runtime_keys_secret(mock, weir):
    # The operator adds to auth.api_keys a key (tenant a) whose secret is a runtime key's (tenant b): start-up
    # and --check refuse that pair; a reload accepted it, and the runtime key's holder became tenant a.
    import hashlib
    a = mock(*FAST)
    port = free_port()
    cfg = admin_config(a, port, 100)
    w = weir(config=cfg, env={"WEIR_RELOAD_ADMIN_TOKEN": TOKEN}, workers=1)
    admin = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(admin + "/ready").status_code == 200, 5, message="admin listener")
    auth = {"authorization": f"Bearer {TOKEN}"}
    secret = httpx.post(admin + "/admin/v1/keys", json={"tenant": "b"}, headers=auth).json()["key"]
    cfg["auth"]["api_keys"].append({"id": "a-cfg", "tenant": "a", "sha256": hashlib.sha256(secret.encode()).hexdigest()})
    write(w, cfg, workers=1)
    sighup(w, "failure")
    r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {secret}", "x-request-id": "rt"},
                   json={"model": "m", "messages": MSG}, timeout=10)
    assert r.status_code == 200, r.text
    assert w.log_for("rt")["tenant"] == "b"


def test_restart_only_sections_spelled_with_their_running_values_reload(mock, weir, tmp_path):
    # As for server.*: auth's restart-only keys, request_log, tracing, admin and redis are compared parsed. A
    # written-out default (key_cache_ttl: 30s, request_log.queue: 4096), or the same value written another
    # way (+00:00 for Z, 0.1s for 100ms), was refused as a change that needs a restart.
    a = mock(*FAST)
    db = tmp_path / "requests.db"
    base = two_pools(a)
    base["tenants"] = {"t": {}}
    base["auth"] = {"required": False, "anonymous_tenant": "t", "budget_utc_offset": "Z"}
    base["request_log"] = {"url": f"sqlite:{db}", "flush_interval": "100ms"}
    w = weir(config=base)
    spelled = [
        ("auth", {"budget_utc_offset": "+00:00"}),
        ("auth", {"key_cache_ttl": "30s", "key_negative_ttl": "5s", "redis_keys": False}),
        ("request_log", {"queue": 4096, "flush_interval": "0.1s"}),
    ]
    for n, (section, values) in enumerate(spelled):
        nxt = json.loads(json.dumps(base))
        nxt["models"][f"m{n + 3}"] = {"pool": "a", "upstream_model": "mock-model"}
        nxt[section].update(values)
        write(w, nxt)
        sighup(w, "success")
        assert status(w, f"m{n + 3}") == 200
    nxt = json.loads(json.dumps(base))
    nxt["request_log"]["queue"] = 100
    write(w, nxt)
    sighup(w, "failure")
    refused = [line for line in w.process.log().splitlines() if "changes only at restart" in line]
    assert refused and "request_log" in refused[-1], refused


def test_a_refused_restart_only_key_is_named_at_its_own_line(mock, weir, tmp_path):
    # The refusal named the key but gave the line of its section's first key.
    a = mock(*FAST)
    base = two_pools(a)
    base["request_log"] = {"url": f"sqlite:{tmp_path / 'r.db'}", "retention": {"max_rows": 1000}}
    w = weir(config=base)
    nxt = json.loads(json.dumps(base))
    nxt["request_log"]["retention"]["max_rows"] = 50
    write(w, nxt)
    sighup(w, "failure")
    lines = w.config_path.read_text().splitlines()
    refused = [line for line in w.process.log().splitlines() if "changes only at restart" in line][-1]
    import re
    m = re.search(r":(\d+):(\d+): request_log\.retention\.max_rows", refused)
    assert m, refused
    assert "max_rows" in lines[int(m.group(1)) - 1], (refused, lines)
