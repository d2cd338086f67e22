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


# -- pools: hosted (continuous_usage off, as for an https:// endpoint) and self-hosted ---------------------------

LOGPROBS = {"content": [{"token": "ok", "logprob": -0.01, "bytes": [111, 107],
                         "top_logprobs": [{"token": "ok", "logprob": -0.01, "bytes": [111, 107]},
                                          {"token": "no", "logprob": -4.6, "bytes": [110, 111]}]}]}


class Pool:
    """An upstream that records each chat body and answers "ok" (with LOGPROBS), or `status` when set."""

    def __init__(self, status: int | None = None):
        self.bodies: list[dict] = []
        self.status = status
        self.up = RawUpstream(self.answer)

    def answer(self, headers, body) -> bytes:
        doc = json.loads(body)
        self.bodies.append(doc)
        if self.status:
            return _json({"error": {"message": "overloaded", "type": "server_error"}}, self.status)
        if doc.get("stream"):
            return _sse([_chunk({"role": "assistant", "content": ""}),
                         _chunk({"content": "ok"}, logprobs=LOGPROBS), _chunk({}, "stop")])
        return _json({"id": "chatcmpl-58", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "finish_reason": "stop", "logprobs": LOGPROBS,
                                   "message": {"role": "assistant", "content": "ok"}}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})


@pytest.fixture(scope="module")
def pools_gw(module_weir):
    p = {"hosted": Pool(), "self": Pool(), "hosted_down": Pool(503), "self_down": Pool(503)}
    try:
        cfg = {"pools": {name: {"endpoints": [pool.up.url], **({"continuous_usage": False}
                                                                 if name.startswith("hosted") else {})}
                         for name, pool in p.items()},
               "models": {"h": {"pool": "hosted"}, "s": {"pool": "self"},
                          "h-then-s": {"pool": "hosted_down", "fallbacks": [{"pool": "self"}]},
                          "s-then-h": {"pool": "self_down", "fallbacks": [{"pool": "hosted"}]}}}
        yield module_weir(config=cfg, workers=1), p
    finally:
        for pool in p.values():
            pool.up.close()


def _client(w) -> openai.OpenAI:
    return openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0)


def test_a_hosted_pool_gets_max_completion_tokens_and_any_effort(pools_gw):
    w, p = pools_gw
    c = _client(w)
    r = c.responses.create(model="h", input="hi", max_output_tokens=50, reasoning={"effort": "minimal"})
    assert r.output_text == "ok" and r.max_output_tokens == 50
    sent = p["hosted"].bodies[-1]
    assert sent["max_completion_tokens"] == 50 and "max_tokens" not in sent
    assert sent["reasoning_effort"] == "minimal"
    # Self-hosted (vLLM): max_tokens, and vLLM's three efforts only.
    c.responses.create(model="s", input="hi", max_output_tokens=50, reasoning={"effort": "high"})
    sent = p["self"].bodies[-1]
    assert sent["max_tokens"] == 50 and "max_completion_tokens" not in sent
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="s", input="hi", reasoning={"effort": "minimal"})
    assert e.value.body["param"] == "reasoning"


@pytest.mark.parametrize("stream", [False, True])
def test_a_fallback_across_the_hosted_line_gets_its_own_names(pools_gw, stream):
    w, p = pools_gw
    c = _client(w)
    extra = {"top_k": 20, "service_tier": "flex"}
    for model, first, then in [("h-then-s", "hosted_down", "self"), ("s-then-h", "self_down", "hosted")]:
        n = len(p[then].bodies)
        r = c.responses.create(model=model, input="hi", max_output_tokens=40, stream=stream, extra_body=extra)
        if stream:
            assert list(r)[-1].type == "response.completed"
        else:
            assert r.output_text == "ok"
        assert len(p[then].bodies) == n + 1
        tried, took = p[first].bodies[-1], p[then].bodies[-1]
        hosted, selfh = (tried, took) if first.startswith("hosted") else (took, tried)
        assert hosted["max_completion_tokens"] == 40 and "max_tokens" not in hosted and "top_k" not in hosted
        assert hosted["service_tier"] == "flex"
        assert selfh["max_tokens"] == 40 and "max_completion_tokens" not in selfh and selfh["top_k"] == 20
        assert "service_tier" not in selfh


