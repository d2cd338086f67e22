"""Regression tests for defects black-box testing found in stop 31 (each failed on the build before
the fix): a request that opens a micro-batch or a coalesced generation passed the pool's queue
(max_concurrent, saturation) without waiting; the token estimate left out the tool definitions and
tool-call arguments a chat template renders into the prompt, so budgets and token buckets were
overspent; and a batch's chunk whose choice index cannot be read went to every member.
Real weir and weir-mock processes on free ports, a raw scripted upstream where the bytes matter."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json

import httpx
import pytest

from conftest import wait_until
from httpwire import RawConn, assert_openai_error, roundtrip
from test_batching import in_parallel
from test_defect_fixes import RawUpstream


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# ------------------------------------------------------- a batch or a generation waits in the queue

SLOW = ("--ttft-ms", "1500", "--itl-ms", "5", "--max-tokens", "4")
# A request that holds the pool's one place while the test sends others to wait for it: long enough for
# them to get there on a loaded machine (the mock's 1.5 s was not, at load 15-20).
HOLD = {"x-mock-ttft-ms": "6000"}


def queued_batching(up, mode: str, size: int, window: str, max_size: int):
    """A pool on `up` with one upstream request at a time (queue.max_concurrent 1) and coalescing or
    micro-batching (`mode`); returns (pool config, route path, body(text) for it)."""
    pool = {"endpoints": [up.base_url], "queue": {"size": size, "max_concurrent": 1, "timeout": "20s",
                                                  "saturation": False}}
    if mode == "coalesce":
        pool["coalesce"] = True
        return pool, "/v1/chat/completions", lambda text: {
            "model": "mock-model", "temperature": 0, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    pool["batch"] = {"window": window, "max_size": max_size}
    return pool, "/v1/completions", lambda text: {"model": "mock-model", "prompt": text, "max_tokens": 4}


@pytest.mark.parametrize("mode", ["coalesce", "batch"])
def test_a_request_that_opens_a_batch_waits_for_the_pools_queue(mock, weir, mode):
    # max_concurrent 1: a second upstream request must wait for the first to end, whether or not
    # the requests could be batched or coalesced (each one here opens its own: distinct prompts).
    up = mock(*SLOW)
    pool, path, text_body = queued_batching(up, mode, size=4, window="10ms", max_size=2)
    body = lambda i: text_body(f"distinct {i}")
    w = weir(config={"pools": {"gpu": pool}, "default_pool": "gpu"}, workers=1)
    # The first runs long enough for the second to be seen waiting on a loaded machine (HOLD); one HTTP
    # client made before, shared.
    with cf.ThreadPoolExecutor(2) as ex, httpx.Client(base_url=w.base_url, timeout=30) as c:
        first = ex.submit(c.post, path, json=body(0), headers=HOLD)
        wait_until(lambda: up.metric("vllm:num_requests_running") == 1, timeout=10, message="the first upstream")
        second = ex.submit(c.post, path, json=body(1))
        wait_until(lambda: w.metric("weir_queue_waiting", pool="gpu") == 1, timeout=10,
                   message="the second request waiting in the queue")
        assert up.metric("vllm:num_requests_running") == 1
        assert first.result().status_code == 200
        assert second.result().status_code == 200
    assert w.metric("weir_queued_requests_total", pool="gpu") == 1
    assert w.metric("weir_queue_waiting", pool="gpu") == 0
    # The place went back: a third request goes straight through.
    assert httpx.post(w.base_url + path, json=body(2), timeout=30).status_code == 200
    assert w.metric("weir_queued_requests_total", pool="gpu") == 1


@pytest.mark.parametrize("mode", ["coalesce", "batch"])
def test_requests_waiting_in_the_queue_join_the_batch_that_opens(mock, weir, mode):
    # Under load the queue fills with compatible requests: when the first of them gets the place and
    # opens a batch (or a generation), the others go with it, not each after the other for a place
    # of its own (which would turn batching off exactly when it is needed).
    up = mock(*SLOW)
    pool, path, body = queued_batching(up, mode, size=16, window="100ms", max_size=8)
    # Identical requests coalesce; micro-batch members differ only in their prompts.
    waiting = (lambda i: body("same")) if mode == "coalesce" else (lambda i: body(f"member {i}"))
    w = weir(config={"pools": {"gpu": pool}, "default_pool": "gpu"}, workers=1)
    # The blocker holds the place until all four wait, on a loaded machine too (HOLD; one HTTP client made
    # before, shared: not one per request costing ~50 ms of CPU each after the blocker started).
    with cf.ThreadPoolExecutor(5) as ex, httpx.Client(base_url=w.base_url, timeout=30) as c:
        blocker = ex.submit(c.post, path, json=body("blocker"), headers=HOLD)
        wait_until(lambda: up.metric("vllm:num_requests_running") == 1, timeout=10, message="the blocker upstream")
        queued = [ex.submit(c.post, path, json=waiting(i)) for i in range(4)]
        wait_until(lambda: w.metric("weir_queue_waiting", pool="gpu") == 4, timeout=10, message="4 waiting")
        assert blocker.result().status_code == 200
        assert [f.result().status_code for f in queued] == [200] * 4
    assert up.metric("vllm:request_success_total") == 2, "the four waiting requests went as one"
    assert w.metric("weir_queue_waiting", pool="gpu") == 0
    # And the place went back.
    assert httpx.post(w.base_url + path, json=body("after"), timeout=30).status_code == 200


def test_a_request_that_joins_an_open_generation_does_not_queue(mock, weir):
    up = mock(*SLOW)
    w = weir(config={"pools": {"gpu": {"endpoints": [up.base_url], "coalesce": True,
                                       "queue": {"size": 4, "max_concurrent": 1, "saturation": False}}},
                     "default_pool": "gpu"}, workers=1)
    body = {"model": "mock-model", "temperature": 0, "max_tokens": 4, "messages": [{"role": "user", "content": "q"}]}
    got = in_parallel(lambda: httpx.post(w.base_url + "/v1/chat/completions", json=body, timeout=30), [(), ()])
    assert [r.status_code for r in got] == [200, 200]
    assert got[0].json()["choices"] == got[1].json()["choices"]
    assert up.metric("vllm:request_success_total") == 1
    assert w.metric("weir_queued_requests_total", pool="gpu") == 0


# ------------------------------------------------------ what the chat template renders is estimated

BIG = "x" * 40_000  # ~10k tokens at 4 bytes a token: $0.01 at 1 USD per 1M


@pytest.fixture(scope="module")
def budgeted(module_mock, module_weir):
    m = module_mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "1", "--model", "m-up")
    return module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "m-up"}},
        "tenants": {"t": {"budget": {"usd": 0.005}}},
        "auth": {"api_keys": [{"id": "k", "sha256": sha("sk-k"), "tenant": "t"}]},
        "pricing": {"*": {"input": 1.0, "output": 1.0}},
    })


def budget_chat(w, **body) -> httpx.Response:
    payload = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(w.base_url + "/v1/chat/completions", json=payload, timeout=30,
                      headers={"authorization": "Bearer sk-k"})


@pytest.mark.parametrize("where", ["content", "tool_description", "tool_schema", "tool_call_arguments",
                                   "functions"])
def test_the_estimate_counts_what_the_chat_template_renders(budgeted, where):
    # Before: only messages' content was counted, so 40 KB in a tool definition reserved ~6 tokens
    # and any number of such requests passed a budget they overspent 200 times.
    body: dict = {}
    if where == "content":
        body["messages"] = [{"role": "user", "content": BIG}]
    elif where == "tool_description":
        body["tools"] = [{"type": "function", "function": {"name": "f", "description": BIG}}]
    elif where == "tool_schema":
        body["tools"] = [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "description": BIG}}}}}]
    elif where == "tool_call_arguments":
        body["messages"] = [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": "c1", "type": "function",
                                 "function": {"name": "f", "arguments": json.dumps({"a": BIG})}}]},
                            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    else:
        body["functions"] = [{"name": "f", "description": BIG}]
    r = budget_chat(budgeted, **body)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "insufficient_quota"


def test_an_image_is_not_estimated_as_text(budgeted):
    # A data: URL is media, not prompt text: 40 KB of base64 does not cost 10k tokens.
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64," + BIG}}]
    r = budget_chat(budgeted, messages=[{"role": "user", "content": content}])
    assert r.status_code == 200, r.text


# --------------------------------------------------------- a chunk no member can be given goes to none

COMPLETION = {"id": "cmpl-b", "object": "text_completion", "created": 1, "model": "m"}


def chunk(index, text: str, finish=None, drop_index: bool = False) -> bytes:
    choice = {"text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    if not drop_index:
        choice["index"] = index
    return b"data: " + json.dumps(dict(COMPLETION, choices=[choice])).encode() + b"\n\n"


BAD_INDEXES = {"negative": -1, "string": "1", "float": 1.0, "null": None, "huge": 2 ** 64, "missing": "drop"}


def batch_answer(headers, body):
    bad = headers.get("x-bad-index", "")
    events = [chunk(i, f" tok{i}") for i in range(3)]
    events.append(chunk(0, " LEAK", drop_index=True) if bad == "missing" else chunk(BAD_INDEXES[bad], " LEAK"))
    events += [chunk(i, " end", finish="length") for i in range(3)]
    events.append(b"data: [DONE]\n\n")
    payload = b"".join(events)
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (
        len(payload), payload)


@pytest.mark.parametrize("bad", sorted(BAD_INDEXES))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "buffered"])
def test_a_batch_chunk_without_a_readable_index_reaches_no_member(weir, bad, stream):
    sent = []
    raw = RawUpstream(lambda headers, body: sent.append(body) or batch_answer(headers, body))
    w = weir(config={"pools": {"gpu": {"endpoints": [raw.url], "batch": {"window": "1s", "max_size": 3}}},
                     "default_pool": "gpu"}, workers=1)

    def go(i):
        body = {"model": "m", "prompt": f"member {i}", "max_tokens": 4, "stream": stream}
        r = httpx.post(w.base_url + "/v1/completions", json=body, timeout=30,
                       headers={"x-bad-index": bad, "x-request-id": f"member-{i}"})
        return r.status_code, r.text

    try:
        got = in_parallel(go, [(0,), (1,), (2,)])
    finally:
        raw.close()
    assert len(sent) == 1 and len(json.loads(sent[0])["prompt"]) == 3, "the three requests were one batch"
    for status, text in got:
        assert "LEAK" not in text, text  # never a text whose owner is unknown
        if not stream:
            assert status == 502, text
    entries = w.wait_log(lambda es: len(es) >= 3)
    assert all(e["error"] is not None for e in entries), entries


# ----------------------------------------------------------------------------------- the HTTP wire

@pytest.fixture(scope="module")
def wire(module_mock, module_weir):
    up = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    raw = RawUpstream(wire_answer)
    w = module_weir(config={"pools": {"p": {"endpoints": [up.base_url]}, "raw": {"endpoints": [raw.url]}},
                            "models": {"m": {"pool": "p"}, "raw": {"pool": "raw"}},
                            "server": {"max_header": "4KiB"}}, workers=1)
    w.raw = raw
    yield w
    raw.close()


def wire_answer(headers, body):
    host = headers.get("host", "")
    page = b'{"id":"x","object":"chat.completion","created":1,"model":"raw","choices":[]}'
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Location: //%s/v1/elsewhere\r\nContent-Location: //%s/v1/x\r\n"
            b"Link: <http://%s/v1/next>; rel=next\r\nAlt-Svc: h2=\":%s\"\r\n\r\n%s") % (
        len(page), host.encode(), host.encode(), host.encode(), host.rsplit(":", 1)[-1].encode(), page)


@pytest.mark.parametrize("lines", [["foo", "close"], ["keep-alive", "close"]])
def test_close_on_a_second_connection_line_closes(wire, lines):
    # RFC 9110 §5.3: two field lines are one list; RFC 9112 §9.6: "close" means the server closes.
    head = "GET /health HTTP/1.1\r\nHost: localhost\r\n" + "".join(f"Connection: {v}\r\n" for v in lines) + "\r\n"
    with RawConn(wire.port) as c:
        c.send(head.encode())
        r = c.read_response("GET")
        assert r.status == 200
        assert "close" in (r.header("connection") or "").lower()
        assert c.closed_by_peer(timeout=5)


def test_no_upstream_address_in_redirect_link_or_alt_svc_fields(wire):
    r = httpx.post(wire.base_url + "/v1/chat/completions", timeout=10,
                   json={"model": "raw", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.headers["location"] == "/v1/elsewhere"
    assert r.headers["content-location"] == "/v1/x"
    assert r.headers["link"] == "</v1/next>; rel=next"
    assert "alt-svc" not in r.headers
    port = wire.raw.url.rsplit(":", 1)[1]
    assert port not in "".join(f"{k}:{v}" for k, v in r.headers.items())


def test_the_echoed_path_is_capped_as_written(wire):
    # 400 bytes that are not UTF-8 become U+FFFD (3 bytes each): the cap holds for what is written.
    path = b"/v1/" + b"\xff" * 400
    r = roundtrip(wire.port, b"GET " + path + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", method="GET")
    err = assert_openai_error(r, 404)
    echoed = err["message"].removeprefix("Unknown request URL: ").removesuffix(".")
    assert len(echoed.encode()) <= 256, len(echoed.encode())
    line = wire.wait_log(lambda es: any(e["status"] == 404 and e["path"].startswith("/v1/\ufffd") for e in es))
    logged = [e for e in line if e["status"] == 404 and e["path"].startswith("/v1/\ufffd")][-1]
    assert len(logged["path"].encode()) <= 256


@pytest.mark.parametrize("shape", ["many_fields", "one_long_field"])
def test_a_head_over_max_header_is_431_exactly(wire, shape):
    # The head's own size against server.max_header (4 KiB here), not a line-by-line estimate.
    limit = 4096
    start = "GET /health HTTP/1.1\r\nHost: localhost\r\n"
    if shape == "many_fields":
        fields = "".join(f"X-F{i}: v\r\n" for i in range(300))
        fields = fields[: limit - len(start) - 40]
        fields = fields[: fields.rfind("\r\n") + 2]
    else:
        fields = ""
    for extra, want in ((0, 200), (1, 431)):
        pad_len = limit - len(start) - len(fields) - len("X-Pad: \r\n") - 2 + extra
        head = start + fields + "X-Pad: " + "a" * pad_len + "\r\n\r\n"
        assert len(head) == limit + extra
        r = roundtrip(wire.port, head.encode(), method="GET")
        assert r.status == want, (shape, len(head), r.status)


@pytest.mark.parametrize("lines,status", [(["gzip", "gzip"], 415), (["identity", "gzip"], 415),
                                          (["gzip", "br"], 415)])
def test_several_content_encoding_lines_are_one_list(wire, lines, status):
    import gzip as gz
    body = gz.compress(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode())
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + "".join(f"Content-Encoding: {v}\r\n" for v in lines) + "\r\n")
    r = roundtrip(wire.port, head.encode() + body)
    assert_openai_error(r, status, "unsupported_content_encoding")


@pytest.mark.parametrize("lines", [["gzip,"], [",gzip"], [" , gzip , "], ["gzip", ""]])
def test_empty_content_encoding_list_elements_are_ignored(wire, lines):
    # RFC 9110 §5.6.1: a recipient ignores empty list elements; "gzip," is gzip.
    import gzip as gz
    body = gz.compress(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode())
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + "".join(f"Content-Encoding: {v}\r\n" for v in lines) + "\r\n")
    r = roundtrip(wire.port, head.encode() + body)
    assert r.status == 200, r.body


@pytest.mark.parametrize("method", ["FOO", "post", "BREW"])
def test_an_unknown_method_is_501(wire, method):
    r = roundtrip(wire.port, f"{method} /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n".encode())
    assert_openai_error(r, 501, "method_not_implemented")
    # A method HTTP defines, on a route without it, stays 405.
    r = roundtrip(wire.port, b"PUT /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
    assert_openai_error(r, 405)


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_a_client_that_leaves_mid_head_is_logged_499(wire, reset):
    # Nothing can be answered, and the request was not malformed: the client left (499), as mid-body.
    def headless(es):  # (the 431s before are headless too, and may still be on their way to the log)
        return [e for e in es if e["status"] in (400, 499) and e["path"] == "/v1/chat/completions"]
    before = len(headless(wire.log_entries()))
    with RawConn(wire.port) as c:
        c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le")
        wait_until(lambda: wire.metric("weir_active_connections") >= 1, timeout=5, message="connected")
        c.close(reset=reset)
    entries = headless(wire.wait_log(lambda es: len(headless(es)) > before))
    assert [e["status"] for e in entries[before:]] == [499], entries[before:]


def test_generated_request_ids_cannot_be_guessed(wire):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ids = [httpx.post(wire.base_url + "/v1/chat/completions", json=body, timeout=10).headers["x-request-id"]
           for _ in range(3)]
    assert all(len(i) == 28 and all(c in "0123456789abcdef" for c in i) for i in ids), ids
    # The counter's digits are sequential; the last 8 are random (2^-32 to repeat).
    assert [int(i[10:20], 16) for i in ids] == [int(ids[0][10:20], 16) + k for k in range(3)], ids
    assert len({i[20:] for i in ids}) == 3, ids


# -------------------------------------------------------- a deadline that a retry would overrun

def busy_503(retry_after: str | None = None):
    """A RawUpstream answer: vLLM's 503 (with Retry-After when given)."""
    extra = f"Retry-After: {retry_after}\r\n".encode() if retry_after else b""

    def answer(headers, body):
        page = b'{"error":{"message":"busy","type":"ServiceUnavailable","code":503}}'
        return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n%s"
                b"Content-Length: %d\r\n\r\n%s") % (extra, len(page), page)
    return answer


