"""The admin API (docs/admin-api.md): its own listener, bearer-token auth,
runtime virtual keys with limits and budgets of their own, tenants' state,
/metrics and /ready beside it. Real weir and weir-mock processes on free
ports; keys are used through the official openai SDK."""

from __future__ import annotations

import hashlib
import os
import stat
import time

import httpx
import openai
import pytest

from conftest import free_port, wait_until

TOKEN = "admin-test-token-0123456789"
MOCK_FLAGS = ("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "4", "--model", "m")
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def config(mock, admin_port: int, **admin_extra) -> dict:
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "default_max_tokens": 8}, "other": {"pool": "p", "upstream_model": "m",
                                                                        "default_max_tokens": 8}},
        "tenants": {"acme": {"models": ["m", "other"], "limits": {"requests_per_minute": 1000}}},
        "auth": {"required": True, "api_keys": [{"id": "acme-cfg", "sha256": sha("sk-acme-cfg"), "tenant": "acme"}]},
        # 1 USD per 1M input tokens, 2 USD per 1M output tokens.
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN", **admin_extra},
    }


class Admin:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def __call__(self, method: str, path: str, token: str | None = TOKEN, **kw) -> httpx.Response:
        headers = kw.pop("headers", {})
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        if "content" in kw:  # (a body is JSON, said so: 415 otherwise)
            headers.setdefault("content-type", "application/json")
        return httpx.request(method, self.base + path, headers=headers, timeout=10, **kw)

    def create(self, **body) -> dict:
        r = self("POST", "/admin/v1/keys", json=body)
        assert r.status_code == 201, r.text
        return r.json()


def start(mock, weir, **admin_extra):
    port = free_port()
    w = weir(config=config(mock, port, **admin_extra), env=ENV)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    return w, admin


def _ready(admin: Admin) -> bool:
    try:
        return admin("GET", "/ready", token=None).status_code == 200
    except httpx.TransportError:
        return False


def chat(w, key: str, model: str = "m") -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def sdk_chat(w, key: str, model: str = "m") -> str:
    client = openai.OpenAI(base_url=w.v1, api_key=key, max_retries=0, timeout=30)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], stream=True)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


@pytest.fixture
def gw(mock, weir):
    return start(mock(*MOCK_FLAGS), weir)


