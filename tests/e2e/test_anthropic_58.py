"""Fixes to the Anthropic Messages translation (helper fixanth58; defects found by anth58 with the anthropic SDK).

- An answer whose `content` is a list of parts (Mistral's API; magistral's thinking part first), streamed or
  not, is its text (and thinking) on /v1/messages and /v1/responses, not an empty message billed as one.
- The upstream's reasoning (vLLM's reasoning_content with a reasoning parser) is a thinking block only when the
  request enabled thinking (or adaptive, or between_tools): the SDK idiom `message.content[0].text` works; the tokens are charged.
- A hosted API (pools.X.continuous_usage off) gets none of vLLM's request members (chat_template_kwargs from
  `thinking`, top_k, a prefill's continue_final_message / add_generation_prompt), also on a fallback from a
  self-hosted pool and unstreamed.
- Tool ids an OpenAI-compatible upstream gave (Kimi-K2's `functions.get_weather:0`) are made ids Anthropic takes
  when the conversation goes on at a `type: anthropic` pool, paired as before.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid

import anthropic
import openai
import pytest

from conftest import free_port
from scripted_upstream import ScriptedUpstream

KEY = "sk-fixanth58"
HI = [{"role": "user", "content": "hi"}]
USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}


def chunk(delta=None, finish=None, usage=None):
    c = {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if usage is None else []}
    if usage is not None:
        c["usage"] = usage
    return c


def completion(message, finish="stop"):
    return {"id": "chatcmpl-abc", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": USAGE}


class Upstream(ScriptedUpstream):
    """Answers from `scripts[x-t header]`: {"body": a chat completion, "chunks": its stream's chunk objects}
    (the one the request asks for), {"status", "body"} on chat completions, and {"anthropic": a message} on
    Anthropic's /v1/messages."""

    def __init__(self):
        super().__init__(api_key="sk-ant-up")
        self.scripts: dict[str, dict] = {}

    def _reply(self, req):
        sc = self.scripts.get(req.header("x-t") or "")
        if sc is None:
            return super()._reply(req)
        path = req.target.split("?", 1)[0]
        if path == "/v1/messages":
            if req.header("x-api-key") != self.api_key or "anthropic" not in sc:
                return 400, {"content-type": "application/json"}, b'{"type":"error"}', False
            return 200, {"content-type": "application/json"}, json.dumps(sc["anthropic"]).encode(), False
        if "status" in sc:
            return sc["status"], {"content-type": "application/json"}, json.dumps(sc["body"]).encode(), False
        if req.json().get("stream"):
            body = "".join(f"data: {json.dumps(c)}\n\n" for c in sc["chunks"]) + "data: [DONE]\n\n"
            return 200, {"content-type": "text/event-stream"}, body.encode(), True
        return 200, {"content-type": "application/json"}, json.dumps(sc["body"]).encode(), False

    def script(self, **sc) -> dict:
        name = uuid.uuid4().hex
        self.scripts[name] = sc
        return {"x-t": name}

    def sent(self, headers: dict, path: str = "/v1/chat/completions") -> dict:
        """The body of the last request to `path` made for the script `headers` names."""
        got = [r for r in self.requests if r.header("x-t") == headers["x-t"] and r.target.split("?")[0] == path]
        assert got, f"no request to {path}"
        return got[-1].json()


@pytest.fixture(scope="module")
def stack(module_weir):
    up = Upstream().start()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: a connect failure, then the fallback
    w = module_weir(config={
        "pools": {
            "up": {"endpoints": [up.base_url]},  # http://: self-hosted, continuous_usage auto is on
            "hosted": {"endpoints": [up.base_url], "continuous_usage": False},  # (an http:// proxy to a hosted API)
            "dead": {"endpoints": [dead]},
            "an": {"type": "anthropic", "api_key": "sk-ant-up", "endpoints": [up.base_url]},
        },
        "models": {
            "claude-up": {"pool": "up", "upstream_model": "m"},
            "gpt-hosted": {"pool": "hosted", "upstream_model": "gpt-4.1"},
            "dead-then-hosted": {"pool": "dead", "upstream_model": "m",
                                 "fallbacks": [{"pool": "hosted", "upstream_model": "gpt-4.1"}]},
            "claude-fb": {"pool": "up", "upstream_model": "m",
                          "fallbacks": [{"pool": "an", "upstream_model": "claude-real"}]},
            "claude-an": {"pool": "an", "upstream_model": "claude-real"},
        },
        "tenants": {"t": {"limits": {"requests_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    })
    yield w, up
    up.stop()


def claude(w) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)


def blocks(message) -> list[tuple[str, str]]:
    return [(b.type, b.text if b.type == "text" else b.thinking) for b in message.content]


# --- F1: content as a list of parts ---

MAGISTRAL = completion({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "reasoning"}]},
                                    {"type": "text", "text": "The answer is 42."}]})
MAGISTRAL_CHUNKS = [chunk({"role": "assistant", "content": ""}),
                    chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "reason"}]}]}),
                    chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "ing"}]}]}),
                    chunk({"content": [{"type": "text", "text": "The answer"}]}),
                    chunk({"content": [{"type": "text", "text": " is 42."}]}),
                    chunk({}, "stop"), chunk(usage=USAGE)]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("thinking", [None, {"type": "enabled", "budget_tokens": 1024}])
