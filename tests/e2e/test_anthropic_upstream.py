"""Pools with ``type: anthropic``: Anthropic's Messages API as the upstream.

A scripted upstream (scripted_upstream.py) speaks Anthropic's wire format
from recorded answers (tests/e2e/streams/). Clients: the official ``openai``
SDK on /v1/chat/completions and /v1/responses (translated into Anthropic's
Messages API and back), the official ``anthropic`` SDK on /v1/messages and
count_tokens (passed through as they came, the model renamed). What the
upstream was sent is checked on its side: x-api-key from the pool's
api_key_env, anthropic-version, never the client's credentials.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import uuid

import anthropic
import httpx
import openai
import pytest

from conftest import wait_until
from scripted_upstream import ScriptedUpstream, recorded

KEY = "sk-weir-client"         # the client's key for Weir
POOL_KEY = "sk-ant-pool-secret"  # the pool's key for Anthropic
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather now.",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["location"]}}},
    {"type": "function", "function": {"name": "get_time"}}]


@pytest.fixture(scope="module")
def stack(module_weir):
    up = ScriptedUpstream(api_key=POOL_KEY).start()
    wrong = ScriptedUpstream(api_key="another-key").start()
    w = module_weir(config={
        "pools": {
            "claude": {"type": "anthropic", "endpoints": [up.base_url], "api_key_env": "WEIR_TEST_ANTHROPIC_KEY",
                       "retry": {"attempts": 2, "backoff": "1ms", "max_backoff": "2ms"}},
            "claude-badkey": {"type": "anthropic", "endpoints": [wrong.base_url],
                              "api_key_env": "WEIR_TEST_ANTHROPIC_KEY", "anthropic": {"max_tokens": 1000}},
            "vllm": {"endpoints": [up.base_url]},
        },
        "models": {
            "claude-x": {"pool": "claude", "upstream_model": "claude-sonnet-4-5"},
            "claude-denied": {"pool": "claude-badkey"},
            "claude-fb": {"pool": "claude", "upstream_model": "claude-sonnet-4-5", "fallbacks": [{"model": "via-vllm"}]},
            "via-vllm": {"pool": "vllm", "upstream_model": "mock-model"},
        },
        "tenants": {"t": {"limits": {"requests_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    }, env={"WEIR_TEST_ANTHROPIC_KEY": POOL_KEY})
    yield up, w
    up.stop()
    wrong.stop()


def rid() -> str:
    return "au-" + uuid.uuid4().hex[:16]


def oai(w) -> openai.OpenAI:
    return openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)


def ant(w) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)


def sent(up: ScriptedUpstream, request_id: str):
    """The requests the upstream got for `request_id` (sent as that id, "-" and a generated one)."""
    return [r for r in up.requests if (r.header("x-request-id") or "").startswith(request_id + "-")]


def assert_credentials(req) -> None:
    """Anthropic's headers, the pool's key, never the client's credential."""
    assert req.header("x-api-key") == POOL_KEY
    assert req.header("anthropic-version") == "2023-06-01"
    assert "authorization" not in req.headers
    assert KEY not in json.dumps(req.raw_headers)


# --------------------------------------------------------------- chat completions


def test_chat_completion_is_translated_both_ways(stack):
    up, w = stack
    r = rid()
    c = oai(w).chat.completions.create(
        model="claude-x", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        temperature=0.2, stop=["\n\n", "END"], user="user-7", extra_headers={"x-request-id": r})
    [req] = sent(up, r)
    assert req.method == "POST" and req.target == "/v1/messages"
    assert_credentials(req)
    assert req.json() == {"model": "claude-sonnet-4-5", "system": [{"type": "text", "text": "Be brief."}],
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                          "max_tokens": 4096, "stop_sequences": ["END"], "temperature": 0.2,  # (Anthropic refuses "\n\n")
                          "metadata": {"user_id": "user-7"}}
    assert c.id == "chatcmpl-msg_013Zva2CMHLNnXjNJJKqJ2EF" and c.object == "chat.completion"
    assert c.model == "claude-sonnet-4-5"
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == "Hi! My name is Claude. 😀"
    assert c.choices[0].finish_reason == "stop"
    assert c.usage.prompt_tokens == 2095 + 1024 and c.usage.completion_tokens == 503
    assert c.usage.prompt_tokens_details.cached_tokens == 1024
    log = w.log_for(r)
    assert log["status"] == 200 and log["path"] == "/v1/chat/completions" and log["error"] is None
    assert (log["prompt_tokens"], log["completion_tokens"]) == (3119, 503)


