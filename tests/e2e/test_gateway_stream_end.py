"""How an OpenAI stream's end reaches the client (docs/reliability.md, "How a stream ends"): vLLM always
ends a stream with `data: [DONE]`, so a passthrough chat or completions stream whose body ends without
it (a chunked body that just stops, a close-delimited body closed early, even one that had its
finish_reason and usage) is a broken stream: the tokens already relayed, then Weir's in-band error and
one [DONE], so the openai SDK raises; one access-log line with the upstream's error; counted as a
`protocol` failure. After [DONE] nothing more of the upstream's reaches the client. The usage chunk Weir
asks for on a client's behalf is dropped by its shape, also when its counts are invalid (then the
request is metered as one without usage).

The upstream is a small raw-socket server in the test (weir-mock always ends its streams well), which
misbehaves per the request's `x-bad-mode` header.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading

import httpx
import openai
import pytest

MSG = [{"role": "user", "content": "hi"}]
INCOMPLETE = "ended the stream before it was complete"


def chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def text_chunk(text: str, finish: str | None = None) -> dict:
    return {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "mock-model",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def usage_chunk(prompt: int, completion: int) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
            "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}


def ev(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


DONE = b"data: [DONE]\n\n"
ROLE = ev(chat_chunk({"role": "assistant", "content": ""}))
W = [ev(chat_chunk({"content": f" w{i}"})) for i in range(3)]
FINISH = ev(chat_chunk({}, "stop"))
USAGE = ev(usage_chunk(5, 2))

# The events of each mode, and how the body ends: "chunked" (a complete chunked body: the upstream just
# stopped), "close" (no length and no chunking: the connection's close ends the body).
MODES: dict[str, tuple[list[bytes], str]] = {
    "ok": ([ROLE, W[0], W[1], FINISH, USAGE, DONE], "chunked"),
    "eof_no_done": ([ROLE, W[0], W[1]], "chunked"),
    "close_delim_sse": ([ROLE, W[0], W[1]], "close"),
    "finish_no_done": ([ROLE, W[0], W[1], FINISH, USAGE], "chunked"),
    "role_only_no_done": ([ROLE], "chunked"),
    "double_done": ([ROLE, W[0], W[1], FINISH, USAGE, DONE, ev(chat_chunk({"content": " AFTER"})), b": late\n\n",
                     DONE], "chunked"),
    "neg_usage": ([ROLE, W[0], FINISH, ev(usage_chunk(-1000, -5000)), DONE], "chunked"),
    "text_no_done": ([ev(text_chunk(" w0")), ev(text_chunk(" w1"))], "chunked"),
    # A whole stream, then the connection closes before the chunked body's end ("cut").
    "done_then_cut": ([ROLE, W[0], W[1], FINISH, USAGE, DONE], "cut"),
    # [DONE] padded with spaces: the openai SDKs end on data that starts with "[DONE]".
    "done_padded": ([ROLE, W[0], W[1], FINISH, b"data: [DONE]  \n\n"], "chunked"),
}


class BadUpstream:
    """Answers every request with the stream of its `x-bad-mode` (default "ok"), keep-alive for a chunked
    body; records each request's mode and body."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.requests: list[tuple[str, dict]] = []
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
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        with conn:
            buf = b""
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        got = conn.recv(65536)
                        if not got:
                            return
                        buf += got
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    headers = {k.strip().lower(): v.strip() for k, _, v in
                               (ln.decode().partition(":") for ln in head.split(b"\r\n")[1:])}
                    need = int(headers.get("content-length", "0"))
                    while len(buf) < need:
                        buf += conn.recv(65536)
                    body, buf = buf[:need], buf[need:]
                    mode = headers.get("x-bad-mode", "ok")
                    self.requests.append((mode, json.loads(body or b"{}")))
                    events, ending = MODES[mode]
                    out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                    if ending == "close":
                        conn.sendall(out + b"connection: close\r\n\r\n" + b"".join(events))
                        return
                    out += b"transfer-encoding: chunked\r\n\r\n"
                    out += b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
                    if ending == "cut":
                        conn.sendall(out)
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    conn.sendall(out + b"0\r\n\r\n")
            except OSError:
                return

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def upstream():
    up = BadUpstream()
    yield up
    up.close()


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(*endpoints: str, **pool) -> dict:
    return {"pools": {"bad": {"endpoints": list(endpoints), **pool}},
            "models": {"mock-model": {"pool": "bad"}},
            "tenants": {"t": {"budget": {"usd": 1.0}}},
            "auth": {"api_keys": [{"id": "k", "sha256": sha("sk-k"), "tenant": "t"}]},
            "pricing": {"*": {"input": 1.0, "output": 2.0}}}


@pytest.fixture(scope="module")
def gw(module_weir, upstream):
    return module_weir(config=config(upstream.base_url))


