"""Usage objects that leave a count out (stop 58's attack round, tokens58; fixer fixusage58).

A count absent or null inside `usage` was read as a reported 0: `{}` was billed 0 tokens and $0, a null
completion_tokens 0 completion tokens, a chat answer's lone total_tokens all prompt (vLLM rerank's rule), an
Anthropic message_delta's null output_tokens left message_start's placeholder (1) standing. And an Anthropic
stream cut before message_delta was charged message_start's prompt without its cache writes, at the input price.
Now a usage with no count at all is no usage (the no-usage estimate); a generation's usage that leaves its prompt
or its completion count out is invalid usage (usage_invalid, weir_upstream_invalid_usage_total): the part it said
is charged as said, the rest at the no-usage estimate (docs/admission.md)."""
from __future__ import annotations

import hashlib
import json

import anthropic
import httpx
import openai
import pytest

from test_usage_estimate_55 import SSE_HEAD, Upstream, anthropic_event, chat_chunk, json_head

KEY = "sk-stop58-usage"
PIECE = "word " * 4  # 20 bytes
PIECES = 10
TEXT = PIECE * PIECES  # 200 bytes: 50 tokens at the estimate's 4 bytes a token
TEXT_TOKENS = len(TEXT) // 4
PRICE = {"input": 1.0, "output": 2.0, "cached_input": 0.5, "cache_write": 4.0, "cache_write_1h": 8.0}


def config(url: str, anthropic_pool: bool = False) -> dict:
    pool = {"endpoints": [url], "retry": {"attempts": 1}}
    if anthropic_pool:
        pool |= {"type": "anthropic", "api_key": "sk-up"}
    return {"pools": {"p": pool},
            "models": {"m": {"pool": "p"}},
            "tenants": {"t": {"budget": {"usd": 100.0}}},
            "auth": {"api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
            "pricing": {"*": PRICE}}


def spend(prompt=0, completion=0, cached=0, write=0, write_1h=0) -> float:
    """USD at PRICE (per 1M tokens) of a charge; `write` counts the 1-hour writes too."""
    return ((prompt - cached - write) * PRICE["input"] + cached * PRICE["cached_input"] +
            (write - write_1h) * PRICE["cache_write"] + write_1h * PRICE["cache_write_1h"] +
            completion * PRICE["output"]) / 1e6


def chat_answer(usage) -> bytes:
    body = {"id": "chatcmpl-58", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}]}
    if usage != "absent":
        body["usage"] = usage
    return json.dumps(body).encode()


def chat_stream(usage) -> list[bytes]:
    """A whole stream: the role chunk, ten text chunks, the finish chunk, the usage chunk (`usage` as given), [DONE]."""
    parts = ([chat_chunk({"role": "assistant", "content": ""})] + [chat_chunk({"content": PIECE})] * PIECES +
             [chat_chunk({}, "stop")])
    if usage != "absent":
        u = {"id": "chatcmpl-58", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": usage}
        parts.append(b"data: %s\n\n" % json.dumps(u).encode())
    return parts + [b"data: [DONE]\n\n"]


def call(w, route: str, stream: bool, rid: str) -> None:
    """One request on `route` with the SDK its clients use, read to its end; checks the text came whole."""
    hdrs = {"x-request-id": rid}
    msgs = [{"role": "user", "content": "hello there"}]
    text = ""
    if route == "chat":
        c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
        if stream:
            for ch in c.chat.completions.create(model="m", max_tokens=500, messages=msgs, stream=True,
                                                stream_options={"include_usage": True}, extra_headers=hdrs):
                if ch.choices and ch.choices[0].delta.content:
                    text += ch.choices[0].delta.content
        else:
            text = c.chat.completions.create(model="m", max_tokens=500, messages=msgs,
                                             extra_headers=hdrs).choices[0].message.content
    elif route == "messages":
        c = anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)
        if stream:
            with c.messages.stream(model="m", max_tokens=500, messages=msgs, extra_headers=hdrs) as s:
                text = "".join(s.text_stream)
        else:
            text = c.messages.create(model="m", max_tokens=500, messages=msgs, extra_headers=hdrs).content[0].text
    else:
        c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
        if stream:
            for ev in c.responses.create(model="m", max_output_tokens=500, input="hello there", stream=True,
                                         extra_headers=hdrs):
                if ev.type == "response.output_text.delta":
                    text += ev.delta
        else:
            r = c.responses.create(model="m", max_output_tokens=500, input="hello there", extra_headers=hdrs)
            text = r.output_text
            assert r.usage is None, r.usage  # (none that reads: null, not zeros)
    assert text == TEXT


