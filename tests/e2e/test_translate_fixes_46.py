"""Defects found in stop 46's black-box rounds: tool calls of an OpenAI chat stream translated for /v1/messages
and /v1/responses clients."""
from __future__ import annotations

import json

import httpx
import pytest

from test_defect_fixes import RawUpstream

# The upstream's answer for the next request: a list of chat chunks (streamed) or a chat.completion (not).
_ANSWER: dict = {}


def _chunk(delta: dict, finish=None) -> dict:
    return {"id": "chatcmpl-46", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _call(name=None, args=None, **entry) -> dict:
    fn = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    return _chunk({"tool_calls": [{"index": 0, **entry, "function": fn}]})


def _answer(headers, body) -> bytes:
    a = _ANSWER["a"]
    if isinstance(a, dict):
        doc = json.dumps(a).encode()
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(doc), doc)
    usage = {"id": "chatcmpl-46", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}
    events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in [*a, usage]) + b"data: [DONE]\n\n"
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(events),
                                                                                                    events)


@pytest.fixture(scope="module")
def gw(module_weir):
    up = RawUpstream(_answer)
    try:
        yield module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}},
                          workers=1)
    finally:
        up.close()


def _events(text: str) -> list[dict]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def _messages(w, stream: bool) -> dict:
    """The tool_use blocks of a /v1/messages answer: {"calls": [(id, name, input)], "error": message or None}."""
    r = httpx.post(w.v1 + "/messages", timeout=10, headers={"anthropic-version": "2023-06-01"},
                   json={"model": "m", "max_tokens": 50, "stream": stream,
                         "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    if not stream:
        return {"calls": [(b["id"], b["name"], b["input"]) for b in r.json()["content"] if b["type"] == "tool_use"],
                "error": None}
    blocks, error = {}, None
    for e in _events(r.text):
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
            blocks[e["index"]] = [e["content_block"], ""]
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            blocks[e["index"]][1] += e["delta"]["partial_json"]
        elif e["type"] == "error":
            error = e["error"]["message"]
    calls = [(b["id"], b["name"], p if error else json.loads(p) if p else {})  # (a failed stream's input is cut)
             for b, p in (blocks[i] for i in sorted(blocks))]
    return {"calls": calls, "error": error}


def _responses(w, stream: bool) -> dict:
    """The function_call items of a /v1/responses answer: {"calls": [(call_id, name, arguments)], "error", "added"
    (the names output_item.added gave)}."""
    r = httpx.post(w.v1 + "/responses", timeout=10,
                   json={"model": "m", "stream": stream, "input": "hi",
                         "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]})
    assert r.status_code == 200, r.text
    if not stream:
        return {"calls": [(o["call_id"], o["name"], o["arguments"]) for o in r.json()["output"]
                          if o["type"] == "function_call"], "error": None, "added": None}
    calls, added, deltas, error = [], [], {}, None
    for e in _events(r.text):
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call":
            added.append(e["item"]["name"])
        elif e["type"] == "response.function_call_arguments.delta":
            deltas[e["item_id"]] = deltas.get(e["item_id"], "") + e["delta"]
        elif e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call":
            it = e["item"]
            assert deltas.get(it["id"], "") == it["arguments"], (deltas, it)  # the deltas add up
            calls.append((it["call_id"], it["name"], it["arguments"]))
        elif e["type"] == "response.failed":
            error = e["response"]["error"]["message"]
    return {"calls": calls, "error": error, "added": added}


# DEFECT: a tool name whose pieces came after the call's first arguments was cut to its first piece for
# /v1/messages (content_block_start went out at the first arguments) while /v1/responses joined it; a name
# repeated whole in every chunk (as some servers send it) was "f" for Messages and "ff" for Responses; and
# Responses' output_item.added showed the first piece only. Both now hold the call's start until a delta brings
# no new piece of the name after its arguments began, and a name equal to the name so far is a repeat.
@pytest.mark.parametrize("chunks,name,args", [
    ([_call("get_", '{"a":', id="call_a", type="function"), _call("weather", "1}")], "get_weather", {"a": 1}),
    ([_call("f", '{"a":', id="call_a", type="function"), _call("f", "1}")], "f", {"a": 1}),
    ([_call("f", '{"a":', id="call_a", type="function"), _call("f", "1"), _call("f", "}")], "f", {"a": 1}),
    ([_call("get_", "", id="call_a", type="function"), _call("weather", '{"a":1}')], "get_weather", {"a": 1}),
    ([_call("get_weather", "", id="call_a", type="function"), _call(args='{"a":'), _call(args="1}")],
     "get_weather", {"a": 1}),
    ([_call(id="call_a", type="function"), _call("get_weather"), _call(args='{"a":1}')], "get_weather", {"a": 1}),
    ([_call("get_weather", '{"a":1}', id="call_a", type="function")], "get_weather", {"a": 1}),
], ids=["pieces-args-first", "repeated", "repeated-thrice", "pieces-args-later", "vllm", "name-after-id", "whole"])
def test_both_translators_give_a_tool_calls_whole_name(gw, chunks, name, args):
    _ANSWER["a"] = [_chunk({"role": "assistant"}), *chunks, _chunk({}, "tool_calls")]
    m = _messages(gw, True)
    assert m == {"calls": [("call_a", name, args)], "error": None}, m
    r = _responses(gw, True)
    assert r["error"] is None, r
    assert [(c[0], c[1], json.loads(c[2])) for c in r["calls"]] == [("call_a", name, args)], r
    assert r["added"] == [name], r


# DEFECT (same class): a piece of the name after the call's start went out (its arguments had begun and a delta had
# brought no new piece) cannot reach a Messages client; both translators now fail the stream alike, where Messages
# named the call "f" and Responses "fg".
def test_a_name_piece_after_the_arguments_streamed_fails_both_alike(gw):
    _ANSWER["a"] = [_chunk({"role": "assistant"}), _call("f", "{", id="call_a", type="function"),
                    _call(args='"a":'), _call("g", "1}"), _chunk({}, "tool_calls")]
    m = _messages(gw, True)
    assert m["error"] and "name of tool call call_a" in m["error"], m
    r = _responses(gw, True)
    assert r["error"] and "name of tool call call_a" in r["error"], r


# DEFECT: whitespace-only arguments failed a /v1/responses stream ("not valid JSON") where /v1/messages gave input
# {}; "null" was {"_raw": "null"} for Messages; unstreamed, whitespace was {"_raw": " "} for Messages and " " for
# Responses. One reading (classify_arguments) now serves both translators, streamed and not: no arguments (absent,
# "", whitespace, null) is {} / "{}"; an object is itself; other JSON is {"_raw": text} / the text; text that is no
# JSON fails a stream (both) and is kept as text unstreamed for Messages (whose unstreamed input can wrap it);
# unstreamed, a Responses client gets a 502 upstream_invalid_response for it (stop 52: as its stream fails).
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unstreamed"])
@pytest.mark.parametrize("args,m_input,r_args", [
    (None, {}, "{}"),
    ("", {}, "{}"),
    (" ", {}, "{}"),
    ("\n\t ", {}, "{}"),
    ("null", {}, "{}"),
    (" null ", {}, "{}"),
    ('{"a": 1}', {"a": 1}, '{"a": 1}'),
    ("[]", {"_raw": "[]"}, "[]"),
    ("1", {"_raw": "1"}, "1"),
    ('"x"', {"_raw": '"x"'}, '"x"'),
    ('{"a":', None, None),
    ("abc", None, None),
], ids=["absent", "empty", "space", "whitespace", "null", "spaced-null", "object", "list", "number", "string",
        "cut-object", "no-json"])
def test_both_translators_read_tool_arguments_alike(gw, stream, args, m_input, r_args):
    if stream:
        _ANSWER["a"] = [_chunk({"role": "assistant"}), _call("f", args, id="call_a", type="function"),
                        _chunk({}, "tool_calls")]
    else:
        fn = {"name": "f"} if args is None else {"name": "f", "arguments": args}
        _ANSWER["a"] = {"id": "chatcmpl-46", "object": "chat.completion", "created": 1, "model": "m",
                        "choices": [{"index": 0, "finish_reason": "tool_calls",
                                     "message": {"role": "assistant", "content": None,
                                                 "tool_calls": [{"id": "call_a", "type": "function",
                                                                 "function": fn}]}}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}
    if m_input is None and not stream:  # unstreamed: Messages keeps the text wrapped; Responses refuses the answer
        assert _messages(gw, stream) == {"calls": [("call_a", "f", {"_raw": args})], "error": None}
        r = httpx.post(gw.v1 + "/responses", timeout=10, json={"model": "m", "input": "hi"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_invalid_response", r.text
        assert "not valid JSON" in r.json()["error"]["message"], r.text
        return
    m, r = _messages(gw, stream), _responses(gw, stream)
    if m_input is None:  # no JSON: the client must not run the call
        assert m["error"] and "not valid JSON" in m["error"], m
        assert r["error"] and "not valid JSON" in r["error"], r
        return
    assert m == {"calls": [("call_a", "f", m_input)], "error": None}, m
    assert r["error"] is None and r["calls"] == [("call_a", "f", r_args)], r
