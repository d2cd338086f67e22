"""Keys in Redis through a Redis outage (docs/auth.md, "Keys in Redis"):

- With redis.fail_open, a key Redis vouched for keeps working past its
  key_cache_ttl while Redis does not answer (stale-if-error), for at most
  auth.key_stale_ttl more, counted in weir_redis_key_stale_served_total; a
  key never seen, or seen revoked, still gets 503. (It got 503 as soon as its
  cache entry expired, whatever fail_open said.)"""

from __future__ import annotations

import time

from conftest import wait_until
from test_redis_keys import MOCK_FLAGS, chat, config, weir_key


def test_with_fail_open_a_key_seen_before_outlives_its_cache_ttl_while_redis_is_down(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, key_cache_ttl="300ms", key_negative_ttl="200ms")  # key_stale_ttl: 5m
    cfg["redis"]["fail_open"] = True
    cfg["redis"]["command_timeout"] = "300ms"
    w = weir(config=cfg, workers=1)
    known = weir_key(redis, "add", "--tenant", "acme", "--id", "known")
    revoked = weir_key(redis, "add", "--tenant", "acme", "--id", "was-revoked")
    unseen = weir_key(redis, "add", "--tenant", "acme", "--id", "unseen")
    assert chat(w, known).status_code == 200
    assert chat(w, revoked).status_code == 200
    # Revoked in Redis (not through this replica's admin API): the cache sees it once its entry expires.
    weir_key(redis, "revoke", "--id", "was-revoked")
    wait_until(lambda: chat(w, revoked).status_code == 401, 5, message="the revocation seen")
    r = chat(w, known)  # (a fresh entry, vouched for by Redis just now)
    assert r.status_code == 200, r.text
    vouched = time.monotonic()

    redis.kill()
    # Past key_cache_ttl: the one worker must ask Redis, which does not answer.
    time.sleep(max(0.0, vouched + 0.4 - time.monotonic()))
    statuses = [chat(w, known).status_code for _ in range(5)]
    assert statuses == [200] * 5, statuses
    assert w.metric("weir_redis_key_stale_served_total") >= 5
    # A key the cache never saw gets 503; one it saw revoked is never served stale.
    r = chat(w, unseen)
    assert r.status_code == 503 and r.json()["error"]["message"], r.text
    # (Its refusal, cached for key_negative_ttl before `vouched`, has expired: Redis is asked, and does not answer.)
    r = chat(w, revoked)
    assert r.status_code == 503, r.text
    assert chat(w, known).status_code == 200


def test_a_stale_key_gets_503_once_key_stale_ttl_has_passed_too(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, key_cache_ttl="300ms", key_stale_ttl="3s")
    cfg["redis"]["command_timeout"] = "300ms"
    w = weir(config=cfg, workers=1)
    known = weir_key(redis, "add", "--tenant", "acme", "--id", "known")
    assert chat(w, known).status_code == 200
    vouched = time.monotonic()
    redis.kill()
    # Bounded: key_cache_ttl + key_stale_ttl after Redis last vouched for it, the key gets 503 too.
    seen: list[int] = []
    wait_until(lambda: seen.append(chat(w, known).status_code) or seen[-1] == 503, 10, interval=0.1,
               message="the stale cap reached")
    assert set(seen[:-1]) <= {200}, seen
    assert time.monotonic() - vouched >= 3.0


def test_without_a_stale_ttl_the_key_gets_503_once_its_entry_expires(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, key_cache_ttl="300ms", key_stale_ttl=0)
    cfg["redis"]["command_timeout"] = "300ms"
    w = weir(config=cfg, workers=1)
    known = weir_key(redis, "add", "--tenant", "acme", "--id", "known")
    assert chat(w, known).status_code == 200
    vouched = time.monotonic()
    redis.kill()
    time.sleep(max(0.0, vouched + 0.4 - time.monotonic()))
    r = chat(w, known)
    assert r.status_code == 503, r.text
    assert w.metric("weir_redis_key_stale_served_total") == 0