def test_admin_requests_need_the_token_and_errors_are_openai_shaped(gw):
    w, admin = gw
    r = admin("GET", "/admin/v1/keys", token=None)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "invalid_api_key" and "admin token" in r.json()["error"]["message"]
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert admin("GET", "/admin/v1/keys", token="wrong-token").status_code == 401
    assert admin("GET", "/admin/v1/keys", token=TOKEN[:-1]).status_code == 401
    # Without the token even unknown paths say 401 (nothing to probe).
    assert admin("GET", "/admin/v1/nothing", token=None).status_code == 401
    assert admin("GET", "/admin/v1/nothing").status_code == 404
    r = admin("PUT", "/admin/v1/keys")
    assert r.status_code == 405 and "GET" in r.headers["allow"] and "POST" in r.headers["allow"], r.text
    r = admin("POST", "/admin/v1/keys", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", "limits": {"requests_per_minute": "many"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limits.requests_per_minute", r.text
    r = admin("POST", "/admin/v1/keys", json={"tenant": "nobody"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "tenant", r.text
    r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", "expires_at": "tomorrow"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "expires_at", r.text
    # The admin API is never on the client port.
    r = httpx.get(w.v1.removesuffix("/v1") + "/admin/v1/keys", headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code in (401, 404), r.text
    # Config keys are listed, read-only, without secrets.
    keys = admin("GET", "/admin/v1/keys").json()
    assert keys["persistence"] == "memory"
    cfg = [k for k in keys["data"] if k["id"] == "acme-cfg"][0]
    assert cfg["source"] == "config" and cfg["read_only"] is True and "key" not in cfg and "sha256" not in cfg
    assert admin("DELETE", "/admin/v1/keys/acme-cfg").status_code == 409


def test_a_runtime_key_has_its_own_limit_beside_its_tenant(gw):
    w, admin = gw
    k = admin.create(tenant="acme", name="ci", limits={"requests_per_minute": 2}, metadata={"team": "c"})
    assert k["key"].startswith("sk-weir-") and len(k["key"]) == len("sk-weir-") + 43
    assert k["id"].startswith("vk_") and k["tenant"] == "acme" and k["limits"] == {"requests_per_minute": 2}
    assert k["metadata"] == {"team": "c"} and k["source"] == "admin" and k["created_at"] > 0
    assert sdk_chat(w, k["key"])
    assert sdk_chat(w, k["key"])
    with pytest.raises(openai.RateLimitError) as e:
        sdk_chat(w, k["key"])
    assert f"key `{k['id']}`" in str(e.value)
    # The tenant still has room: its configured key goes on.
    assert chat(w, "sk-acme-cfg").status_code == 200
    # The secret is shown once: never in list or get.
    listed = admin("GET", "/admin/v1/keys").json()["data"]
    assert k["id"] in [x["id"] for x in listed] and all("key" not in x for x in listed)
    got = admin("GET", f"/admin/v1/keys/{k['id']}").json()
    assert "key" not in got and got["usage"]["requests"]["limit"] == 2 and got["usage"]["requests"]["remaining"] == 0
    # Tenants: limits and current bucket levels.
    t = admin("GET", "/admin/v1/tenants/acme").json()
    # (1000 per minute refills ~17 a second: the level is near full again already.)
    assert t["limits"] == {"requests_per_minute": 1000} and t["usage"]["requests"]["limit"] == 1000
    assert 990 <= t["usage"]["requests"]["remaining"] <= 1000 and t["usage"]["budget"] is None
    assert t["runtime_keys"] == 1
    assert [x["name"] for x in admin("GET", "/admin/v1/tenants").json()["data"]].count("acme") == 1
    assert admin("GET", "/admin/v1/tenants/nobody").status_code == 404
    # Raising its limit takes effect at once: the bucket keeps its level (as a reload carries it, so an
    # edit refills nothing), and refills at the new rate (100 a minute: one in 0.6 s, not 30 s).
    r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"limits": {"requests_per_minute": 100}})
    assert r.status_code == 200 and r.json()["limits"] == {"requests_per_minute": 100}, r.text
    wait_until(lambda: chat(w, k["key"]).status_code == 200, 5, message="a request at the new rate")


def test_patch_models_revoke_and_rotate(gw):
    w, admin = gw
    k = admin.create(tenant="acme")
    assert chat(w, k["key"], "m").status_code == 200
    r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"models": ["other"]})
    assert r.status_code == 200 and r.json()["models"] == ["other"], r.text
    r = chat(w, k["key"], "m")
    # (A model the key may not use is answered as an unknown one: docs/auth.md.)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert chat(w, k["key"], "other").status_code == 200
    r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"tenant": "other"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tenant", r.text

    # Rotate: a new secret, the old one stops working.
    r = admin("POST", f"/admin/v1/keys/{k['id']}/rotate")
    assert r.status_code == 200, r.text
    new = r.json()["key"]
    assert new != k["key"] and r.json()["id"] == k["id"]
    assert chat(w, k["key"], "other").status_code == 401
    assert sdk_chat(w, new, "other")

    # Revoke: the next request gets 401.
    r = admin("DELETE", f"/admin/v1/keys/{k['id']}")
    assert r.status_code == 200 and r.json() == {"object": "key", "id": k["id"], "deleted": True}, r.text
    with pytest.raises(openai.AuthenticationError):
        sdk_chat(w, new, "other")
    assert admin("GET", f"/admin/v1/keys/{k['id']}").status_code == 404
    assert admin("DELETE", f"/admin/v1/keys/{k['id']}").status_code == 404


def test_a_key_budget_runs_out_and_an_expired_key_is_refused(gw):
    w, admin = gw
    # A request reserves its worst case, ~(9 prompt + 8 output tokens) at 1/2 USD per 1M:
    # ~2.5e-5 USD, and costs at least 8e-6 USD (4 output tokens). A budget of 5e-5 USD
    # admits a few requests, then refuses with 429.
    k = admin.create(tenant="acme", budget={"usd": 0.00005, "period": "1h"})
    assert k["budget"] == {"usd": 0.00005, "period": "3600s"}
    codes = [chat(w, k["key"]).status_code for _ in range(6)]
    assert codes[0] == 200 and codes[-1] == 429, codes
    r = chat(w, k["key"])
    assert r.json()["error"]["code"] == "insufficient_quota" and k["id"] in r.json()["error"]["message"], r.text
    usage = admin("GET", f"/admin/v1/keys/{k['id']}").json()["usage"]["budget"]
    assert usage["limit_usd"] == pytest.approx(0.00005) and 0 < usage["spent_usd"] <= 0.00005
    assert usage["remaining_usd"] == pytest.approx(0.00005 - usage["spent_usd"])
    # The tenant has no budget: its other keys go on.
    assert chat(w, "sk-acme-cfg").status_code == 200

    # Expiry: in the future it works; moved into the past, the key is refused saying so.
    e = admin.create(tenant="acme", expires_at=int(time.time()) + 3600)
    assert chat(w, e["key"]).status_code == 200
    r = admin("PATCH", f"/admin/v1/keys/{e['id']}", json={"expires_at": "2020-01-01T00:00:00Z"})
    assert r.status_code == 200 and r.json()["expires_at"] == 1577836800, r.text
    r = chat(w, e["key"])
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"], r.text
    # The log names the expired key and its tenant: whose request was refused.
    line = w.log_for(r.headers["x-request-id"])
    assert (line["tenant"], line["key_id"]) == ("acme", e["id"]), line
    assert admin("GET", f"/admin/v1/keys/{e['id']}").json()["expired"] is True
    # A key created with an expiry a second away stops working by itself.
    soon = admin.create(tenant="acme", expires_at=int(time.time()) + 2)
    assert chat(w, soon["key"]).status_code == 200
    wait_until(lambda: chat(w, soon["key"]).status_code == 401, 5, 0.2, "the key to expire")


