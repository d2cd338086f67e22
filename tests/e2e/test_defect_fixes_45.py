"""Defects found in stop 45's black-box rounds."""
from __future__ import annotations

import hashlib
import re

import httpx
import pytest

from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hi"}]
KEY = "sk-stop45-0001"


def _json_answer(body: bytes = b'{"text":"ok"}') -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def _form(boundary: bytes, model: bytes, filename: bytes) -> bytes:
    return (b"--%s\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n%s\r\n"
            b"--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\nContent-Type: audio/wav\r\n\r\n"
            b"RIFFxxxx\r\n--%s--\r\n") % (boundary, model, boundary, filename, boundary)


# DEFECT: RFC 2231 `boundary*` (and its `boundary*0`, `boundary*1` continuations) is joined into `boundary` by
# Python's email parser, which python-multipart (vLLM's form parser) reads the boundary with, the last copy
# winning: Weir read the form after the preamble (an allowed model), the upstream the one before it (a model the
# tenant may not use). `charset*` got past the UTF-8-only charset rule the same way. Each is a 400 now.
@pytest.mark.parametrize("ctype", [
    "multipart/form-data; boundary=WEIRSIDE; boundary*=''UPSTREAMSIDE",
    "multipart/form-data; boundary=WEIRSIDE; boundary*0=UPSTREAM; boundary*1=SIDE",
    "multipart/form-data; boundary=WEIRSIDE; BOUNDARY*=utf-8''UPSTREAMSIDE",
    "multipart/form-data; boundary=WEIRSIDE; charset*=''utf-16",
    "multipart/form-data; boundary=WEIRSIDE; charset*0=latin-; charset*1=1",
])
def test_rfc2231_boundary_and_charset_parameters_are_refused(weir, ctype):
    seen = []
    up = RawUpstream(lambda h, b: (seen.append(b), _json_answer())[1])
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}},
                         "models": {"allowed-model": {"pool": "p"}, "secret-model": {"pool": "p"}},
                         "tenants": {"t": {"models": ["allowed-model"]}},
                         "auth": {"api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                                                "tenant": "t"}]}},
                 workers=1)
        body = (_form(b"UPSTREAMSIDE", b"secret-model", b"b.wav") + b"\r\n"
                + _form(b"WEIRSIDE", b"allowed-model", b"a.wav"))
        r = httpx.post(w.v1 + "/audio/transcriptions", content=body, timeout=10,
                       headers={"authorization": f"Bearer {KEY}", "content-type": ctype})
        assert r.status_code == 400, r.text
        assert "RFC 2231" in r.json()["error"]["message"], r.text
        assert not seen
        # The plain form still passes.
        ok = httpx.post(w.v1 + "/audio/transcriptions", content=_form(b"WEIRSIDE", b"allowed-model", b"a.wav"),
                        timeout=10, headers={"authorization": f"Bearer {KEY}",
                                             "content-type": "multipart/form-data; boundary=WEIRSIDE"})
        assert ok.status_code == 200, ok.text
    finally:
        up.close()


def _auth(tenant: str = "t") -> dict:
    return {"api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": tenant}]}


CHAT_OK = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
           b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
           b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')


# DEFECT: with Weir's auth on (or a pool key), only Authorization, x-api-key and Cookie were kept from the
# upstream: the client's Weir key also sent as Azure's `api-key` (or Gemini's `x-goog-api-key`) reached the
# provider, and a client could add a provider credential of its own beside the pool's key.
@pytest.mark.parametrize("pool_key", [False, True], ids=["weir-auth", "weir-auth-and-pool-key"])
def test_no_provider_key_header_of_the_client_goes_upstream(weir, pool_key):
    seen = []
    up = RawUpstream(lambda h, b: (seen.append(h), _json_answer(CHAT_OK))[1])
    try:
        pool = {"endpoints": [up.url], **({"api_key": "sk-pool-secret"} if pool_key else {})}
        w = weir(config={"pools": {"p": pool}, "models": {"m": {"pool": "p"}}, "tenants": {"t": {"models": ["*"]}},
                         "auth": _auth()}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG}, timeout=10,
                       headers={"authorization": f"Bearer {KEY}", "api-key": KEY, "x-goog-api-key": KEY,
                                "x-forwarded-authorization": f"Bearer {KEY}", "x-custom": "kept"})
        assert r.status_code == 200, r.text
        got = seen[-1]
        for name in ("api-key", "x-goog-api-key", "x-forwarded-authorization", "x-api-key"):
            assert name not in got, got
        assert got.get("authorization") == ("Bearer sk-pool-secret" if pool_key else None), got
        assert got["x-custom"] == "kept"
    finally:
        up.close()


