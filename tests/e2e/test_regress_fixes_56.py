"""Regressions of stop 56's keys-file, admin and claim fixes (each test fails on the build before its fix):

- a key revoked here (or a secret rotated away here) is never admitted again when the keys file is read again,
  whatever an older Weir sharing the file (no lock, no re-read) writes into it; the file is written again
  without them (docs/operations.md, "Zero-downtime restart");
- a keys file moved away or deleted is as an invalid one: the keys stay with their buckets, and a file
  brought back with the same ids keeps their admission state (docs/admin-api.md, Persistence);
- two endpoints differing only in a redacted query value are two endpoints, each shown by a name of its own;
- a JWT claim path is read as nested claims first; a top-level claim with dots in its name only when that finds
  nothing, longest name first (docs/auth.md);
- an admin key change waiting for another process's FILE.lock gives up after a short bound (503);
- the console shows no new secret after the session ended while the create or rotation was in flight."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import binary, free_port, wait_until
from test_admission import rsa_jwk

TOKEN = "regress56-admin-token-0123456789"
ENV = {"WEIR_RG56_ADMIN": TOKEN}
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHROMIUM = os.environ.get("WEIR_CHROMIUM", "/usr/bin/chromium")


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def keys_config(m, aport: int, keys_file) -> dict:
    return {"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
            "tenants": {"acme": {"models": ["m"]}}, "auth": {"required": True},
            "admin": {"listen": f"127.0.0.1:{aport}", "token_env": "WEIR_RG56_ADMIN", "keys_file": str(keys_file)}}


def chat(w, key: str) -> int:
    r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    return r.status_code


def write_keys(path, keys: list[dict]) -> None:
    """What an older Weir does on its next change: the whole file from its memory, replaced by rename, no lock."""
    tmp = path.with_name(path.name + ".other")
    tmp.write_text(json.dumps({"version": 1, "keys": keys}))
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)


def handmade(like: dict, secret: str, kid: str) -> dict:
    """A key record an older Weir created (a key this process never saw), with a secret the test knows."""
    return {**like, "id": kid, "name": kid, "sha256": sha(secret)}


def test_a_key_revoked_or_rotated_here_is_never_admitted_again_by_a_re_read(mock, weir, tmp_path):
    # An older Weir sharing the file (the first zero-downtime restart onto this build) writes it from its
    # memory without the lock: the revoked key (and the rotated key's old secret) were back in it, and this
    # instance's once-a-second check installed them: the revoked key worked again.
    m = mock()
    aport = free_port()
    keys_file = tmp_path / "keys.json"
    w = weir(config=keys_config(m, aport, keys_file), workers=1, env=ENV)
    with httpx.Client(base_url=f"http://127.0.0.1:{aport}", headers=AUTH, timeout=10) as admin:
        gone = admin.post("/admin/v1/keys", json={"tenant": "acme", "name": "leaked"}).json()
        turned = admin.post("/admin/v1/keys", json={"tenant": "acme", "name": "rotated"}).json()
        old_memory = json.loads(keys_file.read_text())["keys"]  # what the older Weir holds
        assert admin.delete(f"/admin/v1/keys/{gone['id']}").status_code == 200
        r = admin.post(f"/admin/v1/keys/{turned['id']}/rotate")
        assert r.status_code == 200, r.text
        rotated = r.json()
        assert chat(w, gone["key"]) == 401 and chat(w, turned["key"]) == 401 and chat(w, rotated["key"]) == 200

        # The older Weir creates a key: its write holds everything it remembers.
        write_keys(keys_file, old_memory + [handmade(old_memory[0], "sk-made-by-the-old-one-0001", "vk_oldbuild1")])
        wait_until(lambda: chat(w, "sk-made-by-the-old-one-0001") == 200, 5, interval=0.05,
                   message="the older Weir's key read in")
        assert chat(w, gone["key"]) == 401  # revoked here: never again
        assert chat(w, turned["key"]) == 401  # rotated away here
        assert chat(w, rotated["key"]) == 200
        listed = {k["id"] for k in admin.get("/admin/v1/keys").json()["data"]}
        assert listed == {turned["id"], "vk_oldbuild1"}

        # The file is written again without them: a later reader (the next restart) admits neither.
        def repaired():
            keys = {k["id"]: k for k in json.loads(keys_file.read_text())["keys"]}
            return set(keys) == {turned["id"], "vk_oldbuild1"} and keys[turned["id"]]["sha256"] == sha(rotated["key"])
        wait_until(repaired, 5, interval=0.05, message="the keys file written again")
        assert "held keys revoked here" in w.process.log()
        assert admin.get(f"/admin/v1/keys/{gone['id']}").status_code == 404


def test_a_keys_file_moved_away_or_deleted_keeps_the_keys_and_their_buckets(mock, weir, tmp_path):
    # The file moved away (a backup by mv, then cp back): every runtime key was 401 within a second, and the
    # same keys coming back started with fresh buckets (a rate limit reset by a file move).
    m = mock()
    aport = free_port()
    keys_file = tmp_path / "keys.json"
    w = weir(config=keys_config(m, aport, keys_file), workers=1, env=ENV)
    with httpx.Client(base_url=f"http://127.0.0.1:{aport}", headers=AUTH, timeout=10) as admin:
        k = admin.post("/admin/v1/keys", json={"tenant": "acme", "limits": {"requests_per_minute": 3}}).json()
        assert [chat(w, k["key"]) for _ in range(4)] == [200, 200, 200, 429]

        os.rename(keys_file, tmp_path / "keys.json.bak")
        wait_until(lambda: "is gone (moved or deleted)" in w.process.log(), 5, interval=0.05,
                   message="the missing file said on stderr")
        assert chat(w, k["key"]) == 429  # still the key, still limited (not 401)
        assert [x["id"] for x in admin.get("/admin/v1/keys").json()["data"]] == [k["id"]]
        assert w.process.log().count("is gone (moved or deleted)") == 1  # said once

        # Back, with a key added meanwhile by hand: read again; the known id keeps its bucket.
        saved = json.loads((tmp_path / "keys.json.bak").read_text())["keys"]
        write_keys(keys_file, saved + [handmade(saved[0], "sk-added-by-hand-0001", "vk_byhand1")])
        wait_until(lambda: chat(w, "sk-added-by-hand-0001") == 200, 5, interval=0.05, message="the file read again")
        assert chat(w, k["key"]) == 429

        # Deleted: the keys stay, and the next change writes the file with all of them.
        os.unlink(keys_file)
        wait_until(lambda: w.process.log().count("is gone (moved or deleted)") == 2, 5, interval=0.05,
                   message="the deleted file said on stderr")
        assert chat(w, k["key"]) == 429
        assert chat(w, "sk-added-by-hand-0001") == 200
        k2 = admin.post("/admin/v1/keys", json={"tenant": "acme"})
        assert k2.status_code == 201, k2.text
        assert {x["id"] for x in json.loads(keys_file.read_text())["keys"]} == {k["id"], "vk_byhand1", k2.json()["id"]}
    # (A file that never existed at start-up is an empty store, as before: every other keys_file test.)


@pytest.mark.parametrize("name", ["session", "code", "auth", "pass", "key", "token"])
def test_two_endpoints_differing_only_in_a_redacted_query_value_are_two_endpoints(mock, weir, tmp_path, name):
    # They were refused at load as one endpoint listed twice: identity was compared on the redacted display.
    m = mock()
    aport = free_port()
    cfg = {"pools": {"p": {"endpoints": [f"{m.base_url}/v1?{name}=alpha1", f"{m.base_url}/v1?{name}=beta2"]}},
           "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
           "admin": {"listen": f"127.0.0.1:{aport}", "token_env": "WEIR_RG56_ADMIN"}}
    path = tmp_path / "two.yaml"
    from conftest import to_yaml
    path.write_text(to_yaml({**cfg, "listen": "127.0.0.1:1"}) + "\n")
    r = subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                       timeout=10, env={**os.environ, **ENV})
    assert r.returncode == 0, r.stderr
    w = weir(config=cfg, workers=1, env=ENV)
    urls = [e["url"] for p in httpx.get(f"http://127.0.0.1:{aport}/admin/v1/pools", headers=AUTH).json()["data"]
            for e in p["endpoints"]]
    assert urls == [f"{m.base_url}/v1?{name}=REDACTED", f"{m.base_url}/v1?{name}=REDACTED#1"], urls
    metrics = httpx.get(f"http://127.0.0.1:{aport}/metrics").text
    assert "alpha1" not in metrics and "beta2" not in metrics
    assert f'endpoint="{m.base_url}/v1?{name}=REDACTED#1"' in metrics
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=30)
    assert client.chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])

    # The same endpoint twice is still refused; the message shows the redacted form, never the value.
    path.write_text(to_yaml({**cfg, "listen": "127.0.0.1:1", "pools": {"p": {"endpoints": [
        f"{m.base_url}/v1?{name}=alpha1", f"{m.base_url}/v1?{name}=alpha1"]}}}) + "\n")
    r = subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                       timeout=10, env={**os.environ, **ENV})
    assert r.returncode == 2 and "again" in r.stderr and "alpha1" not in r.stderr, r.stderr


def test_a_claim_path_reads_nested_claims_first_then_namespaced_names(mock, weir, tmp_path):
    # A top-level claim named with the whole dotted path won over the nested claim, even null or a number:
    # the tenant switched to what a flat member said (or the token was refused).
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [rsa_jwk(key, "k1")]}))
    m = mock()

    def start(tenant_claim: str, subject_claim: str = "sub"):
        return weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
                            "tenants": {"t": {}, "other": {}},
                            "auth": {"jwt": {"jwks_file": str(jwks), "issuer": "https://idp.test/", "audience": "weir",
                                             "tenant_claim": tenant_claim, "subject_claim": subject_claim}}},
                    workers=1)

    def who(w, claims: dict) -> tuple:
        tok = jwt.encode({"iss": "https://idp.test/", "aud": "weir", "exp": int(time.time()) + 600, **claims}, key,
                         algorithm="RS256", headers={"kid": "k1"})
        rid = f"rg56-{len(w.log_entries())}-{time.monotonic_ns()}"
        r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {tok}", "x-request-id": rid},
                       json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}, timeout=30)
        e = w.log_for(rid)
        return r.status_code, e.get("tenant"), e.get("subject")

    w = start("org.id", "user.name")
    assert who(w, {"org": {"id": "t"}, "user": {"name": "alice"}}) == (200, "t", "alice")
    assert who(w, {"org": {"id": "t"}, "org.id": "other", "user": {"name": "alice"}, "user.name": "mallory"}) == \
        (200, "t", "alice")
    assert who(w, {"org": {"id": "t"}, "org.id": 5, "user": {"name": "alice"}, "user.name": None}) == \
        (200, "t", "alice")
    assert who(w, {"org": {"id": "t"}, "org.id": None}) == (200, "t", None)
    assert who(w, {"org.id": "t"}) == (200, "t", None)  # nothing nested: the whole name
    w.process.stop()
    w = start("https://example.com/tenant", "https://example.com/user")
    assert who(w, {"https://example.com/tenant": "t", "https://example.com/user": "bob"}) == (200, "t", "bob")
    w.process.stop()
    w = start("https://example.com/claims.tenant")  # Auth0 style: a namespaced claim, then a nested step
    assert who(w, {"https://example.com/claims": {"tenant": "t"}, "sub": "s1"}) == (200, "t", "s1")
    assert who(w, {"https://example.com/claims": {"tenant": "other"}, "https://example.com/claims.tenant": "t",
                   "sub": "s1"}) == (200, "t", "s1")  # the longest top-level name first


def test_a_key_change_waiting_for_another_process_lock_gives_up_within_a_short_bound(mock, weir, tmp_path):
    # The wait was up to 2 s with the admin control thread asleep (every admin call, /metrics and the
    # console stalled): now a short bound, then the same 503.
    m = mock()
    aport = free_port()
    keys_file = tmp_path / "keys.json"
    w = weir(config=keys_config(m, aport, keys_file), workers=1, env=ENV)
    with httpx.Client(base_url=f"http://127.0.0.1:{aport}", headers=AUTH, timeout=10) as admin:
        fd = os.open(str(keys_file) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another Weir writing
            r = admin.post("/admin/v1/keys", json={"tenant": "acme"})
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["code"] == "service_unavailable"
            assert "for over 200 ms" in err["message"] and "retry" in err["message"], err
            assert admin.get("/admin/v1/keys").json()["data"] == []  # nothing changed
        finally:
            os.close(fd)  # (released)
        r = admin.post("/admin/v1/keys", json={"tenant": "acme"})
        assert r.status_code == 201, r.text
        assert chat(w, r.json()["key"]) == 200


def test_the_console_shows_no_secret_when_the_session_ended_while_the_create_was_in_flight(mock, weir, tmp_path):
    # The create's answer arrived after the sign-out; its secret dialog opened over the sign-in form.
    import playwright.sync_api as playwright_api
    from playwright.sync_api import expect
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not installed: run scripts/setup (Debian's chromium)", pytrace=False)
    m = mock()
    aport = free_port()
    keys_file = tmp_path / "keys.json"
    weir(config=keys_config(m, aport, keys_file), workers=1, env=ENV)
    base = f"http://127.0.0.1:{aport}"
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(8000)
            page.goto(base + "/console/")
            page.fill("#token", TOKEN)
            page.click("#login button[type=submit]")
            page.get_by_role("link", name="Keys", exact=True).click()

            held = []  # the create and the rotation, held in flight until the user has signed out
            page.route("**/admin/v1/keys", lambda route: held.append(route) if route.request.method == "POST"
                       else route.continue_())
            page.route("**/admin/v1/keys/*/rotate", lambda route: held.append(route))

            for action in ("create", "rotate"):
                if action == "create":
                    page.click("#new-key")
                    page.select_option("#key-tenant", "acme")
                    page.click("#key-create")
                else:
                    page.locator("button.rotate").first.click()
                    page.click("#confirm-go")
                wait_until(lambda: held or page.wait_for_timeout(20), 5, message=f"the {action} in flight")
                # The session ends meanwhile (Sign out; for the rotation, under its dialog, as the idle timeout
                # or a 401 on another call would end it).
                page.locator("button.signout").dispatch_event("click")
                expect(page.locator("#token")).to_be_visible()
                assert page.locator(".overlay").count() == 0
                with page.expect_response(lambda r: r.request.method == "POST") as answer:
                    held.pop().continue_()  # the answer arrives: in a session that ended
                answer.value.finished()
                # (The page's turns after the answer: its body read, the caller resumed.)
                page.evaluate("() => new Promise((r) => setTimeout(() => requestAnimationFrame(() => setTimeout(r, 0)), 0))")
                assert page.locator(".overlay").count() == 0, action
                assert page.locator("#new-secret").count() == 0, action
                assert page.locator("#token").is_visible()
                # Sign in again for the next one (the created key is there to rotate).
                page.fill("#token", TOKEN)
                page.click("#login button[type=submit]")
                page.get_by_role("link", name="Keys", exact=True).click()
                expect(page.locator("button.rotate").first).to_be_visible()
        finally:
            browser.close()
