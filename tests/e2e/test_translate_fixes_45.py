"""Defects found in stop 45's black-box rounds of the protocol translators (OpenAI chat stream → Anthropic
Messages, → OpenAI Responses): parallel tool calls sharing an index or interleaving, empty data events,
cache writes, invalid tool arguments, missing ids, max_tokens' bound, FastAPI's detail list."""
from __future__ import annotations

import json
import re

import anthropic
import httpx
import pytest

from test_defect_fixes import RawUpstream
from test_defect_fixes_43 import _stream

MSG = [{"role": "user", "content": "hi"}]
TOOLS_A = [{"name": "get_weather", "input_schema": {"type": "object"}},
           {"name": "get_time", "input_schema": {"type": "object"}}]
TOOLS_R = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
           {"type": "function", "name": "get_time", "parameters": {"type": "object"}}]


def _chunk(delta: dict, finish=None, cid="chatcmpl-45") -> bytes:
    doc = {"object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if cid is not None:
        doc["id"] = cid
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _call(index, cid=None, name=None, args=None) -> dict:
    tc: dict = {"index": index, "function": {}}
    if cid:
        tc["id"] = cid
        tc["type"] = "function"
    if name is not None:
        tc["function"]["name"] = name
    if args is not None:
        tc["function"]["arguments"] = args
    return {"tool_calls": [tc]}


def _json(doc: dict, status: str = "200 OK") -> bytes:
    body = json.dumps(doc).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


ROLE = _chunk({"role": "assistant", "content": ""})
DONE = b"data: [DONE]\n\n"
CASES = {
    # Ollama's shape: every call of the turn is index 0, each with its own id.
    "same_index": [ROLE, _chunk(_call(0, "call_a", "get_weather", '{"city": "Paris"}')),
                   _chunk(_call(0, "call_b", "get_time", '{"tz": "UTC"}')), _chunk({}, "tool_calls"), DONE],
    # bifrost#1829's shape: both calls start, then each one's arguments.
    "interleaved": [ROLE, _chunk(_call(0, "call_a", "get_weather", "")), _chunk(_call(1, "call_b", "get_time", "")),
                    _chunk(_call(0, args='{"city": ')), _chunk(_call(1, args='{"tz": "UTC"}')),
                    _chunk(_call(0, args='"Paris"}')), _chunk({}, "tool_calls"), DONE],
    "empty_data": [ROLE, b"data: \n\n", _chunk({"content": "ok"}), b"data:\n\n", _chunk({}, "stop"), DONE],
    "bad_args": [ROLE, _chunk(_call(0, "c1", "get_weather", '{"a": ')), _chunk(_call(0, args="tru")),
                 _chunk({}, "tool_calls"), DONE],
    "bad_args_length": [ROLE, _chunk(_call(0, "c1", "get_weather", '{"a": ')), _chunk(_call(0, args="tru")),
                        _chunk({}, "length"), DONE],
    "no_id": [_chunk({"role": "assistant", "content": ""}, cid=None),
              _chunk(_call(0, None, "get_weather", "{}"), cid=None), _chunk({}, "tool_calls", cid=None), DONE],
    "bare_id": [_chunk({"role": "assistant", "content": ""}, cid="chatcmpl-"),
                _chunk(_call(0, None, "get_weather", "{}"), cid="chatcmpl-"),
                _chunk({}, "tool_calls", cid="chatcmpl-"), DONE],
}
ANTHROPIC_USAGE = {"input_tokens": 10, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 1000,
                   "output_tokens": 7}


def _anthropic_sse() -> bytes:
    def ev(t, d):
        return f"event: {t}\ndata: {json.dumps(d)}\n\n".encode()
    return _stream(
        ev("message_start", {"type": "message_start", "message": {
            "id": "msg_up", "type": "message", "role": "assistant", "model": "claude", "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {**ANTHROPIC_USAGE, "output_tokens": 1}}}),
        ev("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}}),
        ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "hi"}}),
        ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"output_tokens": 7}}),
        ev("message_stop", {"type": "message_stop"}))


