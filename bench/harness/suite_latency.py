"""latency: the cost of one hop. Instant mock at concurrency 1 (added µs), the closed-loop throughput
frontier (1..1024 in flight), and the seed-002 shape (20 ms mock, concurrency 1..256)."""

from __future__ import annotations

import shutil
import time

import configs
import measure
from common import (PRETTY, Options, added_cell, gateway_failed, live, peers_for, sat_text, start_peers,
                    stop_targets, twin_notes, baseline_targets)
from loadgen import Load, run as bench_run, summarize_errors
from measure import agg, median
from procs import HarnessError
from report import Report, fmt_over, table
from targets import Env, Mock, Target, direct, peer_targets, start_weir
from tracing import stop_wrapped, strace_argv, strace_counts

TITLE = "added latency of one hop, throughput frontier, seed-002 shape"
LEVELS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
BOUNDS_MS = [1, 5, 10, 50, 100, None]
SEED002_LEVELS = [1, 4, 16, 64, 256]
DIRECT = "direct (no gateway)"
# Syscalls per request: requests/s under strace (far enough apart that one is in flight at a time; a
# request under strace takes about a millisecond), warm-up requests, and N (runs of N and 2N requests).
SYSCALL_RATE = 200.0
SYSCALL_WARM = 20
SYSCALL_N, SYSCALL_N_SMOKE = 400, 40
SYSCALL_TOP = 12


def small_load(env: Env, concurrency: int, duration: float | None = None, warmup: float | None = None) -> Load:
    """Non-streamed chat completion ("Say hello.", max_tokens 16), closed loop."""
    d = duration if duration is not None else (0.5 if env.smoke else 2.0)
    w = warmup if warmup is not None else (0.2 if env.smoke else 0.4)
    return Load(concurrency=concurrency, duration=d, warmup=w, payload="small", timeout=10, stall_ms=0)


# ----------------------------------------------------------- concurrency 1 ---

def concurrency1(env: Env, targets: list[Target], mock: Mock, tag: str, rep: Report) -> dict[str, list[dict]]:
    duration = 0.5 if env.smoke else 4.0
    res = measure.run_cell(env, live(targets), lambda t: small_load(env, 1, duration), tag, mock=mock,
                           give_up=gateway_failed)
    if env.smoke:
        for label, rs in res.items():
            if label.startswith(("direct", "weir", "nginx")):
                measure.require_clean(env, label, rs, tag, rep.failures)
    return res


def concurrency1_table(res: dict[str, list[dict]], rep: Report, section: str) -> tuple[str, dict]:
    d = res.get(DIRECT, [])
    rows, added = [], {}
    for label, rs in res.items():
        if not rs:
            continue
        a = agg(rs)
        ad = {p: measure.added(rs, d, "e2e", p) for p in ("p50", "p90", "p99", "p99_9")}
        hop = {p: measure.added(rs, d, "hop", p) for p in ("p50", "p99", "p99_9")}
        added[label] = ad
        is_direct = label == DIRECT
        rows.append([label, f"{a['achieved_rate_rps']:,.0f}",
                     f"{a['e2e_p50_us']:,.0f} / {a['e2e_p99_us']:,.0f} / {a['e2e_p99_9_us']:,.0f}",
                     "" if is_direct else f"{ad['p50']:+,.0f}" if ad['p50'] is not None else "–",
                     "" if is_direct else f"{ad['p99']:+,.0f}" if ad['p99'] is not None else "–",
                     "" if is_direct else f"{ad['p99_9']:+,.0f}" if ad['p99_9'] is not None else "–",
                     "" if is_direct else " / ".join(f"{hop[p]:+,.0f}" if hop[p] is not None else "–"
                                                     for p in ("p50", "p99", "p99_9")),
                     "" if is_direct else f"{a['target_cpu_cores']:.2f}" if a['target_cpu_cores'] is not None else "–",
                     sat_text(a)])
        for p in ("p50", "p99", "p99_9"):
            rep.row(section, label, 1, f"e2e_{p}", a[f"e2e_{p}_us"], "us", a["rounds"])
            if not is_direct:
                rep.row(section, label, 1, f"added_e2e_{p}", ad[p], "us", a["rounds"])
                rep.row(section, label, 1, f"added_hop_{p}", hop[p], "us", a["rounds"])
        rep.row(section, label, 1, "achieved_rps", a["achieved_rate_rps"], "req/s", a["rounds"])
    text = table(["target", "req/s", "e2e p50 / p99 / p99.9 (µs)", "added p50 (µs)", "added p99 (µs)",
                  "added p99.9 (µs)", "added per request p50 / p99 / p99.9 (µs)", "CPU", "notes"], rows)
    return text, added


