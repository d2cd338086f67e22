"""What the harness measures: the mock, the direct path to it, Weir, and the peer gateways.

A :class:`Target` is one way a client reaches the mock: its base URL, the
headers and model name a client must send, and (except for ``direct``) the
gateway process, pinned to the gateway CPU. Peers come from
``bench/peers/NAME/{setup,start,peer.env}`` (see bench/peers/README.md).
"""

from __future__ import annotations

import configs
import json
import os
import pathlib
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field

from procs import HarnessError, Proc, free_port, http_get, launch, wait_ready

REPO = pathlib.Path(__file__).resolve().parents[2]
PEERS_DIR = REPO / "bench" / "peers"
PEER_ORDER = ["nginx", "litellm", "bifrost", "portkey"]
# What weir and weir-mock print (and exit 1) when another process listens on their port.
PORT_TAKEN = "is already in use by another process"


@dataclass
class Env:
    """Where and how a suite runs (filled in by main.py)."""
    bin_dir: pathlib.Path
    work: pathlib.Path            # temp dir: configs, logs, raw JSON
    gateway_cpu: int
    load_cpu: int
    priority: bool
    smoke: bool
    rounds: int
    verbose: bool = True
    baseline: pathlib.Path | None = None  # --baseline-bin: a second weir binary measured beside build/bin/weir
    allocators: tuple[str, ...] = ()      # --allocators: build/bin/weir again under each LD_PRELOADed malloc
    request_log: bool = False             # --request-log: build/bin/weir again with request_log: (SQLite) on
    tracing: bool = False                 # --tracing: build/bin/weir again with tracing: (OTLP to a sink) on
    no_access_log: bool = False           # --no-access-log: build/bin/weir again with server.access_log: off

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise HarnessError(f"{path} is missing: build it with scripts/build release weir weir-mock weir-bench")
        return str(path)

    def log(self, msg: str) -> None:
        if self.verbose:
            print(msg, flush=True)


# ------------------------------------------------------------------ mock ---

class Mock:
    """weir-mock on a free port, pinned to the load CPU (with the load generator)."""

    def __init__(self, env: Env, name: str = "mock", ttft_ms: int = 90, itl_ms: int = 14,
                 max_tokens: int = 128, threads: int = 1, extra: list[str] | None = None,
                 tls: "configs.TlsFiles | None" = None):
        """`tls`: serve HTTPS on the port (weir-mock --tls-cert/--tls-key) with that certificate; the harness's
        own requests to it (readiness, /metrics) trust `tls.ca`."""
        self.env = env
        self.name = name
        self.proc: Proc | None = None
        self.tls = tls
        self.ssl_context = None
        if tls is not None:
            import ssl
            self.ssl_context = ssl.create_default_context(cafile=str(tls.ca))
        for attempt in range(3):
            self.port = free_port()
            try:
                self._start(ttft_ms, itl_ms, max_tokens, threads, extra)
                break
            except HarnessError as e:
                # Another run's process took the port after free_port(): weir-mock
                # refuses to share it (no --reuse-port), so try another one.
                if PORT_TAKEN not in str(e) or attempt == 2:
                    raise

    def _start(self, ttft_ms: int, itl_ms: int, max_tokens: int, threads: int, extra: list[str] | None) -> None:
        self.flags = dict(ttft_ms=ttft_ms, itl_ms=itl_ms, max_tokens=max_tokens, threads=threads)
        argv = [self.env.binary("weir-mock"), "--listen", f"127.0.0.1:{self.port}", "--any-model",
                "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--max-tokens", str(max_tokens),
                "--threads", str(threads), "--stamp"] + (extra or [])
        if self.tls is not None:
            argv += ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
        self.proc = launch(self.name, argv, self.env.work / "logs", cpu=self.env.load_cpu,
                           priority=self.env.priority)
        wait_ready(self.proc, self.port, 15, "/health", context=self.ssl_context)

    def restart(self, ttft_ms: int, itl_ms: int, max_tokens: int = 128, threads: int = 1,
                extra: list[str] | None = None) -> None:
        """Same port, new timing: the gateways already pointed here reconnect to the new mock."""
        self.proc.stop()
        deadline = time.monotonic() + 10
        while True:
            try:
                self._start(ttft_ms, itl_ms, max_tokens, threads, extra)
                return
            except HarnessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://127.0.0.1:{self.port}"

    def describe(self) -> str:
        f = self.flags
        return (f"weir-mock --ttft-ms {f['ttft_ms']} --itl-ms {f['itl_ms']} --max-tokens {f['max_tokens']} "
                f"--threads {f['threads']}" + (" --tls-cert … --tls-key …" if self.tls is not None else ""))

    def metrics(self) -> str:
        status, body = http_get(self.url + "/metrics", timeout=5, context=self.ssl_context)
        return body.decode(errors="replace") if status == 200 else ""

    def running(self) -> int:
        m = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", self.metrics(), re.M)
        return int(float(m.group(1))) if m else -1

    def lag_buckets(self) -> list[tuple[float, float]]:
        """Cumulative (le seconds, count) of weir_mock_token_lag_seconds (how late the mock sent tokens)."""
        out = []
        for m in re.finditer(r'^weir_mock_token_lag_seconds_bucket\{([^}]*)\} ([0-9.e+]+)$', self.metrics(), re.M):
            le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
            out.append((float("inf") if le == "+Inf" else float(le), float(m.group(2))))
        out.sort()
        return out

    def stop(self) -> None:
        self.proc.stop()


