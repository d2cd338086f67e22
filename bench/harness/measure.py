"""Alternation, repetition and medians: the noise handling shared by every suite.

A *cell* is one load shape (a rate, a concurrency, a stream count). Within a
cell, each round runs every target once, back to back, in an order rotated per
round (round r starts at target r), so drift on the shared machine hits each
target alike; only the target being measured runs (the other gateways are
SIGSTOPped). Numbers are the median over rounds. Added latency is computed per
round (gateway minus the direct run of the same round) and the median of those
differences is reported.
"""

from __future__ import annotations

import statistics
from typing import Callable

import loadgen
from loadgen import Load
from procs import HarnessError
from targets import Env, Mock, Target

HISTS = ("e2e", "ttft", "itl", "hop")
PCTS = ("p50", "p90", "p99", "p99_9", "max")


def median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def focus(targets: list[Target], current: Target) -> None:
    """Resume `current`, pause every other gateway."""
    for t in targets:
        if t is not current and t.proc is not None:
            t.pause()
    current.resume()


def run_cell(env: Env, targets: list[Target], load_for: Callable[[Target], Load], tag: str,
             mock: Mock | None = None, rounds: int | None = None,
             give_up: Callable[[dict], str | None] | None = None,
             probe: Callable[[Target], dict[str, float]] | None = None) -> dict[str, list[dict]]:
    """Runs `rounds` rounds over the available targets; returns label -> list of per-round results.

    A result of a round that was not run is absent. `give_up(result)` may return a reason to skip the
    target's remaining rounds of this cell (a peer that failed outright); the reason is kept in
    result["gave_up"]. `probe(target)` (counters: the mock's and the gateway's /metrics) is read just
    before and just after each run, outside the gateway's CPU window; result["probe"] holds each
    counter's increase over the run."""
    rounds = rounds or env.rounds
    live = [t for t in targets if t.available]
    results: dict[str, list[dict]] = {t.label: [] for t in live}
    stopped: dict[str, str] = {}
    for r in range(rounds):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for t in order:
            if t.label in stopped:
                continue
            if not t.alive():
                t.available = False
                t.reason = t.reason or f"exited during the run (log: {t.proc.log_path if t.proc else '-'})"
                stopped[t.label] = t.reason
                continue
            focus(targets, t)
            before = probe(t) if probe else None
            res = loadgen.run(env, t, load_for(t), f"{tag}-r{r + 1}", mock=mock)
            if probe:
                after = probe(t)
                res["probe"] = {k: after[k] - before[k] for k in after if k in before}
            res["round"] = r + 1
            results[t.label].append(res)
            if env.verbose:
                env.log(f"    {tag} r{r + 1} {t.label:<24} {brief(res)}")
            why = give_up(res) if give_up else None
            if why:
                res["gave_up"] = why
                stopped[t.label] = why
    for t in live:
        t.pause()
    return results


def brief(d: dict) -> str:
    e2e, ttft, itl = d.get("e2e", {}), d.get("ttft", {}), d.get("itl", {})
    parts = [f"{d.get('achieved_rate_rps', 0):8.1f} req/s ok"]
    if ttft.get("count"):
        parts.append(f"ttft p50/p99 {ttft['p50_us'] / 1000:.2f}/{ttft['p99_us'] / 1000:.2f} ms")
    if itl.get("count"):
        parts.append(f"itl p99 {itl['p99_us'] / 1000:.2f} ms")
    if e2e.get("count") and not ttft.get("count"):
        parts.append(f"e2e p50/p99 {e2e['p50_us']:.0f}/{e2e['p99_us']:.0f} us")
    if d.get("errors_total"):
        parts.append(f"ERRORS {d['errors_total']} ({loadgen.summarize_errors(d)})")
    if d.get("target_cpu_cores") is not None:
        parts.append(f"cpu {d['target_cpu_cores']:.2f}")
    if d.get("generator_saturated"):
        parts.append("GENERATOR SATURATED")
    return ", ".join(parts)