# --------------------------------------------------------------- frontier ---

def frontier(env: Env, targets: list[Target], mock: Mock, tag: str, rep: Report,
             levels: list[int] | None = None) -> dict[str, dict[int, dict]]:
    """Closed-loop sweep; returns label -> level -> aggregate. A target stops once it failed (errors above
    1 % or p99 over 1 s) or its throughput stopped growing while p99 was over 100 ms."""
    levels = levels or ([1, 16] if env.smoke else LEVELS)
    out: dict[str, dict[int, dict]] = {t.label: {} for t in live(targets)}
    done: dict[str, str] = {}
    for c in levels:
        active = [t for t in live(targets) if t.label not in done]
        if not active:
            break
        res = measure.run_cell(env, active, lambda t: small_load(env, c), f"{tag}-c{c}", mock=mock,
                               give_up=gateway_failed)
        for t in active:
            rs = res.get(t.label, [])
            if not rs:
                continue
            a = agg(rs)
            out[t.label][c] = a
            if env.smoke and t.label.startswith(("direct", "weir", "nginx")):
                measure.require_clean(env, t.label, rs, f"{tag} c={c}", rep.failures)
            best = max((x["achieved_rate_rps"] or 0) for x in out[t.label].values())
            prev = [x for lvl, x in out[t.label].items() if lvl < c]
            if (a["error_rate"] or 0) > 0.01 or (a["e2e_p99_us"] or 0) > 1e6 or a.get("gave_up"):
                done[t.label] = f"stopped after concurrency {c}: {sat_text(a) or 'p99 over 1 s'}"
            elif prev and (a["e2e_p99_us"] or 0) > 100e3 and (a["achieved_rate_rps"] or 0) < 1.05 * max(
                    (x["achieved_rate_rps"] or 0) for x in prev) and (a["achieved_rate_rps"] or 0) <= best:
                done[t.label] = f"stopped after concurrency {c}: throughput no longer grew, p99 over 100 ms"
    for label, why in done.items():
        rep.note(f"frontier ({tag}): {label} {why}")
    return out


def frontier_points(levels: dict[int, dict]) -> dict:
    """Best req/s with zero failures under each p99 bound: bound -> (req/s, concurrency, p99 µs)."""
    out = {}
    for b in BOUNDS_MS:
        best = None
        for c, a in levels.items():
            if a.get("errors_total"):
                continue
            p99 = a.get("e2e_p99_us")
            if p99 is None or (b is not None and p99 >= b * 1000):
                continue
            rps = a.get("achieved_rate_rps") or 0
            if best is None or rps > best[0]:
                best = (rps, c, p99)
        out[b] = best
    return out


def cpu_split_text(a: dict) -> str:
    """The gateway's CPU per request, its own code (utime) and the kernel's work for it (stime), in µs;
    empty for the direct path (no gateway)."""
    u, k = a.get("cpu_user_us_per_request"), a.get("cpu_sys_us_per_request")
    return f"{u:.1f} + {k:.1f}" if u is not None and k is not None and (u or k) else ""


