"""Admission scopes are reused (admission/scope_ledger.hpp, docs/admission.md "Reusing scopes"): a tenant or key
whose limits change gets a new scope, and the old one is reused once nothing holds it. Without Redis the
limiter reused none of them when admin: was configured: the start-up policy stayed in Services, holding the
tenants' first scopes, and through each carry's pin every scope given since (s0 -> s1 -> s2 ...); and after
an admin key change the control thread kept the policy of the last reload, holding the same chain of a key
PATCHed after it. Each reload or PATCH took one more scope (~1.5 KiB) for the life of the process, and at
262,144 reloads and key changes failed. `weir_admission_scopes` says how many the limiter holds."""

from __future__ import annotations

import threading

import httpx
import openai

from conftest import free_port, wait_until
import test_budget_scopes_62 as scopes62
from test_admin_api import TOKEN, Admin
from test_redis import sha

MOCK_FLAGS = ("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "2", "--model", "m")
KEY = "sk-recycle62"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}


def config(mock, admin_port: int, rpm: int) -> dict:
    return {"pools": {"p": {"endpoints": [mock.base_url]}},
            "models": {"m": {"pool": "p", "default_max_tokens": 2}},
            "tenants": {"acme": {"limits": {"requests_per_minute": rpm, "max_concurrent_streams": 4},
                                 "budget": {"usd": 100, "period": "day"}},
                        "other": {}},
            "pricing": {"m": {"input": 0.5, "output": 1.5}},
            "auth": {"api_keys": [{"id": "a", "sha256": sha(KEY), "tenant": "acme",
                                   "limits": {"requests_per_minute": rpm}}]},
            "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}}


def start(mock, weir):
    m = mock(*MOCK_FLAGS)
    aport = free_port()
    w = weir(config=config(m, aport, 1000), env=ENV, workers=2)
    admin = Admin(aport)
    wait_until(lambda: admin("GET", "/ready", token=None).status_code == 200, 5, message="admin listener")
    return m, aport, w, admin


def reload(w, cfg: dict) -> None:
    scopes62.reload(w, cfg, workers=2)


def scopes(w) -> float:
    text = w.metrics_text()
    assert "weir_admission_scopes " in text, "no weir_admission_scopes gauge"
    return w.metric("weir_admission_scopes")


def chat(w, key: str = KEY) -> None:
    client = openai.OpenAI(base_url=w.v1, api_key=key, max_retries=0, timeout=30)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def test_a_thousand_reloads_changing_limits_reuse_the_retired_scopes(mock, weir):
    m, aport, w, admin = start(mock, weir)
    chat(w)
    first = scopes(w)  # acme, other, the anonymous tenant, key a
    most = first
    for i in range(1, 1001):
        # acme's and key a's limits change every time: both get a new scope, their old ones retire.
        reload(w, config(m, aport, 1000 + i))
        if i % 50 == 0:
            chat(w)  # admitted under the new limits (200), its spend carried on
            most = max(most, scopes(w))
    # The scopes held at once: the live ones, and the two just retired (until the workers drop the policy
    # that names them), whichever reload this is; not one more per reload.
    assert most <= first + 4, f"{most} scopes after 1000 reloads (started with {first})"
    # The budget's spend went on across the reuses: 21 requests, all of them counted.
    usage = admin("GET", "/admin/v1/tenants/acme").json()["usage"]["budget"]
    assert usage["spent_usd"] > 0
    assert not [e for e in w.log_entries() if e.get("path") == "/v1/chat/completions" and e.get("status") != 200]


def test_a_stream_admitted_before_many_reloads_holds_its_scopes_until_it_ends(mock, weir):
    """A ticket of an old scope follows the carries to the newest one: the scopes on that way are not reused
    while it runs, and are once it ended."""
    m = mock("--ttft-ms", "0", "--itl-ms", "40", "--max-tokens", "150", "--model", "m")
    aport = free_port()
    w = weir(config=config(m, aport, 1000), env=ENV, workers=2)
    admin = Admin(aport)
    wait_until(lambda: admin("GET", "/ready", token=None).status_code == 200, 5, message="admin listener")
    first = scopes(w)
    done = threading.Event()
    got: list[int] = []

    def stream() -> None:
        with httpx.stream("POST", w.v1 + "/chat/completions", timeout=60,
                          headers={"authorization": f"Bearer {KEY}"},
                          json={"model": "m", "stream": True, "max_tokens": 150,
                                "messages": [{"role": "user", "content": "hi"}]}) as r:
            got.append(r.status_code)
            for _ in r.iter_bytes():
                pass
        done.set()

    t = threading.Thread(target=stream)
    t.start()
    wait_until(lambda: bool(got), 10, message="stream admitted")  # its head came: admitted, its ticket held
    for i in range(1, 21):
        reload(w, config(m, aport, 2000 + i))
    held = scopes(w)
    assert held >= first + 2 * 19, f"the stream's chain of scopes was reused while it ran ({held})"
    t.join(60)
    assert done.is_set() and got == [200]
    # Once it ended, the next reloads reuse the scopes it held: the count stops growing.
    for i in range(1, 101):
        reload(w, config(m, aport, 3000 + i))
    assert scopes(w) <= held + 4


def test_hundreds_of_key_patches_after_a_reload_reuse_the_retired_scopes(mock, weir):
    m, aport, w, admin = start(mock, weir)
    k = admin.create(tenant="acme", name="patched", limits={"requests_per_minute": 100},
                     budget={"usd": 5, "period": "day"})
    # A reload after the key was created: the control thread's policy then names the key's scope.
    reload(w, config(m, aport, 1000))
    chat(w, k["key"])
    first = scopes(w)
    most = first
    for i in range(1, 401):
        r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"limits": {"requests_per_minute": 100 + i}})
        assert r.status_code == 200, r.text
        if i % 40 == 0:
            chat(w, k["key"])
            most = max(most, scopes(w))
    assert most <= first + 3, f"{most} scopes after 400 PATCHes (started with {first})"
    # Create and revoke, too.
    for i in range(200):
        j = admin.create(tenant="other", name=f"tmp{i}", limits={"requests_per_minute": 10 + i},
                         budget={"usd": 1, "period": "day"})
        assert admin("DELETE", f"/admin/v1/keys/{j['id']}").status_code in (200, 204)
    assert scopes(w) <= most + 3


