"""A Redis budget whose period is changed and changed back counts each spend once (docs/admin-api.md,
docs/admission.md "Distributed mode"): a reload day -> month -> day, day -> 24h -> day, or an admin PATCH of a
key's period 24h -> day -> 24h, carries this replica's spend into the new period's hash once, and not again
into a hash that counts it already (before the fix: real spend $S showed 2S, then 3S, a flip more each time).
Also: a budget period given as a bare number (milliseconds) is warned about at load."""

from __future__ import annotations

import datetime as dt
import os
import signal

import httpx
import openai
import pytest

from conftest import free_port, to_yaml, wait_until
from test_admin_api import TOKEN, Admin
from test_redis import sha

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4", "--model", "m")
KEY = "sk-carry61"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}


def near_a_period_end() -> bool:
    """Within a minute of a UTC day's (so a month's) end: the periods would roll under the test."""
    now = dt.datetime.now(dt.timezone.utc)
    return (now.replace(hour=0, minute=0, second=0, microsecond=0) + dt.timedelta(days=1) - now).total_seconds() < 60


def config(mock, redis_url: str, admin_port: int, period: str) -> dict:
    return {"pools": {"p": {"endpoints": [mock.base_url]}},
            "models": {"m": {"pool": "p", "default_max_tokens": 4}},
            "tenants": {"acme": {"budget": {"usd": 1000, "period": period}}},
            "pricing": {"m": {"input": 1000.0, "output": 1000.0}},
            "auth": {"api_keys": [{"id": "a", "sha256": sha(KEY), "tenant": "acme"}]},
            "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
            "redis": {"url": redis_url, "key_prefix": "carry61:", "budget_sync_interval": "50ms"}}


def chats(entries: list[dict]) -> list[dict]:
    """The access log's requests to the client port (the admin listener's go to the same log)."""
    return [e for e in entries if e.get("path") == "/v1/chat/completions"]


def spend(w) -> float:
    """Real spend so far: the access log's."""
    return sum(e.get("spend_usd") or 0 for e in chats(w.log_entries()))


def chat(w, key: str = KEY) -> None:
    client = openai.OpenAI(base_url=w.v1, api_key=key, max_retries=0, timeout=30)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def hash_totals(redis) -> list[float]:
    """`total` of every budget hash in Redis, USD."""
    raw = redis.cli("KEYS", "carry61:budget:*").decode()
    keys = [line for line in raw.split("\r\n") if line.startswith("carry61:budget:")]
    totals = []
    for k in keys:
        r = redis.cli("HGET", k, "total").decode().split("\r\n")
        if len(r) >= 2 and r[0].startswith("$") and r[0] != "$-1":
            totals.append(int(r[1]) / 1e9)
    return totals


def counted_once(w, redis, usage, count: int, step: str = "") -> None:
    """Waits until `count` requests are logged, the usage says their spend and a hash in Redis holds it (the
    new period's push done); then no hash, nor the usage, holds more."""
    w.wait_log(lambda es: len(chats(es)) >= count)
    real = spend(w)
    assert real > 0
    wait_until(lambda: abs(usage() - real) < 1e-9 and any(abs(t - real) < 1e-9 for t in hash_totals(redis)), 10,
               interval=0.05, message=f"{step}: spend {real} counted once (usage {usage()}, hashes {hash_totals(redis)})")
    assert all(t <= real + 1e-9 for t in hash_totals(redis)), (real, hash_totals(redis))


def reload(w, cfg: dict) -> None:
    cfg = dict(cfg)
    cfg.setdefault("listen", f"127.0.0.1:{w.port}")
    cfg.setdefault("workers", 2)
    cfg.setdefault("server", {})["access_log"] = str(w.access_log_path)
    w.config_path.write_text(to_yaml(cfg) + "\n")
    before = w.metric("weir_config_reloads_total", result="success")
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: w.metric("weir_config_reloads_total", result="success") > before, 10, message="reloaded")


