"""SDK-facing error shapes found by stop 60's SDK round (sdk60).

F1: on the OpenAI routes an upstream's error body passed as it came. vLLM before 0.10.1 answers
{"object":"error","message",...,"code":400} (the Node SDK showed "400 status code (no body)", openai-go an empty
Error), every vLLM version writes its status as an integer `code` (openai-java's e.code() throws: OpenAI's code
is a string or null), also in a stream's error event, and a proxy in front of vLLM answers an HTML page. They now
reach the client in OpenAI's error shape; a body that is one already passes byte for byte.

F2: answers in Anthropic's shape off /v1/messages (the model list asked with anthropic-version, /v1/messages/*
Weir does not serve) carried only x-request-id, and the Anthropic SDKs read `request-id` (err.request_id was
None); /v1/files asked by the Anthropic SDK (beta.files) got OpenAI's 404 shape.
"""
from __future__ import annotations

import gzip
import json

import anthropic
import httpx
import openai
import pytest

from test_defect_fixes import RawUpstream

LEGACY = b'{"object":"error","message":"max_tokens must be at least 1, got 0.","type":"BadRequestError",' \
         b'"param":null,"code":400}'
NESTED_INT = b'{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens",' \
             b'"code":400}}'
OPENAI_SHAPE = b'{"error": {"message": "no such tool", "type": "invalid_request_error", "param": "tools", ' \
               b'"code": "bad_tool", "extra": 1}}\n'
HTML = b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>nginx</body>\r\n</html>\r\n"


def _answer(status: int, body: bytes, ctype: bytes = b"application/json", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d Error\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
            % (status, ctype, len(body), extra) + body)


@pytest.fixture
def upstream():
    ups = []

    def make(answer):
        up = RawUpstream(answer)
        ups.append(up)
        return up

    yield make
    for up in ups:
        up.close()


def _gateway(weir, url):
    return weir(config={"pools": {"p": {"endpoints": [url]}}, "models": {"m": {"pool": "p"}}}, workers=1)


def _call(client: openai.OpenAI, route: str):
    if route == "chat":
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    if route == "completions":
        return client.completions.create(model="m", prompt="hi")
    if route == "embeddings":
        return client.embeddings.create(model="m", input="hi")
    return client.audio.transcriptions.create(model="m", file=("a.wav", b"RIFF0000WAVE", "audio/wav"))


ROUTES = ["chat", "completions", "embeddings", "transcriptions"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("body,status,ctype,want", [
    (LEGACY, 400, b"application/json", {"message": "max_tokens must be at least 1, got 0.", "type": "BadRequestError",
                                        "param": None, "code": None}),
    (NESTED_INT, 400, b"application/json", {"message": "max_tokens is too large", "type": "BadRequestError",
                                            "param": "max_tokens", "code": None}),
    (HTML, 502, b"text/html", {"message": "Upstream answered 502: <html> <head><title>502 Bad Gateway</title></head> "
                                          "<body>nginx</body> </html>", "type": "server_error", "param": None,
                               "code": None}),
    (b"", 503, b"text/plain", {"message": "Upstream answered 503.", "type": "server_error", "param": None,
                               "code": None}),
    (b'{"error":"model m is not loaded"}', 404, b"application/json",
     {"message": "model m is not loaded", "type": "invalid_request_error", "param": None, "code": None}),
], ids=["vllm-legacy", "vllm-int-code", "html", "empty", "error-string"])
def test_upstream_errors_reach_openai_clients_in_openais_shape(weir, upstream, route, body, status, ctype, want):
    up = upstream(lambda h, b: _answer(status, body, ctype, b"x-upstream-own: kept\r\n"))
    w = _gateway(weir, up.url)
    client = openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        _call(client, route)
    err = e.value
    assert err.status_code == status
    # The SDK's typed fields: code a string or None (never vLLM's integer), the body the error object.
    assert err.body == want, err.body
    assert err.code is None and err.type == want["type"] and want["message"] in err.message, err
    # The status and Weir's fields kept; the upstream's own too; the body labelled as what it is now.
    r = err.response
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers.get("x-request-id") and r.headers.get("x-upstream-own") == "kept", r.headers
    assert r.json() == {"error": want}


# A body in OpenAI's shape is the upstream's word: byte for byte (its spacing, its extra member, its newline).
@pytest.mark.parametrize("route", ["chat", "embeddings"])
def test_openai_shaped_upstream_error_passes_byte_for_byte(weir, upstream, route):
    up = upstream(lambda h, b: _answer(422, OPENAI_SHAPE))
    w = _gateway(weir, up.url)
    path = "/chat/completions" if route == "chat" else "/embeddings"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]} if route == "chat" else \
        {"model": "m", "input": "x"}
    r = httpx.post(w.v1 + path, json=body, timeout=10)
    assert r.status_code == 422 and r.content == OPENAI_SHAPE, r.content
    with pytest.raises(openai.UnprocessableEntityError) as e:
        _call(openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0), route)
    assert e.value.code == "bad_tool" and e.value.param == "tools"


