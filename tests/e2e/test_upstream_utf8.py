"""Ill-formed UTF-8 from an upstream (stop 50).

DEFECT: an upstream's ill-formed UTF-8 reached OpenAI-route clients byte for byte: the openai Python SDK
decodes each SSE line strictly and raised UnicodeDecodeError mid-stream (its user lost the whole answer),
and a non-streamed body failed its json.loads the same way; the translated routes (/v1/messages,
/v1/responses) answered 502 or ended the stream with an in-band error, their translators refusing the chunk.
vLLM never sends ill-formed UTF-8 (its detokenizer gives U+FFFD for bytes that never complete a character),
so such an upstream is broken or is not vLLM, and its clients now get what vLLM would have sent: each
maximal ill-formed subsequence becomes one U+FFFD, exactly as Python's bytes.decode("utf-8", "replace"),
on every event and every JSON body, counted in weir_upstream_invalid_utf8_total{model}. A character the
upstream's framing splits across two reads is well-formed and passes as it came.

The upstream picks its answer by the request body's model (it reaches the upstream on every route), so
the same bytes are sent to the chat, Messages and Responses clients.
"""
from __future__ import annotations

import gzip
import json
import random

import httpx
import pytest

from scripted_upstream import ScriptedUpstream

ID = "chatcmpl-utf8"
USAGE = b'{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}'

# The content deltas of each model's answer: raw bytes (no quote, backslash or control byte, so the JSON
# around them stays JSON whatever they hold).
CASES: dict[str, list[bytes]] = {
    "inside": [b"Hello", b" w\xffor\xfeld", b"!"],             # bytes no UTF-8 has, inside a content delta
    "overlong": [b"a\xc0\x80b", b"\xe0\x80\xafc"],              # overlong NUL and '/'
    "surrogate": [b"x\xed\xa0\x80y", b"\xed\xbf\xbf"],          # U+D800, U+DFFF
    "above": [b"\xf4\x90\x80\x80!", b"\xf7\xbf\xbf\xbf"],       # U+110000, and past it
    "truncated": [b"ok ", b"cut \xe2\x82", b"\xf0\x9f\x98"],    # sequences cut short at the delta's end
    "split": [b"caf\xc3\xa9 ", b"\xe6\x97\xa5\xe6\x9c\xac ", b"\xf0\x9f\x98\x80 \xc2\xa0end"],  # well-formed
}
RNG = random.Random(50)
# Random deltas heavy in the bytes where UTF-8's ranges turn, against Python's own decoder.
_EDGES = [0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xe1, 0xed, 0xee, 0xef, 0xf0,
          0xf1, 0xf4, 0xf5, 0xff]
CASES["random"] = [bytes(RNG.choice(_EDGES) if RNG.random() < 0.6 else RNG.randrange(0x61, 0x7b)
                         for _ in range(RNG.randrange(1, 12))) for _ in range(60)]


def text_of(model: str, whole: bool = False) -> str:
    """The text a client gets: each delta (an event of its own) decoded by Python with errors="replace";
    `whole`: the deltas joined first, as one JSON body carries them."""
    if whole:
        return b"".join(CASES[model]).decode("utf-8", "replace")
    return "".join(piece.decode("utf-8", "replace") for piece in CASES[model])


def chunk(delta: bytes, finish: bytes = b"null") -> bytes:
    return (b'data: {"id":"' + ID.encode() + b'","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":[{"index":0,"delta":' + delta + b',"logprobs":null,"finish_reason":' + finish + b'}]}\n\n')


def sse_body(model: str) -> bytes:
    out = chunk(b'{"role":"assistant","content":""}')
    for piece in CASES[model]:
        out += chunk(b'{"content":"' + piece + b'"}')
    if model == "truncated":
        out += b": keep-alive \xe2\x82\n\n"  # a comment event that ends inside a sequence
    out += chunk(b"{}", b'"stop"')
    out += (b'data: {"id":"' + ID.encode() + b'","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":[],"usage":' + USAGE + b"}\n\n")
    return out + b"data: [DONE]\n\n"


def json_body(model: str) -> bytes:
    return (b'{"id":"' + ID.encode() + b'","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
            b'"message":{"role":"assistant","content":"' + b"".join(CASES[model]) + b'"},"logprobs":null,'
            b'"finish_reason":"stop"}],"usage":' + USAGE + b"}")


