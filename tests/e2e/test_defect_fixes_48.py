"""Defects left open at stop 47 and fixed in stop 48."""
from __future__ import annotations

import httpx

from test_defect_fixes import RawUpstream

ERR_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


# DEFECT: a micro-batch's retry sent the upstream the x-request-id of the attempt it replaced (Batch::send set
# the id once): vLLM refuses an id it is still running, and an attempt Weir gave up on may run until its abort is
# processed. Each send after the first carries the batch's id with "-N" after it, as an unbatched request's do;
# the log's batch.id stays the batch's own.
def test_a_micro_batchs_retry_carries_an_upstream_id_of_its_own(weir):
    seen = []

    def answer(headers, body):
        seen.append(headers.get("x-request-id"))
        return ERR_503
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"b": {"endpoints": [up.url], "retry": {"attempts": 3},
                                         "batch": {"window": "20ms", "max_size": 4}}},
                         "models": {"m": {"pool": "b"}}}, workers=1)
        r = httpx.post(w.v1 + "/completions", headers={"x-request-id": "member"}, timeout=10,
                       json={"model": "m", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert len(seen) == 3, seen
        first = seen[0]
        assert seen[1:] == [first + "-1", first + "-2"], seen
        line = w.log_for("member")
        assert line["batch"]["id"] == first and line["retries"] == 2, line
    finally:
        up.close()


# DEFECT: a request-log SQLite file renamed under Weir (logrotate, `mv requests.db requests.db.1`) lost every row
# since the last checkpoint: SQLite skips its checkpoint-on-close for a moved database, and the WAL, left at the
# old name, was taken for the new file's and reset. The renamed file held no table at all; the rows were counted
# written. They are checkpointed into the renamed file before the new one is opened.
def test_a_renamed_request_log_file_keeps_every_row_written_before(mock, weir, tmp_path):
    import sqlite3
    from conftest import wait_until
    m = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    db = tmp_path / "requests.db"
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"}}, workers=1)

    def send(rid):
        assert httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": rid}, timeout=10,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200

    def rows(path):
        if not path.exists():
            return set()
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
                return {r[0] for r in c.execute("SELECT request_id FROM requests")}
        except sqlite3.OperationalError:  # the new file, its table not made yet
            return set()
    before = {f"before-{i}" for i in range(20)}
    for rid in sorted(before):
        send(rid)
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 20, 5, message="the first rows")
    rotated = tmp_path / "requests.db.1"
    db.rename(rotated)
    after = {f"after-{i}" for i in range(3)}
    for rid in sorted(after):
        send(rid)
    wait_until(lambda: after <= rows(db), 10, message="the later rows in a new file")
    assert rows(rotated) == before
    # (Counted after the commit that made the rows visible, on the writer's SCHED_IDLE thread: waited for.)
    wait_until(lambda: w.metric("weir_request_log_written_total") == 23, 10, message="23 rows counted")


# DEFECT: weir-mock, which stands for vLLM in these tests and the benchmarks, answered "model": "" with 404 "The
# model `` does not exist." where vLLM serves its model (_is_model_supported): an empty model through Weir's
# default pool failed against it. Directly and through Weir, on chat, completions and embeddings.
def test_the_mock_takes_an_empty_model_as_vllm_does(mock, weir):
    m = mock("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "2")
    w = weir(upstream=m, workers=1)
    for base in (m.base_url, w.base_url):
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi"}), ("/v1/embeddings", {"input": "hi"})):
            r = httpx.post(base + path, json={"model": "", "max_tokens": 2, **body}, timeout=10)
            assert r.status_code == 200, (base, path, r.text)
            assert r.json()["model"] == "mock-model", r.json()


def _completion(headers, body):
    """A /v1/completions answer for every prompt of `body`, streamed when it asks (a micro-batch does)."""
    import json
    req = json.loads(body)
    prompts = req["prompt"] if isinstance(req["prompt"], list) else [req["prompt"]]
    if req.get("stream"):
        out = b""
        for i, _ in enumerate(prompts):
            out += b"data: " + json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
                                           "choices": [{"index": i, "text": "x", "finish_reason": "stop"}]}).encode()
            out += b"\n\n"
        out += b"data: " + json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
                                       "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                "total_tokens": 2}}).encode() + b"\n\ndata: [DONE]\n\n"
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(out)) + out
    body = json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


