"""Decimals in translated bodies are written as Python's json and JavaScript write them.

Boost.JSON 1.81's serializer writes a double in its own exponent form: a client's `temperature: 0.7` on
/v1/messages reached a vLLM pool as `"temperature":7E-1`, `100.0` as `1E2`, and a tool schema's `"minimum":
0.5` as `5E-1`. Upstreams read the same value, but the body is not what any client or server writes, and it is
what request logs and traces show. Every translator now writes the shortest decimal that reads back as the
same double (`0.7`, `100.0`, `1e+21`), in each direction (api/json_write.hpp).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid

import anthropic
import httpx
import openai
import pytest

from scripted_upstream import ScriptedUpstream

KEY = "sk-numbers-56"
POOL_KEY = "sk-ant-numbers-pool"
EXPONENT = re.compile(rb"[0-9]E[-+]?[0-9]")  # Boost.JSON's form: 7E-1, 1E2, 1.5E0


@pytest.fixture(scope="module")
def stack(module_weir):
    up = ScriptedUpstream(api_key=POOL_KEY).start()
    w = module_weir(config={
        "pools": {
            "vllm": {"endpoints": [up.base_url]},
            "claude": {"type": "anthropic", "endpoints": [up.base_url], "api_key_env": "WEIR_TEST_NUMBERS_KEY"},
        },
        "models": {
            "m": {"pool": "vllm", "upstream_model": "mock-model"},
            "claude-x": {"pool": "claude", "upstream_model": "claude-sonnet-4-5"},
        },
        "tenants": {"t": {"limits": {"requests_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    }, env={"WEIR_TEST_NUMBERS_KEY": POOL_KEY})
    yield up, w
    up.stop()


def rid() -> str:
    return "num-" + uuid.uuid4().hex[:16]


def sent(up: ScriptedUpstream, request_id: str):
    [req] = [r for r in up.requests if (r.header("x-request-id") or "").startswith(request_id + "-")]
    return req


SCHEMA = {"type": "object", "properties": {"t": {"type": "number", "minimum": 0.5, "maximum": 100.0,
                                                 "multipleOf": 0.25}}}


def test_messages_to_a_vllm_pool(stack):
    up, w = stack
    r = rid()
    client = anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)
    client.messages.create(
        model="m", max_tokens=16, temperature=0.7, top_p=0.95, messages=[{"role": "user", "content": "hi"}],
        tools=[{"name": "f", "description": "d", "input_schema": SCHEMA}],
        extra_headers={"x-request-id": r, "x-script": "vllm-echo"})
    req = sent(up, r)
    assert not EXPONENT.search(req.body), req.body
    assert b'"temperature":0.7' in req.body and b'"top_p":0.95' in req.body
    body = req.json()
    assert body["temperature"] == 0.7
    params = body["tools"][0]["function"]["parameters"]
    assert params["properties"]["t"] == {"type": "number", "minimum": 0.5, "maximum": 100.0, "multipleOf": 0.25}
    assert b'"maximum":100.0' in req.body  # a float stays a float


def test_responses_to_a_vllm_pool(stack):
    up, w = stack
    r = rid()
    client = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
    client.responses.create(model="m", input="hi", temperature=0.7, top_p=0.5, max_output_tokens=16,
                            tools=[{"type": "function", "name": "f", "parameters": SCHEMA}],
                            extra_headers={"x-request-id": r, "x-script": "vllm-echo"})
    req = sent(up, r)
    assert not EXPONENT.search(req.body), req.body
    assert b'"temperature":0.7' in req.body and b'"top_p":0.5' in req.body


def test_chat_to_an_anthropic_pool(stack):
    up, w = stack
    r = rid()
    client = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
    client.chat.completions.create(
        model="claude-x", messages=[{"role": "user", "content": "hi"}], temperature=0.7, top_p=0.95,
        tools=[{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}],
        extra_headers={"x-request-id": r, "x-script": "text"})
    req = sent(up, r)
    assert not EXPONENT.search(req.body), req.body
    assert b'"temperature":0.7' in req.body
    assert req.json()["tools"][0]["input_schema"]["properties"]["t"]["multipleOf"] == 0.25


def test_tool_arguments_from_a_chat_history_to_an_anthropic_pool(stack):
    # An assistant tool call's arguments (a JSON string) become a tool_use block's `input` object.
    up, w = stack
    r = rid()
    messages = [
        {"role": "user", "content": "set it"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "f", "arguments": '{"t": 0.1, "big": 1e21, "n": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    resp = httpx.post(f"{w.v1}/chat/completions", headers={"authorization": f"Bearer {KEY}", "x-request-id": r,
                                                            "x-script": "text"},
                      json={"model": "claude-x", "messages": messages, "max_tokens": 16}, timeout=30)
    assert resp.status_code == 200, resp.text
    req = sent(up, r)
    assert not EXPONENT.search(req.body), req.body
    blocks = [b for m in req.json()["messages"] for b in (m["content"] if isinstance(m["content"], list) else [])]
    [use] = [b for b in blocks if b.get("type") == "tool_use"]
    assert use["input"] == {"t": 0.1, "big": 1e21, "n": 3}
    assert b'"t":0.1' in req.body and b'"big":1e+21' in req.body and b'"n":3' in req.body
