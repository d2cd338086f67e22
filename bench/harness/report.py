"""Writes a suite's results: SUITE.md (tables), SUITE.csv (long format), SUITE.json (everything,
per round) and SUITE.png (chart)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import os
import pathlib
import platform
import re
import subprocess

from procs import loadavg
from targets import REPO

CSV_FIELDS = ["suite", "section", "target", "param", "metric", "value", "unit", "rounds", "note"]


def fmt(v, digits: int = 1, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        if abs(v) >= 1000 and digits <= 1:
            s = f"{v:,.0f}"
        else:
            s = f"{v:,.{digits}f}"
    else:
        s = f"{v:,}" if isinstance(v, int) else str(v)
    return s + (f" {unit}" if unit else "")


def fmt_signed(v, digits: int = 1) -> str:
    """A number as it appears beside a ratio: '–' when missing."""
    return "–" if v is None else f"{v:,.{digits}f}"


def fmt_over(r, weir=None, nginx=None) -> str:
    """Weir ÷ nginx as a cell: '1.23×'; why there is none when there is none."""
    if r is not None:
        return f"{r:,.2f}×"
    if weir is None or nginx is None:
        return "–"
    return "– (nginx ≤ 0)" if nginx <= 0 else "– (Weir ≤ 0)"


def us_ms(v_us, digits: int = 2) -> str:
    """A µs value as ms."""
    return "–" if v_us is None else f"{v_us / 1000:,.{digits}f}"


def table(header: list[str], rows: list[list], right: set[int] | None = None) -> str:
    """A markdown table; columns in `right` are right-aligned (default: those whose cells look numeric)."""
    if right is None:
        right = set()
        for i in range(1, len(header)):
            cells = [str(r[i]) for r in rows if i < len(r) and str(r[i]) not in ("", "–")]
            if cells and all(re.match(r"^[+-]?[\d,.]+( |$|[ (%×])", c) for c in cells):
                right.add(i)
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if i in right else "---" for i in range(len(header))) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def git_describe() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "src",
                                "tools"], capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + (" (src/ or tools/ modified in the working tree)" if dirty else "")
    except OSError:
        return "?"


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


class Report:
    def __init__(self, suite: str, title: str, env):
        self.suite = suite
        self.title = title
        self.env = env
        self.started = dt.datetime.now(dt.timezone.utc)
        self.load_start = loadavg()
        self.load_end = None
        self.ended = None
        self.meta: list[tuple[str, str]] = []
        self.goals: list[dict] = []          # {goal, value, status, detail}
        self.sections: list[tuple[str, str]] = []
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.unavailable: dict[str, str] = {}
        self.data: dict = {}
        self.figure = None                   # callable(path) drawing the PNG
        self.failures: list[str] = []        # smoke: what broke
        self.vs_nginx: list[dict] = []       # Weir beside nginx, same run (summary.md lists them)

    # ------------------------------------------------------------ content ---
    def add_meta(self, key: str, value: str) -> None:
        self.meta.append((key, value))

    def goal(self, goal: str, value: str, status: str, detail: str = "") -> None:
        """status: met | missed | not measured."""
        self.goals.append({"goal": goal, "value": value, "status": status, "detail": detail})
        self.row("targets", "weir", goal, "status", status, "", note=value)

    def section(self, heading: str, text: str) -> None:
        self.sections.append((heading, text))

    def row(self, section: str, target: str, param, metric: str, value, unit: str = "", rounds=None,
            note: str = "") -> None:
        if isinstance(value, float):
            value = round(value, 3)
        self.rows.append({"suite": self.suite, "section": section, "target": target, "param": param,
                          "metric": metric, "value": value, "unit": unit,
                          "rounds": rounds if rounds is not None else "", "note": note})

    def compare(self, section: str, what: str, weir, nginx, unit: str, digits: int = 1) -> float | None:
        """Records Weir's and nginx's value of one measure from this run and their ratio (Weir ÷ nginx, below
        1 Weir is cheaper); returns the ratio (None when either is missing or ≤ 0: an added latency within
        the noise of the direct path has no meaningful ratio). The summary
        lists every such row; the CSV gets one `vs_nginx` row per measure."""
        r = weir / nginx if weir is not None and nginx is not None and nginx > 0 and weir > 0 else None
        self.vs_nginx.append({"section": section, "measure": what, "weir": weir, "nginx": nginx, "unit": unit,
                              "ratio": r, "digits": digits})
        self.row("vs_nginx", "weir", what, "weir_over_nginx", r, "ratio",
                 note=f"Weir {fmt_signed(weir, digits)} {unit}, nginx {fmt_signed(nginx, digits)} {unit}")
        return r

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def peer_unavailable(self, label: str, reason: str) -> None:
        self.unavailable[label] = reason
        self.row("peers", label, "", "available", "no", note=reason)

    # ------------------------------------------------------------- output ---
    def finish(self) -> None:
        self.ended = dt.datetime.now(dt.timezone.utc)
        self.load_end = loadavg()

    def markdown(self) -> str:
        e = self.env
        secs = (self.ended - self.started).total_seconds() if self.ended else 0
        out = [f"# `{self.suite}`: {self.title}", ""]
        if e.smoke:
            out += ["**Smoke run** (short windows, one round, direct + Weir + nginx only): "
                    "checks the harness, not the numbers.", ""]
        la0 = " / ".join(f"{x:.2f}" for x in self.load_start)
        la1 = " / ".join(f"{x:.2f}" for x in (self.load_end or self.load_start))
        info = [
            ("when", f"{self.started:%Y-%m-%d %H:%M} UTC, {secs / 60:.1f} min"),
            ("commit", git_describe()),
            ("machine", f"{os.cpu_count()} × {cpu_model()}, {platform.release()}"),
            ("load average (1/5/15 min)", f"start {la0}, end {la1}"
             + ("  **(busy machine: other processes competed for the 2 cores)**"
                if max(self.load_start[0], (self.load_end or self.load_start)[0]) > 1.5 else "")),
            ("pinning", f"gateway under test on CPU {e.gateway_cpu}; weir-mock and weir-bench on CPU {e.load_cpu}"
             + ("; each process in its own session with autogroup nice -10" if e.priority else
                "; normal priority")),
            ("rounds", f"{e.rounds} (targets alternated within each round, medians over rounds)"),
        ] + self.meta
        out.append(table(["run", ""], [[k, v] for k, v in info]))
        out.append("")
        if self.goals:
            out += ["## Targets", ""]
            out.append(table(["target", "Weir", "status"],
                             [[g["goal"], g["value"], {"met": "**met**", "missed": "**missed**"}.get(
                                 g["status"], g["status"])] for g in self.goals]))
            out.append("")
        for heading, text in self.sections:
            out += [f"## {heading}", "", text.rstrip(), ""]
        if self.unavailable:
            out += ["## Peers not measured", ""]
            out.append(table(["peer", "reason"], [[k, v] for k, v in self.unavailable.items()]))
            out.append("")
        if self.notes:
            out += ["## Notes", ""] + [f"- {n}" for n in self.notes] + [""]
        out += [f"Files: `{self.suite}.csv` (every number, long format), `{self.suite}.json` "
                f"(per-round weir-bench reports, summarised), `{self.suite}.png`. "
                f"Method: [bench/README.md](../README.md).", ""]
        return "\n".join(out)

    def write(self, out_dir: pathlib.Path) -> list[pathlib.Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        md = out_dir / f"{self.suite}.md"
        md.write_text(self.markdown())
        cs = out_dir / f"{self.suite}.csv"
        with cs.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            for r in self.rows:
                w.writerow(r)
        js = out_dir / f"{self.suite}.json"
        js.write_text(json.dumps({
            "suite": self.suite, "title": self.title, "smoke": self.env.smoke, "rounds": self.env.rounds,
            "started": self.started.isoformat(), "ended": self.ended.isoformat() if self.ended else None,
            "loadavg_start": self.load_start, "loadavg_end": self.load_end, "commit": git_describe(),
            "meta": dict(self.meta), "targets": self.goals, "unavailable": self.unavailable,
            "notes": self.notes, "vs_nginx": self.vs_nginx, "data": self.data}, indent=1, default=str) + "\n")
        png = out_dir / f"{self.suite}.png"
        draw(self, png)
        return [md, cs, js, png]


def draw(report: Report, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if report.figure is None:
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.text(0.5, 0.5, f"{report.suite}: no chart", ha="center", va="center")
        ax.axis("off")
    else:
        fig = report.figure(plt)
    fig.suptitle(f"weir bench {report.suite}: {report.title}"
                 + (" (smoke)" if report.env.smoke else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
