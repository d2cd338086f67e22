"""Virtual keys stored in Redis (auth.redis_keys, docs/auth.md "Keys in Redis"):
created and revoked with scripts/weir-key against a real redis-server, used by
the official openai SDK through two Weir replicas."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
MOCK_FLAGS = ("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "4", "--model", "m")


def weir_key(redis, *args: str) -> str:
    """Runs scripts/weir-key; its stdout (the new key for `add`)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts/weir-key"), args[0], "--redis", redis.url,
                          "--prefix", prefix(redis), *args[1:]],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def prefix(redis) -> str:
    return f"weir-keys-{redis.port}:"


def config(mock, redis, **auth_extra) -> dict:
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p"}, "other": {"pool": "p", "upstream_model": "m"}},
        "tenants": {"acme": {"models": ["m", "other"]}},
        "auth": {"required": True, "redis_keys": True, **auth_extra},
        "redis": {"url": redis.url, "key_prefix": prefix(redis)},
    }


def chat(w, key: str, model: str = "m") -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_a_key_added_in_redis_works_on_every_replica_and_revoking_it_ends_it(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, key_cache_ttl="300ms", key_negative_ttl="100ms")
    a, b = weir(config=cfg), weir(config=cfg)
    key = weir_key(redis, "add", "--tenant", "acme", "--id", "acme-ci")
    assert key.startswith("sk-weir-")

    for w in (a, b):
        client = openai.OpenAI(base_url=w.v1, api_key=key, max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    entries = a.wait_log(lambda es: len(es) >= 1, 10)
    assert entries[0]["tenant"] == "acme" and entries[0]["key_id"] == "acme-ci"
    # The key and its hash stay out of the access log.
    log_text = "".join(w.access_log_path.read_text() for w in (a, b))
    assert key not in log_text and key[8:20] not in log_text

    # Unknown keys are refused (and the refusal is OpenAI-shaped).
    r = chat(a, "sk-weir-not-a-key")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text

    revoked_at = time.monotonic()
    weir_key(redis, "revoke", "--id", "acme-ci")
    # Every replica refuses it once its cached answer (300 ms) expires. Each worker of a replica caches
    # on its own, so one refusal shows only that one worker's entry has gone: past the TTL every request
    # must be refused, whichever worker takes it.
    for w in (a, b):
        wait_until(lambda: chat(w, key).status_code == 401, 5, message="revoked key refused")
    time.sleep(max(0.0, revoked_at + 0.3 - time.monotonic()))
    for w in (a, b):
        assert [chat(w, key).status_code for _ in range(8)] == [401] * 8
    # The refusal's log line names the revoked key: who still uses it.
    r = chat(a, key)
    line = a.log_for(r.headers["x-request-id"])
    assert (r.status_code, line["tenant"], line["key_id"]) == (401, "acme", "acme-ci"), line


def test_a_key_narrowed_to_models_and_a_key_for_an_unknown_tenant(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis))
    narrow = weir_key(redis, "add", "--tenant", "acme", "--id", "narrow", "--models", "m")
    assert chat(w, narrow, "m").status_code == 200
    r = chat(w, narrow, "other")
    # Answered as an unknown model (docs/auth.md); the log says it was refused.
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert w.log_for(r.headers["x-request-id"])["error"]["code"] == "model_not_allowed"
    stray = weir_key(redis, "add", "--tenant", "nobody", "--id", "stray")
    r = chat(w, stray)
    assert r.status_code == 403, r.text
    assert "error" in r.json()
    line = w.log_for(r.headers["x-request-id"])
    assert (line["tenant"], line["key_id"]) == ("nobody", "stray"), line


def test_redis_down_cached_keys_keep_working_and_new_ones_get_503(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, key_cache_ttl="60s"), workers=1)
    known = weir_key(redis, "add", "--tenant", "acme", "--id", "known")
    unseen = weir_key(redis, "add", "--tenant", "acme", "--id", "unseen")
    # The one worker caches `known`.
    for _ in range(8):
        assert chat(w, known).status_code == 200
    redis.kill()
    t0 = time.monotonic()
    r = chat(w, unseen)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["message"]
    assert time.monotonic() - t0 < 5   # bounded by redis.command_timeout, not hung
    for _ in range(8):
        assert chat(w, known).status_code == 200
    # One lookup found `known` (the other seven hit the cache); `unseen` found Redis gone.
    assert w.metric("weir_redis_key_lookups_total", result="found") == 1
    assert w.metric("weir_redis_key_lookups_total", result="unavailable") >= 1