def _answer(headers, body):
    case = headers.get("x-case", "")
    req = json.loads(body or b"{}")
    if case == "anthropic":
        if req.get("stream"):
            return _anthropic_sse()
        return _json({"id": "msg_up", "type": "message", "role": "assistant", "model": "claude",
                      "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                      "stop_sequence": None, "usage": ANTHROPIC_USAGE})
    if case == "detail422":
        return _json({"detail": [{"type": "greater_than", "loc": ["body", "max_tokens"],
                                  "msg": "Input should be greater than 0", "input": 0}]}, "422 Unprocessable Entity")
    if case.startswith("ns_"):  # a whole chat completion
        cid = {"ns_no_id": None, "ns_bare_id": "chatcmpl-"}[case]
        doc = {"object": "chat.completion", "created": 1, "model": "m", "choices": [{
            "index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}}]}
        if cid is not None:
            doc["id"] = cid
        return _json(doc)
    return _stream(*CASES[case])


@pytest.fixture(scope="module")
def stack(module_weir):
    up = RawUpstream(_answer)
    w = module_weir(config={
        "pools": {"p": {"endpoints": [up.url]},
                  "a": {"type": "anthropic", "api_key": "sk-ant-test", "endpoints": [up.url]}},
        "models": {"m": {"pool": "p"}, "c": {"pool": "a"}},
    }, workers=1)
    yield w
    up.close()


def _events(w, path: str, body: dict, case: str, request_id: str | None = None) -> list[tuple[str, dict]]:
    headers = {"x-case": case}
    if request_id:
        headers["x-request-id"] = request_id
    with httpx.stream("POST", w.base_url + path, json=body, headers=headers, timeout=10) as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
    out = []
    for block in text.split("\n\n"):
        data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        kind = [line[6:].strip() for line in block.split("\n") if line.startswith("event:")]
        if data and data[0] != "[DONE]":
            out.append((kind[0] if kind else "", json.loads("\n".join(data))))
    return out


def _messages(w, case, request_id=None, **extra):
    return _events(w, "/v1/messages", {"model": "m", "max_tokens": 50, "stream": True, "messages": MSG,
                                       "tools": TOOLS_A, **extra}, case, request_id)


def _responses(w, case, request_id=None):
    return _events(w, "/v1/responses", {"model": "m", "stream": True, "input": "hi", "tools": TOOLS_R}, case,
                   request_id)


def _tool_blocks(ev) -> list[list[str]]:
    blocks: dict[int, list[str]] = {}
    for kind, d in ev:
        if kind == "content_block_start" and d["content_block"]["type"] == "tool_use":
            blocks[d["index"]] = [d["content_block"]["id"], d["content_block"]["name"], ""]
        if kind == "content_block_delta" and d["delta"]["type"] == "input_json_delta":
            blocks[d["index"]][2] += d["delta"]["partial_json"]
    return [blocks[i] for i in sorted(blocks)]


def _function_calls(ev) -> list[tuple[str, str, str]]:
    final = ev[-1][1]["response"]
    assert ev[-1][0] == "response.completed", final
    return [(o["call_id"], o["name"], o["arguments"]) for o in final["output"] if o["type"] == "function_call"]


@pytest.mark.parametrize("case", ["same_index", "interleaved"])
def test_parallel_tool_calls_stay_apart_and_whole(stack, case):
    # same_index: merged into one call (get_weatherget_time, {..}{..}). interleaved: call 0 was closed with {}
    # when call 1 began (an agent ran get_weather({})), then the stream failed.
    want = [["call_a", "get_weather", '{"city": "Paris"}'], ["call_b", "get_time", '{"tz": "UTC"}']]
    ev = _messages(stack, case)
    assert [k for k, _ in ev if k == "error"] == [], ev
    assert _tool_blocks(ev) == want
    assert ev[-2][1]["delta"]["stop_reason"] == "tool_use"
    # Every block's stop comes after all of its arguments: none stopped before it was complete.
    for i, (_, _, args) in enumerate(want):
        stop = next(n for n, (k, d) in enumerate(ev) if k == "content_block_stop" and d["index"] == i)
        assert "".join(d["delta"]["partial_json"] for k, d in ev[:stop]
                       if k == "content_block_delta" and d["index"] == i) == args
    ev = _responses(stack, case)
    assert _function_calls(ev) == [tuple(c) for c in want]
    done = [d["item"] for k, d in ev if k == "response.output_item.done"]
    assert [(i["call_id"], i["arguments"], i["status"]) for i in done] == [
        ("call_a", want[0][2], "completed"), ("call_b", want[1][2], "completed")]


def test_the_anthropic_sdk_gets_both_calls(stack):
    client = anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=10)
    with client.messages.stream(model="m", max_tokens=50, messages=MSG, tools=TOOLS_A,
                                extra_headers={"x-case": "interleaved"}) as s:
        msg = s.get_final_message()
    assert [(b.id, b.name, b.input) for b in msg.content] == [
        ("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_time", {"tz": "UTC"})]


def test_empty_data_events_are_skipped(stack):
    # `data: ` / `data:` ended both translated streams with "not a JSON object".
    ev = _messages(stack, "empty_data")
    assert ev[-1][0] == "message_stop", ev
    assert "".join(d["delta"]["text"] for k, d in ev if k == "content_block_delta") == "ok"
    ev = _responses(stack, "empty_data")
    assert ev[-1][0] == "response.completed", ev
    assert ev[-1][1]["response"]["output"][0]["content"][0]["text"] == "ok"


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_responses_report_an_anthropic_pools_cache_writes(stack, stream):
    # cache_write_tokens was a literal 0.
    body = {"model": "c", "input": "x", "stream": stream}
    if stream:
        ev = _events(stack, "/v1/responses", body, "anthropic")
        usage = ev[-1][1]["response"]["usage"]
    else:
        r = httpx.post(stack.base_url + "/v1/responses", json=body, headers={"x-case": "anthropic"}, timeout=10)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 1000, "cache_write_tokens": 200}, usage
    assert usage["input_tokens"] == 1210


def test_tool_arguments_that_are_no_json_fail_the_stream(stack):
    # They reached the Anthropic SDK as input {} with a clean message_stop.
    ev = _messages(stack, "bad_args")
    assert ev[-1][0] == "error" and ev[-1][1]["error"]["type"] == "api_error", ev
    assert "not valid JSON" in ev[-1][1]["error"]["message"]
    assert "message_stop" not in [k for k, _ in ev]
    client = anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=10)
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model="m", max_tokens=50, messages=MSG, tools=TOOLS_A,
                                    extra_headers={"x-case": "bad_args"}) as s:
            s.get_final_message()
    ev = _responses(stack, "bad_args")
    assert ev[-1][0] == "response.failed", ev
    assert ev[-1][1]["response"]["error"]["code"] == "server_error"
    assert "response.output_item.done" not in [k for k, _ in ev]
    # Cut by the token limit: the stop reason / status already says the input is incomplete.
    ev = _messages(stack, "bad_args_length")
    assert ev[-1][0] == "message_stop" and ev[-2][1]["delta"]["stop_reason"] == "max_tokens", ev
    ev = _responses(stack, "bad_args_length")
    assert ev[-1][0] == "response.incomplete", ev


@pytest.mark.parametrize("case", ["no_id", "bare_id"])
def test_an_answer_without_an_id_takes_the_request_id(stack, case):
    # "msg_" and "toolu__0" collided across turns; Responses gave "resp_" for "chatcmpl-".
    ids = set()
    for rid in (f"{case}-1", f"{case}-2"):
        # The id sent upstream: the client's, "-", and a generated one (unique per request).
        ev = _messages(stack, case, rid)
        msg_id = ev[0][1]["message"]["id"]
        assert re.fullmatch(f"msg_{rid}-[0-9a-f]{{28}}", msg_id), msg_id
        assert _tool_blocks(ev)[0][0] == f"toolu_{msg_id[4:]}_0"
        ev = _responses(stack, case, rid)
        assert re.fullmatch(f"resp_{rid}-[0-9a-f]{{28}}", ev[0][1]["response"]["id"]), ev[0][1]
        ids.add(msg_id)
    assert len(ids) == 2
    # Whole answers too.
    r = httpx.post(stack.base_url + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": MSG},
                   headers={"x-case": f"ns_{case}", "x-request-id": f"ns-{case}"}, timeout=10)
    assert r.status_code == 200, r.text
    msg_id = r.json()["id"]
    assert re.fullmatch(f"msg_ns-{case}-[0-9a-f]{{28}}", msg_id) and r.json()["content"][0]["id"] == f"toolu_{msg_id[4:]}_0"
    r = httpx.post(stack.base_url + "/v1/responses", json={"model": "m", "input": "x"},
                   headers={"x-case": f"ns_{case}", "x-request-id": f"ns-{case}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert re.fullmatch(f"resp_ns-{case}-[0-9a-f]{{28}}", r.json()["id"]), r.json()["id"]


@pytest.mark.parametrize("path,field,extra", [
    ("/v1/messages", "max_tokens", {"messages": MSG}),
    ("/v1/responses", "max_output_tokens", {"input": "x"}),
])
@pytest.mark.parametrize("value", [4294967296, 99999999999999999999])
def test_max_tokens_past_32_bits_names_its_bound(stack, path, field, extra, value):
    body = json.dumps({"model": "m", field: value, **extra})
    r = httpx.post(stack.base_url + path, content=body, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] == f"{field}: Input should be less than or equal to 4294967295", err


def test_a_fastapi_detail_list_becomes_the_message(stack):
    # "Upstream answered 422." told the client nothing.
    r = httpx.post(stack.base_url + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": MSG},
                   headers={"x-case": "detail422"}, timeout=10)
    assert r.status_code == 422, r.text
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "max_tokens: Input should be greater than 0"}}
