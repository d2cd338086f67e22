"""Defects found in stop 44's black-box rounds."""
from __future__ import annotations

import json

import httpx
import pytest

from conftest import wait_until
from test_defect_fixes import RawUpstream
from test_defect_fixes_43 import _chunk, _read_all, _stream

MSG = [{"role": "user", "content": "hi"}]

# What vLLM streams for a request it refuses as the engine takes it (an invalid guided_json schema): a 200
# head, the refusal as the first event, [DONE]. The same request unstreamed is a 400.
VLLM_REFUSAL = (b'data: {"error":{"object":"error","message":"Invalid JSON schema","type":"BadRequestError",'
                b'"param":null,"code":400}}\n\n')
OLD_VLLM_REFUSAL = b'data: {"object":"error","message":"bad logprobs","type":"BadRequestError","param":null,"code":400}\n\n'
TEXT = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "ok"}), _chunk({}, "stop"), b"data: [DONE]\n\n"]


def _refusing_or_text(headers, body):
    return _stream(*TEXT) if b"guided_json" not in body else _stream(VLLM_REFUSAL, b"data: [DONE]\n\n")


@pytest.mark.parametrize("held", [False, True], ids=["relayed", "held-with-fallback"])
def test_a_streamed_refusal_of_the_request_is_not_the_endpoints_failure(weir, held):
    # Six refused streams used to open both endpoints' breakers (3 in a row each): every later request of any
    # client got 503 upstream_unavailable. A refusal is the client's fault: relayed as it came, counted
    # against no endpoint, neither retried on another nor sent to a fallback.
    ups = [RawUpstream(_refusing_or_text) for _ in range(2)]
    spare = RawUpstream(lambda h, b: _stream(*TEXT))
    try:
        config = {"pools": {"p": {"endpoints": [u.url for u in ups], "eject_for": "30s",
                                  "outlier": {"consecutive_failures": 3}, "breaker": {}},
                            "q": {"endpoints": [spare.url]}},
                  "models": {"m": {"pool": "p", **({"fallbacks": [{"pool": "q"}]} if held else {})}}}
        w = weir(config=config, workers=1)
        bad = {"model": "m", "messages": MSG, "stream": True, "guided_json": {"type": "nonsense"}}
        for i in range(6):
            with httpx.stream("POST", w.v1 + "/chat/completions", json=bad, headers={"x-request-id": f"bad-{i}"},
                              timeout=10) as r:
                assert r.status_code == 200
                got = [line for line in r.iter_lines() if line.startswith("data:")]
            # (vLLM's refusal in OpenAI's shape: its integer code null, its extra member dropped, stop 60.)
            assert got == ['data: {"error":{"message":"Invalid JSON schema","type":"BadRequestError","param":null,'
                           '"code":null}}', "data: [DONE]"], got
        assert w.metric("weir_upstream_failures_total") == 0
        assert w.metric("weir_upstream_available_endpoints", pool="p") == 2
        wait_until(lambda: len(w.log_entries()) >= 6, 5)
        line = w.log_for("bad-5")
        assert line["status"] == 200 and line["error"]["source"] == "upstream", line
        assert line["retries"] == 0, line
        with httpx.stream("POST", w.v1 + "/chat/completions", json={"model": "m", "messages": MSG, "stream": True},
                          timeout=10) as ok:
            assert ok.status_code == 200
            assert '"ok"' in ok.read().decode()
    finally:
        for u in ups + [spare]:
            u.close()


@pytest.mark.parametrize("error,counted", [
    (OLD_VLLM_REFUSAL, 0),
    (b'data: {"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}\n\n', 0),
    (b'data: {"error":{"message":"slow down","type":"RateLimitError","code":429}}\n\n', 1),
    (b'data: {"error":{"message":"engine died","type":"InternalServerError","code":500}}\n\n', 1),
], ids=["old-shape-400", "openai-type", "429-is-the-upstreams", "500-is-the-upstreams"])
def test_which_in_band_errors_refuse_the_request(weir, error, counted):
    up = RawUpstream(lambda h, b: _stream(error, b"data: [DONE]\n\n"))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
        with httpx.stream("POST", w.v1 + "/chat/completions", json={"model": "m", "messages": MSG, "stream": True},
                          timeout=10) as r:
            got = [line for line in r.iter_lines() if line.startswith("data:")]
        assert got[-1] == "data: [DONE]" and json.loads(got[0][5:]), got
        assert w.metric("weir_upstream_failures_total") == counted
    finally:
        up.close()


