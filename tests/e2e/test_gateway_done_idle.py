"""A stream ends for the client at its `data: [DONE]` (a translated stream: at its own end), not when the
upstream's body does (docs/reliability.md, "How a stream ends"). An upstream that sends [DONE] and then
goes idle, neither ending its chunked body nor closing the connection, must not hold the client's
response open until `timeouts.idle`: Weir ends the client's response at once (the chunked terminator,
the client connection kept alive), logs the request once as complete with the usage it saw, and closes
the upstream connection rather than pooling it (its body never ended). An upstream that ends its body
with its [DONE] keeps its connection pooled.

Every shape Weir relays or translates: chat and completions passthrough, an OpenAI upstream read by an
Anthropic Messages or Responses client, an Anthropic upstream (message_stop, then idle) read by each
client, coalesced and micro-batched streams, and a stream with resume on. The idle timeout is 30 s; a
response that completes within 5 s did not wait for it (a behaviour check, not a speed test).

The upstream is a raw-socket server in the test: it answers by path (chat, completions, Anthropic
messages) and holds the connection open after its last event; `x-idle-mode: ended` ends the body with
the events instead.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time

import anthropic
import httpx
import openai
import pytest

import httpwire
from conftest import wait_until

IDLE_S = 30
PROMPT, COMPLETION = 5, 2
# pricing below: 1 USD per million prompt tokens, 2 per million completion tokens
SPEND = (PROMPT * 1.0 + COMPLETION * 2.0) / 1e6
FAST_S = 5.0  # far below IDLE_S: the response did not wait for the idle timeout


def ev(obj, event: str | None = None) -> bytes:
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def text_chunk(text: str, finish: str | None = None) -> dict:
    return {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "mock-model",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def usage_chunk(obj: str) -> dict:
    return {"id": "x", "object": obj, "created": 1, "model": "mock-model", "choices": [],
            "usage": {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "total_tokens": PROMPT + COMPLETION}}


DONE = b"data: [DONE]\n\n"
CHAT = [ev(chat_chunk({"role": "assistant", "content": ""})), ev(chat_chunk({"content": " w0"})),
        ev(chat_chunk({"content": " w1"})), ev(chat_chunk({}, "stop")), ev(usage_chunk("chat.completion.chunk")), DONE]
TEXT = [ev(text_chunk(" w0")), ev(text_chunk(" w1")), ev(text_chunk("", "stop")), ev(usage_chunk("text_completion")),
        DONE]
ANTHROPIC = [
    ev({"type": "message_start", "message": {
        "id": "msg_idle", "type": "message", "role": "assistant", "model": "claude-x", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": PROMPT, "output_tokens": 1}}},
       "message_start"),
    ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
       "content_block_start"),
    ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " w0"}},
       "content_block_delta"),
    ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " w1"}},
       "content_block_delta"),
    ev({"type": "content_block_stop", "index": 0}, "content_block_stop"),
    ev({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": COMPLETION}}, "message_delta"),
    ev({"type": "message_stop"}, "message_stop"),
]


class IdleUpstream:
    """Streams the events of the request's path, then holds the connection open without ending the
    chunked body (`x-idle-mode: ended`: ends it, keep-alive). Counts connections and the ones Weir closed."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.accepted = 0
        self.closed_by_weir = 0
        self.requests: list[tuple[str, dict]] = []  # (path, body)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        with conn:
            buf = b""
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        got = conn.recv(65536)
                        if not got:  # Weir closed it (after an idle hold, or a pooled one at shutdown)
                            with self.lock:
                                self.closed_by_weir += 1
                            return
                        buf += got
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    lines = head.split(b"\r\n")
                    path = lines[0].split()[1].decode()
                    headers = {k.strip().lower(): v.strip() for k, _, v in
                               (ln.decode().partition(":") for ln in lines[1:])}
                    need = int(headers.get("content-length", "0"))
                    while len(buf) < need:
                        buf += conn.recv(65536)
                    body, buf = buf[:need], buf[need:]
                    with self.lock:
                        self.requests.append((path, json.loads(body or b"{}")))
                    events = ANTHROPIC if path.endswith("/messages") else TEXT if path.endswith("/completions") \
                        and "chat" not in path else CHAT
                    out = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                           b"transfer-encoding: chunked\r\n\r\n")
                    out += b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
                    if headers.get("x-idle-mode") == "ended":
                        conn.sendall(out + b"0\r\n\r\n")
                        continue
                    if headers.get("x-idle-mode") == "late":  # as uvicorn: the end in a write of its own, just after
                        conn.sendall(out)
                        time.sleep(0.01)
                        conn.sendall(b"0\r\n\r\n")
                        continue
                    conn.sendall(out)
                    # Idle: no terminating chunk, the connection open, until Weir closes it (or the test ends).
            except OSError:
                return

    def close(self):
        self.sock.close()


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(up: IdleUpstream, **pool) -> dict:
    timeouts = {"idle": f"{IDLE_S}s", "first_byte": f"{IDLE_S}s"}
    return {"pools": {"idle": {"endpoints": [up.base_url], "timeouts": timeouts, **pool},
                      "claude": {"type": "anthropic", "endpoints": [up.base_url], "timeouts": timeouts,
                                 "api_key_env": "WEIR_TEST_IDLE_ANTHROPIC_KEY"}},
            "models": {"mock-model": {"pool": "idle"}, "claude-x": {"pool": "claude"}},
            "tenants": {"t": {"budget": {"usd": 1.0}}},
            "auth": {"api_keys": [{"id": "k", "sha256": sha("sk-k"), "tenant": "t"}]},
            "pricing": {"*": {"input": 1.0, "output": 2.0}}}


