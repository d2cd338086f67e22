#!/usr/bin/env python3
"""How many concurrent SSE streams one weir-mock core holds at given timings.

For each level N: starts weir-mock pinned to one CPU, drives it with
weir-bench pinned to another CPU (open loop at N / stream-duration requests/s,
so N streams are in flight on average: the seed-000 payload, ~400-token
prompt, max_tokens 128, streamed), and over a steady window reports

  * the mock's CPU (utime+stime from /proc: % of one core, and µs per token),
  * tokens/s leaving the mock (vllm:generation_tokens_total),
  * the mock's scheduling lag (weir_mock_token_lag_seconds: how late each
    token left versus its due time), as histogram bucket bounds,
  * what weir-bench saw (TTFT and inter-token p50/p99, and whether it says
    it was saturated itself).

"Holds N streams" = CPU under 100 % of its core and tokens leaving on time
(lag p99 within a few ms); tokens/s then matches N * 128 / (ttft + 127 * itl).

On a shared machine the mock competes for its CPU with everything else;
--priority runs the mock and weir-bench each in their own session with the
autogroup nice raised (root only), so the lag shows the mock and not the
neighbours. Without weir-bench (--bench missing), a Python asyncio client is
used instead; it saturates well before the mock does.

    tools/mock/measure_capacity.py --mock build-mock/bin/weir-mock \\
        --bench build-bench/bin/weir-bench --streams 1000 2000 3000 --priority
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

LAG_RE = re.compile(r'^weir_mock_token_lag_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$', re.M)
TOKENS_RE = re.compile(r'^vllm:generation_tokens_total\{[^}]*\} (\S+)$', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(base: str) -> tuple[float, list[tuple[float, float]]]:
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    lag = [(float("inf") if le == "+Inf" else float(le), float(v)) for le, v in LAG_RE.findall(text)]
    return float(TOKENS_RE.search(text).group(1)), lag


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    total = buckets[-1][1]
    for le, cum in buckets:
        if total and cum >= q * total:
            return le
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def launcher(cpu: int, priority: bool):
    """preexec_fn: pin to `cpu`; with `priority`, a new session (own autogroup) with nice -10."""
    def setup() -> None:
        os.sched_setaffinity(0, {cpu})
        if priority:
            os.setsid()
            with open("/proc/self/autogroup", "w") as f:
                f.write("-10")
    return setup


def python_client(port: int, n: int, seconds: float) -> subprocess.Popen:
    """Fallback load: N keep-alive connections each running streaming requests back to back."""
    code = r'''
import asyncio, json, sys, resource
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
body = json.dumps({"messages": [{"role": "user", "content": "word " * 300}], "max_tokens": 128, "stream": True}).encode()
req = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body) + body
class S(asyncio.Protocol):
    def connection_made(self, t): self.t = t; t.write(req)
    def data_received(self, d):
        if d.endswith(b"0\r\n\r\n"): self.t.write(req)
async def main():
    loop = asyncio.get_running_loop()
    for _ in range(n):
        await loop.create_connection(S, "127.0.0.1", port)
    await asyncio.sleep(seconds)
asyncio.run(main())
'''
    return subprocess.Popen([sys.executable, "-c", code, str(port), str(n), str(seconds)])


def run_level(args, n: int) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    mock = subprocess.Popen(
        [args.mock, "--listen", f"127.0.0.1:{port}", "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
         *args.mock_args],
        stdout=subprocess.DEVNULL, preexec_fn=launcher(args.mock_cpu, args.priority))
    client = None
    try:
        wait_port(port)
        stream_s = (args.ttft_ms + 127 * args.itl_ms) / 1000
        if args.bench and os.access(args.bench, os.X_OK):
            client = subprocess.Popen(
                [args.bench, base, "--rate", f"{n / stream_s:.1f}", "--stream", "--max-tokens", "128",
                 "--warmup", f"{args.warm}s", "--duration", f"{args.window + 2}s", "-q", "--json", "-"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=launcher(args.client_cpu, args.priority))
        else:
            client = python_client(port, n, args.warm + args.window + 2)
        time.sleep(args.warm)
        tok0, lag0 = scrape(base)
        cpu0, t0 = cpu_seconds(mock.pid), time.monotonic()
        time.sleep(args.window)
        tok1, lag1 = scrape(base)
        cpu1, t1 = cpu_seconds(mock.pid), time.monotonic()
        elapsed = t1 - t0
        lag = [(le, c1 - c0) for (le, c0), (_, c1) in zip(lag0, lag1)]
        tokens = tok1 - tok0
        bench = {}
        if client.stdout is not None:
            out, _ = client.communicate(timeout=120)
            report = json.loads(out)
            ms = lambda h, q: round(report[h][q] / 1000, 1)
            bench = {"bench_ttft_ms_p50_p99": [ms("ttft", "p50_us"), ms("ttft", "p99_us")],
                     "bench_itl_ms_p50_p99": [ms("itl", "p50_us"), ms("itl", "p99_us")],
                     "bench_saturated": report["generator_saturated"]}
        return {
            "streams": n,
            "client": "weir-bench" if args.bench and os.access(args.bench, os.X_OK) else "python",
            "ideal_tokens_per_s": round(n * 128 / ((args.ttft_ms + 127 * args.itl_ms) / 1000)),
            "tokens_per_s": round(tokens / elapsed),
            "mock_cpu_pct_of_core": round(100 * (cpu1 - cpu0) / elapsed, 1),
            "mock_cpu_us_per_token": round(1e6 * (cpu1 - cpu0) / tokens, 2) if tokens else None,
            "lag_p50_le_s": quantile(lag, 0.5),
            "lag_p99_le_s": quantile(lag, 0.99),
            "lag_p999_le_s": quantile(lag, 0.999),
            **bench,
        }
    finally:
        if client and client.poll() is None:
            client.kill()
            client.wait()
        mock.terminate()
        mock.wait(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mock", default="build/bin/weir-mock")
    ap.add_argument("--bench", default="build/bin/weir-bench", help="weir-bench binary (else a Python client)")
    ap.add_argument("--streams", type=int, nargs="+", default=[1000, 2000, 3000])
    ap.add_argument("--ttft-ms", type=int, default=90)
    ap.add_argument("--itl-ms", type=int, default=14)
    ap.add_argument("--mock-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--priority", action="store_true", help="own autogroup with nice -10 for mock and client (root)")
    ap.add_argument("--mock-args", nargs="*", default=[], help="extra weir-mock flags, e.g. --tick-us 0")
    ap.add_argument("--warm", type=float, default=5.0, help="seconds before the window (ramp-up)")
    ap.add_argument("--window", type=float, default=8.0, help="measured seconds")
    args = ap.parse_args()
    for n in args.streams:
        print(json.dumps(run_level(args, n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
