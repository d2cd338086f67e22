"""memory: RSS idle, under a steady load (until it stops moving), after the load, and with 1k/5k/10k
concurrent open streams (MB per 10k streams)."""

from __future__ import annotations

import json
import socket
import time

import configs
from common import Options, baseline_targets, live, start_peers, stop_targets, twin_notes
from loadgen import Load, run as bench_run, summarize_errors
from measure import focus
from report import Report, table
from targets import Env, Mock, Target, start_weir

TITLE = "resident memory: idle, steady load, after load, open streams"
STEADY_RATE = 100          # req/s of seed-000 streams (90 ms TTFT, 14 ms ITL, 128 tokens): ~190 in flight
LEVELS = [1000, 5000, 10000]


def rss_mib(t: Target) -> float:
    return t.memory_kb()["rss_kb"] / 1024


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / den if den else None


def steady(env: Env, t: Target, mock: Mock) -> dict:
    """Runs the fixed load until RSS stops moving (max − min over the last 10 s within 1 % or 256 KiB,
    after at least 15 s), at most 45 s; returns samples, verdict and growth rate."""
    min_s, max_s, window = (1.5, 3.0, 1) if env.smoke else (15.0, 45.0, 10)
    samples: list[tuple[float, float]] = []
    state = {"next": 0.0, "stable_at": None}

    def stop_when(elapsed: float) -> bool:
        if elapsed < state["next"]:
            return False
        state["next"] = elapsed + 1.0
        samples.append((elapsed, rss_mib(t)))
        if elapsed >= min_s and len(samples) > window:
            last = [s[1] for s in samples[-(window + 1):]]
            if max(last) - min(last) <= max(0.01 * max(last), 0.25):
                state["stable_at"] = elapsed
                return True
        return False

    load = Load(rate=STEADY_RATE, duration=max_s, warmup=0, payload="seed000", max_tokens=128, stream=True,
                timeout=30, stall_ms=0)
    d = bench_run(env, t, load, "steady", mock=mock, stop_when=stop_when)
    tail = samples[-(window + 1):]
    growth = slope([(s[0], s[1] * 1024) for s in tail])     # KiB/s over the last window
    overall = slope([(s[0], s[1] * 1024) for s in samples if s[0] >= 5])
    return {"samples": samples, "stable_at": state["stable_at"], "rss_mib": samples[-1][1] if samples else None,
            "growth_kib_s": growth, "overall_growth_kib_s": overall, "errors": d.get("errors_total", 0),
            "errors_text": summarize_errors(d), "ok": d.get("ok", 0), "sent": d.get("sent", 0),
            "generator_saturated": d.get("generator_saturated")}


