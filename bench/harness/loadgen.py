"""Runs weir-bench (pinned to the load CPU) against a target and returns its JSON report,
with the target's CPU time over the measured window and its memory after the run."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from procs import HarnessError, _preexec
from targets import Env, Mock, Target, lag_p99_ms


@dataclass
class Load:
    """One weir-bench run's shape (open loop with `rate`, closed loop with `concurrency`)."""
    rate: float | None = None
    concurrency: int | None = None
    duration: float = 5.0
    warmup: float = 1.0
    payload: str = "seed000"          # built-in payload name, unless payload_lines is set
    payload_lines: list[str] | None = None   # bodies (one JSON per line); {model} is replaced per target
    max_tokens: int | None = None
    stream: bool | None = None
    stall_ms: float = 1000
    timeout: float = 30
    threads: int = 1
    max_lag_ms: float = 5
    extra: list[str] = field(default_factory=list)

    def describe(self) -> str:
        mode = f"open loop {self.rate:g} req/s" if self.rate else f"closed loop, concurrency {self.concurrency}"
        return f"{mode}, {self.warmup:g} s warm-up + {self.duration:g} s"


_counter = 0
_counter_lock = threading.Lock()
running: set[subprocess.Popen] = set()     # weir-bench processes in flight (killed on SIGINT/SIGTERM)


def kill_running() -> None:
    for p in list(running):
        try:
            p.kill()
        except OSError:
            pass


def run(env: Env, target: Target, load: Load, tag: str, mock: Mock | None = None,
        stop_when=None) -> dict:
    """Runs weir-bench once; returns its JSON plus `target_cpu_cores` (CPU over the measured window;
    `target_cpu_user_cores` and `target_cpu_sys_cores` its utime and stime parts),
    `target_cpu_run_s` (CPU over the whole run, warm-up and drain included, ns resolution: what every
    request and SSE event weir-bench counted in `generator.requests_total` / `events_total` cost),
    `target_rss_kb`/`target_hwm_kb` (after the run), `mock_lag_p99_ms` (if `mock`).

    `stop_when(elapsed_s) -> bool`, polled every second, ends the run early with SIGINT."""
    global _counter
    with _counter_lock:
        _counter += 1
        n = _counter
    raw = env.work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    out = raw / f"{n:04d}-{tag}-{target.name}.json"
    argv = [env.binary("weir-bench"), target.chat_url,
            "--duration", f"{load.duration}s", "--warmup", f"{load.warmup}s",
            "--timeout", f"{load.timeout}s", "--stall-ms", f"{load.stall_ms:g}",
            "--max-lag", f"{load.max_lag_ms:g}ms", "--threads", str(load.threads),
            "--json", str(out), "-q"]
    if load.rate:
        argv += ["--rate", f"{load.rate:g}"]
    else:
        argv += ["--concurrency", str(load.concurrency)]
    if load.payload_lines:
        pf = raw / f"{n:04d}-{tag}-{target.name}.payload.jsonl"
        pf.write_text("".join(line.replace("{model}", target.model) + "\n" for line in load.payload_lines))
        argv += ["--payload-file", str(pf)]
    else:
        argv += ["--payload", load.payload, "--model", target.model]
        if load.max_tokens is not None:
            argv += ["--max-tokens", str(load.max_tokens)]
        if load.stream is True:
            argv.append("--stream")
        elif load.stream is False:
            argv.append("--no-stream")
    for h in target.headers:
        argv += ["-H", h]
    argv += load.extra
    if not target.alive():
        raise HarnessError(f"{target.label} is not running before a run ({tag})")
    lag0 = mock.lag_buckets() if mock else []
    run_cpu0 = target.cpu_ns()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_preexec(env.load_cpu, env.priority))
    running.add(proc)
    cpu0 = cpu1 = None
    stderr = ""
    try:
        # CPU of the target over the measured window: read at the end of warm-up and at the window's end.
        deadline_warm = t0 + load.warmup
        deadline_end = deadline_warm + load.duration
        while proc.poll() is None:
            now = time.monotonic()
            if cpu0 is None and now >= deadline_warm:
                cpu0 = (target.cpu_split(), now)
            if cpu0 is not None and cpu1 is None and now >= deadline_end:
                cpu1 = (target.cpu_split(), now)
            if stop_when and stop_when(now - t0):
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.05)
        _, stderr = proc.communicate(timeout=load.timeout + load.duration + load.warmup + 120)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        running.discard(proc)
    if cpu1 is None:
        cpu1 = (target.cpu_split(), time.monotonic())
    # The gateway's last work for this run (closing the connections weir-bench left) follows its exit.
    time.sleep(0.02)
    run_cpu1 = target.cpu_ns()
    if cpu0 is None:
        cpu0 = cpu1
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError) as e:
        raise HarnessError(f"weir-bench against {target.label} ({tag}) wrote no report "
                           f"(exit {proc.returncode}): {stderr.strip()[-500:]}") from e
    wall = cpu1[1] - cpu0[1]
    user, system = cpu1[0][0] - cpu0[0][0], cpu1[0][1] - cpu0[0][1]
    data["target_cpu_cores"] = (user + system) / wall if wall > 0.2 else None
    # Apart: the gateway's own code (utime) and the kernel's work for it (stime), 10 ms ticks.
    data["target_cpu_user_cores"] = user / wall if wall > 0.2 else None
    data["target_cpu_sys_cores"] = system / wall if wall > 0.2 else None
    data["target_cpu_run_s"] = (run_cpu1 - run_cpu0) / 1e9 if target.proc else None
    data.update({f"target_{k}": v for k, v in target.memory_kb().items()})
    data["target_alive"] = target.alive()
    data["mock_lag_p99_ms"] = lag_p99_ms(lag0, mock.lag_buckets()) if mock else None
    data["bench_stderr"] = stderr.strip()[-2000:]
    data["load"] = load.describe()
    data["raw_file"] = str(out)
    return data


def error_rate(d: dict) -> float:
    scheduled = d.get("scheduled") or d.get("completed") or 0
    return (d.get("errors_total", 0) / scheduled) if scheduled else 1.0


def summarize_errors(d: dict) -> str:
    errs = {k: v for k, v in d.get("errors", {}).items() if v and k not in ("cancelled", "left")}
    if not errs:
        return ""
    parts = [f"{k} {v}" for k, v in errs.items()]
    if d.get("status_codes"):
        parts.append("codes " + ",".join(f"{k}x{v}" for k, v in d["status_codes"].items()))
    return ", ".join(parts)
