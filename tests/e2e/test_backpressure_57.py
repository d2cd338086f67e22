"""A stream whose client is behind holds its upstream back (server.max_stream_buffer, docs/reliability.md).

Past the bound, Weir reads nothing more from the stream's upstream until the client has taken enough for its
backlog to be back within it: TCP holds the model server back, and a client that reads steadily gets the whole
stream at its own pace. One that takes nothing is cut off at server.write_timeout (slow_client). Until now Weir
went on reading the upstream at the upstream's pace while the client was behind: a steady reader slower than
its upstream was cut off once the backlog passed the bound plus two of the largest events, or once its TCP
acknowledgements (which come a window update at a time: up to 64 KiB on loopback) showed nothing for 300 ms;
and a client that took nothing had tens of megabytes read for it from a fast upstream during those 300 ms.

The upstream here sends its whole stream at once, as fast as the socket takes it, and counts what it sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from conftest import wait_until
from httpwire import request

KiB = 1 << 10
MiB = 1 << 20


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(i: int, pad: int) -> bytes:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": f"<{i}>" + "x" * pad}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


class FloodUpstream:
    """Answers a streamed chat request with ``events`` events of ~``pad`` bytes then [DONE], written as fast as
    the socket takes them (``forever``: events without end); ``sent`` counts the bytes the kernel took."""

    def __init__(self, events: int, pad: int, forever: bool = False):
        self.events, self.pad, self.forever = events, pad, forever
        self.sent = 0
        self.done = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self):
        self.sock.close()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            block = b"".join(_chunk(_event(i, self.pad)) for i in range(64))
            try:
                conn.sendall(head)
                if self.forever:
                    while True:
                        self.sent += conn.send(block)
                else:
                    body = b"".join(_chunk(_event(i, self.pad)) for i in range(self.events))
                    body += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
                    view = memoryview(body)
                    while view:
                        n = conn.send(view)
                        self.sent += n
                        view = view[n:]
            except OSError:
                pass
            self.done.set()


def _config(up: FloodUpstream, **server) -> dict:
    return {"server": {"max_stream_buffer": "64KiB", "max_event": "16KiB"} | server,
            "pools": {"p": {"endpoints": [up.url], "request_usage": False}}, "models": {"m": {"pool": "p"}}}


def _ask(port: int, rcvbuf: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    s.sendall(request("POST", "/v1/chat/completions",
                      {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}))
    return s


def _read_slowly(s: socket.socket, size: int, pause: float) -> bytes:
    """A steady reader: ``size`` bytes at most per read, ``pause`` seconds between reads, to the body's end."""
    got = b""
    try:
        while not got.endswith(b"0\r\n\r\n"):
            data = s.recv(size)
            if not data:
                break
            got += data
            time.sleep(pause)
    finally:
        s.close()
    return got


