"""Upstream connections: keep-alive reuse, one retry on a stale pooled
connection, power-of-two-choices over a pool, and endpoints that refuse.
"""

from __future__ import annotations

import concurrent.futures
import os
import uuid

import pytest

from conftest import Mock, binary, free_port, wait_until
from httpwire import RawConn, request

MSG = [{"role": "user", "content": "hello"}]
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")


def served(m: Mock) -> float:
    """Requests the mock finished (any reason)."""
    return m.metric("vllm:request_success_total")


def test_upstream_connections_are_reused(mock, weir):
    m = mock(*FAST)
    w = weir(upstream=m, workers=1)
    conns_before = m.metric("weir_mock_connections_total")
    c = w.client()
    for i in range(8):
        c.chat.completions.create(model="mock-model", messages=MSG)
        list(c.chat.completions.create(model="mock-model", messages=MSG, stream=True))
        c.embeddings.create(model="mock-model", input=["a", "b"])
    # an upstream error status is a complete response: the connection stays usable
    with pytest.raises(Exception):
        c.chat.completions.create(model="mock-model", messages=MSG, extra_headers={"x-mock-status": "400"})
    c.completions.create(model="mock-model", prompt="x")
    entries = w.wait_log(lambda es: len(es) >= 26)
    assert w.metric("weir_upstream_connects_total") == 1, (
        [e for e in entries if e["retries"] or e["status"] not in (200, 400)], m.aborts())
    # the mock saw Weir's one connection (and the two of these /metrics reads)
    assert m.metric("weir_mock_connections_total") - conns_before == 1 + 1


def test_sdk_streams_keep_the_upstream_connection(mock, weir):
    """The openai SDK closes its connection as soon as it reads [DONE], while Weir may still be
    writing the stream's last chunk; the finished upstream connection must still be reused."""
    m = mock("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "3")
    w = weir(upstream=m, workers=1)
    c = w.client()
    for _ in range(100):
        chunks = list(c.chat.completions.create(model="mock-model", messages=MSG, stream=True))
        assert chunks[-1].choices[0].finish_reason == "stop"
    entries = w.wait_log(lambda es: len(es) >= 100)
    assert [e["status"] for e in entries] == [200] * 100
    assert m.aborts() == 0
    assert w.metric("weir_upstream_connects_total") == 1


def test_concurrent_streams_reuse_a_bounded_set_of_connections(mock, weir):
    m = mock(*FAST)
    w = weir(upstream=m, workers=2)

    def run(_):
        c = w.client()
        for _ in range(10):
            chunks = list(c.chat.completions.create(model="mock-model", messages=MSG, stream=True))
            assert chunks[-1].choices[0].finish_reason == "stop"
        c.close()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(run, range(4)))
    assert served(m) == 40
    assert w.metric("weir_upstream_connects_total") <= 8  # at most 4 in flight on each of 2 workers


def test_connection_closed_after_client_disconnect_is_not_reused(mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "300", "--max-tokens", "50")
    w = weir(upstream=m, workers=1)
    conn = RawConn(w.port)
    conn.send(request("POST", "/v1/chat/completions", {"model": "mock-model", "messages": MSG, "stream": True}))
    assert conn.read_head().status == 200
    next(conn.iter_chunks())
    conn.close()
    wait_until(lambda: m.aborts() == 1, 5, message="the abort")
    out = w.client().chat.completions.create(model="mock-model", messages=MSG, max_tokens=2,
                                             extra_headers={"x-mock-itl-ms": "1"})
    assert out.usage.completion_tokens == 2
    assert w.metric("weir_upstream_connects_total") == 2


def restart_mock(processes, old: Mock, *flags) -> Mock:
    port = old.process.port
    assert old.process.stop() == 0
    argv = [binary("weir-mock"), "--listen", f"127.0.0.1:{port}", *flags]
    return Mock(processes.start(argv, port, name="weir-mock"))


