"""Weir out of file descriptors (docs/operations.md#out-of-descriptors): its own shortage is never held against an
endpoint (health probes and load scrapes are skipped, not failed), a failing accept(2) is counted and told on
stderr at a bounded rate, and connections already open keep being served.

Each test lowers the running Weir's soft RLIMIT_NOFILE to 3 (prlimit(2)): stdin, stdout and stderr are open, so
every socket(2) and accept(2) fails with EMFILE while the descriptors already open keep working."""

from __future__ import annotations

import resource
import socket

import pytest

from conftest import free_port, metric_value, parse_prometheus, wait_until
from httpwire import RawConn, request

TOKEN = "admin-test-token-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")


class Kept:
    """One kept-alive connection, opened before the shortage: GETs on it need no new descriptor in Weir."""

    def __init__(self, port: int, token: str | None = None):
        self.conn = RawConn(port, timeout=10)
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str):
        self.conn.send(request("GET", path, headers=self.headers))
        return self.conn.read_response("GET")

    def metrics(self):
        r = self.get("/metrics")
        assert r.status == 200, r.body
        return parse_prometheus(r.body.decode())

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)


class NoDescriptors:
    """Within it, Weir (pid) can open no descriptor: its soft limit is 3."""

    def __init__(self, pid: int):
        self.pid = pid

    def __enter__(self):
        self.soft, self.hard = resource.prlimit(self.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(self.pid, resource.RLIMIT_NOFILE, (3, self.hard))
        return self

    def __exit__(self, *exc):
        resource.prlimit(self.pid, resource.RLIMIT_NOFILE, (self.soft, self.hard))


def gateway(mock, weir, **pool):
    m = mock(*FAST)
    admin_port = free_port()
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url], "max_idle_per_endpoint": 0, **pool}},
                     "models": {"mock-model": {"pool": "p"}},
                     "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
             workers=1, env=ENV)
    wait_until(lambda: _listening(admin_port), 5, message="admin listener")
    # Each listener's queue of connections not yet accepted is empty before a test takes the descriptors away: the
    # readiness probes above connect and close, and an accept(2) still owed for one would fail (and count) under the
    # shortage. accept(2) takes connections in order, so one answered request on a new connection means every
    # earlier one was accepted.
    for port, token in ((w.port, None), (admin_port, TOKEN)):
        drained = Kept(port, token)
        assert drained.get("/ready").status == 200
        drained.conn.close()
    return m, w, admin_port


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


# DEFECT: a health probe whose socket Weir could not open (EMFILE) counted as the endpoint failing it: after
# unhealthy_after probes the healthy endpoint was marked unhealthy ("pool p endpoint ... is unhealthy") and /ready
# answered 503; a load scrape that could not be made counted a scrape failure against the endpoint (as a timeout).
# Now both are skipped, counted in weir_local_resource_failures_total and told once on stderr; the endpoint keeps
# its state. /metrics answers on a connection already open, process_open_fds saying every descriptor is taken.
def test_probes_and_scrapes_weir_cannot_make_are_no_verdict_on_the_endpoint(mock, weir):
    m, w, admin_port = gateway(mock, weir, health={"interval": "50ms", "timeout": "200ms", "unhealthy_after": 2},
                               load_metrics={"interval": "50ms", "timeout": "50ms"})
    client, admin = Kept(w.port), Kept(admin_port, TOKEN)
    # One answer on each kept connection before the shortage: Weir has accepted both (a connection still in the
    # admin listener's queue could not be accepted under the shortage, and its GET would wait: CI failed stop 59).
    assert client.get("/ready").status == 200
    assert admin.get("/ready").status == 200
    wait_until(lambda: client.metric("weir_load_scraped", pool="p") == 1, 10, message="a first scrape")
    with NoDescriptors(w.process.pid):
        # Many probe and scrape intervals pass (or the endpoint is marked down: the old fault).
        wait_until(lambda: client.metric("weir_local_resource_failures_total", operation="health_probe") >= 6 and
                   client.metric("weir_local_resource_failures_total", operation="load_scrape") >= 6 or
                   client.get("/ready").status != 200, 10, message="probes and scrapes skipped")
        r = client.get("/ready")
        assert r.status == 200, r.body
        assert admin.get("/ready").status == 200
        s = admin.metrics()
        assert metric_value(s, "weir_load_scrape_failures_total", pool="p") == 0
        assert metric_value(s, "weir_upstream_health_transitions_total") == 0
        assert metric_value(s, "weir_upstream_endpoint_state", state="closed") == 1
        assert metric_value(s, "weir_local_resource_failures_total", operation="health_probe", reason="fds") >= 6
        assert metric_value(s, "process_open_fds") == metric_value(s, "process_max_fds") == 3
        # A request on an open connection that needs an upstream socket: Weir's own 503, at once.
        client.conn.send(request("POST", "/v1/chat/completions",
                                 {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}))
        r = client.conn.read_response("POST")
        assert r.status == 503 and r.json()["error"]["code"] == "gateway_overloaded", r.body
    log = w.process.log()
    assert "is unhealthy" not in log, log
    assert "load scrape of" not in log, log
    assert log.count("cannot open a socket for health probes: Too many open files") == 1, log
    assert log.count("load scrapes: Too many open files") == 1, log
    # Sockets open again: probes and scrapes resume, and stderr says so once.
    wait_until(lambda: "cannot open a socket for health probes: works again" in w.process.log(), 10,
               message="the probes' recovery line")
    wait_until(lambda: "load scrapes: works again" in w.process.log(), 10, message="the scrapes' recovery line")
    assert client.get("/ready").status == 200
    assert client.metric("weir_load_scrape_failures_total", pool="p") == 0


# DEFECT: accept(2) failing with EMFILE was silent: new clients waited in the listen backlog with no stderr line
# and no metric (the client port's and the admin listener's accept loops swallowed the error). Now each failure
# counts in weir_accept_errors_total{listener,reason}; stderr tells the first, then at most one line per 10 s,
# then one when accepts work again; the waiting connections are answered once descriptors are free.
@pytest.mark.parametrize("listener", ["client", "admin"])
def test_accept_failures_are_counted_and_told_and_the_waiting_clients_are_served_after(mock, weir, listener):
    m, w, admin_port = gateway(mock, weir)
    kept = Kept(admin_port, TOKEN) if listener == "admin" else Kept(w.port)
    assert kept.get("/ready").status == 200
    port = admin_port if listener == "admin" else w.port
    with NoDescriptors(w.process.pid):
        waiting = RawConn(port, timeout=10)  # the kernel completes the handshake; Weir cannot accept it
        waiting.send(request("GET", "/ready"))
        wait_until(lambda: kept.metric("weir_accept_errors_total", listener=listener, reason="fds") >= 3, 10,
                   message="accept failures counted")
        s = kept.metrics()
        other = "client" if listener == "admin" else "admin"
        assert metric_value(s, "weir_accept_errors_total", listener=other) == 0
        assert kept.get("/ready").status == 200  # the connection already open is served
    r = waiting.read_response("GET")  # accepted once a descriptor is free
    assert r.status == 200, r.body
    log = w.process.log()
    who = "admin: cannot accept connections on admin.listen" if listener == "admin" else \
        "worker 0: cannot accept connections on the client port"
    # One line for the run of failures (many in well under 10 s), one for its end.
    assert log.count(f"{who}: Too many open files; new") == 1, log
    assert f"{who}: still failing" not in log, log
    assert log.count(f"{who}: works again, after ") == 1, log