def raw_events(w, mode: str, rid: str, path: str = "/v1/chat/completions", **body) -> list[str]:
    """The data of every SSE event the client got, in order ([DONE] included)."""
    payload = {"model": "mock-model", "stream": True, **body}
    if path.endswith("chat/completions"):
        payload.setdefault("messages", MSG)
    else:
        payload.setdefault("prompt", "hi")
    with httpx.stream("POST", w.base_url + path, json=payload, timeout=30,
                      headers={"authorization": "Bearer sk-k", "x-bad-mode": mode, "x-request-id": rid}) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    out = []
    for block in raw.split("\n\n"):
        lines = [ln[6:] for ln in block.split("\n") if ln.startswith("data: ")]
        if lines:
            out.append("\n".join(lines))
    return out


def sdk_stream(w, mode: str, rid: str, **kw):
    client = w.client(api_key="sk-k")
    return client.chat.completions.create(model="mock-model", messages=MSG, stream=True,
                                          extra_headers={"x-bad-mode": mode, "x-request-id": rid}, **kw)


def protocol_failures(w) -> float:
    return w.metric("weir_upstream_failures_total", kind="protocol")


@pytest.mark.parametrize("mode", ["eof_no_done", "close_delim_sse", "finish_no_done"])
def test_a_chat_stream_that_ends_without_done_is_broken_and_the_sdk_raises(gw, mode):
    before = protocol_failures(gw)
    got = []
    with pytest.raises(openai.APIError) as exc:
        for chunk in sdk_stream(gw, mode, f"end-sdk-{mode}"):
            got.append(chunk)
    assert INCOMPLETE in exc.value.message and "pool `bad`" in exc.value.message
    assert exc.value.body["code"] == "upstream_unavailable"
    # Every token relayed before the end is the client's, once.
    assert [c.choices[0].delta.content for c in got if c.choices and c.choices[0].delta.content] == [" w0", " w1"]
    finishes = [c.choices[0].finish_reason for c in got if c.choices and c.choices[0].finish_reason]
    assert finishes == (["stop"] if mode == "finish_no_done" else [])
    assert all(c.usage is None for c in got)  # the usage chunk Weir asked for stays Weir's
    entry = gw.log_for(f"end-sdk-{mode}")  # exactly one line
    assert entry["status"] == 200
    assert entry["error"] == {"source": "upstream", "code": "upstream_unavailable"}
    if mode == "finish_no_done":  # the usage came: metered as reported
        assert (entry["prompt_tokens"], entry["completion_tokens"]) == (5, 2)
    else:
        assert entry["prompt_tokens"] is None
    assert entry["spend_usd"] > 0
    assert protocol_failures(gw) == before + 1