def lag_p99_ms(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float | None:
    """Upper bound (bucket edge, ms) of the p99 of the mock's token lag between two scrapes."""
    if not before or not after or len(before) != len(after):
        return None
    delta = [(le, a - b) for (le, b), (_, a) in zip(before, after)]
    total = delta[-1][1]
    if total <= 0:
        return None
    for le, c in delta:
        if c >= 0.99 * total:
            return le * 1000.0
    return None


# --------------------------------------------------------------- targets ---

@dataclass
class Target:
    name: str                      # direct, weir, nginx, litellm, portkey, bifrost
    label: str                     # shown in tables: "weir (all controls)", "bifrost (logging-off)"
    kind: str = "gateway"          # "direct" or "gateway"
    url: str = ""
    model: str = "mock-model"
    path_prefix: str = ""
    headers: list[str] = field(default_factory=list)   # "Name: value"
    proc: Proc | None = None
    port: int = 0
    available: bool = True
    reason: str = ""               # why not available / what went wrong
    version: str = ""
    ready_path: str = "/health"
    ready_timeout: float = 30.0
    companions: list = field(default_factory=list)  # processes that live and stop with it (the OTLP sink)
    sink_url: str = ""             # --tracing: the sink's counts (GET)

    @property
    def chat_url(self) -> str:
        return f"{self.url}{self.path_prefix}/v1/chat/completions"

    def pause(self) -> None:
        if self.proc:
            self.proc.pause()

    def resume(self) -> None:
        if self.proc:
            self.proc.resume()

    def stop(self) -> None:
        if self.proc:
            self.proc.stop(grace=15)
            self.proc = None
        for c in self.companions:
            c.stop(grace=5)
        self.companions = []

    def alive(self) -> bool:
        return self.kind == "direct" or (self.proc is not None and self.proc.alive())

    def cpu_seconds(self) -> float:
        return self.proc.cpu_seconds() if self.proc else 0.0

    def cpu_split(self) -> tuple[float, float]:
        return self.proc.cpu_split() if self.proc else (0.0, 0.0)

    def cpu_ns(self) -> int:
        return self.proc.cpu_ns() if self.proc else 0

    def memory_kb(self) -> dict[str, int]:
        return self.proc.memory_kb() if self.proc else {"rss_kb": 0, "hwm_kb": 0}


def direct(mock: Mock) -> Target:
    return Target(name="direct", label="direct (no gateway)", kind="direct", url=mock.url)


def weir_version(env: Env, binary: str | None = None) -> str:
    """`weir --version` and the binary's build time (others may rebuild build/ between runs)."""
    path = binary or env.binary("weir")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
        version = out.stdout.strip() or out.stderr.strip()
        mtime = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.stat(path).st_mtime))
        return f"{version} ({'--baseline-bin' if binary else 'build/bin/weir'} of {mtime})"
    except (OSError, subprocess.TimeoutExpired):
        return ""


