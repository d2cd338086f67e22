"""Shared helpers for Weir's end-to-end tests: real processes on free ports.

Binaries
    ``binary("weir-mock")`` finds a built executable in ``$WEIR_BUILD_DIR``
    (default ``/work/main/build/bin``; a relative path is taken from the repo
    root, e.g. ``WEIR_BUILD_DIR=build-mock/bin``).

Processes
    ``start_process(argv, port)`` starts a real process, waits until
    ``127.0.0.1:port`` accepts TCP connections (polling connect() against a
    deadline, never a fixed sleep) and returns a :class:`Process`. Its stdout
    and stderr go to a log file (``Process.log_path``).

    The ``processes`` fixture (function scope) and ``module_processes``
    (module scope) are :class:`ProcessGroup` objects: everything started
    through them is terminated at teardown, also when the test fails, and the
    tail of each log is printed into the failure report.
    weir and weir-mock refuse a port another process listens on; the
    factories below then retry on a new free port (``on_a_free_port``).

weir-mock
    The ``mock`` fixture (and ``module_mock`` for a module-wide instance) is a
    factory: ``m = mock("--ttft-ms", "20")`` starts weir-mock on a free port
    and returns a :class:`Mock` with ``m.base_url`` (``http://127.0.0.1:PORT``),
    ``m.v1`` (``.../v1``, for ``openai.OpenAI(base_url=...)``) and
    ``m.metric(name, **labels)`` reading its ``/metrics`` counters.

weir
    The ``weir`` fixture (and ``module_weir``) is a factory:
    ``w = weir(upstream=mock)`` starts the gateway in quick mode
    (``--upstream``), ``w = weir(config={...})`` writes the dict as YAML
    (``listen``, ``workers`` and ``server.access_log`` filled in unless given)
    and runs ``--config``. Either way it listens on a free port, its access log
    goes to a file, and it is stopped at teardown. The :class:`Weir` has
    ``base_url``, ``v1``, ``client()`` (an ``openai.OpenAI`` without retries),
    ``metric(name, **labels)`` / ``metrics_text()`` for /metrics, and
    ``log_entries()`` / ``wait_log(pred)`` / ``log_for(request_id)`` for the
    access log (workers flush it every 50 ms, so these poll).
    Raw-socket helpers for tests about bytes on the wire are in httpwire.py.

Polling
    ``wait_until(predicate, timeout)`` polls a condition instead of sleeping.
    Conditions worth waiting for, rather than a sleep standing for them:
    ``read_by_peer(sock)`` (the process at the other end read all that was sent:
    e.g. a request that must be in Weir before the next one is sent),
    ``unread_by_peer(sock) > 0`` (what was sent waits in the peer's socket: e.g.
    for a SIGSTOPped Weir to find on SIGCONT),
    ``listens(port)`` (false once a draining weir closed its listener),
    ``connections_to(port)``, a metric, a log line. A deadline guards a
    slow-but-correct event generously (it costs nothing when things pass); a
    stopwatch that tells a fix from a defect measures against a slow path far
    away, on Weir's clock (the access log's ``duration_ms``) where it can, and
    makes its HTTP clients before the clock starts (one costs ~50 ms of CPU).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Iterable, Mapping, Sequence

import httpx
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_BUILD_DIR = pathlib.Path("/work/main/build/bin")


# ---------------------------------------------------------------------------
# Binaries and ports


def build_dir() -> pathlib.Path:
    """The directory holding built binaries: $WEIR_BUILD_DIR or /work/main/build/bin."""
    value = os.environ.get("WEIR_BUILD_DIR")
    if not value:
        return DEFAULT_BUILD_DIR
    path = pathlib.Path(value)
    return path if path.is_absolute() else REPO / path


def binary(name: str) -> pathlib.Path:
    """Path of the built executable ``name``; fails the test with a hint if missing."""
    path = build_dir() / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"{path} not found: build it (scripts/build, or cmake --build <dir> --target {name}) "
            f"or point WEIR_BUILD_DIR at the directory holding it",
            pytrace=False,
        )
    return path


# Ports: bench/harness/ports.py (shared with the benchmark harness, which runs beside these tests) hands
# them out below the kernel's ephemeral range, from a slice of their own, and tells whose listener a port is.
def _load_ports():
    import importlib.util
    spec = importlib.util.spec_from_file_location("weir_ports", REPO / "bench" / "harness" / "ports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ports = _load_ports()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, from the end-to-end tests' slice, not handed out before by
    this process (a small race with other processes remains: see on_a_free_port)."""
    return _ports.free_port("e2e", host)


