"""allocs: heap allocations (heaptrack) and syscalls (strace -c -f) per request and per SSE event on
Weir's hot path, separated by differencing runs with different token counts."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import time

import configs
from common import Options
from loadgen import Load, run as bench_run, summarize_errors
from procs import HarnessError, http_get
from report import Report, table
from targets import REPO, Env, Mock, Target, start_weir
from tracing import stop_wrapped, strace_argv, strace_counts

TITLE = "heap allocations and syscalls per request and per SSE event"
T1, T2 = 16, 64
RATE, RATE_SMOKE = 50.0, 50.0     # streams per second under the tool (strace slows Weir down a lot)


def metrics(t: Target) -> dict[str, float]:
    status, body = http_get(t.url + "/metrics", timeout=10)
    out = {"events": 0.0, "requests": 0.0}
    if status != 200:
        return out
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("weir_sse_events_total"):
            out["events"] += float(line.split()[-1])
        elif line.startswith("weir_requests_total"):
            out["requests"] += float(line.split()[-1])
    return out


TOP = re.compile(r"^(\d+) calls to allocation functions with .* from$")
SUB = re.compile(r"^(\d+) calls with .* from:$")


def parse_heaptrack_sites(text: str) -> dict[str, int]:
    """Allocation calls keyed by the first frame in Weir's own source (src/FILE:LINE and its function),
    from `heaptrack_print -a 1 -n 100 -s 100` (each allocating function, then its callers)."""
    src = str(REPO / "src") + "/"
    out: dict[str, int] = {}
    blocks: list[tuple[int, list[str], bool]] = []    # (count, frame lines, is_sub)
    for line in text.splitlines():
        m, n = TOP.match(line), SUB.match(line.strip())
        if m:
            blocks.append((int(m.group(1)), [], False))
        elif n and blocks:
            blocks.append((int(n.group(1)), [], True))
        elif blocks and line.strip():
            blocks[-1][1].append(line.strip())
    i = 0
    while i < len(blocks):
        count, frames, _ = blocks[i]
        subs = []
        j = i + 1
        while j < len(blocks) and blocks[j][2]:
            subs.append(blocks[j])
            j += 1
        top_fn = frames[0] if frames else "?"
        if top_fn.startswith("0x"):
            lib = next((f[3:].rsplit("/", 1)[-1] for f in frames if f.startswith("in ")), "?")
            top_fn = f"(no symbol) in {lib}"
        for c, fr, is_sub in (subs or [(count, frames, False)]):
            fns = [f for f in fr if not f.startswith(("at ", "in "))]
            caller = fns[0] if is_sub else (fns[1] if len(fns) > 1 else "")
            where = ""
            for k, f in enumerate(fr):
                if f.startswith("at " + src):
                    where = f[len("at " + src):]
                    break
            key = short(top_fn) + (f" ← {short(caller)}" if caller else "") + (f" [src/{where}]" if where else "")
            out[key] = out.get(key, 0) + c
        i = j
    return out


def short(fn: str) -> str:
    """A frame's function without template arguments, parameters or return type."""
    if fn.startswith("0x"):
        return "(no symbol)"
    fn = re.sub(r"\(.*$", "", fn) if not fn.startswith("(") else fn
    fn = fn.replace("<>", "")
    fn = fn.split(" ")[-1] if " " in fn and not fn.startswith("(") else fn
    return fn[-70:]


