"""The official openai SDK's client.responses through Weir's /v1/responses,
translated for a vLLM-style (weir-mock) chat-completions upstream.

Text and token counts are checked against the same request sent straight to
weir-mock as a chat completion (with the x-request-id Weir sent upstream: same words, same usage);
reasoning and tool calls use weir-mock's x-mock-reasoning and
x-mock-tool-calls. Raw-wire tests check the event grammar as a non-SDK client
sees it, and that a failure mid-stream ends in response.failed.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import httpx
import openai
import pytest

MOCK_FLAGS = ("--ttft-ms", "2", "--itl-ms", "1", "--max-tokens", "12")
KEY = "sk-responses-test"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    "strict": False,
}
CLOCK = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock(*MOCK_FLAGS)
    w = module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"gpt-test": {"pool": "p", "upstream_model": "mock-model"}},
        "tenants": {"t": {"limits": {"requests_per_minute": 10000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    })
    return m, w


def client(w, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=w.base_url + "/v1", api_key=key, max_retries=0, timeout=30)


def direct(m) -> openai.OpenAI:
    return openai.OpenAI(base_url=m.v1, api_key="test", max_retries=0, timeout=30)


def rid() -> str:
    return "r-" + uuid.uuid4().hex[:16]


def reference(m, request_id: str, max_tokens: int, messages=None):
    """The mock's own answer to the translated request."""
    return direct(m).chat.completions.create(model="mock-model", max_tokens=max_tokens,
                                             messages=messages or [{"role": "user", "content": "hello there"}],
                                             extra_headers={"x-request-id": request_id})


def test_create_matches_upstream_and_is_incomplete_at_max_output_tokens(stack):
    m, w = stack
    r = rid()
    before = w.metric("weir_requests_total", route="/v1/responses", status="200")
    resp = client(w).responses.create(model="gpt-test", input="hello there", max_output_tokens=5,
                                      extra_headers={"x-request-id": r})
    ref = reference(m, w.upstream_id(r), 5)
    assert resp.object == "response" and resp.id == "resp_" + w.upstream_id(r)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in resp.output] == ["message"]
    assert resp.output[0].id == "msg_" + w.upstream_id(r) and resp.output[0].role == "assistant"
    assert resp.output_text == ref.choices[0].message.content
    assert resp.usage.input_tokens == ref.usage.prompt_tokens and resp.usage.output_tokens == 5
    assert resp.usage.total_tokens == ref.usage.total_tokens
    assert resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.max_output_tokens == 5 and resp.store is False and resp.tools == []
    log = w.log_for(r)
    assert log["path"] == "/v1/responses" and log["status"] == 200 and log["stream"] is False
    assert (log["prompt_tokens"], log["completion_tokens"]) == (ref.usage.prompt_tokens, 5)
    assert log["error"] is None
    assert w.metric("weir_requests_total", route="/v1/responses", status="200") == before + 1


def test_natural_end_is_completed_with_instructions(stack):
    m, w = stack
    r = rid()
    resp = client(w).responses.create(model="gpt-test", input=[{"role": "user", "content": "hello there"}],
                                      instructions="Be brief.", temperature=0.2, metadata={"k": "v"},
                                      store=True, extra_headers={"x-request-id": r})
    ref = reference(m, w.upstream_id(r), 100, [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "hello there"}])
    assert resp.status == "completed" and resp.incomplete_details is None
    assert resp.output_text == ref.choices[0].message.content and resp.usage.output_tokens == 12
    assert resp.instructions == "Be brief." and resp.metadata == {"k": "v"} and resp.temperature == 0.2
    assert resp.store is False  # nothing is stored, whatever was asked