def listens(port: int) -> bool:
    """Some socket listens on TCP ``port`` (any address) in this network namespace: e.g. a draining weir's workers
    close their client listeners first thing, so ``not listens(port)`` says the drain has begun in every worker."""
    return bool(_ports._listening_inodes(port))


def connections_to(port: int) -> int:
    """Established TCP connections whose remote port is `port` (this network namespace)."""
    return sum(1 for _, remote, state, _ in _ports.tcp_sockets() if state == "01" and remote == port)


def unread_by_peer(sock: socket.socket) -> int | None:
    """Bytes sent on the loopback TCP connection ``sock`` that the process at the other end has not read yet: the
    receive queue of the peer's socket (local and remote ports swapped) in /proc/net/tcp{,6}; None if there is no
    such socket (gone). A socket still in its listener's accept queue counts: the bytes are there for it."""
    mine, peer = sock.getsockname()[1], sock.getpeername()[1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, remote = int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16)
            if local == peer and remote == mine:
                return int(parts[4].split(":")[1], 16)
    return None


def read_by_peer(sock: socket.socket) -> bool:
    """True once the process at the other end of the loopback TCP connection ``sock`` has read every byte sent on
    it: the peer's socket (local and remote ports swapped) has an empty receive queue in /proc/net/tcp{,6}. What
    a test sent is then in that process, not in the kernel: a readiness condition, e.g. for requests whose order
    of arrival matters (wait_until(lambda: read_by_peer(s), ...)). False if not accepted yet, or gone."""
    return unread_by_peer(sock) == 0


