"""Redis-shared admission, stop 54's fixes (docs/admission.md, "Redis outage" and "Shutdown";
docs/admin-api.md, "Tenants"): a replica drained while its Redis client waits to reconnect still pushes
the spend only it knows, or says what was lost; one key holding bad data is no outage for every tenant,
and an error only one key pattern meets does not flap; the tenant pages answer from local state while
Redis is down."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from conftest import connections_to, sigstop, wait_until
from test_redis import sha
from test_redis_fixes_45 import MOCK_FLAGS

PASSWORD = "acl-pass-54"


def prefix(redis) -> str:
    return f"weir-test54-{redis.port}:"


def config(mock, redis, tenants: dict, **redis_extra) -> dict:
    """Tenants by name, each with a key sk-<name>."""
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "default_max_tokens": 4}},
        "tenants": tenants,
        "auth": {"api_keys": [{"id": name, "sha256": sha(f"sk-{name}"), "tenant": name} for name in tenants]},
        "pricing": {"m": {"input": 1.0, "output": 2.0}},
        "redis": {"url": redis.url, "key_prefix": prefix(redis), **redis_extra},
    }


def call(w, tenant: str) -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer sk-{tenant}"}, timeout=30,
                      json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})


def redis_int(redis, *cmd: str) -> int | None:
    """An integer or bulk-string reply as an int (None for nil)."""
    raw = redis.cli(*cmd)
    if raw.startswith(b":"):
        return int(raw[1:].split(b"\r\n")[0])
    if raw.startswith(b"$-1"):
        return None
    return int(raw.split(b"\r\n")[1])


def logged_spend(w, tenant: str = "t") -> int:
    """The access log's spend of `tenant`'s chat requests, nano-USD."""
    return round(sum(e.get("spend_usd", 0) for e in w.log_entries()
                     if e.get("path", "").startswith("/v1/") and e.get("tenant") == tenant) * 1e9)


def logged_calls(w, tenant: str = "t") -> int:
    """The access log's lines of `tenant`'s chat requests."""
    return sum(1 for e in w.log_entries() if e.get("path", "").startswith("/v1/") and e.get("tenant") == tenant)


def lines(w, text: str) -> list[str]:
    return [line for line in w.process.log().splitlines() if text in line]


def test_a_replica_drained_while_waiting_to_reconnect_pushes_its_spend(mock, weir, redis):
    """Redis hangs, the replica serves requests from its local state (fail_open), Redis answers again while
    the replica's client waits out its reconnect backoff, and the replica is drained: the final push used to
    fail at once, losing that spend without a word. It now connects for it (connect_timeout), then pushes."""
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, {"t": {"budget": {"usd": 1}}}, budget_sync_interval="50ms",
                           reconnect_max="60s"))
    total = f"{prefix(redis)}budget:tenant:t:0"
    for _ in range(3):
        assert call(w, "t").status_code == 200
    # Every line is in the log (workers flush it every 50 ms) and the spend they say in Redis: the third
    # request's is not still on its way while the log says two.
    wait_until(lambda: logged_calls(w) == 3 and redis_int(redis, "HGET", total, "total") == logged_spend(w) > 0, 10,
               message="the spend of the three in Redis")
    sigstop(redis.proc.pid)
    stopped_at = time.monotonic()
    try:
        for _ in range(5):
            assert call(w, "t").status_code == 200  # fail_open: the budget's local allowance
        wait_until(lambda: w.metric("weir_redis_degraded") == 1, 10, message="degraded")
        # The client reconnects (the kernel accepts for a stopped Redis), times out, backs off: 50 ms, doubling.
        # Past 2.5 s, between connections, its wait is over a second long.
        wait_until(lambda: time.monotonic() - stopped_at > 2.5 and connections_to(redis.port) == 0, 30,
                   message="the client waiting to reconnect")
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    wait_until(redis.ping, 10, message="Redis answering again")
    assert w.process.stop(timeout=10) == 0
    assert redis_int(redis, "HGET", total, "total") == logged_spend(w), w.process.log()
    assert not lines(w, "exiting with spend"), w.process.log()


def test_spend_a_drained_replica_cannot_push_is_logged(mock, weir, redis):
    """Redis still hangs at the drain: one connect-and-push attempt, then a line per budget with what the
    shared budget does not count (before: nothing but `weir: stopped`)."""
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, {"t": {"budget": {"usd": 1}}}, budget_sync_interval="50ms"))
    total = f"{prefix(redis)}budget:tenant:t:0"
    for _ in range(3):
        assert call(w, "t").status_code == 200
    # Every line is in the log (workers flush it every 50 ms) and the spend they say in Redis: the third
    # request's is not still on its way while the log says two.
    wait_until(lambda: logged_calls(w) == 3 and redis_int(redis, "HGET", total, "total") == logged_spend(w) > 0, 10,
               message="the spend of the three in Redis")
    pushed = logged_spend(w)
    sigstop(redis.proc.pid)
    try:
        for _ in range(4):
            assert call(w, "t").status_code == 200
        wait_until(lambda: w.metric("weir_redis_degraded") == 1, 10, message="degraded")
        assert w.process.stop(timeout=10) == 0
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    lost = logged_spend(w) - pushed  # (the access log is whole once Weir exited)
    [line] = lines(w, "exiting with spend Redis does not count")
    # (Written to a Redis that does not answer: it may still run the push once resumed.)
    assert f"({lost} nano-USD) settled here for {prefix(redis)}budget:tenant:t may not have reached Redis (" in line, line


@pytest.mark.parametrize("fail_open", [False, True])
def test_a_key_of_the_wrong_type_is_reset_not_an_outage_for_every_tenant(mock, weir, redis, fail_open):
    """A string at one tenant's bucket key: every tenant got 503 (fail_open off), a tenant without limits
    included, or every limit went per replica (on), until someone deleted it."""
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, {"bad": {"limits": {"requests_per_minute": 6000}},
                            "good": {"limits": {"requests_per_minute": 6000}}, "nolimits": {}},
                 fail_open=fail_open)
    w = weir(config=cfg)
    key = f"{prefix(redis)}rl:tenant:bad:req"
    assert call(w, "good").status_code == 200
    assert redis.cli("SET", key, "oops").startswith(b"+OK")
    statuses = {t: [call(w, t).status_code for _ in range(5)] for t in ("bad", "good", "nolimits")}
    assert statuses == {t: [200] * 5 for t in statuses}, statuses
    assert w.metric("weir_redis_degraded") == 0
    assert w.metric("weir_redis_outages_total") == 0
    assert w.metric("weir_redis_data_resets_total") >= 1
    # Reset to a hash (or, on a host slow enough for the bucket to idle out since, already expired).
    assert redis.cli("TYPE", key).split()[0] in (b"+hash", b"+none"), redis.cli("TYPE", key)
    assert len(lines(w, f"Redis key {key} held a string, not a hash: reset")) == 1, w.process.log()
    assert not lines(w, "unusable ("), w.process.log()


def test_a_budget_total_that_is_not_an_integer_is_reseeded_without_flapping(mock, weir, redis):
    """HSET ... total 1.5e3 on one tenant's budget: weir_redis_outages_total climbed ~25 a second (the probe
    ended each outage, the next budget sync began another) and other tenants got 503 on and off."""
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, {"bad": {"budget": {"usd": 1}}, "good": {"limits": {"requests_per_minute": 6000}}},
                 fail_open=False, budget_sync_interval="50ms")
    w = weir(config=cfg)
    key = f"{prefix(redis)}budget:tenant:bad:0"
    assert call(w, "bad").status_code == 200
    wait_until(lambda: redis_int(redis, "HGET", key, "total") == logged_spend(w, "bad") > 0, 10,
               message="the spend in Redis")
    redis.cli("HSET", key, "total", "1.5e3")
    statuses = [call(w, t).status_code for _ in range(10) for t in ("bad", "good")]
    assert statuses == [200] * 20, statuses
    # The hash was taken as lost and re-seeded from this replica's running total.
    wait_until(lambda: redis_int(redis, "HGET", key, "total") == logged_spend(w, "bad"), 10,
               message="the period's spend re-seeded")
    assert w.metric("weir_redis_outages_total") == 0
    assert w.metric("weir_redis_degraded") == 0
    assert len(lines(w, f"Redis key {key} held a field total that is not an integer: reset")) >= 1, w.process.log()


def test_an_error_only_the_budget_keys_meet_is_one_outage(mock, weir, redis):
    """An ACL that allows the bucket keys and not the budget keys: NOPERM on the budget's script is an
    outage; its probe replays that script, so it stays one outage (the probe used to SET another key,
    which worked: the outage ended, and began again at the next sync). Allowed: back, once."""
    p = prefix(redis)
    assert redis.cli("ACL", "SETUSER", "weir", "on", f">{PASSWORD}", f"~{p}rl:*", f"~{p}slots:*",
                     f"~{p}probe:*", "+@all").startswith(b"+OK")
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, {"t": {"limits": {"requests_per_minute": 6000}, "budget": {"usd": 1}}},
                 fail_open=False, username="weir", password=PASSWORD)
    w = weir(config=cfg)
    wait_until(lambda: w.metric("weir_redis_degraded") == 1, 10, message="degraded: NOPERM on the budget")
    statuses = [call(w, "t").status_code for _ in range(30)]
    assert set(statuses) == {503}, statuses
    assert w.metric("weir_redis_outages_total") == 1
    assert len(lines(w, "unusable (NOPERM")) == 1, w.process.log()
    assert redis.cli("ACL", "SETUSER", "weir", f"~{p}budget:*").startswith(b"+OK")
    wait_until(lambda: call(w, "t").status_code == 200, 10, interval=0.05, message="admitted once allowed")
    assert w.metric("weir_redis_outages_total") == 1
    assert len(lines(w, "reachable again")) == 1, w.process.log()


@pytest.mark.parametrize("how", ["kill", "sigstop"])
def test_the_tenant_pages_answer_from_local_state_while_redis_is_down(mock, weir, redis, how):
    """auth.redis_keys: GET /admin/v1/tenants[/name] answered 503 key_store_unavailable while Redis was
    down or hung; only runtime_keys needs Redis, and it is null then, with why."""
    from test_defect_fixes_42 import redis_keys_gateway
    _, admin = redis_keys_gateway(mock, weir, redis, tenants=("acme", "beta"))
    admin.create(tenant="acme")
    assert admin("GET", "/admin/v1/tenants/acme").json()["runtime_keys"] == 1
    if how == "kill":
        redis.kill()
    else:
        sigstop(redis.proc.pid)
    try:
        one = admin("GET", "/admin/v1/tenants/acme")
        assert one.status_code == 200, one.text
        body = one.json()
        assert body["name"] == "acme" and body["runtime_keys"] is None, body
        assert "did not answer" in body["runtime_keys_error"] and "nothing was changed" not in body[
            "runtime_keys_error"], body
        listed = admin("GET", "/admin/v1/tenants")
        assert listed.status_code == 200, listed.text
        counts = {t["name"]: t["runtime_keys"] for t in listed.json()["data"]}
        assert {"acme", "beta"} <= set(counts) and set(counts.values()) == {None}, counts
    finally:
        if how == "sigstop":
            redis.proc.send_signal(signal.SIGCONT)
    if how == "sigstop":
        wait_until(lambda: admin("GET", "/admin/v1/tenants/acme").json()["runtime_keys"] == 1, 10,
                   message="the count again once Redis answers")
