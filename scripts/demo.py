"""Weir demo: four mock vLLM pools, Weir in front, the openai SDK as the client.

Run through scripts/demo (which sets up and builds first)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = REPO / "build" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, name: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"demo: {name} exited early with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    sys.exit(f"demo: {name} did not open port {port} within {timeout}s")


def main() -> None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="weir-demo-"))
    example = (REPO / "config" / "weir.example.yaml").read_text()
    procs: list[subprocess.Popen] = []

    # Each endpoint of the example config gets a free port and a mock serving
    # the pool's upstream model name (as vLLM's --served-model-name would).
    served = {"8101": "meta-llama/Llama-3.1-8B-Instruct", "8102": "meta-llama/Llama-3.1-8B-Instruct",
              "8103": "Qwen/Qwen2.5-7B-Instruct", "8104": "mistralai/Mistral-7B-Instruct-v0.3",
              "8105": "BAAI/bge-m3"}
    ports = {old: free_port() for old in served}
    weir_port = free_port()
    config = example.replace("listen: 127.0.0.1:8080", f"listen: 127.0.0.1:{weir_port}")
    config = config.replace('access_log: "-"', f'access_log: "{work / "access.log"}"')
    for old, new in ports.items():
        config = config.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
    (work / "weir.yaml").write_text(config)

    def start(argv: list[str], port: int, name: str) -> subprocess.Popen:
        log = open(work / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        wait_port(port, p, name)
        return p

    try:
        for old, model in served.items():
            start([str(BIN / "weir-mock"), "--listen", f"127.0.0.1:{ports[old]}", "--model", model,
                   "--ttft-ms", "90", "--itl-ms", "14"], ports[old], f"mock-{old}")
        start([str(BIN / "weir"), "--config", str(work / "weir.yaml")], weir_port, "weir")
        base = f"http://127.0.0.1:{weir_port}"
        print(f"demo: 5 weir-mock endpoints in 4 pools (TTFT 90 ms, 14 ms/token, like seed 000), Weir on {base}")
        print(f"demo: config {work / 'weir.yaml'}, access log {work / 'access.log'}\n")

        from openai import OpenAI

        client = OpenAI(base_url=f"{base}/v1", api_key="demo-key")
        print("models:", ", ".join(m.id for m in client.models.list().data))
        print("\n> model=llama (alias of llama-3.1-8b-instruct), stream=True")
        print("< ", end="", flush=True)
        t0 = time.perf_counter()
        first = None
        tokens = 0
        stream = client.chat.completions.create(
            model="llama", stream=True, max_tokens=48, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Say something about gateways."}])
        usage = None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.content:
                    if first is None:
                        first = time.perf_counter() - t0
                    tokens += 1
                    print(c.delta.content, end="", flush=True)
        total = time.perf_counter() - t0
        print(f"\n\n  {tokens} tokens, TTFT {first * 1000:.1f} ms, total {total * 1000:.0f} ms, usage {usage}")

        emb = client.embeddings.create(model="bge-m3", input=["weir", "gateway"])
        print(f"\n> embeddings via bge-m3: {len(emb.data)} vectors of {len(emb.data[0].embedding)} dims, "
              f"usage {emb.usage.prompt_tokens} tokens")

        latency_table(base, ports["8103"], work)
        time.sleep(0.1)  # let the access log's 50 ms flush run before we read it
        lines = (work / "access.log").read_text().splitlines()
        if lines:
            print(f"\naccess log: {len(lines)} lines; the streamed chat request:")
            for line in lines:
                rec = json.loads(line)
                if rec.get("stream") and rec.get("model") == "llama":
                    print("  " + line)
                    break
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def latency_table(base: str, direct_port: int, work: pathlib.Path) -> None:
    print("\nlatency, direct to the mock vs through Weir (weir-bench, seed-000 prompt, 24 tokens, "
          "16 concurrent streams, 4 s each, alternated twice; medians):")
    runs: dict[str, list[dict]] = {"direct": [], "weir": []}
    for i in range(2):
        for name, url, model in (("direct", f"http://127.0.0.1:{direct_port}/v1/chat/completions", "Qwen/Qwen2.5-7B-Instruct"),
                                 ("weir", f"{base}/v1/chat/completions", "qwen")):
            out = work / f"bench-{name}-{i}.json"
            subprocess.run([str(BIN / "weir-bench"), url, "--concurrency", "16", "--duration", "4s", "--warmup",
                            "1s", "--stream", "--max-tokens", "24", "--model", model, "--payload", "seed000",
                            "--json", str(out), "--quiet"], check=True)
            runs[name].append(json.loads(out.read_text()))

    def med(name: str, metric: str, pct: str) -> float:
        return statistics.median(r[metric][pct + "_us"] for r in runs[name]) / 1000.0

    rows = [("TTFT", "ttft"), ("inter-token gap", "itl"), ("end to end", "e2e")]
    print(f"  {'metric':<16}{'pct':>6}{'direct ms':>12}{'weir ms':>12}{'added ms':>12}")
    for label, metric in rows:
        for pct in ("p50", "p99"):
            d, w = med("direct", metric, pct), med("weir", metric, pct)
            print(f"  {label:<16}{pct:>6}{d:>12.3f}{w:>12.3f}{w - d:>+12.3f}")
    ok = sum(r["ok"] for r in runs["weir"])
    errors = sum(r["errors_total"] for r in runs["weir"])
    direct_ok = sum(r["ok"] for r in runs["direct"])
    print(f"  requests: {direct_ok} direct, {ok} through Weir with {errors} errors")


if __name__ == "__main__":
    main()