def test_a_budget_429_says_when_the_budget_admits_again(gw):
    w, admin = gw
    # Spent within its hour: Retry-After (whole seconds) runs to the end of the period,
    # the current UTC hour (duration periods are aligned to Unix time, as with Redis).
    k = admin.create(tenant="acme", budget={"usd": 0.00005, "period": "1h"})
    for _ in range(8):
        r = chat(w, k["key"])
        if r.status_code == 429:
            break
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
    retry = r.headers.get("retry-after")
    assert retry is not None and retry.isdigit(), r.headers
    left = 3600 - time.time() % 3600
    assert left - 30 <= int(retry) <= left + 30, (retry, left)
    # The x-ratelimit-* lines of the tenant's requests bucket still come with it.
    assert r.headers["x-ratelimit-limit-requests"] == "1000", r.headers
    # A budget that never resets: no Retry-After (no wait helps).
    never = admin.create(tenant="acme", budget={"usd": 0.00005})
    for _ in range(8):
        r = chat(w, never["key"])
        if r.status_code == 429:
            break
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
    assert "retry-after" not in r.headers, r.headers
    # Nor for $0.
    zero = admin.create(tenant="acme", budget={"usd": 0, "period": "1h"})
    r = chat(w, zero["key"])
    assert r.status_code == 429 and "retry-after" not in r.headers, (r.text, r.headers)


# A field of POST/PATCH /admin/v1/keys, a value of the wrong JSON type, and the param the 400 names.
WRONG_TYPES = [
    ({"limits": {"requests_per_minute": "60"}}, "limits.requests_per_minute"),
    ({"limits": {"tokens_per_minute": True}}, "limits.tokens_per_minute"),
    ({"limits": {"max_concurrent_streams": 1.5}}, "limits.max_concurrent_streams"),
    ({"limits": {"requests_per_minute": 5, "requests_burst": "10"}}, "limits.requests_burst"),
    ({"limits": {"tokens_burst": [100]}}, "limits.tokens_burst"),
    ({"limits": {"tokens_per_minute": None}}, "limits.tokens_per_minute"),
    ({"budget": {"usd": "25"}}, "budget.usd"),
    ({"budget": {"usd": False}}, "budget.usd"),
    ({"budget": {"usd": 1, "period": 1.5}}, "budget.period"),
    ({"budget": {"usd": 1, "period": True}}, "budget.period"),
    ({"expires_at": True}, "expires_at"),
    ({"expires_at": 1900000000.5}, "expires_at"),
    ({"expires_at": "1900000000"}, "expires_at"),
]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_numeric_key_fields_take_json_numbers_only(gw, method):
    w, admin = gw
    k = admin.create(tenant="acme", limits={"requests_per_minute": 7})
    for body, param in WRONG_TYPES:
        if method == "POST":
            r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", **body})
        else:
            r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, (body, r.text)
    # Nothing changed, nothing was created.
    assert admin("GET", f"/admin/v1/keys/{k['id']}").json()["limits"] == {"requests_per_minute": 7}
    assert len(admin("GET", "/admin/v1/keys").json()["data"]) == 2  # the config key and k
    # A number without a fraction is an integer (JSON Schema's "integer"); 0 means no limit.
    body = {"limits": {"requests_per_minute": 60.0, "tokens_per_minute": 0}, "budget": {"usd": 2, "period": 3600000},
            "expires_at": 1900000000.0}
    if method == "POST":
        r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", **body})
        assert r.status_code == 201, r.text
    else:
        r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json=body)
        assert r.status_code == 200, r.text
    got = r.json()
    assert got["limits"] == {"requests_per_minute": 60}, got
    assert got["budget"] == {"usd": 2.0, "period": "3600s"} and got["expires_at"] == 1900000000, got
    r = admin("PATCH", f"/admin/v1/keys/{got['id']}", json={"limits": {"requests_per_minute": 0}})
    assert r.status_code == 200 and r.json()["limits"] == {}, r.text