class Utf8Upstream(ScriptedUpstream):
    """Chat completions answered with CASES[model] (a stream, or the whole body; gzip-coded with
    `x-gzip: 1`); x-split splits a stream's body at the given offsets (ScriptedUpstream)."""

    def _reply(self, req):
        if req.target.split("?", 1)[0] != "/v1/chat/completions":
            return super()._reply(req)
        body = req.json()
        model = body["model"]
        if body.get("stream"):
            return 200, {"content-type": "text/event-stream"}, sse_body(model), True
        if req.header("x-gzip"):
            return 200, {"content-type": "application/json", "content-encoding": "gzip"}, \
                gzip.compress(json_body(model)), False
        return 200, {"content-type": "application/json"}, json_body(model), False


@pytest.fixture
def stack(weir):
    up = Utf8Upstream().start()
    w = weir(workers=1, config={
        "pools": {"p": {"endpoints": [up.base_url]}},
        "models": {name: {"pool": "p"} for name in CASES},
    })
    yield up, w
    up.stop()


def repaired(data: bytes) -> bytes:
    return data.decode("utf-8", "replace").encode()


BROKEN = [m for m in CASES if m != "split"]


@pytest.mark.parametrize("model", BROKEN)
def test_openai_sdk_reads_the_stream_with_replacement_characters(stack, model):
    up, w = stack
    stream = w.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == text_of(model)
    assert "\ufffd" in text
    assert w.metric("weir_upstream_invalid_utf8_total", model=model) >= 1


@pytest.mark.parametrize("model", BROKEN + ["split"])
def test_the_stream_is_the_upstreams_as_python_decodes_it(stack, model):
    """Byte for byte: the upstream's stream with each maximal ill-formed subsequence one U+FFFD (the client
    asks for usage, so no event is Weir's to drop). The well-formed one, split inside every multi-byte
    character across the upstream's reads, comes as it was sent and is not counted."""
    up, w = stack
    body = sse_body(model)
    headers = {}
    if model == "split":
        # An offset inside each character: its lead byte arrives in one read, the rest in the next.
        headers["x-split"] = ",".join(str(i + 1) for i in range(len(body)) if body[i] >= 0xc0)
    req = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True,
           "stream_options": {"include_usage": True}}
    r = httpx.post(w.v1 + "/chat/completions", json=req, headers=headers, timeout=30)
    assert r.status_code == 200
    assert r.content == repaired(body)
    r.content.decode("utf-8")  # strict
    counted = w.metric("weir_upstream_invalid_utf8_total", model=model)
    if model == "split":
        assert r.content == body and counted == 0
    else:
        # One per event that held ill-formed bytes (the comment of "truncated" among them).
        events = [e for e in body.split(b"\n\n") if repaired(e) != e]
        assert counted == len(events), (counted, len(events))


@pytest.mark.parametrize("model", BROKEN)
def test_a_whole_body_reaches_the_openai_sdk_repaired(stack, model):
    up, w = stack
    r = w.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == text_of(model, whole=True)
    raw = httpx.post(w.v1 + "/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "x"}]},
                     timeout=30)
    assert raw.content == repaired(json_body(model))


def test_a_gzip_body_goes_decoded_and_repaired_to_a_client_that_accepts_gzip(stack):
    up, w = stack
    with httpx.Client(timeout=30) as c:
        r = c.post(w.v1 + "/chat/completions", json={"model": "inside", "messages": [{"role": "user", "content": "x"}]},
                   headers={"accept-encoding": "gzip", "x-gzip": "1"})
    assert r.status_code == 200
    assert "content-encoding" not in r.headers  # the coded bytes held the ill-formed ones: sent decoded
    assert r.content == repaired(json_body("inside"))
    # A well-formed gzip body still goes as it came.
    with httpx.Client(timeout=30) as c:
        r = c.post(w.v1 + "/chat/completions", json={"model": "split", "messages": [{"role": "user", "content": "x"}]},
                   headers={"accept-encoding": "gzip", "x-gzip": "1"})
    assert r.headers.get("content-encoding") == "gzip" and r.content == json_body("split")


@pytest.mark.parametrize("model", ["inside", "truncated", "random"])
def test_translated_routes_answer_with_replacement_characters(stack, model):
    """They answered 502 (whole bodies) or ended the stream with an in-band error (their translators refused
    the chunk); they now carry the text as Python decodes it."""
    import anthropic
    up, w = stack
    want, whole = text_of(model), text_of(model, whole=True)
    a = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    msg = a.messages.create(model=model, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert "".join(b.text for b in msg.content if b.type == "text") == whole
    with a.messages.stream(model=model, max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == want
    client = w.client()
    assert client.responses.create(model=model, input="hi").output_text == whole
    events = list(client.responses.create(model=model, input="hi", stream=True))
    assert events[-1].type == "response.completed", events[-1]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
