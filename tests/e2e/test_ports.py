"""The ports the tests and the benchmark harness hand out, and their readiness waits (bench/harness/ports.py).

The benchmark smoke runs beside these tests (scripts/test), so a port either picks may already hold the other's
server: the started process then refuses it and exits, and the wait must not take the other server's answer for
its readiness (the CI run that measured a foreign Weir's 404s as the allocation suite's run did exactly that).
"""

from __future__ import annotations

import socket
import sys

import pytest

from conftest import PORT_TAKEN, REPO, _ports, binary, free_port, start_process


def test_ports_come_from_below_the_ephemeral_range_and_are_never_handed_out_twice():
    lo, hi = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    got = [free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    assert all(_ports.LOW <= p < _ports.HIGH and not lo <= p <= hi for p in got)
    # The benchmark harness's slice is its own.
    bench = [_ports.free_port("bench") for _ in range(50)]
    assert all(_ports.BENCH[0] <= p < _ports.BENCH[1] for p in bench)
    assert not set(bench) & set(got)


def test_the_xdist_workers_have_slices_of_their_own(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = _ports._slice("e2e")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = _ports._slice("e2e")
    assert first[1] <= second[0] and first[0] >= _ports.BENCH[1] and second[1] <= _ports.HIGH


def test_a_port_taken_by_another_server_is_not_mistaken_for_readiness(tmp_path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert not _ports.owns_listener(999999, port)
        with pytest.raises(RuntimeError) as e:
            start_process([binary("weir-mock"), "--listen", f"127.0.0.1:{port}"], port, log_dir=tmp_path,
                          ready_timeout=10)
        assert PORT_TAKEN in str(e.value)


def test_the_benchmark_harness_does_not_take_another_server_for_its_process(tmp_path):
    sys.path.insert(0, str(REPO / "bench" / "harness"))
    try:
        import procs
    finally:
        sys.path.pop(0)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = procs.launch("mock", [str(binary("weir-mock")), "--listen", f"127.0.0.1:{port}"], tmp_path,
                            cpu=None, priority=False)
        try:
            with pytest.raises(procs.HarnessError) as e:
                procs.wait_ready(proc, port, 10)
            assert PORT_TAKEN in proc.log_tail()
            assert "exited" in str(e.value)
        finally:
            proc.stop()


def test_a_redis_whose_port_is_taken_starts_on_another(tmp_path):
    from conftest import Redis
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        r = Redis(tmp_path)
        taken = r.port = other.getsockname()[1]
        try:
            r.start()
            assert r.port != taken and r.ping()
            assert _ports.holds_listener([r.proc.pid], r.port)
        finally:
            r.kill()