def test_chat_stream_with_usage(stack):
    up, w = stack
    r = rid()
    chunks = list(oai(w).chat.completions.create(
        model="claude-x", messages=[{"role": "user", "content": "Hi"}], max_tokens=50, stream=True,
        stream_options={"include_usage": True}, extra_headers={"x-request-id": r}))
    [req] = sent(up, r)
    assert req.json()["stream"] is True and req.json()["max_tokens"] == 50
    assert "stream_options" not in req.json()
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Hello! Ça va? 你好 — ünïcödé 😀 \"quoted\"\\n and a tab\t."
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 25 + 1024
    assert chunks[-1].usage.completion_tokens == 15 and chunks[-1].usage.prompt_tokens_details.cached_tokens == 1024
    assert {ch.id for ch in chunks} == {"chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL"}
    log = w.log_for(r)
    assert log["stream"] is True and (log["prompt_tokens"], log["completion_tokens"]) == (1049, 15)


def test_chat_stream_without_usage_still_counts_it(stack):
    _, w = stack
    r = rid()
    raw = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {KEY}", "x-request-id": r},
                     json={"model": "claude-x", "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
                     timeout=30)
    assert raw.status_code == 200
    events = [e for e in raw.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), raw.text
    assert events[-1] == "data: [DONE]" and '"usage"' not in raw.text
    assert (w.log_for(r)["prompt_tokens"], w.log_for(r)["completion_tokens"]) == (1049, 15)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_round_trip(stack, stream):
    up, w = stack
    r = rid()
    kw = dict(model="claude-x", messages=[{"role": "user", "content": "Weather in SF, and the time?"}], tools=TOOLS,
              tool_choice="auto", parallel_tool_calls=True, extra_headers={"x-request-id": r, "x-script": "tools"})
    if stream:
        calls: dict[int, dict] = {}
        finish = None
        for ch in oai(w).chat.completions.create(stream=True, **kw):
            for d in ch.choices:
                finish = d.finish_reason or finish
                for tc in d.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    slot["name"] = (tc.function.name if tc.function else None) or slot["name"]
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        got = [calls[i] for i in sorted(calls)]
        assert [c["id"] for c in got] == ["toolu_01T1x1fJ34qAmk2tNTrN7Up6", "toolu_01Q2cgnxDzm7tH1ymGM1c4Zu"]
    else:
        c = oai(w).chat.completions.create(**kw)
        finish = c.choices[0].finish_reason
        assert c.choices[0].message.content == "I'll check the weather for you."
        assert getattr(c.choices[0].message, "reasoning_content", None) == "Weather needs a tool."
        got = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
               for t in c.choices[0].message.tool_calls]
        assert [g["id"] for g in got] == ["toolu_01A09q90qw90lq917835lq9", "toolu_01B12"]
    assert finish == "tool_calls"
    assert [g["name"] for g in got] == ["get_weather", "get_time"]
    assert json.loads(got[0]["arguments"])["location"] == "San Francisco, CA"
    assert json.loads(got[1]["arguments"]) == {}
    [req] = sent(up, r)
    body = req.json()
    assert body["tools"][0] == {"name": "get_weather", "description": "The weather now.",
                                "input_schema": TOOLS[0]["function"]["parameters"]}
    assert body["tools"][1] == {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
    assert body["tool_choice"] == {"type": "auto"}

    # The results go back: tool_use blocks in the assistant turn, tool_result blocks in one user turn.
    r2 = rid()
    follow = oai(w).chat.completions.create(
        model="claude-x", tools=TOOLS, extra_headers={"x-request-id": r2},
        messages=[*kw["messages"],
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": g["id"], "type": "function", "function": {"name": g["name"], "arguments": g["arguments"]}}
                      for g in got]},
                  {"role": "tool", "tool_call_id": got[0]["id"], "content": "18 C"},
                  {"role": "tool", "tool_call_id": got[1]["id"], "content": "noon"}])
    assert follow.choices[0].message.content
    msgs = sent(up, r2)[0].json()["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert [b["type"] for b in msgs[1]["content"]] == ["tool_use", "tool_use"]
    assert msgs[2]["content"] == [{"type": "tool_result", "tool_use_id": got[0]["id"], "content": "18 C"},
                                  {"type": "tool_result", "tool_use_id": got[1]["id"], "content": "noon"}]


def test_thinking_becomes_reasoning_content(stack):
    up, w = stack
    r = rid()
    chunks = list(oai(w).chat.completions.create(
        model="claude-x", messages=[{"role": "user", "content": "GCD of 1071 and 462?"}], stream=True,
        reasoning_effort="low", extra_headers={"x-request-id": r, "x-script": "thinking"}))
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks if ch.choices)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert reasoning.startswith("I need to find the GCD") and reasoning.endswith("147 = 7 × 21 + 0")
    assert text == "The greatest common divisor of 1071 and 462 is **21**."  # never mixed
    assert sent(up, r)[0].json()["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_images_go_as_anthropic_sources(stack):
    up, w = stack
    r = rid()
    oai(w).chat.completions.create(model="claude-x", extra_headers={"x-request-id": r}, messages=[{
        "role": "user", "content": [{"type": "text", "text": "What is this?"},
                                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                                    {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}]}])
    assert sent(up, r)[0].json()["messages"][0]["content"][1:] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}}]