def agg(results: list[dict]) -> dict:
    """Medians over rounds of the usual numbers; flags are OR-ed, counts summed where that makes sense."""
    if not results:
        return {}
    out: dict = {"rounds": len(results)}
    for h in HISTS:
        for p in PCTS:
            out[f"{h}_{p}_us"] = median(r.get(h, {}).get(f"{p}_us") if r.get(h, {}).get("count") else None
                                        for r in results)
        out[f"{h}_count"] = sum(r.get(h, {}).get("count", 0) for r in results)
    for k in ("achieved_rate_rps", "send_rate_rps", "tokens_per_s", "target_cpu_cores"):
        out[k] = median(r.get(k) for r in results)
    # CPU per request (µs), user and system apart: each round's cores over its own rate.
    for part in ("user", "sys"):
        out[f"cpu_{part}_us_per_request"] = median(
            r[f"target_cpu_{part}_cores"] / r["achieved_rate_rps"] * 1e6
            if r.get(f"target_cpu_{part}_cores") is not None and r.get("achieved_rate_rps") else None
            for r in results)
    out["errors_total"] = sum(r.get("errors_total", 0) for r in results)
    out["events_total"] = sum((r.get("generator") or {}).get("events_total") or 0 for r in results)
    out["cpu_us_per_event"] = median(cpu_us_per_event(r) for r in results)
    out["scheduled"] = sum(r.get("scheduled", 0) for r in results)
    out["error_rate"] = out["errors_total"] / out["scheduled"] if out["scheduled"] else None
    out["errors_text"] = "; ".join(filter(None, (loadgen.summarize_errors(r) for r in results)))
    out["target_rss_kb"] = max(r.get("target_rss_kb", 0) for r in results)
    out["target_hwm_kb"] = max(r.get("target_hwm_kb", 0) for r in results)
    out["generator_saturated"] = any(r.get("generator_saturated") for r in results)
    reasons = []
    for r in results:
        for why in r.get("saturation_reasons", []) or []:
            short = why.split(":")[0]
            if short.startswith("sender lag"):
                short = "sender lag p99 over --max-lag"
            if short not in reasons:
                reasons.append(short)
    out["saturation_reasons"] = reasons
    out["saturated_rounds"] = sum(1 for r in results if r.get("generator_saturated"))
    out["mock_lag_p99_ms"] = median(r.get("mock_lag_p99_ms") for r in results)
    out["gave_up"] = next((r["gave_up"] for r in results if r.get("gave_up")), None)
    return out


def cpu_us_per_event(r: dict) -> float | None:
    """The gateway's CPU over one weir-bench run (warm-up and drain included) per SSE event weir-bench
    received in it (every request's, warm-up included), µs; None without a gateway process or events."""
    cpu = r.get("target_cpu_run_s")
    events = (r.get("generator") or {}).get("events_total") or 0
    return cpu * 1e6 / events if cpu is not None and events else None


def added(target_rs: list[dict], direct_rs: list[dict], hist: str, pct: str) -> float | None:
    """Median over rounds of (target − direct) for hist/pct, paired by round; µs."""
    by_round = {r["round"]: r for r in direct_rs}
    diffs = []
    for r in target_rs:
        d = by_round.get(r["round"])
        if not d:
            continue
        a, b = r.get(hist, {}), d.get(hist, {})
        if a.get("count") and b.get("count"):
            diffs.append(a[f"{pct}_us"] - b[f"{pct}_us"])
    return median(diffs)


def require_clean(env: Env, label: str, results: list[dict], what: str, failures: list[str]) -> None:
    """Smoke mode: errors where none are expected are a failure of the harness run. A stall (a gap between
    tokens over the suite's limit, with every token still delivered) is a timing verdict, not a fault: on a
    host whose load CPU is starved (CI runs the smoke beside the end-to-end tests) the direct path stalls as
    well, so stalls are noted, never failed; a hang still fails as weir-bench's timeout error."""
    for r in results:
        stalls = (r.get("errors") or {}).get("stall", 0)
        if r.get("errors_total", 0) - stalls > 0:
            failures.append(f"{what}: {label} had {r['errors_total']} errors ({loadgen.summarize_errors(r)})"
                            f" in {r.get('raw_file')}")
        elif stalls:
            env.log(f"    note: {what}: {label} had {stalls} stalls (a starved host: timing, not failed)")
        if not r.get("target_alive", True):
            failures.append(f"{what}: {label} died during the run")


def check_started(targets: list[Target], must: list[str]) -> None:
    for t in targets:
        if t.name in must and not t.available:
            raise HarnessError(f"{t.label} is not available: {t.reason}")