@pytest.mark.parametrize("stream", [False, True])
def test_stale_pooled_connection_is_replaced_before_sending(mock, weir, processes, stream):
    m = mock(*FAST)
    w = weir(upstream=m, workers=1)
    c = w.client()
    c.chat.completions.create(model="mock-model", messages=MSG)
    assert w.metric("weir_upstream_connects_total") == 1
    # The model server restarts on the same port: Weir's pooled connection is now stale.
    m2 = restart_mock(processes, m, *FAST)
    request_id = "stale-" + uuid.uuid4().hex[:8]
    if stream:
        chunks = list(c.chat.completions.create(model="mock-model", messages=MSG, stream=True,
                                                extra_headers={"x-request-id": request_id}))
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        out = c.chat.completions.create(model="mock-model", messages=MSG, extra_headers={"x-request-id": request_id})
        assert out.choices[0].message.content
    assert served(m2) == 1  # sent once, to the new server
    # The pool saw the old server's FIN before sending (a peek) and opened a
    # fresh connection: nothing had to be retried.
    assert w.metric("weir_upstream_retries_total") == 0
    assert w.metric("weir_upstream_connects_total") == 2
    entry = w.log_for(request_id)
    assert entry["status"] == 200 and entry["retries"] == 0


def test_two_endpoints_both_get_traffic(mock, weir):
    a, b = mock(*FAST), mock(*FAST)
    w = weir(config={"pools": {"p": {"endpoints": [a.base_url, b.base_url]}},
                     "models": {"mock-model": {"pool": "p"}}})
    c = w.client()
    for _ in range(40):
        c.chat.completions.create(model="mock-model", messages=MSG)
    na, nb = served(a), served(b)
    assert na + nb == 40 and na > 0 and nb > 0, (na, nb)
    endpoints = {e["endpoint"] for e in w.wait_log(lambda es: len(es) >= 40)}
    assert endpoints == {a.base_url, b.base_url}


def test_power_of_two_choices_prefers_the_less_loaded(mock, weir):
    """Ten long streams at once on one worker: P2C over two endpoints spreads them."""
    a = mock("--ttft-ms", "1", "--itl-ms", "50", "--max-tokens", "40")
    b = mock("--ttft-ms", "1", "--itl-ms", "50", "--max-tokens", "40")
    w = weir(config={"pools": {"p": {"endpoints": [a.base_url, b.base_url]}},
                     "models": {"mock-model": {"pool": "p"}}}, workers=1)
    conns = []
    for _ in range(10):
        conn = RawConn(w.port)
        conn.send(request("POST", "/v1/chat/completions",
                          {"model": "mock-model", "messages": MSG, "stream": True}))
        assert conn.read_head().status == 200  # in flight before the next one is picked
        conns.append(conn)
    ra, rb = a.metric("vllm:num_requests_running"), b.metric("vllm:num_requests_running")
    for conn in conns:
        conn.close()
    assert ra + rb == 10 and abs(ra - rb) <= 2, (ra, rb)


def test_refusing_endpoint_is_skipped(mock, weir):
    live = mock(*FAST)
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    w = weir(config={"pools": {"p": {"endpoints": [*dead, live.base_url]}},
                     "models": {"mock-model": {"pool": "p"}}}, workers=1)
    c = w.client()
    for i in range(10):
        if i % 2:
            chunks = list(c.chat.completions.create(model="mock-model", messages=MSG, stream=True))
            assert chunks[-1].choices[0].finish_reason == "stop"
        else:
            assert c.chat.completions.create(model="mock-model", messages=MSG).choices[0].message.content
    assert served(live) == 10
    assert w.metric("weir_upstream_failures_total", kind="connect_refused") >= 1
    # (the /metrics scrape above writes no log line: it is counted in the metrics)
    entries = w.wait_log(lambda es: len(es) >= 10)
    assert not [e for e in entries if not e["path"].startswith("/v1/")]
    assert len(entries) == 10
    assert not [e for e in entries if e["status"] != 200 or e["endpoint"] != live.base_url]
    assert sum(e["retries"] for e in entries) == w.metric("weir_upstream_retries_total") >= 1