# ------------------------------------------------------------------------ errors


def test_overloaded_529_is_retried_then_an_openai_error(stack):
    up, w = stack
    r = rid()
    with pytest.raises(openai.InternalServerError) as e:
        oai(w).chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "Hi"}],
                                       extra_headers={"x-request-id": r, "x-script": "status-529"})
    assert e.value.status_code == 529
    assert e.value.body == {"message": "Overloaded", "type": "overloaded_error", "param": None, "code": None}
    assert len(sent(up, r)) == 2  # retry.attempts: 529 is Anthropic's "try again"
    assert w.log_for(r)["status"] == 529


def test_rate_limit_429_and_auth_errors_keep_their_status(stack):
    _, w = stack
    with pytest.raises(openai.RateLimitError) as e:
        oai(w).chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "Hi"}],
                                       extra_headers={"x-script": "status-429"})
    assert e.value.body["type"] == "rate_limit_error"
    with pytest.raises(openai.BadRequestError) as e:
        oai(w).chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "Hi"}],
                                       extra_headers={"x-script": "status-400"})
    assert e.value.body["message"] == "messages: text content blocks must be non-empty"
    # A pool whose key Anthropic refuses: 401 in OpenAI's shape (the client's own key was fine).
    with pytest.raises(openai.AuthenticationError) as e:
        oai(w).chat.completions.create(model="claude-denied", messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["type"] == "authentication_error"


def test_error_mid_stream_is_an_in_band_openai_error(stack):
    _, w = stack
    r = rid()
    got = []
    with pytest.raises(openai.APIError) as e:
        for ch in oai(w).chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "Hi"}],
                                                 stream=True,
                                                 extra_headers={"x-request-id": r, "x-script": "error-mid-stream"}):
            got += [ch.choices[0].delta.content or ""] if ch.choices else []
    assert "Overloaded" in str(e.value)
    assert "".join(got) == "Partial answer: é"
    raw = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {KEY}",
                                                          "x-script": "error-mid-stream"},
                     json={"model": "claude-x", "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
                     timeout=30).text
    assert raw.endswith('data: {"error":{"message":"Overloaded","type":"overloaded_error","param":null,'
                        '"code":null}}\n\ndata: [DONE]\n\n'), raw
    assert w.log_for(r)["status"] == 200  # the head went out before the error


def test_upstream_that_misbehaves(stack):
    _, w = stack
    h = {"authorization": f"Bearer {KEY}"}
    hi = [{"role": "user", "content": "Hi"}]
    # A 200 whose body is no Anthropic message: 502 in OpenAI's shape.
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "claude-x", "messages": hi},
                   headers={**h, "x-script": "garbage"}, timeout=30)
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error", r.text
    # A stream whose connection drops: the text so far, then Weir's in-band error and [DONE].
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "claude-x", "messages": hi, "stream": True},
                   headers={**h, "x-script": "cut"}, timeout=30)
    assert r.status_code == 200
    events = [e for e in r.text.split("\n\n") if e]
    assert '"content":"Hello"' in r.text
    assert json.loads(events[-2][6:])["error"]["message"].startswith("Upstream pool `claude`"), events[-2]
    assert events[-1] == "data: [DONE]"
    # The same to an Anthropic client: Anthropic's bytes, then one error event.
    r = httpx.post(w.base_url + "/v1/messages", json={"model": "claude-x", "max_tokens": 5, "messages": hi,
                                                      "stream": True},
                   headers={"x-api-key": KEY, "x-script": "cut"}, timeout=30)
    assert r.text.startswith(recorded("anthropic_text.sse").decode()[:200])
    assert r.text.endswith("\n\n") and r.text.rsplit("\n\n", 2)[-2].startswith('event: error\ndata: {"type":"error"')
    assert r.text.count("event: error") == 1