# (usage sent, the upstream's part kept: prompt, completion; flagged as invalid usage)
CASES = {
    "empty": ({}, None, None, False),
    "all-null": ({"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}, None, None, False),
    "completion-null": ({"prompt_tokens": 11, "completion_tokens": None, "total_tokens": None}, 11, None, True),
    "completion-absent": ({"prompt_tokens": 11, "total_tokens": 11}, 11, None, True),
    "prompt-null": ({"prompt_tokens": None, "completion_tokens": 7, "total_tokens": None}, None, 7, True),
    "total-only": ({"total_tokens": 16}, None, None, True),
}


# DEFECT: {} was charged 0/0 ($0), a null completion 0, a chat answer's lone total_tokens all prompt; none was
# flagged. Now: no count at all is the no-usage estimate (as no usage member); a part left out is estimated, the
# part said kept, and the usage flagged invalid (log usage_invalid, weir_upstream_invalid_usage_total).
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ["chat", "messages", "responses"])
def test_a_usage_that_leaves_a_count_out_is_not_a_count_of_0(weir, route, stream):
    scenario = {}

    def answer(path, body):
        usage = scenario["usage"]
        if stream:
            return SSE_HEAD, chat_stream(usage), False
        b = chat_answer(usage)
        return json_head(len(b)), [b], False

    up = Upstream(answer)
    try:
        w = weir(config=config(up.url), workers=1)
        scenario["usage"] = "absent"
        call(w, route, stream, f"{route}-{stream}-absent")
        control = w.log_for(f"{route}-{stream}-absent", timeout=15)
        est = control["charged_tokens"]
        assert est["completion"] >= TEXT_TOKENS and est["prompt"] > 0, control
        invalid_before = w.metric("weir_upstream_invalid_usage_total", model="m")
        flagged = 0
        for name, (usage, prompt, completion, invalid) in CASES.items():
            scenario["usage"] = usage
            rid = f"{route}-{stream}-{name}"
            call(w, route, stream, rid)
            line = w.log_for(rid, timeout=15)
            assert line["status"] == 200, line
            # The upstream's counts are none that can be billed: null in the log, the charge apart.
            assert line["prompt_tokens"] is None and line["completion_tokens"] is None, line
            charged = line["charged_tokens"]
            assert charged["source"] == "estimate", line
            want_prompt = prompt if prompt is not None else est["prompt"]
            want_completion = completion if completion is not None else est["completion"]
            # (Was 0/0 for {} and all-null, 11/0, 0/7 and 16/0.)
            assert (charged["prompt"], charged["completion"]) == (want_prompt, want_completion), (name, line)
            assert line["spend_usd"] == pytest.approx(spend(want_prompt, want_completion)), (name, line)
            assert line.get("usage_invalid", False) is invalid, (name, line)
            flagged += invalid
        assert w.metric("weir_upstream_invalid_usage_total", model="m") == invalid_before + flagged
    finally:
        up.close()


# The rerank rule (total_tokens alone is all prompt) stays a pooling route's; an embeddings usage has no completion.
def test_pooling_routes_keep_their_usage(weir):
    def answer(path, body):
        if path.endswith("/rerank"):
            b = json.dumps({"id": "rerank-58", "model": "m", "results": [], "usage": {"total_tokens": 16}}).encode()
        else:
            b = json.dumps({"object": "list", "model": "m", "data": [{"object": "embedding", "index": 0,
                                                                     "embedding": [0.5]}],
                            "usage": {"prompt_tokens": 9, "total_tokens": 9}}).encode()
        return json_head(len(b)), [b], False

    up = Upstream(answer)
    try:
        w = weir(config=config(up.url), workers=1)
        hdrs = {"authorization": f"Bearer {KEY}"}
        r = httpx.post(w.v1 + "/rerank", json={"model": "m", "query": "q", "documents": ["a", "b"]},
                       headers=hdrs | {"x-request-id": "rerank"}, timeout=30)
        assert r.status_code == 200, r.text
        line = w.log_for("rerank", timeout=15)
        assert (line["prompt_tokens"], line["completion_tokens"]) == (16, 0), line
        assert "usage_invalid" not in line, line
        r = httpx.post(w.v1 + "/embeddings", json={"model": "m", "input": "hello"},
                       headers=hdrs | {"x-request-id": "embed"}, timeout=30)
        assert r.status_code == 200, r.text
        line = w.log_for("embed", timeout=15)
        assert (line["prompt_tokens"], line["completion_tokens"]) == (9, 0), line
        assert "usage_invalid" not in line, line
    finally:
        up.close()


START_USAGE = {"input_tokens": 8, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 4,
               "cache_creation": {"ephemeral_5m_input_tokens": 3, "ephemeral_1h_input_tokens": 1},
               "output_tokens": 1}
PROMPT = 8 + 3 + 4  # OpenAI's count of it: input, cache reads and cache writes


def anthropic_stream(delta_usage, cut: bool = False) -> list[bytes]:
    """message_start (START_USAGE), the text in ten text_deltas, then (unless `cut`) message_delta with
    `delta_usage` (no usage member when "absent") and message_stop."""
    msg = {"id": "msg_58", "type": "message", "role": "assistant", "model": "c", "content": [],
           "stop_reason": None, "stop_sequence": None, "usage": START_USAGE}
    parts = ([anthropic_event("message_start", {"message": msg}),
              anthropic_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})] +
             [anthropic_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": PIECE}})
              for _ in range(PIECES)] +
             [anthropic_event("content_block_stop", {"index": 0})])
    if cut:
        return parts
    delta = {"delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    if delta_usage != "absent":
        delta["usage"] = delta_usage
    return parts + [anthropic_event("message_delta", delta), anthropic_event("message_stop", {})]


def anthropic_message(usage) -> bytes:
    return json.dumps({"id": "msg_58", "type": "message", "role": "assistant", "model": "c",
                       "content": [{"type": "text", "text": TEXT}], "stop_reason": "end_turn",
                       "stop_sequence": None, "usage": usage}).encode()


# DEFECT: an Anthropic pool's message_delta with output_tokens null was charged message_start's placeholder (1) as
# the output; a whole message's {"input_tokens": 8, "output_tokens": null} 0. Now the output is the relayed text's
# estimate, message_start's prompt (with its cache reads and writes) kept; the usage flagged invalid. A
# message_delta without usage is usage not reported (not flagged), charged the same way.
@pytest.mark.parametrize("route", ["chat", "messages", "responses"])
def test_an_anthropic_output_left_out_is_estimated(weir, route):
    scenario = {}

    def answer(path, body):
        if body.get("stream"):
            return SSE_HEAD, anthropic_stream(scenario["delta"]), False
        b = anthropic_message(scenario["message"])
        return json_head(len(b)), [b], False

    up = Upstream(answer)
    try:
        w = weir(config=config(up.url, anthropic_pool=True), workers=1)
        before = w.metric("weir_upstream_invalid_usage_total", model="m")
        flagged = 0
        for name, delta, invalid in (("null", {"output_tokens": None}, True), ("absent", "absent", False),
                                     ("no-output", {"input_tokens": None}, True)):
            scenario["delta"] = delta
            rid = f"anth-{route}-stream-{name}"
            if route == "messages" and delta == "absent":
                # (Passed through as it came: the Anthropic SDK cannot read a message_delta without usage.)
                r = httpx.post(w.base_url + "/v1/messages", timeout=30,
                               headers={"x-request-id": rid, "x-api-key": KEY, "anthropic-version": "2023-06-01"},
                               json={"model": "m", "max_tokens": 500, "stream": True,
                                     "messages": [{"role": "user", "content": "hello there"}]})
                assert r.status_code == 200 and "message_stop" in r.text, r.text
            else:
                call(w, route, True, rid)
            line = w.log_for(rid, timeout=15)
            charged = line["charged_tokens"]
            # (Was completion 1: message_start's placeholder, and no charged_tokens.)
            assert (charged["prompt"], charged["completion"], charged["cached"]) == (PROMPT, TEXT_TOKENS, 3), line
            assert line["spend_usd"] == pytest.approx(spend(PROMPT, TEXT_TOKENS, 3, 4, 1)), line
            assert line.get("usage_invalid", False) is invalid, line
            flagged += invalid
        for name, usage in (("null", {"input_tokens": 8, "output_tokens": None}), ("absent", {"input_tokens": 8})):
            scenario["message"] = usage
            rid = f"anth-{route}-whole-{name}"
            call(w, route, False, rid)
            line = w.log_for(rid, timeout=15)
            charged = line["charged_tokens"]
            # (Was completion 0.)
            assert (charged["prompt"], charged["completion"]) == (8, TEXT_TOKENS), line
            assert line["usage_invalid"] is True, line
            flagged += 1
        assert w.metric("weir_upstream_invalid_usage_total", model="m") == before + flagged
    finally:
        up.close()


# DEFECT: an Anthropic pool's stream cut before message_delta was charged message_start's prompt count and cache
# reads but its cache writes at the input price (spend 2.35e-05 where its counts give 2.525e-05). Now its cache
# writes (and their 1-hour part) are priced as cache writes, as in a whole stream's usage.
@pytest.mark.parametrize("route", ["chat", "messages"])
def test_a_stream_cut_before_message_delta_keeps_its_cache_writes(weir, route):
    def answer(path, body):
        return SSE_HEAD, anthropic_stream(None, cut=True), False

    up = Upstream(answer)
    try:
        w = weir(config=config(up.url, anthropic_pool=True), workers=1)
        rid = f"cut-{route}"
        hdrs = {"x-request-id": rid}
        msgs = [{"role": "user", "content": "hello there"}]
        if route == "chat":
            c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
            with pytest.raises(openai.APIError):
                for _ in c.chat.completions.create(model="m", max_tokens=500, messages=msgs, stream=True,
                                                   extra_headers=hdrs):
                    pass
        else:
            c = anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)
            try:
                with c.messages.stream(model="m", max_tokens=500, messages=msgs, extra_headers=hdrs) as s:
                    for _ in s.text_stream:
                        pass
            except anthropic.APIError:
                pass
        line = w.log_for(rid, timeout=15)
        charged = line["charged_tokens"]
        assert charged["prompt"] == PROMPT and charged["cached"] == 3, line
        assert charged["completion"] >= TEXT_TOKENS, line
        # (Was spend(PROMPT, completion, 3): the 4 written tokens at the input price.)
        assert line["spend_usd"] == pytest.approx(spend(PROMPT, charged["completion"], 3, 4, 1)), line
        assert charged.get("cache_write") == 4, line
    finally:
        up.close()
