"""Credential-store fixes of stop 60 (docs/auth.md):

- An RSA JWK is checked as RFC 8017 §3.1 asks (e odd, 3 <= e, and below 2^32; n odd): a key with e = 1
  let anyone sign (the PKCS#1 v1.5 encoding of a token's hash is its own signature); it is skipped as
  malformed, and a token naming it is a 401.
- A token without a kid is checked against the first 4 keys of its kind, not every one: a JWKS of
  thousands of keys made each unsigned token (no credential needed) seconds of a worker's time.
- Two live Redis key records with one id: one key holds the id (the lower digest, on every replica),
  the other is refused as invalid; they shared one rate limit and budget (key:<id>), even across tenants.
  A revoked (rotated) holder gives the id to the other."""

from __future__ import annotations

import base64
import hashlib
import json
import time

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from conftest import wait_until
from test_admission import MOCK_FLAGS, base_config, chat, ec_jwk


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def jwks_file(tmp_path, keys: list[dict]) -> str:
    p = tmp_path / "jwks.json"
    p.write_text(json.dumps({"keys": keys}))
    return str(p)


def jwt_cfg(m, path: str) -> dict:
    cfg = base_config(m)
    cfg["auth"]["jwt"] = {"issuer": "https://idp.test/", "audience": "weir", "jwks_file": path}
    return cfg


def claims() -> dict:
    now = int(time.time())
    return {"iss": "https://idp.test/", "aud": "weir", "sub": "u", "tenant": "acme", "iat": now, "exp": now + 600}


def test_an_rsa_key_with_e_1_is_malformed_and_cannot_be_forged_with(mock, weir, tmp_path):
    m = mock(*MOCK_FLAGS)
    n = int.from_bytes(hashlib.sha512(b"n").digest() * 4, "big") | (1 << 2047) | 1  # any odd 2048-bit n
    rsa_key = {"kty": "RSA", "n": b64u(n.to_bytes(256, "big")), "alg": "RS256", "use": "sig"}
    keys = [dict(rsa_key, kid="e1", e="AQ"),  # 1
            dict(rsa_key, kid="even", e="AQAA"),  # 65536
            dict(rsa_key, kid="huge", e=b64u(b"\x01" + b"\x00" * 383 + b"\x01")),  # 3,073 bits
            ec_jwk(ec.generate_private_key(ec.SECP256R1()), "good")]
    w = weir(config=jwt_cfg(m, jwks_file(tmp_path, keys)))
    # The forgery: with e = 1, s^e mod n = s, so the padded hash itself is the "signature".
    head = b64u(json.dumps({"alg": "RS256", "kid": "e1", "typ": "JWT"}).encode())
    si = head + "." + b64u(json.dumps(claims()).encode())
    di = bytes.fromhex("3031300d060960864801650304020105000420") + hashlib.sha256(si.encode()).digest()
    em = b"\x00\x01" + b"\xff" * (256 - 3 - len(di)) + b"\x00" + di
    r = chat(w, si + "." + b64u(em))
    assert r.status_code == 401, r.text
    assert "the key `e1` is not usable" in r.json()["error"]["message"], r.text
    # Each is named on stderr, with why.
    wait_until(lambda: "RSA exponent e must be odd" in w.process.log(), 5, message="skipped keys on stderr")
    lines = [ln for ln in w.process.log().splitlines() if "RSA exponent e must be odd" in ln]
    for kid in ("e1", "even", "huge"):
        assert any(kid in ln for ln in lines), lines


