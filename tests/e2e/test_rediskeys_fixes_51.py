"""Keys in Redis through a Redis outage (docs/auth.md, "Keys in Redis"), and a
JWKS with no usable key said once (docs/auth.md, "JWT"):

- With redis.fail_open and auth.key_stale_ttl set (default 0: off), a key
  Redis vouched for keeps working past its key_cache_ttl while Redis does not
  answer (stale-if-error), for at most auth.key_stale_ttl more, counted in weir_redis_key_stale_served_total; a
  key never seen, or seen revoked, still gets 503. (It got 503 as soon as its
  cache entry expired, whatever fail_open said.)
- An empty key set refetched unchanged is not announced again on every
  refetch, only when the document changes."""

from __future__ import annotations

import json
import time

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import wait_until
from test_admission import JwksServer
from test_redis_keys import MOCK_FLAGS, chat, config, weir_key


def test_with_fail_open_a_key_seen_before_outlives_its_cache_ttl_while_redis_is_down(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, key_cache_ttl="300ms", key_negative_ttl="200ms", key_stale_ttl="5m")
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


# Serving stale is off by default (auth.key_stale_ttl 0): a key revoked in Redis while its entry sat expired
# with no request to refresh it would otherwise work through an outage that follows.
def test_without_a_stale_ttl_the_key_gets_503_once_its_entry_expires(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, key_cache_ttl="300ms")
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


def test_an_empty_jwks_is_announced_once_per_document_not_per_refetch(mock, weir):
    m = mock(*MOCK_FLAGS)
    k1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k1.public_key()))
    jwk.update({"kid": "k1", "alg": "RS256", "use": "sig"})
    server = JwksServer()
    try:
        server.jwks = {"keys": [jwk]}
        w = weir(config={
            "pools": {"p": {"endpoints": [m.base_url]}},
            "models": {"m": {"pool": "p"}},
            "tenants": {"acme": {}},
            "auth": {"jwt": {"jwks_url": server.url, "min_refetch_interval": "100ms", "refresh_interval": "1s"}},
        }, workers=1)
        said = "holds no key Weir can verify with"

        def chat_jwt() -> int:
            # A token no key in use verifies asks for a refetch (at most one per min_refetch_interval).
            now = int(time.time())
            tok = jwt.encode({"sub": "u", "tenant": "acme", "iat": now, "exp": now + 600}, k1, algorithm="RS256",
                             headers={"kid": "k1"})
            return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {tok}"}, timeout=10,
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code

        def refetched(times: int) -> None:
            hits = server.hits
            wait_until(lambda: chat_jwt() and server.hits >= hits + times, 15, interval=0.15,
                       message=f"{times} refetches of the same key set")

        wait_until(lambda: chat_jwt() == 200, 5, interval=0.05, message="the key set loaded")
        server.jwks = {"keys": []}  # the issuer withdrew every key
        wait_until(lambda: said in w.process.log(), 5, message="the empty set announced")
        refetched(4)
        assert w.process.log().count(said) == 1, w.process.log()
        # Another document, still with no usable key: said again, once.
        server.jwks = {"keys": [], "note": "still none"}
        wait_until(lambda: w.process.log().count(said) >= 2, 5, message="the changed empty set announced")
        refetched(4)
        assert w.process.log().count(said) == 2, w.process.log()
        assert chat_jwt() == 401  # the empty set in use: tokens refused, Weir serving
    finally:
        server.close()