def one_run(env: Env, tool: str, cfg: dict, headers: list[str], model: str, warm: int, n: int, tokens: int | None,
            tag: str, rep: Report) -> dict:
    """Starts weir under `tool`, sends `warm` requests of T1 tokens then (if tokens) `n` of `tokens`, scrapes
    /metrics once, stops weir; returns the tool's counts and the metric values."""
    out_file = env.work / f"{tag}.{'zst' if tool == 'heaptrack' else 'strace'}"
    wrapper = (["heaptrack", "-o", str(out_file.with_suffix(""))] if tool == "heaptrack"
               else strace_argv(out_file))
    t = start_weir(env, f"weir under {tool}", cfg, tag=tag, headers=headers, model=model, wrapper=wrapper)
    rate = RATE_SMOKE if env.smoke else RATE

    def load(count: int, tok: int) -> Load:
        # open loop: exactly `count` requests (rate × duration), all awaited
        return Load(rate=rate, duration=count / rate, warmup=0, payload="seed000", max_tokens=tok, stream=True,
                    timeout=60, stall_ms=0, max_lag_ms=1000)

    for count, tok, what in ((warm, T1, "warm"), (n, tokens, "measured")):
        if not count:
            continue
        if not tok:
            time.sleep(count / rate)      # run (a): as long as (b) and (c), so timers cancel out
            continue
        d = bench_run(env, t, load(count, tok), f"{tag}-{what}")
        if d.get("errors_total"):
            rep.failures.append(f"allocs {tag}: {d['errors_total']} errors ({summarize_errors(d)})")
    m = metrics(t)
    stop_wrapped(t, "weir")
    if tool == "heaptrack":
        zst = pathlib.Path(str(out_file.with_suffix("")) + ".zst")
        if not zst.exists():
            cands = sorted(env.work.glob(out_file.with_suffix("").name + "*"))
            zst = cands[0] if cands else zst
        text = subprocess.run(["heaptrack_print", "-a", "1", "-p", "0", "-l", "0", "-T", "0", "-n", "100", "-s",
                               "100", str(zst)], capture_output=True, text=True, timeout=300).stdout
        tail = subprocess.run(["heaptrack_print", "-a", "0", "-p", "0", "-l", "0", "-T", "0", str(zst)],
                              capture_output=True, text=True, timeout=300).stdout
        mm = re.search(r"calls to allocation functions: (\d+)", tail)
        if not mm:
            raise HarnessError(f"heaptrack_print gave no allocation count for {zst}:\n{tail[-500:]}")
        sites = parse_heaptrack_sites(text)
        return {"count": int(mm.group(1)), "sites": sites, **m}
    calls = strace_counts(out_file)
    return {"count": sum(calls.values()), "sites": calls, **m}


def analyse(a: dict, b: dict, c: dict) -> dict:
    """a: warm-up only; b: + N requests of T1 tokens; c: + N requests of T2 tokens."""
    de_b, de_c = b["events"] - a["events"], c["events"] - a["events"]
    dr_b, dr_c = b["requests"] - a["requests"], c["requests"] - a["requests"]
    if de_c == de_b or dr_b <= 0:
        return {}
    # Solve count = base + r·requests + e·events from the three runs (b and c may differ in requests too).
    # With r and e unknown: (b−a) = r·dr_b + e·de_b ; (c−a) = r·dr_c + e·de_c
    det = dr_b * de_c - dr_c * de_b
    if det == 0:
        return {}
    x_b, x_c = b["count"] - a["count"], c["count"] - a["count"]
    r = (x_b * de_c - x_c * de_b) / det
    e = (dr_b * x_c - dr_c * x_b) / det
    sites = {}
    for k in set(b["sites"]) | set(c["sites"]):
        # per event: what grows with events when requests are (about) equal
        per_e = (c["sites"].get(k, 0) - b["sites"].get(k, 0) - (dr_c - dr_b) * 0) / (de_c - de_b)
        per_r = (b["sites"].get(k, 0) - a["sites"].get(k, 0) - per_e * de_b) / dr_b
        sites[k] = (per_r, per_e)
    return {"per_request": r, "per_event": e, "events_b": de_b, "events_c": de_c, "requests_b": dr_b,
            "requests_c": dr_c, "events_per_request_b": de_b / dr_b, "events_per_request_c": de_c / dr_c,
            "sites": sites, "a": a["count"], "b": b["count"], "c": c["count"]}


