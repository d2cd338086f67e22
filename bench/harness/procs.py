"""Processes for the benchmark harness: free ports, pinned launches, readiness, stop, /proc readings.

Every process the harness starts goes through :func:`launch`, which pins it to
one CPU (``sched_setaffinity``, what ``taskset -c`` does), puts it in its own
session (so the whole process group can be paused, resumed and stopped) and,
when the harness runs as root and ``priority`` is on, gives that session's
autogroup nice -10 so the measured processes are not starved by whatever else
the shared machine runs (compilers). Every started process is registered and
:func:`stop_all` (called on exit, on SIGINT/SIGTERM and on failure) stops them.
"""

from __future__ import annotations

import errno
import os
import pathlib
import resource
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Mapping, Sequence

import ports

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
SCHEDSTAT = pathlib.Path("/proc/self/schedstat").exists()

_registry: list["Proc"] = []
_registry_lock = threading.Lock()


class HarnessError(RuntimeError):
    """A failure of the harness or of a process it needs (not a measurement result)."""


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE (soft and, as root, hard) so 10k-stream runs fit; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20
    try:
        nr_open = int(pathlib.Path("/proc/sys/fs/nr_open").read_text())
        want = min(want, nr_open)
    except OSError:
        pass
    if os.geteuid() == 0 and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            pass
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft
    return hard


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, from the harness's slice (ports.py), not handed
    out before by this process."""
    return ports.free_port("bench")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 2.0,
             context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """GET url; returns (status, body); status 0 when the connection failed. `context`: an https URL's trust."""
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() if e.fp else b""
    except (urllib.error.URLError, OSError, ConnectionError):
        return 0, b""


def priority_available() -> bool:
    return os.geteuid() == 0 and pathlib.Path("/proc/self/autogroup").exists()


def _preexec(cpu: int | None, priority: bool) -> Callable[[], None]:
    def setup() -> None:
        os.setsid()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        if priority:
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write("-10")
            except OSError:
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return setup


class Proc:
    """A started process group: the harness's handle on it."""

    def __init__(self, name: str, argv: Sequence[str], log_path: pathlib.Path, popen: subprocess.Popen,
                 stop_signal: int, cpu: int | None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.popen = popen
        self.stop_signal = stop_signal
        self.cpu = cpu
        self.paused = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def group_pids(self) -> list[int]:
        """Pids of every live process in this process group (the leader first)."""
        pids = ports.group_pids(self.pid)
        pids.sort(key=lambda p: (p != self.pid, p))
        return pids

    def cpu_split(self) -> tuple[float, float]:
        """(utime, stime) of every process in the group, in seconds (/proc/PID/stat fields 14, 15):
        the gateway's own code and the kernel's work for it, apart."""
        user = system = 0
        for pid in self.group_pids():
            try:
                stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            user += int(fields[11])
            system += int(fields[12])
        return user / CLK_TCK, system / CLK_TCK

    def cpu_seconds(self) -> float:
        """utime + stime of every process in the group, in seconds (/proc/PID/stat fields 14, 15)."""
        return sum(self.cpu_split())

    def cpu_ns(self) -> int:
        """CPU time of every thread in the group, in ns: the scheduler's per-thread runtime
        (/proc/PID/task/TID/schedstat, field 1), the same quantity as utime + stime without their
        10 ms clock-tick rounding (a concurrency-1 stream run costs a gateway a few ms). Without
        schedstat (a kernel without CONFIG_SCHED_INFO) it is utime + stime. Threads that already
        exited are not counted (the gateways' threads live as long as they do)."""
        if not SCHEDSTAT:
            return int(self.cpu_seconds() * 1e9)
        total = 0
        for pid in self.group_pids():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    total += int(pathlib.Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    continue     # the thread exited meanwhile
        return total

    def memory_kb(self) -> dict[str, int]:
        """VmRSS and VmHWM summed over the group, in KiB (/proc/PID/status)."""
        rss = hwm = 0
        for pid in self.group_pids():
            try:
                for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        hwm += int(line.split()[1])
            except OSError:
                continue
        return {"rss_kb": rss, "hwm_kb": hwm}

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def pause(self) -> None:
        """SIGSTOP the group: an idle gateway takes no CPU while another one is measured."""
        if self.alive() and not self.paused:
            self.signal_group(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.signal_group(signal.SIGCONT)
            self.paused = False

    def stop(self, grace: float = 10.0) -> int | None:
        """Stop signal to the group (after SIGCONT), SIGKILL after `grace` s; returns the exit status."""
        if self.alive():
            self.signal_group(signal.SIGCONT)
            self.paused = False
            self.signal_group(self.stop_signal)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                try:
                    self.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        # Leftover group members (workers of a leader that exited first).
        if self.group_pids():
            self.signal_group(signal.SIGKILL)
        with _registry_lock:
            if self in _registry:
                _registry.remove(self)
        return self.popen.returncode


def launch(name: str, argv: Sequence[str], log_dir: pathlib.Path, *, cpu: int | None, priority: bool,
           env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
           stop_signal: int = signal.SIGTERM, stdout: int | None = None) -> Proc:
    """Start argv pinned to `cpu` in its own session; stdout+stderr to LOG_DIR/NAME.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "ab")
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        popen = subprocess.Popen(list(map(str, argv)), stdout=stdout if stdout is not None else log,
                                 stderr=log, stdin=subprocess.DEVNULL, env=full_env, cwd=cwd,
                                 preexec_fn=_preexec(cpu, priority))
    except OSError as e:
        raise HarnessError(f"{name}: cannot start {argv[0]}: {e}") from e
    finally:
        log.close()
    proc = Proc(name, argv, log_path, popen, stop_signal, cpu)
    with _registry_lock:
        _registry.append(proc)
    return proc


def wait_ready(proc: Proc, port: int, timeout: float, http_path: str | None = None,
               headers: Mapping[str, str] | None = None, context: ssl.SSLContext | None = None) -> None:
    """Wait until `port` accepts connections (and GET http_path answers below 500); raise on exit/timeout.
    With `context` the GET is https, trusting what the context trusts."""
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise HarnessError(f"{proc.name} exited with status {proc.popen.returncode} before it served:\n"
                               f"{proc.log_tail()}")
        # Ours, not another process's server on a port ours found taken (ours then exits: the callers retry).
        if port_open(port) and ports.owns_listener(proc.pid, port):
            if http_path is None:
                return
            scheme = "https" if context is not None else "http"
            status, _ = http_get(f"{scheme}://127.0.0.1:{port}{http_path}", headers, context=context)
            if 0 < status < 500:
                return
        if time.monotonic() > deadline:
            raise HarnessError(f"{proc.name} did not serve on port {port} within {timeout:.0f} s:\n"
                               f"{proc.log_tail()}")
        time.sleep(0.05)


def stop_all() -> None:
    """Stop every process the harness started (in reverse start order)."""
    with _registry_lock:
        procs = list(reversed(_registry))
    for p in procs:
        try:
            p.stop(grace=5.0)
        except Exception:   # noqa: BLE001 - best effort at exit
            pass


def loadavg() -> tuple[float, float, float]:
    a, b, c = pathlib.Path("/proc/loadavg").read_text().split()[:3]
    return float(a), float(b), float(c)
