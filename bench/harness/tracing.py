"""Running a gateway under a tracing tool (strace -f -c, heaptrack) and reading what strace counted: shared by
the allocs suite (Weir under strace and heaptrack) and the latency suite (Weir and nginx under strace)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess

from procs import HarnessError
from targets import Target


def strace_argv(out_file: pathlib.Path) -> list[str]:
    """The wrapper that counts every syscall of the command and of every process it forks (-f: nginx's
    workers), written to out_file when the last of them exits."""
    return ["strace", "-f", "-c", "-o", str(out_file)]


def wrapped_pid(t: Target, exe: str) -> int | None:
    """The process running `exe` (basename) that the wrapper started: the child of the group leader (strace,
    heaptrack's shell) when there is one, else the first such process of the group (nginx's workers are
    children of its master, not of the wrapper)."""
    first = None
    for pid in t.proc.group_pids():
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != exe:
                continue
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == t.proc.pid:
            return pid
        first = first or pid
    return first


def stop_wrapped(t: Target, exe: str, timeout: float = 90) -> None:
    """SIGTERM to the wrapped process itself (Weir drains and exits 0; nginx's master stops its workers and
    exits); the wrapper then writes its output and exits."""
    pid = wrapped_pid(t, exe)
    if pid:
        os.kill(pid, signal.SIGTERM)
    try:
        t.proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    t.stop()


def strace_counts(out_file: pathlib.Path) -> dict[str, int]:
    """Calls per syscall from an `strace -c -o FILE` table (columns: % time, seconds, usecs/call, calls,
    [errors,] syscall; a `total` row last)."""
    text = out_file.read_text() if out_file.exists() else ""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            try:
                calls[f[-1]] = int(f[3])
            except ValueError:
                continue
    if not calls:
        raise HarnessError(f"strace -c wrote no table to {out_file}:\n{text[-500:]}")
    return calls
