"""Defects found in stop 58's round on /v1/responses with the official openai SDK (oai58): a garbled earlier tool
call passed as "completed" when the response ended on finish_reason "length" (also on /v1/messages streams);
translated requests carried names hosted APIs refuse (max_tokens to OpenAI's reasoning models, reasoning.effort
minimal refused for every pool); members vLLM's own /v1/responses honours were dropped silently (top_k,
cache_salt, logprobs, extra_body's sampling members)."""
from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from test_defect_fixes import RawUpstream

GARBLED = '{"path": "/tmp/x", "recursive": tru'  # not JSON: whole, yet garbled
WHOLE = '{"path": "/tmp/x", "recursive": true}'
CUT = '{"tz": "U'  # the call the length limit cut

TOOLS = [{"type": "function", "name": "delete_files", "parameters": {"type": "object"}},
         {"type": "function", "name": "get_time", "parameters": {"type": "object"}}]


def _chunk(delta: dict, finish=None, logprobs=None) -> dict:
    return {"id": "chatcmpl-58", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


def _sse(chunks: list) -> bytes:
    usage = {"id": "chatcmpl-58", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}
    events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in [*chunks, usage]) + b"data: [DONE]\n\n"
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(events),
                                                                                                    events)


def _json(doc: dict, status: int = 200) -> bytes:
    body = json.dumps(doc).encode()
    return b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body),
                                                                                                body)


def _calls_answer(first: str, finish: str):
    """Two parallel calls: the first with `first` as its arguments, the second cut; ends on `finish`."""
    calls = [("call0", "delete_files", first), ("call1", "get_time", CUT)]

    def answer(headers, body) -> bytes:
        if json.loads(body).get("stream"):
            return _sse([_chunk({"role": "assistant", "content": ""}),
                         *[_chunk({"tool_calls": [{"index": i, "id": c, "type": "function",
                                                   "function": {"name": n, "arguments": a}}]})
                           for i, (c, n, a) in enumerate(calls)],
                         _chunk({}, finish)])
        return _json({"id": "chatcmpl-58", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "finish_reason": finish, "message": {
                          "role": "assistant", "content": None,
                          "tool_calls": [{"id": c, "type": "function", "function": {"name": n, "arguments": a}}
                                         for c, n, a in calls]}}],
                      "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}})
    return answer


@pytest.fixture(scope="module")
def calls_gw(module_weir):
    state = {"answer": None}
    up = RawUpstream(lambda h, b: state["answer"](h, b))
    try:
        w = module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}},
                        workers=1)
        yield w, state
    finally:
        up.close()


@pytest.mark.parametrize("finish", ["length", "tool_calls"])
def test_an_earlier_garbled_call_fails_the_response_whatever_the_finish(calls_gw, finish):
    w, state = calls_gw
    state["answer"] = _calls_answer(GARBLED, finish)
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        client.responses.create(model="m", input="hi", tools=TOOLS)
    assert e.value.status_code == 502
    assert "call0" in e.value.message
    events = list(client.responses.create(model="m", input="hi", tools=TOOLS, stream=True))
    assert events[-1].type == "response.failed"
    # The client is never handed the garbled call as done.
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert all(getattr(i, "call_id", None) != "call0" for i in done)


def test_only_the_call_the_limit_cut_is_incomplete(calls_gw):
    w, state = calls_gw
    state["answer"] = _calls_answer(WHOLE, "length")
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0)
    r = client.responses.create(model="m", input="hi", tools=TOOLS)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [(o.call_id, o.status, o.arguments) for o in r.output] == [("call0", "completed", WHOLE),
                                                                      ("call1", "incomplete", CUT)]
    events = list(client.responses.create(model="m", input="hi", tools=TOOLS, stream=True))
    assert events[-1].type == "response.incomplete"
    assert [(o.call_id, o.status) for o in events[-1].response.output] == [("call0", "completed"),
                                                                            ("call1", "incomplete")]


def test_messages_stream_an_earlier_garbled_call_is_an_error_under_max_tokens(calls_gw):
    # The same class in the Anthropic translator's stream: stop_reason max_tokens exempts only the last block.
    w, state = calls_gw
    state["answer"] = _calls_answer(GARBLED, "length")
    client = anthropic.Anthropic(base_url=w.process.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIError):
        with client.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                                    tools=[{"name": "delete_files", "input_schema": {"type": "object"}},
                                           {"name": "get_time", "input_schema": {"type": "object"}}]) as s:
            for _ in s:
                pass
    state["answer"] = _calls_answer(WHOLE, "length")
    with client.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                                tools=[{"name": "delete_files", "input_schema": {"type": "object"}},
                                       {"name": "get_time", "input_schema": {"type": "object"}}]) as s:
        m = s.get_final_message()
    assert m.stop_reason == "max_tokens"
    assert m.content[0].input == json.loads(WHOLE)


