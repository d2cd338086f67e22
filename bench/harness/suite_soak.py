"""soak: the seed-000 workload for minutes with upstream faults, clients that leave mid-stream and
upstream streams broken mid-way; RSS, open descriptors and added TTFT every 30 s; after an idle minute,
RSS within 10 % of the warmed-up baseline and the descriptors back to it."""

from __future__ import annotations

import json
import os
import pathlib
import time

import configs
from common import Options
from loadgen import Load, run as bench_run
from procs import HarnessError, http_get
from report import Report, table
from targets import Env, Mock, Target, direct, start_weir

TITLE = "soak: the seed workload with faults and leaving clients; memory, descriptors and TTFT over time"
FAULTS = 0.01        # upstream answers 503 before its head (weir-mock --error-rate): retried by the pool
LEAVE = 0.20         # clients that close their connection mid-stream (weir-bench --leave)
LEAVE_AFTER = 8      # ... after this many SSE events
RESETS = 0.05        # streams the upstream resets mid-way (weir-mock --reset-after 20 --reset-rate)
RESET_AFTER = 20     # tokens before that reset
WINDOW_S = 30.0      # one sample (a weir-bench run) per window
IDLE_S = 60.0        # idle before the final reading
RSS_SLACK = 0.10     # target: final RSS ≤ (1 + slack) × warmed-up baseline
# Outcomes the injected faults explain; any other error kind is Weir's (or the harness's) own.
EXPECTED = {"status", "stream_error", "truncated", "left", "cancelled"}


def open_fds(t: Target) -> int:
    """Open file descriptors of the target's process group (/proc/PID/fd)."""
    n = 0
    for pid in t.proc.group_pids() if t.proc else []:
        try:
            n += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return n


def rss_mib(t: Target) -> float:
    return t.memory_kb()["rss_kb"] / 1024


def pct_ms(d: dict, hist: str, p: str) -> float | None:
    h = d.get(hist) or {}
    return h.get(f"{p}_us") / 1000.0 if h.get("count") else None


