"""Stop 62's console defects, in Chromium (console/js; each test fails on the build before its fix):

- a budget period that is not whole seconds: the API answered "1500ms", which the console read as 1500 s
  ("$5.00 / 25m", 1000 times too long); the API answers seconds ("1.5s") and the console reads every unit;
- metadata integers beyond 2^53 (ids an operator stores: the API keeps int64s exactly) were changed by the
  console: 1234567890123456789 shown as ...800, and 9007199254740993 typed into the form stored as ...992."""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from conftest import free_port
from test_regress_fixes_56 import AUTH, CHROMIUM, ENV, TOKEN, keys_config


def signed_in(p, base: str):
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not installed: run scripts/setup (Debian's chromium)", pytrace=False)
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
    page = browser.new_context().new_page()
    page.set_default_timeout(8000)
    page.goto(base + "/console/")
    page.fill("#token", TOKEN)
    page.click("#login button[type=submit]")
    return browser, page


def create(base: str, body: dict | str) -> dict:
    r = httpx.post(base + "/admin/v1/keys", headers={**AUTH, "content-type": "application/json"}, timeout=10,
                   content=body if isinstance(body, str) else None, json=None if isinstance(body, str) else body)
    assert r.status_code == 201, r.text
    return r.json()


def test_budget_periods_are_shown_in_their_own_units(mock, weir, tmp_path):
    import playwright.sync_api as playwright_api
    from playwright.sync_api import expect
    m = mock()
    aport = free_port()
    cfg = keys_config(m, aport, tmp_path / "keys.json")
    cfg["tenants"]["acme"]["budget"] = {"usd": 50, "period": "1500ms"}
    weir(config=cfg, workers=1, env=ENV)
    base = f"http://127.0.0.1:{aport}"
    shown = {}
    for period in ["1.5s", "2250ms", "90m", "86400s", "week"]:
        shown[create(base, {"tenant": "acme", "budget": {"usd": 5, "period": period}})["id"]] = period
    want = {"1.5s": "$5.00 / 1.5s", "2250ms": "$5.00 / 2.25s", "90m": "$5.00 / 90m", "86400s": "$5.00 / 1d",
            "week": "$5.00 / week"}
    with playwright_api.sync_playwright() as p:
        browser, page = signed_in(p, base)
        try:
            page.get_by_role("link", name="Keys", exact=True).click()
            for kid, period in shown.items():
                expect(page.locator(f"tr[data-key='{kid}'] td").nth(5)).to_have_text(want[period])
            page.get_by_role("link", name="Tenants & spend", exact=True).click()
            expect(page.locator("section[data-tenant='acme'] .budget-line")).to_contain_text("left · 1.5s")
        finally:
            browser.close()


def test_metadata_integers_beyond_2_53_are_shown_and_sent_as_they_are(mock, weir, tmp_path):
    import playwright.sync_api as playwright_api
    from playwright.sync_api import expect
    m = mock()
    aport = free_port()
    weir(config=keys_config(m, aport, tmp_path / "keys.json"), workers=1, env=ENV)
    base = f"http://127.0.0.1:{aport}"
    k = create(base, '{"tenant":"acme","metadata":{"account":1234567890123456789,"n":[-9223372036854775808,'
                     '18446744073709551615],"small":42,"x":1.5}}')
    with playwright_api.sync_playwright() as p:
        browser, page = signed_in(p, base)
        try:
            page.get_by_role("link", name="Keys", exact=True).click()
            page.goto(f"{base}/console/#/keys/{k['id']}")
            view = page.locator("#key-metadata-view")
            expect(view).to_contain_text('"account": 1234567890123456789')
            text = view.inner_text()
            for n in ["-9223372036854775808", "18446744073709551615", '"small": 42', '"x": 1.5']:
                assert n in text, text
            # The form sends the digits typed.
            page.get_by_role("link", name="Keys", exact=True).click()
            page.click("#new-key")
            expect(page.locator("#key-tenant option[value=acme]")).to_have_count(1)
            page.select_option("#key-tenant", "acme")
            page.fill("#key-metadata", '{"account": 9007199254740993, "big": 12345678901234567890, "f": 0.1}')
            page.click("#key-create")
            expect(page.locator("#new-secret")).to_be_visible()
            new = page.inner_text("#new-key-id").strip()
            raw = httpx.get(f"{base}/admin/v1/keys/{new}", headers=AUTH, timeout=10).text
            assert '"account":9007199254740993' in raw and '"big":12345678901234567890' in raw, raw
            assert '"f":0.1' in raw, raw
        finally:
            browser.close()