def test_client_leaving_mid_stream_aborts_the_anthropic_request(stack):
    up, w = stack
    r = rid()
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=30,
                      json={"model": "claude-x", "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
                      headers={"authorization": f"Bearer {KEY}", "x-script": "hang", "x-request-id": r}) as resp:
        for line in resp.iter_lines():
            if '"content":"Hello"' in line:
                break  # the first token is here: leave
    wait_until(lambda: any(a.startswith(r + "-") for a in up.aborted), 10,
               message="the upstream connection closed by Weir")
    assert w.log_for(r)["status"] == 499


def test_what_anthropic_cannot_express_is_a_400_before_the_upstream(stack):
    up, w = stack
    before = len(up.requests)
    with pytest.raises(openai.BadRequestError) as e:
        oai(w).chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "Hi"}], n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        oai(w).chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "Hi"}],
                                       response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        oai(w).embeddings.create(model="claude-x", input="hi")
    assert e.value.body["code"] == "unsupported_route" and "/v1/embeddings" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai(w).completions.create(model="claude-x", prompt="hi")
    assert e.value.body["code"] == "unsupported_route"
    assert len(up.requests) == before


def test_fallback_from_an_anthropic_pool_to_an_openai_compatible_one(stack):
    up, w = stack
    r = rid()
    c = oai(w).chat.completions.create(model="claude-fb", messages=[{"role": "user", "content": "Hi"}],
                                       extra_headers={"x-request-id": r, "x-script": "status-529"})
    assert c.choices[0].message.content == "Hello! Ça va? 你好 😀 \"done\"\n"  # vLLM's answer
    reqs = sent(up, r)
    assert [q.target for q in reqs] == ["/v1/messages", "/v1/messages", "/v1/chat/completions"]
    assert reqs[2].json() == {"model": "mock-model", "messages": [{"role": "user", "content": "Hi"}]}
    assert "x-api-key" not in reqs[2].headers and "anthropic-version" not in reqs[2].headers
    # An Anthropic client's request goes as it came to the Anthropic pool, translated to the fallback.
    r2 = rid()
    msg = ant(w).messages.create(model="claude-fb", max_tokens=9, messages=[{"role": "user", "content": "Hi"}],
                                 extra_headers={"x-request-id": r2, "x-script": "status-529"})
    assert msg.content[0].text == "Hello! Ça va? 你好 😀 \"done\"\n"
    reqs = sent(up, r2)
    assert reqs[0].json() == {"model": "claude-sonnet-4-5", "max_tokens": 9,
                              "messages": [{"role": "user", "content": "Hi"}]}
    assert reqs[2].target == "/v1/chat/completions" and reqs[2].json()["max_tokens"] == 9


# ----------------------------------------------------------------- /v1/responses


@pytest.mark.parametrize("stream", [False, True])
def test_responses_through_an_anthropic_pool(stack, stream):
    up, w = stack
    r = rid()
    kw = dict(model="claude-x", input="Hi", instructions="Be brief.", max_output_tokens=64,
              extra_headers={"x-request-id": r})
    if stream:
        with oai(w).responses.stream(**kw) as s:
            final = s.get_final_response()
        assert final.output_text == "Hello! Ça va? 你好 — ünïcödé 😀 \"quoted\"\\n and a tab\t."
        assert final.usage.input_tokens == 1049 and final.usage.output_tokens == 15
    else:
        final = oai(w).responses.create(**kw)
        assert final.output_text == "Hi! My name is Claude. 😀"
        assert final.usage.input_tokens == 3119 and final.usage.input_tokens_details.cached_tokens == 1024
    assert final.status == "completed" and final.id.startswith("resp_msg_")
    body = sent(up, r)[0].json()
    assert body["system"] == [{"type": "text", "text": "Be brief."}] and body["max_tokens"] == 64


# ---------------------------------------------------------- /v1/messages as it came