def test_runtime_keys_survive_a_restart_with_keys_file(mock, weir, tmp_path):
    m = mock(*MOCK_FLAGS)
    keys_file = tmp_path / "keys.json"
    w, admin = start(m, weir, keys_file=str(keys_file))
    k = admin.create(tenant="acme", models=["m"], limits={"requests_per_minute": 50}, metadata={"owner": "ci"})
    gone = admin.create(tenant="acme")
    assert admin("DELETE", f"/admin/v1/keys/{gone['id']}").status_code == 200
    assert stat.S_IMODE(os.stat(keys_file).st_mode) == 0o600
    text = keys_file.read_text()
    assert k["key"] not in text and sha(k["key"]) in text and gone["id"] not in text
    assert admin("GET", "/admin/v1/keys").json()["persistence"] == "keys_file"
    w.process.stop()

    w2 = weir(config=config(m, int(admin.base.rsplit(":", 1)[1]), keys_file=str(keys_file)), env=ENV)
    wait_until(lambda: _ready(admin), 5, message="admin listener after the restart")
    assert sdk_chat(w2, k["key"])
    assert chat(w2, gone["key"]).status_code == 401
    got = admin("GET", f"/admin/v1/keys/{k['id']}").json()
    assert got["limits"] == {"requests_per_minute": 50} and got["models"] == ["m"] and got["metadata"] == {"owner": "ci"}


def test_metrics_and_ready_on_the_admin_port_and_scrapes_write_no_log_line(gw):
    w, admin = gw
    r = admin("GET", "/metrics", token=None)
    assert r.status_code == 200 and "weir_requests_total" in r.text, r.text[:200]
    assert r.headers["content-type"].startswith("text/plain")
    assert admin("GET", "/ready", token=None).json() == {"status": "ready"}
    r = chat(w, "sk-acme-cfg")
    assert r.status_code == 200
    entries = w.wait_log(lambda es: any(e.get("path") == "/v1/chat/completions" for e in es), 5)
    assert not [e for e in entries if e.get("path") == "/metrics"], entries
    # With tenants and an admin listener, /metrics (every tenant's spend) is the admin listener's only
    # (server.metrics.client_port's default then): the client port has no such route.
    assert httpx.get(w.base_url + "/metrics").status_code == 404


def redis_config(mock, redis, admin_port: int) -> dict:
    cfg = config(mock, admin_port)
    cfg["auth"].update({"redis_keys": True, "key_cache_ttl": "300ms", "key_negative_ttl": "100ms"})
    cfg["redis"] = {"url": redis.url, "key_prefix": f"weir-admin-{redis.port}:"}
    return cfg


