"""bench/run: Weir's benchmark harness. See bench/README.md.

    bench/run SUITE [SUITE...]       run suites, write bench/results/SUITE.{md,csv,json,png}
    bench/run all                    every suite, then bench/results/summary.md
    bench/run --smoke all|SUITE      short mode (seconds per suite; Weir, direct and nginx only), output in a
                                     temp dir (or --out); exits non-zero when anything breaks
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import procs  # noqa: E402
from common import Options  # noqa: E402
from procs import HarnessError  # noqa: E402
from targets import REPO, Env, PEER_ORDER  # noqa: E402

SUITES = ["seed000", "latency", "stream", "memory", "governed", "allocs", "batch", "routing", "translate", "tls",
          "soak"]


def load_suite(name: str):
    import importlib
    return importlib.import_module(f"suite_{name}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suites", nargs="+", help=f"{', '.join(SUITES)} or all")
    ap.add_argument("--smoke", action="store_true", help="short mode for CI: seconds per suite, no peers but nginx")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per measurement (default 3; smoke 1)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="output directory (default bench/results; smoke: a temp dir)")
    ap.add_argument("--peers", default=",".join(PEER_ORDER),
                    help="comma-separated peers to run (default: all; '' for none)")
    ap.add_argument("--no-install", action="store_true", help="do not run a peer's setup when it is not installed")
    ap.add_argument("--no-priority", action="store_true", help="do not raise the measured processes' priority")
    ap.add_argument("--bin-dir", type=pathlib.Path, default=REPO / "build" / "bin")
    ap.add_argument("--baseline-bin", type=pathlib.Path, default=None,
                    help="also measure this weir binary (e.g. the previous commit's build) beside build/bin/weir, "
                         "same config, alternated in the same rounds: target 'weir (baseline)' in the latency, "
                         "stream and memory suites")
    ap.add_argument("--allocators", default="",
                    help="comma-separated mallocs (jemalloc, mimalloc) to LD_PRELOAD into extra build/bin/weir "
                         "targets 'weir (NAME)', alternated in the same rounds of the latency, stream and memory "
                         "suites (glibc's malloc is the plain 'weir')")
    ap.add_argument("--request-log", action="store_true",
                    help="also measure build/bin/weir with request_log: (a SQLite file in the work dir) beside it, "
                         "same config otherwise, alternated in the same rounds: target 'weir (request log)' in the "
                         "latency, stream and memory suites")
    ap.add_argument("--soak-minutes", type=float, default=0.0,
                    help="soak: minutes of load after the warm-up (default 10)")
    ap.add_argument("--soak-rate", type=float, default=0.0, help="soak: open-loop req/s (default 250)")
    ap.add_argument("--rates", default="",
                    help="seed000: comma-separated offered rates (req/s) instead of the suite's steps, e.g. 20")
    ap.add_argument("--tracing", action="store_true",
                    help="also measure build/bin/weir with tracing: (every request's spans exported over OTLP/HTTP "
                         "to a sink on the load CPU) beside it, same config otherwise, alternated in the same rounds: "
                         "target 'weir (tracing)' in the latency, stream and memory suites")
    ap.add_argument("--no-access-log", action="store_true",
                    help="also measure build/bin/weir with server.access_log: off beside it, same config otherwise, "
                         "alternated in the same rounds: target 'weir (no access log)' (what the log costs)")
    ap.add_argument("--gateway-cpu", type=int, default=0)
    ap.add_argument("--load-cpu", type=int, default=1)
    ap.add_argument("--keep-work", action="store_true", help="keep the work dir (configs, logs, raw JSON)")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.suites == ["all"]:
        args.suites = list(SUITES)
    for s in args.suites:
        if s not in SUITES:
            ap.error(f"unknown suite {s!r} (one of: {', '.join(SUITES)}, all)")
    return args


def ensure_binaries(bin_dir: pathlib.Path) -> None:
    need = ["weir", "weir-mock", "weir-bench"]
    missing = [n for n in need if not os.access(bin_dir / n, os.X_OK)]
    if missing and bin_dir == REPO / "build" / "bin":
        print(f"bench/run: building {' '.join(missing)} (scripts/build release ...)", flush=True)
        import subprocess
        for attempt in range(10):
            r = subprocess.run([str(REPO / "scripts" / "build"), "release", *need], cwd=REPO)
            if r.returncode == 0:
                break
            time.sleep(15)   # the lead builds into build/ too: a held ninja lock clears
        missing = [n for n in need if not os.access(bin_dir / n, os.X_OK)]
    if missing:
        raise HarnessError(f"missing binaries in {bin_dir}: {', '.join(missing)} "
                           "(scripts/build release weir weir-mock weir-bench)")


def snapshot_binaries(bin_dir: pathlib.Path) -> pathlib.Path:
    """Copies weir, weir-mock and weir-bench to a private dir, so one `bench/run` measures one build even when
    someone rebuilds build/ meanwhile; each copy must run (--help) or the copy is retried."""
    import subprocess
    snap = pathlib.Path(tempfile.mkdtemp(prefix="weir-bench-bin-"))
    for name in ("weir", "weir-mock", "weir-bench"):
        for attempt in range(20):
            try:
                shutil.copy2(bin_dir / name, snap / name)
                if subprocess.run([str(snap / name), "--help"], capture_output=True, timeout=20).returncode == 0:
                    break
            except (OSError, subprocess.TimeoutExpired):
                pass
            time.sleep(5)      # the linker is writing it: wait
        else:
            raise HarnessError(f"{bin_dir / name} does not run (being rebuilt?)")
    return snap


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if os.cpu_count() and os.cpu_count() < 2:
        print("bench/run: needs 2 CPUs (gateway on one, mock and load generator on the other)", file=sys.stderr)
        return 2
    ensure_binaries(args.bin_dir)
    snap = snapshot_binaries(args.bin_dir)
    baseline = None
    if args.baseline_bin:
        src = args.baseline_bin / "weir" if args.baseline_bin.is_dir() else args.baseline_bin
        if not os.access(src, os.X_OK):
            print(f"bench/run: --baseline-bin: {src} is not an executable weir", file=sys.stderr)
            return 2
        baseline = snap / "weir-baseline"
        shutil.copy2(src, baseline)
    from common import ALLOCATORS
    allocators = tuple(a for a in args.allocators.split(",") if a)
    for a in allocators:
        if a not in ALLOCATORS or not os.path.exists(ALLOCATORS[a]):
            print(f"bench/run: --allocators: {a!r} is not one of {', '.join(ALLOCATORS)} "
                  "(or its library is missing: scripts/setup)", file=sys.stderr)
            return 2
    procs.raise_fd_limit()

    def on_signal(signum, _frame):
        print(f"\nbench/run: signal {signum}: stopping every process it started", file=sys.stderr, flush=True)
        import loadgen
        loadgen.kill_running()
        procs.stop_all()
        os._exit(128 + signum)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    smoke = args.smoke
    if args.out:
        out_dir = args.out
    elif smoke:
        out_dir = pathlib.Path(tempfile.mkdtemp(prefix="weir-bench-smoke-"))
    else:
        out_dir = REPO / "bench" / "results"
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    priority = not args.no_priority and procs.priority_available()
    opts = Options(peers=[p for p in args.peers.split(",") if p], install_peers=not args.no_install,
                   soak_minutes=args.soak_minutes, soak_rate=args.soak_rate,
                   rates=[float(r) for r in args.rates.split(",") if r.strip()])
    rounds = args.rounds or (1 if smoke else 3)
    failures: list[str] = []
    written: list[pathlib.Path] = []
    reports = []
    t_all = time.monotonic()
    for name in args.suites:
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"weir-bench-{name}-"))
        env = Env(bin_dir=snap, work=work, gateway_cpu=args.gateway_cpu, load_cpu=args.load_cpu,
                  priority=priority, smoke=smoke, rounds=rounds, verbose=not args.quiet, baseline=baseline,
                  allocators=allocators, request_log=args.request_log, tracing=args.tracing,
                  no_access_log=args.no_access_log)
        print(f"== {name}{' (smoke)' if smoke else ''}: work dir {work}", flush=True)
        t0 = time.monotonic()
        try:
            rep = load_suite(name).run(env, opts)
            rep.finish()
            files = rep.write(out_dir)
            written += files
            reports.append(rep)
            for f in files:
                if not f.exists() or f.stat().st_size == 0:
                    rep.failures.append(f"output file {f} missing or empty")
            failures += [f"{name}: {x}" for x in rep.failures]
            status = "FAILED" if rep.failures else "ok"
            print(f"== {name}: {status} in {time.monotonic() - t0:.0f} s -> {out_dir / name}.md", flush=True)
            for x in rep.failures:
                print(f"   {x}", flush=True)
        except HarnessError as e:
            failures.append(f"{name}: {e}")
            print(f"== {name}: FAILED: {e}", file=sys.stderr, flush=True)
        except Exception:   # noqa: BLE001 - report, stop processes, go on with the next suite
            failures.append(f"{name}: harness error:\n{traceback.format_exc()}")
            print(f"== {name}: FAILED (harness error)\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        finally:
            procs.stop_all()
            if args.keep_work or (not smoke and failures):
                print(f"   work dir kept: {work}", flush=True)
            else:
                shutil.rmtree(work, ignore_errors=True)
            if not smoke and not args.keep_work and (REPO / "bench" / "results").resolve() == out_dir:
                # keep raw per-run reports where .gitignore expects them
                pass
    shutil.rmtree(snap, ignore_errors=True)
    if reports:
        import summary
        written.append(summary.write(out_dir, smoke))
    print(f"bench/run: {len(args.suites)} suite(s) in {time.monotonic() - t_all:.0f} s; output in {out_dir}")
    if failures:
        print("bench/run: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    finally:
        procs.stop_all()