def test_a_token_without_a_kid_is_tried_against_the_first_keys_of_its_kind_only(mock, weir, tmp_path):
    m = mock(*MOCK_FLAGS)
    eds = [ed25519.Ed25519PrivateKey.generate() for _ in range(6)]
    jwks = []
    for i, k in enumerate(eds):
        j = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(k.public_key()))
        j.update({"kid": f"ed{i}", "alg": "EdDSA", "use": "sig"})
        jwks.append(j)
    w = weir(config=jwt_cfg(m, jwks_file(tmp_path, jwks)))
    first = jwt.encode(claims(), eds[0], algorithm="EdDSA")  # no kid header
    fourth = jwt.encode(claims(), eds[3], algorithm="EdDSA")
    sixth = jwt.encode(claims(), eds[5], algorithm="EdDSA")
    assert "kid" not in jwt.get_unverified_header(sixth)
    assert chat(w, first).status_code == 200
    assert chat(w, fourth).status_code == 200
    r = chat(w, sixth)
    assert r.status_code == 401, r.text
    assert "first 4 keys for alg EdDSA" in r.json()["error"]["message"], r.text
    # With its kid, the sixth key is found.
    assert chat(w, jwt.encode(claims(), eds[5], algorithm="EdDSA", headers={"kid": "ed5"})).status_code == 200


# --- One key per id (keys in Redis) ---

def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def redis_cfg(m, redis) -> dict:
    cfg = base_config(m)
    cfg["tenants"]["gamma"] = {}
    cfg["auth"].update({"redis_keys": True, "key_cache_ttl": "300ms", "key_negative_ttl": "100ms"})
    cfg["redis"] = {"url": redis.url, "key_prefix": f"w60-{redis.port}:"}
    return cfg


def ordered_secrets(a: str = "sk-dup-one", b: str = "sk-dup-two") -> tuple[str, str]:
    """Two secrets, the one with the lower SHA-256 first."""
    return (a, b) if sha(a) < sha(b) else (b, a)


def put(redis, secret: str, *fields: str):
    assert redis.cli("HSET", f"w60-{redis.port}:key:{sha(secret)}", *fields).startswith(b":")


def test_a_second_live_record_with_a_keys_id_is_refused_not_given_its_limits(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    w = weir(config=redis_cfg(m, redis))
    low, high = ordered_secrets()
    limits = '{"requests_per_minute": 3}'
    put(redis, low, "id", "dup", "tenant", "acme", "limits", limits)
    put(redis, high, "id", "dup", "tenant", "gamma", "limits", limits)
    assert chat(w, low).status_code == 200
    assert chat(w, low).status_code == 200
    # Another tenant's record under the same id: it took the first's limit (and budget), key:dup.
    r = chat(w, high)
    assert r.status_code == 401, r.text
    wait_until(lambda: "claims the id of another live key record" in w.process.log(), 5,
               message="the refused record logged")
    assert chat(w, low).status_code == 200  # the holder is untouched (its third request of three)
    # A rotation: the holder is revoked, the other record takes the id over, and its limit (the key's) goes on.
    put(redis, low, "revoked", "1")
    wait_until(lambda: chat(w, low).status_code == 401, 5, message="revoked key refused")
    wait_until(lambda: chat(w, high).status_code != 401, 5, message="the other record takes the id")
    assert chat(w, high).status_code == 429


def test_the_lower_digest_holds_the_id_whichever_a_replica_saw_first(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    w = weir(config=redis_cfg(m, redis))
    low, high = ordered_secrets()
    put(redis, high, "id", "twin", "tenant", "gamma", "limits", '{"requests_per_minute": 100}')
    assert chat(w, high).status_code == 200
    put(redis, low, "id", "twin", "tenant", "acme", "limits", '{"requests_per_minute": 100}')
    assert chat(w, low).status_code == 200  # takes the id over
    # Once its cached answer expires, the higher one is refused: the same choice every replica makes.
    wait_until(lambda: chat(w, high).status_code == 401, 5, message="the higher digest refused")
    assert chat(w, low).status_code == 200
    # Without limits too: an id names one key in the logs and metrics as well. (Two secrets not looked up
    # before: a lookup cached above would answer for key_cache_ttl, and only a lookup claims an id.)
    low, high = ordered_secrets("sk-plain-one", "sk-plain-two")
    put(redis, high, "id", "plain", "tenant", "acme")
    put(redis, low, "id", "plain", "tenant", "acme")
    assert chat(w, low).status_code == 200
    assert chat(w, high).status_code == 401