@pytest.fixture(scope="module")
def upstream():
    up = IdleUpstream()
    yield up
    up.close()


@pytest.fixture(scope="module")
def gw(module_weir, upstream):
    return module_weir(config=config(upstream), env={"WEIR_TEST_IDLE_ANTHROPIC_KEY": "sk-ant"})


AUTH = {"authorization": "Bearer sk-k"}


def spend(w) -> float:
    return w.metric("weir_spend_usd_total")


def assert_settled_once(w, rids: list[str], spend_before: float) -> None:
    """One access-log line per request, complete (200, no error), with the usage the stream carried;
    each metered once."""
    for rid in rids:
        entry = w.log_for(rid)
        assert entry["status"] == 200 and entry["error"] is None, entry
        assert (entry["prompt_tokens"], entry["completion_tokens"]) == (PROMPT, COMPLETION)
        assert entry["spend_usd"] == pytest.approx(SPEND)
    want = spend_before + len(rids) * SPEND
    wait_until(lambda: spend(w) == pytest.approx(want), message="spend metered")
    time.sleep(0.2)  # and not a second time
    assert spend(w) == pytest.approx(want)


def assert_upstream_closed(up: IdleUpstream, closed_before: int) -> None:
    # The held connection was closed by Weir at the stream's end, not kept (its body never ended).
    wait_until(lambda: up.closed_by_weir > closed_before, timeout=FAST_S, message="the idle upstream connection closed")


def stream_body(path: str, rid: str, **extra) -> dict:
    if path == "/v1/completions":
        return {"model": "mock-model", "prompt": "hi", "stream": True, **extra}
    if path == "/v1/messages":
        return {"model": extra.pop("model", "mock-model"), "max_tokens": 50, "stream": True,
                "messages": [{"role": "user", "content": "hi"}], **extra}
    if path == "/v1/responses":
        return {"model": extra.pop("model", "mock-model"), "input": "hi", "stream": True, **extra}
    return {"model": extra.pop("model", "mock-model"), "messages": [{"role": "user", "content": "hi"}],
            "stream": True, **extra}


