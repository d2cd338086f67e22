"""Defects of the admin API's validation found in stop 56's attack round (docs/admin-api.md, docs/auth.md,
docs/console.md): an empty bearer credential against the empty string's hash, a runtime key's model names that
changed meaning in Redis, credential query names the URL redaction missed, limits read with the wrong reason or
as 0, claim paths with empty steps, and dialogs left over the sign-in form."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time

import httpx
import jwt
# (tests/e2e/requirements.txt; a missing package is an error here, not a skip: CI must run this.)
import playwright.sync_api as playwright_api
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import binary, free_port, wait_until
from test_admission import rsa_jwk

TOKEN = "admin-fixes-56-token-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
ADMIN = {"authorization": f"Bearer {TOKEN}"}
EMPTY_SHA = hashlib.sha256(b"").hexdigest()  # e3b0c442...b855: `printf %s "$UNSET" | sha256sum`


def weir_check(tmp_path, cfg_text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "c.yaml"
    path.write_text(cfg_text)
    return subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                          timeout=10, env={**os.environ, **ENV})


def base_config(admin_port: int, upstream: str = "http://127.0.0.1:9", **admin_extra) -> dict:
    return {
        "pools": {"p": {"endpoints": [upstream]}},
        "models": {"m": {"pool": "p", "default_max_tokens": 4}},
        "tenants": {"acme": {"models": ["m"]}},
        "auth": {"required": True},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN", **admin_extra},
    }


def start(weir, cfg: dict, admin_port: int):
    w = weir(config=cfg, env=ENV)
    base = f"http://127.0.0.1:{admin_port}"

    def ready() -> bool:
        try:
            return httpx.get(base + "/ready", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False

    wait_until(ready, 5, message="admin listener")
    return w, base


# DEFECT 1: admin.token_sha256 set to the empty string's SHA-256 (a hash of an unset variable) passed --check, and
# then "Authorization: Bearer" with no token was full admin (201 on POST /admin/v1/keys), while the client port
# refused the same header. The hash is refused at load (admin.token_sha256 and auth.api_keys[].sha256), and the
# scheme alone is no credential on the admin port: 401 as a missing header, never hashed.
@pytest.mark.parametrize("where", ["admin", "api_key"])
def test_the_empty_strings_sha256_is_refused_at_load(tmp_path, where):
    port = free_port()
    admin = (f"admin: {{listen: 127.0.0.1:{port}, token_sha256: {EMPTY_SHA}}}\n" if where == "admin"
             else f"admin: {{listen: 127.0.0.1:{port}, token_env: WEIR_TEST_ADMIN_TOKEN}}\n")
    keys = f"  api_keys: [{{id: k, tenant: acme, sha256: {EMPTY_SHA}}}]\n" if where == "api_key" else ""
    r = weir_check(tmp_path, f"""listen: 127.0.0.1:{free_port()}