def frontier_tables(front: dict[str, dict[int, dict]], rep: Report, section: str) -> tuple[str, dict]:
    points = {label: frontier_points(lv) for label, lv in front.items() if lv}
    rows = []
    for label, pts in points.items():
        row = [label]
        for b in BOUNDS_MS:
            p = pts[b]
            row.append(f"{p[0]:,.0f} (c={p[1]})" if p else "–")
            rep.row(section, label, "unbounded" if b is None else f"p99<{b}ms", "max_rps_zero_failures",
                    p[0] if p else None, "req/s", note=f"concurrency {p[1]}, p99 {p[2]:.0f} us" if p else "")
        rows.append(row)
    text = table(["target"] + [f"p99 < {b} ms" if b else "unbounded" for b in BOUNDS_MS], rows)
    levels = sorted({c for lv in front.values() for c in lv})
    detail = []
    for label, lv in front.items():
        for c in levels:
            a = lv.get(c)
            if not a:
                continue
            detail.append([label, c, f"{a['achieved_rate_rps']:,.0f}", f"{a['e2e_p50_us']:,.0f}",
                           f"{a['e2e_p99_us']:,.0f}",
                           f"{a['target_cpu_cores']:.2f}" if a.get('target_cpu_cores') is not None else "",
                           cpu_split_text(a), sat_text(a)])
            rep.row(section + "_levels", label, c, "achieved_rps", a["achieved_rate_rps"], "req/s", a["rounds"])
            rep.row(section + "_levels", label, c, "e2e_p50", a["e2e_p50_us"], "us", a["rounds"])
            rep.row(section + "_levels", label, c, "e2e_p99", a["e2e_p99_us"], "us", a["rounds"])
            rep.row(section + "_levels", label, c, "errors", a["errors_total"], "requests", a["rounds"])
            rep.row(section + "_levels", label, c, "cpu_cores", a.get("target_cpu_cores"), "cores", a["rounds"])
            for part in ("user", "sys"):
                rep.row(section + "_levels", label, c, f"cpu_{part}_per_request", a.get(f"cpu_{part}_us_per_request"),
                        "us", a["rounds"])
    detail_text = table(["target", "concurrency", "req/s", "p50 (µs)", "p99 (µs)", "CPU",
                         "CPU µs / request, user + sys", "notes"], detail)
    return text + "\n\nEvery level (medians over rounds):\n\n" + detail_text, points


# ------------------------------------------------------ syscalls per request ---

def syscall_run(env: Env, opts: Options, mock: Mock, kind: str, count: int, longest: int, tag: str) -> dict:
    """A fresh `kind` ('weir' or 'nginx', as in the suite's targets) under `strace -f -c`: SYSCALL_WARM
    requests, then `count`, open loop at SYSCALL_RATE (exactly rate × duration requests, all awaited), then
    idle until the run has lasted as long as one of `longest` requests (timer work cancels out), stop.
    Returns the calls per syscall and what weir-bench issued."""
    out_file = env.work / f"{tag}.strace"
    if kind == "weir":
        t = start_weir(env, "weir under strace", configs.plain(mock.url, configs.ACCESS_LOG_FILE), tag=tag, wrapper=strace_argv(out_file))
    else:
        t = peer_targets(env, mock, [kind], opts.install_peers, wrapper=strace_argv(out_file),
                         tag_suffix=f"-{tag}")[0]
        if not t.available:
            raise HarnessError(f"{kind} under strace did not start: {t.reason}")
    try:
        load = Load(rate=SYSCALL_RATE, warmup=SYSCALL_WARM / SYSCALL_RATE, duration=count / SYSCALL_RATE,
                    payload="small", timeout=10, stall_ms=0, max_lag_ms=1000)
        d = bench_run(env, t, load, tag)
        if longest > count:
            time.sleep((longest - count) / SYSCALL_RATE)
    finally:
        stop_wrapped(t, kind, timeout=30)
    gen = d.get("generator") or {}
    return {"calls": strace_counts(out_file), "requests": gen.get("requests_total") or 0,
            "max_inflight": gen.get("max_inflight"), "errors_total": d.get("errors_total", 0),
            "errors_text": summarize_errors(d), "raw_file": d.get("raw_file")}