def start_weir(env: Env, label: str, config: dict, tag: str = "weir", headers: list[str] | None = None,
               model: str = "mock-model", wrapper: list[str] | None = None,
               stop_signal: int = signal.SIGTERM, binary: str | None = None, name: str = "weir",
               extra_env: dict[str, str] | None = None) -> Target:
    """Writes `config` (JSON is YAML) with a free `listen` port and starts `weir --config` on the gateway CPU.

    `wrapper` (e.g. heaptrack or strace argv) goes before the weir binary; `binary` replaces build/bin/weir
    (the --baseline-bin build); `extra_env` is added to its environment (LD_PRELOAD for --allocators)."""
    for attempt in range(3):
        port = free_port()
        cfg = dict(config)
        cfg["listen"] = f"127.0.0.1:{port}"
        cfg.setdefault("workers", 1)
        if cfg.get("server", {}).get("access_log") == configs.ACCESS_LOG_FILE:
            # A file of this target's own in the work dir (kept with --keep-work), as in production.
            cfg["server"] = dict(cfg["server"], access_log=str(env.work / f"{tag}-access.log"))
        path = env.work / f"{tag}.yaml"
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        argv = list(wrapper or []) + [binary or env.binary("weir"), "--config", str(path)]
        t = Target(name=name, label=label, url=f"http://127.0.0.1:{port}", port=port, model=model,
                   headers=list(headers or []), version=weir_version(env, binary))
        t.proc = launch(tag, argv, env.work / "logs", cpu=env.gateway_cpu, priority=env.priority,
                        stop_signal=stop_signal, env=extra_env)
        try:
            wait_ready(t.proc, port, 60 if wrapper else 15, "/health")
            return t
        except HarnessError as e:
            # Another process took the port after free_port(): Weir refuses to share it.
            if PORT_TAKEN not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


# ----------------------------------------------------------------- peers ---

def read_peer_env(name: str, upstream: str) -> dict:
    kv: dict[str, str] = {}
    for line in (PEERS_DIR / name / "peer.env").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        kv[k.strip()] = v.strip()
    headers = []
    for h in filter(None, (x.strip() for x in kv.get("HEADERS", "").split(" | "))):
        k, _, v = h.partition(":")
        headers.append(f"{k.strip()}: {v.strip().replace('{upstream}', upstream.rstrip('/'))}")
    return {
        "model": kv.get("MODEL", "mock-model"),
        "path_prefix": kv.get("PATH_PREFIX", "").rstrip("/"),
        "headers": headers,
        "variants": kv.get("VARIANTS", "default").split() or ["default"],
        "ready_path": kv.get("READY_PATH", "/"),
        "ready_timeout": float(kv.get("READY_TIMEOUT_S", "60")),
        "stop_signal": getattr(signal, "SIG" + kv.get("STOP_SIGNAL", "TERM")),
    }


_installed_cache: dict[str, tuple[bool, str]] = {}