def test_content_parts_are_the_messages_text_and_thinking(stack, streamed, thinking):
    w, up = stack
    h = up.script(body=MAGISTRAL, chunks=MAGISTRAL_CHUNKS)
    kw = {"thinking": thinking} if thinking else {}
    args = dict(model="claude-up", max_tokens=50, messages=HI, extra_headers=h, **kw)
    if streamed:
        with claude(w).messages.stream(**args) as s:
            m = s.get_final_message()
    else:
        m = claude(w).messages.create(**args)
    want = [("text", "The answer is 42.")]
    if thinking:
        want.insert(0, ("thinking", "reasoning"))
    assert blocks(m) == want
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 4


@pytest.mark.parametrize("streamed", [False, True])
def test_content_parts_are_the_responses_output_text(stack, streamed):
    w, up = stack
    h = up.script(body=MAGISTRAL, chunks=MAGISTRAL_CHUNKS)
    o = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
    if streamed:
        with o.responses.stream(model="claude-up", input="hi", extra_headers=h) as s:
            r = s.get_final_response()
    else:
        r = o.responses.create(model="claude-up", input="hi", extra_headers=h)
    assert r.output_text == "The answer is 42."
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "reasoning"


# --- F2: thinking blocks only when asked for ---

@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("thinking", [None, {"type": "disabled"}, {"type": "enabled", "budget_tokens": 1024},
                                      {"type": "adaptive"}, {"type": "between_tools"}])
def test_reasoning_is_a_thinking_block_only_when_thinking_is_on(stack, streamed, thinking):
    # (between_tools, the current SDKs' fourth type: thinking off, the model's notes between tool calls given back
    # as thinking blocks. It was a 400.)
    w, up = stack
    h = up.script(body=completion({"content": "Answer", "reasoning_content": "Let me think"}),
                  chunks=[chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "Let me think"}),
                          chunk({"content": "Answer"}), chunk({}, "stop"), chunk(usage=USAGE)])
    kw = {"thinking": thinking} if thinking else {}
    args = dict(model="claude-up", max_tokens=2048, messages=HI, extra_headers=h, **kw)
    if streamed:
        with claude(w).messages.stream(**args) as s:
            m = s.get_final_message()
    else:
        m = claude(w).messages.create(**args)
    on = thinking is not None and thinking["type"] != "disabled"
    assert blocks(m) == ([("thinking", "Let me think")] if on else []) + [("text", "Answer")]
    if not on:
        assert m.content[0].text == "Answer"  # the SDK's quickstart idiom
    assert m.usage.output_tokens == 4  # generated, so charged: the reasoning's tokens too
    if thinking is not None:  # the reasoning template's switch: on only where Anthropic's model thinks
        want = thinking["type"] in ("enabled", "adaptive")
        assert up.sent(h)["chat_template_kwargs"] == {"enable_thinking": want}


# --- F4: a hosted API gets no vLLM-only member ---