def sigstop(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and wait until every thread of it is stopped: kill(2) returns before they are, and a
    thread still running meanwhile may accept or read what the caller sends next."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                status = open(f"/proc/{pid}/task/{t}/status").read()
            except FileNotFoundError:
                continue  # (a thread that exited)
            if "\nState:\tT" not in status:
                return False
        return True
    wait_until(stopped, timeout, message=f"process {pid} stopped")


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.005,
               message: str = "condition") -> object:
    """Polls ``predicate`` until it returns a truthy value (returned) or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def answers(url: str, statuses: Iterable[int] = (200,), timeout: float = 2.0) -> bool:
    """``GET url`` answered with one of ``statuses`` within ``timeout`` s; False on any transport error too. For
    ``wait_until(lambda: answers(...), 10)`` on a listener besides the one start_process waited for (the admin
    API's): it may not accept yet, or not answer until start-up ends (slow on a loaded machine), and each try
    that fails so is retried, not raised."""
    try:
        return httpx.get(url, timeout=timeout).status_code in tuple(statuses)
    except httpx.TransportError:
        return False


# ---------------------------------------------------------------------------
# Processes


@dataclasses.dataclass
class Process:
    """A started process that listens on ``host:port``."""

    name: str
    argv: list[str]
    host: str
    port: int
    popen: subprocess.Popen
    log_path: pathlib.Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; returns the exit status."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(timeout)
        return self.popen.returncode


def _wait_for_port(proc: Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise RuntimeError(
                f"{proc.name} exited with status {proc.popen.returncode} before listening on "
                f"{proc.host}:{proc.port}; its output:\n{proc.log()[-4000:]}")
        try:
            with socket.create_connection((proc.host, proc.port), timeout=0.2):
                # Ours, not another process's server on a port ours found taken (ours then exits).
                if _ports.owns_listener(proc.popen.pid, proc.port):
                    return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            proc.stop()
            raise RuntimeError(
                f"{proc.name} did not accept on {proc.host}:{proc.port} within {timeout}s; "
                f"its output:\n{proc.log()[-4000:]}")
        time.sleep(0.01)


def start_process(argv: Sequence[str | os.PathLike], port: int, *, host: str = "127.0.0.1",
                  env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                  log_dir: str | os.PathLike | None = None, ready_timeout: float = 10.0,
                  name: str | None = None) -> Process:
    """Starts ``argv`` and returns once ``host:port`` accepts connections.

    stdout and stderr go to ``<log_dir>/<name>-<port>.log``. The process gets
    its own session so stop() reaches its children too. Raises RuntimeError
    (with the log tail) if it exits or does not listen within
    ``ready_timeout`` s. Prefer ``processes.start(...)``, which also stops it.
    """
    argv = [str(a) for a in argv]
    name = name or pathlib.Path(argv[0]).name
    log_dir = pathlib.Path(log_dir) if log_dir else pathlib.Path("/tmp")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=full_env, cwd=cwd, start_new_session=True)
    proc = Process(name=name, argv=argv, host=host, port=port, popen=popen, log_path=log_path)
    _wait_for_port(proc, ready_timeout)
    return proc


# What weir and weir-mock say when another process already listens on their
# address (they refuse to share it without --reuse-port).
PORT_TAKEN = "is already in use by another process"


def on_a_free_port(start: Callable[[int], object], attempts: int = 3):
    """``start(port)`` on a port from free_port(), again on a new one if another process
    took it between the check and the bind (weir and weir-mock then exit at once)."""
    for attempt in range(attempts):
        try:
            return start(free_port())
        except RuntimeError as e:
            if PORT_TAKEN not in str(e) or attempt == attempts - 1:
                raise


class ProcessGroup:
    """Starts processes and guarantees they are stopped (see ``processes`` fixture)."""

    def __init__(self, log_dir: pathlib.Path):
        self.log_dir = log_dir
        self.started: list[Process] = []

    def start(self, argv: Sequence[str | os.PathLike], port: int, **kwargs) -> Process:
        proc = start_process(argv, port, log_dir=self.log_dir, **kwargs)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()

    def report(self, out=sys.stderr, lines: int = 40) -> None:
        for proc in self.started:
            tail = "\n".join(proc.log().splitlines()[-lines:])
            print(f"----- {proc.name} (pid {proc.pid}, port {proc.port}, exit {proc.popen.returncode}) "
                  f"log tail: {proc.log_path}\n{tail}", file=out)


def _group_fixture(request, tmp_path_factory):
    group = ProcessGroup(tmp_path_factory.mktemp("procs"))
    failures_before = request.session.testsfailed
    yield group
    group.stop_all()
    if request.session.testsfailed > failures_before:
        group.report()


@pytest.fixture
def processes(request, tmp_path_factory):
    """A ProcessGroup whose processes are stopped when the test ends."""
    yield from _group_fixture(request, tmp_path_factory)


@pytest.fixture(scope="module")
def module_processes(request, tmp_path_factory):
    """A ProcessGroup whose processes are stopped when the module's tests end."""
    yield from _group_fixture(request, tmp_path_factory)


# ---------------------------------------------------------------------------
# Prometheus text and weir-mock

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample line of a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: v.encode().decode("unicode_escape") for k, v in _LABEL.findall(m.group(2) or "")}
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def metric_value(samples: Iterable[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(v for n, lbl, v in samples if n == name and all(lbl.get(k) == str(x) for k, x in labels.items()))


@dataclasses.dataclass
class Mock:
    """A running weir-mock."""

    process: Process

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def v1(self) -> str:
        return self.process.base_url + "/v1"

    def metrics_text(self) -> str:
        return httpx.get(self.base_url + "/metrics", timeout=5).text

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        return parse_prometheus(self.metrics_text())

    def metric(self, name: str, **labels: str) -> float:
        """Current value of a counter/gauge (summed over matching label sets)."""
        return metric_value(self.metrics(), name, **labels)

    def aborts(self) -> float:
        return self.metric("vllm:request_success_total", finished_reason="abort")


class MockFactory:
    """Callable: ``factory(*flags)`` starts weir-mock with ``flags`` on a free port."""

    def __init__(self, group: ProcessGroup):
        self.group = group

    def __call__(self, *flags: str | int | float, ready_timeout: float = 10.0) -> Mock:
        def start(port: int) -> Mock:
            argv = [binary("weir-mock"), "--listen", f"127.0.0.1:{port}", *map(str, flags)]
            return Mock(self.group.start(argv, port, ready_timeout=ready_timeout, name="weir-mock"))
        return on_a_free_port(start)


@pytest.fixture
def mock(processes) -> MockFactory:
    """Factory for weir-mock instances stopped at the end of the test."""
    return MockFactory(processes)


@pytest.fixture(scope="module")
def module_mock(module_processes) -> MockFactory:
    """Factory for weir-mock instances shared by a module's tests."""
    return MockFactory(module_processes)


# ---------------------------------------------------------------------------
# weir (the gateway)


def to_yaml(value, indent: int = 0) -> str:
    """A small YAML emitter for test configs: dicts, lists, str (quoted), int, float, bool, None."""
    pad = "  " * indent

    def scalar(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        return json.dumps(str(v))  # a JSON string is a YAML double-quoted scalar

    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            k = scalar(k)  # keys quoted too: "*" and "a:b" are not plain YAML
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:\n{to_yaml(v, indent + 1)}")
            elif isinstance(v, dict):
                lines.append(f"{pad}{k}: {{}}")
            elif isinstance(v, list):
                lines.append(f"{pad}{k}: []")
            else:
                lines.append(f"{pad}{k}: {scalar(v)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for v in value:
            if isinstance(v, (dict, list)) and v:
                inner = to_yaml(v, indent + 1).lstrip()
                lines.append(f"{pad}- {inner}")
            else:
                lines.append(f"{pad}- {scalar(v)}")
        return "\n".join(lines)
    return pad + scalar(value)


@dataclasses.dataclass
class Weir:
    """A running weir: ``base_url``, ``v1`` (for openai.OpenAI), the access log and /metrics."""

    process: Process
    access_log_path: pathlib.Path
    config_path: pathlib.Path | None
    # Where metrics_text() scrapes: the client port, or the admin listener when /metrics is its only
    # (server.metrics.client_port's default with tenants and admin.listen).
    metrics_url: str | None = None

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def v1(self) -> str:
        return self.process.base_url + "/v1"

    def client(self, **kw):
        """An openai.OpenAI client pointed at this weir (no SDK retries: a test sees every error)."""
        import openai
        kw.setdefault("api_key", "test")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        return openai.OpenAI(base_url=self.v1, **kw)

    # /metrics
    def metrics_text(self) -> str:
        r = httpx.get(self.metrics_url or self.base_url + "/metrics", timeout=10)
        assert r.status_code == 200, r.text
        return r.text

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        return parse_prometheus(self.metrics_text())

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    # the access log (one JSON object per line; workers flush every 50 ms)
    def log_entries(self) -> list[dict]:
        try:
            text = self.access_log_path.read_text()
        except FileNotFoundError:
            return []
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines = lines[:-1]  # a line being written
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise AssertionError(f"access log line is not JSON: {line!r}") from e
        return out

    def wait_log(self, predicate: Callable[[list[dict]], bool] = bool, timeout: float = 5.0,
                 message: str = "access log") -> list[dict]:
        """Polls the access log until ``predicate(entries)`` holds; returns the entries."""
        found: list[list[dict]] = []

        def check():
            entries = self.log_entries()
            if predicate(entries):
                found.append(entries)
                return True
            return False

        wait_until(check, timeout, interval=0.01, message=message)
        return found[0]

    def log_for(self, request_id: str, timeout: float = 5.0) -> dict:
        """The access-log line of ``request_id``; waits for it and asserts there is exactly one."""
        entries = self.wait_log(lambda es: any(e.get("request_id") == request_id for e in es), timeout,
                                message=f"access log line for request {request_id}")
        mine = [e for e in entries if e.get("request_id") == request_id]
        assert len(mine) == 1, f"{len(mine)} access log lines for {request_id}: {mine}"
        return mine[0]

    # SIGHUP
    _RELOAD_SAID = re.compile(r"configuration (reloaded from|reload refused|reload failed)")

    def reloads_said(self) -> int:
        """The reloads Weir has said on stderr (a line each: reloaded, refused or failed)."""
        return len(self._RELOAD_SAID.findall(self.process.log()))

    def sighup(self, expect: str = "success", timeout: float = 10.0) -> None:
        """SIGHUP, then waits until the reload is counted as ``expect`` (weir_config_reloads_total{result}) and
        said on stderr: Weir counts it, then writes its line, so a log read at the count could miss the line."""
        before, said = self.metric("weir_config_reloads_total", result=expect), self.reloads_said()
        os.kill(self.process.pid, signal.SIGHUP)
        wait_until(lambda: self.metric("weir_config_reloads_total", result=expect) > before, timeout,
                   message=f"a reload counted as {expect}")
        wait_until(lambda: self.reloads_said() > said, timeout, message="the reload's line on stderr")

    def upstream_id(self, request_id: str, timeout: float = 5.0) -> str:
        """The x-request-id Weir sent upstream for the client's own ``request_id`` (the log's
        upstream_request_id): that id, "-", and a generated one (28 hex digits)."""
        up = self.log_for(request_id, timeout)["upstream_request_id"]
        assert up.startswith(request_id + "-") and len(up) == len(request_id) + 29, up
        return up


def metrics_url(config: dict | None) -> str | None:
    """The admin listener's /metrics when the client port does not serve it: tenants and admin.listen
    configured and server.metrics.client_port left to its default (docs/observability.md)."""
    if not config or not config.get("tenants"):
        return None
    listen = (config.get("admin") or {}).get("listen")
    if not listen or "client_port" in ((config.get("server") or {}).get("metrics") or {}):
        return None
    return f"http://{listen}/metrics"


class WeirFactory:
    """Callable: starts weir on a free port and returns a :class:`Weir`.

    ``factory(upstream=mock)`` runs quick mode (``--upstream``);
    ``factory(config={...})`` writes the dict as YAML (``listen`` and
    ``server.access_log`` filled in unless given) and runs ``--config``.
    The access log always goes to a file. Everything is stopped at teardown.
    """

    def __init__(self, group: ProcessGroup):
        self.group = group
        self.count = 0

    def __call__(self, upstream: "Mock | str | None" = None, *, config: dict | None = None,
                 workers: int = 2, extra_args: Sequence[str] = (), ready_timeout: float = 10.0,
                 env: Mapping[str, str] | None = None) -> Weir:
        assert (upstream is None) != (config is None), "give upstream= (quick mode) or config="
        if config is not None and "listen" in config:
            return self._start(config["listen"].rsplit(":", 1)[1], upstream, config, workers, extra_args,
                               ready_timeout, env)
        return on_a_free_port(lambda port: self._start(port, upstream, config, workers, extra_args,
                                                       ready_timeout, env))

    def _start(self, port, upstream, config, workers, extra_args, ready_timeout, env) -> Weir:
        self.count += 1
        port = int(port)
        access_log = self.group.log_dir / f"weir-{port}-{self.count}.access.log"
        config_path = None
        argv: list[str | os.PathLike] = [binary("weir")]
        if upstream is not None:
            url = upstream.base_url if isinstance(upstream, Mock) else upstream
            argv += ["--listen", f"127.0.0.1:{port}", "--upstream", url, "-w", str(workers),
                     "--access-log", str(access_log)]
        else:
            cfg = json.loads(json.dumps(config))  # deep copy
            cfg.setdefault("listen", f"127.0.0.1:{port}")
            port = int(str(cfg["listen"]).rsplit(":", 1)[1])
            cfg.setdefault("workers", workers)
            server = cfg.setdefault("server", {})
            server.setdefault("access_log", str(access_log))
            access_log = pathlib.Path(server["access_log"])
            config_path = self.group.log_dir / f"weir-{port}-{self.count}.yaml"
            config_path.write_text(to_yaml(cfg) + "\n")
            argv += ["--config", config_path]
        argv += list(extra_args)
        proc = self.group.start(argv, port, ready_timeout=ready_timeout, name="weir", env=env)
        # The listener accepts (into the backlog) as soon as a worker binds it; weir writes its
        # start-up line after every worker has started. Tests read that line, so wait for it.
        wait_until(lambda: "weir: listening on" in proc.log() or not proc.alive(), ready_timeout,
                   message="weir's start-up line")
        return Weir(proc, access_log, config_path, metrics_url(config))


@pytest.fixture
def weir(processes) -> WeirFactory:
    """Factory for weir instances stopped at the end of the test."""
    return WeirFactory(processes)


@pytest.fixture(scope="module")
def module_weir(module_processes) -> WeirFactory:
    """Factory for weir instances shared by a module's tests."""
    return WeirFactory(module_processes)


# --- redis-server (shared limits, keys in Redis) ---

class Redis:
    def __init__(self, tmp_path):
        self.port = free_port()
        self.dir = tmp_path
        self.proc: subprocess.Popen | None = None
        self.started = False  # start() succeeded once: a restart stays on the same port

    def start(self):
        exe = shutil.which("redis-server")
        if not exe:
            pytest.fail("redis-server not installed: run scripts/setup", pytrace=False)
        for attempt in range(3):
            self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                          "--appendonly", "no", "--dir", str(self.dir)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            # Ours answering, not another process's server on a port ours found taken (ours then exits).
            wait_until(lambda: self.proc.poll() is not None or
                       (self.ping() and _ports.holds_listener([self.proc.pid], self.port)), 10,
                       message=f"redis-server on {self.port} answering PING")
            if self.proc.poll() is None:
                self.started = True
                return
            if self.started or attempt == 2:  # a restart keeps its port (the tests' Weir points at it)
                pytest.fail(f"redis-server exited (status {self.proc.returncode}) on port {self.port}", pytrace=False)
            self.port = free_port()

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def cli(self, *args: str) -> bytes:
        """Sends one command (RESP); returns the start of the raw reply."""
        payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(payload.encode())
            return s.recv(65536)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    r.start()
    yield r
    r.kill()