def raw_stream(conn: httpwire.RawConn, path: str, rid: str, **extra) -> httpwire.Response:
    """One streaming request on a kept-alive raw connection; the whole chunked response, timed."""
    conn.send(httpwire.request("POST", path, stream_body(path, rid, **extra), {**AUTH, "x-request-id": rid}))
    t0 = time.monotonic()
    r = conn.read_response("POST")
    r.elapsed = time.monotonic() - t0
    return r


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_done_then_idle_ends_the_clients_response_at_once(gw, upstream, path):
    closed, s0 = upstream.closed_by_weir, spend(gw)
    rid = "idle-raw-" + path.strip("/").replace("/", "-")
    with httpwire.RawConn(gw.port, timeout=IDLE_S + 10) as c:
        r = raw_stream(c, path, rid)
        # Complete (its chunked terminator), long before the idle timeout, and the connection kept alive.
        assert r.status == 200 and r.chunked and r.elapsed < FAST_S
        assert (r.header("connection") or "").lower() != "close"
        events = httpwire.sse_data(r.body)
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in ch for ch in chunks)
        key = "delta" if "chat" in path else None
        text = "".join((ch["choices"][0]["delta"].get("content") or "") if key else ch["choices"][0]["text"]
                       for ch in chunks if ch["choices"])
        assert text == " w0 w1"  # every token once
        # The same client connection serves a second request.
        r2 = raw_stream(c, path, rid + "-again")
        assert r2.status == 200 and r2.elapsed < FAST_S and httpwire.sse_data(r2.body)[-1] == "[DONE]"
    assert_settled_once(gw, [rid, rid + "-again"], s0)
    assert_upstream_closed(upstream, closed)


def test_done_then_idle_with_the_openai_sdk_and_httpx(gw, upstream):
    client = gw.client(api_key="sk-k", timeout=IDLE_S + 10)
    s0 = spend(gw)
    t0 = time.monotonic()
    chunks = list(client.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_headers={"x-request-id": "idle-sdk"}))
    assert time.monotonic() - t0 < FAST_S
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == " w0 w1"
    assert chunks[-1].usage.completion_tokens == COMPLETION
    assert_settled_once(gw, ["idle-sdk"], s0)
    # httpx reads the body to its end: it gets it, on a connection it can use again.
    with httpx.Client(base_url=gw.base_url, timeout=IDLE_S + 10, headers=AUTH) as h:
        for i in range(2):
            t0 = time.monotonic()
            r = h.post("/v1/chat/completions", json=stream_body("/v1/chat/completions", ""),
                       headers={"x-request-id": f"idle-httpx-{i}"})
            assert r.status_code == 200 and time.monotonic() - t0 < FAST_S
            assert httpwire.sse_data(r.content)[-1] == "[DONE]"
            entry = gw.log_for(f"idle-httpx-{i}")
            assert entry["status"] == 200 and entry["error"] is None
            assert (entry["prompt_tokens"], entry["completion_tokens"]) == (PROMPT, COMPLETION)


def test_a_body_that_ends_with_its_done_keeps_its_upstream_connection(gw, upstream):
    # The upstream ends its body with [DONE]: the connection goes back to the pool and serves the next stream.
    hdr = {**AUTH, "x-idle-mode": "ended"}
    with httpx.Client(base_url=gw.base_url, timeout=IDLE_S + 10, headers=hdr) as h:
        r = h.post("/v1/chat/completions", json=stream_body("/v1/chat/completions", ""))
        assert httpwire.sse_data(r.content)[-1] == "[DONE]"
        accepted = upstream.accepted
        for _ in range(3):
            r = h.post("/v1/chat/completions", json=stream_body("/v1/chat/completions", ""))
            assert httpwire.sse_data(r.content)[-1] == "[DONE]"
    assert upstream.accepted == accepted


def test_a_body_end_written_just_after_its_done_keeps_its_upstream_connection(gw, upstream):
    # uvicorn (vLLM's server) writes the chunked terminator in a write of its own a moment after
    # [DONE]: Weir waits a short grace for it, so the connection is pooled, not replaced per stream.
    hdr = {**AUTH, "x-idle-mode": "late"}
    with httpx.Client(base_url=gw.base_url, timeout=IDLE_S + 10, headers=hdr) as h:
        r = h.post("/v1/chat/completions", json=stream_body("/v1/chat/completions", ""))
        assert httpwire.sse_data(r.content)[-1] == "[DONE]"
        accepted = upstream.accepted
        for _ in range(3):
            t0 = time.monotonic()
            r = h.post("/v1/chat/completions", json=stream_body("/v1/chat/completions", ""))
            assert httpwire.sse_data(r.content)[-1] == "[DONE]" and time.monotonic() - t0 < FAST_S
    assert upstream.accepted == accepted