@pytest.mark.parametrize("mode", ["eof_no_done", "close_delim_sse", "finish_no_done"])
def test_on_the_wire_the_tokens_then_one_error_and_one_done(gw, mode):
    events = raw_events(gw, mode, f"end-raw-{mode}")
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    err = json.loads(events[-2])["error"]
    assert set(err) == {"message", "type", "param", "code"} and INCOMPLETE in err["message"]
    chunks = [json.loads(e) for e in events[:-2]]
    assert not any("error" in c for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == " w0 w1"


def test_a_completions_stream_that_ends_without_done_is_broken(gw):
    client = gw.client(api_key="sk-k")
    got = []
    with pytest.raises(openai.APIError, match=INCOMPLETE):
        for chunk in client.completions.create(model="mock-model", prompt="hi", stream=True,
                                               extra_headers={"x-bad-mode": "text_no_done",
                                                              "x-request-id": "end-completions"}):
            got.append(chunk.choices[0].text)
    assert got == [" w0", " w1"]
    entry = gw.log_for("end-completions")
    assert entry["error"] == {"source": "upstream", "code": "upstream_unavailable"}


def test_a_complete_stream_is_untouched(gw):
    chunks = list(sdk_stream(gw, "ok", "end-ok", stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " w0 w1"
    assert chunks[-1].usage.completion_tokens == 2
    entry = gw.log_for("end-ok")
    assert entry["status"] == 200 and entry["error"] is None


def test_nothing_after_done_reaches_the_client(gw):
    events = raw_events(gw, "double_done", "end-double-done")
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    assert not any("AFTER" in e for e in events)
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == " w0 w1"
    assert not any("usage" in c for c in chunks)  # Weir's usage chunk, before [DONE], dropped as ever
    entry = gw.log_for("end-double-done")
    assert entry["status"] == 200 and entry["error"] is None
    assert entry["events"] == len(events)  # the events the client got: role, two tokens, finish, [DONE]
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (5, 2)  # the usage after [DONE] is not read


def test_a_usage_chunk_with_invalid_counts_never_reaches_a_client_that_did_not_ask(gw, upstream):
    asked = len(upstream.requests)
    got = list(sdk_stream(gw, "neg_usage", "end-neg-usage"))
    # Weir asked for the usage on the client's behalf ...
    mode, body = upstream.requests[asked]
    assert mode == "neg_usage" and body["stream_options"] == {"include_usage": True}
    # ... and the client, which did not, gets only chunks with a choice (choices[0] never fails).
    assert all(c.choices and c.usage is None for c in got)
    assert [c.choices[0].delta.content for c in got if c.choices[0].delta.content] == [" w0"]
    events = raw_events(gw, "neg_usage", "end-neg-usage-raw")
    assert events[-1] == "[DONE]" and not any('"usage"' in e for e in events)
    # Invalid counts are no usage: metered as a stream without one, never a negative charge.
    for rid in ("end-neg-usage", "end-neg-usage-raw"):
        entry = gw.log_for(rid)
        assert entry["status"] == 200 and entry["error"] is None
        assert entry["prompt_tokens"] is None and entry["completion_tokens"] is None
        assert entry["spend_usd"] >= 0


def test_a_client_that_asked_for_usage_gets_the_chunk_as_the_upstream_sent_it(gw):
    events = raw_events(gw, "neg_usage", "end-neg-usage-asked", stream_options={"include_usage": True})
    usage = [json.loads(e) for e in events if '"usage"' in e]
    assert len(usage) == 1 and usage[0]["usage"]["prompt_tokens"] == -1000
    assert gw.log_for("end-neg-usage-asked")["prompt_tokens"] is None


def test_a_held_stream_that_ends_without_done_or_content_fails_over(weir, mock, upstream):
    # With a fallback left the head waits for the first content: the role-only stream that just stops
    # sent the client nothing, so the fallback answers, and the client sees one whole stream.
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "3")
    cfg = config(upstream.base_url)
    cfg["pools"]["good"] = {"endpoints": [m.base_url]}
    cfg["models"]["mock-model"]["fallbacks"] = [{"pool": "good"}]
    w = weir(config=cfg)
    chunks = list(sdk_stream(w, "role_only_no_done", "end-held"))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    entry = w.log_for("end-held")
    assert entry["status"] == 200 and entry["error"] is None and entry["pool"] == "good"
    assert [a["failure"] for a in entry["attempts"]] == ["protocol", None]
    assert w.metric("weir_upstream_failures_total", kind="protocol") == 1


@pytest.mark.parametrize("mode", ["eof_no_done", "close_delim_sse"])
def test_with_resume_on_and_no_other_endpoint_the_break_is_the_in_band_error(weir, upstream, mode):
    w = weir(config=config(upstream.base_url, resume=True))
    with pytest.raises(openai.APIError, match=INCOMPLETE):
        list(sdk_stream(w, mode, f"end-resume-{mode}"))
    assert w.log_for(f"end-resume-{mode}")["error"]["code"] == "upstream_unavailable"


def test_with_resume_on_a_stream_that_lost_only_its_done_gets_it(weir, upstream):
    # The finish_reason reached the client: nothing is generated again, the stream just gets its [DONE].
    w = weir(config=config(upstream.base_url, resume=True))
    chunks = list(sdk_stream(w, "finish_no_done", "end-resume-finish"))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " w0 w1"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    entry = w.log_for("end-resume-finish")
    assert entry["status"] == 200 and entry["error"] is None
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (5, 2)
    assert w.metric("weir_upstream_failures_total", kind="protocol") == 1
    assert w.metric("weir_upstream_resumes_total") == 0


@pytest.mark.parametrize("resume", [False, True])
def test_an_upstream_that_fails_after_its_done_costs_only_its_connection(module_weir, upstream, resume):
    # The stream was whole at [DONE]: a close before the body's end is no error after it, no failure
    # counted against the endpoint (which would feed its ejection), and never a resume's second [DONE].
    w = module_weir(config=config(upstream.base_url, **({"resume": True} if resume else {})))
    rid = f"end-after-done-{resume}"
    before = (w.metric("weir_upstream_failures_total", kind="reset"), protocol_failures(w))
    events = raw_events(w, "done_then_cut", rid)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert not any("error" in json.loads(e) for e in events[:-1])
    entry = w.log_for(rid)
    assert entry["status"] == 200 and entry["error"] is None
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (5, 2)
    assert (w.metric("weir_upstream_failures_total", kind="reset"), protocol_failures(w)) == before
    # The SDK's view: a complete stream.
    got = [c.choices[0].delta.content for c in sdk_stream(w, "done_then_cut", rid + "-sdk")
           if c.choices and c.choices[0].delta.content]
    assert got == [" w0", " w1"]


def test_a_done_padded_with_spaces_ends_the_stream(gw):
    events = raw_events(gw, "done_padded", "end-padded")
    assert events.count("[DONE]  ") == 1 and events[-1] == "[DONE]  "
    assert not any(INCOMPLETE in e for e in events)
    assert gw.log_for("end-padded")["error"] is None
