"""Defects found in stop 52's black-box round on /v1/responses (an OpenAI SDK user in front of a chat-completions
upstream): function-call arguments sent as a JSON value, invalid arguments unstreamed, the upstream error's
`param`, `metadata`'s limits and `completed_at`."""
from __future__ import annotations

import json

import httpx
import pytest

from test_defect_fixes import RawUpstream

# The upstream's answer for the next request: a list of chat chunks (streamed), a chat.completion (not), or
# (status, error body).
_ANSWER: dict = {}


def _chunk(delta: dict, finish=None) -> dict:
    return {"id": "chatcmpl-52", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _answer(headers, body) -> bytes:
    a = _ANSWER["a"]
    if isinstance(a, tuple):
        doc = json.dumps(a[1]).encode()
        return b"HTTP/1.1 %d Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
            a[0], len(doc), doc)
    if isinstance(a, dict):
        doc = json.dumps(a).encode()
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(doc), doc)
    usage = {"id": "chatcmpl-52", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
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


def _completion(tool_calls: list, finish="tool_calls") -> dict:
    return {"id": "chatcmpl-52", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": None, "tool_calls": tool_calls}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}


def _tc(args, i=0, name="f") -> dict:
    return {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def _post(w, body: dict) -> httpx.Response:
    return httpx.post(w.v1 + "/responses", timeout=10, json={"model": "m", "input": "hi", **body})


def _responses_calls(w, stream: bool) -> list:
    """The function_call items of a /v1/responses answer: [(call_id, arguments)]; streamed, the deltas add up
    to each item's arguments and the terminal event is response.completed."""
    r = _post(w, {"stream": stream, "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]})
    assert r.status_code == 200, r.text
    if not stream:
        return [(o["call_id"], o["arguments"]) for o in r.json()["output"] if o["type"] == "function_call"]
    ev = _events(r.text)
    assert ev[-1]["type"] == "response.completed", ev[-1]
    deltas, calls = {}, []
    for e in ev:
        if e["type"] == "response.function_call_arguments.delta":
            deltas[e["item_id"]] = deltas.get(e["item_id"], "") + e["delta"]
        elif e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call":
            assert deltas.get(e["item"]["id"], "") == e["item"]["arguments"], (deltas, e)
            calls.append((e["item"]["call_id"], e["item"]["arguments"]))
    final = [(o["call_id"], o["arguments"]) for o in ev[-1]["response"]["output"] if o["type"] == "function_call"]
    assert final == calls, (final, calls)
    return calls


def _messages_inputs(w, stream: bool) -> list:
    """The tool_use blocks' inputs of a /v1/messages answer."""
    r = httpx.post(w.v1 + "/messages", timeout=10, headers={"anthropic-version": "2023-06-01"},
                   json={"model": "m", "max_tokens": 50, "stream": stream,
                         "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    if not stream:
        return [b["input"] for b in r.json()["content"] if b["type"] == "tool_use"]
    blocks = {}
    for e in _events(r.text):
        assert e["type"] != "error", e
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
            blocks[e["index"]] = ""
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            blocks[e["index"]] += e["delta"]["partial_json"]
    return [json.loads(blocks[i]) if blocks[i] else {} for i in sorted(blocks)]


# DEFECT: arguments the upstream sent as a JSON value, not a string ({"city": "Paris"} unencoded, as some
# OpenAI-compatible servers do; chat completions' clients get it as it came) became "{}" for a Responses client
# (streamed and not) and input {} for a Messages client: the client ran the tool with no arguments. The value is
# now read as its JSON text: an object is the arguments, a number is given as its text (as the string "5" is).
def test_unencoded_arguments_are_kept(gw):
    obj = {"city": "Paris", "days": [1, 2]}
    _ANSWER["a"] = _completion([_tc(obj), _tc(5, 1)])
    calls = _responses_calls(gw, False)
    assert [(c, json.loads(a)) for c, a in calls] == [("call_0", obj), ("call_1", 5)], calls
    assert _messages_inputs(gw, False) == [obj, {"_raw": "5"}]
    _ANSWER["a"] = [_chunk({"role": "assistant"}), _chunk({"tool_calls": [_tc(obj)]}),
                    _chunk({"tool_calls": [_tc(5, 1)]}), _chunk({}, "tool_calls")]
    calls = _responses_calls(gw, True)
    assert [(c, json.loads(a)) for c, a in calls] == [("call_0", obj), ("call_1", 5)], calls
    assert _messages_inputs(gw, True) == [obj, {"_raw": "5"}]
    # JSON null is no arguments, as the string "null" is.
    _ANSWER["a"] = _completion([_tc(None)])
    assert _responses_calls(gw, False) == [("call_0", "{}")]


# DEFECT: arguments that are no JSON text ('{"city":' with finish_reason tool_calls) failed a stream
# (response.failed: the client must not run the call) but an unstreamed answer was 200 "completed" with the
# broken arguments. It is now a 502 upstream_invalid_response naming the call; cut by `length`, the response is
# incomplete with the arguments as they came, as streamed.
def test_invalid_arguments_unstreamed_are_refused(gw):
    _ANSWER["a"] = _completion([_tc({"ok": 1}), _tc('{"city":', 1, "weather")])
    r = _post(gw, {})
    assert r.status_code == 502, r.text
    err = r.json()["error"]
    assert err["code"] == "upstream_invalid_response", err
    assert "function call call_1 (weather)" in err["message"] and "not valid JSON" in err["message"], err
    _ANSWER["a"] = _completion([_tc('{"city":')], finish="length")
    r = _post(gw, {})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}, body
    assert body["output"][0]["arguments"] == '{"city":', body


# DEFECT: an upstream's 400 reached a Responses client with the chat-completions member in `param`
# (max_tokens for a client that sent max_output_tokens). `param` now names the Responses field; the message is
# the upstream's.
@pytest.mark.parametrize("upstream,client", [
    ("max_tokens", "max_output_tokens"), ("max_completion_tokens", "max_output_tokens"), ("messages", "input"),
    ("messages[1].content", "input"), ("response_format", "text"), ("temperature", "temperature")])
def test_upstream_error_param_names_the_responses_field(gw, upstream, client):
    msg = f"{upstream} is wrong, got 0."
    _ANSWER["a"] = (400, {"object": "error", "message": msg, "type": "BadRequestError", "param": upstream,
                          "code": 400})
    r = _post(gw, {"max_output_tokens": 8})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == client and err["message"] == msg, err


# DEFECT: `metadata` was echoed whatever it held; OpenAI allows at most 16 pairs, string keys of at most 64
# characters, string values of at most 512, and refuses anything else with a 400 (param metadata).
@pytest.mark.parametrize("md", [
    {f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"a": "v" * 513}, {"a": 1}, {"a": {"x": 1}}, {"a": None},
    {"a": "é" * 513}], ids=["17-pairs", "long-key", "long-value", "number", "object", "null", "long-utf8"])
def test_metadata_beyond_openais_limits_is_refused(gw, md):
    r = _post(gw, {"metadata": md})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "metadata", err


def test_metadata_within_openais_limits_is_echoed(gw):
    _ANSWER["a"] = {"id": "chatcmpl-52", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hi"}}]}
    md = {f"k{i}": "v" for i in range(14)} | {"é" * 64: "ü" * 512, "k" * 64: ""}  # (characters, not bytes)
    r = _post(gw, {"metadata": md})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == md


# DEFECT: `completed_at` (Unix seconds; the SDK's Response has it) was missing. A completed response has it (the
# unstreamed body, the response.completed event's response); any other status says null.
def test_completed_at(gw):
    text = {"role": "assistant", "content": "hi"}
    _ANSWER["a"] = {"id": "chatcmpl-52", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": text}]}
    body = _post(gw, {}).json()
    assert body["status"] == "completed" and isinstance(body["completed_at"], int), body
    assert body["completed_at"] >= body["created_at"], body
    _ANSWER["a"]["choices"][0]["finish_reason"] = "length"
    body = _post(gw, {}).json()
    assert body["status"] == "incomplete" and body["completed_at"] is None, body
    _ANSWER["a"] = [_chunk({"role": "assistant"}), _chunk({"content": "hi"}), _chunk({}, "stop")]
    r = _post(gw, {"stream": True})
    ev = _events(r.text)
    assert ev[0]["type"] == "response.created" and ev[0]["response"]["completed_at"] is None, ev[0]
    assert ev[-1]["type"] == "response.completed", ev[-1]
    assert isinstance(ev[-1]["response"]["completed_at"], int) and ev[-1]["response"]["completed_at"] >= 1, ev[-1]
