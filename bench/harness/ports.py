"""Loopback ports for the processes the end-to-end tests and the benchmark harness start.

Both run at once on one host (scripts/test runs the benchmark smoke beside the end-to-end tests, and some
tests run bench/run themselves), so a port one of them picks must not be one the other picks or the kernel
hands out. Two rules:

- :func:`free_port` hands out ports *below* the kernel's ephemeral range (net.ipv4.ip_local_port_range,
  32768-60999 by default), where no ``bind(0)`` listener and no outgoing connection's local port lands, from a
  slice of its own per kind of process (the benchmark harness; the end-to-end tests, one slice per pytest-xdist
  worker), starting at a random place in the slice and never twice in one process.
- :func:`owns_listener` tells whether the listener on a port is the started process's (a pid of its process
  group holds the listening socket): the readiness waits use it, so a process that found its port taken (and
  exits saying so, which the callers retry on another port) is never mistaken for ready because someone
  else's server answers there.

Imported by tests/e2e/conftest.py by path; standard library only.
"""

from __future__ import annotations

import os
import random
import socket

# [LOW, HIGH): below the default ephemeral range; above the registered ports most services use.
LOW, HIGH = 10000, 32768
# The benchmark harness's slice; the end-to-end tests split the rest between their pytest-xdist workers.
BENCH = (LOW, 15000)

_given: set[int] = set()      # handed out by free_port() in this process
_next: dict[str, int] = {}     # per role: where free_port() looks next


def _slice(role: str) -> tuple[int, int]:
    if role == "bench":
        return BENCH
    lo, hi = BENCH[1], HIGH
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")           # "gw0", "gw1", ... under xdist
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (hi - lo) // max(count, 1)
    return lo + index * width, lo + (index + 1) * width


def free_port(role: str, host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing was bound to a moment ago, from `role`'s slice ("bench" or "e2e"),
    not handed out before by this process. The caller binds it later; another process may still take it in
    between (its server then refuses to start: retry on a new port)."""
    lo, hi = _slice(role)
    if not lo <= _next.get(role, -1) < hi:
        _next[role] = random.randrange(lo, hi)
    for _ in range(2 * (hi - lo)):
        port = _next[role]
        _next[role] = lo if port + 1 >= hi else port + 1
        if port in _given:
            if sum(lo <= p < hi for p in _given) >= (hi - lo) // 2:
                _given.difference_update(range(lo, hi))   # most of the slice used: start over
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))            # no SO_REUSEADDR: a port in TIME_WAIT is skipped too
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {lo}-{hi - 1} on {host}")


def tcp_sockets():
    """(local port, remote port, state, inode) of every TCP socket, IPv4 and IPv6, in this network namespace
    (/proc/net/tcp{,6}; state "0A" is LISTEN, "01" ESTABLISHED)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            yield int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16), parts[3], parts[9]


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP `port` (any address, IPv4 or IPv6) in this network namespace."""
    return {inode for local, _, state, inode in tcp_sockets() if state == "0A" and local == port}


def group_pids(pgid: int) -> list[int]:
    """Pids of the live processes in process group `pgid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[2]) == pgid:   # field 5: pgrp
            pids.append(int(entry))
    return pids


def owns_listener(pgid: int, port: int) -> bool:
    """Whether a process of group `pgid` holds a socket listening on TCP `port`."""
    return holds_listener(group_pids(pgid), port)


def holds_listener(pids, port: int) -> bool:
    """Whether one of `pids` holds a socket listening on TCP `port` (a server that is not its own process
    group's leader: redis-server, postgres, started by the tests in theirs)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False