def test_a_client_reading_steadily_behind_a_large_event_is_not_cut_as_slow(weir):
    # A 6 MB event (a prompt_logprobs chunk), then small events: a client reading 16 KiB at a time, steadily,
    # was cut as `slow_client` ~0.4 s in. The grace measured progress by the writes that completed, and a full
    # socket wakes its writer only once a third of its send buffer is free: bytes the client acknowledged
    # are progress too, as for server.write_timeout.
    import socket
    import time

    from test_defect_fixes import RawUpstream as Raw

    def answer(h, b):
        def chunk(d):
            return b"%x\r\n%s\r\n" % (len(d), d)
        steps = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
                 chunk(_chunk({"role": "assistant", "content": ""})), chunk(_chunk({"content": "a" * (6 << 20)}))]
        for i in range(40):
            steps += [0.05, chunk(_chunk({"content": f" t{i}"}))]
        steps.append(chunk(_chunk({}, "stop") + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return steps

    up = Raw(answer)
    try:
        w = weir(config={"server": {"max_event": "16MiB", "write_timeout": "5s"},
                         "pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
        body = json.dumps({"model": "m", "messages": MSG, "stream": True}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        s.settimeout(30)
        s.connect(("127.0.0.1", w.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nx-request-id: big-event\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while True:
            c = s.recv(16384)
            if not c:
                break
            got += c
            time.sleep(0.01)
        s.close()
        line = w.log_for("big-event")
        assert b"data: [DONE]" in got and b" t39" in got, (len(got), line)
        assert line["status"] == 200 and line.get("error") is None, line
    finally:
        up.close()


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_non_streamed_answer_cut_after_its_head_is_retried_on_the_pool(weir, how):
    # A 200 whose body broke after its head sent nothing to the client: it is retried on the pool's other
    # endpoint while attempts last, as a failure before the head is (it went only to a fallback, and without
    # one the client got a 502 though a healthy endpoint and attempts were left).
    import socket as sk
    import struct

    def cut(h, b):
        return [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 300\r\n\r\n{\"id\":\"chat", 0.02,
                None]

    bad = RawUpstream(cut)
    if how == "reset":
        original = bad.server.RequestHandlerClass.handle

        def handle(self):
            original(self)
            self.request.setsockopt(sk.SOL_SOCKET, sk.SO_LINGER, struct.pack("ii", 1, 0))
        bad.server.RequestHandlerClass.handle = handle
    good_body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                                         "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    good = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                       % (len(good_body), good_body))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [bad.url, good.url],
                                         "retry": {"attempts": 3, "backoff": "1ms", "budget": 1.0}}},
                         "models": {"m": {"pool": "p"}}}, workers=1)
        # (p2c picks either endpoint of two idle ones: 16 requests all to the good one is a 2^-16 chance, where 6
        # were a 1-in-64 flake.)
        statuses = [httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG},
                               headers={"x-request-id": f"cut-{i}"}, timeout=10).status_code for i in range(16)]
        assert statuses == [200] * 16, statuses
        wait_until(lambda: len(w.log_entries()) >= 16, 5)
        assert sum(w.log_for(f"cut-{i}")["retries"] for i in range(16)) >= 1
    finally:
        bad.close()
        good.close()


def _good_completion() -> bytes:
    body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_an_answer_over_max_response_falls_back(weir, gzipped):
    # A 2 MiB answer over server.max_response: 1MiB reached no byte of the client: it fails over to the
    # fallback, whether it came plain or compressed (only the compressed one did).
    import gzip as gz
    big = json.dumps({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {
        "role": "assistant", "content": "a" * (2 << 20)}, "finish_reason": "stop"}]}).encode()
    if gzipped:
        big = gz.compress(big)
    coding = b"content-encoding: gzip\r\n" if gzipped else b""
    bad = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"
                      % (coding, len(big), big))
    good = RawUpstream(lambda h, b: _good_completion())
    try:
        w = weir(config={"server": {"max_response": "1MiB"},
                         "pools": {"bad": {"endpoints": [bad.url]}, "good": {"endpoints": [good.url]}},
                         "models": {"m": {"pool": "bad", "fallbacks": [{"pool": "good"}]}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG},
                       headers={"x-request-id": "too-large"}, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "fine"
        line = w.log_for("too-large")
        assert [a["pool"] for a in line["attempts"]] == ["bad", "good"], line
    finally:
        bad.close()
        good.close()


@pytest.mark.parametrize("pool_type,path,body", [
    ("openai", "/chat/completions", {"model": "m", "messages": MSG, "stream": True}),
    ("anthropic", "/messages", {"model": "m", "messages": MSG, "stream": True, "max_tokens": 5}),
    ("anthropic", "/chat/completions", {"model": "m", "messages": MSG, "stream": True}),
], ids=["openai-chat", "anthropic-messages", "anthropic-chat"])
def test_a_compressed_stream_is_refused_at_its_head(weir, pool_type, path, body):
    # A gzip event stream that inflates to 300 MiB, on a route whose events Weir must relay: refused at its
    # head (502 upstream_invalid_response), not decoded to server.max_response first (250 MiB of memory per
    # request, and then the wrong code: upstream_unavailable, "larger than").
    import zlib
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"data: " + b"a" * (1 << 20) + b"\n\n"
    gz = b"".join(comp.compress(chunk) for _ in range(300)) + comp.flush()
    up = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(gz), gz))
    try:
        pool = {"endpoints": [up.url]}
        if pool_type == "anthropic":
            pool.update({"type": "anthropic", "api_key": "sk-up"})
        w = weir(config={"pools": {"p": pool}, "models": {"m": {"pool": "p"}}}, workers=1)
        r = httpx.post(w.v1 + path, json=body, headers={"x-request-id": "gz-bomb", "anthropic-version": "2023-06-01"},
                       timeout=30)
        assert r.status_code == 502, r.text
        assert w.log_for("gz-bomb")["error"]["code"] == "upstream_invalid_response"
    finally:
        up.close()


