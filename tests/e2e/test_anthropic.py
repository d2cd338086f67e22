"""The official anthropic SDK through Weir's /v1/messages, translated for a
vLLM-style (weir-mock) chat-completions upstream.

Text and token counts are checked against the same request sent straight to
weir-mock with the openai SDK (with the x-request-id Weir sent upstream: same words, same usage);
thinking, tool calls and stop strings use weir-mock's x-mock-reasoning,
x-mock-tool-calls and x-mock-stop-hit. One raw-wire test checks the event
grammar byte by byte, as a non-SDK client would see it.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import anthropic
import httpx
import openai
import pytest

MOCK_FLAGS = ("--ttft-ms", "2", "--itl-ms", "1", "--max-tokens", "12")
KEY = "sk-anthropic-test"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city now.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
CLOCK = {"name": "get_time", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock(*MOCK_FLAGS)
    w = module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"claude-test": {"pool": "p", "upstream_model": "mock-model"}},
        "tenants": {"t": {"limits": {"requests_per_minute": 10000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    })
    return m, w


def client(w, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=w.base_url, api_key=key, max_retries=0, timeout=30)


def direct(m) -> openai.OpenAI:
    return openai.OpenAI(base_url=m.v1, api_key="test", max_retries=0, timeout=30)


def rid() -> str:
    return "a-" + uuid.uuid4().hex[:16]


HELLO = [{"role": "user", "content": "hello there"}]


def reference(m, request_id: str, max_tokens: int, messages=None):
    """The mock's own answer to the translated request."""
    return direct(m).chat.completions.create(model="mock-model", max_tokens=max_tokens,
                                             messages=messages or HELLO,
                                             extra_headers={"x-request-id": request_id})


def test_messages_create_matches_upstream(stack):
    m, w = stack
    r = rid()
    msg = client(w).messages.create(model="claude-test", max_tokens=5, messages=HELLO,
                                    extra_headers={"x-request-id": r, "anthropic-version": "2023-06-01"})
    ref = reference(m, w.upstream_id(r), 5)
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.id == "msg_" + w.upstream_id(r)
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == ref.choices[0].message.content
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert msg.usage.input_tokens == ref.usage.prompt_tokens
    assert msg.usage.output_tokens == 5
    log = w.log_for(r)
    assert log["path"] == "/v1/messages" and log["status"] == 200 and log["stream"] is False
    assert (log["prompt_tokens"], log["completion_tokens"]) == (ref.usage.prompt_tokens, 5)
    assert log["error"] is None


