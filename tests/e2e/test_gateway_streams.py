"""Streams: a client that leaves cancels the upstream request at once, and a
client that stops reading is cut off at server.max_stream_buffer without
slowing anybody else.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import time
import uuid

import httpx
import pytest

from conftest import metric_value, parse_prometheus, wait_until
from httpwire import RawConn, request

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "tell me a long story"}]}
# Weir ends the request (its access log line, written once the upstream request is cancelled) within this of the
# client's close. Both are read on the wall clock: the client's just before its close, Weir's in the line's ts;
# a client's stopwatch polling the mock's /metrics counted the client's and the mock's delays on a loaded machine
# (best of three 60 ms at load 18). Weir's thread too may wait for a core there, so the bound holds for the best of
# a test's tries; every try stays far below the slow path (an abort noticed at the upstream's next event, seconds
# away), which tells the defect from the fix on any machine. That the mock saw the abort is awaited as well.
ABORT_BOUND_S = 0.050


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "1000")
    w = module_weir(upstream=m)
    return m, w


class MockMetrics:
    """Reads the mock's /metrics over one kept-alive connection (a poll costs about a millisecond)."""

    def __init__(self, m):
        self.url = m.base_url + "/metrics"
        self.http = httpx.Client(timeout=5)
        self.aborts()

    def value(self, name, **labels) -> float:
        return metric_value(parse_prometheus(self.http.get(self.url).text), name, **labels)

    def aborts(self) -> float:
        return self.value("vllm:request_success_total", finished_reason="abort")

    def running(self) -> float:
        return self.value("vllm:num_requests_running")

    def close(self):
        self.http.close()


def time_to_abort(w, mm: MockMetrics, before: float, request_id: str, close) -> tuple[float, float]:
    """Calls ``close()`` and waits (5 s at most) for the mock to count one more abort. Returns (logged, seen):
    the seconds from just before the close to Weir's access log line of ``request_id`` (its ts: milliseconds, so
    1 ms is added), and to the mock's count as this client saw it (its polls' delays included)."""
    wall, t0 = time.time(), time.monotonic()
    close()
    while mm.aborts() <= before:
        if time.monotonic() - t0 > 5:
            raise AssertionError("the mock never saw the request aborted")
    seen = time.monotonic() - t0
    ts = w.log_for(request_id)["ts"]
    logged = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() + 0.001 - wall
    return logged, seen


def rid(prefix) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_client_close_mid_stream_aborts_upstream(stack):
    m, w = stack
    mm = MockMetrics(m)
    disconnects = w.metric("weir_client_disconnects_total")
    latencies, ids = [], []
    try:
        for _ in range(3):
            request_id = rid("cancel")
            ids.append(request_id)
            c = RawConn(w.port)
            # a token every 3 s: an abort noticed only at the next token would take that long
            c.send(request("POST", "/v1/chat/completions", {**CHAT, "stream": True},
                           {"x-mock-itl-ms": "3000", "x-request-id": request_id}))
            head = c.read_head()
            assert head.status == 200
            chunks = c.iter_chunks()
            while b'"content":" ' not in next(chunks):  # the first token
                pass
            before = mm.aborts()
            latencies.append(time_to_abort(w, mm, before, request_id, c.close))
    finally:
        mm.close()
    logged, seen = zip(*latencies)
    assert max(seen) < 2.0 and min(logged) <= ABORT_BOUND_S, latencies
    for request_id in ids:
        entry = w.log_for(request_id)
        assert entry["status"] == 499 and entry["stream"] is True and entry["ttft_ms"] is not None
    assert w.metric("weir_client_disconnects_total") >= disconnects + 3
    wait_until(lambda: w.metric("weir_active_streams") == 0, 5, message="weir_active_streams back to 0")


def test_client_close_while_waiting_for_first_token_stream(stack):
    """vLLM sends the stream's head at once; the client leaves before the first token."""
    m, w = stack
    mm = MockMetrics(m)
    latencies = []
    try:
        for _ in range(3):
            request_id = rid("first")
            c = RawConn(w.port)
            c.send(request("POST", "/v1/chat/completions", {**CHAT, "stream": True},
                           {"x-mock-ttft-ms": "10000", "x-request-id": request_id}))
            assert c.read_head().status == 200
            latencies.append(time_to_abort(w, mm, mm.aborts(), request_id, c.close))
    finally:
        mm.close()
    logged, seen = zip(*latencies)
    assert max(seen) < 3.0 and min(logged) <= ABORT_BOUND_S, latencies