def syscalls(env: Env, opts: Options, mock: Mock, rep: Report) -> dict[str, dict]:
    """Syscalls per non-streamed request for Weir and nginx, each under strace -f -c: per round and target,
    a run of N requests and one of 2N, each a fresh process; (2N run − N run) / (requests more) cancels
    start-up, warm-up and shutdown. Rounds alternate the targets; medians over rounds.
    Returns kind -> {"total": per request, "calls": {syscall: per request}, "max_inflight", "rounds"}."""
    n = SYSCALL_N_SMOKE if env.smoke else SYSCALL_N
    kinds = ["weir"] + (["nginx"] if "nginx" in peers_for(env, opts) else [])
    per_round: dict[str, list[dict]] = {k: [] for k in kinds}
    failed: dict[str, str] = {}
    for r in range(env.rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        for kind in order:
            if kind in failed:
                continue
            try:
                a = syscall_run(env, opts, mock, kind, n, 2 * n, f"strace-{kind}-r{r + 1}-n")
                b = syscall_run(env, opts, mock, kind, 2 * n, 2 * n, f"strace-{kind}-r{r + 1}-2n")
            except HarnessError as e:
                failed[kind] = str(e).splitlines()[0]
                continue
            for x in (a, b):
                if x["errors_total"]:
                    rep.failures.append(f"syscalls: {kind} under strace had {x['errors_total']} errors "
                                        f"({x['errors_text']}) in {x['raw_file']}")
            dreq = b["requests"] - a["requests"]
            if dreq <= 0:
                failed[kind] = f"the runs of {n} and {2 * n} requests could not be told apart"
                continue
            names = set(a["calls"]) | set(b["calls"])
            per = {k: (b["calls"].get(k, 0) - a["calls"].get(k, 0)) / dreq for k in names}
            per_round[kind].append({"calls": per, "total": sum(per.values()), "requests": dreq,
                                    "max_inflight": max(a["max_inflight"] or 0, b["max_inflight"] or 0)})
            env.log(f"    syscalls r{r + 1} {kind:<6} {sum(per.values()):.2f} per request "
                    f"({dreq} requests more in the 2N run)")
    out: dict[str, dict] = {}
    for kind, rs in per_round.items():
        if not rs:
            continue
        names = set().union(*(x["calls"] for x in rs))
        out[kind] = {"total": median(x["total"] for x in rs),
                     "calls": {k: median(x["calls"].get(k, 0.0) for x in rs) for k in names},
                     "max_inflight": max(x["max_inflight"] for x in rs), "rounds": len(rs)}
    for kind, why in failed.items():
        rep.note(f"syscalls per request: {kind} not measured: {why}")
        if env.smoke:
            rep.failures.append(f"syscalls: {kind}: {why}")
    return out


def syscalls_section(sc: dict[str, dict], rep: Report, n: int) -> None:
    kinds = [k for k in ("weir", "nginx") if k in sc]
    w, g = sc.get("weir"), sc.get("nginx")
    names = set().union(*(sc[k]["calls"] for k in kinds)) if kinds else set()
    top = sorted(names, key=lambda k: -max(abs(sc[x]["calls"].get(k, 0.0)) for x in kinds))
    shown = [k for k in top if max(abs(sc[x]["calls"].get(k, 0.0)) for x in kinds) >= 0.05][:SYSCALL_TOP]

    def cell(kind: str, v) -> str:
        return f"{v:.2f}" if kind in sc and v is not None else "–"

    def rest(kind: str) -> float | None:
        return sum(v for k, v in sc[kind]["calls"].items() if k not in shown) if kind in sc else None

    rows = [["**total**", cell("weir", w and w["total"]), cell("nginx", g and g["total"]),
             f"{w['total'] - g['total']:+.2f}" if w and g else "–",
             fmt_over(w["total"] / g["total"] if w and g and g["total"] > 0 else None,
                      w and w["total"], g and g["total"])]]
    for k in shown + ["(other)"]:
        wv = (w["calls"].get(k, 0.0) if k != "(other)" else rest("weir")) if w else None
        gv = (g["calls"].get(k, 0.0) if k != "(other)" else rest("nginx")) if g else None
        if k == "(other)" and abs(wv or 0) < 0.005 and abs(gv or 0) < 0.005:
            continue
        rows.append([f"`{k}`" if k != "(other)" else k, cell("weir", wv), cell("nginx", gv),
                     f"{wv - gv:+.2f}" if wv is not None and gv is not None else "–", ""])
    for kind in kinds:
        rep.row("syscalls", kind, "total", "syscalls_per_request", sc[kind]["total"], "syscalls",
                sc[kind]["rounds"], note=f"max in flight {sc[kind]['max_inflight']}")
        for k, v in sorted(sc[kind]["calls"].items()):
            rep.row("syscalls", kind, k, "syscalls_per_request", v, "syscalls", sc[kind]["rounds"])
    rep.compare("syscalls", "syscalls per non-streamed request (strace -f -c)", w and w["total"],
                g and g["total"], "syscalls", 2)
    inflight = {k: sc[k]["max_inflight"] for k in kinds}
    many = [f"{k} {v}" for k, v in inflight.items() if v and v > 1]
    rep.section("Syscalls per request (strace -f -c), Weir and nginx", (
        f"Non-streamed requests (payload `small`, instant mock), one at a time: open loop at "
        f"{SYSCALL_RATE:g} req/s, a request under strace takes about a millisecond"
        + (f" (but more than one was in flight at times: {', '.join(many)})" if many else
           " (weir-bench never had more than one in flight)")
        + f". Each target runs under `strace -f -c` (every process it forks: nginx's master and worker), "
        f"fresh for each run: {SYSCALL_WARM} warm-up requests, then {n} requests and an idle wait as long as "
        f"{n} more, or {2 * n} requests; (2N run − N run) ÷ the requests more counts what one request costs, "
        f"start-up, warm-up, idle timers and shutdown cancelling out. Medians over rounds; the syscalls of "
        f"either target above 0.05 per request, the rest as (other). Client side excluded (weir-bench is not "
        f"traced).\n\n"
        + table(["syscall", "Weir per request", "nginx per request", "Weir − nginx", "Weir ÷ nginx"], rows)))


# --------------------------------------------------------------- the suite ---

def run(env: Env, opts: Options) -> Report:
    rep = Report("latency", TITLE, env)
    mock = Mock(env, ttft_ms=0, itl_ms=0, max_tokens=128)
    rep.add_meta("mock", mock.describe() + " (instant) for concurrency 1 and the frontier; then restarted on "
                 "the same port with --ttft-ms 20 for the seed-002 shape")
    rep.add_meta("load", "weir-bench closed loop, payload `small` (chat completion \"Say hello.\", max_tokens 16, "
                 "not streamed); latency = e2e (request written → last byte)")
    weir = start_weir(env, "weir", configs.plain(mock.url, configs.ACCESS_LOG_FILE), tag="weir-plain")
    rep.add_meta("weir", f"{weir.version}; --workers 1; one pool, no auth, no limits, access log on "
                 "(a file of its own; nginx's access_log off)")
    targets = ([direct(mock), weir] + baseline_targets(env, configs.plain(mock.url, configs.ACCESS_LOG_FILE), rep)
               + start_peers(env, opts, mock, rep))

    env.log("  latency: concurrency 1, instant mock")
    c1 = concurrency1(env, targets, mock, "c1", rep)
    text, added = concurrency1_table(c1, rep, "concurrency1")
    for p, name in (("p50", "p50"), ("p99", "p99"), ("p99_9", "p99.9")):
        if "weir" in added or "nginx" in added:
            rep.compare("concurrency1", f"added e2e {name}, non-streamed, concurrency 1",
                        added.get("weir", {}).get(p), added.get("nginx", {}).get(p), "µs", 0)
    rep.section("Concurrency 1, instant mock: added latency (µs)", (
        "One request at a time; added = gateway e2e − direct e2e, per round, median over rounds. *Added per "
        "request*: the same from each request's own hop (weir-bench's `hop`: the client's wait less the time "
        "weir-mock --stamp says it spent on the request), gateway − direct, free of the mock's and the "
        "generator's jitter.\n\n" + text))

    env.log("  latency: throughput frontier")
    front = frontier(env, targets, mock, "frontier", rep)
    ftext, points = frontier_tables(front, rep, "frontier")
    rep.section("Throughput frontier (closed loop, instant mock)", (
        "The most requests/s carried with **zero failures** while the p99 stayed under each bound, over "
        "concurrency levels " + ", ".join(str(c) for c in sorted({c for lv in front.values() for c in lv}))
        + " (closed loop: latency from the moment a request is issued). The direct row is the mock and the "
        "load generator alone on their core: no gateway can exceed it here. In every level's row, CPU is the "
        "gateway's cores busy over the measured window, and CPU per request splits it into the gateway's own "
        "code (utime) and the kernel's work for it (stime), each over the requests carried, from 10 ms clock "
        "ticks: near a gateway's own limit, the user part is what its code costs against another's.\n\n" + ftext))

    n = SYSCALL_N_SMOKE if env.smoke else SYSCALL_N
    if shutil.which("strace"):
        env.log("  latency: syscalls per request (Weir and nginx under strace -f -c)")
        sc = syscalls(env, opts, mock, rep)
        syscalls_section(sc, rep, n)
    else:
        sc = {}
        rep.section("Syscalls per request (strace -f -c), Weir and nginx",
                    "Not measured: strace is not installed (scripts/setup installs it).")
        if env.smoke:
            rep.failures.append("syscalls: strace is not installed (scripts/setup installs it)")

    env.log("  latency: seed-002 shape (20 ms mock)")
    mock.restart(ttft_ms=20, itl_ms=0, max_tokens=128)
    s2_levels = [1, 4] if env.smoke else SEED002_LEVELS
    s2: dict[str, dict[int, list[dict]]] = {}
    for c in s2_levels:
        res = measure.run_cell(env, live(targets), lambda t: small_load(env, c), f"seed002-c{c}", mock=mock,
                               give_up=gateway_failed)
        for label, rs in res.items():
            s2.setdefault(label, {})[c] = rs
            if env.smoke and label.startswith(("direct", "weir", "nginx")):
                measure.require_clean(env, label, rs, f"seed002 c={c}", rep.failures)
    rows = []
    for label, lv in s2.items():
        for c, rs in lv.items():
            a = agg(rs)
            d = s2.get(DIRECT, {}).get(c, [])
            p50 = measure.added(rs, d, "e2e", "p50")
            p99 = measure.added(rs, d, "e2e", "p99")
            rows.append([c, label, f"{a['achieved_rate_rps']:,.1f}", f"{a['e2e_p50_us'] / 1000:.2f}",
                         f"{a['e2e_p99_us'] / 1000:.2f}",
                         "" if label == DIRECT else added_cell(p50), "" if label == DIRECT else added_cell(p99),
                         sat_text(a)])
            rep.row("seed002", label, c, "achieved_rps", a["achieved_rate_rps"], "req/s", a["rounds"])
            rep.row("seed002", label, c, "e2e_p50", a["e2e_p50_us"], "us", a["rounds"])
            rep.row("seed002", label, c, "e2e_p99", a["e2e_p99_us"], "us", a["rounds"])
            if label != DIRECT:
                rep.row("seed002", label, c, "added_e2e_p50", p50, "us", a["rounds"])
                rep.row("seed002", label, c, "added_e2e_p99", p99, "us", a["rounds"])
    rows.sort(key=lambda r: (r[0], r[1] != DIRECT))
    rep.section("Seed-002 shape: 20 ms mock, concurrency 1 to 256", (
        "The shape of LiteLLM's published gateway benchmark (seed 002): a mock that answers after 20 ms, "
        "closed loop. Requests/s, e2e p50/p99 (ms) and added p50/p99 (ms, gateway − direct, same round).\n\n"
        + table(["concurrency", "target", "req/s", "p50", "p99", "added p50", "added p99", "notes"], rows)))
    twin_notes(targets, rep)
    stop_targets(targets)
    mock.stop()

    # ------------------------------------------------------------ goals ---
    w = added.get("weir")
    n = added.get("nginx")
    goal = "added p99 at concurrency 1 ≤ nginx's plain hop"
    if w and n and w["p99"] is not None and n["p99"] is not None:
        rep.goal(goal, f"Weir {w['p99']:+,.0f} µs vs nginx {n['p99']:+,.0f} µs (p50 {w['p50']:+,.0f} vs "
                 f"{n['p50']:+,.0f} µs)", "met" if w["p99"] <= n["p99"] else "missed")
    else:
        rep.goal(goal, "not measured (nginx or Weir missing)", "not measured")
    goal = "req/s under a 1 ms p99 ≥ nginx's"
    wp, np_ = points.get("weir", {}).get(1), points.get("nginx", {}).get(1)
    if "weir" in points and "nginx" in points:
        wv, nv = (wp[0] if wp else 0.0), (np_[0] if np_ else 0.0)
        if nv:
            rep.goal(goal, f"Weir {wv:,.0f} req/s vs nginx {nv:,.0f} req/s (ratio {wv / nv:.2f})",
                     "met" if wv >= nv else "missed")
        elif wv:
            rep.goal(goal, f"Weir {wv:,.0f} req/s; nginx never had p99 under 1 ms", "met")
        else:
            # Neither stayed under the bound at any level (a host that adds
            # a millisecond to every hop): no comparison, not a tie.
            rep.goal(goal, "neither Weir nor nginx had p99 under 1 ms at any level", "not measured")
    else:
        rep.goal(goal, "not measured", "not measured")
    ratios = []
    for label, ad in added.items():
        if label in ("weir", DIRECT) or not w:
            continue
        if ad["p99"] is not None and w["p99"] is not None:
            ratios.append(f"{label}: added p99 {ad['p99']:+,.0f} µs ({PRETTY.get(label.split(' ')[0], label)} / "
                          f"Weir = {ad['p99'] / w['p99']:.1f}×)" if w["p99"] > 0 else
                          f"{label}: added p99 {ad['p99']:+,.0f} µs (Weir ≤ 0)")
    if ratios:
        rep.section("Ratios at concurrency 1", "\n".join(f"- {r}" for r in ratios))
    rep.data = {"concurrency1": {k: [trim(r) for r in v] for k, v in c1.items()},
                "frontier": {k: {str(c): a for c, a in v.items()} for k, v in front.items()},
                "seed002": {k: {str(c): [trim(r) for r in rs] for c, rs in v.items()} for k, v in s2.items()},
                "syscalls": sc}

    def figure(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        ax = axes[0]
        for label, lv in front.items():
            pts = sorted((a["achieved_rate_rps"] or 0, (a["e2e_p99_us"] or 0) / 1000) for c, a in lv.items())
            cs = sorted(lv)
            pts = [((lv[c]["achieved_rate_rps"] or 0), (lv[c]["e2e_p99_us"] or 0) / 1000) for c in cs]
            if pts:
                ax.plot([p[0] for p in pts], [max(p[1], 0.001) for p in pts], marker="o", label=label)
        ax.set_yscale("log")
        ax.set_xlabel("req/s carried (closed loop, concurrency 1…1024)")
        ax.set_ylabel("p99 e2e (ms, log)")
        ax.set_title("throughput frontier, instant mock", fontsize=9)
        for b in (1, 5, 10, 50, 100):
            ax.axhline(b, color="grey", lw=0.5, ls=":")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1]
        labels = [l for l in c1 if c1[l]]
        vals = [(agg(c1[l])["e2e_p50_us"] or 0, agg(c1[l])["e2e_p99_us"] or 0) for l in labels]
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], [v[0] for v in vals], width=0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [v[1] for v in vals], width=0.4, label="p99")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=20, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("e2e at concurrency 1 (µs, log)")
        ax.set_title("concurrency 1, instant mock", fontsize=9)
        ax.legend(fontsize=7)
        return fig
    rep.figure = figure
    return rep


def trim(r: dict) -> dict:
    keep = ("round", "achieved_rate_rps", "errors_total", "errors", "status_codes", "e2e", "generator_saturated",
            "saturation_reasons", "target_cpu_cores", "target_rss_kb", "target_hwm_kb", "gave_up", "load")
    return {k: r.get(k) for k in keep if k in r}