def test_messages_stream_matches_upstream(stack):
    m, w = stack
    r = rid()
    with client(w).messages.stream(model="claude-test", max_tokens=6, messages=HELLO,
                                   system="Be brief.", extra_headers={"x-request-id": r}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    ref = reference(m, w.upstream_id(r), 6, [{"role": "system", "content": "Be brief."}, *HELLO])
    assert text == ref.choices[0].message.content
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 6
    assert final.usage.input_tokens == ref.usage.prompt_tokens
    log = w.log_for(r)
    assert log["stream"] is True and log["status"] == 200
    assert (log["prompt_tokens"], log["completion_tokens"]) == (ref.usage.prompt_tokens, 6)


def test_natural_end_is_end_turn(stack):
    _, w = stack
    msg = client(w).messages.create(model="claude-test", max_tokens=100, messages=HELLO)
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_block_from_reasoning_content(stack, stream):
    m, w = stack
    r = rid()
    kw = dict(model="claude-test", max_tokens=5, messages=HELLO,
              thinking={"type": "enabled", "budget_tokens": 1024},
              extra_headers={"x-request-id": r, "x-mock-reasoning": "2"})
    if stream:
        with client(w).messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = client(w).messages.create(**kw)
    words = reference(m, w.upstream_id(r), 5).choices[0].message.content.split(" ")[1:]
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == " " + " ".join(words[:2])
    assert msg.content[1].text == " " + " ".join(words[2:])  # reasoning never leaks into the text


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(stack, stream):
    _, w = stack
    c = client(w)
    kw = dict(model="claude-test", max_tokens=3, tools=[WEATHER, CLOCK], tool_choice={"type": "auto"},
              messages=[{"role": "user", "content": "Weather in Paris, and the time?"}],
              extra_headers={"x-mock-tool-calls": "2"})
    if stream:
        with c.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = c.messages.create(**kw)
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use", "tool_use"]
    calls = msg.content[1:]
    assert [b.name for b in calls] == ["get_weather", "get_time"]
    assert all(b.id.startswith("chatcmpl-tool-") for b in calls) and calls[0].id != calls[1].id
    assert all(set(b.input) == {"q"} and isinstance(b.input["q"], str) for b in calls)

    # The tool results go back; the upstream gets the assistant's tool_calls
    # and one `role: tool` message per result.
    follow = c.messages.create(
        model="claude-test", max_tokens=4, tools=[WEATHER, CLOCK],
        messages=[*kw["messages"],
                  {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
                  {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": calls[0].id, "content": "18 C and sunny"},
                      {"type": "tool_result", "tool_use_id": calls[1].id, "is_error": True,
                       "content": [{"type": "text", "text": "clock broken"}]},
                      {"type": "text", "text": "Summarize.", "cache_control": {"type": "ephemeral"}}]}])
    assert follow.stop_reason == "max_tokens" and [b.type for b in follow.content] == ["text"]
    assert follow.usage.input_tokens > msg.usage.input_tokens


def test_stop_sequence(stack):
    _, w = stack
    msg = client(w).messages.create(model="claude-test", max_tokens=5, messages=HELLO, stop_sequences=["###"],
                                    extra_headers={"x-mock-stop-hit": "1"})
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "###"


def test_count_tokens(stack):
    m, w = stack
    c = client(w)
    n = c.messages.count_tokens(model="claude-test", messages=HELLO, system="Be brief.")
    msg = c.messages.create(model="claude-test", max_tokens=1, messages=HELLO, system="Be brief.")
    assert n.input_tokens == msg.usage.input_tokens


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind, body
    return body["error"]["message"]


def post(w, body, key: str | None = KEY, path: str = "/v1/messages", **headers) -> httpx.Response:
    if key:
        headers["x-api-key"] = key
    return httpx.post(w.base_url + path, content=json.dumps(body), headers=headers, timeout=30)


def test_errors_in_anthropic_shape(stack):
    _, w = stack
    msg = anthropic_error(post(w, {"model": "claude-test", "messages": HELLO}), 400, "invalid_request_error")
    assert "max_tokens" in msg
    anthropic_error(post(w, {"model": "claude-test", "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}),
                    400, "invalid_request_error")
    r = httpx.post(w.base_url + "/v1/messages", content=b"{nope", headers={"x-api-key": KEY}, timeout=30)
    anthropic_error(r, 400, "invalid_request_error")
    anthropic_error(post(w, {"model": "claude-test", "max_tokens": 5, "messages": HELLO}, key=None), 401,
                    "authentication_error")
    anthropic_error(post(w, {"model": "nope", "max_tokens": 5, "messages": HELLO}), 404, "not_found_error")
    anthropic_error(post(w, {"model": "claude-test", "max_tokens": 5, "messages": HELLO}, **{"x-mock-status": "500"}),
                    500, "api_error")
    anthropic_error(post(w, {"model": "claude-test", "max_tokens": 5, "messages": HELLO}, **{"x-mock-status": "503"}),
                    503, "overloaded_error")
    r = httpx.get(w.base_url + "/v1/messages", headers={"x-api-key": KEY}, timeout=30)
    anthropic_error(r, 405, "invalid_request_error")
    # Weir's keys also work as a Bearer token.
    r = httpx.post(w.base_url + "/v1/messages", json={"model": "claude-test", "max_tokens": 2, "messages": HELLO},
                   headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_sdk_errors(stack):
    _, w = stack
    with pytest.raises(anthropic.AuthenticationError) as e:
        client(w, key="sk-wrong").messages.create(model="claude-test", max_tokens=5, messages=HELLO)
    assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client(w).messages.create(model="no-such-model", max_tokens=5, messages=HELLO)
    assert e.value.body["error"]["type"] == "not_found_error"


def sse_events(raw: str) -> list[tuple[str, dict]]:
    """Strict parse: every block is exactly `event: T` then `data: J`, and J.type == T."""
    assert raw.endswith("\n\n"), raw[-200:]
    out = []
    for block in raw[:-2].split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        kind, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == kind, block
        out.append((kind, data))
    return out


def test_raw_stream_grammar(stack):
    _, w = stack
    # (thinking on: the reasoning is a thinking block only when asked for)
    body = {"model": "claude-test", "max_tokens": 5, "stream": True, "tools": [WEATHER, CLOCK],
            "messages": HELLO, "thinking": {"type": "adaptive"}}
    with httpx.stream("POST", w.base_url + "/v1/messages", json=body, timeout=30,
                      headers={"x-api-key": KEY, "x-mock-reasoning": "2", "x-mock-tool-calls": "2"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert "[DONE]" not in raw and "data: {\"id\"" not in raw
    ev = sse_events(raw)
    kinds = [k for k, _ in ev]
    assert kinds.count("message_start") == 1 and kinds[0] == "message_start"
    assert kinds.count("message_delta") == 1 and kinds[-2] == "message_delta"
    assert kinds.count("message_stop") == 1 and kinds[-1] == "message_stop"
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["role"] == "assistant" and start["stop_reason"] is None
    assert kinds[1] == "ping" and kinds.count("ping") == 1  # (Anthropic's: after message_start)
    # Blocks: dense indices, one open at a time, deltas of the open block's kind.
    blocks, open_index = [], None
    delta_kind = {"thinking": "thinking_delta", "text": "text_delta", "tool_use": "input_json_delta"}
    for kind, data in ev[2:-2]:
        if kind == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append(data["content_block"]["type"])
        elif kind == "content_block_delta":
            assert data["index"] == open_index and data["delta"]["type"] == delta_kind[blocks[-1]]
        else:
            assert kind == "content_block_stop" and data["index"] == open_index
            open_index = None
    assert open_index is None
    assert blocks == ["thinking", "text", "tool_use", "tool_use"]
    final = ev[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == 5 and final["usage"]["input_tokens"] > 0


def test_raw_stream_upstream_failure_is_an_error_event(stack):
    _, w = stack
    body = {"model": "claude-test", "max_tokens": 10, "stream": True, "messages": HELLO}
    with httpx.stream("POST", w.base_url + "/v1/messages", json=body, timeout=30,
                      headers={"x-api-key": KEY, "x-mock-reset-after": "3"}) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    ev = sse_events(raw)
    kinds = [k for k, _ in ev]
    assert kinds[0] == "message_start" and kinds[-1] == "error"
    assert "message_stop" not in kinds and "message_delta" not in kinds and "[DONE]" not in raw
    assert ev[-1][1]["error"]["type"] == "api_error"


def test_client_leaving_mid_stream_aborts_the_upstream(stack):
    m, w = stack
    from conftest import wait_until
    aborts = m.aborts()
    r = rid()
    body = {"model": "claude-test", "max_tokens": 10, "stream": True, "messages": HELLO}
    with httpx.stream("POST", w.base_url + "/v1/messages", json=body, timeout=30,
                      headers={"x-api-key": KEY, "x-request-id": r, "x-mock-itl-ms": "200"}) as resp:
        for line in resp.iter_lines():
            if line.startswith("event: content_block_delta"):
                break  # leave after the first token
    wait_until(lambda: m.aborts() > aborts, 10, message="mock abort after the client left")
    log = w.log_for(r)
    assert log["status"] == 499 and log["error"]["code"] == "client_closed_request"


def test_assistant_prefill_is_continued(stack):
    _, w = stack
    msg = client(w).messages.create(model="claude-test", max_tokens=3,
                                    messages=[*HELLO, {"role": "assistant", "content": "The answer is"}])
    assert msg.stop_reason == "max_tokens" and [b.type for b in msg.content] == ["text"]