# ---------------------------------------------------------------------------------------------------------------
# With redis: RedisLimiter reused no scope at all (each change of limits, each key created, took one for the life
# of the process: ~2.8 KiB a reload, ~2.5 KiB a key created and revoked). Now a free scope is reused once it gave
# back what Redis granted it (leases, stream slots, its budget allowance) and pushed or folded its spend; a reused
# scope writes Redis under a member of its own, so the budget's spend stays exact.

HASH = "recycle62:budget:tenant:acme:0"  # acme's budget without a period: one hash


def redis_config(mock, admin_port: int, redis_url: str, rpm: int) -> dict:
    c = config(mock, admin_port, rpm)
    c["tenants"]["acme"]["budget"] = {"usd": 1000000}
    c["redis"] = {"url": redis_url, "key_prefix": "recycle62:", "budget_sync_interval": "50ms",
                  "lease_idle": "200ms"}
    return c


def test_with_redis_reloads_and_key_churn_reuse_the_drained_scopes(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    aport = free_port()
    w = weir(config=redis_config(m, aport, redis.url, 1000), env=ENV, workers=2)
    admin = Admin(aport)
    wait_until(lambda: admin("GET", "/ready", token=None).status_code == 200, 5, message="admin listener")
    chat(w)
    first = scopes(w)
    most = first
    n = 1
    for i in range(1, 401):
        reload(w, redis_config(m, aport, redis.url, 1000 + i))  # acme's and key a's limits: new scopes
        if i % 40 == 0:
            chat(w)
            n += 1
            most = max(most, scopes(w))
    # Live ones, and those retired in the last moments (a scope drains within a sync or two, one that admitted
    # a request once its lease went back after lease_idle): far from one per reload.
    assert most <= first + 24, f"{most} scopes after 400 reloads (started with {first})"
    # Every request charged once, in Redis and here, under one member of this replica in the hash.
    entries = w.wait_log(lambda es: len([e for e in es if e.get("path") == "/v1/chat/completions"]) >= n)
    real = sum(e.get("spend_usd") or 0 for e in entries if e.get("path") == "/v1/chat/completions")
    assert real > 0

    def total() -> float:
        r = redis.cli("HGET", HASH, "total").decode().split("\r\n")
        return int(r[1]) / 1e9 if len(r) >= 2 and r[0] != "$-1" else 0.0

    def spent() -> float:
        return admin("GET", "/admin/v1/tenants/acme").json()["usage"]["budget"]["spent_usd"]

    def hlen() -> int:
        return int(redis.cli("HLEN", HASH).decode().strip().lstrip(":") or 0)

    wait_until(lambda: abs(spent() - real) < 1e-9 and abs(total() - real) < 1e-9 and hlen() <= 4, 15, interval=0.05,
               message=f"spend {real}: admin {spent()}, Redis {total()}, HLEN {hlen()}")
    # Keys created with limits and a budget, and revoked: their scopes are reused too (the count is the most
    # held at once: it never shrinks, and stops growing).
    before = scopes(w)
    for i in range(200):
        j = admin.create(tenant="other", name=f"tmp{i}", limits={"requests_per_minute": 10 + i},
                         budget={"usd": 1, "period": "day"})
        assert admin("DELETE", f"/admin/v1/keys/{j['id']}").status_code in (200, 204)
    assert scopes(w) <= before + 24, f"{scopes(w)} scopes after 200 keys created and revoked (before: {before})"
    assert w.metric("weir_redis_outages_total") == 0
    assert not [e for e in entries if e.get("path") == "/v1/chat/completions" and e.get("status") != 200]