def test_stream_matches_upstream(stack):
    m, w = stack
    r = rid()
    events = list(client(w).responses.create(model="gpt-test", input="hello there", max_output_tokens=6,
                                             stream=True, extra_headers={"x-request-id": r}))
    ref = reference(m, w.upstream_id(r), 6)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete" and sum(k in TERMINAL for k in kinds) == 1
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == ref.choices[0].message.content
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and done[0].text == text
    final = events[-1].response
    assert final.id == "resp_" + w.upstream_id(r) and final.output_text == text
    assert final.usage.output_tokens == 6 and final.usage.input_tokens == ref.usage.prompt_tokens
    log = w.log_for(r)
    assert log["stream"] is True and log["status"] == 200 and log["path"] == "/v1/responses"
    assert (log["prompt_tokens"], log["completion_tokens"]) == (ref.usage.prompt_tokens, 6)


def test_sdk_stream_helper_accumulates_the_events(stack):
    """client.responses.stream() rebuilds the response from the events and
    takes the final one from response.completed."""
    _, w = stack
    with client(w).responses.stream(model="gpt-test", input="Weather?", tools=[WEATHER, CLOCK],
                                    extra_headers={"x-mock-tool-calls": "2", "x-mock-reasoning": "2"}) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed"
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call", "function_call"]
    assert final.output_text == text and text
    assert [o.name for o in final.output[2:]] == ["get_weather", "get_time"]


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_item_from_reasoning_content(stack, stream):
    m, w = stack
    r = rid()
    kw = dict(model="gpt-test", input="hello there", max_output_tokens=5, reasoning={"effort": "low"},
              extra_headers={"x-request-id": r, "x-mock-reasoning": "2"})
    if stream:
        events = list(client(w).responses.create(stream=True, **kw))
        resp = events[-1].response
        deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    else:
        resp = client(w).responses.create(**kw)
    words = reference(m, w.upstream_id(r), 5).choices[0].message.content.split(" ")[1:]
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == " " + " ".join(words[:2])
    assert resp.output_text == " " + " ".join(words[2:])  # reasoning never leaks into the text
    if stream:
        assert deltas == resp.output[0].content[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_round_trip(stack, stream):
    _, w = stack
    c = client(w)
    question = [{"role": "user", "content": "Weather in Paris, and the time?"}]
    kw = dict(model="gpt-test", input=question, max_output_tokens=3, tools=[WEATHER, CLOCK], tool_choice="auto",
              parallel_tool_calls=True, extra_headers={"x-mock-tool-calls": "2"})
    if stream:
        events = list(c.responses.create(stream=True, **kw))
        kinds = [e.type for e in events]
        assert kinds.count("response.function_call_arguments.done") == 2
        resp = events[-1].response
        assert events[-1].type == "response.completed"
    else:
        resp = c.responses.create(**kw)
    assert resp.status == "completed"
    assert [o.type for o in resp.output] == ["message", "function_call", "function_call"]
    calls = resp.output[1:]
    assert [f.name for f in calls] == ["get_weather", "get_time"]
    assert all(f.call_id.startswith("chatcmpl-tool-") for f in calls) and calls[0].call_id != calls[1].call_id
    assert all(f.id.startswith("fc_") for f in calls) and calls[0].id != calls[1].id
    assert all(set(json.loads(f.arguments)) == {"q"} for f in calls)
    assert [t.name for t in resp.tools] == ["get_weather", "get_time"]

    # The outputs go back with the results: the upstream gets the assistant's
    # tool_calls and one `role: tool` message per result.
    follow = c.responses.create(
        model="gpt-test", max_output_tokens=4, tools=[WEATHER, CLOCK],
        input=[*question, *[o.model_dump(exclude_none=True) for o in resp.output],
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"},
               {"type": "function_call_output", "call_id": calls[1].call_id, "output": "12:00"}])
    assert follow.status == "incomplete" and [o.type for o in follow.output] == ["message"]
    assert follow.usage.input_tokens > resp.usage.input_tokens


def test_text_format_json_schema(stack):
    _, w = stack
    schema = {"type": "object", "properties": {"t": {"type": "number"}}, "required": ["t"],
              "additionalProperties": False}
    resp = client(w).responses.create(model="gpt-test", input="hello there", max_output_tokens=3,
                                      text={"format": {"type": "json_schema", "name": "weather", "schema": schema,
                                                       "strict": True}})
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "weather"
    assert [o.type for o in resp.output] == ["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client(w).responses.create(model="gpt-test", input="x", text={"format": {"type": "json_schema",
                                                                                  "schema": schema}})
    assert e.value.body["param"] == "text" and "text.format.name" in e.value.body["message"]