pools: {{p: {{endpoints: ["http://127.0.0.1:9"]}}}}
models: {{m: {{pool: p}}}}
tenants: {{acme: {{models: [m]}}}}
auth:
  required: true
{keys}{admin}""")
    assert r.returncode == 2, (r.stdout, r.stderr)
    key = "admin.token_sha256" if where == "admin" else "auth.api_keys[0].sha256"
    assert key in r.stderr and "SHA-256 of the empty string" in r.stderr, r.stderr


def test_the_bearer_scheme_without_a_token_is_no_admin_credential(weir):
    port = free_port()
    _, base = start(weir, base_config(port), port)
    for header in ["Bearer", "Bearer ", "bearer   ", "BEARER\t"]:
        # (Raw bytes: httpx refuses a field value with whitespace at its end, which a client may still send.)
        body = b'{"tenant": "acme"}'
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + header.encode() +
                         b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                         % len(body) + body)
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        head, _, text = raw.decode().partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 401 "), (header, raw)
        assert "didn't provide an admin token" in json.loads(text)["error"]["message"], text
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:])}
        # RFC 6750 §3.1: no error code when no token was presented.
        assert fields["www-authenticate"] == 'Bearer realm="weir-admin"', head
    assert httpx.get(base + "/admin/v1/keys", headers=ADMIN).status_code == 200


# DEFECT 2: with auth.redis_keys a key's models are one comma-joined Redis field, split and trimmed (empty items
# dropped) on read. So ["zzz,m"] granted m, [","] and [" "] widened a narrowed key to the tenant's every model,
# and a list over the lookup's 16 KiB was created (201) and then refused on every request (401). GET showed the
# list untrimmed. Names that would change meaning are refused (400, models[N]) in both stores; GET shows what
# requests are checked against.
BAD_MODELS = [[","], [" "], ["zzz,m"], ["zzz, m"], [" m"], ["m "], ["a\u0000b"], ["a\tb"], [""]]
MANY_MODELS = ["m"] + [f"some-org/model-variant-{i:04d}" for i in range(700)]


def redis_config(admin_port: int, redis, upstream: str) -> dict:
    cfg = base_config(admin_port, upstream)
    cfg["auth"].update({"redis_keys": True, "key_cache_ttl": "300ms", "key_negative_ttl": "100ms"})
    cfg["redis"] = {"url": redis.url, "key_prefix": f"fix56-{redis.port}:"}
    return cfg


def chat(w, key: str) -> int:
    return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_model_names_that_change_meaning_in_redis_are_refused_in_both_stores(mock, weir, request, store):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2", "--model", "m")
    port = free_port()
    if store == "redis":
        cfg = redis_config(port, request.getfixturevalue("redis"), m.base_url)
    else:
        cfg = base_config(port, m.base_url)
    w, base = start(weir, cfg, port)
    for models in BAD_MODELS:
        r = httpx.post(base + "/admin/v1/keys", headers=ADMIN, json={"tenant": "acme", "models": ["zzz", *models]})
        assert r.status_code == 400, (models, r.text)
        assert r.json()["error"]["param"] == "models[1]", r.text
    r = httpx.post(base + "/admin/v1/keys", headers=ADMIN, json={"tenant": "acme", "models": MANY_MODELS})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "models" and "16384 bytes" in r.json()["error"]["message"], r.text
    assert httpx.get(base + "/admin/v1/keys", headers=ADMIN).json()["data"] == []
    # What is accepted means the same in both: a narrowed key stays narrowed, a prefix pattern works.
    narrow = httpx.post(base + "/admin/v1/keys", headers=ADMIN, json={"tenant": "acme", "models": ["zzz"]}).json()
    wide = httpx.post(base + "/admin/v1/keys", headers=ADMIN, json={"tenant": "acme", "models": ["zzz", "m*"]}).json()
    assert chat(w, narrow["key"]) == 404
    assert chat(w, wide["key"]) == 200
    # PATCH refuses the same names.
    p = httpx.patch(base + f"/admin/v1/keys/{narrow['id']}", headers=ADMIN, json={"models": ["zzz,m"]})
    assert p.status_code == 400 and p.json()["error"]["param"] == "models[0]", p.text
    assert chat(w, narrow["key"]) == 404


def test_a_redis_record_is_listed_as_requests_read_it(mock, weir, redis):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2", "--model", "m")
    port = free_port()
    cfg = redis_config(port, redis, m.base_url)
    w, base = start(weir, cfg, port)
    # A record as scripts/weir-key writes `--models "m, zzz"`: the lookup trims each item.
    key = "sk-weir-fix56-hand-made-0123456789"
    record = cfg["redis"]["key_prefix"] + "key:" + hashlib.sha256(key.encode()).hexdigest()
    assert redis.cli("HSET", record, "id", "hand", "tenant", "acme", "models", "m, zzz").startswith(b":")
    assert chat(w, key) == 200
    got = httpx.get(base + "/admin/v1/keys/hand", headers=ADMIN)
    assert got.status_code == 200, got.text
    assert got.json()["models"] == ["m", "zzz"]
    # And a PATCH of another field keeps it (its list re-read passes the checks).
    p = httpx.patch(base + "/admin/v1/keys/hand", headers=ADMIN, json={"name": "renamed"})
    assert p.status_code == 200, p.text
    assert p.json()["models"] == ["m", "zzz"]
    assert chat(w, key) == 200


# DEFECT 3: URL redaction missed query names real providers put credentials under: Azure Functions' `code`,
# Firebase's `auth`, `pwd`. /admin/v1/pools and /metrics (no token needed) showed them.
def test_provider_query_credentials_are_redacted_in_pools_and_metrics(weir):
    port = free_port()
    secrets = {"code": "AZFUNC_SECRET", "auth": "FIREBASE_SECRET", "pwd": "PW_SECRET", "passphrase": "PP_SECRET",
               "session": "SESSION_SECRET", "db_pwd": "DB_SECRET"}
    query = "&".join(f"{k}={v}" for k, v in secrets.items()) + "&api-version=2024-10-21"
    cfg = base_config(port, f"http://127.0.0.1:9/api?{query}")
    _, base = start(weir, cfg, port)
    pools = httpx.get(base + "/admin/v1/pools", headers=ADMIN).text
    metrics = httpx.get(base + "/metrics").text
    for text in (pools, metrics):
        for v in secrets.values():
            assert v not in text
        assert "code=REDACTED" in text and "auth=REDACTED" in text and "api-version=2024-10-21" in text


# DEFECT 4: a limit of 1e30 was refused as "not a number with a fraction", and 1e-400 (a double's underflow)
# was read as 0, no limit. Out of range says so; a number that underflows is a 400 wherever it is.
def test_limits_out_of_range_or_underflowing_are_refused_for_the_right_reason(weir):
    port = free_port()
    _, base = start(weir, base_config(port), port)

    def create(body: str) -> httpx.Response:
        return httpx.post(base + "/admin/v1/keys", headers={**ADMIN, "content-type": "application/json"},
                          content=body)

    r = create('{"tenant": "acme", "limits": {"requests_per_minute": 1e30}}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "limits.requests_per_minute"
    assert "out of range" in r.json()["error"]["message"] and "fraction" not in r.json()["error"]["message"], r.text
    for body in ('{"tenant": "acme", "limits": {"requests_per_minute": 1e-400}}',
                 '{"tenant": "acme", "budget": {"usd": 1e-400}}',
                 '{"tenant": "acme", "metadata": {"n": 0.1e-330}}'):
        r = create(body)
        assert r.status_code == 400, (body, r.text)
        assert "too small for a double" in r.json()["error"]["message"], r.text
    assert httpx.get(base + "/admin/v1/keys", headers=ADMIN).json()["data"] == []
    ok = create('{"tenant": "acme", "limits": {"requests_per_minute": 6e1}, "metadata": {"z": 0e-400, "s": "1e-400"}}')
    assert ok.status_code == 201, ok.text
    assert ok.json()["limits"] == {"requests_per_minute": 60}
    p = httpx.patch(base + f"/admin/v1/keys/{ok.json()['id']}", headers={**ADMIN, "content-type": "application/json"},
                    content='{"limits": {"requests_per_minute": 1e-400}}')
    assert p.status_code == 400, p.text
    assert httpx.get(base + f"/admin/v1/keys/{ok.json()['id']}", headers=ADMIN).json()["limits"] == {
        "requests_per_minute": 60}


# DEFECT 5: admin.jwt_claim took ".", "a..b", "a." (empty claim names), and a namespaced claim such as
# https://example.com/admin could never match: the path was split at every dot. Empty steps are refused at load;
# a top-level claim with the whole name is found first.
@pytest.mark.parametrize("claim", [".", "a..b", "a.", ".a"])
def test_a_claim_path_with_an_empty_step_is_refused(tmp_path, claim):
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [rsa_jwk(rsa.generate_private_key(public_exponent=65537, key_size=2048),
                                                 "k1")]}))
    r = weir_check(tmp_path, f"""listen: 127.0.0.1:{free_port()}
