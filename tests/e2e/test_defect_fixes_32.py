"""Regression tests for defects found in stop 32 (each failed on the build before the fix): the
access log of a refused head named no method or path, a body that timed out logged no bytes,
HEAD /version lacked the Content-Length its GET has, and an Anthropic or Responses client that
asked for a stream got a whole JSON body when the upstream ignored `stream: true`. Real weir and
weir-mock processes on free ports, raw sockets and a scripted upstream where the bytes matter."""

from __future__ import annotations

import concurrent.futures as cf
import email.utils
import hashlib
import json
import signal
import socket
import subprocess
import threading
import time

import anthropic
import httpx
import openai
import pytest

from conftest import answers, binary, free_port, wait_until
from httpwire import RawConn, roundtrip
from test_defect_fixes import RawUpstream


@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    up = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    return module_weir(config={"pools": {"p": {"endpoints": [up.base_url]}}, "default_pool": "p",
                               "server": {"max_header": "4KiB", "body_timeout": "1s", "header_timeout": "1s",
                                          "keepalive_timeout": "10s"}}, workers=1)


def lines_for(gw, path: str, status: int) -> list[dict]:
    return [e for e in gw.log_entries() if e.get("path") == path and e.get("status") == status]


@pytest.mark.parametrize("head,status", [
    (b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 5000 + b"\r\n\r\n", 431),
    (b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: localhost\r\nNo colon here\r\n\r\n", 400),
], ids=["too_large", "malformed"])
def test_a_refused_head_is_logged_with_its_request_line(gw, head, status):
    method, target = head.split(b" ")[:2]
    path = target.decode().split("?")[0]
    before = len(lines_for(gw, path, status))
    r = roundtrip(gw.port, head, method=method.decode())
    assert r.status == status
    wait_until(lambda: len(lines_for(gw, path, status)) > before, 5, message="the refused head's line")
    line = lines_for(gw, path, status)[-1]
    assert line["method"] == method.decode(), line
    assert "request_id" in line and line["request_id"], line


def test_a_head_with_no_request_line_is_logged_without_one(gw):
    before = len([e for e in gw.log_entries() if e.get("status") == 400 and e.get("method") == "-"])
    r = roundtrip(gw.port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
    assert r.status == 400
    entries = gw.wait_log(lambda es: len([e for e in es if e.get("status") == 400 and e.get("method") == "-"]) > before)
    line = [e for e in entries if e.get("status") == 400 and e.get("method") == "-"][-1]
    assert not line.get("path"), line


def test_a_body_that_times_out_logs_the_bytes_that_came(gw):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"x-request-id: slow-body-32\r\nContent-Length: 100\r\n\r\n")
    with RawConn(gw.port) as c:
        c.send(head + b"{" * 37)
        r = c.read_response("POST")
        assert r.status == 408
    line = gw.log_for("slow-body-32")
    assert line["bytes_in"] == len(head) + 37, line  # (the head, and what came of the body)


def test_head_version_has_the_content_length_of_its_get(gw):
    get = httpx.get(gw.base_url + "/version", timeout=10)
    assert get.status_code == 200, get.text
    head = httpx.head(gw.base_url + "/version", timeout=10)
    assert head.status_code == 200
    assert head.headers.get("content-length") == str(len(get.content)), head.headers


# ------------------------------------------------------- an upstream that ignores stream: true

def whole_answer(headers, body):
    """An OpenAI-compatible upstream that answers every request with the whole chat completion."""
    asked = json.loads(body)
    page = json.dumps({
        "id": "chatcmpl-whole", "object": "chat.completion", "created": 1, "model": asked.get("model", "m"),
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Hello there",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))


@pytest.fixture(scope="module")
def whole(module_weir):
    raw = RawUpstream(whole_answer)
    w = module_weir(config={"pools": {"raw": {"endpoints": [raw.url]}}, "default_pool": "raw"}, workers=1)
    yield w
    raw.close()


def test_an_anthropic_stream_is_made_from_an_upstream_answer_that_ignored_stream(whole):
    client = anthropic.Anthropic(base_url=whole.base_url, api_key="k", max_retries=0, timeout=30)
    with client.messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}],
                                tools=[{"name": "get_weather", "input_schema": {"type": "object"}}]) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop", events
    assert [b.type for b in final.content] == ["text", "tool_use"], final
    assert final.content[0].text == "Hello there"
    assert final.content[1].name == "get_weather" and final.content[1].input == {"city": "Oslo"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 5


def test_a_responses_stream_is_made_from_an_upstream_answer_that_ignored_stream(whole):
    client = openai.OpenAI(base_url=whole.v1, api_key="k", max_retries=0, timeout=30)
    events = list(client.responses.create(model="m", input="hi", stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello there"
    done = events[-1].response
    assert done.usage.output_tokens == 5
    assert [o.type for o in done.output] == ["message", "function_call"], done.output


def test_an_anthropic_pools_whole_message_becomes_the_stream_an_anthropic_client_asked_for(module_weir):
    def answer(headers, body):
        page = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                           "content": [{"type": "text", "text": "Hello there"}], "stop_reason": "end_turn",
                           "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 2}}).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(page), page)
    up = RawUpstream(answer)
    w = module_weir(config={"pools": {"anth": {"type": "anthropic", "endpoints": [up.url], "api_key": "sk-up"}},
                            "models": {"claude-x": {"pool": "anth"}}}, workers=1)
    try:
        client = anthropic.Anthropic(base_url=w.base_url, api_key="k", max_retries=0, timeout=30)
        with client.messages.stream(model="claude-x", max_tokens=16,
                                    messages=[{"role": "user", "content": "hi"}]) as s:
            final = s.get_final_message()
        assert final.content[0].text == "Hello there" and final.stop_reason == "end_turn", final
        assert final.usage.output_tokens == 2
    finally:
        up.close()


def test_a_plain_chat_stream_gets_the_whole_answer_as_its_stream(whole):
    # The client asked for a stream and the upstream sent the whole completion: it becomes the one chunk that
    # carries all of it, then [DONE] (stop 38: relayed as it came, the openai SDK read it as no chunk and no
    # error), as the translated routes make their streams from it.
    r = httpx.post(whole.v1 + "/chat/completions", timeout=10,
                   json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.headers
    data = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]", r.text
    chunk = json.loads(data[0])
    assert chunk["object"] == "chat.completion.chunk" and chunk["choices"][0]["delta"]["content"] == "Hello there"



# ----------------------------------------------------------------------------- the HTTP wire, round 2

def test_a_kept_alive_connections_next_head_has_header_timeout(gw):
    # keepalive_timeout (10 s) waits for the next head's first byte; from it, header_timeout (1 s)
    # bounds the head, as on a new connection: a head sent a byte at a time holds no connection longer.
    with RawConn(gw.port, timeout=15) as c:
        c.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert c.read_response("GET").status == 200
        c.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        t0 = time.monotonic()
        r = c.read_response("GET")
        assert r.status == 408
        assert r.json()["error"]["code"] == "request_timeout", r.body   # as the admin listener's
        assert time.monotonic() - t0 < 5, time.monotonic() - t0


def test_a_head_timeout_is_logged_with_the_time_it_took(gw):
    with RawConn(gw.port, timeout=15) as c:
        c.send(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nx-request-id: slow-head\r\n")
        assert c.read_response("GET").status == 408
    line = gw.wait_log(lambda es: any(e["status"] == 408 and e.get("path") == "/v1/models" for e in es))
    line = [e for e in line if e["status"] == 408 and e.get("path") == "/v1/models"][-1]
    assert line["duration_ms"] >= 900, line


def test_added_latency_leaves_out_the_wait_for_the_clients_body(gw):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    with RawConn(gw.port, timeout=15) as c:
        c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               b"x-request-id: slow-upload-32\r\nContent-Length: %d\r\n\r\n" % len(body))
        time.sleep(0.6)  # the client's pace (under body_timeout): not Weir's time
        c.send(body)
        assert c.read_response("POST").status == 200
    line = gw.log_for("slow-upload-32")
    assert line["duration_ms"] >= 500 and line["added_us"] < 300_000, line


def test_a_chunked_body_with_bare_lf_lines_is_400_at_once(gw):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: bare-lf-32\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    r = roundtrip(gw.port, head + b"%x\n" % len(body) + body + b"\n0\n\n")
    assert r.status == 400, r.status
    # not body_timeout (1 s here, 60 s by default); Weir's clock, arrival to answer
    assert gw.log_for("bare-lf-32")["duration_ms"] < 900


@pytest.mark.parametrize("end", [b"0\n\r\n", b"0\r\n\n", b"0\r\nX-T: 1\n\r\n"], ids=["size", "last", "trailer"])
def test_a_bare_lf_in_the_last_chunk_or_its_trailers_is_400_at_once(gw, end):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    rid = f"bare-lf-end-{len(end)}-{end[-3:].hex()}"
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: %s\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" % rid.encode())
    r = roundtrip(gw.port, head + b"%x\r\n" % len(body) + body + b"\r\n" + end)
    assert r.status == 400, r.status
    assert gw.log_for(rid)["duration_ms"] < 900  # (Weir's clock, arrival to answer)


def test_a_request_line_cut_off_mid_target_names_no_path(gw):
    with RawConn(gw.port, timeout=15) as c:
        c.send(b"POST /v1/chat/comp")
        assert c.read_response("POST").status == 408
    entries = gw.wait_log(lambda es: any(e["status"] == 408 and e["method"] == "-" for e in es))
    assert not [e for e in entries if e.get("path") == "/v1/chat/comp"], entries


def test_check_refuses_an_access_log_start_up_could_not_open(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("listen: 127.0.0.1:1\nserver: {access_log: /nonexistent-dir-32/x.log}\n"
                   "pools: {a: {endpoints: [\"http://127.0.0.1:1\"]}}\nmodels: {m: {pool: a}}\n")
    r = subprocess.run([binary("weir"), "--config", cfg, "--check"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "access_log" in r.stderr, (r.returncode, r.stderr)
    cfg.write_text(cfg.read_text().replace("/nonexistent-dir-32/x.log", str(tmp_path / "x.log")))
    r = subprocess.run([binary("weir"), "--config", cfg, "--check"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "x.log").exists()  # --check creates nothing
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "x.log"), str(tmp_path)))  # a directory
    r = subprocess.run([binary("weir"), "--config", cfg, "--check"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "access_log" in r.stderr, (r.returncode, r.stderr)


# --------------------------------------------------------------------------- upstream answers, round 2

class CutUpstream:
    """Answers each request with `head + body` and closes the connection (a reset mid-body)."""

    def __init__(self, data: bytes):
        self.data = data
        self.hits = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        break
                    buf += got
                self.hits += 1
                try:
                    conn.sendall(self.data)
                except OSError:
                    pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self.sock.close()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse_chunk(content: str, finish: str | None = None) -> bytes:
    ev = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m",
          "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
    return b"data: " + json.dumps(ev).encode() + b"\n\n"


def test_a_non_streamed_request_whose_upstream_streams_and_breaks_ends_at_once(module_weir):
    # The client did not ask for a stream; the upstream sent one anyway and reset after two
    # tokens. It ends at once, never a body that stops on a connection kept open until
    # keepalive_timeout. (Since stop 38 an event stream to a request that did not ask for one is
    # no answer: read whole, here broken, a 502.)
    up = CutUpstream(SSE_HEAD + chunk(sse_chunk("Hel")) + chunk(sse_chunk("lo")))
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
    try:
        t0 = time.monotonic()
        r = httpx.post(w.v1 + "/chat/completions", timeout=20, headers={"x-request-id": "cut-non-stream"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        assert time.monotonic() - t0 < 5
        assert r.status_code == 502 and r.json()["error"]["code"], r.text
        line = w.log_for("cut-non-stream")
        assert line["error"] is not None and line["bytes_out"] > 0, line
    finally:
        up.close()


def retry_after_upstream(value: str, hits: list):
    def answer(headers, body):
        hits.append(1)
        page = b'{"error":{"message":"slow down","type":"rate_limit_error"}}'
        return (b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: %s\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (value.encode(), len(page), page))
    return RawUpstream(answer)


@pytest.mark.parametrize("kind", ["http_date", "huge"])
def test_a_retry_after_date_or_huge_number_past_the_cap_is_not_retried(module_weir, kind):
    # RFC 9110 §10.2.3: Retry-After is delay-seconds or an HTTP-date. Past retry_after_cap either
    # way: the 429 goes to the client, not three attempts within milliseconds.
    value = (email.utils.formatdate(time.time() + 60, usegmt=True) if kind == "http_date"
             else "99999999999999999999")
    hits: list = []
    up = retry_after_upstream(value, hits)
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url], "retry": {
        "attempts": 3, "backoff": "10ms", "max_backoff": "50ms", "retry_after_cap": "2s"}}},
        "default_pool": "p"}, workers=1)
    try:
        r = httpx.post(w.v1 + "/chat/completions", timeout=20,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 429, r.text
        assert len(hits) == 1, hits
    finally:
        up.close()


def test_a_retry_after_date_within_the_cap_is_waited_for(module_weir):
    hits: list = []
    up = retry_after_upstream(email.utils.formatdate(time.time() + 2, usegmt=True), hits)
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url], "retry": {
        "attempts": 2, "backoff": "10ms", "max_backoff": "50ms", "retry_after_cap": "5s"}}},
        "default_pool": "p"}, workers=1)
    try:
        t0 = time.monotonic()
        r = httpx.post(w.v1 + "/chat/completions", timeout=20,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 429 and len(hits) == 2, (r.status_code, hits)
        assert time.monotonic() - t0 >= 0.9  # (a whole-second date: at least 1 s away)
    finally:
        up.close()


def test_reason_phrases_of_passed_through_statuses(module_weir):
    status = [307]

    def answer(headers, body):
        return b"HTTP/1.1 %d X\r\nLocation: /v1/x\r\nContent-Length: 0\r\n\r\n" % status[0]
    up = RawUpstream(answer)
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
    try:
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 307 and r.reason_phrase == "Temporary Redirect", r.reason_phrase
        status[0] = 425
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 425 and r.reason_phrase == "Too Early", r.reason_phrase
    finally:
        up.close()


def sse_body_answer(events: bytes):
    def answer(headers, body):
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(events)
                + events)
    return answer