@pytest.mark.parametrize("wait", ["retry_after", "backoff"])
def test_a_retry_the_deadline_rules_out_leaves_the_request_to_its_fallback(mock, weir, wait):
    # 500 ms left, and the pool's next retry would wait 1 s (the upstream's Retry-After) or 5 s (its
    # backoff): that retry is not made, and the fallback answers. Before, a 504 "deadline passed"
    # came at once, with no fallback tried.
    busy = RawUpstream(busy_503(retry_after="1"))
    good = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    retry = ({"attempts": 3, "backoff": "10ms", "retry_after_cap": "5s"} if wait == "retry_after"
             else {"attempts": 2, "backoff": "5s", "max_backoff": "5s"})
    w = weir(config={"pools": {"p": {"endpoints": [busy.url], "retry": retry, "outlier": {"consecutive_failures": 0}},
                               "q": {"endpoints": [good.base_url]}},
                     "models": {"m": {"pool": "p", "upstream_model": "mock-model"},
                                "mf": {"pool": "p", "upstream_model": "mock-model", "fallbacks": [{"pool": "q"}]}}},
             workers=1)
    try:
        body = lambda model: {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(w.base_url + "/v1/chat/completions", json=body("mf"), timeout=10,
                       headers={"x-weir-timeout-ms": "500"})
        assert r.status_code == 200, r.text
        # No fallback: the pool's own last answer, not a deadline that has not passed.
        r = httpx.post(w.base_url + "/v1/chat/completions", json=body("m"), timeout=10,
                       headers={"x-weir-timeout-ms": "500"})
        assert r.status_code == 503, r.text
        assert w.metric("weir_deadline_exceeded_total") == 0
        entries = w.wait_log(lambda es: len(es) >= 2)
        assert [e["status"] for e in entries] == [200, 503]
        # One attempt on p, then the fallback's; a retry never sent is not one.
        assert [a["pool"] for a in entries[0]["attempts"]] == ["p", "q"], entries[0]
        assert entries[1]["retries"] == 0 and not entries[1].get("attempts"), entries[1]
    finally:
        busy.close()


# ------------------------------------------------------ the first token is the first content event

ROLE_ONLY = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
             b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n')
AZURE_PREAMBLE = (b'data: {"id":"","object":"","created":0,"model":"","choices":[],"prompt_filter_results":'
                  b'[{"prompt_index":0,"content_filter_results":{}}]}\n\n')


@pytest.mark.parametrize("preamble", [ROLE_ONLY, AZURE_PREAMBLE], ids=["role_only", "azure_preamble"])
def test_a_stream_that_stalls_after_a_role_chunk_hits_the_first_token_timeout(weir, preamble):
    # The first-token timeout (300 ms) must not be disarmed by a chunk without content: before, the
    # stream waited for the idle timeout (30 s here) and the endpoint was never charged.
    import socket
    import threading
    srv = socket.create_server(("127.0.0.1", 0))
    conns = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)
            c.recv(65536)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + b"%x\r\n%s\r\n" % (len(preamble), preamble))  # then nothing: a stall
    threading.Thread(target=serve, daemon=True).start()
    port = srv.getsockname()[1]
    w = weir(config={"pools": {"p": {"endpoints": [f"http://127.0.0.1:{port}"],
                                     "timeouts": {"first_token": "300ms", "idle": "30s"}}},
                     "models": {"m": {"pool": "p"}}}, workers=1)
    try:
        with httpx.stream("POST", w.base_url + "/v1/chat/completions", timeout=10,
                          json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
            text = r.read().decode()
        assert "first token" in text or "timeout" in text, text
        assert w.metric("weir_upstream_first_token_timeouts_total") == 1
        entry = w.wait_log(lambda es: len(es) >= 1)[0]
        assert entry["ttft_ms"] is None, entry  # no token came
    finally:
        srv.close()
        for c in conns:
            c.close()


# ------------------------------------------------------- a batch's retries in its members' lines

def test_a_batchs_retries_show_in_each_members_log_line_and_the_metric(mock, weir):
    # The batch retried on its pool (503, then 503), then its members fell back: each member's line
    # shows every attempt, as an unbatched request's does, and the retry is counted once.
    up = RawUpstream(busy_503())
    backup = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(config={"pools": {"gpu": {"endpoints": [up.url], "batch": {"window": "1s", "max_size": 2},
                                       "retry": {"attempts": 2, "backoff": "10ms"},
                                       "outlier": {"consecutive_failures": 0}},
                               "backup": {"endpoints": [backup.base_url]}},
                     "models": {"m": {"pool": "gpu", "upstream_model": "mock-model",
                                      "fallbacks": [{"pool": "backup"}]}}}, workers=1)
    try:
        go = lambda i: httpx.post(w.base_url + "/v1/completions", timeout=30,
                                  json={"model": "m", "prompt": f"member {i}", "max_tokens": 2}).status_code
        assert in_parallel(go, [(0,), (1,)]) == [200, 200]
    finally:
        up.close()
    entries = w.wait_log(lambda es: len(es) >= 2)
    for e in entries:
        assert [(a["pool"], a["status"]) for a in e["attempts"]] == [("gpu", 503), ("gpu", 503), ("backup", 200)], e
        assert e["retries"] >= 1, e
    assert w.metric("weir_upstream_retries_total", reason="status") == 1  # one retry: the batch's


def test_an_include_usage_that_is_not_a_boolean_is_a_400_as_from_a_strict_upstream(mock, weir):
    # "true" (a string): weir-mock refuses it, as a strict validator does, and so does Weir (stop 39: vLLM's
    # lax reading of "false", 0, "no" left a stream without usage to charge): the client gets a 400 either way.
    up = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(up, workers=1)
    body = {"model": "mock-model", "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            "stream_options": {"include_usage": "true"}}
    direct = httpx.post(up.base_url + "/v1/chat/completions", json=body, timeout=10)
    through = httpx.post(w.base_url + "/v1/chat/completions", json=body, timeout=10)
    assert through.status_code == direct.status_code == 400, (direct.text, through.text)