pools: {{p: {{endpoints: ["http://127.0.0.1:9"]}}}}
models: {{m: {{pool: p}}}}
tenants: {{acme: {{models: [m]}}}}
auth:
  jwt: {{jwks_file: {jwks}, issuer: "https://idp.test/", audience: weir}}
admin: {{listen: 127.0.0.1:{free_port()}, token_env: WEIR_TEST_ADMIN_TOKEN, jwt_claim: "{claim}"}}
""")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "admin.jwt_claim" in r.stderr and "empty step" in r.stderr, r.stderr


def test_a_namespaced_admin_claim_is_found_by_its_whole_name(weir, tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [rsa_jwk(key, "k1")]}))
    port = free_port()
    cfg = base_config(port, jwt_claim="https://example.com/admin")
    cfg["auth"]["jwt"] = {"jwks_file": str(jwks), "issuer": "https://idp.test/", "audience": "weir"}
    _, base = start(weir, cfg, port)
    now = int(time.time())

    def token(claims: dict) -> str:
        return jwt.encode({"iss": "https://idp.test/", "aud": "weir", "sub": "ops", "exp": now + 600, **claims}, key,
                          algorithm="RS256", headers={"kid": "k1"})

    ok = httpx.get(base + "/admin/v1/keys", headers={"authorization": "Bearer " + token(
        {"https://example.com/admin": True})})
    assert ok.status_code == 200, ok.text
    for claims in ({"https://example.com/admin": "true"}, {"https://example": {"com/admin": False}}, {}):
        r = httpx.get(base + "/admin/v1/keys", headers={"authorization": "Bearer " + token(claims)})
        assert r.status_code == 401, (claims, r.text)


# DEFECT 6: the console's secret and confirm dialogs are attached to <body>, outside #app: when the session ended
# (idle timeout, a refused token) the sign-in form was drawn under a dialog still showing the new key's secret.
CHROMIUM = os.environ.get("WEIR_CHROMIUM", "/usr/bin/chromium")


def test_console_dialogs_close_when_the_session_ends(weir):
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not installed: run scripts/setup (Debian's chromium)", pytrace=False)
    port = free_port()
    _, base = start(weir, base_config(port), port)
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(8000)
            expect = playwright_api.expect

            def sign_in():
                page.goto(base + "/console/")
                page.fill("#token", TOKEN)
                page.click("#login button[type=submit]")
                expect(page.locator("#tile-rps")).to_be_visible()

            # A new key's secret on screen, then the server refuses the token (rotated; the stats poll finds out).
            sign_in()
            page.get_by_role("link", name="Keys", exact=True).click()
            page.click("#new-key")
            page.select_option("#key-tenant", "acme")
            page.click("#key-create")
            secret = page.locator("#new-secret").input_value()
            assert secret.startswith("sk-weir-")
            page.evaluate("sessionStorage.setItem('weir.console.token', 'rotated-away')")
            expect(page.locator("#login-error")).to_contain_text("refused the token", timeout=8000)
            expect(page.locator(".overlay")).to_have_count(0)
            assert secret not in page.content()

            # A revoke confirmation, then the idle timeout ends the session (its check runs on any render).
            sign_in()
            page.get_by_role("link", name="Keys", exact=True).click()
            page.locator("#keys-table .revoke").first.click()
            expect(page.locator("#confirm-go")).to_be_visible()
            page.evaluate("sessionStorage.setItem('weir.console.active', String(Date.now() - 31 * 60 * 1000))")
            page.evaluate("location.hash = '#/overview'")
            expect(page.locator("#login-error")).to_contain_text("expired")
            expect(page.locator(".overlay")).to_have_count(0)
        finally:
            browser.close()
