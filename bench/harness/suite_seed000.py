"""seed000: the seed workload with every control on, open loop, rates stepping up until saturation."""

from __future__ import annotations

import configs
import measure
from common import (PRETTY, Options, added_cell, baseline_targets, fmt_ratio, gateway_failed, live, ms, ratio,
                    sat_text, start_peers, stop_targets, twin_notes)
from loadgen import Load
from measure import agg
from report import Report, table
from targets import Env, Mock, direct, start_weir

TITLE = "seed workload, every control on, open loop"
# 20 req/s is below the seed's range: there every peer still carries the load, so the ratios compare latency
# rather than collapse; 250 and up are the seed's steps.
RATES = [20, 250, 500, 1000, 2000, 4000, 8000]
# First tokens each run measures at least: a run's p99 is then its 12th-slowest first token and its p99.9 its
# 2nd-slowest. Six seconds at 20 req/s gave 120, where the p99 was the 2nd-slowest and the p99.9 the slowest,
# and the Weir / nginx ratio there moved between runs by more than the gap it compared.
MIN_FIRST_TOKENS = 1200
# A first token this much later than the direct path's usual (~0.2 ms hop) is a stall, not a slow hop.
SLOW_HOP_US = 1000.0


def run(env: Env, opts: Options) -> Report:
    rep = Report("seed000", TITLE, env)
    rates = [50] if env.smoke else ([int(r) if float(r).is_integer() else r for r in opts.rates] or RATES)
    warmup, duration = (0.5, 1.0) if env.smoke else (3.0, 6.0)
    mock = Mock(env, ttft_ms=90, itl_ms=14, max_tokens=128)
    rep.add_meta("mock", mock.describe() + " (any model name)")
    rep.add_meta("load", f"weir-bench open loop, constant rate, {warmup:g} s warm-up + {duration:g} s measured per "
                 + ("run" if env.smoke else f"run, longer where that gives fewer than {MIN_FIRST_TOKENS:,} first "
                    f"tokens ({MIN_FIRST_TOKENS / rates[0]:g} s at {rates[0]} req/s)")
                 + "; 400-token prompt, 128 streamed tokens, include_usage; the four model names round-robin "
                 "(Weir routes each to its pool)")
    jwks, token = configs.make_jwt(env.work)
    access_log = env.work / "weir-access.log"
    auth = [f"Authorization: Bearer {token}"]
    weir = start_weir(env, "weir (all controls)", configs.all_controls(mock.url, jwks, str(access_log)),
                      tag="weir-seed000", headers=auth)
    rep.add_meta("weir", f"{weir.version}; --workers 1; JWT RS256 against a JWKS file (cached key set, "
                 "verified-token cache), tenant lookup, tenant rate limits (requests, tokens), stream cap and "
                 "budget set never to trip, pricing, four pools by model name, access log on (a file)")
    # The same gateway without identity and admission (same four pools, same access log): the controls' cost.
    bare_cfg = configs.all_controls(mock.url, jwks, str(env.work / "weir-bare-access.log"))
    for k in ("auth", "tenants", "pricing"):
        bare_cfg.pop(k)
    bare = start_weir(env, "weir (no controls)", bare_cfg, tag="weir-seed000-bare")
    # --baseline-bin, --allocators, --request-log, --tracing: variants of the all-controls gateway, same rounds.
    variants = baseline_targets(env, configs.all_controls(mock.url, jwks, str(env.work / "weir-variant-access.log")),
                                rep, tag="weir-seed000-variant", headers=auth)
    targets = [direct(mock), weir, bare] + variants + start_peers(env, opts, mock, rep)

    tokens = 16 if env.smoke else 128     # smoke: short streams, the harness is checked, not the numbers
    seed_lines = [configs.chat_body(m, tokens) for m in configs.SEED_MODELS]
    peer_line = [configs.chat_body("{model}", tokens)]

    def load_for(t) -> Load:
        lines = seed_lines if t.name == "direct" or t.name.startswith("weir") else peer_line
        seconds = duration if env.smoke else max(duration, MIN_FIRST_TOKENS / rate)
        return Load(rate=rate, duration=seconds, warmup=warmup, payload_lines=lines, timeout=15,
                    stall_ms=1000)

    per_rate: dict[int, dict] = {}
    dropped: dict[str, str] = {}
    stop_reason = ""
    for rate in rates:
        active = [t for t in live(targets) if t.label not in dropped]
        if not any(t.name == "weir" for t in active):
            break
        env.log(f"  seed000 @ {rate} req/s: {', '.join(t.label for t in active)}")
        res = measure.run_cell(env, active, load_for, f"seed000-{rate}", mock=mock, give_up=gateway_failed)
        per_rate[rate] = res
        if env.smoke:
            for label in ("direct (no gateway)", weir.label, bare.label, "nginx"):
                measure.require_clean(env, label, res.get(label, []), f"seed000 @ {rate}", rep.failures)
        d = agg(res.get("direct (no gateway)", []))
        for t in active:
            if t.kind == "direct":
                continue
            a = agg(res.get(t.label, []))
            why = saturated(a, rate)
            if why:
                dropped[t.label] = f"saturated at {rate} req/s ({why})"
        direct_why = saturated(d, rate) or direct_behind(res.get("direct (no gateway)", []))
        if direct_why:
            stop_reason = f"the direct path (mock + load generator on one core) saturated at {rate} req/s: {direct_why}"
            break
        if weir.label in dropped:
            stop_reason = f"Weir saturated at {rate} req/s"
            break
    twin_notes(targets, rep)
    stop_targets(targets)
    mock.stop()

    # ------------------------------------------------------------- tables ---
    labels = [t.label for t in targets if t.available or t.label in {l for r in per_rate.values() for l in r}]
    rows = []
    added_by = {}   # (label, rate) -> dict
    for rate, res in per_rate.items():
        dres = res.get("direct (no gateway)", [])
        for label in labels:
            rs = res.get(label)
            if not rs:
                continue
            a = agg(rs)
            ad = {f"{h}_{p}": measure.added(rs, dres, h, p)
                  for h in ("ttft", "itl", "hop") for p in ("p50", "p99", "p99_9")}
            added_by[(label, rate)] = ad
            is_direct = label.startswith("direct")
            rows.append([f"{rate:,}", label, f"{a['achieved_rate_rps']:,.0f}",
                         f"{ms(a['ttft_p50_us'])} / {ms(a['ttft_p99_us'])} / {ms(a['ttft_p99_9_us'])}",
                         "" if is_direct else " / ".join(added_cell(ad[f'ttft_{p}']) for p in ("p50", "p99", "p99_9")),
                         "" if is_direct else " / ".join(added_cell(ad[f'hop_{p}']) for p in ("p50", "p99", "p99_9")),
                         f"{ms(a['itl_p50_us'])} / {ms(a['itl_p99_us'])} / {ms(a['itl_p99_9_us'])}",
                         "" if is_direct else " / ".join(added_cell(ad[f'itl_{p}']) for p in ("p50", "p99", "p99_9")),
                         "" if is_direct else f"{a['target_cpu_cores']:.2f}" if a['target_cpu_cores'] is not None else "–",
                         "" if is_direct else f"{a['target_hwm_kb'] / 1024:.1f}",
                         sat_text(a)])
            for h in ("ttft", "itl", "e2e"):
                for p in ("p50", "p99", "p99_9"):
                    rep.row("latency", label, rate, f"{h}_{p}", a[f"{h}_{p}_us"], "us", a["rounds"])
            for h in ("ttft", "itl", "hop"):
                for p in ("p50", "p99", "p99_9"):
                    if not is_direct:
                        rep.row("added", label, rate, f"added_{h}_{p}", ad[f"{h}_{p}"], "us", a["rounds"])
            rep.row("throughput", label, rate, "achieved_rps", a["achieved_rate_rps"], "req/s", a["rounds"])
            rep.row("throughput", label, rate, "errors", a["errors_total"], "requests", a["rounds"])
            rep.row("throughput", label, rate, "generator_saturated_rounds", a["saturated_rounds"], "", a["rounds"])
            if not is_direct:
                rep.row("resources", label, rate, "cpu_cores", a["target_cpu_cores"], "cores", a["rounds"])
                rep.row("resources", label, rate, "peak_rss", a["target_hwm_kb"] / 1024, "MiB", a["rounds"])
    rep.section("Latency by offered rate", (
        "Per rate: TTFT and inter-token latency (ITL) percentiles as the client saw them (ms), and *added* = "
        "through the gateway minus direct in the same round, median over rounds (ms; a negative value is "
        "noise around zero). *Added per request*: the same from each stream's own first-token hop (weir-bench's "
        "`hop`: send → first token, less the time weir-mock --stamp says it took to that token), gateway − "
        "direct, free of the mock's timer jitter and the generator's lateness. CPU: the gateway's utime+stime over the measured window / wall time (cores; "
        "it is pinned to one core, so 1.00 is its ceiling). Peak RSS: VmHWM (MiB).\n\n"
        + table(["req/s", "target", "ok req/s", "TTFT p50 / p99 / p99.9", "added TTFT p50 / p99 / p99.9",
                 "added per request p50 / p99 / p99.9", "ITL p50 / p99 / p99.9", "added ITL p50 / p99 / p99.9", "CPU", "peak RSS", "notes"], rows)))
    slow_rows = []
    for rate, res in per_rate.items():
        for label in labels:
            rs = res.get(label)
            if not rs:
                continue
            n, total, capped = slow_hops(rs, SLOW_HOP_US)
            if not total:
                continue
            per_k = n * 1000 / total
            slow_rows.append([f"{rate:,}", label, f"{total:,}", f"{'≥ ' if capped else ''}{n}",
                              f"{'≥ ' if capped else ''}{per_k:.2f}"])
            rep.row("tail", label, rate, "first_token_hops_over_1ms_per_1000", per_k, "per 1,000", len(rs))
    if slow_rows:
        rep.section("Slow first tokens", (
            f"First-token hops (send → first token, less the mock's own time) over {SLOW_HOP_US / 1000:g} ms, "
            "counted over every round (weir-bench reports each run's 16 slowest hops; ≥ where all 16 were over). "
            "A run's p99.9 is its 2nd-slowest first token in 1,200, so it is set by these few; their count per "
            "1,000 first tokens, gateway beside the direct path and nginx, says whether a gateway makes them or "
            "the machine does (bench/README.md, \"Where the low-rate p99.9 comes from\").\n\n"
            + table(["req/s", "target", "first tokens", f"over {SLOW_HOP_US / 1000:g} ms", "per 1,000"], slow_rows)))
    if dropped:
        rep.section("Saturation", "\n".join(f"- {k}: {v}; not run at higher rates." for k, v in dropped.items())
                    + (f"\n- Stepping stopped: {stop_reason}." if stop_reason else ""))
    elif stop_reason:
        rep.section("Saturation", f"- Stepping stopped: {stop_reason}.")

    # ------------------------------------------------------- ratios, goals ---
    weir_label = weir.label
    ratio_rows = []
    goal_vals: dict[str, list] = {}
    for (label, rate), ad in added_by.items():
        if label in (weir_label, bare.label) or label.startswith("direct"):
            continue
        w = added_by.get((weir_label, rate))
        if not w:
            continue
        r99 = ratio(ad["ttft_p99"], w["ttft_p99"])
        r999 = ratio(ad["ttft_p99_9"], w["ttft_p99_9"])
        ri99 = ratio(ad["itl_p99"], w["itl_p99"])
        rh99, rh999 = ratio(ad["hop_p99"], w["hop_p99"]), ratio(ad["hop_p99_9"], w["hop_p99_9"])
        ratio_rows.append([f"{rate:,}", label, fmt_ratio(r99), fmt_ratio(r999), fmt_ratio(ri99), fmt_ratio(rh99),
                           fmt_ratio(rh999)])
        rep.row("ratios", label, rate, "added_hop_p99_peer_over_weir", rh99, "x")
        rep.row("ratios", label, rate, "added_hop_p99_9_peer_over_weir", rh999, "x")
        rep.row("ratios", label, rate, "added_ttft_p99_peer_over_weir", r99, "x")
        rep.row("ratios", label, rate, "added_ttft_p99_9_peer_over_weir", r999, "x")
        goal_vals.setdefault(label.split(" ")[0], []).append((rate, r99, r999, ad, w))
    if ratio_rows:
        rep.section("Weir against each peer", (
            "Peer's added latency / Weir's added latency, same rate, same run (bigger is better for Weir; "
            "∞ when Weir's added latency is at or below zero, i.e. within the noise of the direct path).\n\n"
            + table(["req/s", "peer", "TTFT p99", "TTFT p99.9", "ITL p99", "per request p99", "per request p99.9"],
                    ratio_rows)))

    cost_rows = []
    for (label, rate), w in added_by.items():
        b = added_by.get((bare.label, rate))
        if label != weir_label or not b:
            continue
        cells = []
        for h in ("ttft", "itl"):
            for p in ("p50", "p99", "p99_9"):
                on, off = w[f"{h}_{p}"], b[f"{h}_{p}"]
                cells.append(f"{added_cell(on)} / {added_cell(off)}")
                if on is not None and off is not None:
                    rep.row("controls", "weir", rate, f"controls_cost_{h}_{p}", on - off, "us")
        cost_rows.append([f"{rate:,}"] + cells)
    if cost_rows:
        rep.section("Cost of the controls", (
            "Weir's added latency with every control on (JWT, tenant lookup, limits, budget, pricing) / with none "
            "(same pools, same access log), ms, same rate, same run. The difference is the controls' cost; "
            "differences below ~0.1 ms are the noise of these runs.\n\n"
            + table(["req/s", "TTFT p50 on / off", "TTFT p99 on / off", "TTFT p99.9 on / off",
                     "ITL p50 on / off", "ITL p99 on / off", "ITL p99.9 on / off"], cost_rows)))

    for peer, need in (("bifrost", 5), ("litellm", 50)):
        vals = goal_vals.get(peer)
        goal = f"seed000, all controls on: added TTFT p99 and p99.9 ≥ {need}× lower than {PRETTY[peer]}'s"
        if not vals:
            why = next((v for k, v in rep.unavailable.items() if k.startswith(peer)),
                       "smoke run: peers other than nginx are not started" if env.smoke else
                       f"{PRETTY[peer]} was not measured at any rate Weir was (--peers)")
            rep.goal(goal, "not measured: " + why, "not measured")
            continue
        parts, ok = [], True
        for rate, r99, r999, ad, w in vals:
            parts.append(f"{rate:,} req/s: {fmt_ratio(r99)} / {fmt_ratio(r999)} (Weir {added_cell(w['ttft_p99'])} / "
                         f"{added_cell(w['ttft_p99_9'])} ms, {peer} {added_cell(ad['ttft_p99'])} / "
                         f"{added_cell(ad['ttft_p99_9'])} ms)")
            ok = ok and r99 is not None and r999 is not None and r99 >= need and r999 >= need
        rep.goal(goal, "; ".join(parts), "met" if ok else "missed")

    rep.note("The seed's 5 ms micro-batcher is not part of these numbers: Weir micro-batches /v1/completions "
             "only (vLLM's chat server takes one conversation per request), so these chat requests each go to "
             "their pool on their own; the batch suite (batch.md) measures micro-batching on completions.")
    rep.note("The seed measured 10 minutes per rate after 2 minutes of warm-up on 4-vCPU pods with the load "
             "generator on another node; here each run is seconds long on a 2-core VM where the mock and the load "
             "generator share one core, so the highest rates are bounded by that core (see Saturation).")
    rep.note("JWT: one token for all requests, so after the first request every verification is a hit in Weir's "
             "verified-token cache (the seed's 'cached key set').")
    rep.note("Bifrost would be measured twice (logging as shipped, and off); LiteLLM runs with one worker per "
             "core it may use (its start script uses nproc, which honours the pinning: 1).")
    rep.data = {"per_rate": {str(k): {lab: [trim(r) for r in rs] for lab, rs in v.items()} for k, v in per_rate.items()},
                "dropped": dropped, "stop_reason": stop_reason}

    def figure(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, h in zip(axes, ("ttft", "itl")):
            for label in labels:
                if label.startswith("direct"):
                    continue
                xs = [r for (l, r) in added_by if l == label]
                ys = [added_by[(label, r)][f"{h}_p99"] for r in xs]
                pts = [(x, y / 1000) for x, y in zip(xs, ys) if y is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [max(p[1], 0.001) for p in pts], marker="o", label=label)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("offered rate (req/s)")
            ax.set_ylabel(f"added {h.upper()} p99 (ms, log)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        return fig
    rep.figure = figure
    return rep


def direct_behind(rounds: list[dict]) -> str:
    """The direct path can no longer carry the rate on time (the machine's limit, not a gateway's): in most
    rounds the generator sent late (its pacing reasons, not only CPU wait), or the mock's first token came
    more than 2× its 90 ms late at p99, or the inter-token p99 exceeded 3× the 14 ms pace."""
    bad = []
    for r in rounds:
        why = []
        pacing = [x for x in r.get("saturation_reasons", []) or [] if "waited for a CPU" not in x]
        if pacing:
            why.append(pacing[0].split(":")[0])
        if r.get("ttft", {}).get("p99_us", 0) > 180e3:
            why.append(f"TTFT p99 {r['ttft']['p99_us'] / 1000:.0f} ms")
        if r.get("itl", {}).get("p99_us", 0) > 42e3:
            why.append(f"ITL p99 {r['itl']['p99_us'] / 1000:.0f} ms")
        if why:
            bad.append("; ".join(why))
    return bad[0] + f" (in {len(bad)} of {len(rounds)} rounds)" if bad and len(bad) * 2 > len(rounds) else ""


def slow_hops(rounds: list[dict], over_us: float) -> tuple[int, int, bool]:
    """(hops over `over_us`, first tokens measured, capped) summed over rounds, from weir-bench's
    `slowest_hops` (its 16 slowest per run): capped when a run's 16 were all over, so the count is a floor."""
    n = total = 0
    capped = False
    for r in rounds:
        hops = r.get("slowest_hops") or []
        over = sum(1 for h in hops if h.get("hop_us", 0) > over_us)
        n += over
        total += (r.get("hop") or {}).get("count", 0)
        capped = capped or (over == len(hops) and len(hops) >= 16)
    return n, total, capped


def saturated(a: dict, rate: float) -> str:
    if not a:
        return "no result"
    if a.get("gave_up"):
        return a["gave_up"]
    if a.get("error_rate") and a["error_rate"] > 0.001:
        return f"{a['error_rate'] * 100:.3g} % errors"
    if a.get("achieved_rate_rps") is not None and a["achieved_rate_rps"] < 0.95 * rate:
        return f"carried {a['achieved_rate_rps']:.0f} req/s"
    if a.get("target_cpu_cores") is not None and a["target_cpu_cores"] >= 0.95:
        return f"CPU {a['target_cpu_cores']:.2f} of its one core"
    return ""


def trim(r: dict) -> dict:
    keep = ("round", "achieved_rate_rps", "send_rate_rps", "errors_total", "errors", "status_codes", "tokens",
            "e2e", "ttft", "itl", "sender_lag_p99_us", "generator_saturated", "saturation_reasons",
            "target_cpu_cores", "target_rss_kb", "target_hwm_kb", "mock_lag_p99_ms", "gave_up", "load",
            "concurrency", "offered_rate_rps", "generator", "hop", "slowest_hops", "measure_start_unix_s")
    return {k: r.get(k) for k in keep if k in r}
