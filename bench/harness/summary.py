"""SUMMARY: summary.md in the output dir, every target the harness tracks, read back from the SUITE.json
files there (so rerunning one suite and the summary stays whole)."""

from __future__ import annotations

import datetime as dt
import json
import pathlib

from report import fmt_over, fmt_signed, table

ORDER = ["seed000", "latency", "stream", "memory", "governed", "allocs", "batch", "soak"]


def write(out_dir: pathlib.Path, *rest) -> pathlib.Path:
    """write(out_dir, smoke): rebuilds out_dir/summary.md from the SUITE.json files there."""
    smoke = bool(rest[-1]) if rest else False
    rows, loads, commits, vs = [], [], set(), []
    minutes = 0.0
    for suite in ORDER:
        path = out_dir / f"{suite}.json"
        if not path.exists():
            continue
        d = json.loads(path.read_text())
        commits.add(d.get("commit", "?"))
        for g in d.get("targets", []):
            status = {"met": "**met**", "missed": "**missed**"}.get(g["status"], g["status"])
            rows.append([f"[{suite}]({suite}.md)", g["goal"], g["value"], status])
        for c in d.get("vs_nginx", []):
            digits = c.get("digits", 1)
            vs.append([f"[{suite}]({suite}.md)", c["measure"], f"{fmt_signed(c['weir'], digits)} {c['unit']}",
                       f"{fmt_signed(c['nginx'], digits)} {c['unit']}", fmt_over(c["ratio"], c["weir"], c["nginx"])])
        la0, la1 = d.get("loadavg_start") or [0], d.get("loadavg_end") or d.get("loadavg_start") or [0]
        started = d.get("started", "")[:16].replace("T", " ")
        loads.append(f"{suite} ({started} UTC): {la0[0]:.2f} → {la1[0]:.2f}")
        try:
            minutes += (dt.datetime.fromisoformat(d["ended"]) - dt.datetime.fromisoformat(d["started"])).total_seconds() / 60
        except (KeyError, TypeError, ValueError):
            pass
    text = "\n".join([
        "# Weir benchmark: where Weir stands on each target", "",
        ("**Smoke run**: the harness was checked, not the numbers.\n\n" if smoke else "")
        + f"Commit(s): {', '.join(sorted(commits))}; {minutes:.0f} min of runs. 1-minute load average at the "
        f"start → end of each suite (2 cores; above ~1.5 other work competed): {'; '.join(loads)}.", "",
        table(["suite", "target", "Weir", "status"], rows), "",
        *(["## Weir beside nginx, same run", "",
           "Each measure for Weir and for nginx (one worker, the floor for one proxy hop) from the same run, "
           "alternated in the same rounds; Weir ÷ nginx below 1 means Weir is cheaper. Added latencies are "
           "gateway − direct; a ratio is left out when a value is within the noise of the direct path (≤ 0).",
           "", table(["suite", "measure", "Weir", "nginx", "Weir ÷ nginx"], vs), ""] if vs else []),
        "Benchmarks, not tests: a missed target is a finding, reported with its numbers. Method and how to read "
        "the tables: [bench/README.md](../README.md).", ""])
    path = out_dir / "summary.md"
    path.write_text(text)
    return path