def test_a_steady_reader_slower_than_its_upstream_gets_the_whole_stream(weir):
    events = 600  # ~2.4 MB: 37 times the bound, 150 times the cut-off's hard limit (bound + 2 × max_event)
    up = FloodUpstream(events, pad=4000)
    try:
        w = weir(config=_config(up), workers=1)
        got = _read_slowly(_ask(w.port, rcvbuf=16 * KiB), 16 * KiB, 0.004)  # (~4 MB/s: the upstream, loopback's)
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
        assert b"data: [DONE]" in got, got[-600:]
        for i in (0, events // 2, events - 1):
            assert f"<{i}>".encode() in got
        assert b"slow_client" not in got and b'"error"' not in got, got[-600:]
        entry = w.wait_log(lambda es: es)[-1]
        assert entry["status"] == 200 and not entry.get("error"), entry
    finally:
        up.close()


def test_a_client_that_takes_nothing_has_little_read_for_it(weir):
    # A client that reads nothing is cut off as slow at write_timeout; meanwhile Weir reads no more from the
    # upstream than the bound (and what the kernels' socket buffers hold), not what the upstream can send.
    up = FloodUpstream(0, pad=4000, forever=True)
    try:
        w = weir(config=_config(up, max_event="64MiB", write_timeout="1s"), workers=1)
        s = _ask(w.port, rcvbuf=16 * KiB)
        try:
            wait_until(lambda: w.log_entries(), 10, message="the stream cut off")
        finally:
            s.close()
        entry = w.log_entries()[-1]
        assert entry["error"]["code"] == "slow_client", entry
        up.done.wait(10)
        # Loopback's socket buffers (the upstream's send buffer and Weir's receive buffer, autotuned to a few MB
        # each) hold what Weir has not read; reading at the upstream's pace for 300 ms was 40-75 MB.
        assert up.sent < 24 * MiB, up.sent
    finally:
        up.close()


def test_the_upstreams_idle_timeout_does_not_run_while_weir_waits_for_the_client(weir):
    # pools.X.timeouts.idle bounds a wait for the upstream's bytes. While Weir holds a stream back for its client,
    # nothing is waited for from the upstream (its bytes sit in TCP): a slow, steady reader whose catching up takes
    # longer than timeouts.idle still gets the whole stream, and the endpoint is not blamed for a timeout.
    events = 60  # ~240 KB at ~100 KB/s: each wait for the client is longer than the 400 ms idle timeout
    up = FloodUpstream(events, pad=4000)
    try:
        config = _config(up, max_stream_buffer="8KiB")
        config["pools"]["p"]["timeouts"] = {"idle": "400ms"}
        w = weir(config=config, workers=1)
        got = _read_slowly(_ask(w.port, rcvbuf=4 * KiB), 4 * KiB, 0.04)
        assert b"data: [DONE]" in got and f"<{events - 1}>".encode() in got, got[-600:]
        assert b'"error"' not in got, got[-600:]
        entry = w.wait_log(lambda es: es)[-1]
        assert entry["status"] == 200 and not entry.get("error"), entry
        assert w.metric("weir_upstream_failures_total", pool="p", kind="timeout") == 0
    finally:
        up.close()


def test_a_reader_whose_acknowledgements_come_in_large_steps_is_not_cut(weir):
    # A reader at ~100 KB/s with the default receive buffer: its TCP opens the window again only once a large
    # part of it is free (loopback: 64 KiB steps), so no progress shows for 0.5 s at a time. It is reading; it
    # was cut as slow_client 300 ms into such a step.
    events = 80  # ~320 KB: ~3 s at this pace
    up = FloodUpstream(events, pad=4000)
    try:
        w = weir(config=_config(up), workers=1)
        s = socket.socket()
        s.settimeout(30)
        s.connect(("127.0.0.1", w.port))
        s.sendall(request("POST", "/v1/chat/completions",
                          {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}))
        got = _read_slowly(s, 1 * KiB, 0.01)
        assert b"data: [DONE]" in got and f"<{events - 1}>".encode() in got, got[-600:]
        entry = w.wait_log(lambda es: es)[-1]
        assert entry["status"] == 200 and not entry.get("error"), entry
    finally:
        up.close()


def test_a_batch_member_cut_as_slow_is_not_charged_the_batchs_run_as_weirs_time(weir, mock):
    # A member cut off stays in its batch until its prompt ends upstream (vLLM generates it all the same, and it
    # is charged for it): that wait is the model server's time. It was counted in added_us: seconds of "Weir's
    # own time" per cut member.
    m = mock("--ttft-ms", "20", "--itl-ms", "1", "--max-tokens", "3000", "--any-model")
    w = weir(config={"server": {"max_stream_buffer": "16KiB", "max_event": "4KiB"},
                     "pools": {"p": {"endpoints": [m.base_url], "batch": {"window": "50ms", "max_size": 8}}},
                     "models": {"m": {"pool": "p"}}}, workers=1)
    body = {"model": "m", "stream": True, "prompt": "hi", "max_tokens": 3000}
    fast, stalled = socket.socket(), socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        for s, rid in ((fast, "fast"), (stalled, "stalled")):
            s.settimeout(30)
            s.connect(("127.0.0.1", w.port))
            s.sendall(request("POST", "/v1/completions", body, {"x-request-id": rid}))
        got = _read_slowly(fast, 64 * KiB, 0)
        assert got.count(b"data: [DONE]") == 1, got[-300:]
        line = w.log_for("stalled", timeout=15)
    finally:
        stalled.close()
    assert line["status"] == 499 and line["error"]["code"] == "slow_client", line
    assert line.get("batch"), line
    # Its line is written once its prompt ended upstream (~3 s of generation); Weir's own part is milliseconds.
    assert line["duration_ms"] > 1000, line
    assert line["added_us"] < line["duration_ms"] * 1000 / 4, line