def peer_installed(name: str, install: bool, env: Env) -> tuple[bool, str]:
    """(True, version) or (False, reason). With `install`, runs NAME/setup once when --check fails."""
    if name in _installed_cache:
        return _installed_cache[name]
    setup = PEERS_DIR / name / "setup"
    if not os.access(setup, os.X_OK):
        res = (False, f"bench/peers/{name}/setup is missing (peer not set up in this tree)")
        _installed_cache[name] = res
        return res

    def check() -> tuple[bool, str]:
        r = subprocess.run([str(setup), "--check"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return True, (r.stdout.strip().splitlines() or [""])[-1]
        reason = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["setup --check failed"])[-1]
        return False, reason

    ok, info = check()
    if not ok and install:
        env.log(f"  peer {name}: not installed ({info}); running bench/peers/{name}/setup")
        r = subprocess.run([str(setup)], capture_output=True, text=True, timeout=1800)
        if r.returncode == 0:
            ok, info = check()
        else:
            info = (r.stderr.strip().splitlines() or [f"setup exited {r.returncode}"])[-1]
    reason_file = PEERS_DIR / name / "install" / "REASON"
    if not ok and reason_file.exists():
        info = reason_file.read_text().strip().splitlines()[-1] if reason_file.read_text().strip() else info
    _installed_cache[name] = (ok, info)
    return ok, info


def peer_label(name: str, variant: str, default_variant: str) -> str:
    return name if variant == default_variant else f"{name} ({variant})"


def peer_targets(env: Env, mock: Mock, names: list[str], install: bool,
                 variants: dict[str, list[str]] | None = None, wrapper: list[str] | None = None,
                 tag_suffix: str = "") -> list[Target]:
    """Starts every requested peer (and variant) against `mock`, in parallel; unavailable ones keep a reason.

    `variants[name]` lists the variants to run (default: the peer's default). `wrapper` (e.g. strace argv)
    goes before the peer's start script; `tag_suffix` keeps such a start's log apart."""
    out: list[Target] = []
    pending: list[Target] = []
    for name in names:
        if not (PEERS_DIR / name / "peer.env").exists():
            out.append(Target(name=name, label=name, available=False,
                              reason=f"bench/peers/{name} is not there (peer not set up)"))
            continue
        pe = read_peer_env(name, mock.url)
        wanted = (variants or {}).get(name) or [pe["variants"][0]]
        ok, info = peer_installed(name, install, env)
        for variant in wanted:
            label = peer_label(name, variant, pe["variants"][0])
            t = Target(name=name, label=label, model=pe["model"], path_prefix=pe["path_prefix"],
                       headers=pe["headers"], ready_path=pe["ready_path"], ready_timeout=pe["ready_timeout"])
            if not ok:
                t.available, t.reason = False, f"cannot be installed here: {info}"
                out.append(t)
                continue
            t.version = info
            t.port = free_port()
            t.url = f"http://127.0.0.1:{t.port}"
            tag = f"peer-{name}-{variant}{tag_suffix}"
            # Each start makes its temp dir with mktemp -t: keep them in the run's work dir.
            tmp = env.work / "peer-tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            try:
                t.proc = launch(tag, list(wrapper or []) + [str(PEERS_DIR / name / "start"), mock.url, str(t.port),
                                      variant],
                                env.work / "logs", cpu=env.gateway_cpu, priority=env.priority,
                                env={"TMPDIR": str(tmp)}, stop_signal=pe["stop_signal"])
            except HarnessError as e:
                t.available, t.reason = False, str(e)
                out.append(t)
                continue
            out.append(t)
            pending.append(t)
    # Wait for all of them together (LiteLLM takes long to import; the others are quick).
    for t in pending:
        start = time.monotonic()
        try:
            wait_ready(t.proc, t.port, t.ready_timeout, t.ready_path)
            env.log(f"  peer {t.label} ({t.version}) ready on :{t.port} after {time.monotonic() - start:.1f} s")
        except HarnessError as e:
            t.available = False
            t.reason = "did not start: " + str(e).splitlines()[0]
            tail = t.proc.log_tail(5) if t.proc else ""
            if tail:
                t.reason += " | log: " + " / ".join(tail.splitlines()[-3:])
            t.stop()
    return out