@pytest.mark.parametrize("path,model,last", [
    ("/v1/messages", "mock-model", "message_stop"),         # an OpenAI upstream, translated for an Anthropic client
    ("/v1/responses", "mock-model", "response.completed"),  # ... for a Responses client
    ("/v1/messages", "claude-x", "message_stop"),           # an Anthropic upstream, passed through
    ("/v1/chat/completions", "claude-x", "[DONE]"),         # ... translated into chat chunks
    ("/v1/responses", "claude-x", "response.completed"),    # ... and into Responses events
])
def test_every_translated_stream_ends_at_its_end(gw, upstream, path, model, last):
    closed, s0 = upstream.closed_by_weir, spend(gw)
    rid = f"idle-{path.rsplit('/', 1)[1]}-{model}"
    with httpwire.RawConn(gw.port, timeout=IDLE_S + 10) as c:
        r = raw_stream(c, path, rid, model=model)
        assert r.status == 200 and r.chunked and r.elapsed < FAST_S
        events = httpwire.sse_data(r.body)
        got = events[-1] if last == "[DONE]" else json.loads(events[-1])["type"]
        assert got == last
        text = ""
        for e in events:
            if e == "[DONE]":
                continue
            d = json.loads(e)
            assert "error" not in d and d.get("type") not in ("error", "response.failed"), d
            if d.get("type") == "content_block_delta":
                text += d["delta"]["text"]
            elif d.get("type") == "response.output_text.delta":
                text += d["delta"]
            elif d.get("choices"):
                text += d["choices"][0]["delta"].get("content") or ""
        assert text == " w0 w1"
        r2 = raw_stream(c, path, rid + "-again", model=model)
        assert r2.status == 200 and r2.elapsed < FAST_S
    assert_settled_once(gw, [rid, rid + "-again"], s0)
    assert_upstream_closed(upstream, closed)


def test_the_anthropic_sdk_gets_the_whole_message(gw):
    client = anthropic.Anthropic(base_url=gw.base_url, api_key="sk-k", max_retries=0, timeout=IDLE_S + 10)
    t0 = time.monotonic()
    with client.messages.stream(model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                                extra_headers={"x-request-id": "idle-anthropic-sdk"}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert time.monotonic() - t0 < FAST_S
    assert text == " w0 w1" and final.stop_reason == "end_turn" and final.usage.output_tokens == COMPLETION


@pytest.mark.parametrize("pool", [{"resume": True}, {"coalesce": True},
                                  {"batch": {"window": "20ms", "max_size": 4}}], ids=["resume", "coalesce", "batch"])
def test_resumable_coalesced_and_batched_streams_end_at_done(weir, upstream, pool):
    w = weir(config=config(upstream, **pool), env={"WEIR_TEST_IDLE_ANTHROPIC_KEY": "sk-ant"})
    path = "/v1/completions" if "batch" in pool else "/v1/chat/completions"
    extra = {"temperature": 0} if "coalesce" in pool else {}
    closed, s0 = upstream.closed_by_weir, spend(w)
    with httpwire.RawConn(w.port, timeout=IDLE_S + 10) as c:
        r = raw_stream(c, path, "idle-shape", **extra)
        assert r.status == 200 and r.chunked and r.elapsed < FAST_S
        events = httpwire.sse_data(r.body)
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        assert not any("error" in json.loads(e) for e in events[:-1])
        r2 = raw_stream(c, path, "idle-shape-again", **extra)
        assert r2.status == 200 and r2.elapsed < FAST_S and httpwire.sse_data(r2.body)[-1] == "[DONE]"
    entry = w.log_for("idle-shape")
    assert entry["status"] == 200 and entry["error"] is None
    if "batch" not in pool:  # (a batch member's usage is its own share, from per-chunk usage vLLM sends)
        assert_settled_once(w, ["idle-shape", "idle-shape-again"], s0)
    assert_upstream_closed(upstream, closed)
    assert w.metric("weir_upstream_resumes_total") == 0