def test_anthropic_sdk_messages_pass_through(stack):
    up, w = stack
    r = rid()
    msg = ant(w).messages.create(model="claude-x", max_tokens=300, messages=[{"role": "user", "content": "Hi"}],
                                 extra_headers={"x-request-id": r})
    assert msg.content[0].text == "Hi! My name is Claude. 😀"
    assert msg.model == "claude-sonnet-4-5" and msg.usage.cache_read_input_tokens == 1024
    [req] = sent(up, r)
    assert_credentials(req)
    log = w.log_for(r)
    assert (log["prompt_tokens"], log["completion_tokens"]) == (3119, 503)


def test_anthropic_sdk_stream_and_tools_pass_through(stack):
    up, w = stack
    r = rid()
    with ant(w).messages.stream(model="claude-x", max_tokens=300, messages=[{"role": "user", "content": "SF?"}],
                                tools=[{"name": "get_weather", "input_schema": {"type": "object"}},
                                       {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
                                extra_headers={"x-request-id": r, "x-script": "tools"}) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[1].input == {"location": "San Francisco, CA", "unit": "fahrenheit"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 89
    # Server tools go to Anthropic (the chat translation would refuse them).
    assert sent(up, r)[0].json()["tools"][1]["type"] == "web_search_20250305"
    log = w.log_for(r)
    assert (log["prompt_tokens"], log["completion_tokens"]) == (472, 89)


def test_messages_body_goes_byte_for_byte_but_the_model(stack):
    up, w = stack
    r = rid()
    raw = ('{"model":"claude-x",  "max_tokens":7,"messages":[{"role":"user","content":"\\u00e9 caf\u00e9"}],'
           '"metadata":{"user_id":"u"},"x-unknown":[1.50,2e3]}').encode()
    resp = httpx.post(w.base_url + "/v1/messages?beta=true", content=raw,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-01-01", "anthropic-beta": "b-1",
                               "content-type": "application/json", "x-request-id": r}, timeout=30)
    assert resp.status_code == 200, resp.text
    [req] = sent(up, r)
    assert req.target == "/v1/messages?beta=true"
    assert req.body == raw.replace(b'"claude-x"', b'"claude-sonnet-4-5"')
    assert req.header("anthropic-version") == "2023-06-01"  # the pool's replaces the client's
    assert req.header("anthropic-beta") == "b-1"
    assert_credentials(req)


def test_count_tokens_passes_through_and_is_not_charged(stack):
    up, w = stack
    r = rid()
    n = ant(w).messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "Hi"}],
                                     extra_headers={"x-request-id": r})
    [req] = sent(up, r)
    assert req.target == "/v1/messages/count_tokens" and req.json()["model"] == "claude-sonnet-4-5"
    assert n.input_tokens == 14 + len(json.dumps([{"role": "user", "content": "Hi"}])) // 8
    log = w.log_for(r)
    assert (log["prompt_tokens"], log["completion_tokens"]) == (0, 0)


def test_anthropic_errors_pass_through_in_anthropics_shape(stack):
    _, w = stack
    with pytest.raises(anthropic.OverloadedError) as e:
        ant(w).messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "Hi"}],
                               extra_headers={"x-script": "status-529"})
    assert e.value.status_code == 529 and e.value.body["error"]["type"] == "overloaded_error"
    # Weir's own refusals keep Anthropic's shape too.
    r = httpx.post(w.base_url + "/v1/messages", json={"model": "claude-x", "messages": []},
                   headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_error_event_mid_stream_reaches_the_anthropic_client(stack):
    _, w = stack
    with pytest.raises(anthropic.APIStatusError) as e:
        with ant(w).messages.stream(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "Hi"}],
                                    extra_headers={"x-script": "error-mid-stream"}) as s:
            for _ in s:
                pass
    assert "Overloaded" in str(e.value)


# ---------------------------------------------------------- request bodies


