"""governed: the latency suite with API keys, rate limits and budgets on (never tripping) against the same
gateway with them off: what the checks cost."""

from __future__ import annotations

import configs
import suite_latency as lat
from common import Options, stop_targets
from report import Report, table
from targets import Env, Mock, direct, start_weir

TITLE = "cost of governance: API keys, rate limits and budgets on vs off"
LEVELS = [1, 4, 16, 64, 256, 1024]


def run(env: Env, opts: Options) -> Report:
    rep = Report("governed", TITLE, env)
    mock = Mock(env, ttft_ms=0, itl_ms=0, max_tokens=128)
    rep.add_meta("mock", mock.describe() + " (instant)")
    plain = start_weir(env, "weir (checks off)", configs.plain(mock.url, configs.ACCESS_LOG_FILE), tag="weir-plain")
    gov = start_weir(env, "weir (governed)", configs.governed(mock.url, configs.ACCESS_LOG_FILE), tag="weir-governed",
                     headers=[f"Authorization: Bearer {configs.API_KEY}"])
    rep.add_meta("weir", f"{plain.version}; --workers 1; access log on in both (a file each). Governed: API key (SHA-256 "
                 "lookup) → tenant; tenant and key token buckets (requests, tokens), stream caps and budgets "
                 "(limits set never to trip), pricing, spend settled per request. Checks off: the same "
                 "pool, no auth section")
    rep.add_meta("load", "as the latency suite: closed loop, payload `small` (non-streamed, max_tokens 16)")
    targets = [direct(mock), plain, gov]

    env.log("  governed: concurrency 1")
    c1 = lat.concurrency1(env, targets, mock, "c1", rep)
    text, added = lat.concurrency1_table(c1, rep, "concurrency1")
    rep.section("Concurrency 1, instant mock (µs)", text)
    env.log("  governed: frontier")
    front = lat.frontier(env, targets, mock, "frontier", rep, levels=[1, 16] if env.smoke else LEVELS)
    ftext, points = lat.frontier_tables(front, rep, "frontier")
    rep.section("Throughput frontier (closed loop)", ftext)
    stop_targets(targets)
    mock.stop()

    p, g = points.get(plain.label, {}), points.get(gov.label, {})
    rows = []
    costs = {}
    for b in lat.BOUNDS_MS:
        pv = p.get(b)[0] if p.get(b) else None
        gv = g.get(b)[0] if g.get(b) else None
        cost = (1 - gv / pv) if pv and gv is not None else None
        costs[b] = cost
        rows.append(["unbounded" if b is None else f"p99 < {b} ms", f"{pv:,.0f}" if pv else "–",
                     f"{gv:,.0f}" if gv is not None else "–", f"{cost * 100:+.1f} %" if cost is not None else "–"])
        rep.row("cost", "weir", "unbounded" if b is None else f"p99<{b}ms", "throughput_cost",
                cost * 100 if cost is not None else None, "%")
    ap, ag = added.get(plain.label), added.get(gov.label)
    if ap and ag:
        for q in ("p50", "p99"):
            if ap[q] is not None and ag[q] is not None:
                rows.append([f"added {q} at concurrency 1", f"{ap[q]:+,.0f} µs", f"{ag[q]:+,.0f} µs",
                             f"{ag[q] - ap[q]:+,.0f} µs"])
                rep.row("cost", "weir", 1, f"added_{q}_delta", ag[q] - ap[q], "us")
    rep.section("What the checks cost", (
        "Throughput cost = 1 − governed / checks-off, at each frontier bound (positive: the checks cost "
        "throughput; a negative value is noise).\n\n" + table(["measure", "checks off", "governed", "cost"], rows)))
    c = costs.get(None)
    if c is not None:
        extra = f"; under a 1 ms p99: {costs[1] * 100:+.1f} %" if costs.get(1) is not None else ""
        rep.goal("governance costs at most 10 % of throughput",
                 f"{c * 100:+.1f} % of the unbounded frontier ({g[None][0]:,.0f} vs {p[None][0]:,.0f} req/s){extra}",
                 "met" if c <= 0.10 else "missed")
    else:
        rep.goal("governance costs at most 10 % of throughput", "not measured", "not measured")
    rep.data = {"concurrency1": {k: [lat.trim(r) for r in v] for k, v in c1.items()},
                "frontier": {k: {str(c): a for c, a in v.items()} for k, v in front.items()}}

    def figure(plt):
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, lv in front.items():
            cs = sorted(lv)
            pts = [((lv[c]["achieved_rate_rps"] or 0), (lv[c]["e2e_p99_us"] or 0) / 1000) for c in cs]
            if pts:
                ax.plot([q[0] for q in pts], [max(q[1], 0.001) for q in pts], marker="o", label=label)
        ax.set_yscale("log")
        ax.set_xlabel("req/s carried (closed loop)")
        ax.set_ylabel("p99 e2e (ms, log)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        return fig
    rep.figure = figure
    return rep