def fmt_ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def sub(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def unexpected_errors(d: dict) -> dict[str, int]:
    return {k: v for k, v in (d.get("errors") or {}).items() if v and k not in EXPECTED}


def counter_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus counter's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def upstream_failures(weir: Target, mock: Mock) -> dict[str, float]:
    """Weir's upstream failures by kind, and the resets the mock injected."""
    _, body = http_get(weir.url + "/metrics", timeout=5)
    text = body.decode(errors="replace")
    out = {k: counter_sum(text, "weir_upstream_failures_total", kind=k)
           for k in ("reset", "protocol", "timeout", "connect_refused", "connect_timeout")}
    out["mock_resets"] = counter_sum(mock.metrics(), "weir_mock_injected_resets_total")
    return out


def access_log_lines(path: pathlib.Path) -> int:
    """Access-log lines of chat completions (not the harness's readiness probes)."""
    n = 0
    try:
        with path.open() as f:
            for line in f:
                try:
                    n += json.loads(line).get("path") == "/v1/chat/completions"
                except ValueError:
                    n += 1  # a line that is not JSON is a line too: it will not match the count
    except OSError:
        return 0
    return n


def run(env: Env, opts: Options) -> Report:
    rep = Report("soak", TITLE, env)
    minutes = opts.soak_minutes if opts.soak_minutes else 10.0
    rate = opts.soak_rate if opts.soak_rate else 250.0
    window = 2.0 if env.smoke else WINDOW_S
    windows = 3 if env.smoke else max(1, round(minutes * 60 / window))
    # Longer than idle_keepalive (4 s) and the sweep after it: the upstream connections are gone.
    idle = 5.5 if env.smoke else IDLE_S
    if env.smoke:
        rate = 40.0
    tokens = 32 if env.smoke else 128
    mock = Mock(env, ttft_ms=90, itl_ms=14, max_tokens=tokens, threads=1 if env.smoke else 2,
                extra=["--error-rate", f"{FAULTS:g}", "--error-status", "503",
                       "--reset-after", str(RESET_AFTER), "--reset-rate", f"{RESETS:g}"])
    jwks, token = configs.make_jwt(env.work)
    access_log = env.work / "weir-soak-access.log"
    cfg = configs.all_controls(mock.url, jwks, str(access_log))
    for p in cfg["pools"].values():
        # A 503 before the head is retried once on the pool (the retry path runs all along).
        p["retry"] = {"attempts": 2, "backoff": "5ms", "max_backoff": "20ms", "min_concurrent": 1000}
    weir = start_weir(env, "weir (all controls)", cfg, tag="weir-soak", headers=[f"Authorization: Bearer {token}"])
    lines = [configs.chat_body(m, tokens) for m in configs.SEED_MODELS]
    extra = ["--leave", f"{LEAVE:g}", "--leave-after", str(LEAVE_AFTER)]

    def load(duration: float) -> Load:
        return Load(rate=rate, duration=duration, warmup=0, payload_lines=lines, timeout=30, stall_ms=0,
                    max_lag_ms=20, extra=list(extra))

    rep.add_meta("mock", f"{mock.describe()} --any-model --error-rate {FAULTS:g} --error-status 503 "
                 f"--reset-after {RESET_AFTER} --reset-rate {RESETS:g}")
    rep.add_meta("load", f"weir-bench open loop {rate:g} req/s, {len(lines)} models round-robin, 400-token prompt, "
                 f"{tokens} streamed tokens; --leave {LEAVE:g} --leave-after {LEAVE_AFTER} (clients that close "
                 f"mid-stream); one run per {window:g} s window")
    rep.add_meta("weir", f"{weir.version}; --workers 1; the seed000 configuration (JWT, tenant limits, stream "
                 "cap and budget never tripping, pricing, four pools, access log to a file), each pool with "
                 "retry {attempts: 2}")
    rep.add_meta("duration", f"{windows} windows of {window:g} s ({windows * window / 60:.1f} min) after a "
                 f"{window:g} s warm-up and {idle:g} s idle; then {idle:g} s idle"
                 + ("" if env.smoke or minutes == 10 else f" (--soak-minutes {minutes:g})"))

    fds_start, rss_start = open_fds(weir), rss_mib(weir)
    sent_total = 0

    # The direct path under the same load and faults: the TTFT the added one is measured against.
    env.log(f"  soak: direct path, {window:g} s at {rate:g} req/s")
    d_direct = bench_run(env, direct(mock), load(window), "soak-direct", mock=mock)
    ttft50_d, ttft99_d = pct_ms(d_direct, "ttft", "p50"), pct_ms(d_direct, "ttft", "p99")
    resets_direct = counter_sum(mock.metrics(), "weir_mock_injected_resets_total")  # not Weir's

    # Warm-up, then idle: the baseline the end is compared with.
    env.log(f"  soak: warm-up {window:g} s through Weir, then {idle:g} s idle")
    d_warm = bench_run(env, weir, load(window), "soak-warmup", mock=mock)
    sent_total += (d_warm.get("generator") or {}).get("requests_total", 0)
    rss_warm_load = rss_mib(weir)
    time.sleep(idle)
    fds_base, rss_base = open_fds(weir), rss_mib(weir)
    env.log(f"  soak: baseline after warm-up and idle: RSS {rss_base:.1f} MiB, {fds_base} descriptors")

    samples: list[dict] = []
    t0 = time.monotonic()
    for i in range(windows):
        if not weir.alive():
            rep.failures.append(f"soak: Weir exited during window {i + 1} (log: {weir.proc.log_path})")
            break
        d = bench_run(env, weir, load(window), f"soak-{i + 1:03d}", mock=mock)
        sent_total += (d.get("generator") or {}).get("requests_total", 0)
        errs = d.get("errors") or {}
        s = {"t_s": round(time.monotonic() - t0, 1), "rss_mib": rss_mib(weir), "fds": open_fds(weir),
             "sent": d.get("sent", 0), "ok": d.get("ok", 0), "left": errs.get("left", 0),
             "status": errs.get("status", 0), "stream_error": errs.get("stream_error", 0),
             "truncated": errs.get("truncated", 0), "unexpected": unexpected_errors(d),
             "ttft_p50_ms": pct_ms(d, "ttft", "p50"), "ttft_p99_ms": pct_ms(d, "ttft", "p99"),
             "cpu_cores": d.get("target_cpu_cores"), "saturated": d.get("generator_saturated"),
             "codes": d.get("status_codes", {})}
        s["added_p50_ms"] = sub(s["ttft_p50_ms"], ttft50_d)
        s["added_p99_ms"] = sub(s["ttft_p99_ms"], ttft99_d)
        samples.append(s)
        env.log(f"    window {i + 1}/{windows}: RSS {s['rss_mib']:.1f} MiB, {s['fds']} fds, ok {s['ok']}, "
                f"left {s['left']}, added TTFT p50 {fmt_ms(s['added_p50_ms'])} p99 {fmt_ms(s['added_p99_ms'])} ms"
                + (f", unexpected {s['unexpected']}" if s["unexpected"] else ""))

    # Idle: the clients are gone; upstream connections age out (idle_keepalive), free heap is trimmed.
    idle_curve: list[tuple[float, float, int]] = []
    t_idle = time.monotonic()
    while time.monotonic() - t_idle < idle:
        time.sleep(1.0 if not env.smoke else 0.5)
        idle_curve.append((round(time.monotonic() - t_idle, 1), rss_mib(weir), open_fds(weir)))
    rss_end, fds_end = rss_mib(weir), open_fds(weir)
    hwm = weir.memory_kb()["hwm_kb"] / 1024
    failures = upstream_failures(weir, mock)
    failures["mock_resets"] -= resets_direct
    log_lines = access_log_lines(access_log)
    alive = weir.alive()
    weir.stop()
    mock.stop()
    if not alive:
        rep.failures.append("soak: Weir was not running at the end")

    # ---- targets ----
    limit = rss_base * (1 + RSS_SLACK)
    rep.goal(f"RSS after {idle:g} s idle within {RSS_SLACK:.0%} of the warmed-up baseline",
             f"{rss_end:.1f} MiB vs baseline {rss_base:.1f} MiB ({(rss_end / rss_base - 1) * 100:+.1f} %); "
             f"peak under load {max([s['rss_mib'] for s in samples] + [rss_warm_load]):.1f} MiB, HWM {hwm:.1f} MiB",
             "met" if rss_end <= limit else "missed")
    rep.goal(f"open descriptors after {idle:g} s idle back to the warmed-up baseline",
             f"{fds_end} vs baseline {fds_base} (at start {fds_start}; at most "
             f"{max([s['fds'] for s in samples] or [fds_base])} under load)",
             "met" if fds_end <= fds_base else "missed")
    unexpected: dict[str, int] = {}
    for s in samples:
        for k, v in s["unexpected"].items():
            unexpected[k] = unexpected.get(k, 0) + v
    answered = sum(s["sent"] for s in samples)
    # Weir's view: every upstream failure is one the mock injected (a reset it sent), none other.
    unexplained = {k: v for k, v in failures.items() if k in ("protocol", "timeout", "connect_refused",
                                                              "connect_timeout") and v}
    if failures["reset"] > failures["mock_resets"]:
        unexplained["reset beyond the mock's"] = failures["reset"] - failures["mock_resets"]
    clean = not unexpected and not unexplained
    rep.goal("no errors beyond the injected faults",
             ("none" if clean else "; ".join(filter(None, [
                 ", ".join(f"{k} {v}" for k, v in unexpected.items()),
                 ", ".join(f"upstream {k} {v:g}" for k, v in unexplained.items())])))
             + f" ({answered} requests; Weir saw {failures['reset']:g} upstream resets, the mock sent "
             f"{failures['mock_resets']:g})", "met" if clean else "missed")
    if env.smoke:
        if unexpected or unexplained:
            rep.failures.append(f"soak: errors the faults do not explain: {unexpected} {unexplained}")
        if fds_end > fds_base:
            rep.failures.append(f"soak: {fds_end - fds_base} descriptors more after idle than at the baseline")
        if not samples:
            rep.failures.append("soak: no window ran")

    # ---- tables ----
    rows = []
    for s in samples:
        rows.append([f"{s['t_s']:.0f}", f"{s['rss_mib']:.1f}", str(s["fds"]), str(s["sent"]), str(s["ok"]),
                     str(s["left"]), str(s["status"]), str(s["stream_error"] + s["truncated"]),
                     ", ".join(f"{k} {v}" for k, v in s["unexpected"].items()) or "–",
                     "–" if s["added_p50_ms"] is None else f"{s['added_p50_ms']:+.2f}",
                     "–" if s["added_p99_ms"] is None else f"{s['added_p99_ms']:+.2f}",
                     "–" if s["cpu_cores"] is None else f"{s['cpu_cores']:.2f}"])
        rep.row("window", "weir", s["t_s"], "rss", s["rss_mib"], "MiB")
        rep.row("window", "weir", s["t_s"], "fds", s["fds"], "")
        rep.row("window", "weir", s["t_s"], "added_ttft_p50", s["added_p50_ms"], "ms")
        rep.row("window", "weir", s["t_s"], "added_ttft_p99", s["added_p99_ms"], "ms")
    rep.section("Every window", (
        f"One weir-bench run of {window:g} s per row, back to back (t: seconds since the first window "
        "started). RSS (VmRSS) and open descriptors read right after the window. sent: requests written; "
        f"ok: complete answers; left: clients that closed mid-stream on purpose (≈ {LEAVE:.0%}); 503: the "
        f"upstream's injected error ({FAULTS:.0%} of attempts) twice in a row, passed on after the retry; "
        f"in-band: streams the upstream reset mid-way ({RESETS:.0%}), ended with an in-band error; "
        "added TTFT: the window's percentile minus the direct path's under the same load and faults "
        f"(direct p50 {fmt_ms(ttft50_d)} ms, p99 {fmt_ms(ttft99_d)} ms).\n\n"
        + table(["t (s)", "RSS MiB", "fds", "sent", "ok", "left", "503", "in-band", "other errors",
                 "added TTFT p50 ms", "added TTFT p99 ms", "Weir CPU (cores)"], rows)))
    rep.section("Idle", (
        f"Before any request: RSS {rss_start:.1f} MiB, {fds_start} descriptors. After the {window:g} s warm-up "
        f"(RSS {rss_warm_load:.1f} MiB under load) and {idle:g} s idle (the baseline): RSS {rss_base:.1f} MiB, "
        f"{fds_base} descriptors. After the soak and {idle:g} s idle: RSS {rss_end:.1f} MiB, {fds_end} "
        f"descriptors. During those {idle:g} s:\n\n"
        + table(["s idle", "RSS MiB", "fds"], [[f"{t:.0f}", f"{r:.1f}", str(f)] for t, r, f in idle_curve[::5 if
                                                                                                      not env.smoke
                                                                                                      else 2]])))
    rep.section("Access log", (
        f"{log_lines} lines for {sent_total} requests weir-bench sent through Weir (warm-up included): "
        + ("one per request." if log_lines == sent_total else
           "**not one per request** (a request without a line, or with two).")))
    if log_lines != sent_total:
        rep.note(f"The access log has {log_lines} lines for {sent_total} requests.")
        if env.smoke:
            rep.failures.append(f"soak: {log_lines} access-log lines for {sent_total} requests")
    rep.data = {"samples": samples, "idle": idle_curve, "baseline": {"rss_mib": rss_base, "fds": fds_base},
                "end": {"rss_mib": rss_end, "fds": fds_end}, "start": {"rss_mib": rss_start, "fds": fds_start},
                "direct": {"ttft_p50_ms": ttft50_d, "ttft_p99_ms": ttft99_d}, "rate": rate, "window_s": window}

    def figure(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        ax = axes[0]
        ts = [s["t_s"] for s in samples]
        ax.plot(ts, [s["rss_mib"] for s in samples], marker="o", label="RSS (MiB)")
        ax.axhline(rss_base, linestyle="--", color="gray", label="warmed-up idle baseline")
        ax.axhline(limit, linestyle=":", color="red", label=f"baseline + {RSS_SLACK:.0%}")
        ax2 = ax.twinx()
        ax2.plot(ts, [s["fds"] for s in samples], color="green", marker="x", label="descriptors")
        ax.set_xlabel("seconds into the soak")
        ax.set_ylabel("RSS (MiB)")
        ax2.set_ylabel("open descriptors")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
        ax2.legend(fontsize=7, loc="lower right")
        ax = axes[1]
        ax.plot(ts, [s["added_p50_ms"] for s in samples], marker="o", label="added TTFT p50")
        ax.plot(ts, [s["added_p99_ms"] for s in samples], marker="o", label="added TTFT p99")
        ax.set_xlabel("seconds into the soak")
        ax.set_ylabel("ms")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        return fig
    rep.figure = figure
    if not samples:
        raise HarnessError("soak: no window ran")
    return rep
