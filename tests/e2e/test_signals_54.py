"""Signals an operator (or the system) sends, and a drain after an interim answer.

- SIGQUIT is nginx's graceful stop (a Dockerfile's `STOPSIGNAL SIGQUIT`, Ctrl-\\): Weir drains on it as on SIGTERM.
  Its default action ended Weir at once (streams cut silently, no log lines, a core dump holding secrets).
- SIGXFSZ (a file-size limit: `ulimit -f`, systemd's LimitFSIZE=) killed Weir mid-line in the access log; it is
  ignored, so the write fails (EFBIG) and the lines are counted lost, cut back to whole lines, as on a full disk.
- The other signals whose default action ends a process and that Weir never sends itself (SIGALRM, SIGPWR, the
  real-time ones, ...) are ignored: a stray one no longer cuts every stream.
- A request whose `100 Continue` went out before SIGTERM is answered with `Connection: close` (its answer had not
  begun: the drain then closes the connection, and the client must not be promised it).
"""

from __future__ import annotations

import json
import resource
import signal
import socket
import threading

import httpx
import pytest

from conftest import wait_until

MODEL = {"pools": {"p": {"endpoints": []}}, "models": {"m": {"pool": "p", "upstream_model": "mock-model"}}}


def config(m, **server) -> dict:
    cfg = json.loads(json.dumps(MODEL))
    cfg["pools"]["p"]["endpoints"] = [m.base_url]
    cfg["server"] = {"drain_timeout": "10s", **server}
    return cfg


def stream_in_thread(w, out: dict) -> threading.Thread:
    """A 30-token stream read in a thread: out["events"] grows as its data lines come."""
    out["events"] = []

    def run():
        body = {"model": "m", "stream": True, "max_tokens": 30, "messages": [{"role": "user", "content": "hi"}]}
        try:
            with httpx.Client(timeout=30) as c, c.stream("POST", w.base_url + "/v1/chat/completions", json=body,
                                                       headers={"x-request-id": "quit-stream"}) as r:
                out["status"] = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        out["events"].append(line)
        except httpx.HTTPError as e:
            out["error"] = repr(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_sigquit_drains_like_sigterm(weir, mock):
    m = mock("--ttft-ms", "20", "--itl-ms", "30", "--max-tokens", "30")
    w = weir(config=config(m))
    out: dict = {}
    t = stream_in_thread(w, out)
    wait_until(lambda: len(out["events"]) >= 2, 10, message="the stream's first events")
    w.process.popen.send_signal(signal.SIGQUIT)
    t.join(30)
    rc = w.process.popen.wait(20)
    assert rc == 0, w.process.log()[-2000:]
    assert out.get("status") == 200 and "error" not in out, out
    # The stream finished whole: its 30 tokens and [DONE], nothing cut.
    assert out["events"][-1] == "data: [DONE]", out["events"][-3:]
    finish = [e for e in out["events"] if '"finish_reason":"' in e]
    assert finish, out["events"][-3:]
    assert "SIGQUIT received, draining" in w.process.log()
    assert w.log_for("quit-stream")["status"] == 200


@pytest.mark.parametrize("sig", ["SIGALRM", "SIGPWR", "SIGVTALRM", "SIGIO", "SIGRTMIN+3"])
def test_a_stray_signal_whose_default_ends_a_process_is_ignored(sig, weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(config=config(m))
    number = signal.SIGRTMIN + 3 if sig == "SIGRTMIN+3" else getattr(signal, sig)
    w.process.popen.send_signal(number)
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    # Still serving after the signal was handled (a second request: the first may race its delivery).
    for _ in range(2):
        r = httpx.post(w.base_url + "/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 200, r.text
    assert w.process.alive(), w.process.log()[-2000:]


def test_a_file_size_limit_costs_access_log_lines_not_the_process(weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(config=config(m))
    limit = 6000
    resource.prlimit(w.process.pid, resource.RLIMIT_FSIZE, (limit, limit))
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=10) as c:
        for i in range(40):
            r = c.post(w.base_url + "/v1/chat/completions", json=body, headers={"x-request-id": f"fsize-{i}"})
            assert r.status_code == 200, (i, r.text)
    wait_until(lambda: w.metric("weir_access_log_lines_lost_total") > 0, 10, message="lines counted lost")
    assert w.process.alive(), w.process.log()[-2000:]
    text = w.access_log_path.read_bytes()
    assert len(text) <= limit
    # Whole lines only: every line parses, the last ends with its newline.
    assert text.endswith(b"\n"), text[-200:]
    for line in text.splitlines():
        json.loads(line)
    assert "File too large" in w.process.log()


def test_a_drain_after_a_100_continue_answers_with_connection_close(weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(config=config(m))
    body = json.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    with socket.create_connection(("127.0.0.1", w.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = s.recv(4096)
            assert chunk, interim
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100"), interim
        w.process.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM received, draining" in w.process.log(), 10, message="the drain")
        s.sendall(body)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        head = answer.split(b"\r\n\r\n", 1)[0].decode().lower()
        assert head.startswith("http/1.1 200"), head
        assert "connection: close" in head.split("\r\n"), head


def test_a_drain_sends_the_batches_waiting_in_their_window(weir, mock):
    # A 1 s window (the most) and a 200 ms drain: the two members waiting in the window were answered 503
    # drain_timeout at the deadline. The drain now sends every open batch at once.
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    cfg = config(m, drain_timeout="200ms")
    cfg["pools"]["p"]["batch"] = {"window": "1s", "max_size": 8}
    w = weir(config=cfg, workers=1)
    got: dict = {}

    bodies = [json.dumps({"model": "m", "prompt": f"p{i}", "max_tokens": 2}).encode() for i in range(2)]

    def send(i):
        got[i] = httpx.post(w.base_url + "/v1/completions", timeout=30, content=bodies[i],
                            headers={"x-request-id": f"win-{i}", "content-type": "application/json"})

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    # Both requests read and waiting in the window: their bodies are charged to the buffer budget until they end.
    # (A connection whose request has not arrived yet is idle: the drain closes it, rightly.)
    wait_until(lambda: w.metric("weir_buffered_bytes") >= sum(map(len, bodies)), 10,
               message="both members waiting in the window")
    w.process.popen.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    for i in range(2):
        assert got[i].status_code == 200, got[i].text
        line = w.log_for(f"win-{i}")
        assert line["status"] == 200 and line["batch"]["size"] == 2, line
    assert w.process.popen.wait(20) == 0


def test_a_request_that_joins_a_batch_after_the_drain_began_is_sent_at_once(weir, mock):
    # Its body was still arriving at SIGTERM: it joined a batch after the drain had sent the open ones, waited out
    # the 1 s window, and the 200 ms drain deadline answered it 503.
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    cfg = config(m, drain_timeout="200ms")
    cfg["pools"]["p"]["batch"] = {"window": "1s", "max_size": 8}
    w = weir(config=cfg, workers=1)
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", w.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"x-request-id: late-1\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
        wait_until(lambda: w.metric("weir_active_connections") >= 2, 10, message="the request's connection")
        w.process.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM received, draining" in w.process.log(), 10, message="the drain")
        s.sendall(body[5:])
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:400]
    assert w.process.popen.wait(20) == 0
