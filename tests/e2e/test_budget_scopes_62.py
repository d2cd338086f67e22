"""Reloads that change a budgeted tenant keep one member per replica in its Redis budget hash
(docs/admission.md, "Distributed mode"): each reload that changes a tenant (here only its requests_per_minute)
gives it a new admission scope, and each scope pushed its spend under a member of its own (`s:<replica>/<scope>`,
`t:...`) for the life of the process. With a budget that never resets the hash grew two fields a reload; after
~600 reloads the sync passed its command_timeout (503s, wrong 429 insufficient_quota), and at 4,096 fields
budget.lua reset the hash. Now a retired scope folds into its successor once its requests are done: its
running total joins the successor's member in Redis, it pushes no more, and the spend stays exact, also
when the reload happens during a Redis outage."""

from __future__ import annotations

import openai

from conftest import free_port, to_yaml, wait_until
from test_admin_api import TOKEN, Admin
from test_redis import sha

import os
import signal

MOCK_FLAGS = ("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "2", "--model", "m")
KEY = "sk-scopes62"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
HASH = "scopes62:budget:tenant:acme:0"  # a budget without a period: one hash, no expiry


def config(mock, redis_url: str, admin_port: int, rpm: int) -> dict:
    return {"pools": {"p": {"endpoints": [mock.base_url]}},
            "models": {"m": {"pool": "p", "default_max_tokens": 2}},
            "tenants": {"acme": {"limits": {"requests_per_minute": rpm}, "budget": {"usd": 1000000}}},
            "pricing": {"m": {"input": 1000.0, "output": 1000.0}},
            "auth": {"api_keys": [{"id": "a", "sha256": sha(KEY), "tenant": "acme"}]},
            "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
            "redis": {"url": redis_url, "key_prefix": "scopes62:", "budget_sync_interval": "50ms"}}


def start(mock, weir, redis, rpm: int = 1000):
    m = mock(*MOCK_FLAGS)
    aport = free_port()
    w = weir(config=config(m, redis.url, aport, rpm), env=ENV, workers=1)
    admin = Admin(aport)
    wait_until(lambda: admin("GET", "/ready", token=None).status_code == 200, 5, message="admin listener")
    return m, aport, w, admin


def reload(w, cfg: dict, workers: int = 1) -> None:
    cfg = dict(cfg)
    cfg.setdefault("listen", f"127.0.0.1:{w.port}")
    cfg.setdefault("workers", workers)
    cfg.setdefault("server", {})["access_log"] = str(w.access_log_path)
    w.config_path.write_text(to_yaml(cfg) + "\n")
    before = w.metric("weir_config_reloads_total", result="success")
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: w.metric("weir_config_reloads_total", result="success") > before, 10, message="reloaded")


def chat(w) -> None:
    client = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def chats(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e.get("path") == "/v1/chat/completions"]


def real_spend(w, count: int) -> float:
    """The access log's spend once `count` requests are logged."""
    entries = w.wait_log(lambda es: len(chats(es)) >= count)
    return sum(e.get("spend_usd") or 0 for e in chats(entries))


def hlen(redis) -> int:
    return int(redis.cli("HLEN", HASH).decode().strip().lstrip(":") or 0)


def total(redis) -> float:
    r = redis.cli("HGET", HASH, "total").decode().split("\r\n")
    return int(r[1]) / 1e9 if len(r) >= 2 and r[0] != "$-1" else 0.0


def spent(admin) -> float:
    return admin("GET", "/admin/v1/tenants/acme").json()["usage"]["budget"]["spent_usd"]


def exact(w, admin, redis, count: int, step: str) -> None:
    """The admin API and Redis's total both show the access log's spend, and the hash holds one member
    (total, s:, t:, a:): four fields, not two per scope the tenant ever had."""
    real = real_spend(w, count)
    assert real > 0
    wait_until(lambda: abs(spent(admin) - real) < 1e-6 and abs(total(redis) - real) < 1e-6 and hlen(redis) <= 4, 15,
               interval=0.05,
               message=f"{step}: spend {real} (admin {spent(admin)}, Redis total {total(redis)}), HLEN {hlen(redis)}")


def test_hundreds_of_reloads_keep_the_budget_hash_to_one_member(mock, weir, redis):
    m, aport, w, admin = start(mock, weir, redis)
    chat(w)
    n = 1
    exact(w, admin, redis, n, "start")
    most = 0
    for i in range(1, 251):
        reload(w, config(m, redis.url, aport, 1000 + i))  # only the rate limit changes: a new scope each time
        chat(w)  # 200, never 503 nor 429: every request is admitted
        n += 1
        if i % 25 == 0:
            most = max(most, hlen(redis))
    assert most <= 8, f"the budget hash grew to {most} fields over 250 reloads"
    exact(w, admin, redis, n, "after 250 reloads")
    assert w.metric("weir_redis_outages_total") == 0
    assert not [e for e in chats(w.log_entries()) if e.get("status") != 200]


def test_a_reload_during_a_redis_outage_folds_once_redis_is_back(mock, weir, redis):
    m, aport, w, admin = start(mock, weir, redis)
    n = 0
    for _ in range(3):
        chat(w)
        n += 1
    exact(w, admin, redis, n, "before the outage")
    redis.kill()
    wait_until(lambda: w.metric("weir_redis_degraded") == 1, 10, message="the outage seen")
    chat(w)  # spend under the old scope, during the outage
    n += 1
    reload(w, config(m, redis.url, aport, 2000))  # the new scope during the outage
    for _ in range(2):
        chat(w)
        n += 1
    redis.start()  # an empty Redis on the same port: the replicas re-seed it with their running totals
    wait_until(lambda: w.metric("weir_redis_degraded") == 0, 15, message="Redis back")
    exact(w, admin, redis, n, "after the outage")
    for rpm in (2001, 2002, 2003):
        reload(w, config(m, redis.url, aport, rpm))
        chat(w)
        n += 1
    exact(w, admin, redis, n, "reloads after the outage")