class KeptConnectionCloser:
    """An HTTP/1.1 upstream whose every keep-alive connection answers its first request (_completion) and is
    closed as its second arrives, unanswered: the upstream's close crossing a request on each pooled connection
    Weir reuses (the stale pooled connection). A connection Weir opens afresh is answered: the resend."""

    def __init__(self):
        import socket
        import socketserver
        import threading

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                sock: socket.socket = self.request
                buf, n = b"", 0
                while True:
                    while b"\r\n\r\n" not in buf:
                        got = sock.recv(65536)
                        if not got:
                            return
                        buf += got
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        k, _, v = line.partition(b":")
                        if k.strip().lower() == b"content-length":
                            length = int(v)
                    while len(buf) < length:
                        got = sock.recv(65536)
                        if not got:
                            return
                        buf += got
                    body, buf = buf[:length], buf[length:]
                    n += 1
                    if n > 1:
                        return  # (socketserver closes it)
                    sock.sendall(_completion({}, body))

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def stale_rounds(w, model: str, want: int, tries: int = 100) -> tuple[int, int, int]:
    """Sends completions of `model` (an upstream KeptConnectionCloser's) until `want` of them met a stale
    pooled connection, and returns (requests sent, stale ones, real resets). The upstream closes each reused
    connection as the request arrives; Weir takes that for stale only when the close comes within
    Attempts::kStaleWindow (5 ms) of the send, before which a loaded machine may not get to it: then it is a
    real reset (no retry section: the client's 502), and the next request opens a fresh connection. So the
    test waits for the condition, `want` stale resends, rather than for the window, and holds each request
    to what it met."""
    sent = stale = resets = 0
    fresh = True  # the next request finds no pooled connection
    while stale < want:
        assert sent < tries, f"{stale} of {sent} requests met a stale connection in the window; wanted {want}"
        rid = f"{model}-{sent}"
        r = httpx.post(w.v1 + "/completions", headers={"x-request-id": rid}, timeout=10,
                       json={"model": model, "prompt": "hi", "max_tokens": 2})
        sent += 1
        line = w.log_for(rid)
        if fresh:
            assert r.status_code == 200 and not line.get("retries"), (r.text, line)
            fresh = False
        elif r.status_code == 200:
            # (Logged as what it was since stop 50, test_small_fixes_50: not the reset it looked like.)
            assert line["retries"] == 1 and line["attempts"][0].get("failure") == "stale_connection", line
            stale += 1
        else:
            assert r.status_code == 502 and not line.get("retries"), (r.text, line)
            resets += 1
            fresh = True
    return sent, stale, resets


# DEFECT: a micro-batch counted a stale pooled connection (closed by the upstream as the request went out, resent at
# once on a fresh one) in weir_upstream_failures_total; an unbatched request does not (the endpoint did no wrong).
# (Stop 51: waits for a stale resend instead of counting on the first close to come within the 5 ms window.)
def test_a_stale_pooled_connection_is_no_failure_of_a_micro_batch_either(weir):
    u, b = KeptConnectionCloser(), KeptConnectionCloser()
    try:
        w = weir(config={"pools": {"u": {"endpoints": [u.url]},
                                   "b": {"endpoints": [b.url], "batch": {"window": "5ms", "max_size": 4}}},
                         "models": {"mu": {"pool": "u"}, "mb": {"pool": "b"}}}, workers=1)
        for model, pool in (("mu", "u"), ("mb", "b")):
            sent, stale, resets = stale_rounds(w, model, want=1)
            # Only the real resets fail: a stale connection is no failure, and its resend one more attempt.
            assert w.metric("weir_upstream_failures_total", pool=pool) == resets, pool
            assert w.metric("weir_upstream_attempts_total", pool=pool) == sent + stale, pool
    finally:
        u.close()
        b.close()