def test_a_key_added_with_its_own_limit_is_held_to_it_on_every_replica(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, key_cache_ttl="300ms", key_negative_ttl="100ms")
    a, b = weir(config=cfg), weir(config=cfg)
    key = weir_key(redis, "add", "--tenant", "acme", "--id", "acme-ci", "--limits", '{"requests_per_minute": 2}')
    codes = [chat(w, key).status_code for w in (a, b, a, b, a, b)]
    assert 1 <= codes.count(200) <= 2 and codes.count(429) >= 4, codes
    # What the gateway would refuse is refused before anything is stored.
    bad = subprocess.run([sys.executable, str(ROOT / "scripts/weir-key"), "add", "--redis", redis.url, "--prefix",
                          prefix(redis), "--tenant", "acme", "--id", "bad", "--limits", '{"requests_per_minute": -1}'],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "requests_per_minute" in bad.stderr and not bad.stdout, (bad.stdout, bad.stderr)
    # Another key of the same tenant has no such limit.
    other = weir_key(redis, "add", "--tenant", "acme", "--id", "acme-other")
    assert [chat(w, other).status_code for w in (a, b, a, b)] == [200] * 4


def test_hand_written_records_that_do_not_read_are_refused_and_cannot_forge_log_lines(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, key_cache_ttl="300ms", key_negative_ttl="100ms"))

    def hset(key: str, *fields: str) -> None:
        redis.cli("HSET", prefix(redis) + "key:" + hashlib.sha256(key.encode()).hexdigest(), *fields)

    # A record's id with a line break cannot write a line of its own into the log (first: invalid
    # records are logged once per 10 s).
    forged = "sk-weir-forged-id"
    hset(forged, "id", "evil\nweir: redis: FORGED LINE", "tenant", "acme", "limits", "{not json")
    assert chat(w, forged).status_code == 401
    wait_until(lambda: "invalid limits or budget" in w.process.log(), 5, message="the invalid record logged")
    assert not any(line.startswith("weir: redis: FORGED") for line in w.process.log().splitlines())
    assert "evil\\x0aweir: redis: FORGED LINE" in w.process.log()
    # expires_at is Unix seconds: a date, a negative number or text is refused, never "no expiry".
    for i, bad in enumerate(["2020-01-01T00:00:00Z", "-5", "abc", "1e9"]):
        key = f"sk-weir-bad-expiry-{i}"
        hset(key, "id", f"bad-expiry-{i}", "tenant", "acme", "expires_at", bad)
        r = chat(w, key)
        assert r.status_code == 401, (bad, r.text)
    later = "sk-weir-good-expiry"
    hset(later, "id", "good-expiry", "tenant", "acme", "expires_at", str(int(time.time()) + 3600))
    assert chat(w, later).status_code == 200
    # "0" is a time (1970), as "1" is: expired, never "no expiry" (the admin API writes "" for that).
    for i, past in enumerate(["0", "1"]):
        key = f"sk-weir-epoch-{i}"
        hset(key, "id", f"epoch-{i}", "tenant", "acme", "expires_at", past)
        assert chat(w, key).status_code == 401, past


def test_a_redis_record_cannot_take_a_configured_keys_id(mock, weir, redis):
    # Key ids are unique: a record reusing a configured key's id would mix two credentials (and
    # two tenants) in the log, the metrics and a shared limit's key:<id>.
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, api_keys=[{"id": "cfg-1", "sha256": hashlib.sha256(b"sk-cfg-1").hexdigest(),
                                      "tenant": "acme"}])
    w = weir(config=cfg)
    for key, rid in (("sk-weir-clash", "cfg-1"), ("sk-weir-own", "own-1")):
        redis.cli("HSET", prefix(redis) + "key:" + hashlib.sha256(key.encode()).hexdigest(), "id", rid,
                  "tenant", "acme")
    assert chat(w, "sk-weir-clash").status_code == 401
    assert chat(w, "sk-weir-own").status_code == 200
    assert chat(w, "sk-cfg-1").status_code == 200
