"""`weir --check` validates exactly what start-up does (issue 8, defect 5):
auth:, tenants:, pricing: and redis: too, through the one loader; errors
name the file, line and key and exit 2; warnings go to stderr and exit 0.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess

import httpx
import pytest

from conftest import binary, free_port

SHA = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

BASE = """\
listen: 127.0.0.1:{port}
pools:
  p:
    endpoints: [http://127.0.0.1:9]
models:
  m: {{pool: p, aliases: [mm]}}
"""

# (name, extra yaml after BASE's 6 lines, line, key): exit 2 naming file:line and key.
BAD = [
    ("auth-unknown-key", "auth:\n  requird: true\n", 8, "auth.requird"),
    ("tenants-wrong-type", "tenants:\n  acme:\n    priority: high\n", 9, "tenants.acme.priority"),
    ("undefined-tenant",
     f"tenants:\n  acme: {{}}\nauth:\n  api_keys:\n    - {{id: k, sha256: {SHA}, tenant: ghost}}\n", 11,
     "auth.api_keys[0].tenant"),
    ("malformed-sha256", "tenants:\n  acme: {}\nauth:\n  api_keys:\n    - {id: k, sha256: abc123, tenant: acme}\n", 11,
     "auth.api_keys[0].sha256"),
    ("unset-key-env",
     "tenants:\n  acme: {}\nauth:\n  api_keys:\n    - {id: k, key_env: WEIR_TEST_UNSET_KEY, tenant: acme}\n", 11,
     "auth.api_keys[0].key_env"),
    ("invalid-pricing", "pricing:\n  m: {input: cheap}\n", 8, "pricing.m.input"),
    ("pricing-unknown-key", "pricing:\n  m: {inptu: 1}\n", 8, "pricing.m.inptu"),
    ("invalid-redis-url", "redis:\n  url: http://127.0.0.1:6379\n", 8, "redis.url"),
    ("redis-with-auth", "tenants:\n  acme: {}\nredis:\n  url: redis://u:pw@127.0.0.1:6379\n", 10, "redis.url"),
    ("limits-top-level", "limits:\n  requests_per_minute: 5\n", 7, "limits"),
    ("batching-top-level", "batching:\n  window: 5ms\n", 7, "batching"),
    ("budget-period-word", "tenants:\n  acme:\n    budget: {usd: 1, period: fortnight}\n", 9,
     "tenants.acme.budget.period"),
    ("budget-utc-offset-zone", "auth:\n  budget_utc_offset: Europe/Paris\n", 8, "auth.budget_utc_offset"),
    # vk_<hex> names the admin API's keys: a configured one would shadow a runtime key.
    # "*" labels the models default_pool serves: a model of that name repeated those series (defect, stop 43).
    ("model-named-star", "  '*': {pool: p}\n", 7, "models"),
    # Empty names (as an empty model name already was).
    ("tenant-name-empty", "tenants:\n  '': {}\n", 8, "tenants"),
    ("anonymous-tenant-empty", "tenants:\n  acme: {}\nauth:\n  anonymous_tenant: ''\n", 10, "auth.anonymous_tenant"),
    ("key-id-reserved-prefix",
     f"tenants:\n  acme: {{}}\nauth:\n  api_keys:\n    - {{id: vk_0123abcd, sha256: {SHA}, tenant: acme}}\n", 11,
     "auth.api_keys[0].id"),
]


def weir_run(*args, timeout=10, env=None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "WEIR_TEST_UNSET_KEY"}
    full.update(env or {})
    return subprocess.run([str(binary("weir")), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=full)


@pytest.mark.parametrize("name,extra,line,key", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_invalid_sections_exit_2_naming_file_line_and_key(tmp_path, name, extra, line, key, check):
    path = tmp_path / f"{name}.yaml"
    port = free_port()
    path.write_text(BASE.format(port=port) + extra)
    r = weir_run("--config", path, *(["--check"] if check else []))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{path}:{line}:" in r.stderr, r.stderr
    assert f" {key}: " in r.stderr, r.stderr
    assert "ok" not in r.stdout
    with pytest.raises(OSError):  # it never listened
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()


def test_warnings_exit_0_and_are_printed_by_check_and_start_up(tmp_path, processes):
    path = tmp_path / "warn.yaml"
    port = free_port()
    path.write_text(BASE.format(port=port) + (
        "tenants:\n  acme: {models: [m, nope]}\n"
        "  alias: {models: [mm]}\n"
        f"auth:\n  api_keys:\n    - {{id: k, sha256: {SHA}, tenant: acme, models: [missing]}}\n"
        "pricing:\n  ghost: {input: 1}\n"))
    r = weir_run("--config", path, "--check")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{path}: ok ("), r.stdout
    lines = [l for l in r.stderr.splitlines() if l.startswith("weir: warning: ")]
    # (The last: tenants' /metrics on the client port, without an admin listener: test_tenancy_52.)
    assert len(lines) == 5 and "GET /metrics on the client port" in lines[4], r.stderr
    assert f"{path}:8:" in lines[0] and "tenants.acme.models[1]" in lines[0] and '"nope"' in lines[0], lines[0]
    assert "tenants.alias.models[0]" in lines[1] and 'alias of model "m"' in lines[1], lines[1]
    assert f"{path}:12:" in lines[2] and "auth.api_keys[0].models[0]" in lines[2], lines[2]
    assert f"{path}:14:" in lines[3] and "pricing.ghost" in lines[3], lines[3]
    # start-up prints the same warnings, then serves
    proc = processes.start([binary("weir"), "--config", path], port, name="weir")
    log = proc.log()
    for line in lines:
        assert line in log, log


def test_a_lone_redis_section_is_checked_and_warned_about(tmp_path):
    path = tmp_path / "redis.yaml"
    path.write_text(BASE.format(port=free_port()) + "redis:\n  url: redis://127.0.0.1:6379\n")
    r = weir_run("--config", path, "--check")
    assert r.returncode == 0, r.stderr
    assert "weir: warning: " in r.stderr and " redis: " in r.stderr, r.stderr


def test_a_zero_limit_is_warned_about_it_means_no_limit(tmp_path):
    # budget usd: 0 freezes a scope and other gateways' rpm 0 refuses everything; Weir's limit 0 is none.
    path = tmp_path / "zero.yaml"
    path.write_text(BASE.format(port=free_port()) + (
        "tenants:\n  acme: {limits: {requests_per_minute: 0, tokens_per_minute: 10}}\n"
        f"auth:\n  api_keys:\n    - {{id: k, sha256: {SHA}, tenant: acme, limits: {{max_concurrent_streams: 0}}}}\n"))
    r = weir_run("--config", path, "--check")
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("weir: warning: ") and "/metrics" not in l]
    assert len(lines) == 2, r.stderr
    assert "tenants.acme.limits.requests_per_minute: 0 means no limit" in lines[0], lines
    assert "auth.api_keys[0].limits.max_concurrent_streams: 0 means no limit" in lines[1], lines


def test_key_env_set_passes_check(tmp_path):
    path = tmp_path / "env.yaml"
    path.write_text(BASE.format(port=free_port()) + (
        "tenants:\n  acme: {}\nauth:\n  api_keys:\n    - {id: k, key_env: WEIR_TEST_UNSET_KEY, tenant: acme}\n"))
    assert weir_run("--config", path, "--check").returncode == 2
    r = weir_run("--config", path, "--check", env={"WEIR_TEST_UNSET_KEY": "sk-test"})
    assert r.returncode == 0, r.stderr
    # (Nothing but the note that tenants' /metrics is on the client port, without an admin listener.)
    assert [l for l in r.stderr.splitlines() if "/metrics" not in l] == [], r.stderr


KEYS_FILE_CONFIG = """\
tenants:
  acme: {{}}
admin:
  listen: 127.0.0.1:{admin_port}
  token_env: WEIR_TEST_ADMIN_TOKEN
  keys_file: {keys_file}
"""

# (name, keys file content, what the error says)
BAD_KEYS_FILES = [
    ("bad-sha256", '{"version":1,"keys":[{"id":"vk_1","sha256":"zz","tenant":"acme"}]}', "keys[0]"),
    ("not-json", "{not json", "not a Weir keys file"),
    ("no-keys", '{"version":1}', "not a Weir keys file"),
    ("string-limit",
     '{"version":1,"keys":[{"id":"vk_1","sha256":"' + SHA + '","tenant":"acme",'
     '"limits":{"requests_per_minute":"60"}}]}', "limits.requests_per_minute"),
]


@pytest.mark.parametrize("name,content,says", BAD_KEYS_FILES, ids=[b[0] for b in BAD_KEYS_FILES])
def test_a_corrupt_keys_file_is_a_configuration_error_for_check_and_start_up(tmp_path, name, content, says):
    keys = tmp_path / "keys.json"
    keys.write_text(content)
    path = tmp_path / "keys.yaml"
    port = free_port()
    path.write_text(BASE.format(port=port) + KEYS_FILE_CONFIG.format(admin_port=free_port(), keys_file=keys))
    env = {"WEIR_TEST_ADMIN_TOKEN": "admin-test-token-0123456789"}
    for args in (["--check"], []):
        r = weir_run("--config", path, *args, env=env)
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        assert "weir: configuration error: " in r.stderr, r.stderr
        assert f"admin.keys_file {keys}" in r.stderr and says in r.stderr, r.stderr
        assert "ok" not in r.stdout
    # --check reads the file and does not write it.
    assert keys.read_text() == content
    with pytest.raises(OSError):  # start-up never listened
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()


def test_a_valid_or_missing_keys_file_passes_check(tmp_path):
    keys = tmp_path / "keys.json"
    path = tmp_path / "keys.yaml"
    path.write_text(BASE.format(port=free_port()) + KEYS_FILE_CONFIG.format(admin_port=free_port(), keys_file=keys))
    env = {"WEIR_TEST_ADMIN_TOKEN": "admin-test-token-0123456789"}
    r = weir_run("--config", path, "--check", env=env)
    assert r.returncode == 0, r.stderr
    assert not keys.exists(), "--check must not create the keys file"
    content = ('{"version":1,"keys":[{"id":"vk_1","sha256":"' + SHA + '","tenant":"acme",'
               '"limits":{"requests_per_minute":60},"budget":{"usd":2.5E1,"period":"3600s"},"expires_at":null}]}')
    keys.write_text(content)
    r = weir_run("--config", path, "--check", env=env)
    assert r.returncode == 0, r.stderr
    assert keys.read_text() == content


def test_an_empty_allow_list_allows_no_model_and_says_so(tmp_path, processes):
    # `models: []` locks a tenant or key out (it never falls back to every model), with a warning.
    path = tmp_path / "empty.yaml"
    port = free_port()
    key = "sk-empty-list"
    digest = hashlib.sha256(key.encode()).hexdigest()
    other = "sk-open-tenant"
    path.write_text(BASE.format(port=port) + (
        "tenants:\n  locked: {models: []}\n  open: {}\n"
        f"auth:\n  api_keys:\n    - {{id: k1, sha256: {digest}, tenant: open, models: []}}\n"
        f"    - {{id: k2, sha256: {hashlib.sha256(other.encode()).hexdigest()}, tenant: open}}\n"
        f"    - {{id: k3, sha256: {SHA}, tenant: locked}}\n"))
    r = weir_run("--config", path, "--check")
    assert r.returncode == 0, r.stderr
    warns = [l for l in r.stderr.splitlines() if l.startswith("weir: warning: ")]
    assert any("tenants.locked.models" in l and "allows no model" in l for l in warns), r.stderr
    assert any("auth.api_keys[0].models" in l and "allows no model" in l for l in warns), r.stderr
    processes.start([binary("weir"), "--config", path], port, name="weir")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    base = f"http://127.0.0.1:{port}/v1"
    # (A model the key or tenant may not use is answered as an unknown one: 404.)
    for k, want in ((key, 404), ("foo", 404)):   # SHA is sha256("foo"): the locked tenant's key
        r = httpx.post(base + "/chat/completions", json=body, headers={"authorization": f"Bearer {k}"}, timeout=10)
        assert r.status_code == want, r.text
    r = httpx.get(base + "/models", headers={"authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200 and r.json()["data"] == [], r.text
    # The open tenant (no list) keeps every model: it is refused only by its upstream (port 9: nothing listens).
    r = httpx.get(base + "/models", headers={"authorization": f"Bearer {other}"}, timeout=10)
    assert [d["id"] for d in r.json()["data"]] == ["m", "mm"], r.text


def test_a_keys_file_id_that_a_configured_key_also_has_is_refused(tmp_path):
    # One id, two keys: logs and metrics could not tell them apart, and the admin API could not revoke the
    # runtime one (it found the read-only configured key first).
    keys = tmp_path / "keys.json"
    content = '{"version":1,"keys":[{"id":"ci","sha256":"' + SHA + '","tenant":"acme"}]}'
    keys.write_text(content)
    path = tmp_path / "keys.yaml"
    other = hashlib.sha256(b"sk-config").hexdigest()
    path.write_text(BASE.format(port=free_port()) + KEYS_FILE_CONFIG.format(admin_port=free_port(), keys_file=keys)
                    + f"auth:\n  api_keys:\n    - {{id: ci, sha256: {other}, tenant: acme}}\n")
    env = {"WEIR_TEST_ADMIN_TOKEN": "admin-test-token-0123456789"}
    for args in (["--check"], []):
        r = weir_run("--config", path, *args, env=env)
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        assert "id 'ci' is also a configured key's" in r.stderr, r.stderr


# (name, server.listen host, admin.listen host, admin on the client's port, what the error says)
LISTENERS = [
    # Another spelling of the client's own address is the client's listener (start-up's bind said "already
    # in use by another process", and --check passed). "127.1" resolves (inet_aton) to 127.0.0.1.
    ("admin-name-of-client-address", "127.0.0.1", "127.1", True, "admin.listen: 127.1:"),
    ("client-name-of-admin-address", "127.1", "127.0.0.1", True, "admin.listen: 127.0.0.1:"),
    ("client-host-unresolvable", "weir-no-such-host.invalid", "127.0.0.1", False,
     'listen: cannot resolve listen host "weir-no-such-host.invalid"'),
    ("admin-host-unresolvable", "127.0.0.1", "weir-no-such-host.invalid", False,
     'admin.listen: cannot resolve listen host "weir-no-such-host.invalid"'),
]


@pytest.mark.parametrize("name,client,admin,same_port,says", LISTENERS, ids=[l[0] for l in LISTENERS])
def test_listen_addresses_are_checked_by_check_and_start_up_alike(tmp_path, name, client, admin, same_port, says):
    port = free_port()
    admin_port = port if same_port else free_port()
    path = tmp_path / "listen.yaml"
    path.write_text(BASE.format(port=port).replace("127.0.0.1:", f"{client}:", 1) +
                    f"admin:\n  listen: {admin}:{admin_port}\n  token_env: WEIR_TEST_ADMIN_TOKEN\n")
    env = {"WEIR_TEST_ADMIN_TOKEN": "admin-test-token-0123456789"}
    for args in (["--check"], []):
        r = weir_run("--config", path, *args, env=env)
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        assert f"weir: configuration error: {path}: " + says in r.stderr, r.stderr
        assert "ok" not in r.stdout
    with pytest.raises(OSError):  # start-up never listened
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()


def test_an_admin_listener_on_its_own_port_of_a_named_host_passes_check(tmp_path):
    path = tmp_path / "listen.yaml"
    path.write_text(BASE.format(port=free_port()) +
                    f"admin:\n  listen: 127.1:{free_port()}\n  token_env: WEIR_TEST_ADMIN_TOKEN\n")
    r = weir_run("--config", path, "--check", env={"WEIR_TEST_ADMIN_TOKEN": "admin-test-token-0123456789"})
    assert r.returncode == 0, r.stderr