def test_with_redis_a_key_created_on_one_replica_works_on_another(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    port_a, port_b = free_port(), free_port()
    a = weir(config=redis_config(m, redis, port_a), env=ENV)
    b = weir(config=redis_config(m, redis, port_b), env=ENV)
    admin_a, admin_b = Admin(port_a), Admin(port_b)
    wait_until(lambda: _ready(admin_a) and _ready(admin_b), 5, message="admin listeners")

    k = admin_a.create(tenant="acme", models=["m"], metadata={"team": "c"}, name="shared")
    assert sdk_chat(b, k["key"]) and sdk_chat(a, k["key"])
    # Both replicas' admin APIs list it (from Redis).
    listed = admin_b("GET", "/admin/v1/keys").json()
    assert listed["persistence"] == "redis"
    mine = [x for x in listed["data"] if x["id"] == k["id"]]
    assert mine and mine[0]["metadata"] == {"team": "c"} and mine[0]["models"] == ["m"] and "key" not in mine[0]

    # A change made through B reaches A within the key cache TTL.
    r = admin_b("PATCH", f"/admin/v1/keys/{k['id']}", json={"models": ["other"]})
    assert r.status_code == 200 and r.json()["models"] == ["other"], r.text
    # Each worker's key cache expires on its own: wait for both answers (a request may land on either worker).
    wait_until(lambda: chat(a, k["key"], "m").status_code == 404, 5, 0.05, "the narrowed models on A")
    wait_until(lambda: chat(a, k["key"], "other").status_code == 200, 5, 0.05, "the new model on A")

    # Expiry in Redis: refused saying so.
    r = admin_a("PATCH", f"/admin/v1/keys/{k['id']}", json={"expires_at": "2020-01-01T00:00:00Z"})
    assert r.status_code == 200, r.text
    def expired_on_b() -> bool:
        r = chat(b, k["key"], "other")
        return r.status_code == 401 and "expired" in r.json()["error"]["message"]
    wait_until(expired_on_b, 5, 0.05, "the expired key on B")
    r = admin_a("PATCH", f"/admin/v1/keys/{k['id']}", json={"expires_at": None})
    assert r.status_code == 200 and r.json()["expires_at"] is None, r.text

    # Rotate on A: the new secret works on B, the old one stops.
    r = admin_a("POST", f"/admin/v1/keys/{k['id']}/rotate")
    assert r.status_code == 200, r.text
    new = r.json()["key"]
    wait_until(lambda: chat(b, new, "other").status_code == 200, 5, 0.05, "the rotated key on B")
    wait_until(lambda: chat(b, k["key"], "other").status_code == 401, 5, 0.05, "the old secret refused on B")

    # Revoke on B: A refuses it within the TTL.
    assert admin_b("DELETE", f"/admin/v1/keys/{k['id']}").status_code == 200
    wait_until(lambda: chat(a, new, "other").status_code == 401, 5, 0.05, "the revoked key on A")
    assert admin_a("GET", f"/admin/v1/keys/{k['id']}").status_code == 404


def test_with_redis_a_key_with_its_own_limit_and_budget_holds_them_across_replicas(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    port_a, port_b = free_port(), free_port()
    a = weir(config=redis_config(m, redis, port_a), env=ENV)
    b = weir(config=redis_config(m, redis, port_b), env=ENV)
    admin_a, admin_b = Admin(port_a), Admin(port_b)
    wait_until(lambda: _ready(admin_a) and _ready(admin_b), 5, message="admin listeners")

    # 3 requests a minute for the key, shared by both replicas (the tenant allows 1000).
    k = admin_a.create(tenant="acme", limits={"requests_per_minute": 3})
    assert k["limits"] == {"requests_per_minute": 3}
    assert admin_b("GET", f"/admin/v1/keys/{k['id']}").json()["limits"] == {"requests_per_minute": 3}
    answers = [chat(w, k["key"]) for w in (a, b, a, b, a, b, a, b)]
    codes = [r.status_code for r in answers]
    # Never more than the shared bucket holds; a replica may park a unit it leased (the
    # documented under-admission), so not always all three.
    assert 1 <= codes.count(200) <= 3 and codes.count(200) + codes.count(429) == 8, codes
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded", refused.text
    assert f"key `{k['id']}`" in refused.json()["error"]["message"], refused.text
    assert chat(a, "sk-acme-cfg").status_code == 200  # the tenant's other key goes on
    usage = admin_a("GET", f"/admin/v1/keys/{k['id']}").json()["usage"]
    assert usage["requests"]["limit"] == 3, usage
    # Raised through B: both replicas admit again within the key cache TTL.
    r = admin_b("PATCH", f"/admin/v1/keys/{k['id']}", json={"limits": {"requests_per_minute": 1000}})
    assert r.status_code == 200 and r.json()["limits"] == {"requests_per_minute": 1000}, r.text
    wait_until(lambda: chat(a, k["key"]).status_code == 200, 5, 0.05, "the raised limit on A")
    wait_until(lambda: chat(b, k["key"]).status_code == 200, 5, 0.05, "the raised limit on B")

    # A budget of 5e-5 USD an hour: a request reserves ~2.5e-5 and costs at least 8e-6
    # (4 output tokens at 2 USD per 1M), so at most 6 are admitted across both replicas.
    q = admin_b.create(tenant="acme", budget={"usd": 0.00005, "period": "1h"})
    codes = []
    for _ in range(20):
        for w in (a, b):
            codes.append(chat(w, q["key"]).status_code)
        if codes[-2:] == [429, 429]:
            break
    assert codes[0] == 200 and codes[-2:] == [429, 429], codes
    assert codes.count(200) <= 6, codes
    r = chat(a, q["key"])
    assert r.json()["error"]["code"] == "insufficient_quota" and q["id"] in r.json()["error"]["message"], r.text
    # Both replicas count every replica's spend.
    def spent(admin):
        u = admin("GET", f"/admin/v1/keys/{q['id']}").json().get("usage") or {}
        return (u.get("budget") or {}).get("spent_usd", 0)
    wait_until(lambda: spent(admin_a) > 0 and spent(admin_a) == spent(admin_b), 5, 0.05, "the same spend on A and B")
    assert spent(admin_a) <= 0.00005 + 1e-12
    # Invalid limits written to Redis by hand: the key is refused (401), not let through unlimited.
    key = "sk-weir-by-hand-0123456789"
    h = f"weir-admin-{redis.port}:key:{sha(key)}"
    redis.cli("HSET", h, "id", "by-hand", "tenant", "acme", "limits", '{"requests_per_minute": -1}')
    assert chat(a, key).status_code == 401
    # Nor can the admin API rewrite it into a key without limits: not listed, not found, not changed.
    assert admin_a("PATCH", "/admin/v1/keys/by-hand", json={"name": "renamed"}).status_code == 404
    assert "by-hand" not in [x["id"] for x in admin_a("GET", "/admin/v1/keys").json()["data"]]
    assert chat(b, key).status_code == 401
    redis.cli("HSET", h, "limits", '{"requests_per_minute": 1}')
    wait_until(lambda: chat(b, key).status_code == 200, 5, 0.05, "the repaired record")


def test_with_redis_limits_a_keys_file_key_gets_its_own_limit(tmp_path, mock, weir, redis):
    # redis: for the shared limiter, keys kept in a keys file (not in Redis).
    m = mock(*MOCK_FLAGS)
    port = free_port()
    cfg = config(m, port, keys_file=str(tmp_path / "keys.json"))
    cfg["redis"] = {"url": redis.url, "key_prefix": f"weir-kf-{redis.port}:"}
    w = weir(config=cfg, env=ENV)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    k = admin.create(tenant="acme", limits={"requests_per_minute": 2}, budget={"usd": 1, "period": "day"})
    codes = [chat(w, k["key"]).status_code for _ in range(5)]
    assert 1 <= codes.count(200) <= 2 and codes[-1] == 429, codes
    usage = admin("GET", f"/admin/v1/keys/{k['id']}").json()["usage"]
    assert usage["requests"]["limit"] == 2 and usage["budget"]["limit_usd"] == 1, usage
    assert usage["budget"]["window_start"].endswith("T00:00:00Z"), usage
    assert chat(w, "sk-acme-cfg").status_code == 200


def test_the_request_log_is_queried_through_the_admin_api(tmp_path, mock, weir):
    m = mock(*MOCK_FLAGS)
    port = free_port()
    cfg = config(m, port)
    cfg["request_log"] = {"url": f"sqlite:{tmp_path}/requests.db", "flush_interval": "10ms"}
    w = weir(config=cfg, env=ENV)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    ids = []
    for i in range(5):
        r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                       headers={"authorization": "Bearer sk-acme-cfg", "x-request-id": f"req-{i}"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        ids.append(f"req-{i}")
    assert chat(w, "sk-wrong").status_code == 401

    def stored():
        got = admin("GET", "/admin/v1/requests?limit=1000").json()["data"]
        return len(got) >= 6
    wait_until(stored, 5, message="six stored requests")
    # Pages of two, newest first, by keyset cursor, until has_more is false.
    seen, cursor = [], None
    while True:
        r = admin("GET", "/admin/v1/requests", params={"tenant": "acme", "limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["object"] == "list" and len(page["data"]) <= 2
        seen += [d["request_id"] for d in page["data"]]
        if not page["has_more"]:
            assert page["next_cursor"] is None
            break
        cursor = page["next_cursor"]
    assert seen == list(reversed(ids))
    # Filters: status, and one request by id.
    (bad,) = admin("GET", "/admin/v1/requests?status=401").json()["data"]
    assert bad["status"] == 401
    one = admin("GET", "/admin/v1/requests/req-3")
    assert one.status_code == 200 and one.json()["request_id"] == "req-3" and one.json()["key_id"] == "acme-cfg"
    assert admin("GET", "/admin/v1/requests/nope").status_code == 404
    # Bad query parameters: 400 naming them; no token: 401.
    r = admin("GET", "/admin/v1/requests?limit=0")
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
    assert admin("GET", "/admin/v1/requests", token=None).status_code == 401


def test_without_a_request_log_the_request_routes_say_so(mock, weir):
    _, admin = start(mock(*MOCK_FLAGS), weir)
    r = admin("GET", "/admin/v1/requests")
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_request_log"


def test_stats_count_traffic_by_model_and_tenant_and_pools_show_endpoints(gw):
    w, admin = gw
    assert admin("GET", "/admin/v1/stats", token=None).status_code == 401
    assert admin("GET", "/admin/v1/pools", token=None).status_code == 401
    before = admin("GET", "/admin/v1/stats").json()
    assert sdk_chat(w, "sk-acme-cfg")  # a stream: it has a TTFT
    assert chat(w, "sk-acme-cfg", "nope").status_code in (403, 404)
    assert chat(w, "sk-wrong").status_code == 401
    admin("GET", "/metrics", token=None)  # scrapes are not traffic
    s = admin("GET", "/admin/v1/stats").json()
    assert s["object"] == "stats" and s["time_ms"] >= before["time_ms"]
    m = {x["model"]: x for x in s["models"]}
    assert m["m"]["requests"] == 1 and m["m"]["status"] == {"200": 1}
    assert m["m"]["ttft"]["count"] == 1 and m["m"]["ttft"]["buckets"][-1] == 1
    assert len(m["m"]["ttft"]["buckets"]) == len(s["ttft_buckets_s"]) + 1
    assert m["m"]["spend_usd"] > 0 and m["m"]["completion_tokens"] > 0
    assert sum(x["requests"] for x in s["models"]) == 3, s["models"]
    assert sum(x["errors_4xx"] for x in s["models"]) == 2
    (acme,) = [t for t in s["tenants"] if t["tenant"] == "acme"]
    assert acme["requests"] == 2 and acme["errors_4xx"] == 1 and acme["ttft"]["count"] == 1
    assert acme["ttft"]["sum_s"] > 0 and acme["spend_usd"] == pytest.approx(m["m"]["spend_usd"])
    # The same TTFT by tenant in /metrics (sum and count).
    text = admin("GET", "/metrics", token=None).text
    assert 'weir_tenant_time_to_first_token_seconds_count{model="m",tenant="acme"} 1' in text

    p = admin("GET", "/admin/v1/pools").json()
    assert p["object"] == "list" and p["workers"] == 2
    (pool,) = p["data"]
    assert pool["name"] == "p" and pool["models"] == ["m", "other"] and pool["healthy_endpoints"] == 1
    (ep,) = pool["endpoints"]
    assert ep["health"] == "up" and ep["attempts"] >= 1 and ep["in_flight"] == 0
    assert ep["idle_connections"] >= 1 and set(ep["failures"]) >= {"connect_refused", "reset", "timeout"}


def test_pools_show_an_endpoint_that_refuses_connections_as_ejected(mock, weir):
    m = mock(*MOCK_FLAGS)
    port, dead = free_port(), free_port()
    cfg = config(m, port)
    cfg["pools"]["p"] = {"endpoints": [m.base_url, f"http://127.0.0.1:{dead}/?token=s3cret"], "eject_for": "60s"}
    w = weir(config=cfg, env=ENV, workers=1)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    # p2c tries both endpoints soon; a refused connect is retried on the other one.
    wait_until(lambda: chat(w, "sk-acme-cfg").status_code == 200 and
               admin("GET", "/admin/v1/pools").json()["data"][0]["healthy_endpoints"] == 1
               and admin("GET", "/admin/v1/pools").json()["data"][0]["endpoints"][1]["attempts"] > 0,
               10, 0.01, "the dead endpoint tried")
    ep = admin("GET", "/admin/v1/pools").json()["data"][0]["endpoints"][1]
    assert ep["health"] == "ejected" and ep["ejected_workers"] == 1 and 0 < ep["ejected_ms"] <= 60000, ep
    assert ep["failures"]["connect_refused"] >= 1 and "s3cret" not in ep["url"]


def test_a_calendar_day_budget_resets_at_the_next_utc_midnight(gw):
    """budget.period: "day" (docs/admission.md, "Periods"): created and patched through the
    admin API, refused through the openai SDK with insufficient_quota and a Retry-After
    that runs to the next 00:00 UTC; usage shows the day's window."""
    w, admin = gw
    k = admin.create(tenant="acme", budget={"usd": 0.00005, "period": "Day"})
    assert k["budget"] == {"usd": 0.00005, "period": "day"}, k
    client = openai.OpenAI(base_url=w.v1, api_key=k["key"], max_retries=0, timeout=30)
    err = None
    for _ in range(8):
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except openai.RateLimitError as e:
            err = e
            break
    assert err is not None, "the day's budget never ran out"
    assert err.body["code"] == "insufficient_quota", err.body
    now = time.time()
    to_midnight = 86400 - now % 86400
    retry = err.response.headers.get("retry-after")
    assert retry is not None and retry.isdigit(), err.response.headers
    assert abs(int(retry) - to_midnight) <= 5, (retry, to_midnight)
    got = admin("GET", f"/admin/v1/keys/{k['id']}").json()
    assert got["budget"] == {"usd": 0.00005, "period": "day"}, got["budget"]
    usage = got["usage"]["budget"]
    day = time.strftime("%Y-%m-%d", time.gmtime(now))
    nxt = time.strftime("%Y-%m-%d", time.gmtime(now + to_midnight + 1))
    assert usage["period"] == "day" and usage["window_start"] == f"{day}T00:00:00Z", usage
    assert usage["window_end"] == f"{nxt}T00:00:00Z", usage
    assert 0 < usage["spent_usd"] <= 0.00005 + 1e-12, usage

    # PATCH to a week and a month; a word that is not a period is a 400 naming budget.period.
    r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"budget": {"usd": 1, "period": "WEEK"}})
    assert r.status_code == 200 and r.json()["budget"] == {"usd": 1.0, "period": "week"}, r.text
    r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"budget": {"usd": 1, "period": "month"}})
    assert r.status_code == 200 and r.json()["budget"]["period"] == "month", r.text
    month = admin("GET", f"/admin/v1/keys/{k['id']}").json()["usage"]["budget"]
    assert month["window_start"] == time.strftime("%Y-%m-01T00:00:00Z", time.gmtime(now)), month
    r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", "budget": {"usd": 1, "period": "fortnight"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "budget.period", r.text
    assert "day, week, month" in r.json()["error"]["message"], r.text


def test_with_redis_a_change_made_here_takes_effect_here_at_once(mock, weir, redis):
    # A long key cache: the replica that revokes, rotates or narrows a key drops its own cached
    # lookups before it answers, so nothing here waits for the TTL (other replicas do: docs/admin-api.md).
    m = mock(*MOCK_FLAGS)
    port = free_port()
    cfg = redis_config(m, redis, port)
    cfg["auth"]["key_cache_ttl"] = "60s"
    w = weir(config=cfg, env=ENV, workers=2)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    k = admin.create(tenant="acme")
    for _ in range(6):   # cached on both workers (connections spread over them)
        assert chat(w, k["key"], "other").status_code == 200
    r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"models": ["m"]})
    assert r.status_code == 200, r.text
    assert [chat(w, k["key"], "other").status_code for _ in range(6)] == [404] * 6
    r = admin("POST", f"/admin/v1/keys/{k['id']}/rotate")
    assert r.status_code == 200, r.text
    new = r.json()["key"]
    assert [chat(w, k["key"]).status_code for _ in range(6)] == [401] * 6
    assert [chat(w, new).status_code for _ in range(6)] == [200] * 6
    assert admin("DELETE", f"/admin/v1/keys/{k['id']}").status_code == 200
    assert [chat(w, new).status_code for _ in range(6)] == [401] * 6


