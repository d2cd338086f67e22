"""routing: a pool's balance policy on a shared-prefix workload. Four weir-mocks with a prefix cache (LRU of
16-token blocks, prefill charged per uncached prompt token) behind one Weir; 32 groups of requests share
4,000-character system prompts, each with its own question, Poisson arrivals. TTFT p50/p99, the mocks' prefix
cache hit rate and the spread of requests over the endpoints for p2c, least_load and prefix_affinity. A second
part measures the imbalance guard's `absolute` threshold on the same traffic and on skewed traffic (one group
takes half of it)."""

from __future__ import annotations

import json
import random
import re
import statistics

from common import Options
from loadgen import Load, error_rate, run as bench_run
from report import Report, table
from targets import Env, Mock, start_weir

TITLE = "routing policies on a shared-prefix workload (prefix cache on)"
POLICIES = ["p2c", "least_load", "prefix_affinity"]
GROUPS, PREFIX_CHARS, QUESTION_WORDS = 32, 4000, 30
ENDPOINTS = 4
TTFT_MS, ITL_MS, TOKENS = 20, 10, 16
# Each mock's cache holds ~12 of the 32 prefixes: all of its share (8) under affinity, a third of them when
# every endpoint sees every group.
CACHE_TOKENS, PREFILL_US, MAX_NUM_SEQS = 12288, 100, 64
RATE = 40.0
GUARDS = [4, 8, 16, 32, 64]  # imbalance.absolute values measured on the skewed workload (relative 1.5)
SKEW_SEQS = 4          # --max-num-seqs of the skewed part: a hot endpoint queues (vllm:num_requests_waiting)


def mock_flags(max_num_seqs: int) -> list[str]:
    return ["--prefix-cache-tokens", str(CACHE_TOKENS), "--prefill-us-per-token", str(PREFILL_US),
            "--max-num-seqs", str(max_num_seqs)]


def prefix_text(rng: random.Random) -> str:
    """PREFIX_CHARS characters of random 3-letter words: the mock counts a word as a token, so ~1,000
    tokens, the 4 characters per token of English text under a BPE tokenizer."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choice(letters) for _ in range(3)) for _ in range(PREFIX_CHARS // 4))


def bodies(count: int, seed: int, hot_share: float = 0.0) -> list[str]:
    """`count` chat bodies, each of a group drawn at random (group 0 with probability `hot_share` plus its
    fair share when skewed), the group's prefix as the system message and a question of its own."""
    rng = random.Random(seed)
    prefixes = [prefix_text(random.Random(1000 + g)) for g in range(GROUPS)]
    lines = []
    for i in range(count):
        g = 0 if rng.random() < hot_share else rng.randrange(GROUPS)
        q = " ".join(f"q{i}x{rng.randrange(10 ** 6)}" for _ in range(QUESTION_WORDS))
        lines.append(json.dumps({"model": "{model}", "stream": True, "max_tokens": TOKENS,
                                 "stream_options": {"include_usage": True},
                                 "messages": [{"role": "system", "content": prefixes[g]},
                                              {"role": "user", "content": q}]}))
    return lines


