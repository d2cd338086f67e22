"""Helpers shared by the suites: the set of targets, saturation rules, table cells."""

from __future__ import annotations

import json
import pathlib

from dataclasses import dataclass, field

import measure
from measure import agg
from report import Report, us_ms
from targets import Env, Mock, Target, direct, peer_targets, PEER_ORDER


@dataclass
class Options:
    peers: list[str] = field(default_factory=lambda: list(PEER_ORDER))
    install_peers: bool = True
    bifrost_variants: list[str] = field(default_factory=lambda: ["logging-on", "logging-off"])
    soak_minutes: float = 0.0   # soak: minutes of load (0: the suite's default, 10)
    soak_rate: float = 0.0      # soak: req/s (0: the suite's default, 250)
    rates: list[float] = field(default_factory=list)  # seed000: the offered rates (empty: the suite's steps)


def peers_for(env: Env, opts: Options) -> list[str]:
    return ["nginx"] if env.smoke else [p for p in opts.peers]


def start_peers(env: Env, opts: Options, mock: Mock, report: Report, names: list[str] | None = None) -> list[Target]:
    names = names if names is not None else peers_for(env, opts)
    if not names:
        return []
    env.log(f"  starting peers: {', '.join(names)}")
    peers = peer_targets(env, mock, names, opts.install_peers, {"bifrost": opts.bifrost_variants})
    for p in peers:
        if not p.available:
            report.peer_unavailable(p.label, p.reason)
        else:
            report.add_meta(f"peer {p.label}", p.version or "installed")
    if env.smoke:
        for p in peers:
            if p.name == "nginx" and not p.available:
                report.failures.append(f"nginx (required in smoke mode) is not available: {p.reason}")
    return peers


# --allocators: the shared objects LD_PRELOADed in place of glibc's malloc (Debian 12's packages,
# installed by scripts/setup: libjemalloc2 5.3.0, libmimalloc2.0 2.0.9).
ALLOCATORS = {"jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
              "mimalloc": "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"}


def baseline_targets(env: Env, config: dict, report: Report, tag: str = "weir-baseline",
                     headers: list[str] | None = None) -> list[Target]:
    """Weir variants measured beside build/bin/weir with the same `config` (and client `headers`), in the same
    rounds: the --baseline-bin weir ('weir (baseline)'), build/bin/weir under each --allocators malloc
    ('weir (jemalloc)', ...), and the --request-log, --no-access-log and --tracing twins. Empty when no option asked for one."""
    from targets import start_weir
    out = []
    if env.baseline:
        t = start_weir(env, "weir (baseline)", config, tag=tag, binary=str(env.baseline), name="weir-baseline",
                       headers=headers)
        report.add_meta("weir (baseline)", t.version or str(env.baseline))
        out.append(t)
    for a in env.allocators:
        t = start_weir(env, f"weir ({a})", config, tag=f"{tag}-{a}", name=f"weir-{a}",
                       extra_env={"LD_PRELOAD": ALLOCATORS[a]}, headers=headers)
        report.add_meta(f"weir ({a})", f"build/bin/weir with LD_PRELOAD={ALLOCATORS[a]}")
        out.append(t)
    if env.request_log:
        # The same config with every request's record stored in SQLite (a fresh file per run).
        cfg = json.loads(json.dumps(config))
        cfg["request_log"] = {"url": f"sqlite:{env.work / (tag + '-requests.db')}"}
        t = start_weir(env, "weir (request log)", cfg, tag=f"{tag}-requestlog", name="weir-requestlog",
                       headers=headers)
        report.add_meta("weir (request log)", "build/bin/weir with request_log: {url: sqlite:WORK/requests.db} "
                        "(queue 4096, batch 256, flush 100ms)")
        out.append(t)
    if env.no_access_log:
        # The same config with server.access_log off: what the access log's line and its write(2) cost.
        cfg = json.loads(json.dumps(config))
        cfg.setdefault("server", {})["access_log"] = "off"
        t = start_weir(env, "weir (no access log)", cfg, tag=f"{tag}-nolog", name="weir-nolog", headers=headers)
        report.add_meta("weir (no access log)", "build/bin/weir with server.access_log: off")
        out.append(t)
    if env.tracing:
        # The same config with every request traced (sample_ratio 1) and exported over OTLP/HTTP to a sink
        # on the load CPU (bench/harness/otlp_sink.py), as a collector would take them.
        sink, sink_url = start_otlp_sink(env, f"{tag}-otlp-sink")
        cfg = json.loads(json.dumps(config))
        cfg["tracing"] = {"otlp_endpoint": sink_url, "sample_ratio": 1.0}
        t = start_weir(env, "weir (tracing)", cfg, tag=f"{tag}-tracing", name="weir-tracing", headers=headers)
        t.companions.append(sink)
        t.sink_url = sink_url + "/"
        report.add_meta("weir (tracing)", "build/bin/weir with tracing: {otlp_endpoint: a sink on the load CPU, "
                        "sample_ratio: 1.0} (every request's spans exported; queue 2048, batch 256, flush 1s)")
        out.append(t)
    return out


def start_otlp_sink(env: Env, name: str):
    """bench/harness/otlp_sink.py on a free port on the load CPU: (its Proc, its base URL)."""
    import sys
    from procs import free_port, launch, wait_ready
    port = free_port()
    sink = launch(name, [sys.executable, str(pathlib.Path(__file__).with_name("otlp_sink.py")), str(port)],
                  env.work / "logs", cpu=env.load_cpu, priority=False)
    wait_ready(sink, port, 15, "/")
    return sink, f"http://127.0.0.1:{port}"