def test_every_endpoint_refusing_is_502(weir):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]
    w = weir(config={"pools": {"p": {"endpoints": dead}}, "models": {"mock-model": {"pool": "p"}}})
    import openai
    with pytest.raises(openai.APIStatusError) as e:
        w.client().chat.completions.create(model="mock-model", messages=MSG)
    assert e.value.status_code == 502 and e.value.body["code"] == "upstream_unavailable"


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_body_on_a_get_is_not_smuggled_upstream(mock, weir, method):
    """A GET /v1/models (proxied in quick mode) carrying a body that is itself an HTTP request:
    the upstream must never run it, and the next client must get its own answer, not the
    smuggled request's (response desync on the pooled connection)."""
    m = mock(*FAST)
    w = weir(upstream=m, workers=1)
    body = b'{"model":"mock-model","messages":[{"role":"user","content":"smuggled"}]}'
    smuggled = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: smuggled\r\n"
                b"x-mock-ttft-ms: 300\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body))
    with RawConn(w.port) as c:
        c.send(b"%s /v1/models HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
               % (method.encode(), len(smuggled), smuggled))
        assert c.read_response(method).status == 200
    c = w.client()
    for i in range(3):
        out = c.chat.completions.create(model="mock-model", messages=MSG, extra_headers={"x-request-id": f"v{i}"})
        assert out.id == f"chatcmpl-{w.upstream_id(f'v{i}')}"  # its own answer (the id Weir sent upstream)
    assert served(m) == 3  # the smuggled request never ran


def test_request_the_upstream_received_is_not_sent_twice(mock, weir):
    m = mock("--ttft-ms", "50", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(upstream=m, workers=1)
    c = w.client()
    c.chat.completions.create(model="mock-model", messages=MSG)  # a pooled connection
    with pytest.raises(Exception):
        c.chat.completions.create(model="mock-model", messages=MSG, extra_headers={"x-mock-reset-after": "0"})
    assert m.metric("weir_mock_injected_resets_total") == 1  # the upstream got (and crashed on) it once


# --- idle pooled connections are closed when the upstream closes them or they age out ---

def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def upstream_burst(w, n: int) -> None:
    """``n`` concurrent requests (each held 300 ms by the mock), so Weir opens about ``n``
    upstream connections; every client connection is closed afterwards."""
    conns = [RawConn(w.port) for _ in range(n)]
    for c in conns:
        c.send(request("POST", "/v1/chat/completions", {"model": "mock-model", "messages": MSG},
                       {"x-mock-ttft-ms": "300"}))
    for c in conns:
        assert c.read_response("POST").status == 200
        c.close()


@pytest.mark.parametrize("closer", ["upstream", "idle_keepalive"])
def test_idle_upstream_connections_do_not_pile_up(mock, weir, closer):
    """After a burst and no further traffic, the pooled upstream connections are closed
    (no CLOSE-WAIT left over) once the model server closes them (its keep-alive timeout,
    1 s here, below Weir's idle_keepalive) or once they are idle_keepalive old (1 s, below
    the server's): Weir's descriptor count returns to what it was before the burst."""
    if closer == "upstream":
        m = mock(*FAST, "--keep-alive-s", "1")
        idle_keepalive = "60s"
    else:
        m = mock(*FAST, "--keep-alive-s", "60")
        idle_keepalive = "1s"
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url], "idle_keepalive": idle_keepalive}},
                     "models": {"mock-model": {"pool": "p"}}}, workers=2)
    with RawConn(w.port) as c:
        c.send(request("GET", "/health"))
        assert c.read_response().status == 200
    pid = w.process.pid
    wait_until(lambda: w.metric("weir_active_connections") <= 1, 5, message="no client connection but the scrape")
    baseline = open_fds(pid)
    n = 60
    upstream_burst(w, n)
    after_burst = open_fds(pid)
    assert after_burst >= baseline + n // 2, (baseline, after_burst)  # the pool holds them now
    wait_until(lambda: open_fds(pid) <= baseline, 5, interval=0.05,
               message=f"weir's descriptors back to {baseline} (after the burst: {after_burst}, "
                       f"now {open_fds(pid)})")
    # The pool still works: the next request opens a fresh connection.
    out = w.client().chat.completions.create(model="mock-model", messages=MSG)
    assert out.choices[0].message.content