def post(w, body, key: str | None = KEY, **headers) -> httpx.Response:
    if key:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(w.base_url + "/v1/responses", content=json.dumps(body), headers=headers, timeout=30)


def openai_error(r: httpx.Response, status: int, kind: str, param: str | None = None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == kind, err
    if param is not None:
        assert err["param"] == param, err
    return err["message"]


def test_errors_in_openai_shape(stack):
    _, w = stack
    with pytest.raises(openai.BadRequestError) as e:
        client(w).responses.create(model="gpt-test", input="x", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id" and "store" in e.value.body["message"]
    openai_error(post(w, {"model": "gpt-test", "input": "x", "tools": [{"type": "web_search"}]}), 400,
                 "invalid_request_error", "tools")
    openai_error(post(w, {"model": "gpt-test", "input": [{"type": "item_reference", "id": "msg_1"}]}), 400,
                 "invalid_request_error", "input")
    openai_error(post(w, {"model": "gpt-test"}), 400, "invalid_request_error", "input")
    r = httpx.post(w.base_url + "/v1/responses", content=b"{nope", headers={"authorization": f"Bearer {KEY}"},
                   timeout=30)
    openai_error(r, 400, "invalid_request_error")
    openai_error(post(w, {"model": "gpt-test", "input": "x"}, key=None), 401, "invalid_request_error")
    assert post(w, {"model": "nope", "input": "x"}).status_code == 404
    # The upstream's own error passes through with its status.
    r = post(w, {"model": "gpt-test", "input": "x"}, **{"x-mock-status": "500"})
    assert r.status_code == 500 and "error" in r.json()
    with pytest.raises(openai.AuthenticationError):
        client(w, key="sk-wrong").responses.create(model="gpt-test", input="x")


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
    body = {"model": "gpt-test", "input": "hello there", "max_output_tokens": 5, "stream": True,
            "tools": [WEATHER, CLOCK]}
    with httpx.stream("POST", w.base_url + "/v1/responses", json=body, timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "x-mock-reasoning": "2",
                               "x-mock-tool-calls": "2"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert "[DONE]" not in raw and "data: {\"id\"" not in raw
    ev = sse_events(raw)
    assert [d["sequence_number"] for _, d in ev] == list(range(len(ev)))
    kinds = [k for k, _ in ev]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert sum(k in TERMINAL for k in kinds) == 1
    # Items: dense output indices, one open at a time, deltas of the open item's kind.
    items, open_index = [], None
    delta_of = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta",
                "function_call": "response.function_call_arguments.delta"}
    for kind, data in ev[2:-1]:
        if kind == "response.output_item.added":
            assert open_index is None and data["output_index"] == len(items)
            open_index = data["output_index"]
            items.append(data["item"]["type"])
        elif kind == "response.output_item.done":
            assert data["output_index"] == open_index
            open_index = None
        else:
            assert data["output_index"] == open_index, (kind, data)
            if kind.endswith(".delta"):
                assert kind == delta_of[items[-1]]
    assert open_index is None
    assert items == ["reasoning", "message", "function_call", "function_call"]
    final = ev[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == items
    assert final["usage"]["output_tokens"] == 5 and final["usage"]["input_tokens"] > 0


def test_raw_stream_upstream_failure_is_response_failed(stack):
    _, w = stack
    r = rid()
    body = {"model": "gpt-test", "input": "hello there", "max_output_tokens": 10, "stream": True}
    with httpx.stream("POST", w.base_url + "/v1/responses", json=body, timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "x-request-id": r,
                               "x-mock-reset-after": "3"}) as resp:
        assert resp.status_code == 200
        raw = resp.read().decode()
    ev = sse_events(raw)
    kinds = [k for k, _ in ev]
    assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
    assert "response.completed" not in kinds and "[DONE]" not in raw
    failed = ev[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert r in failed["error"]["message"]
    assert w.log_for(r)["error"] is not None