@pytest.fixture(scope="module")
def odd(module_weir):
    """Models whose upstream sends one fixed SSE body: `nodone-blank` ends in `data: [DONE]` with no
    empty line; `early-done` sends [DONE] before any finish_reason; `no-finish` ends cleanly without
    a finish_reason or [DONE]."""
    ups = {
        "nodone-blank": RawUpstream(sse_body_answer(sse_chunk("Hel") + sse_chunk("lo", "stop") + b"data: [DONE]\n")),
        "early-done": RawUpstream(sse_body_answer(sse_chunk("Hel") + sse_chunk("lo") + b"data: [DONE]\n\n")),
        "no-finish": RawUpstream(sse_body_answer(sse_chunk("Hel") + sse_chunk("lo"))),
    }
    w = module_weir(config={"pools": {k: {"endpoints": [u.url]} for k, u in ups.items()},
                            "models": {k: {"pool": k} for k in ups}}, workers=1)
    yield w
    for u in ups.values():
        u.close()


def test_a_final_done_without_its_empty_line_ends_the_stream_whole(odd):
    client = openai.OpenAI(base_url=odd.v1, api_key="k", max_retries=0, timeout=10)
    chunks = list(client.chat.completions.create(model="nodone-blank", stream=True, extra_headers={
        "x-request-id": "nodone-blank-32"}, messages=[{"role": "user", "content": "hi"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert odd.log_for("nodone-blank-32")["error"] is None


def test_an_anthropic_stream_whose_upstream_sent_done_before_a_finish_is_an_error(odd):
    r = httpx.post(odd.base_url + "/v1/messages", timeout=10, headers={"x-request-id": "early-done-32"},
                   json={"model": "early-done", "max_tokens": 50, "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert "event: error" in r.text and "end_turn" not in r.text, r.text
    assert odd.log_for("early-done-32")["error"] is not None


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/responses"])
def test_a_translated_stream_cut_short_is_logged_as_failed(odd, route):
    body = ({"model": "no-finish", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            if route == "/v1/messages" else {"model": "no-finish", "input": "hi", "stream": True})
    rid = "cut-" + route.rsplit("/", 1)[1]
    r = httpx.post(odd.base_url + route, timeout=10, headers={"x-request-id": rid}, json=body)
    assert r.status_code == 200 and ("event: error" in r.text or "response.failed" in r.text), r.text
    line = odd.log_for(rid)
    assert line["error"] is not None and line["error"]["source"] == "upstream", line


# --------------------------------------------------------------------------- tenants and admission

def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_a_coalesced_generation_is_never_shared_across_tenants(module_mock, module_weir, request):
    # A 3 s first token: the second request reaches Weir while the first's generation runs, on a loaded
    # machine too (400 ms was not always: a follower that comes after it ends gets a generation of its own).
    up = module_mock("--ttft-ms", "3000", "--itl-ms", "5", "--max-tokens", "4")
    w = module_weir(config={
        "pools": {"p": {"endpoints": [up.base_url], "coalesce": True}}, "default_pool": "p",
        "tenants": {"t1": {}, "t2": {}},
        "auth": {"api_keys": [{"id": "k1", "sha256": sha("sk-t1"), "tenant": "t1"},
                              {"id": "k1b", "sha256": sha("sk-t1b"), "tenant": "t1"},
                              {"id": "k2", "sha256": sha("sk-t2"), "tenant": "t2"}]}}, workers=1)
    body = {"model": "mock-model", "temperature": 0, "max_tokens": 4, "messages": [{"role": "user", "content": "same"}]}

    http = httpx.Client(timeout=20)  # made once, before the pairs' requests (one costs ~50 ms of CPU)
    request.addfinalizer(http.close)

    def ask(key, rid):
        return http.post(w.v1 + "/chat/completions", json=body,
                         headers={"authorization": f"Bearer {key}", "x-request-id": rid})

    def pair(first, second, tag):
        with cf.ThreadPoolExecutor(2) as ex:
            a = ex.submit(ask, first, f"{tag}-a")
            wait_until(lambda: up.metric("vllm:num_requests_running") >= 1, 10, message="the first generation")
            b = ex.submit(ask, second, f"{tag}-b")
            assert a.result().status_code == 200 and b.result().status_code == 200
        return w.log_for(f"{tag}-a")["batch"]["id"], w.log_for(f"{tag}-b")["batch"]

    # Two keys of one tenant share one generation; two tenants each get their own.
    first, second = pair("sk-t1", "sk-t1b", "same-tenant")
    assert second["id"] == first and second["size"] == 2, second
    first, second = pair("sk-t1", "sk-t2", "two-tenants")
    assert second["id"] != first and second["size"] == 1, second


def test_count_tokens_is_not_held_to_the_token_limit(module_mock, module_weir):
    up = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = module_weir(config={
        "pools": {"p": {"endpoints": [up.base_url]}}, "default_pool": "p",
        "tenants": {"t": {"limits": {"tokens_per_minute": 60000, "tokens_burst": 1000}}},
        "auth": {"api_keys": [{"id": "k", "sha256": sha("sk-count"), "tenant": "t"}]}}, workers=1)
    r = httpx.post(w.base_url + "/v1/messages/count_tokens", timeout=10, headers={"x-api-key": "sk-count"},
                   json={"model": "m", "messages": [{"role": "user", "content": "word " * 1500}]})
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 1000
    # A generation that big still is held to it, its burst named.
    r = httpx.post(w.base_url + "/v1/messages", timeout=10, headers={"x-api-key": "sk-count"},
                   json={"model": "m", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 429 and "burst 1000" in r.json()["error"]["message"], r.text


def test_the_admin_port_answers_through_a_drain(module_mock, weir):
    up = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "200", "--max-tokens", "100")
    admin_port = free_port()
    w = weir(config={"pools": {"p": {"endpoints": [up.base_url]}}, "default_pool": "p",
                     "server": {"drain_timeout": "10s"},
                     "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_32"}},
             env={"WEIR_TEST_ADMIN_32": "admin-token-32-0123456789"})
    admin = f"http://127.0.0.1:{admin_port}"
    wait_until(lambda: answers(admin + "/ready"), 10, message="admin listener")
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=30,
                      json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as s:
        lines = s.iter_lines()
        next(lines)
        w.process.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: httpx.get(admin + "/ready", timeout=2).status_code == 503, 5, message="/ready 503")
        auth = {"authorization": "Bearer admin-token-32-0123456789"}
        assert httpx.get(admin + "/metrics", timeout=2, headers=auth).status_code == 200
        assert httpx.get(admin + "/admin/v1/stats", timeout=2, headers=auth).status_code == 200


def test_a_batched_non_streamed_member_without_an_answer_is_charged_nothing(module_mock, module_weir):
    # The batch's upstream stream had a 2xx head, then reset: the member's client got a 502 and
    # no head of its own, as the same request alone would (failing before its head): no charge.
    up = module_mock("--ttft-ms", "20", "--itl-ms", "5", "--max-tokens", "16", "--reset-after", "3")
    w = module_weir(config={
        "pools": {"b": {"endpoints": [up.base_url], "batch": {"window": "20ms", "max_size": 8}}},
        "default_pool": "b", "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "tenants": {"t": {}}, "auth": {"api_keys": [{"id": "k", "sha256": sha("sk-batch-32"), "tenant": "t"}]}},
        workers=1)
    r = httpx.post(w.v1 + "/completions", timeout=20,
                   headers={"authorization": "Bearer sk-batch-32", "x-request-id": "batch-502-32"},
                   json={"model": "mock-model", "prompt": "one two", "max_tokens": 6})
    assert r.status_code == 502, r.text
    line = w.log_for("batch-502-32")
    assert line["batch"]["size"] == 1 and line["spend_usd"] == 0, line