@pytest.mark.skipif(near_a_period_end(), reason="a UTC day ends within a minute: the periods would roll")
def test_reloads_that_flip_the_period_carry_the_spend_once(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    aport = free_port()
    w = weir(config=config(m, redis.url, aport, "day"), env=ENV)
    admin = Admin(aport)
    wait_until(lambda: admin("GET", "/ready", token=None).status_code == 200, 5, message="admin listener")

    def usage() -> float:
        return admin("GET", "/admin/v1/tenants/acme").json()["usage"]["budget"]["spent_usd"]

    n = 0
    for _ in range(3):
        chat(w)
        n += 1
    counted_once(w, redis, usage, n)
    for period in ["month", "day", "24h", "day", "month", "24h", "day"]:
        reload(w, config(m, redis.url, aport, period))
        counted_once(w, redis, usage, n, f"reloaded to {period}")  # carried, not added again
        chat(w)  # and new spend counts once on top
        n += 1
        counted_once(w, redis, usage, n, f"a request under {period}")


@pytest.mark.skipif(near_a_period_end(), reason="a UTC day ends within a minute: the periods would roll")
def test_admin_patch_that_flips_a_key_period_carries_the_spend_once(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    aport = free_port()
    cfg = config(m, redis.url, aport, "month")
    cfg["tenants"]["acme"]["budget"]["usd"] = 100000
    w = weir(config=cfg, env=ENV)
    admin = Admin(aport)
    wait_until(lambda: admin("GET", "/ready", token=None).status_code == 200, 5, message="admin listener")
    key = admin.create(tenant="acme", budget={"usd": 1000, "period": "day"})
    kid, secret = key["id"], key["key"]

    def usage() -> float:
        return admin("GET", f"/admin/v1/keys/{kid}").json()["usage"]["budget"]["spent_usd"]

    n = 0
    for _ in range(3):
        chat(w, secret)
        n += 1

    def key_counted_once(count: int, step: str = "") -> None:
        w.wait_log(lambda es: len(chats(es)) >= count)
        real = spend(w)
        wait_until(lambda: abs(usage() - real) < 1e-9, 10, interval=0.05,
                   message=f"{step}: the key's spend {real} counted once (usage {usage()})")
        # The key's hashes (not the tenant's, whose month counts it all once): none over the real spend.
        raw = redis.cli("KEYS", "carry61:budget:key:*").decode()
        for k in [line for line in raw.split("\r\n") if line.startswith("carry61:budget:key:")]:
            r = redis.cli("HGET", k, "total").decode().split("\r\n")
            if len(r) >= 2 and r[0] != "$-1":
                assert int(r[1]) / 1e9 <= real + 1e-9, (k, r[1], real)

    key_counted_once(n)
    for period in ["24h", "day", "24h", "day"]:
        r = admin("PATCH", f"/admin/v1/keys/{kid}", json={"budget": {"usd": 1000, "period": period}})
        assert r.status_code == 200, r.text
        key_counted_once(n, f"patched to {period}")
        chat(w, secret)
        n += 1
        key_counted_once(n, f"a request under {period}")


def test_a_bare_number_budget_period_is_warned_about(mock, weir, tmp_path):
    """`period: 86400` is 86.4 s (a bare number is milliseconds): served as read, and said at load."""
    m = mock(*MOCK_FLAGS)
    cfg = {"pools": {"p": {"endpoints": [m.base_url]}},
           "models": {"m": {"pool": "p", "default_max_tokens": 4}},
           "tenants": {"acme": {"budget": {"usd": 10, "period": 86400}},
                       "ok": {"budget": {"usd": 10, "period": "24h"}}, "never": {"budget": {"usd": 10, "period": 0}}},
           "auth": {"api_keys": [{"id": "a", "sha256": sha(KEY), "tenant": "acme"},
                                 {"id": "b", "sha256": sha("sk-b"), "tenant": "ok", "budget": {"usd": 1, "period": 3600}}]}}
    w = weir(config=cfg)
    log = w.process.log()
    assert "tenants.acme.budget.period: 86400 is read as 86400 ms (86.4 s)" in log, log
    assert "write 86400s, 24h, or day" in log, log
    assert "auth.api_keys[0].budget.period" not in log
    assert "auth.api_keys[1].budget.period: 3600 is read as 3600 ms (3.6 s)" in log and "3600s or 1h" in log, log
    assert "tenants.ok.budget" not in log and "tenants.never.budget" not in log, log
    r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