def counter(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def snapshot(mocks: list[Mock]) -> list[dict]:
    out = []
    for m in mocks:
        t = m.metrics()
        out.append({"queries": counter(t, "vllm:prefix_cache_queries_total"),
                    "hits": counter(t, "vllm:prefix_cache_hits_total"),
                    "requests": counter(t, "vllm:request_success_total")})
    return out


def pool_config(mocks: list[Mock], balance: str, absolute: int | None = None) -> dict:
    pool: dict = {"endpoints": [m.url for m in mocks], "balance": balance,
                  "timeouts": {"connect": "2s", "first_byte": "120s", "idle": "60s"}}
    if absolute is not None:
        pool["imbalance"] = {"absolute": absolute, "relative": 1.5}
    return {"workers": 2, "server": {"access_log": "off"}, "pools": {"p": pool},
            "models": {"mock-model": {"pool": "p"}}, "default_pool": "p"}


def one_run(env: Env, label: str, balance: str, lines: list[str], warmup: float, duration: float, seqs: int,
            absolute: int | None = None) -> dict:
    """Fresh mocks (cold caches) and a fresh Weir for one policy; one weir-bench run; the mocks' counters."""
    mocks = [Mock(env, name=f"mock{i}", ttft_ms=TTFT_MS, itl_ms=ITL_MS, max_tokens=TOKENS,
                  extra=mock_flags(seqs)) for i in range(ENDPOINTS)]
    weir = start_weir(env, label, pool_config(mocks, balance, absolute), tag=f"weir-{balance}")
    try:
        before = snapshot(mocks)
        load = Load(rate=RATE, warmup=warmup, duration=duration, payload_lines=lines, stream=True, timeout=30,
                    stall_ms=5000, max_lag_ms=20, extra=["--poisson"])
        d = bench_run(env, weir, load, f"routing-{label}")
        after = snapshot(mocks)
    finally:
        weir.stop()
        for m in mocks:
            m.stop()
    per = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    q, h = sum(p["queries"] for p in per), sum(p["hits"] for p in per)
    reqs = [p["requests"] for p in per]
    mean = statistics.mean(reqs) if reqs else 0
    return {"ttft_p50_ms": d.get("ttft", {}).get("p50_us", 0) / 1000 if d.get("ttft", {}).get("count") else None,
            "ttft_p99_ms": d.get("ttft", {}).get("p99_us", 0) / 1000 if d.get("ttft", {}).get("count") else None,
            "hit_rate": h / q if q else None, "requests": reqs,
            "max_over_mean": max(reqs) / mean if mean else None, "errors": d.get("errors_total", 0),
            "error_rate": error_rate(d), "completed": d.get("ok", 0), "achieved_rps": d.get("achieved_rate_rps")}


def med(rs: list[dict], k: str):
    v = [r[k] for r in rs if r.get(k) is not None]
    return statistics.median(v) if v else None


def cell(v, digits=1, suffix=""):
    return "–" if v is None else f"{v:,.{digits}f}{suffix}"


def run(env: Env, opts: Options) -> Report:
    rep = Report("routing", TITLE, env)
    warmup, duration = (0.5, 2.0) if env.smoke else (3.0, 20.0)
    count = int(RATE * (warmup + duration) * 1.5) + 100   # never reused: each question is new
    rep.add_meta("mocks", f"{ENDPOINTS} × weir-mock --ttft-ms {TTFT_MS} --itl-ms {ITL_MS} --max-tokens {TOKENS} "
                 + " ".join(mock_flags(MAX_NUM_SEQS)) + " (fresh per run: cold caches)")
    rep.add_meta("weir", "--workers 2 (one shared prefix index), pool of the four mocks, access log off; "
                 "load_metrics on (default for least_load/prefix_affinity: GET /metrics every 500 ms)")
    rep.add_meta("load", f"weir-bench open loop, Poisson arrivals, {RATE:g} req/s, {warmup:g} s warm-up + "
                 f"{duration:g} s measured; {GROUPS} groups, each request one group's {PREFIX_CHARS:,}-character "
                 f"system prompt (~1,000 mock tokens) plus a question of its own ({QUESTION_WORDS} words), "
                 f"streamed, {TOKENS} tokens")
    rep.add_meta("command", "bench/run routing" + (" --smoke" if env.smoke else ""))
    results: dict[str, list[dict]] = {p: [] for p in POLICIES}
    for r in range(env.rounds):
        for p in POLICIES:
            env.log(f"  routing round {r + 1}: {p}")
            results[p].append(one_run(env, p, p, bodies(count, seed=r), warmup, duration, MAX_NUM_SEQS))
    rows = []
    for p in POLICIES:
        rs = results[p]
        rows.append([p, cell(med(rs, "ttft_p50_ms")), cell(med(rs, "ttft_p99_ms")),
                     cell(None if med(rs, "hit_rate") is None else med(rs, "hit_rate") * 100, 1, " %"),
                     cell(med(rs, "max_over_mean"), 2, "×"),
                     " / ".join(f"{x:.0f}" for x in rs[len(rs) // 2]["requests"]), sum(x["errors"] for x in rs)])
        for k, unit in (("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"), ("hit_rate", "ratio"),
                        ("max_over_mean", "ratio")):
            rep.row("policies", "weir", p, k, med(rs, k), unit, rounds=len(rs))
    rep.section("Policies (medians over rounds)", (
        "TTFT measured by weir-bench at the client (gateway included). Hit rate = the mocks' "
        "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total over the run (tokens). Spread = the "
        "busiest endpoint's requests over the mean (vllm:request_success_total per mock).\n\n"
        + table(["balance", "TTFT p50 (ms)", "TTFT p99 (ms)", "prefix cache hit rate", "spread (max/mean)",
                 "requests per endpoint (median round)", "errors"], rows)))

    # The imbalance guard's absolute threshold, on the same traffic and on skewed traffic.
    guard_rows = []
    guard: dict[str, dict] = {}
    if not env.smoke:
        for a in GUARDS:
            env.log(f"  routing guard: absolute {a}")
            bal = one_run(env, f"guard-{a}", "prefix_affinity", bodies(count, seed=0), warmup, duration,
                          MAX_NUM_SEQS, absolute=a)
            sk = one_run(env, f"guard-{a}-skewed", "prefix_affinity", bodies(count, seed=100, hot_share=0.5),
                         warmup, duration, SKEW_SEQS, absolute=a)
            guard[f"prefix_affinity, absolute {a}"] = {"balanced": bal, "skewed": sk}
        env.log("  routing guard: least_load, skewed")
        guard["least_load"] = {"balanced": None,
                               "skewed": one_run(env, "least_load-skewed", "least_load",
                                                 bodies(count, seed=100, hot_share=0.5), warmup, duration,
                                                 SKEW_SEQS)}
        for label, g in guard.items():
            b, k = g["balanced"], g["skewed"]
            pct = lambda r: None if r is None or r["hit_rate"] is None else r["hit_rate"] * 100  # noqa: E731
            guard_rows.append([label,
                               cell(b and b["ttft_p99_ms"]), cell(pct(b), 1, " %"),
                               cell(b and b["max_over_mean"], 2, "×"),
                               cell(k["ttft_p50_ms"]), cell(k["ttft_p99_ms"]), cell(pct(k), 1, " %"),
                               cell(k["max_over_mean"], 2, "×"), " / ".join(f"{x:.0f}" for x in k["requests"])])
            for part, r in (("balanced", b), ("skewed", k)):
                if r is None:
                    continue
                for key, unit in (("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"), ("hit_rate", "ratio"),
                                  ("max_over_mean", "ratio")):
                    rep.row(f"guard_{part}", "weir", label, key, r[key], unit, rounds=1)
        rep.section("The imbalance guard's `absolute` threshold (one round each, relative 1.5)", (
            "Balanced: the workload above. Skewed: half the requests belong to group 0, the rest spread over "
            f"all {GROUPS} groups, and the mocks run at most {SKEW_SEQS} requests at once (the rest wait: "
            "vllm:num_requests_waiting, which least_load and the guard read from /metrics). Too small a "
            "threshold gives up affinity on ordinary jitter (balanced traffic: hits fall, p99 rises); too large "
            "a one lets a hot endpoint's queue grow that far before anything moves (skewed traffic: p99).\n\n"
            + table(["policy", "balanced TTFT p99 (ms)", "balanced hit rate", "balanced spread",
                     "skewed TTFT p50 (ms)", "skewed TTFT p99 (ms)", "skewed hit rate", "skewed spread",
                     "skewed requests per endpoint"], guard_rows)))

    p2c50, pa50 = med(results["p2c"], "ttft_p50_ms"), med(results["prefix_affinity"], "ttft_p50_ms")
    spread = med(results["prefix_affinity"], "max_over_mean")
    if env.smoke:
        for p in POLICIES:
            for r in results[p]:
                if not r["completed"] or r["error_rate"] > 0.01:
                    rep.failures.append(f"{p}: {r['completed']} completed, errors {r['errors']}")
    if p2c50 and pa50:
        ratio = p2c50 / pa50
        rep.goal("prefix_affinity at least halves TTFT p50 against p2c",
                 f"{pa50:.1f} vs {p2c50:.1f} ms ({ratio:.2f}× lower)",
                 "not measured" if env.smoke else ("met" if ratio >= 2 else "missed"))
    if spread is not None:
        rep.goal("no endpoint above 1.5× the mean load (prefix_affinity)", f"busiest {spread:.2f}× the mean",
                 "not measured" if env.smoke else ("met" if spread <= 1.5 else "missed"))
    rep.data = {"policies": results, "guard": guard}

    def figure(plt):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        runs = {k: results[k] for k in POLICIES}
        runs.update({f"{k} (skewed)": [g["skewed"]] for k, g in guard.items()})
        labels = list(runs)
        p50 = [med(runs[k], "ttft_p50_ms") or 0 for k in labels]
        p99 = [med(runs[k], "ttft_p99_ms") or 0 for k in labels]
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], p50, 0.4, label="TTFT p50")
        ax.bar([x + 0.2 for x in xs], p99, 0.4, label="TTFT p99")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([l.replace("prefix_affinity, ", "pa ") for l in labels], rotation=20, fontsize=7)
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        return fig
    rep.figure = figure
    return rep