# DEFECT: a client that stops reading (a suspended process) was cut off by neither server.write_timeout nor
# server.max_stream_buffer while the kernel still took Weir's writes: its send buffer autotunes to 4 MiB, and both
# bounds counted only Weir's own queue. The generation ran on (billed whole, logged 200) though the client read
# nothing. The bytes the kernel holds unacknowledged count now.
@pytest.mark.parametrize("server,code", [
    ({"write_timeout": "2s"}, "client_write_timeout"),
    # (Over the bound the stream is held back, and the cut is write_timeout's: a slow client.)
    ({"write_timeout": "2s", "max_stream_buffer": "4KiB", "max_event": "4KiB"}, "slow_client"),
], ids=["write-timeout", "max-stream-buffer"])
def test_a_client_that_stops_reading_is_cut_off_though_the_kernel_takes_the_bytes(weir, mock, server, code):
    import socket

    from conftest import wait_until
    m = mock("--any-model", "--ttft-ms", 10, "--itl-ms", 5, "--max-tokens", 30000)
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}},
                     "server": server}, workers=1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", w.port))
    try:
        body = ('{"model":"m","stream":true,"max_tokens":30000,"messages":[{"role":"user","content":"hi"}]}')
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  f"x-request-id: frozen\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        # Never read: the line comes once Weir cuts the stream off, and the upstream is aborted.
        line = w.log_for("frozen", timeout=15)
        assert line["status"] == 499 and line["error"]["code"] == code, line
        assert w.metric("weir_slow_client_cutoffs_total") == 1
        wait_until(lambda: m.aborts() >= 1, 5)
    finally:
        s.close()


@pytest.mark.parametrize("section", [
    "pools:\n  p: {{endpoints: ['https://127.0.0.1:9'], tls: {{ca_file: {fifo}}}}}\nmodels:\n  m: {{pool: p}}\n",
    "pools:\n  p: {{endpoints: ['https://127.0.0.1:9'], tls: {{client_cert: {fifo}, client_key: {fifo}}}}}\n"
    "models:\n  m: {{pool: p}}\n",
    "pools:\n  p: {{endpoints: ['http://127.0.0.1:9']}}\nmodels:\n  m: {{pool: p}}\ntenants:\n  t: {{}}\n"
    "admin: {{listen: '127.0.0.1:0', token_sha256: '{h}', keys_file: {fifo}}}\n",
], ids=["ca_file", "client_cert", "keys_file"])
def test_a_fifo_named_as_a_file_to_read_is_refused_at_check_and_start_up(tmp_path, section):
    # A pool's TLS file or admin.keys_file that was a FIFO hung `weir --check` and start-up in silence (the read
    # waited for a writer), as the access log's did: every file the configuration reads must be a regular file.
    import os

    from conftest import free_port
    from test_config_check import weir_run
    fifo = tmp_path / "x.fifo"
    os.mkfifo(fifo)
    path = tmp_path / "c.yaml"
    path.write_text(f"listen: 127.0.0.1:{free_port()}\n"
                    + section.format(fifo=fifo, h=hashlib.sha256(b"admin").hexdigest()))
    for args in (["--check"], []):
        r = weir_run("--config", path, *args, timeout=10)
        assert r.returncode == 2 and "is not a regular file" in r.stderr, (args, r.returncode, r.stderr)


