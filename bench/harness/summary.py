"""bench/results/summary.md: every target the harness tracks, from the suites of one `bench/run` call."""

from __future__ import annotations

import pathlib

from report import git_describe, table


def write(out_dir: pathlib.Path, reports: list, smoke: bool) -> pathlib.Path:
    rows = []
    for rep in reports:
        for g in rep.goals:
            status = {"met": "**met**", "missed": "**missed**"}.get(g["status"], g["status"])
            rows.append([f"[{rep.suite}]({rep.suite}.md)", g["goal"], g["value"], status])
    loads = [f"{rep.suite}: {rep.load_start[0]:.2f} → {(rep.load_end or rep.load_start)[0]:.2f}" for rep in reports]
    minutes = sum(((rep.ended - rep.started).total_seconds() for rep in reports if rep.ended), 0.0) / 60
    text = "\n".join([
        "# Weir benchmark: targets", "",
        ("**Smoke run**: the harness was checked, not the numbers.\n" if smoke else "")
        + f"Commit {git_describe()}, {len(reports)} suites in {minutes:.0f} min, "
        f"started {reports[0].started:%Y-%m-%d %H:%M} UTC. 1-minute load average at the start → end of each "
        f"suite: {'; '.join(loads)}.", "",
        table(["suite", "target", "Weir", "status"], rows), "",
        "Benchmarks, not tests: a missed target is a finding, with its numbers. Method and how to read the "
        "tables: [bench/README.md](../README.md).", ""])
    path = out_dir / "summary.md"
    path.write_text(text)
    return path
