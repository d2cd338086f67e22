"""The console's key form waits for the tenants it offers (console/js/pages/keys.js).

"Create key" clicked before the Keys page's first load had answered opened a form whose tenant list was empty, and
stayed so: nothing could be created until the page was left and opened again (CI caught it as a test's
select_option timing out on a loaded machine). The form now opens once the tenants are known.
"""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import free_port, wait_until
from test_regress_fixes_56 import CHROMIUM, ENV, TOKEN, keys_config


def test_create_key_clicked_before_the_tenants_arrived_offers_them(mock, weir, tmp_path):
    import playwright.sync_api as playwright_api
    from playwright.sync_api import expect
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not installed: run scripts/setup (Debian's chromium)", pytrace=False)
    m = mock()
    aport = free_port()
    weir(config=keys_config(m, aport, tmp_path / "keys.json"), workers=1, env=ENV)
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(8000)
            page.goto(f"http://127.0.0.1:{aport}/console/")
            page.fill("#token", TOKEN)
            page.click("#login button[type=submit]")
            expect(page.get_by_role("link", name="Keys", exact=True)).to_be_visible()
            held = []  # the Keys page's first list of tenants, held until "Create key" was clicked
            page.route("**/admin/v1/tenants",
                       lambda route: route.continue_() if held else held.append(route))
            page.get_by_role("link", name="Keys", exact=True).click()
            wait_until(lambda: held or page.wait_for_timeout(20), 5, message="the tenants asked for")
            page.click("#new-key")
            held[0].continue_()
            expect(page.locator("#key-tenant option[value=acme]")).to_have_count(1)
            page.select_option("#key-tenant", "acme")
            page.click("#key-create")
            expect(page.locator("#new-secret")).to_be_visible()
        finally:
            browser.close()
