"""The web console (docs/console.md) in a real browser: Debian's chromium,
headless, driven by Playwright for Python (launched with
executable_path=/usr/bin/chromium: Playwright's own browser builds cannot be
downloaded here). One weir, one weir-mock and one browser for the module.

Covers the operator's path (sign in with the admin token, create a key,
use it through the openai SDK, see the request in the log and the spend
change, revoke it, the next request gets 401), the console's HTTP answers
(Content-Type, ETag and 304, CSP, redirects), and attacks: markup in key
names, metadata, tenant names, request ids and models shown as text and
never run; a wrong token; an expired session; a token the server no longer
accepts."""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil

import httpx
import openai
# (tests/e2e/requirements.txt; a missing package is an error here, not a skip: CI must run this.)
import playwright.sync_api as playwright_api
import pytest
from playwright.sync_api import expect

from conftest import free_port, wait_until

TOKEN = "console-test-token-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
CHROMIUM = os.environ.get("WEIR_CHROMIUM", "/usr/bin/chromium")
# Markup that would run if any of it reached an HTML parser.
XSS_TENANT = '<img src=x onerror="window.__xss=1">evil'
XSS_NAME = '<script>window.__xss=2</script><b>bold</b>'
XSS_META = {"owner": '<img src=x onerror="window.__xss=3">', "html": "</pre><svg onload=window.__xss=4>"}
XSS_REQUEST_ID = "<img/src=x/onerror=window.__xss=5>"
XSS_MODEL = '<iframe src="javascript:window.__xss=6"></iframe>'
EXPECT_MS = 8000  # what a condition the console polls for may take (the stats poll every 2 s)


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


@pytest.fixture(scope="module")
def gw(module_mock, module_weir, tmp_path_factory):
    mock = module_mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "4", "--model", "m")
    admin_port = free_port()
    db = tmp_path_factory.mktemp("console") / "requests.db"
    cfg = {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "default_max_tokens": 8}},
        "tenants": {
            "acme": {"models": ["m"], "budget": {"usd": 10, "period": "24h"}},
            XSS_TENANT: {"models": ["m"]},
        },
        "auth": {"required": True, "api_keys": [{"id": "evil-cfg", "sha256": sha("sk-evil"), "tenant": XSS_TENANT}]},
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
    }
    w = module_weir(config=cfg, env=ENV)
    base = f"http://127.0.0.1:{admin_port}"
    wait_until(lambda: _ready(base), 5, message="admin listener")
    return w, base


def _ready(base: str) -> bool:
    try:
        return httpx.get(base + "/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not installed: run scripts/setup (Debian's chromium)", pytrace=False)
    with playwright_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Console:
    """One browser context (its own sessionStorage) on the console, recording
    every request it makes and every error the page reports."""

    def __init__(self, browser, base: str):
        self.base = base
        self.ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(EXPECT_MS)
        self.urls: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))

    def open(self, fragment: str = ""):
        self.page.goto(self.base + "/console/" + fragment)

    def login(self, token: str = TOKEN):
        self.open()
        self.page.fill("#token", token)
        self.page.click("#login button[type=submit]")

    def nav(self, title: str):
        self.page.get_by_role("link", name=title, exact=True).click()

    def check_clean(self):
        """Nothing ran that the server sent, nothing left this origin, no CSP or script error."""
        assert self.page.evaluate("window.__xss") is None
        foreign = [u for u in self.urls if not u.startswith(self.base + "/")]
        assert not foreign, foreign
        # 401s the test provoked on purpose are logged by chromium as failed loads; anything else is a fault.
        bad = [e for e in self.errors if "401" not in e]
        assert not bad, bad

    def close(self):
        self.ctx.close()


@pytest.fixture
def console(browser, gw):
    c = Console(browser, gw[1])
    yield c
    c.close()