def run(env: Env, opts: Options) -> Report:
    rep = Report("allocs", TITLE, env)
    for tool in ("heaptrack", "strace", "heaptrack_print"):
        if not shutil.which(tool):
            raise HarnessError(f"{tool} is not installed (scripts/setup installs it)")
    mock = Mock(env, ttft_ms=0, itl_ms=1, max_tokens=128)
    rep.add_meta("mock", mock.describe() + " (a token every 1 ms: one SSE event per upstream read)")
    warm, n = (5, 20) if env.smoke else (100, 400)
    rep.add_meta("method", f"three runs per tool and configuration, each a fresh Weir under the tool: (a) start, "
                 f"{warm} warm-up streams of {T1} tokens, an idle wait, one /metrics scrape, SIGTERM; (b) the same plus {n} "
                 f"streams of {T1} tokens; (c) the same plus {n} streams of {T2} tokens (open loop, "
                 f"{RATE_SMOKE if env.smoke else RATE:g} streams/s; run (a) idles as long instead, so timer work "
                 "cancels out). Requests and SSE events come from Weir's own counters. "
                 "Solving (b−a) and (c−a) for 'per request' and 'per event' separates the two; start-up and "
                 "warm-up cancel out.")
    jwks, token = configs.make_jwt(env.work)
    variants = [
        ("plain proxy", configs.plain(mock.url), [], "mock-model"),
        ("all controls", configs.all_controls(mock.url, jwks, str(env.work / "access.log")),
         [f"Authorization: Bearer {token}"], "llama"),
    ]
    sink = None
    if env.request_log:
        # The store's cost: the same "all controls" config with every record stored (the writer thread's
        # allocations, SQLite's included, count too: heaptrack sees the whole process).
        cfg = configs.all_controls(mock.url, jwks, str(env.work / "access-rl.log"))
        # A small queue flushed often: its slots are all reused during the warm-up, so the runs measure the
        # steady state (a fresh slot's strings grow once; a running gateway's slots have all grown).
        cfg["request_log"] = {"url": f"sqlite:{env.work / 'allocs-requests.db'}", "queue": 64,
                              "flush_interval": "20ms"}
        variants.append(("all controls + request log", cfg, [f"Authorization: Bearer {token}"], "llama"))
    if env.tracing:
        # Every request traced (sample_ratio 1) and exported to a sink: the worker's part and the exporter
        # thread's (encoding, HTTP) both count; the sites table tells them apart.
        from common import start_otlp_sink
        sink, sink_url = start_otlp_sink(env, "allocs-otlp-sink")
        cfg = configs.all_controls(mock.url, jwks, str(env.work / "access-tr.log"))
        cfg["tracing"] = {"otlp_endpoint": sink_url, "sample_ratio": 1.0, "queue": 64, "flush_interval": "20ms"}
        variants.append(("all controls + tracing", cfg, [f"Authorization: Bearer {token}"], "llama"))
    results = {}
    for tool in ("heaptrack", "strace"):
        for name, cfg, headers, model in variants:
            env.log(f"  allocs: {tool}, {name}")
            key = f"{tool}-{name.replace(' ', '-')}"
            a = one_run(env, tool, cfg, headers, model, warm, n, None, f"{key}-a", rep)
            b = one_run(env, tool, cfg, headers, model, warm, n, T1, f"{key}-b", rep)
            c = one_run(env, tool, cfg, headers, model, warm, n, T2, f"{key}-c", rep)
            res = analyse(a, b, c)
            results[(tool, name)] = res
            if res:
                env.log(f"    {tool} {name}: {res['per_request']:.2f} per request, {res['per_event']:.3f} per event "
                        f"(runs {res['a']}, {res['b']}, {res['c']}; events {res['events_b']:.0f} / {res['events_c']:.0f})")
            else:
                rep.failures.append(f"allocs: {tool} {name}: runs could not be separated "
                                    f"(events a/b/c {a['events']}/{b['events']}/{c['events']})")
    mock.stop()
    if sink:
        sink.stop(grace=5)

    rows = []
    for (tool, name), r in results.items():
        if not r:
            continue
        unit = "allocations" if tool == "heaptrack" else "syscalls"
        rows.append([name, unit, f"{r['per_request']:.2f}", f"{r['per_event']:.3f}",
                     f"{r['events_per_request_b']:.1f} / {r['events_per_request_c']:.1f}",
                     f"{r['a']:,} / {r['b']:,} / {r['c']:,}"])
        rep.row(tool, "weir", name, f"{unit}_per_request", r["per_request"], unit)
        rep.row(tool, "weir", name, f"{unit}_per_event", r["per_event"], unit)
    rep.section("Per request and per SSE event", (
        "Per request: everything a streamed request costs apart from its events (head, body, auth, "
        "admission, routing, upstream exchange, log). Per event: each further SSE event relayed. Events per "
        f"request: SSE events Weir relayed per stream in runs (b) / (c) ({T1} / {T2} tokens plus role, usage and "
        "[DONE]).\n\n" + table(["Weir", "counted", "per request", "per event", "events/request (b / c)",
                                "total in runs a / b / c"], rows)))
    for (tool, name), r in results.items():
        if not r:
            continue
        top = sorted(r["sites"].items(), key=lambda kv: -(abs(kv[1][1]) * 100 + abs(kv[1][0])))
        lines = []
        for k, (pr, pe) in top[:10]:
            if abs(pr) < 0.05 and abs(pe) < 0.005:
                continue
            lines.append([f"`{k[:150]}`", f"{pr:.2f}", f"{pe:.3f}"])
        if lines:
            rep.section(f"{'Allocation sites' if tool == 'heaptrack' else 'Syscalls'}: {name}", (
                ("Allocation calls by allocating function ← its caller [first frame in Weir's src/] "
                 "(heaptrack_print), per request and per event by the same differencing; "
                 "[src/gateway/worker.cpp:74] is the worker's io_context::run(), i.e. an Asio/Beast completion "
                 "with no Weir frame in between." if tool == "heaptrack" else
                 "strace -c -f counts by syscall, per request and per event by the same differencing.")
                + "\n\n" + table(["site" if tool == "heaptrack" else "syscall", "per request", "per event"], lines)))
    hp = results.get(("heaptrack", "plain proxy")) or {}
    ha = results.get(("heaptrack", "all controls")) or {}
    if hp or ha:
        vals = [v for v in (hp.get("per_event"), ha.get("per_event")) if v is not None]
        worst = max(vals) if vals else None
        rep.goal("zero heap allocations per SSE event in steady state",
                 " ; ".join(f"{nm}: {r['per_event']:.3f} per event ({r['per_request']:.1f} per request)"
                            for nm, r in (("plain", hp), ("all controls", ha)) if r),
                 "met" if worst is not None and worst < 0.01 else "missed")
    sp = results.get(("strace", "plain proxy"))
    if sp:
        rep.note(f"Syscalls per SSE event {sp['per_event']:.2f} (plain proxy): Weir reads each upstream event and "
                 "writes it to the client; events that arrive together leave in one write.")
    rep.data = {f"{k[0]}|{k[1]}": {kk: vv for kk, vv in v.items() if kk != "sites"} | {
        "sites": {s: list(x) for s, x in v.get("sites", {}).items()}} for k, v in results.items() if v}

    def figure(plt):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for ax, tool in zip(axes, ("heaptrack", "strace")):
            names = [nm for (tl, nm) in results if tl == tool and results[(tl, nm)]]
            pr = [results[(tool, nm)]["per_request"] for nm in names]
            pe = [results[(tool, nm)]["per_event"] for nm in names]
            xs = range(len(names))
            ax.bar([x - 0.2 for x in xs], pr, width=0.4, label="per request")
            ax.bar([x + 0.2 for x in xs], pe, width=0.4, label="per SSE event")
            for x, v in zip(xs, pe):
                ax.text(x + 0.2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, fontsize=8)
            ax.set_title("heap allocations" if tool == "heaptrack" else "syscalls", fontsize=9)
            ax.legend(fontsize=7)
        return fig
    rep.figure = figure
    return rep