def _hwm_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("path,body", [
    ("/responses", {"model": "m", "input": "hi", "stream": True}),
    ("/messages", {"model": "m", "messages": MSG, "stream": True, "max_tokens": 5}),
    ("/chat/completions", {"model": "m", "messages": MSG}),
], ids=["responses", "messages", "chat-json"])
def test_a_decompression_bomb_is_refused_before_it_inflates(weir, path, body):
    # A translated route decodes an OpenAI pool's compressed stream whole (and any route a compressed JSON
    # answer): 300 KiB of gzip inflated to 250 MiB (server.max_response) before anything was refused, 270 MB of
    # memory per request. Past its first MiB a body may inflate at most 200:1.
    import zlib
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"data: " + b"a" * (1 << 20) + b"\n\n"
    gz = b"".join(comp.compress(chunk) for _ in range(250)) + comp.flush()
    ctype = b"application/json" if path == "/chat/completions" else b"text/event-stream"
    up = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-encoding: gzip\r\n"
                     b"content-length: %d\r\n\r\n%s" % (ctype, len(gz), gz))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
        r = httpx.post(w.v1 + path, json=body, headers={"x-request-id": "bomb", "anthropic-version": "2023-06-01"},
                       timeout=30)
        assert r.status_code == 502 or "decompression bomb" in r.text, r.text
        line = w.log_for("bomb")
        assert line["error"]["code"] == "upstream_invalid_response", line
        assert _hwm_kb(w.process.pid) < 100 * 1024
    finally:
        up.close()


@pytest.mark.parametrize("headers,body", [
    ({"x-weir-fallbacks": "abc"}, {"model": "good", "messages": MSG}),
    ({}, {"model": "good", "messages": MSG, "stream": "yes"}),
], ids=["bad-fallbacks-header", "invalid-body"])
def test_a_refused_request_is_logged_and_counted_with_its_model(weir, mock, headers, body):
    # A bad x-weir-fallbacks was checked before the route's model and pool were kept (metrics model="", log
    # pool null, no duration observed); a body the parse refused logged "model": null though the client named
    # one. Both now carry the model, as the other refusals after routing do.
    m = mock("--any-model")
    w = weir(config={"pools": {"good": {"endpoints": [m.base_url]}}, "models": {"good": {"pool": "good"}}}, workers=1)
    r = httpx.post(w.v1 + "/chat/completions", json=body, headers={"x-request-id": "refused", **headers}, timeout=10)
    assert r.status_code == 400, r.text
    line = w.log_for("refused")
    assert line["model"] == "good", line
    if headers:
        assert line["pool"] == "good", line
    assert w.metric("weir_requests_total", model="good", status="400") == 1