# A gzip body (the client accepted it) is read decoded and written plain once reshaped.
def test_gzip_legacy_error_is_reshaped(weir, upstream):
    up = upstream(lambda h, b: _answer(400, gzip.compress(LEGACY), extra=b"content-encoding: gzip\r\n"))
    w = _gateway(weir, up.url)
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": []}, timeout=10,
                   headers={"accept-encoding": "gzip"})
    assert r.status_code == 400 and "content-encoding" not in r.headers, r.headers
    assert r.json()["error"]["message"] == "max_tokens must be at least 1, got 0." and r.json()["error"]["code"] is None


def _sse(*events: bytes) -> bytes:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body)) + body


CHUNK = (b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
         b'"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}')


def _stream_events(w) -> list[str]:
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=10,
                      json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


# vLLM's in-band error: its integer code (every version), or its older flat object, which the openai SDK did
# not even take for an error (it has no `error` member: the stream went on as if it were a chunk).
@pytest.mark.parametrize("event,want", [
    (b'{"error":{"message":"boom mid stream","type":"BadRequestError","param":null,"code":400}}',
     {"message": "boom mid stream", "type": "BadRequestError", "param": None, "code": None}),
    (b'{"error":{"message":"engine died","code":500}}',
     {"message": "engine died", "type": "server_error", "param": None, "code": None}),
    (b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}',
     {"message": "too long", "type": "BadRequestError", "param": None, "code": None}),
], ids=["int-code", "int-code-no-type", "legacy-flat"])
def test_stream_error_event_reaches_openai_clients_in_openais_shape(weir, upstream, event, want):
    up = upstream(lambda h, b: _sse(CHUNK, event, b"[DONE]"))
    w = _gateway(weir, up.url)
    client = openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    got = []
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            got.append(chunk.choices[0].delta.content if chunk.choices else None)
    assert got == ["Hel"], got
    assert e.value.body == want and e.value.code is None and e.value.message == want["message"], e.value.body
    events = _stream_events(w)
    assert json.loads(events[1]) == {"error": want} and events[2:] == ["[DONE]"], events


def test_openai_shaped_stream_error_event_passes_as_it_came(weir, upstream):
    event = b'{"error": {"message": "m", "type": "server_error", "param": null, "code": "engine_dead"}}'
    up = upstream(lambda h, b: _sse(CHUNK, event, b"[DONE]"))
    w = _gateway(weir, up.url)
    assert _stream_events(w)[1:] == [event.decode(), "[DONE]"]


# F2: every answer in Anthropic's shape carries request-id, the field the Anthropic SDKs read.
def test_anthropic_shaped_answers_carry_request_id(weir):
    w = weir(config={"pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}}, "models": {"m": {"pool": "p"}}},
             workers=1)
    client = anthropic.Anthropic(base_url=w.base_url, api_key="k", max_retries=0)
    listed = client.models.with_raw_response.list()
    assert listed.headers.get("request-id") == listed.headers["x-request-id"], listed.headers
    with pytest.raises(anthropic.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.request_id and e.value.request_id == e.value.response.headers["x-request-id"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.batches.list()
    assert e.value.request_id and e.value.request_id == e.value.response.headers["x-request-id"]
    # Anthropic's Files API (beta) is no route of Weir's: a 404 in the shape its SDK reads.
    with pytest.raises(anthropic.NotFoundError) as e:
        client.beta.files.list()
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error", e.value.body
    assert e.value.request_id == e.value.response.headers["x-request-id"]
    # Without anthropic-version (an OpenAI client): OpenAI's shape, no request-id.
    r = httpx.get(w.v1 + "/files", timeout=5)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    assert "request-id" not in r.headers and r.headers["x-request-id"]
    r = httpx.get(w.v1 + "/models", timeout=5)
    assert r.status_code == 200 and "request-id" not in r.headers