VLLM_ONLY = {"chat_template_kwargs", "top_k", "continue_final_message", "add_generation_prompt"}
CASES = {
    "thinking": {"thinking": {"type": "enabled", "budget_tokens": 2048}},
    "top_k": {"top_k": 40},
    "prefill": {"messages": [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}]},
}


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("model", ["gpt-hosted", "dead-then-hosted"])
def test_a_hosted_api_gets_no_vllm_member(stack, model, case, streamed):
    w, up = stack
    h = up.script(body=completion({"content": "ok"}),
                  chunks=[chunk({"role": "assistant", "content": "ok"}), chunk({}, "stop"), chunk(usage=USAGE)])
    args = {"model": model, "max_tokens": 4096, "messages": HI, "extra_headers": h, **CASES[case]}
    if streamed:
        with claude(w).messages.stream(**args) as s:
            m = s.get_final_message()
    else:
        m = claude(w).messages.create(**args)
    assert blocks(m) == [("text", "ok")]
    sent = up.sent(h)
    assert sent["model"] == "gpt-4.1"
    assert not VLLM_ONLY & set(sent), sent
    assert "continuous_usage_stats" not in sent.get("stream_options", {})
    if case == "prefill":
        assert sent["messages"][-1] == {"role": "assistant", "content": "{"}


@pytest.mark.parametrize("case", list(CASES))
def test_a_self_hosted_vllm_still_gets_its_members(stack, case):
    w, up = stack
    h = up.script(body=completion({"content": "ok"}))
    claude(w).messages.create(**{"model": "claude-up", "max_tokens": 4096, "messages": HI, "extra_headers": h,
                                 **CASES[case]})
    sent = up.sent(h)
    want = {"thinking": {"chat_template_kwargs"}, "top_k": {"top_k"},
            "prefill": {"continue_final_message", "add_generation_prompt"}}[case]
    assert want <= set(sent), sent


# --- F3: tool ids Anthropic takes on the way to an Anthropic pool ---

WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
ANTHROPIC_OK = {"id": "msg_02", "type": "message", "role": "assistant", "model": "claude-real",
                "content": [{"type": "text", "text": "sunny it is"}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 11, "output_tokens": 3}}
ID = re.compile(r"[a-zA-Z0-9_-]+")


@pytest.mark.parametrize("model", ["claude-fb", "claude-an"])
def test_tool_ids_from_an_openai_upstream_go_to_anthropic_as_ids_it_takes(stack, model):
    w, up = stack
    c = claude(w)
    # Turn 1 at the OpenAI-compatible pool: Kimi-K2's tool call id, given to the client as it came.
    h = up.script(body=completion({"content": None, "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"q":"Paris"}'}}]}, "tool_calls"))
    m1 = c.messages.create(model="claude-up", max_tokens=50, tools=[WEATHER], messages=HI, extra_headers=h)
    tu = [b for b in m1.content if b.type == "tool_use"][0]
    assert tu.id == "functions.get_weather:0"
    # Turn 2 at an Anthropic pool (the OpenAI pool busy: claude-fb's fallback; or claude-an itself).
    h = up.script(status=503, body={"error": {"message": "busy"}}, anthropic=ANTHROPIC_OK)
    history = [*HI, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "sunny"}]}]
    m2 = c.messages.create(model=model, max_tokens=50, tools=[WEATHER], messages=history, extra_headers=h)
    assert blocks(m2) == [("text", "sunny it is")]
    sent = up.sent(h, "/v1/messages")
    call, result = sent["messages"][1]["content"][0], sent["messages"][2]["content"][0]
    assert ID.fullmatch(call["id"]) and call["id"] == result["tool_use_id"], sent["messages"]
    assert call["input"] == {"q": "Paris"}
    assert sent["model"] == "claude-real"
    # An id Anthropic takes goes as it came.
    good = [*HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01A", "name": "get_weather",
                                                     "input": {"q": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "sunny"}]}]
    c.messages.create(model=model, max_tokens=50, tools=[WEATHER], messages=good, extra_headers=h)
    assert up.sent(h, "/v1/messages")["messages"] == good