def _answer_for(rid: str, tag: str = "") -> bytes:
    import json
    b = json.dumps({"id": "chatcmpl-" + rid, "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "answer for " + rid + tag},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(b) + b


class _StrayBytesUpstream:
    """Answers each request; one with x-misbehave: 1 gets a second, unrequested answer after its own: in the
    same TCP segment as two TLS records (tls), or once the test sets ``send_stray`` (plain); ``stray_sent`` is
    set then, ``stray_conn`` the connection it went on."""

    def __init__(self, context=None):
        import socket
        import threading
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        self.context = context
        self.send_stray, self.stray_sent = threading.Event(), threading.Event()
        self.stray_conn = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                if self.context:
                    c = self.context.wrap_socket(c, server_side=True)
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        import socket
        import time
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, buf = buf.partition(b"\r\n\r\n")
                h = {ln.split(b":")[0].strip().lower(): ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n")[1:]}
                n = int(h.get(b"content-length", b"0"))
                while len(buf) < n:
                    buf += c.recv(65536)
                buf = buf[n:]
                rid = h[b"x-request-id"].decode()
                if h.get(b"x-misbehave") != b"1":
                    c.sendall(_answer_for(rid))
                elif self.context:
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
                    c.sendall(_answer_for(rid))
                    c.sendall(_answer_for(rid, " (SECOND, unsolicited)"))
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
                else:
                    c.sendall(_answer_for(rid))
                    self.send_stray.wait(60)
                    self.send_stray.clear()
                    c.sendall(_answer_for(rid, " (SECOND, unsolicited)"))
                    self.stray_conn = c
                    self.stray_sent.set()
        except OSError:
            return

    def close(self):
        self.ls.close()


@pytest.mark.parametrize("mode", ["tls", "plain"])
def test_an_upstreams_unsolicited_bytes_never_reach_another_request(weir, tmp_path, mode):
    # Cross-talk through a pooled upstream connection. TLS: the stray answer sat in the TLS layer (decrypted, or
    # ciphertext in Asio's BIO pair), where the pool's recv(MSG_PEEK) cannot see it: the next request got it as
    # its 200, every time. Plain: the next client request and the stray bytes came in one epoll_wait, and the
    # client's handler took the connection before the upstream's news was performed, so the pool thought it
    # drained (SIGSTOP stands in for a busy loop: the stray answer and the next request are each waited for in
    # the stopped Weir's sockets). Each request must get its own answer.
    import os
    import signal
    import ssl

    from conftest import sigstop, unread_by_peer, wait_until
    from httpwire import RawConn, request
    from test_tls_upstreams import CA
    context = None
    pool = {}
    if mode == "tls":
        ca = CA(tmp_path, "ca")
        server = ca.issue("server", dns=["weir-test.internal"], ips=["127.0.0.1"])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(server.cert, server.key)
        pool = {"tls": {"ca_file": str(ca.pem)}}
    up = _StrayBytesUpstream(context)
    try:
        scheme = "https" if mode == "tls" else "http"
        w = weir(config={"pools": {"p": {"endpoints": [f"{scheme}://127.0.0.1:{up.port}"], **pool}},
                         "default_pool": "p"}, workers=1)
        body = {"model": "m", "messages": MSG}
        answered = lambda rid: re.compile(f"answer for {rid}-[0-9a-f]{{28}}")  # noqa: E731
        with RawConn(w.port) as conn:  # one kept-alive client connection
            for t in range(3):
                a, b = f"alice-{t}", f"bob-{t}"
                conn.send(request("POST", "/v1/chat/completions", body, {"x-request-id": a, "x-misbehave": "1"}))
                ra = conn.read_response("POST")
                # (The upstream answers for the id it got: the client's, "-", and a generated one.)
                assert answered(a).fullmatch(ra.json()["choices"][0]["message"]["content"]), ra.body
                next_request = request("POST", "/v1/chat/completions", body, {"x-request-id": b})
                if mode == "plain":
                    # Weir stopped while its pooled upstream connection gets the stray answer and its client the
                    # next request: on SIGCONT both come in one epoll_wait. Each is waited for in Weir's socket.
                    w.log_for(a, timeout=10)  # (the first request over: its upstream connection in the pool)
                    sigstop(w.process.pid)
                    try:
                        up.stray_sent.clear()
                        up.send_stray.set()
                        assert up.stray_sent.wait(10), "the upstream sent no stray answer"
                        wait_until(lambda: (unread_by_peer(up.stray_conn) or 0) > 0, 10,
                                   message="the stray answer in Weir's upstream socket")
                        conn.send(next_request)
                        wait_until(lambda: (unread_by_peer(conn.sock) or 0) > 0, 10,
                                   message="the next request in Weir's client socket")
                    finally:
                        os.kill(w.process.pid, signal.SIGCONT)
                else:
                    conn.send(next_request)
                rb = conn.read_response("POST")
                assert rb.status == 200, rb.body
                assert answered(b).fullmatch(rb.json()["choices"][0]["message"]["content"]), rb.body
    finally:
        up.close()


def test_a_resume_never_goes_back_to_an_endpoint_that_failed_the_request(weir, mock):
    # A stream that stalled on C before its first token went on to A, which broke after 3 tokens: the resume
    # avoided only A (whose stream broke) and went back to C in 4 of 6 such requests (3 words, a 300 ms wait,
    # an in-band timeout), with a healthy G untried. Every endpoint that failed the request is avoided now.
    a = mock("--ttft-ms", 5, "--itl-ms", 2, "--reset-after", 3)
    c = mock("--ttft-ms", 3000, "--itl-ms", 2)
    g = mock("--ttft-ms", 5, "--itl-ms", 2)
    f = mock("--ttft-ms", 5, "--itl-ms", 2, "--any-model")
    w = weir(config={
        "pools": {"p": {"endpoints": [c.base_url, a.base_url, g.base_url], "resume": True,
                        "retry": {"attempts": 2, "backoff": "1ms"}, "outlier": {"consecutive_failures": 0},
                        "timeouts": {"first_token": "300ms"}},
                  "f": {"endpoints": [f.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "mock-model", "fallbacks": [{"pool": "f"}]}}}, workers=1)
    for i in range(24):
        with httpx.stream("POST", w.v1 + "/chat/completions", timeout=20, headers={"x-request-id": f"r{i}"},
                          json={"model": "m", "messages": MSG, "stream": True, "max_tokens": 20}) as r:
            assert r.status_code == 200
            r.read()
        attempts = w.log_for(f"r{i}").get("attempts") or []
        failed = [x["endpoint"] for x in attempts if x.get("failure") or (x.get("status") or 200) >= 500]
        assert len(failed) == len(set(failed)), attempts  # no endpoint failed this request twice
        if len(attempts) >= 3 and attempts[0]["endpoint"] == c.base_url and attempts[1]["endpoint"] == a.base_url:
            assert attempts[2]["endpoint"] == g.base_url, attempts


@pytest.mark.parametrize("headers,says", [
    ([("x-weir-priority", "abc")], "x-weir-priority must be a whole number"),
    ([("x-weir-priority", "5"), ("x-weir-priority", "999")], "x-weir-priority must be sent once"),
    ([("x-weir-timeout-ms", "5000"), ("x-weir-timeout-ms", "abc")], "x-weir-timeout-ms must be sent once"),
    ([("x-weir-fallbacks", "1"), ("x-weir-fallbacks", "none")], "x-weir-fallbacks must be sent once"),
], ids=["bad-priority-no-queue", "priority-twice", "timeout-twice", "fallbacks-twice"])
def test_weirs_request_controls_are_checked_up_front_and_once(weir, mock, headers, says):
    # A bad x-weir-priority was read only by a pool's queue: 200 while the primary (no queue) was healthy, and a
    # 400 once it failed over to a queued fallback, after the primary was tried (an outage turned into an error
    # SDKs never retry). Two lines of a control header: the first won in silence (a front proxy appending its own
    # priority lost to the client's). Both are 400s before anything goes upstream now.
    m = mock("--any-model")
    w = weir(config={"pools": {"plain": {"endpoints": [m.base_url]},
                               "q": {"endpoints": [m.base_url], "queue": {"max_concurrent": 4}}},
                     "models": {"m": {"pool": "plain", "fallbacks": [{"pool": "q"}]}}}, workers=1)
    before = m.metric("vllm:request_success_total") if hasattr(m, "metric") else None
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG}, timeout=10,
                   headers=httpx.Headers(headers + [("x-request-id", "ctl")]))
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    line = w.log_for("ctl")
    assert line["model"] == "m" and not line.get("attempts"), line
    if before is not None:
        assert m.metric("vllm:request_success_total") == before


def test_the_admin_token_may_not_be_a_tenants_key(tmp_path):
    # --check said ok, and the tenant holding that key held the admin API too.
    from conftest import free_port
    from test_config_check import weir_run
    h = hashlib.sha256(KEY.encode()).hexdigest()
    path = tmp_path / "c.yaml"
    path.write_text(f"listen: 127.0.0.1:{free_port()}\npools:\n  p: {{endpoints: ['http://127.0.0.1:9']}}\n"
                    f"models:\n  m: {{pool: p}}\ntenants:\n  t: {{}}\n"
                    f"auth:\n  api_keys: [{{id: k1, sha256: '{h}', tenant: t}}]\n"
                    f"admin: {{listen: '127.0.0.1:{free_port()}', token_sha256: '{h}'}}\n")
    r = weir_run("--config", path, "--check")
    assert r.returncode == 2 and "admin.token_sha256" in r.stderr and "auth.api_keys[0]" in r.stderr, r.stderr


@pytest.mark.parametrize("te", [b"gzip, chunked", b"chunked, identity", b"deflate"])
def test_a_transfer_coding_weir_cannot_decode_is_refused_at_the_head(weir, te):
    # `Transfer-Encoding: gzip, chunked`: the client got a 200 and then an in-band "ended the stream before it
    # was complete" (the gzip bytes read as events), with no failover. A coding other than chunked is the
    # upstream's protocol error at its head now: 502, or the fallback's answer.
    import gzip
    events = b"".join([_sse_chunk({"role": "assistant", "content": ""}), _sse_chunk({"content": "ok"}),
                       _sse_chunk({}, "stop"), b"data: [DONE]\n\n"])
    body = gzip.compress(events) if b"gzip" in te else events
    bad = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: %s\r\n"
                      b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (te, len(body), body))
    good = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                       % (len(events), events))
    try:
        w = weir(config={"pools": {"bad": {"endpoints": [bad.url]}, "good": {"endpoints": [good.url]}},
                         "models": {"m": {"pool": "bad"}, "f": {"pool": "bad", "fallbacks": [{"pool": "good"}]}}},
                 workers=1)
        r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG, "stream": True}, timeout=10,
                       headers={"x-request-id": "te"})
        assert r.status_code == 502, r.text
        with httpx.stream("POST", w.v1 + "/chat/completions", timeout=10,
                          json={"model": "f", "messages": MSG, "stream": True}) as r2:
            assert r2.status_code == 200
            assert '"ok"' in r2.read().decode()
    finally:
        bad.close()
        good.close()