@pytest.mark.parametrize("extra,says", [
    # A burst is its per-minute bucket's depth: alone it limited nothing, in silence.
    ("tenants:\n  t: {limits: {requests_burst: 2}}\n", "tenants.t.limits.requests_burst: limits nothing without"),
    ("tenants:\n  t: {limits: {tokens_burst: 30, requests_per_minute: 5}}\n",
     "tenants.t.limits.tokens_burst: limits nothing without"),
    # A port past 65535 wrapped (80800 is 15264): shared limits went to whatever listened there, and the
    # key set that authenticates every JWT came from a port nobody configured.
    ("tenants:\n  t: {limits: {requests_per_minute: 5}}\nredis: {url: 'redis://127.0.0.1:80800'}\n",
     "redis.url: port must be 1..65535"),
    ("tenants:\n  t: {}\nauth:\n  jwt: {jwks_url: 'http://127.0.0.1:99999/jwks'}\n",
     'auth.jwt.jwks_url: "http://127.0.0.1:99999/jwks" has no valid port'),
    ("tenants:\n  t: {}\nauth:\n  jwt: {jwks_url: 'http://127.0.0.1:0/jwks'}\n", "has no valid port"),
    # A collector's CA file that does not load: every export failed, every span dropped, while --check said ok.
    ("tracing: {otlp_endpoint: 'https://localhost:4318', ca_file: NOTPEM}\n", "tracing.ca_file: cannot load ca_file"),
    # Runtime keys belong to tenants: a keys file with none was ignored in silence (every key route 409).
    ("admin: {listen: '127.0.0.1:1', token_sha256: SHA, keys_file: KEYS}\n", "admin.keys_file: needs a tenants:"),
    # One server written two ways took twice its share of the traffic.
    ("  q: {endpoints: ['http://[::1]:9', 'http://[0:0::1]:9']}\n", "pools.q.endpoints[1]: is pools.q.endpoints[0] again"),
    ("  q: {endpoints: ['http://h:9/v1', 'http://h:9/%76%31']}\n", "pools.q.endpoints[1]: is pools.q.endpoints[0] again"),
    # An empty default tenant, as an empty anonymous_tenant: it meant "not set" in silence.
    ("tenants:\n  t: {}\nauth:\n  jwt: {jwks_file: JWKS, default_tenant: ''}\n", "auth.jwt.default_tenant: is empty"),
])
def test_config_values_that_limit_or_name_nothing_are_refused(tmp_path, extra, says):
    from test_config_check import weir_run
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{"kty": "oct", "kid": "k", "alg": "HS256", "k": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}]}))
    path = tmp_path / "c.yaml"
    notpem = tmp_path / "not.pem"
    notpem.write_text("not a certificate\n")
    path.write_text(f"listen: 127.0.0.1:{__import__('conftest').free_port()}\npools:\n  p: {{endpoints: [http://127.0.0.1:9]}}\n"
                    + extra.replace("JWKS", str(jwks)).replace("NOTPEM", str(notpem)).replace("SHA", "a" * 64)
                    .replace("KEYS", str(tmp_path / "keys.json")) + "models:\n  m: {pool: p}\n")
    for args in (["--check"], []):
        r = weir_run("--config", path, *args)
        assert r.returncode == 2 and says in r.stderr, (args, r.returncode, r.stderr)