def test_client_close_while_waiting_for_non_streaming_answer(stack):
    """Non-streaming: Weir waits for the upstream's head; the client leaves meanwhile."""
    m, w = stack
    mm = MockMetrics(m)
    latencies, ids = [], []
    try:
        for _ in range(3):
            request_id = rid("wait")
            ids.append(request_id)
            running = mm.running()
            c = RawConn(w.port)
            c.send(request("POST", "/v1/chat/completions", CHAT,
                           {"x-mock-ttft-ms": "10000", "x-request-id": request_id}))
            wait_until(lambda: mm.running() > running, 5, message="the request reaching the mock")
            latencies.append(time_to_abort(w, mm, mm.aborts(), request_id, c.close))
    finally:
        mm.close()
    logged, seen = zip(*latencies)
    assert max(seen) < 3.0 and min(logged) <= ABORT_BOUND_S, latencies
    for request_id in ids:
        assert w.log_for(request_id)["status"] == 499


def test_client_reset_mid_stream_aborts_upstream(stack):
    """The same with an RST instead of a FIN."""
    m, w = stack
    mm = MockMetrics(m)
    try:
        request_id = rid("reset")
        c = RawConn(w.port)
        # a token every 3 s: an abort noticed only at the next token would take that long
        c.send(request("POST", "/v1/chat/completions", {**CHAT, "stream": True},
                       {"x-mock-itl-ms": "3000", "x-request-id": request_id}))
        assert c.read_head().status == 200
        next(c.iter_chunks())
        logged, seen = time_to_abort(w, mm, mm.aborts(), request_id, lambda: c.close(reset=True))
    finally:
        mm.close()
    assert logged < 0.4 and seen < 2.0, (logged, seen)
    assert w.log_for(request_id)["status"] == 499


def test_sdk_stream_closed_early_aborts_upstream(stack):
    """A user breaking out of the openai SDK's stream and closing it."""
    m, w = stack
    mm = MockMetrics(m)
    try:
        before = mm.aborts()
        client = w.client()
        stream = client.chat.completions.create(model="mock-model", messages=CHAT["messages"], stream=True,
                                                extra_headers={"x-mock-itl-ms": "200"})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()
        client.close()
        wait_until(lambda: mm.aborts() > before, 10, message="mock abort after the SDK closed the stream")
    finally:
        mm.close()


# --- slow clients ----------------------------------------------------------------

NORMAL_TOKENS = 200  # (5 s at 25 ms: the slow reader's cut, at write_timeout, comes while they run)


@pytest.fixture
def slow_stack(mock, weir):
    firehose = mock("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "100000")
    normal = mock("--ttft-ms", "5", "--itl-ms", "25", "--max-tokens", str(NORMAL_TOKENS))
    w = weir(config={
        # (A firehose stream is held back once its reader is 64 KiB behind, and cut when it took nothing for
        # write_timeout.)
        "server": {"max_stream_buffer": "64KiB", "write_timeout": "1s"},
        "pools": {"firehose": {"endpoints": [firehose.base_url]}, "normal": {"endpoints": [normal.base_url]}},
        "models": {"firehose": {"pool": "firehose", "upstream_model": "mock-model"},
                   "normal": {"pool": "normal", "upstream_model": "mock-model"}},
    })
    return firehose, normal, w


def normal_stream(w) -> tuple[int, str | None, float]:
    t0 = time.monotonic()
    client = w.client(timeout=30)
    tokens, finish = 0, None
    for chunk in client.chat.completions.create(model="normal", messages=CHAT["messages"], stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            tokens += 1
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    client.close()
    return tokens, finish, time.monotonic() - t0


def test_slow_reader_cut_off_while_others_stream_on(slow_stack):
    firehose, normal, w = slow_stack
    normal_mm = MockMetrics(normal)
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(normal_stream, w) for _ in range(20)]
        wait_until(lambda: normal_mm.running() == 20, 10, message="20 normal streams in flight")

        # One reader that stops reading: a small receive buffer and never a recv().
        slow = RawConn(w.port, rcvbuf=4096, timeout=15)
        slow.send(request("POST", "/v1/chat/completions",
                          {"model": "firehose", "messages": CHAT["messages"], "stream": True},
                          {"x-request-id": "slow-reader"}))
        wait_until(lambda: w.metric("weir_slow_client_cutoffs_total") >= 1, 20, message="the slow-client cutoff")
        wait_until(lambda: firehose.aborts() >= 1, 5, message="the firehose mock seeing an abort")
        assert normal_mm.running() > 0, "the cutoff must happen while the normal streams are still running"

        results = [f.result(timeout=60) for f in futures]
    normal_mm.close()
    for tokens, finish, took in results:
        assert tokens == NORMAL_TOKENS and finish == "stop"
        assert took < 15.0, f"a normal 5 s stream took {took:.2f} s"  # generous: 2 shared cores

    # The slow reader's connection ends (closed or reset) without the stream's end.
    received = slow.read_to_eof()
    slow.close()
    assert b"data: [DONE]" not in received and not received.endswith(b"0\r\n\r\n")
    entry = w.log_for("slow-reader")
    assert entry["status"] == 499 and entry["error"]["code"] == "slow_client"
    assert normal.aborts() == 0
    wait_until(lambda: w.metric("weir_active_streams") == 0, 5, message="weir_active_streams back to 0")