def _sse_chunk(delta: dict, finish=None) -> bytes:
    import json
    return b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_tokenizing_is_never_charged_whatever_usage_the_upstream_adds(weir, path):
    # docs/protocols.md: tokenize and detokenize run no model and charge nothing; an upstream that added a
    # `usage` member to its answer got the tenant charged for it.
    body = b'{"count":3,"max_model_len":32768,"tokens":[1,2,3],"prompt":"hi","usage":{"prompt_tokens":1000000,' \
           b'"total_tokens":1000000}}'
    up = RawUpstream(lambda h, b: _json_answer(body))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}},
                         "tenants": {"t": {"models": ["*"]}}, "auth": _auth(),
                         "pricing": {"*": {"input": 1, "output": 2}}}, workers=1)
        req = {"model": "m", "prompt": "hi"} if path == "/tokenize" else {"model": "m", "tokens": [1, 2, 3]}
        r = httpx.post(w.base_url + path, json=req, headers={"authorization": f"Bearer {KEY}", "x-request-id": "tok"},
                       timeout=10)
        assert r.status_code == 200, r.text
        assert w.log_for("tok")["spend_usd"] == 0, w.log_for("tok")
    finally:
        up.close()


def test_a_stream_without_usage_is_charged_no_more_tokens_than_max_tokens_allows(weir):
    # A stream with no usage is charged one token per content event: an upstream that streamed 20 events for a
    # max_tokens of 5 (a non-vLLM server, or one that splits tokens) was charged 20, past the request's bound
    # and its reservation (docs: overspend is zero when requests carry max_tokens).
    events = [_sse_chunk({"role": "assistant", "content": ""})] + [_sse_chunk({"content": f"w{i} "}) for i in range(20)]
    up = RawUpstream(lambda h, b: [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 999999\r\n\r\n"
                                   + b"".join(events), None])
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url], "request_usage": False}}, "models": {"m": {"pool": "p"}},
                         "tenants": {"t": {"models": ["*"]}}, "auth": _auth(),
                         "pricing": {"*": {"input": 0, "output": 1}}}, workers=1)
        spend = {}
        for mt in (5, 1000):
            with httpx.stream("POST", w.v1 + "/chat/completions", timeout=10,
                              headers={"authorization": f"Bearer {KEY}", "x-request-id": f"mt{mt}"},
                              json={"model": "m", "messages": MSG, "stream": True, "max_tokens": mt}) as r:
                r.read()
            spend[mt] = w.log_for(f"mt{mt}")["spend_usd"]
        assert spend[5] == pytest.approx(5e-6), spend
        assert spend[1000] == pytest.approx(20e-6), spend
    finally:
        up.close()