def wait_drained(mock: Mock, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mock.running() == 0:
            return True
        time.sleep(0.2)
    return False


def open_streams(env: Env, t: Target, mock: Mock, n: int) -> dict:
    """Opens `n` slow streams through `t` (ramp over a few seconds), reads the gateway's RSS once the mock
    has them all running, then ends them (SIGINT to weir-bench closes every connection)."""
    ramp = 1.0 if env.smoke else 4.0
    # Streams of an earlier run that a gateway did not abort upstream may still run at the mock: count ours.
    base = max(mock.running(), 0)
    got = {"rss": None, "running": 0, "at": None}
    deadline = ramp + (5 if env.smoke else 25)

    def stop_when(elapsed: float) -> bool:
        if elapsed < ramp * 0.5:
            return False
        running = mock.running() - base
        got["running"] = max(got["running"], running)
        if running >= 0.99 * n:
            time.sleep(0.5)        # let the last responses' buffers settle
            got["rss"] = rss_mib(t)
            got["running"] = max(got["running"], mock.running() - base)
            got["at"] = elapsed
            return True
        if elapsed > deadline:
            got["rss"] = rss_mib(t)
            return True
        time.sleep(0.2)
        return False

    load = Load(rate=n / ramp, duration=ramp, warmup=0, payload="seed000", max_tokens=120, stream=True,
                timeout=120, stall_ms=0, max_lag_ms=50)
    before = rss_mib(t)
    d = bench_run(env, t, load, f"open-{n}", mock=mock, stop_when=stop_when)
    ok = got["running"] >= 0.99 * n
    drained = wait_drained(mock, 65 if not env.smoke else 10)   # streams last a minute: at most that
    return {"n": n, "rss_mib": got["rss"], "before_mib": before, "running": got["running"], "reached": ok,
            "leftover_at_start": base,
            "seconds_to_reach": got["at"], "errors": {k: v for k, v in d.get("errors", {}).items()
                                                       if v and k != "cancelled"},
            "drained": drained, "generator_saturated": d.get("generator_saturated"),
            "saturation_reasons": d.get("saturation_reasons")}


CUT_CLIENTS = 4   # clients that never read a long, fast stream: cut as slow_client (server.max_stream_buffer)


def after_slow_clients(env: Env, t: Target, mock: Mock, rounds: int) -> dict:
    """RSS once the gateway has cut `CUT_CLIENTS` clients that never read (each stream's backlog grows to a few
    MB before the cut) and then stayed idle past its idle trim, per round. glibc's allocator once kept those
    backlogs resident for good (21 MiB idle after one round, 6 fresh)."""
    before = rss_mib(t)
    after = []
    body = json.dumps({"model": "mock-model", "stream": True, "max_tokens": 200000,
                       "messages": [{"role": "user", "content": "hi"}]})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    for _ in range(rounds):
        socks = []
        for _ in range(CUT_CLIENTS):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", t.port))
            s.sendall((head + body).encode())
            socks.append(s)
        time.sleep(0.5)
        drained = wait_drained(mock, 40)      # the gateway cut every client and aborted its stream upstream
        for s in socks:
            s.close()
        time.sleep(2.5)                        # past Weir's idle trim (1 s after its last session)
        after.append(rss_mib(t) if drained else None)
    return {"before_mib": before, "after_mib": after}


def run(env: Env, opts: Options) -> Report:
    rep = Report("memory", TITLE, env)
    mock = Mock(env, ttft_ms=90, itl_ms=14, max_tokens=128, threads=1 if env.smoke else 2)
    # Idle first: Weir and the peers before their first request.
    weir = start_weir(env, "weir", configs.plain(mock.url, configs.ACCESS_LOG_FILE), tag="weir-plain")
    time.sleep(0.5)
    gateways: list[Target] = [weir] + baseline_targets(env, configs.plain(mock.url, configs.ACCESS_LOG_FILE), rep) + start_peers(env, opts, mock, rep)
    time.sleep(1.0)
    idle = {t.label: rss_mib(t) for t in live(gateways)}
    env.log("  memory: idle " + ", ".join(f"{k} {v:.1f} MiB" for k, v in idle.items()))
    rep.add_meta("weir", f"{weir.version}; --workers 1; one pool, no auth, access log on (a file of its own)")
    rep.add_meta("steady load", f"{STEADY_RATE} req/s open loop of seed-000 streams (mock {mock.describe()}), "
                 "RSS sampled every second until it stops moving")

    results: dict[str, dict] = {t.label: {"idle_mib": idle.get(t.label)} for t in gateways}
    for t in live(gateways):
        focus(gateways, t)
        env.log(f"  memory: steady load through {t.label}")
        st = steady(env, t, mock)
        wait_drained(mock, 30)
        time.sleep(1.0 if env.smoke else 2.0)
        st["after_mib"] = rss_mib(t)
        results[t.label]["steady"] = st
        env.log(f"    {t.label}: steady {st['rss_mib']:.1f} MiB (stable at {st['stable_at']}), "
                f"after {st['after_mib']:.1f} MiB, errors {st['errors']}")
        if env.smoke and t.name in ("weir", "nginx") and st["errors"]:
            rep.failures.append(f"memory steady: {t.label} had {st['errors']} errors ({st['errors_text']})")

    # Open streams: a slow mock (a token every 500 ms, 120 tokens: a minute per stream).
    mock.restart(ttft_ms=0, itl_ms=500, max_tokens=120, threads=1 if env.smoke else 2)
    levels = [100, 200] if env.smoke else LEVELS
    failed: dict[str, str] = {}
    for n in levels:
        for t in live(gateways):
            if t.label in failed:
                continue
            focus(gateways, t)
            env.log(f"  memory: {n} open streams through {t.label}")
            o = open_streams(env, t, mock, n)
            results[t.label].setdefault("streams", []).append(o)
            env.log(f"    {t.label}: {o['running']} running at the mock, RSS {o['rss_mib']:.1f} MiB"
                    + (f", errors {o['errors']}" if o["errors"] else ""))
            if not o["drained"]:
                rep.note(f"After the {n:,} clients of {t.label} went away, the mock still ran their streams a "
                         "minute later: this gateway does not abort the upstream generation when its client "
                         "leaves (the next level counts only its own streams).")
            if not o["reached"]:
                failed[t.label] = (f"could not hold {n} streams (the mock saw at most {o['running']}"
                                   + (f"; errors {o['errors']}" if o["errors"] else "") + ")")
                if env.smoke and t.name in ("weir", "nginx"):
                    rep.failures.append(f"memory: {t.label} {failed[t.label]}")
    # Clients that never read: a fast, long stream (no pacing), cut once its backlog passes
    # server.max_stream_buffer; Weir and its baseline twins only (a peer has no such cut).
    mock.restart(ttft_ms=10, itl_ms=0, max_tokens=200000, threads=1,
                 extra=["--tick-us", "0", "--max-model-len", "1000000"])
    for t in live(gateways):
        if not t.name.startswith("weir"):
            continue
        focus(gateways, t)
        env.log(f"  memory: {CUT_CLIENTS} clients that never read, through {t.label}")
        c = after_slow_clients(env, t, mock, 1 if env.smoke else 3)
        results[t.label]["slow_cut"] = c
        env.log(f"    {t.label}: {c['before_mib']:.1f} MiB before, after each round (idle): "
                + ", ".join("–" if a is None else f"{a:.1f}" for a in c["after_mib"]))
    for t in gateways:
        t.pause()
    twin_notes(gateways, rep)
    stop_targets(gateways)
    mock.stop()

    rows = []
    per10k = {}
    for t in gateways:
        r = results.get(t.label, {})
        if not t.available and "steady" not in r:
            continue
        st = r.get("steady", {})
        pts = [(o["n"], o["rss_mib"] * 1024 * 1024) for o in r.get("streams", []) if o["reached"] and o["rss_mib"]]
        s = slope(pts)
        mb10k = s * 10000 / 1e6 if s is not None else None
        per10k[t.label] = mb10k
        stream_cells = []
        for n in levels:
            o = next((o for o in r.get("streams", []) if o["n"] == n), None)
            stream_cells.append("–" if not o else (f"{o['rss_mib']:.1f}" if o["reached"] else
                                                   f"failed ({o['running']} held)"))
        steady_txt = "–"
        if st:
            steady_txt = f"{st['rss_mib']:.1f}" + (
                f" (stable after {st['stable_at']:.0f} s)" if st.get("stable_at") else
                f" (still moving: {st['growth_kib_s']:+.0f} KiB/s over the last window, "
                f"{st['overall_growth_kib_s']:+.0f} KiB/s overall)" if st.get("growth_kib_s") is not None else "")
            if st.get("errors"):
                steady_txt += f"; {st['errors']} errors ({st['errors_text'][:80]})"
        rows.append([t.label, f"{r.get('idle_mib', 0):.1f}", steady_txt,
                     f"{st.get('after_mib', 0):.1f}" if st else "–", *stream_cells,
                     f"{mb10k:.1f}" if mb10k is not None else "–", failed.get(t.label, "")])
        rep.row("rss", t.label, "idle", "rss", r.get("idle_mib"), "MiB")
        if st:
            rep.row("rss", t.label, "steady", "rss", st["rss_mib"], "MiB",
                    note=f"stable after {st['stable_at']} s" if st.get("stable_at") else "did not settle")
            rep.row("rss", t.label, "steady", "growth", st.get("growth_kib_s"), "KiB/s")
            rep.row("rss", t.label, "after", "rss", st.get("after_mib"), "MiB")
        for o in r.get("streams", []):
            rep.row("rss", t.label, f"{o['n']} streams", "rss", o["rss_mib"], "MiB",
                    note="" if o["reached"] else f"held only {o['running']}")
        rep.row("rss", t.label, "per 10k streams", "rss_slope", mb10k, "MB")
    rep.section("Resident set size (VmRSS, MiB)", (
        "Idle: after start, before the first request. Steady: under the fixed load, once it stopped moving. "
        "After: the load stopped and every stream ended. N streams: the gateway's RSS once the mock had all N "
        "streams running through it (slow streams: a token every 500 ms). Per 10k streams: least-squares "
        "slope of RSS over the stream levels, × 10,000 (MB = 10⁶ bytes). Sums over the process group "
        "(nginx: master + worker; LiteLLM: supervisor + worker).\n\n"
        + table(["gateway", "idle", "steady load", "after load", *[f"{n:,} streams" for n in levels],
                 "MB per 10k streams", "notes"], rows)))

    cut_rows = []
    for label, r in results.items():
        c = r.get("slow_cut")
        if not c:
            continue
        cut_rows.append([label, f"{c['before_mib']:.1f}",
                         ", ".join("–" if a is None else f"{a:.1f}" for a in c["after_mib"])])
        for i, a in enumerate(c["after_mib"]):
            rep.row("rss", label, f"after slow-client cuts, round {i + 1}", "rss", a, "MiB")
    if cut_rows:
        rep.section("After slow-client cuts (VmRSS, MiB)", (
            f"{CUT_CLIENTS} clients that never read (4 KiB receive buffer) ask for a long stream from a mock with "
            "no pacing; the gateway cuts each once its backlog passes server.max_stream_buffer (1 MiB, plus "
            "what the kernel holds unacknowledged) and aborts the generation. RSS 2.5 s after the last cut "
            "(past the idle trim), per round, against RSS before the first round.\n\n"
            + table(["gateway", "before", "after each round, idle"], cut_rows)))

    w = results.get("weir", {})
    goal = "idle RSS at most 8 MiB"   # issue 10's target
    if w.get("idle_mib") is not None:
        rep.goal(goal, f"{w['idle_mib']:.1f} MiB", "met" if w["idle_mib"] <= 8 else "missed")
    goal = "at most 60 MB per 10k streams"
    if per10k.get("weir") is not None:
        levels_txt = ", ".join(f"{o['n']:,}: {o['rss_mib']:.1f} MiB" for o in w.get("streams", []) if o["reached"])
        rep.goal(goal, f"{per10k['weir']:.1f} MB per 10k ({levels_txt})" + (
            " — smoke levels only" if env.smoke else ""), "met" if per10k["weir"] <= 60 else "missed")
    else:
        rep.goal(goal, "not measured: " + failed.get("weir", "no stream level reached"), "not measured")
    st = w.get("steady")
    if st and not st.get("stable_at"):
        rep.note(f"Weir's RSS did not settle under the steady load within the time allowed: growth "
                 f"{st['growth_kib_s']:+.0f} KiB/s over the last window ({st['overall_growth_kib_s']:+.0f} KiB/s "
                 "from 5 s on).")
    rep.data = results

    def figure(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        ax = axes[0]
        for label, r in results.items():
            st = r.get("steady")
            if st and st.get("samples"):
                ax.plot([s[0] for s in st["samples"]], [s[1] for s in st["samples"]], label=label)
        ax.set_xlabel("seconds under the steady load")
        ax.set_ylabel("RSS (MiB)")
        ax.set_yscale("log")
        ax.set_title(f"steady load ({STEADY_RATE} req/s)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1]
        for label, r in results.items():
            pts = [(0, r.get("idle_mib") or 0)] + [(o["n"], o["rss_mib"]) for o in r.get("streams", [])
                                                   if o["reached"] and o["rss_mib"]]
            if len(pts) > 1:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel("concurrent open streams (0 = idle)")
        ax.set_ylabel("RSS (MiB)")
        ax.set_title("open streams", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        return fig
    rep.figure = figure
    return rep