def test_gzip_request_body_is_decoded(stack):
    up, w = stack
    r = rid()
    body = json.dumps({"model": "claude-x", "messages": [{"role": "user", "content": "Hi"}]}).encode()
    resp = httpx.post(w.v1 + "/chat/completions", content=gzip.compress(body),
                      headers={"authorization": f"Bearer {KEY}", "content-encoding": "gzip",
                               "content-type": "application/json", "x-request-id": r}, timeout=30)
    assert resp.status_code == 200, resp.text
    assert "content-encoding" not in sent(up, r)[0].headers
    # To an OpenAI-compatible pool the decoded body goes as it is, without the header.
    r2 = rid()
    vbody = json.dumps({"model": "via-vllm", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}).encode()
    resp = httpx.post(w.v1 + "/chat/completions", content=gzip.compress(vbody),
                      headers={"authorization": f"Bearer {KEY}", "content-encoding": "gzip",
                               "x-request-id": r2, "x-script": "vllm-text"}, timeout=30)
    assert resp.status_code == 200, resp.text
    [req] = sent(up, r2)
    assert "content-encoding" not in req.headers and json.loads(req.body)["model"] == "mock-model"
    # Other codings: 415 naming what is accepted; a corrupt gzip body: 400.
    bad = httpx.post(w.v1 + "/chat/completions", content=b"\x00" * 10,
                     headers={"authorization": f"Bearer {KEY}", "content-encoding": "br"}, timeout=30)
    assert bad.status_code == 415 and bad.json()["error"]["code"] == "unsupported_content_encoding"
    assert "gzip" in bad.headers["accept-encoding"]
    bad = httpx.post(w.v1 + "/chat/completions", content=b"\x1f\x8b not gzip",
                     headers={"authorization": f"Bearer {KEY}", "content-encoding": "gzip"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_content_encoding"
    # Several gzip members in a row (RFC 1952 §2.2, what `cat a.gz b.gz` makes): decoded whole.
    r3 = rid()
    resp = httpx.post(w.v1 + "/chat/completions", content=gzip.compress(vbody[:20]) + gzip.compress(vbody[20:]),
                      headers={"authorization": f"Bearer {KEY}", "content-encoding": "gzip",
                               "x-request-id": r3, "x-script": "vllm-text"}, timeout=30)
    assert resp.status_code == 200, resp.text
    assert json.loads(sent(up, r3)[0].body)["messages"] == [{"role": "user", "content": "Hi"}]
    # Bytes after the last member that are not gzip: refused, never dropped unread.
    bad = httpx.post(w.v1 + "/chat/completions", content=gzip.compress(body) + b"garbage",
                     headers={"authorization": f"Bearer {KEY}", "content-encoding": "gzip"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_content_encoding"
    # A body that inflates past server.max_body (4 MiB): 413, whatever its compressed size.
    bomb = gzip.compress(b"0" * (5 << 20))
    assert len(bomb) < 10_000
    bad = httpx.post(w.v1 + "/chat/completions", content=bomb,
                     headers={"authorization": f"Bearer {KEY}", "content-encoding": "gzip"}, timeout=30)
    assert bad.status_code == 413 and bad.json()["error"]["code"] == "request_too_large"
    # On an Anthropic route the refusal is in Anthropic's shape.
    bad = httpx.post(w.base_url + "/v1/messages", content=b"{}",
                     headers={"x-api-key": KEY, "content-encoding": "zstd"}, timeout=30)
    assert bad.status_code == 415 and bad.json()["error"]["type"] == "invalid_request_error"


def test_integers_beyond_64_bits_reach_the_upstream_exactly(stack):
    up, w = stack
    schema = ('{"type":"object","properties":{"n":{"type":"integer","maximum":18446744073709551616,'
              '"minimum":-123456789012345678901234567890}}}')
    for path, body, script in [
        ("/v1/chat/completions",
         '{"model":"claude-x","messages":[{"role":"user","content":"x"}],'
         '"tools":[{"type":"function","function":{"name":"f","parameters":' + schema + '}}]}', "text"),
        ("/v1/messages",  # Anthropic → chat completions for an OpenAI-compatible pool
         '{"model":"via-vllm","max_tokens":5,"messages":[{"role":"user","content":"x"}],'
         '"tools":[{"name":"f","input_schema":' + schema + '}]}', "vllm-text"),
        ("/v1/responses",
         '{"model":"via-vllm","input":"x","tools":[{"type":"function","name":"f","parameters":' + schema + '}]}',
         "vllm-text"),
    ]:
        r = rid()
        resp = httpx.post(w.base_url + path, content=body.encode(),
                          headers={"authorization": f"Bearer {KEY}", "x-request-id": r, "x-script": script,
                                   "content-type": "application/json"}, timeout=30)
        assert resp.status_code == 200, (path, resp.text)
        got = sent(up, r)[0].body
        assert b'"maximum":18446744073709551616' in got, (path, got)
        assert b'"minimum":-123456789012345678901234567890' in got, (path, got)