def twin_notes(targets: list[Target], report: Report) -> None:
    """For the --request-log and --tracing twins: how much of the work they did, from their /metrics (a store
    or a collector that fell behind drops, and dropped records cost less than stored ones)."""
    from procs import http_get
    for t in targets:
        if t.name not in ("weir-requestlog", "weir-tracing") or not t.alive():
            continue
        t.resume()  # the cells pause the targets they do not measure
        status, body = http_get(t.url + "/metrics", timeout=10)
        if status != 200:
            continue
        vals: dict[str, float] = {}
        for line in body.decode(errors="replace").splitlines():
            if line.startswith(("weir_request_log_", "weir_tracing_", "weir_requests_total")):
                name, _, v = line.rpartition(" ")
                key = name.split("{")[0] + ("{" + name.split("{", 1)[1] if "reason=" in name else "")
                vals[key] = vals.get(key, 0.0) + float(v)
        reqs = vals.get("weir_requests_total", 0)
        if t.name == "weir-requestlog":
            dropped = sum(v for k, v in vals.items() if k.startswith("weir_request_log_dropped_total"))
            report.note(f"{t.label}: {vals.get('weir_request_log_written_total', 0):,.0f} records stored, "
                        f"{dropped:,.0f} dropped, of {reqs:,.0f} requests")
        else:
            dropped = {k.split('"')[1]: v for k, v in vals.items() if k.startswith("weir_tracing_spans_dropped_total{")}
            report.note(f"{t.label}: {vals.get('weir_tracing_spans_exported_total', 0):,.0f} spans exported in "
                        f"{vals.get('weir_tracing_exports_total', 0):,.0f} requests to the sink, dropped "
                        + ", ".join(f"{k} {v:,.0f}" for k, v in dropped.items())
                        + f", of {reqs:,.0f} requests")


def stop_targets(targets: list[Target]) -> None:
    for t in targets:
        if t.kind != "direct":
            t.stop()


def live(targets: list[Target]) -> list[Target]:
    return [t for t in targets if t.available]


def ratio(peer_val, weir_val) -> float | None:
    """peer / weir for added latencies (µs); None when either is missing; inf when Weir's added latency
    is at or below zero (within the noise of the direct path) and the peer's is above it."""
    if peer_val is None or weir_val is None:
        return None
    if weir_val <= 0:
        return float("inf") if peer_val > 0 else None
    return peer_val / weir_val


def fmt_ratio(r) -> str:
    if r is None:
        return "– (both ≤ 0)"
    if r == float("inf"):
        return "∞ (Weir ≤ 0)"
    return f"{r:,.1f}×" if r < 100 else f"{r:,.0f}×"


PRETTY = {"litellm": "LiteLLM", "bifrost": "Bifrost", "portkey": "Portkey", "nginx": "nginx", "weir": "Weir",
          "weir-baseline": "Weir (baseline)", "weir-jemalloc": "Weir (jemalloc)", "weir-mimalloc": "Weir (mimalloc)",
          "weir-requestlog": "Weir (request log)", "weir-tracing": "Weir (tracing)"}


def gateway_failed(res: dict) -> str | None:
    """give_up rule for a round: most requests failed, so further rounds only cost time."""
    sched = res.get("scheduled") or 0
    if sched and res.get("errors_total", 0) > 0.5 * sched:
        return f"{res['errors_total']} of {sched} requests failed in round {res.get('round')}"
    if not res.get("target_alive", True):
        return "the gateway exited"
    return None


def sat_text(a: dict) -> str:
    """A short note for a cell's aggregate: errors, generator saturation (by kind), give-up."""
    notes = []
    if a.get("errors_total"):
        notes.append(f"{a['errors_total']} errors ({a['error_rate'] * 100:.3g} %: {a['errors_text'][:120]})")
    if a.get("generator_saturated"):
        notes.append(f"generator saturated in {a['saturated_rounds']}/{a['rounds']} rounds: "
                     + "; ".join(condense(a.get("saturation_reasons", []))))
    if a.get("gave_up"):
        notes.append(f"stopped after: {a['gave_up']}")
    return "; ".join(notes)


def condense(reasons: list[str]) -> list[str]:
    """weir-bench's saturation reasons, one per kind ("waited for a CPU N%" keeps the largest N)."""
    import re
    out, wait = [], 0
    for r in reasons:
        m = re.search(r"waited for a CPU (\d+)%", r)
        if m:
            wait = max(wait, int(m.group(1)))
        elif "sender lag" in r:
            if "sender lag p99 over --max-lag" not in out:
                out.append("sender lag p99 over --max-lag")
        elif r not in out:
            out.append(r)
    if wait:
        out.insert(0, f"it waited for a CPU up to {wait} % of the run (the mock shares its core)")
    return out


def ms(v_us, digits: int = 2) -> str:
    return us_ms(v_us, digits)


def added_cell(v_us, digits: int = 2) -> str:
    if v_us is None:
        return "–"
    return f"{v_us / 1000:+,.{digits}f}"


def base_targets(mock: Mock) -> list[Target]:
    return [direct(mock)]


__all__ = ["Options", "start_peers", "stop_targets", "live", "ratio", "fmt_ratio", "gateway_failed", "sat_text",
           "ms", "added_cell", "base_targets", "agg", "measure"]
