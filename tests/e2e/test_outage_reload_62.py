"""A reload made just after Redis went away, before a sync found the outage (a stopped Redis, a cut link: the
outage is found at the next round trip's command_timeout), gave a budgeted tenant a new admission scope that
Redis never answered for. The old scope's allowance stayed with the old scope, so under `fail_open: true` every
request of the tenant got 503 "The budget ... cannot be checked" for the whole outage, though its budget had
synced many times (docs/admission.md: that 503 is for a budget Redis never answered for in this process). The
allowance now moves to the new scope when the outage is found, as it does for a reload during an outage."""

from __future__ import annotations

import os
import signal

import httpx

from conftest import wait_until
from test_budget_scopes_62 import KEY, MOCK_FLAGS, chat, reload
from test_redis import sha


def config(mock, redis_url: str, rpm: int) -> dict:
    return {"pools": {"p": {"endpoints": [mock.base_url]}},
            "models": {"m": {"pool": "p", "default_max_tokens": 2}},
            "tenants": {"acme": {"limits": {"requests_per_minute": rpm}, "budget": {"usd": 1000, "period": "30d"}}},
            "pricing": {"m": {"input": 1.0, "output": 1.0}},
            "auth": {"api_keys": [{"id": "a", "sha256": sha(KEY), "tenant": "acme"}]},
            # Slow ticks: nothing but the reload's own sync meets the stopped Redis first.
            "redis": {"url": redis_url, "key_prefix": "outage62:", "fail_open": True, "sync_interval": "1s",
                      "budget_sync_interval": "30s"}}


def post(w) -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_a_reload_just_before_an_outage_is_found_keeps_the_budget_open(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis.url, 1000), workers=1)
    for _ in range(3):
        chat(w)  # the budget is read from Redis (its first reservation waits for that reply)
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        reload(w, config(m, redis.url, 1001))  # only the rate changes: a new scope for acme's budget
        wait_until(lambda: w.metric("weir_redis_degraded") == 1, 10, message="the outage found")
        answers = [post(w) for _ in range(5)]
        assert [r.status_code for r in answers] == [200] * 5, [r.text for r in answers if r.status_code != 200]
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    wait_until(lambda: w.metric("weir_redis_degraded") == 0, 15, message="Redis back")
    assert post(w).status_code == 200