def test_lost_access_log_lines_are_counted_and_said(weir, mock):
    # A failed access-log write (a full disk: /dev/full) was counted per flush, not per line lost, and said
    # nowhere: an operator could not tell how much of the log was gone.
    from conftest import wait_until
    m = mock("--any-model")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}},
                     "server": {"access_log": "/dev/full"}}, workers=1)
    for _ in range(3):
        assert httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG}, timeout=10).status_code == 200
    wait_until(lambda: w.metric("weir_access_log_lines_lost_total") == 3, 5)
    assert w.metric("weir_access_log_write_errors_total") >= 1
    wait_until(lambda: "access log: a write failed" in w.process.log(), 5)


@pytest.mark.parametrize("fetch_timeout", ["1s", "3s"], ids=["refetch-fails", "refetch-succeeds"])
def test_a_client_that_leaves_during_the_jwks_wait_is_a_499(mock, weir, fetch_timeout):
    # A token naming a new kid waits for the JWKS refetch; a client that left meanwhile was logged 401
    # invalid_api_key when the refetch failed (the README: 499 means the client left first).
    import json
    import socket
    import time

    from conftest import wait_until
    from cryptography.hazmat.primitives.asymmetric import rsa
    from test_admission import MOCK_FLAGS, JwksServer, jwt_config, rsa_jwk, token

    class SlowJwks(JwksServer):
        delay = 0.0

        @property
        def jwks(self):
            time.sleep(self.delay)
            return self._jwks

        @jwks.setter
        def jwks(self, v):
            self._jwks = v

    server = SlowJwks()
    try:
        k1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        k2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        server.jwks = {"keys": [rsa_jwk(k1, "k1")]}
        w = weir(config=jwt_config(mock(*MOCK_FLAGS), {"jwks_url": server.url, "fetch_timeout": fetch_timeout}))
        wait_until(lambda: server.hits >= 1, 5)
        time.sleep(0.2)  # past min_refetch_interval (100ms)
        server.jwks = {"keys": [rsa_jwk(k1, "k1"), rsa_jwk(k2, "k2")]}
        server.delay = 1.5
        hits = server.hits
        body = json.dumps({"model": "m", "messages": MSG}).encode()
        s = socket.create_connection(("127.0.0.1", w.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                  b"x-request-id: left\r\nauthorization: Bearer " + token(k2, "k2").encode()
                  + b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        # The client leaves while the refetch its unknown kid started is pending (not 200 ms after sending, which
        # a loaded machine could outlast before Weir read the request).
        wait_until(lambda: server.hits > hits, 10, message="the refetch for the new kid")
        s.close()
        line = w.log_for("left", timeout=8)
        assert line["status"] == 499 and line["error"]["code"] == "client_closed_request", line
    finally:
        server.delay = 0
        server.close()