def test_an_empty_models_list_and_the_implicit_anonymous_tenant_are_refused(mock, weir):
    w, admin = start(mock(*MOCK_FLAGS), weir)
    r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", "models": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "models", r.text
    k = admin.create(tenant="acme", models=["m"])
    r = admin("PATCH", f"/admin/v1/keys/{k['id']}", json={"models": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "models", r.text
    assert chat(w, k["key"]).status_code == 200   # unchanged
    # "anonymous" exists only for requests without credentials: no key may name it.
    r = admin("POST", "/admin/v1/keys", json={"tenant": "anonymous"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "tenant_not_found", r.text


def test_every_admin_request_has_one_access_log_line_without_its_credential(mock, weir):
    # Wrong tokens (a brute force) and a key's creation are an operator's to see, as any request is.
    m = mock(*MOCK_FLAGS)
    w, admin = start(m, weir)
    for i in range(3):
        assert admin("GET", "/admin/v1/keys", token=f"wrong-token-{i}").status_code == 401
    created = admin.create(tenant="acme", name="audited")
    assert admin("GET", "/metrics", token=None).status_code == 200  # a scrape: not logged

    def admin_lines(es):
        return [e for e in es if e.get("listener") == "admin" and e.get("path", "").startswith("/admin/")]

    entries = w.wait_log(lambda es: len(admin_lines(es)) >= 4, message="admin log lines")
    lines = admin_lines(entries)
    assert [(e["method"], e["status"]) for e in lines] == [("GET", 401)] * 3 + [("POST", 201)], lines
    assert all(e["duration_ms"] >= 0 and e["bytes_out"] > 0 for e in lines), lines
    assert not [e for e in entries if e.get("listener") == "admin" and e.get("path") == "/metrics"], entries
    text = w.access_log_path.read_text()
    assert "wrong-token" not in text and TOKEN not in text and created["key"] not in text
