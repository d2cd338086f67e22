#!/usr/bin/env python3
"""How many concurrent SSE streams one weir-mock core holds at given timings.

Starts weir-mock pinned to one CPU, keeps N streaming chat requests in flight
from this process (pinned to another CPU; closed loop over N keep-alive
connections, each starting its next request when the previous one ends),
and over a steady window reports:

  * the mock's CPU use (utime+stime from /proc, % of one core),
  * token throughput and completed streams (every one checked for all its
    tokens and the final `data: [DONE]`),
  * the mock's own scheduling lag (weir_mock_token_lag_seconds: how late each
    token left versus its due time), p50/p99/max bucket.

"Holds N streams" means: CPU below 100 % of the core and p99 lag within a
couple of milliseconds (tokens leave on time, nothing queues up).

    tools/mock/measure_capacity.py --bin build-mock/bin/weir-mock --streams 500 1000 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
import urllib.request

LAG_RE = re.compile(r'^weir_mock_token_lag_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lag_buckets(base: str) -> list[tuple[float, float]]:
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    return [(float("inf") if le == "+Inf" else float(le), float(v)) for le, v in LAG_RE.findall(text)]


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    total = buckets[-1][1]
    for le, cum in buckets:
        if total and cum >= q * total:
            return le
    return float("nan")


def max_bucket(buckets: list[tuple[float, float]]) -> float:
    """Upper bound of the highest non-empty bucket of a cumulative histogram."""
    top, prev = 0.0, 0.0
    for le, cum in buckets:
        if cum > prev:
            top = le
        prev = cum
    return top


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Stream(asyncio.Protocol):
    """One keep-alive connection running streaming requests back to back."""

    def __init__(self, request: bytes, tokens: int, stats: dict):
        self.request, self.tokens, self.stats = request, tokens, stats
        self.parts: list[bytes] = []
        self.running = True
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.transport.write(self.request)

    def data_received(self, data: bytes):
        self.parts.append(data)
        if not data.endswith(b"0\r\n\r\n"):
            return
        body = b"".join(self.parts)
        self.parts = []
        got = body.count(b'"delta":{"content":"')
        self.stats["streams"] += 1
        self.stats["tokens"] += got
        if got != self.tokens or b"data: [DONE]\n\n" not in body:
            self.stats["bad"] += 1
        if self.running:
            self.transport.write(self.request)

    def connection_lost(self, exc):
        self.stats["lost"] += 1


async def run_level(port: int, pid: int, n: int, tokens: int, ramp: float, warm: float, window: float) -> dict:
    base = f"http://127.0.0.1:{port}"
    body = json.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "measure capacity"}],
                       "max_tokens": tokens, "stream": True}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n").encode() + body
    stats = {"streams": 0, "tokens": 0, "bad": 0, "lost": 0}
    loop = asyncio.get_running_loop()
    conns = []
    for i in range(n):  # spread the starts so requests are not all in phase
        _, proto = await loop.create_connection(lambda: Stream(request, tokens, stats), "127.0.0.1", port)
        conns.append(proto)
        await asyncio.sleep(ramp / n)
    await asyncio.sleep(warm)
    lag0, cpu0, s0, t0, w0 = lag_buckets(base), cpu_seconds(pid), dict(stats), time.monotonic(), time.process_time()
    await asyncio.sleep(window)
    lag1, cpu1, s1, t1, w1 = lag_buckets(base), cpu_seconds(pid), dict(stats), time.monotonic(), time.process_time()
    for c in conns:
        c.running = False
    await asyncio.sleep(3)  # let the last requests finish
    for c in conns:
        c.transport.close()
    elapsed = t1 - t0
    lag = [(le, c1 - c0) for (le, c0), (_, c1) in zip(lag0, lag1)]
    return {
        "streams": n,
        "mock_cpu_pct": round(100 * (cpu1 - cpu0) / elapsed, 1),
        "client_cpu_pct": round(100 * (w1 - w0) / elapsed, 1),
        "tokens_per_s": round((s1["tokens"] - s0["tokens"]) / elapsed),
        "streams_done": s1["streams"] - s0["streams"],
        "bad_streams": stats["bad"],
        "lost_conns": stats["lost"],
        "lag_p50_le_s": quantile(lag, 0.5),
        "lag_p99_le_s": quantile(lag, 0.99),
        "lag_max_le_s": max_bucket(lag),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin/weir-mock")
    ap.add_argument("--streams", type=int, nargs="+", default=[500, 1000, 2000])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ttft-ms", type=int, default=90)
    ap.add_argument("--itl-ms", type=int, default=14)
    ap.add_argument("--mock-cpu", type=int, default=0, help="CPU the mock is pinned to")
    ap.add_argument("--client-cpu", type=int, default=1, help="CPU this client is pinned to")
    ap.add_argument("--nice", type=int, default=0,
                    help="nice value for mock and client (negative needs root; shields the run from a busy machine)")
    ap.add_argument("--ramp", type=float, default=2.0)
    ap.add_argument("--warm", type=float, default=2.0)
    ap.add_argument("--window", type=float, default=6.0)
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.sched_setaffinity(0, {args.client_cpu})
    if args.nice:
        os.nice(args.nice)  # the mock inherits it
    for n in args.streams:
        port = free_port()
        mock = subprocess.Popen(
            [args.bin, "--listen", f"127.0.0.1:{port}", "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
             "--max-tokens", str(args.tokens)],
            stdout=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, {args.mock_cpu}))
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            result = asyncio.run(run_level(port, mock.pid, n, args.tokens, args.ramp, args.warm, args.window))
            print(json.dumps(result), flush=True)
        finally:
            mock.terminate()
            mock.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