def chat(w, key: str, model: str = "m", request_id: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    if request_id:
        headers["x-request-id"] = request_id
    return httpx.post(w.v1 + "/chat/completions", headers=headers, timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def spend_text(page) -> str:
    return page.locator('.tenant[data-tenant="acme"] .spend-total').inner_text()


def test_sign_in_create_a_key_use_it_see_it_logged_and_spent_then_revoke_it(gw, console):
    w, _ = gw
    page = console.page
    console.login()
    expect(page.locator("#tile-rps")).to_be_visible()
    # The token stays in this tab's sessionStorage: not in the URL, not in a cookie.
    assert TOKEN not in page.url
    assert page.evaluate("sessionStorage.getItem('weir.console.token')") == TOKEN
    assert console.ctx.cookies() == []

    console.nav("Tenants & spend")
    expect(page.locator('.tenant[data-tenant="acme"] .budget-spent')).to_be_visible()
    spent_before = spend_text(page)
    budget_before = page.locator('.tenant[data-tenant="acme"] .budget-spent').inner_text()

    console.nav("Keys")
    page.click("#new-key")
    page.select_option("#key-tenant", "acme")
    page.fill("#key-name", "browser key")
    page.fill("#key-rpm", "100")
    page.fill("#key-metadata", '{"team": "c"}')
    page.click("#key-create")
    secret = page.locator("#new-secret").input_value()
    key_id = page.locator("#new-key-id").inner_text()
    assert re.fullmatch(r"sk-weir-[A-Za-z0-9_-]{43}", secret), secret
    assert key_id.startswith("vk_")
    page.click("#secret-done")
    expect(page.locator("#new-secret")).to_have_count(0)  # shown once, gone with the dialog
    row = page.locator(f'#keys-table tr[data-key="{key_id}"]')
    expect(row.locator(".key-name")).to_have_text("browser key")
    assert secret not in page.content()

    # The key works through the official SDK.
    client = openai.OpenAI(base_url=w.v1, api_key=secret, max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    request_id = raw.headers["x-request-id"]
    assert raw.parse().choices[0].message.content

    # The request log shows it (filtered by the key), and its detail.
    # (The page shows the newest requests live: the row appears by itself once the store has it.)
    page.goto(f"{console.base}/console/#/requests?key_id={key_id}")
    expect(page.locator("#f-key")).to_have_value(key_id)
    link = page.locator(f'#requests-table tr[data-request="{request_id}"] a')
    expect(link).to_have_count(1)
    link.click()
    expect(page.locator("#request-id")).to_have_text(request_id)
    expect(page.locator('#request-detail dd[data-field="key_id"]')).to_have_text(key_id)
    expect(page.locator('#request-detail dd[data-field="status"]')).to_have_text("200")

    # The tenant's spend moved: since start (metrics) and in its budget period.
    console.nav("Tenants & spend")
    expect(page.locator('.tenant[data-tenant="acme"] .spend-total')).not_to_have_text(spent_before, timeout=EXPECT_MS)
    expect(page.locator('.tenant[data-tenant="acme"] .budget-spent')).not_to_have_text(budget_before)

    # The overview counts it per model and per tenant.
    console.nav("Overview")
    expect(page.locator('#stats-tenants tr[data-name="acme"] td').nth(2)).not_to_have_text("0")

    # Revoke through the console: the next request with the key gets 401.
    console.nav("Keys")
    page.locator(f'#keys-table tr[data-key="{key_id}"] .revoke').click()
    page.click("#confirm-go")
    expect(page.locator(f'#keys-table tr[data-key="{key_id}"]')).to_have_count(0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    console.check_clean()


def test_rotate_shows_the_new_secret_once_and_the_old_one_stops(gw, console):
    w, base = gw
    r = httpx.post(base + "/admin/v1/keys", json={"tenant": "acme", "name": "to rotate"},
                   headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 201, r.text
    old, key_id = r.json()["key"], r.json()["id"]
    console.login()
    expect(console.page.locator("#tile-rps")).to_be_visible()
    console.nav("Keys")
    console.page.locator(f'#keys-table tr[data-key="{key_id}"] .rotate').click()
    console.page.click("#confirm-go")
    new = console.page.locator("#new-secret").input_value()
    assert new.startswith("sk-weir-") and new != old
    console.page.click("#secret-done")
    assert chat(w, old).status_code == 401
    assert chat(w, new).status_code == 200
    console.check_clean()


def test_markup_from_the_server_is_shown_as_text_and_never_runs(gw, console):
    w, base = gw
    admin = {"authorization": f"Bearer {TOKEN}"}
    r = httpx.post(base + "/admin/v1/keys", headers=admin,
                   json={"tenant": XSS_TENANT, "name": XSS_NAME, "metadata": XSS_META})
    assert r.status_code == 201, r.text
    key_id = r.json()["id"]
    assert chat(w, r.json()["key"], request_id=XSS_REQUEST_ID).status_code == 200
    assert chat(w, r.json()["key"], model=XSS_MODEL).status_code in (403, 404)
    wait_until(lambda: httpx.get(base + "/admin/v1/requests?limit=5", headers=admin).json()["data"], 5,
               message="stored requests")
    page = console.page
    console.login()
    expect(page.locator("#tile-rps")).to_be_visible()
    expect(page.locator("#stats-tenants")).to_contain_text(XSS_TENANT)

    console.nav("Keys")
    expect(page.locator(f'#keys-table tr[data-key="{key_id}"] .key-name')).to_have_text(XSS_NAME)
    page.locator(f'#keys-table tr[data-key="{key_id}"] a').click()
    expect(page.locator("#key-metadata-view")).to_contain_text(XSS_META["html"])

    console.nav("Tenants & spend")
    expect(page.locator(".tenant h2").filter(has_text="evil")).to_have_text(XSS_TENANT)

    console.nav("Requests")
    expect(page.locator("#requests-table")).to_contain_text(XSS_MODEL)
    page.locator("#requests-table a", has_text=XSS_REQUEST_ID).click()
    expect(page.locator("#request-id")).to_have_text(XSS_REQUEST_ID)
    expect(page.locator('#request-detail dd[data-field="tenant"]')).to_have_text(XSS_TENANT)
    # Filters with markup in them go into the fragment and back into inputs, as text.
    page.goto(f"{base}/console/#/requests?model={XSS_MODEL}")
    expect(page.locator("#f-model")).to_have_value(XSS_MODEL)
    console.nav("Pools")
    expect(page.locator(".pool h2")).to_contain_text("1/1 healthy")
    # None of it became an element.
    assert page.evaluate("document.querySelectorAll('img[src=x], iframe, svg, script:not([src])').length") == 0
    # The CSP itself refuses an HTML sink: a string assigned to innerHTML throws.
    err = page.evaluate("""() => { try { document.body.innerHTML = '<b>x</b>'; return null } catch (e) { return e.name } }""")
    assert err == "TypeError", err
    console.errors = [e for e in console.errors if "TrustedHTML" not in e]  # the probe above reports itself
    console.check_clean()


def test_a_wrong_token_an_idle_session_and_a_refused_token_end_at_the_sign_in(gw, console):
    page = console.page
    console.login("not-the-token")
    expect(page.locator("#login-error")).to_contain_text("Incorrect admin token")
    assert page.evaluate("sessionStorage.length") == 0
    # A pasted en dash cannot go in an Authorization field: said so, not "the admin API cannot be reached".
    console.login("console\u2013test-token")
    expect(page.locator("#login-error")).to_contain_text("U+2013")
    assert page.evaluate("sessionStorage.length") == 0

    # A session idle for longer than 30 minutes is over.
    console.login()
    expect(page.locator("#tile-rps")).to_be_visible()
    page.evaluate("sessionStorage.setItem('weir.console.active', String(Date.now() - 31 * 60 * 1000))")
    page.reload()
    expect(page.locator("#login-error")).to_contain_text("expired")
    assert page.evaluate("sessionStorage.getItem('weir.console.token')") is None

    # A token the server no longer accepts (rotated, or an admin JWT past its exp): the first call says so.
    console.login()
    expect(page.locator("#tile-rps")).to_be_visible()
    page.evaluate("sessionStorage.setItem('weir.console.token', 'rotated-away')")
    console.nav("Keys")
    expect(page.locator("#login-error")).to_contain_text("refused the token")
    assert page.evaluate("sessionStorage.getItem('weir.console.token')") is None
    expect(page.locator("#keys-table")).to_have_count(0)
    console.check_clean()


def test_the_console_files_answer_with_types_etags_and_a_strict_policy(gw):
    _, base = gw
    r = httpx.get(base + "/", follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == "/console/"
    r = httpx.get(base + "/console", follow_redirects=False)
    assert r.status_code == 301 and r.headers["location"] == "/console/"
    page = httpx.get(base + "/console/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    for d in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'",
              "require-trusted-types-for 'script'"):
        assert d in csp, csp
    assert "unsafe" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["cache-control"] == "no-cache"
    etag = page.headers["etag"]
    assert re.fullmatch(r'"[0-9a-f]{16}"', etag)
    again = httpx.get(base + "/console/index.html", headers={"if-none-match": etag})
    assert again.status_code == 304 and again.content == b"" and "content-length" not in again.headers
    assert httpx.get(base + "/console/", headers={"if-none-match": '"0000000000000000"'}).status_code == 200
    js = httpx.get(base + "/console/js/app.js")
    assert js.status_code == 200 and js.headers["content-type"] == "text/javascript; charset=utf-8"
    assert js.headers["etag"] != etag
    head = httpx.head(base + "/console/js/app.js")
    assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) == len(js.content)
    for path in ("/console/nope.js", "/console/../admin/v1/keys", "/console/js/%2e%2e/index.html",
                 "/console//index.html", "/console/js\\app.js"):
        conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=5)  # sends the path as written
        conn.request("GET", path)
        assert conn.getresponse().status == 404, path
        conn.close()
    r = httpx.post(base + "/console/index.html")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    # The files need no token, the data does; the JSON answers carry the same policy.
    r = httpx.get(base + "/admin/v1/stats")
    assert r.status_code == 401 and "frame-ancestors 'none'" in r.headers["content-security-policy"]
