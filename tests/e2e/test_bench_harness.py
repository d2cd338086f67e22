"""bench/run end to end: the cheapest suite in smoke mode, then the structure of what it wrote.

`bench/run --smoke latency` starts weir-mock, Weir and nginx pinned to the two CPUs, measures concurrency 1,
a short throughput frontier and the seed-002 shape, and writes latency.{md,csv,json,png} into a temp dir
(never into bench/results/, so CI leaves the tree clean).
"""

from __future__ import annotations

import csv
import json
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import REPO, build_dir

RUN = REPO / "bench" / "run"
CSV_FIELDS = ["suite", "section", "target", "param", "metric", "value", "unit", "rounds", "note"]
STATUSES = {"met", "missed", "not measured", "met (tie at the mock's ceiling)"}


def bench_run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUN), *args, "--bin-dir", str(build_dir())], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def results_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "bench/results"], cwd=REPO,
                          capture_output=True, text=True).stdout


@pytest.mark.timeout(300)
def test_smoke_latency_writes_md_csv_json_png_outside_the_tree():
    before = results_state()
    r = bench_run("--smoke", "latency", "-q")
    assert r.returncode == 0, f"bench/run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    m = re.search(r"output in (\S+)", r.stdout)
    assert m, r.stdout
    out = pathlib.Path(m.group(1))
    try:
        assert REPO not in out.parents, f"smoke output must not go into the tree: {out}"
        assert results_state() == before, "bench/run --smoke changed bench/results/"

        files = {ext: out / f"latency.{ext}" for ext in ("md", "csv", "json", "png")}
        for ext, f in files.items():
            assert f.is_file() and f.stat().st_size > 0, f"missing {f}"
        assert (out / "summary.md").is_file()
        assert "Weir beside nginx" in (out / "summary.md").read_text()

        # PNG: a real image
        assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        # CSV: long format, every number of the report
        with files["csv"].open() as fh:
            rows = list(csv.DictReader(fh))
        assert rows and list(rows[0].keys()) == CSV_FIELDS
        assert {r["suite"] for r in rows} == {"latency"}
        targets = {r["target"] for r in rows}
        assert {"direct (no gateway)", "weir", "nginx"} <= targets, targets
        sections = {r["section"] for r in rows}
        assert {"concurrency1", "frontier", "frontier_levels", "seed002", "syscalls", "vs_nginx",
                "targets"} <= sections, sections

        def value(section, target, metric, param=None):
            for r in rows:
                if (r["section"], r["target"], r["metric"]) == (section, target, metric) and (
                        param is None or r["param"] == str(param)):
                    return r["value"]
            raise AssertionError(f"no row {section}/{target}/{metric}/{param}")

        assert float(value("concurrency1", "weir", "added_e2e_p99")) > -10_000
        assert float(value("concurrency1", "direct (no gateway)", "e2e_p50")) > 0
        assert float(value("concurrency1", "weir", "achieved_rps")) > 0
        assert float(value("frontier", "weir", "max_rps_zero_failures", "unbounded")) > 0
        assert float(value("seed002", "nginx", "achieved_rps", 1)) > 0
        # syscalls per request, Weir and nginx under strace -f -c: a request is at least a read and a write
        assert float(value("syscalls", "weir", "syscalls_per_request", "total")) >= 2
        assert float(value("syscalls", "nginx", "syscalls_per_request", "total")) >= 2

        # JSON: targets with a status, load average, per-round data
        data = json.loads(files["json"].read_text())
        assert data["suite"] == "latency" and data["smoke"] is True
        assert len(data["loadavg_start"]) == 3 and len(data["loadavg_end"]) == 3
        goals = {g["goal"]: g for g in data["targets"]}
        assert any("concurrency 1" in g for g in goals), goals
        assert all(g["status"] in STATUSES for g in goals.values()), goals
        assert set(data["data"]) == {"concurrency1", "frontier", "seed002", "syscalls"}
        assert {"weir", "nginx"} <= set(data["data"]["syscalls"])
        assert any(c["measure"].startswith("syscalls per") and c["ratio"] for c in data["vs_nginx"]), data["vs_nginx"]
        assert data["data"]["concurrency1"]["weir"][0]["errors_total"] == 0

        # Markdown: the run's conditions, the targets, the tables
        md = files["md"].read_text()
        for needle in ("# `latency`", "Smoke run", "load average", "pinning", "## Targets",
                       "## Concurrency 1, instant mock", "## Throughput frontier", "## Seed-002 shape",
                       "## Syscalls per request", "| **total** |",
                       "| weir |", "| nginx |", "| direct (no gateway) |"):
            assert needle in md, f"{needle!r} not in latency.md"
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.timeout(60)
def test_broken_harness_exits_non_zero(tmp_path):
    r = subprocess.run([str(RUN), "--smoke", "latency", "--bin-dir", str(tmp_path / "nothing"), "--out",
                        str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "missing" in (r.stdout + r.stderr)


def test_unknown_suite_is_a_usage_error():
    r = subprocess.run([str(RUN), "nosuchsuite"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "unknown suite" in r.stderr


@pytest.mark.timeout(300)
def test_smoke_tls_measures_every_lane_and_the_https_over_http_ratios():
    # bench/run tls: Weir → weir-mock over http and over https (the mock's own TLS listener), kept-alive and
    # with a new upstream connection per request (resumed and full handshakes). The smoke itself fails when a
    # lane's mock counters do not show the connection handling it is named for.
    r = bench_run("--smoke", "tls", "-q")
    assert r.returncode == 0, f"bench/run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = pathlib.Path(re.search(r"output in (\S+)", r.stdout).group(1))
    try:
        with (out / "tls.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        lanes = {"weir → http", "weir → https", "weir → http, new connection per request",
                 "weir → https, new connection per request (resumed)",
                 "weir → https, new connection per request (full handshake)"}
        assert lanes | {"direct (no gateway)"} <= {r["target"] for r in rows if r["section"] == "c1"}

        def value(section, target, metric, param=None):
            for row in rows:
                if (row["section"], row["target"], row["metric"]) == (section, target, metric) and (
                        param is None or row["param"] == str(param)):
                    return row["value"]
            raise AssertionError(f"no row {section}/{target}/{metric}/{param}")

        for lane in lanes:
            assert float(value("c1", lane, "cpu_per_request")) > 0
            per_conn = float(value("c1", lane, "upstream_connections_per_request"))
            assert per_conn < 0.1 if "new connection" not in lane else per_conn > 0.9, (lane, per_conn)
        assert float(value("max_rps", "weir → https", "max_rps_zero_failures")) > 0
        assert float(value("ttft", "weir → https", "added_ttft_p50", 16)) > -10_000
        metrics = {row["metric"] for row in rows if row["section"] == "summary"}
        assert {"closed-loop max req/s", "added e2e p99, concurrency 1 (µs)", "added TTFT p99, concurrency 16 (µs)",
                "Weir CPU per request, kept-alive (µs)",
                "Weir CPU per request, new connection, full handshake (µs)"} <= metrics, metrics
        md = (out / "tls.md").read_text()
        for needle in ("# `tls`", "## https ÷ http", "## What TLS adds per request", "## Closed-loop maximum",
                       "## Streaming: added TTFT"):
            assert needle in md, f"{needle!r} not in tls.md"
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_seed000_counts_slow_first_tokens_from_the_slowest_hops():
    import sys
    sys.path.insert(0, str(REPO / "bench" / "harness"))
    try:
        from suite_seed000 import slow_hops
    finally:
        sys.path.pop(0)
    runs = [{"hop": {"count": 1200}, "slowest_hops": [{"sent_s": 1.0, "hop_us": 3400.0},
                                                     {"sent_s": 2.0, "hop_us": 1001.0},
                                                     {"sent_s": 3.0, "hop_us": 999.0}]},
            {"hop": {"count": 1200}, "slowest_hops": [{"sent_s": 4.0, "hop_us": 800.0}]}]
    assert slow_hops(runs, 1000.0) == (2, 2400, False)
    # All 16 reported hops over: the count is a floor.
    full = [{"hop": {"count": 100}, "slowest_hops": [{"sent_s": i, "hop_us": 5000.0} for i in range(16)]}]
    assert slow_hops(full, 1000.0) == (16, 100, True)
    assert slow_hops([{"hop": {"count": 0}}], 1000.0) == (0, 0, False)
