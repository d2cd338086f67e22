"""Metric label slots across reloads (docs/observability.md, "Identity labels and their bounds"): a model, pool or
endpoint a reload removes keeps its counts only while a request of a configuration that names it may run, then its
slot is freed and reused, so what Weir holds is bounded by the configurations in use however many reloads renamed
them; a name dropped and named again starts from 0; model slots never pass the series keys' space (a file with more
models than 65,535 is refused; reloads renaming that many, one after another, keep serving)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import httpx
import pytest

from conftest import binary, free_port, to_yaml, wait_until

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "3")
TOKEN = "admin-slots-token-0123456789abcdef"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}


def write(w, cfg: dict) -> None:
    """Replaces weir's configuration file with `cfg` (atomically)."""
    full = json.loads(json.dumps(cfg))
    full.setdefault("listen", f"127.0.0.1:{w.port}")
    full.setdefault("workers", 2)
    full.setdefault("server", {}).setdefault("access_log", str(w.access_log_path))
    tmp = w.config_path.with_suffix(".next")
    tmp.write_text(to_yaml(full) + "\n")
    os.replace(tmp, w.config_path)


def reloads(w, result: str) -> float:
    return w.metric("weir_config_reloads_total", result=result)


def sighup(w, expect: str = "success", timeout: float = 10) -> None:
    w.sighup(expect, timeout)


def chat(w, model: str) -> int:
    return httpx.post(w.v1 + "/chat/completions", timeout=20,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]}).status_code


def config(mock, admin_port: int, models: list[str], endpoint_query: str = "") -> dict:
    return {
        "pools": {"p": {"endpoints": [mock.base_url + endpoint_query]}},
        "models": {m: {"pool": "p", "upstream_model": "mock-model"} for m in models},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
    }


def stats(admin_port: int) -> dict:
    r = httpx.get(f"http://127.0.0.1:{admin_port}/admin/v1/stats", headers={"authorization": f"Bearer {TOKEN}"},
                  timeout=10)
    assert r.status_code == 200, r.text
    return {m["model"]: m for m in r.json()["models"]}


def admin_ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_renamed_models_leave_what_weir_holds_and_one_named_again_counts_from_zero(mock, weir):
    m = mock(*FAST)
    admin_port = free_port()
    w = weir(config=config(m, admin_port, ["keep", "r0"]), env=ENV)
    wait_until(lambda: admin_ready(admin_port), 5, message="admin listener")
    assert chat(w, "r0") == 200
    # 6 reloads, each renaming one model, a request on each model in between: the removed names' counts are
    # dropped once no request of a configuration naming them runs (here: at the next reload).
    for gen in range(1, 7):
        write(w, config(m, admin_port, ["keep", f"r{gen}"]))
        sighup(w)
        assert chat(w, f"r{gen}") == 200
        assert chat(w, "keep") == 200
    s = stats(admin_port)
    renamed = sorted(k for k in s if k and k.startswith("r"))
    # r6 (configured), r5 at most (the previous configuration's): not the five before.
    assert len(renamed) <= 2 and "r6" in renamed, renamed
    assert s["keep"]["requests"] == 6 and s["r6"]["requests"] == 1
    # r0 named again (its slot freed long ago): counted from 0, in /metrics and the stats.
    write(w, config(m, admin_port, ["keep", "r0"]))
    sighup(w)
    assert chat(w, "r0") == 200
    assert stats(admin_port)["r0"]["requests"] == 1
    samples = w.metrics()
    r0 = [v for n, lab, v in samples if n == "weir_requests_total" and lab.get("model") == "r0"]
    assert r0 == [1.0], r0
    assert not [lab for n, lab, _ in samples if lab.get("model", "").startswith("r") and lab["model"] != "r0"]
    assert w.process.alive()


def test_an_endpoint_renamed_back_and_forth_keeps_one_series_counted_right(mock, weir):
    m = mock(*FAST)
    admin_port = free_port()
    w = weir(config=config(m, admin_port, ["a"]), env=ENV)
    wait_until(lambda: admin_ready(admin_port), 5, message="admin listener")
    # The endpoint's URL changes at every reload (a query of its own), a request on each: each generation's
    # endpoint series counts its own attempts, from 0, and only the configured one is shown.
    for gen in range(1, 9):
        write(w, config(m, admin_port, ["a"], f"/?v={gen}"))
        sighup(w)
        assert chat(w, "a") == 200
        attempts = [(lab["endpoint"], v) for n, lab, v in w.metrics() if n == "weir_upstream_attempts_total"]
        assert attempts == [(m.base_url + f"/?v={gen}", 1.0)], attempts


def many_models(prefix: str, n: int) -> str:
    return "".join(f"  {prefix}{i}: {{pool: p, upstream_model: mock-model}}\n" for i in range(n))


def test_models_past_the_slot_space_are_a_configuration_error(tmp_path):
    path = tmp_path / "weir.yaml"
    path.write_text("pools: {p: {endpoints: [http://127.0.0.1:9]}}\nmodels:\n" + many_models("m", 65536))
    r = subprocess.run([binary("weir"), "--config", path, "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "65536 models, at most 65535" in r.stdout + r.stderr, r.stdout + r.stderr


def test_reloads_renaming_every_one_of_65535_models_keep_serving(mock, weir):
    # Three files of 65,535 models each, one after another: the slots of the first are freed for the third
    # (before: every name ever configured kept a slot, and a model past 131,071 of them crashed weir). (A
    # scrape of /metrics with that many models is large: reloads are told by weir's log, requests by theirs.)
    m = mock(*FAST)
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"x0": {"pool": "p"}}})
    head = (f"listen: 127.0.0.1:{w.port}\nworkers: 2\nserver: {{access_log: {w.access_log_path}}}\n"
            f"pools: {{p: {{endpoints: [{m.base_url}]}}}}\nmodels:\n")
    for gen, prefix in enumerate(("a", "b", "c"), start=2):
        tmp = w.config_path.with_suffix(".next")
        tmp.write_text(head + many_models(prefix, 65535))
        os.replace(tmp, w.config_path)
        os.kill(w.process.pid, signal.SIGHUP)
        wait_until(lambda: f"(generation {gen})" in w.process.log() or not w.process.alive(), 120, 0.1,
                   message=f"generation {gen}")
        assert chat(w, f"{prefix}65534") == 200
        assert chat(w, f"{prefix}0") == 200
        assert w.process.alive()
    assert "refused" not in w.process.log()