def test_a_fallback_that_cannot_take_the_effort_is_skipped(pools_gw):
    w, p = pools_gw
    n = len(p["self"].bodies)
    with pytest.raises(openai.APIStatusError) as e:
        _client(w).responses.create(model="h-then-s", input="hi", reasoning={"effort": "minimal"})
    assert e.value.status_code == 503
    assert p["hosted_down"].bodies[-1]["reasoning_effort"] == "minimal"
    assert len(p["self"].bodies) == n


VLLM_EXTRA = {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "cache_salt": "tenant-salt-0123456789abcdef",
              "priority": 5, "skip_special_tokens": False, "chat_template_kwargs": {"enable_thinking": False}}
CHAT_EXTRA = {"logit_bias": {"50256": -100}, "seed": 7, "stop": ["\n\n"]}


@pytest.mark.parametrize("stream", [False, True])
def test_members_vllm_honours_reach_it_and_logprobs_come_back(pools_gw, stream):
    w, p = pools_gw
    c = _client(w)
    kw = dict(model="s", input="hi", top_logprobs=2, include=["message.output_text.logprobs"],
              extra_body={**VLLM_EXTRA, **CHAT_EXTRA})
    if stream:
        events = list(c.responses.create(stream=True, **kw))
        deltas = [e.logprobs for e in events if e.type == "response.output_text.delta"]
        assert [[lp.token for lp in d] for d in deltas] == [["ok"]]
        r = events[-1].response
    else:
        r = c.responses.create(**kw)
    sent = p["self"].bodies[-1]
    for k, v in {**VLLM_EXTRA, **CHAT_EXTRA}.items():
        assert sent[k] == v, k
    assert sent["logprobs"] is True and sent["top_logprobs"] == 2
    lp = r.output[0].content[0].logprobs
    assert [(x.token, x.logprob, [t.token for t in x.top_logprobs]) for x in lp] == [("ok", -0.01, ["ok", "no"])]
    assert r.top_logprobs == 2


def test_a_hosted_pool_gets_the_standard_members_only(pools_gw):
    w, p = pools_gw
    _client(w).responses.create(model="h", input="hi", extra_body={**VLLM_EXTRA, **CHAT_EXTRA,
                                                                    "safety_identifier": "u-1"})
    sent = p["hosted"].bodies[-1]
    assert all(k not in sent for k in VLLM_EXTRA)
    assert all(sent[k] == v for k, v in CHAT_EXTRA.items())
    assert sent["safety_identifier"] == "u-1"


def test_a_bad_top_logprobs_is_a_400(pools_gw):
    w, _ = pools_gw
    r = httpx.post(w.v1 + "/responses", json={"model": "s", "input": "hi", "top_logprobs": 21}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


# -- structured outputs to a type: anthropic pool -----------------------------------------------------------------

def test_structured_outputs_reach_an_anthropic_pool_as_output_config(module_weir):
    from scripted_upstream import ScriptedUpstream
    up = ScriptedUpstream().start()
    try:
        w = module_weir(config={"pools": {"claude": {"type": "anthropic", "endpoints": [up.base_url]}},
                                "models": {"claude-x": {"pool": "claude", "upstream_model": "claude-sonnet-4-5"}}},
                        workers=1)
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"], "additionalProperties": False}
        c = _client(w)
        r = c.responses.create(model="claude-x", input="John is 42",
                               text={"format": {"type": "json_schema", "name": "Person", "schema": schema,
                                                "strict": True}})
        assert r.status == "completed"
        sent = up.requests[-1].json()
        assert sent["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
        c.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "John is 42"}],
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "Person", "schema": schema}})
        assert up.requests[-1].json()["output_config"]["format"]["schema"] == schema
        # json_object: Anthropic has no JSON mode without a schema.
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "x"}],
                                      response_format={"type": "json_object"})
    finally:
        up.stop()
