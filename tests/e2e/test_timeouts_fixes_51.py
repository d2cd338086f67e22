"""Faults a tester found by reading other gateways' bug reports (session 51).

1. A non-streamed generation longer than ``timeouts.first_byte`` (120 s) was
   cut with a 504, and with ``retry.attempts: N`` started again from
   scratch N times. vLLM sends a non-streamed answer's head only when the
   whole generation is done, so that wait is the generation
   (vllm-project/aibrix#1176, envoyproxy/ai-gateway#795). Now a non-streamed
   request's head waits ``timeouts.response`` (600 s by default; a pool that
   sets ``first_byte`` alone keeps it for every head, as before), a stream's
   still ``first_byte``; and a pool may say ``retry.response_timeout: false``
   so that a non-streamed request written whole that got no head in time is
   not sent again (the generation may be running). The micro-batcher's
   coalesced generations follow the same rule.
2. The client's ``X-Forwarded-For`` went upstream unchanged, with no address
   of Weir's: vLLM's uvicorn trusts forwarded fields from 127.0.0.1 and
   logged the client's own claim. Now the peer's address is appended, as
   nginx's ``$proxy_add_x_forwarded_for`` and Envoy do.

The upstream is scripted here (a raw HTTP/1.1 server): its ``x-probe``
header picks the answer. The test's delays are the upstream's behaviour
(a generation that takes 2 s), not waits for Weir.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class ProbeUpstream:
    """Records every request (its headers as (name, value) pairs) and answers by its ``x-probe``:
    ``slow``: the whole answer after 2 s (a non-streamed generation); ``silent``: nothing until the
    peer closes (a generation still running, or a stuck server); else the answer at once."""

    def __init__(self):
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self, probe: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r["probe"] == probe)

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            buf = b""
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    headers = []
                    for line in head.decode("latin-1").split("\r\n")[1:]:
                        name, _, value = line.partition(":")
                        headers.append((name.strip().lower(), value.strip()))
                    length = int(dict(headers).get("content-length", "0"))
                    while len(buf) < length:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    body, buf = buf[:length], buf[length:]
                    probe = dict(headers).get("x-probe", "")
                    stream = bool(body) and json.loads(body).get("stream") is True
                    with self._lock:
                        self.requests.append({"probe": probe, "headers": headers, "stream": stream})
                    if probe == "silent":
                        while conn.recv(65536):
                            pass
                        return
                    if probe == "slow":
                        time.sleep(2.0)
                    if stream:
                        events = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
                                  b'"choices":[{"index":0,"delta":{"content":"done"},"finish_reason":"stop"}]}\n\n'
                                  b"data: [DONE]\n\n")
                        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                     b"content-length: %d\r\n\r\n" % len(events) + events)
                    else:
                        out = json.dumps(CHAT).encode()
                        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                     b"content-length: %d\r\n\r\n" % len(out) + out)
            except OSError:
                return

    def close(self):
        self._sock.close()


@pytest.fixture
def upstream():
    u = ProbeUpstream()
    yield u
    u.close()


def gateway(weir, upstream, **pool):
    return weir(config={
        "pools": {"p": {"endpoints": [upstream.url], **pool}},
        "models": {"m": {"pool": "p"}},
    }, workers=1)


def chat(w, probe: str, stream: bool = False, headers=None, **body) -> httpx.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream, **body}
    return httpx.post(w.v1 + "/chat/completions", json=payload, timeout=30,
                      headers=[("x-probe", probe), *(headers or [])])


# --- 1. timeouts.response ---------------------------------------------------------------------------------

TIMEOUTS = {"first_byte": "1s", "response": "3s"}


# DEFECT: a non-streamed answer slower than first_byte was a 504 (its generation thrown away, and started
# again by each retry); a coalesced generation (the micro-batcher's own attempt path) the same.
@pytest.mark.parametrize("coalesce", [False, True])
def test_a_non_streamed_answer_slower_than_first_byte_but_within_response_succeeds(weir, upstream, coalesce):
    w = gateway(weir, upstream, timeouts=TIMEOUTS, retry={"attempts": 3}, coalesce=coalesce)
    r = chat(w, "slow", temperature=0)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "done"
    assert upstream.count("slow") == 1
    line = w.log_for(r.headers["x-request-id"])
    assert line["retries"] == 0 and line["error"] is None


# A pool that sets first_byte alone bounds a non-streamed head by it, as before timeouts.response existed (a
# hung endpoint is cut at the bound the operator chose), and retries it on another try.
def test_first_byte_alone_still_bounds_a_non_streamed_head(weir, upstream):
    w = gateway(weir, upstream, timeouts={"first_byte": "1s"},
                retry={"attempts": 2, "backoff": "1ms", "max_backoff": "1ms"})
    t0 = time.monotonic()
    r = chat(w, "silent", temperature=0)
    assert r.status_code == 504, r.text
    assert upstream.count("silent") == 2
    assert time.monotonic() - t0 < 8  # two waits of 1 s, not of 600 s (a bound, not a speed)


# With retry.response_timeout false, a non-streamed request whose head did not come in time is not sent again
# (`attempts` generations from scratch while the one before might still run).
@pytest.mark.parametrize("coalesce", [False, True])
def test_a_non_streamed_response_timeout_is_attempted_once_when_the_pool_says_so(weir, upstream, coalesce):
    w = gateway(weir, upstream, timeouts=TIMEOUTS,
                retry={"attempts": 3, "backoff": "1ms", "max_backoff": "1ms", "response_timeout": False},
                coalesce=coalesce)
    r = chat(w, "silent", temperature=0)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "upstream_timeout"
    line = w.log_for(r.headers["x-request-id"])
    assert line["retries"] == 0
    assert upstream.count("silent") == 1
    assert w.metric("weir_upstream_retries_total", reason="timeout") == 0


# A stream's head comes at once from vLLM: first_byte still bounds it, and a stuck server is still retried.
def test_a_stream_without_a_head_within_first_byte_still_times_out_and_is_retried(weir, upstream):
    w = gateway(weir, upstream, timeouts=TIMEOUTS, retry={"attempts": 3, "backoff": "1ms", "max_backoff": "1ms"})
    t0 = time.monotonic()
    r = chat(w, "silent", stream=True)
    assert r.status_code == 504, r.text
    assert upstream.count("silent") == 3
    line = w.log_for(r.headers["x-request-id"])
    assert line["retries"] == 2
    # Three first_byte waits of 1 s, not a response wait of 3 s each (a bound, not a speed: 9 s would be 3 × 3 s).
    assert time.monotonic() - t0 < 8
    ok = chat(w, "fast", stream=True)
    assert ok.status_code == 200 and "[DONE]" in ok.text


# By default a non-streamed response timeout is retried, as every timeout before the head.
def test_a_non_streamed_response_timeout_is_retried_by_default(weir, upstream):
    w = gateway(weir, upstream, timeouts=TIMEOUTS, retry={"attempts": 2, "backoff": "1ms", "max_backoff": "1ms"})
    r = chat(w, "silent")
    assert r.status_code == 504, r.text
    assert upstream.count("silent") == 2
    assert w.log_for(r.headers["x-request-id"])["retries"] == 1


# --- 2. X-Forwarded-For -----------------------------------------------------------------------------------

def forwarded_for(upstream, probe: str) -> list[str]:
    with upstream._lock:
        reqs = [r for r in upstream.requests if r["probe"] == probe]
    assert len(reqs) == 1
    return [v for n, v in reqs[0]["headers"] if n == "x-forwarded-for"]


# DEFECT: the client's X-Forwarded-For went up unchanged and no address was added: vLLM's uvicorn, trusting
# 127.0.0.1, logged the client's own claim.
@pytest.mark.parametrize("coalesce", [False, True])
def test_x_forwarded_for_ends_with_the_clients_address(weir, upstream, coalesce):
    w = gateway(weir, upstream, coalesce=coalesce)
    assert chat(w, "xff-none", temperature=0).status_code == 200
    assert forwarded_for(upstream, "xff-none") == ["127.0.0.1"]
    assert chat(w, "xff-one", headers=[("X-Forwarded-For", "6.6.6.6")], temperature=0).status_code == 200
    assert forwarded_for(upstream, "xff-one") == ["6.6.6.6, 127.0.0.1"]
    r = chat(w, "xff-two", headers=[("X-Forwarded-For", "6.6.6.6"), ("x-forwarded-for", "10.0.0.1, 10.0.0.2")],
             temperature=0)
    assert r.status_code == 200
    assert forwarded_for(upstream, "xff-two") == ["6.6.6.6, 10.0.0.1, 10.0.0.2, 127.0.0.1"]