def test_the_admin_api_refuses_a_burst_without_its_rate(mock, weir):
    from test_admin_api import MOCK_FLAGS, start
    w, admin = start(mock(*MOCK_FLAGS), weir)
    r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", "limits": {"requests_burst": 1}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "limits.requests_burst", r.text
    assert admin("POST", "/admin/v1/keys", json={"tenant": "acme", "limits": {"requests_burst": 1,
                                                                            "requests_per_minute": 5}}).status_code == 201


def test_a_micro_batchs_failure_counts_once_against_its_endpoint(mock, weir):
    # One batch of 4 members whose stream the upstream reset is one attempt and one failure: it counted one
    # failure per member (failures 4 for 1 attempt).
    import threading
    m = mock("--ttft-ms", "5", "--itl-ms", "10", "--max-tokens", "10")
    w = weir(config={"pools": {"gpu": {"endpoints": [m.base_url], "batch": {"window": "1s", "max_size": 4}}},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)

    client = httpx.Client(timeout=30)  # (one, made before the members start: a client each costs ~50 ms of CPU)

    def comp(i):
        with client.stream("POST", w.v1 + "/completions", headers={"x-mock-reset-after": "3"},
                           json={"model": "mock-model", "prompt": f"prompt {i}", "stream": True, "max_tokens": 10}) as r:
            r.read()
    ts = [threading.Thread(target=comp, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    client.close()
    assert w.metric("weir_batches_total") == 1
    assert w.metric("weir_upstream_attempts_total") == 1
    assert w.metric("weir_upstream_failures_total") == 1


@pytest.mark.parametrize("path", ["/messages", "/chat/completions"])
def test_a_broken_anthropic_stream_prices_its_cache_reads_as_cached_input(weir, path):
    # A stream cut before message_delta is charged message_start's prompt count; its cache reads (1024 of
    # 1049) went in at the full input price (~8x the spend).
    import hashlib

    import scripted_upstream as su
    up = su.ScriptedUpstream().start()
    try:
        w = weir(config={
            "pools": {"a": {"endpoints": [up.base_url], "type": "anthropic", "api_key": "sk-up"}},
            "models": {"claude": {"pool": "a"}}, "tenants": {"t": {}},
            "auth": {"api_keys": [{"id": "k", "sha256": hashlib.sha256(b"kt").hexdigest(), "tenant": "t"}]},
            "pricing": {"claude": {"input": 1.0, "output": 2.0, "cached_input": 0.1}}}, workers=1)
        body = {"model": "claude", "max_tokens": 50, "stream": True, "messages": MSG}
        with httpx.stream("POST", w.v1 + path, json=body, timeout=10,
                          headers={"authorization": "Bearer kt", "anthropic-version": "2023-06-01",
                                   "x-script": "cut", "x-request-id": "cut-cache"}) as r:
            r.read()
        line = w.log_for("cut-cache")
        # message_start: input 25, cache reads 1024; one token per content delta at the output price.
        expected_prompt = (25 * 1.0 + 1024 * 0.1) / 1e6
        assert line["spend_usd"] < expected_prompt + 50 * 2.0 / 1e6, line
        assert line["spend_usd"] >= expected_prompt, line
    finally:
        up.stop()


@pytest.mark.parametrize("path,body,says", [
    ("/messages", {"model": "m", "messages": MSG, "stream": True, "max_tokens": 5}, '"type":"invalid_request_error"'),
    ("/responses", {"model": "m", "input": "hi", "stream": True}, '"code":"invalid_prompt"'),
], ids=["anthropic", "responses"])
def test_a_streamed_refusal_reaches_a_translated_client_as_the_clients_error(weir, path, body, says):
    # The same refusal as a 400 head is an invalid_request_error to the Anthropic SDK: streamed, it was an
    # api_error (and server_error in a Responses stream), the shape of an engine's fault.
    up = RawUpstream(lambda h, b: _stream(VLLM_REFUSAL, b"data: [DONE]\n\n"))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
        with httpx.stream("POST", w.v1 + path, json=body, timeout=10,
                          headers={"anthropic-version": "2023-06-01"}) as r:
            text = r.read().decode()
        assert says in text, text
        assert w.metric("weir_upstream_failures_total") == 0
    finally:
        up.close()


def test_a_drained_workers_counts_stay_in_metrics_while_the_others_drain(mock, weir):
    # A worker that finished draining stops its loop: a scrape posted to it never ran, so /metrics waited 1 s
    # and left its counts out (weir_requests_total 40 -> 17 mid-drain: a counter going back, read by
    # Prometheus as a reset). Its last counts are kept and merged.
    import os
    import signal

    from conftest import free_port
    from httpwire import RawConn, request
    m = mock("--ttft-ms", "5", "--itl-ms", "20", "--max-tokens", "1000", "--any-model")
    aport = free_port()
    token = "admin-token-0123456789"
    w = weir(config={"server": {"drain_timeout": "60s"}, "pools": {"a": {"endpoints": [m.base_url]}},
                     "models": {"m": {"pool": "a"}},
                     "admin": {"listen": f"127.0.0.1:{aport}", "token_env": "WEIR_T44_ADMIN"}},
             workers=2, env={"WEIR_T44_ADMIN": token})
    with httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        for _ in range(30):  # on new connections: both workers serve some
            c.post(w.v1 + "/chat/completions", json={"model": "m", "max_tokens": 2, "messages": MSG})
    admin = f"http://127.0.0.1:{aport}"

    def requests_total() -> float:
        text = httpx.get(admin + "/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("weir_requests_total{"))
    wait_until(lambda: requests_total() >= 30, 5)
    before = requests_total()

    def weir_threads() -> int:
        """weir's threads called "weir" (the control thread, the signal thread, the workers; its other threads
        name themselves): one fewer once a drained worker's loop stopped and its thread ended."""
        n = 0
        for t in os.listdir(f"/proc/{w.process.pid}/task"):
            try:
                n += open(f"/proc/{w.process.pid}/task/{t}/comm").read().strip() == "weir"
            except FileNotFoundError:
                pass  # (a thread that exited)
        return n

    # A stream that outlasts the test's scrapes however slow they are (20 s; the drain waits 60), held on a
    # raw connection the test closes when done.
    stream = RawConn(w.port, timeout=30)
    stream.send(request("POST", "/v1/chat/completions", {"model": "m", "stream": True, "messages": MSG}))
    stream.read_head()
    wait_until(lambda: w.metric("weir_active_streams") == 1, 10)
    threads = weir_threads()
    os.kill(w.process.pid, signal.SIGTERM)
    # The worker without the stream drains at once and stops (its thread ends); the other one serves its stream
    # on. Scrapes from then on read the stopped worker's counts.
    wait_until(lambda: weir_threads() == threads - 1, 10, message="the idle worker stopped")
    for _ in range(3):
        assert requests_total() >= before
    stream.close()  # the stream's worker ends its drain: weir stops
    assert w.process.popen.wait(30) == 0


def test_a_sighup_with_a_readerless_pipe_as_access_log_does_not_freeze_the_gateway(tmp_path, mock, processes):
    # SIGHUP reopens the access log on the control thread; a FIFO with no reader (a log shipper restarting)
    # blocked that open until a reader came: SIGTERM was then never handled, nor the admin API.
    import os
    import signal

    from conftest import binary, free_port
    m = mock("--ttft-ms", "1", "--max-tokens", "3", "--any-model")
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    # The reader is this test's own end (a `cat` started here may not have reached its open when weir starts).
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    port = free_port()
    cfg = tmp_path / "w.yaml"
    cfg.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "workers": 1,
                               "server": {"access_log": str(fifo), "drain_timeout": "2s"},
                               "pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}}}))
    p = processes.start([binary("weir"), "--config", str(cfg)], port, name="weir")
    try:
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10,
                          json={"model": "m", "messages": MSG}).status_code == 200
        os.close(reader)
        reader = -1
        os.kill(p.pid, signal.SIGHUP)
        wait_until(lambda: "a pipe with no reader" in p.log(), 5, message="the reopen refused at once")
        os.kill(p.pid, signal.SIGTERM)
        assert p.popen.wait(timeout=10) == 0
    finally:
        if reader >= 0:
            os.close(reader)


def test_the_drain_cut_answer_to_head_has_no_content(weir):
    # A HEAD proxied upstream, cut at drain_timeout: its 503 came with the JSON error as content (RFC 9110
    # §9.3.2: none), bytes a client would read as the start of the next answer.
    import os
    import signal
    import socket

    seen = []

    def hang(h, b):
        seen.append(1)
        return [4.0, None]
    up = RawUpstream(hang)
    try:
        w = weir(config={"server": {"drain_timeout": "1s"}, "pools": {"p": {"endpoints": [up.url]}},
                         "default_pool": "p"}, workers=1)
        s = socket.create_connection(("127.0.0.1", w.port), timeout=10)
        s.sendall(b"HEAD /version HTTP/1.1\r\nHost: localhost\r\nx-request-id: head-drain\r\n\r\n")
        wait_until(lambda: seen, 5, message="the HEAD proxied")
        os.kill(w.process.pid, signal.SIGTERM)
        got = _read_all(s)
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), got
        assert rest == b"", got
    finally:
        up.close()


@pytest.mark.parametrize("options", [{"include_usage": False, "continuous_usage_stats": True},
                                     {"include_usage": None, "continuous_usage_stats": True}])
def test_a_batched_stream_gets_no_per_chunk_usage_it_did_not_ask_for(mock, weir, options):
    # continuous_usage_stats without include_usage asks vLLM for nothing: unbatched every chunk says
    # "usage":null; batched, each carried the member's usage.
    import concurrent.futures as cf
    import re
    m = mock("--ttft-ms", "30", "--itl-ms", "5", "--max-tokens", "3")
    batched = weir(config={"pools": {"b": {"endpoints": [m.base_url], "request_usage": False,
                                           "batch": {"window": "1s", "max_size": 2}}}, "default_pool": "b"},
                   workers=1)
    direct = weir(config={"pools": {"b": {"endpoints": [m.base_url], "request_usage": False}}, "default_pool": "b"},
                  workers=1)
    body = {"model": "mock-model", "prompt": "hello", "max_tokens": 3, "stream": True, "stream_options": options}

    client = httpx.Client(timeout=10)  # (one, made before the members start: a client each costs ~50 ms of CPU)

    def post(w):
        return client.post(w.v1 + "/completions", json=body).text
    with cf.ThreadPoolExecutor(2) as ex:
        got = [f.result() for f in [ex.submit(post, batched), ex.submit(post, batched)]]
    assert batched.metric("weir_batches_total") == 1
    norm = lambda s: re.sub(r'"(created|id)":("[^"]*"|\d+)', '"x":0', s)  # noqa: E731
    assert norm(got[0]) == norm(post(direct)), got[0]


@pytest.mark.parametrize("path", ["//metrics", "/metrics/", "//ready", "/ready/", "/admin//v1/keys", "/admin/v1/keys/"])
def test_the_admin_listener_routes_only_a_paths_own_spelling(mock, weir, path):
    # "//metrics" reached the metrics handler, but the token check and the log's scrape exemption read
    # "/metrics" only: it needed the token and a scrape wrote a log line. As on the client port, such a
    # path is no route: 401 without the token (as every unknown admin path), 404 with it.
    from test_admin_api import MOCK_FLAGS, start
    w, admin = start(mock(*MOCK_FLAGS), weir)
    assert admin("GET", path, token=None).status_code == 401
    r = admin("GET", path)
    assert r.status_code == 404, r.text
    assert admin("GET", "/metrics", token=None).status_code == 200


def test_bytes_out_counts_the_100_continue(mock, weir):
    # curl sends Expect: 100-continue with every body over 1 KiB: the interim response is bytes the client
    # got, in the log's bytes_out as in weir_response_bytes_total.
    import socket
    m = mock("--ttft-ms", "1", "--max-tokens", "3", "--any-model")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
    body = json.dumps({"model": "m", "messages": MSG}).encode()
    s = socket.create_connection(("127.0.0.1", w.port), timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
              b"Connection: close\r\nx-request-id: expect-1\r\nContent-Length: %d\r\n\r\n" % len(body))
    got = s.recv(100)
    assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), got
    s.sendall(body)
    got += _read_all(s)
    assert w.log_for("expect-1")["bytes_out"] == len(got)


def test_an_access_log_or_keys_file_that_cannot_be_used_is_named_at_its_line(tmp_path):
    # The README: every configuration error names the file, line and key. These two named no line.
    import re

    from conftest import free_port
    from test_config_check import weir_run
    bad_keys = tmp_path / "keys.json"
    bad_keys.write_text("[]")
    for extra, key in (("server: {access_log: /nonexistent/dir/access.log}\n", "server.access_log"),
                       ("tenants: {t: {}}\nadmin: {listen: '127.0.0.1:" + str(free_port()) + "', token_sha256: "
                        + "a" * 64 + f", keys_file: {bad_keys}}}\n", "admin.keys_file")):
        path = tmp_path / "c.yaml"
        path.write_text(f"listen: 127.0.0.1:{free_port()}\npools:\n  p: {{endpoints: [http://127.0.0.1:9]}}\n"
                        + extra + "models:\n  m: {pool: p}\n")
        for args in (["--check"], []):
            r = weir_run("--config", path, *args)
            assert r.returncode == 2, (args, r.stderr)
            assert re.search(re.escape(str(path)) + r":\d+:\d+: " + re.escape(key), r.stderr), (args, r.stderr)


def test_usage_weir_asked_for_is_taken_off_a_finish_chunk_with_choices(weir):
    # Some OpenAI-compatible servers put usage on the finish chunk (choices and usage together): a client
    # that did not ask for usage got the member Weir asked for on its behalf.
    fin = json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                      "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
    up = RawUpstream(lambda h, b: _stream(_chunk({"role": "assistant", "content": "hi"}), b"data: " + fin + b"\n\n",
                                          b"data: [DONE]\n\n"))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
        with httpx.stream("POST", w.v1 + "/chat/completions", json={"model": "m", "messages": MSG, "stream": True},
                          headers={"x-request-id": "fin-usage"}, timeout=10) as r:
            text = r.read().decode()
        assert '"usage"' not in text, text
        assert '"finish_reason": "stop"' in text or '"finish_reason":"stop"' in text, text
        assert w.log_for("fin-usage")["completion_tokens"] == 1
        with httpx.stream("POST", w.v1 + "/chat/completions", timeout=10,
                          json={"model": "m", "messages": MSG, "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert '"usage"' in r.read().decode()  # asked for: as it came
    finally:
        up.close()


@pytest.mark.parametrize("lines", [b"content-encoding: identity\r\ncontent-encoding: gzip\r\n",
                                   b"content-encoding: \r\ncontent-encoding: gzip\r\n",
                                   b"content-encoding: identity, gzip\r\n"])
def test_a_coding_split_over_two_lines_is_the_same_coding(weir, lines):
    # RFC 9110 §5.3: two Content-Encoding lines are their values joined. A gzip stream whose first line said
    # identity went out as a 200 with both lines over bytes that were not gzip.
    import gzip as gz
    body = gz.compress(b"data: " + json.dumps({"id": "c", "choices": []}).encode() + b"\n\ndata: [DONE]\n\n")
    up = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + lines
                     + b"content-length: %d\r\n\r\n%s" % (len(body), body))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG, "stream": True},
                       headers={"x-request-id": "two-ce"}, timeout=10)
        assert r.status_code == 502, r.text
        assert w.log_for("two-ce")["error"]["code"] == "upstream_invalid_response"
    finally:
        up.close()


@pytest.mark.parametrize("connection", [b"Connection: keep-alive, close\r\n", b"Connection: keep-alive\r\nConnection: close\r\n",
                                        b"Connection: close, keep-alive\r\n"])
def test_an_http10_request_listing_close_closes_its_connection(mock, weir, connection):
    # RFC 9112 §9.3: with close among the connection options the connection does not persist; on HTTP/1.0
    # a keep-alive beside it won (Beast reads close on HTTP/1.1 only), and a pipelined request was served.
    import socket
    m = mock("--any-model")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
    s = socket.create_connection(("127.0.0.1", w.port), timeout=10)
    s.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n" + connection + b"\r\nGET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
    got = _read_all(s)
    assert got.count(b"HTTP/1.") == 1, got
    assert b"keep-alive" not in got.lower().split(b"\r\n\r\n")[0], got


@pytest.mark.parametrize("target", [b"http:///v1/models", b"http://user:pw@a/v1/models", b"http://u@a/v1/models"])
def test_an_absolute_form_target_with_no_host_or_with_userinfo_is_refused(mock, weir, target):
    # RFC 9110 §4.2.1: an http URI with an empty host MUST be rejected; §4.2.4: userinfo is an error. They were
    # served (200), while a Host field with userinfo is a 400.
    import socket
    m = mock("--any-model")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
    s = socket.create_connection(("127.0.0.1", w.port), timeout=10)
    s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 400"), got


def test_a_readerless_pipe_as_access_log_is_refused_at_check_and_start_up(tmp_path):
    # Start-up opened it and waited for a reader, silent, before its signal handlers (SIGTERM then killed it
    # undrained), while --check said ok.
    import os

    from conftest import free_port
    from test_config_check import weir_run
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    path = tmp_path / "c.yaml"
    path.write_text(f"listen: 127.0.0.1:{free_port()}\nserver: {{access_log: {fifo}}}\n"
                    "pools:\n  p: {endpoints: [http://127.0.0.1:9]}\nmodels:\n  m: {pool: p}\n")
    for args in (["--check"], []):
        r = weir_run("--config", path, *args)
        assert r.returncode == 2 and "a pipe with no reader" in r.stderr, (args, r.returncode, r.stderr)


@pytest.mark.parametrize("listener", ["client", "admin"])
@pytest.mark.parametrize("fields", [b"Content-Length: abc\r\n", b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                                    b"Expect: foo\r\n"])
def test_a_refused_head_request_gets_no_content(mock, weir, listener, fields):
    # RFC 9110 §9.3.2: an answer to HEAD has no content, refusals of its framing too; the JSON error came after
    # the head (bytes a client reads as the start of the next answer).
    import socket

    from test_admin_api import MOCK_FLAGS, start
    w, admin = start(mock(*MOCK_FLAGS), weir)
    port = w.port if listener == "client" else int(admin.base.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"HEAD /v1/models HTTP/1.1\r\nHost: localhost\r\n" + fields + b"\r\n")
    got = _read_all(s)
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 4"), got
    assert rest == b"", got


@pytest.mark.parametrize("head", [b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: my-id-1\r\n"
                                  b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                                  b"GET * HTTP/1.1\r\nHost: localhost\r\nx-request-id: my-id-1\r\n\r\n"])
def test_a_framing_refusal_keeps_the_clients_request_id(mock, weir, head):
    # The client's x-request-id came back (and was logged) on every refusal but these, which made up an id.
    import socket
    m = mock("--any-model")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
    s = socket.create_connection(("127.0.0.1", w.port), timeout=10)
    s.sendall(head)
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 400"), got
    assert b"x-request-id: my-id-1" in got.lower(), got
    assert w.log_for("my-id-1")["status"] == 400
