"""Takes the screenshots of docs/console/*.png (docs/console.md) so they can
be redone after a change: starts two weir-mock pools and weir with an admin
listener and a request log, sends some traffic of two tenants (a few 429s
and a 404 among it), creates keys, and photographs each page of the console
in headless chromium (Playwright, executable_path=/usr/bin/chromium).

    scripts/console-screenshots [--out docs/console] [--build build/bin]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import random
import sys
import tempfile
import threading
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from conftest import ProcessGroup, free_port, to_yaml, wait_until  # noqa: E402

from playwright.sync_api import sync_playwright  # noqa: E402

TOKEN = "screenshot-admin-token"


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "docs" / "console"))
    ap.add_argument("--build", default=str(REPO / "build" / "bin"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--seconds", type=float, default=14, help="traffic before the overview is taken")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build = pathlib.Path(args.build)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="weir-console-shots-"))
    group = ProcessGroup(tmp)
    try:
        return run(args, out, build, tmp, group)
    finally:
        group.stop_all()


def run(args, out: pathlib.Path, build: pathlib.Path, tmp: pathlib.Path, group: ProcessGroup) -> int:
    fast_port, slow_port, port, admin_port = free_port(), free_port(), free_port(), free_port()
    mock = str(build / "weir-mock")
    group.start([mock, "--listen", f"127.0.0.1:{fast_port}", "--ttft-ms", "35", "--itl-ms", "2", "--max-tokens", "24",
                 "--model", "llama-3.1-8b"], fast_port, name="mock-fast")
    group.start([mock, "--listen", f"127.0.0.1:{slow_port}", "--ttft-ms", "90", "--itl-ms", "4", "--max-tokens", "24",
                 "--model", "llama-3.1-70b"], slow_port, name="mock-slow")
    cfg = {
        "listen": f"127.0.0.1:{port}",
        "workers": 2,
        "server": {"access_log": str(tmp / "access.log")},
        "pools": {
            "small": {"endpoints": [f"http://127.0.0.1:{fast_port}"]},
            "large": {"endpoints": [f"http://127.0.0.1:{slow_port}", "http://127.0.0.1:9"], "eject_for": "60s"},
        },
        "models": {"llama-3.1-8b": {"pool": "small"}, "llama-3.1-70b": {"pool": "large"}},
        "tenants": {
            "acme": {"models": ["llama-3.1-8b", "llama-3.1-70b"], "budget": {"usd": 5, "period": "24h"},
                     "limits": {"requests_per_minute": 6000}},
            "globex": {"models": ["llama-3.1-8b"], "budget": {"usd": 0.05, "period": "720h"}},
        },
        "auth": {"required": True, "api_keys": [
            {"id": "acme-ci", "sha256": sha("sk-acme-ci"), "tenant": "acme"},
            {"id": "globex-app", "sha256": sha("sk-globex-app"), "tenant": "globex"},
        ]},
        "pricing": {"llama-3.1-8b": {"input": 0.2, "output": 0.6}, "llama-3.1-70b": {"input": 2.0, "output": 6.0}},
        "request_log": {"url": f"sqlite:{tmp / 'requests.db'}", "flush_interval": "50ms"},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_ADMIN_TOKEN"},
    }
    cfg_path = tmp / "weir.yaml"
    cfg_path.write_text(to_yaml(cfg) + "\n")
    group.start([str(build / "weir"), "--config", str(cfg_path)], port, name="weir", env={"WEIR_ADMIN_TOKEN": TOKEN})
    base = f"http://127.0.0.1:{admin_port}"
    admin = httpx.Client(base_url=base, headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
    wait_until(lambda: admin.get("/ready").status_code == 200, 10, message="admin listener")

    keys = [
        admin.post("/admin/v1/keys", json={"tenant": "acme", "name": "batch jobs", "models": ["llama-3.1-8b"],
                                           "limits": {"requests_per_minute": 120}, "metadata": {"owner": "data-eng"}}),
        admin.post("/admin/v1/keys", json={"tenant": "globex", "name": "mobile app", "limits": {"requests_per_minute": 30},
                                           "budget": {"usd": 0.01, "period": "24h"}, "expires_at": "2027-01-31T00:00:00Z"}),
    ]
    for k in keys:
        assert k.status_code == 201, k.text
    batch_key, app_key = keys[0].json()["key"], keys[1].json()["key"]

    stop = threading.Event()
    rng = random.Random(7)

    def traffic():
        client = httpx.Client(timeout=30)
        plan = [("sk-acme-ci", "llama-3.1-8b"), ("sk-acme-ci", "llama-3.1-70b"), (batch_key, "llama-3.1-8b"),
                ("sk-globex-app", "llama-3.1-8b"), (app_key, "llama-3.1-8b"), ("sk-globex-app", "llama-3.1-70b")]
        while not stop.is_set():
            key, model = rng.choice(plan)
            client.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                        json={"model": model, "stream": rng.random() < 0.7,
                              "messages": [{"role": "user", "content": "Say something about rivers."}]})
            if rng.random() < 0.03:
                client.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={"authorization": "Bearer sk-wrong"},
                            json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]})
            stop.wait(rng.uniform(0.01, 0.06))

    threads = [threading.Thread(target=traffic, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
        page.set_default_timeout(15000)
        page.goto(base + "/console/")
        page.screenshot(path=str(out / "login.png"))
        page.fill("#token", TOKEN)
        page.click("#login button[type=submit]")
        page.wait_for_selector("#tile-rps")
        time.sleep(args.seconds)  # a picture of live charts needs some history: this is the point of waiting
        page.screenshot(path=str(out / "overview.png"), full_page=True)
        stop.set()
        for t in threads:
            t.join()

        page.get_by_role("link", name="Tenants & spend", exact=True).click()
        page.wait_for_selector(".tenant")
        page.screenshot(path=str(out / "tenants.png"), full_page=True)

        page.get_by_role("link", name="Keys", exact=True).click()
        page.wait_for_selector("#keys-table")
        page.screenshot(path=str(out / "keys.png"), full_page=True)
        page.click("#new-key")
        page.select_option("#key-tenant", "acme")
        page.fill("#key-name", "notebook")
        page.fill("#key-rpm", "60")
        page.fill("#key-budget", "25")
        page.fill("#key-period", "720h")
        page.fill("#key-metadata", '{"owner": "team-c"}')
        page.screenshot(path=str(out / "key-form.png"), full_page=True)
        page.click("#key-create")
        page.wait_for_selector("#new-secret")
        page.screenshot(path=str(out / "key-created.png"))
        page.click("#secret-done")

        page.get_by_role("link", name="Requests", exact=True).click()
        page.wait_for_selector("#requests-table tbody tr[data-request]")
        page.screenshot(path=str(out / "requests.png"))
        page.locator("#requests-table tbody tr[data-request] a").first.click()
        page.wait_for_selector("#request-detail")
        page.screenshot(path=str(out / "request-detail.png"), full_page=True)

        page.get_by_role("link", name="Pools", exact=True).click()
        page.wait_for_selector(".pool")
        page.screenshot(path=str(out / "pools.png"), full_page=True)
        browser.close()
    print(f"console-screenshots: wrote {', '.join(sorted(os.listdir(out)))} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
