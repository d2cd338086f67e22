"""Configuration and reload fixes of stop 59.

- Aliases (*name) were bounded by the nodes they expand to only: one 100 KB value named 20,000 times stayed
  under 1,000,000 nodes and expanded to 2 GB for every reader of the file (`--check` 27 s and 1.97 GB, a SIGHUP
  reload 2.7 GB, 20,001 warning lines). The text they expand to is bounded too (16 MiB): refused at once, with
  the file, line and column, by `--check`, start-up and a reload alike. A warning about a value named through
  many aliases is said three times, then once for the rest.
- A reload that dropped the `auth:` section while `tenants:` stayed was applied: the gateway went from "401
  without a valid key" to every request admitted as the anonymous tenant, any credential unchecked. Turning
  authentication on or off is restart-only now (refused, counted, the old configuration serving on); keys
  added or removed inside `auth:` still reload. `tenants:` that no credential can name are a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess

import openai
import pytest

from conftest import binary, to_yaml, wait_until

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
MSG = [{"role": "user", "content": "hi"}]
BIG = "x" * 100_000


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bomb_text(head: str, times: int, value: str = BIG) -> str:
    """`head` and a tenant whose allow-list names one long value `times` times (an anchor, then aliases)."""
    return head + "tenants:\n  t:\n    models: [&b " + value + "".join(", *b" for _ in range(times - 1)) + "]\n"


HEAD = ("pools: {a: {endpoints: ['http://127.0.0.1:9']}}\nmodels: {m: {pool: a}}\n"
        "server: {metrics: {client_port: false}}\n")


def check(tmp_path, text: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "weir.yaml"
    cfg.write_text(text)
    return subprocess.run([binary("weir"), "--check", "-c", str(cfg)], capture_output=True, text=True, timeout=120)


# --- aliases that expand to too much text ---

@pytest.mark.parametrize("value", [BIG, "{k: [" + BIG + "]}", "{? " + BIG + " : 1}"], ids=["scalar", "subtree", "key"])
def test_a_long_value_named_by_many_aliases_is_refused_at_check(tmp_path, value):
    # 200 x 100 KB: 20 MB of text from a 100 KB file (the attack's 20,000 were 2 GB; the bound is the same).
    r = check(tmp_path, bomb_text(HEAD, 200, value))
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert f"{tmp_path / 'weir.yaml'}:6:" in r.stderr, r.stderr[:500]
    assert "aliases (*name) expand to more than 16 MiB of text" in r.stderr, r.stderr[:500]
    assert len(r.stderr.splitlines()) == 1, r.stderr[:2000]


def test_the_same_file_is_refused_at_start_up(tmp_path):
    cfg = tmp_path / "weir.yaml"
    cfg.write_text("listen: 127.0.0.1:9\n" + bomb_text(HEAD, 200))
    r = subprocess.run([binary("weir"), "-c", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert "weir: configuration error:" in r.stderr and "expand to more than 16 MiB of text" in r.stderr


def test_aliases_under_the_bound_load_and_their_warnings_are_said_a_few_times(tmp_path):
    # 1,000 x 1 KB of an allow-list entry no model matches: 1 MB, loaded; one warning per alias was 1,000 lines.
    r = check(tmp_path, bomb_text(HEAD, 1000, "y" * 1000)
              + f"auth: {{api_keys: [{{id: k, sha256: {sha('sk')}, tenant: t}}]}}\n")
    assert r.returncode == 0, r.stderr[-1000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 4, "\n".join(line[:160] for line in lines[:10])
    assert all(line.startswith("weir: warning: ") and "tenants.t.models[" in line for line in lines)
    assert "tenants.t.models[3]: the same warning as above, here and for 996 more keys that name this value " \
           "through an alias (*name)" in lines[3], lines[3][:300]


def test_a_reload_to_a_file_whose_aliases_expand_too_far_is_refused(mock, weir):
    a = mock(*FAST)
    w = weir(config=auth_config(a, [("k1", "sk-one")]))
    # The same file but for tenant t1's allow-list: nothing a restart alone could change.
    full = auth_config(a, [("k1", "sk-one")])
    del full["tenants"]
    write(w, full)
    text = w.config_path.read_text()
    w.config_path.write_text(bomb_text(text, 200).replace("tenants:\n  t:\n", "tenants:\n  t1:\n"))
    w.sighup("failure", 30)
    log = w.process.log()
    assert "configuration reload refused:" in log and "expand to more than 16 MiB of text" in log, log[-1500:]
    assert w.metric("weir_config_generation") == 1
    assert answers(w, "sk-one")


# --- authentication turned on or off by a reload ---

def auth_config(mock, keys: list[tuple[str, str]] | None) -> dict:
    cfg = {"pools": {"a": {"endpoints": [mock.base_url]}},
           "models": {"m": {"pool": "a", "upstream_model": "mock-model"}},
           "server": {"metrics": {"client_port": True}},
           "tenants": {"t1": {"limits": {"requests_per_minute": 100}}}}
    if keys is not None:
        cfg["auth"] = {"api_keys": [{"id": kid, "sha256": sha(key), "tenant": "t1"} for kid, key in keys]}
    return cfg


def write(w, cfg: dict) -> None:
    full = json.loads(json.dumps(cfg))
    full.setdefault("listen", f"127.0.0.1:{w.port}")
    full.setdefault("workers", 2)
    full.setdefault("server", {}).setdefault("access_log", str(w.access_log_path))
    tmp = w.config_path.with_suffix(".next")
    tmp.write_text(to_yaml(full) + "\n")
    os.replace(tmp, w.config_path)


def sighup(w, expect: str) -> None:
    w.sighup(expect)


def answers(w, key: str) -> bool:
    """True when a chat completion with `key` is served, False on a 401."""
    try:
        w.client(api_key=key).chat.completions.create(model="m", messages=MSG)
        return True
    except openai.AuthenticationError:
        return False


def test_a_reload_that_drops_auth_is_refused_and_keys_are_still_checked(mock, weir):
    a = mock(*FAST)
    w = weir(config=auth_config(a, [("k1", "sk-one")]))
    assert answers(w, "sk-one") and not answers(w, "bogus")
    write(w, auth_config(a, None))  # the auth: block lost, tenants: kept
    sighup(w, "failure")
    log = w.process.log()
    assert "configuration reload refused:" in log, log[-1500:]
    assert "auth: changes only at restart (whether clients' credentials are checked is set at start-up" in log, \
        log[-1500:]
    assert w.metric("weir_config_last_reload_successful") == 0
    assert w.metric("weir_config_generation") == 1
    assert answers(w, "sk-one") and not answers(w, "bogus")
    # --check says what the file does: every request would run as the anonymous tenant.
    r = subprocess.run([binary("weir"), "--check", "-c", str(w.config_path)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert 'tenants: every request runs as the anonymous tenant "anonymous": there is no auth: section' in r.stderr, \
        r.stderr


def test_a_reload_that_adds_auth_is_refused(mock, weir):
    a = mock(*FAST)
    w = weir(config=auth_config(a, None))
    assert "every request runs as the anonymous tenant" in w.process.log()  # said at start-up
    assert answers(w, "anything")
    write(w, auth_config(a, [("k1", "sk-one")]))
    sighup(w, "failure")
    assert "auth: changes only at restart" in w.process.log()
    assert answers(w, "anything")  # the running configuration, unchanged


def test_keys_added_and_removed_inside_auth_reload(mock, weir):
    a = mock(*FAST)
    w = weir(config=auth_config(a, [("k1", "sk-one")]))
    write(w, auth_config(a, [("k2", "sk-two")]))
    sighup(w, "success")
    assert "auth ~api_keys" in w.process.log()
    assert answers(w, "sk-two") and not answers(w, "sk-one")
