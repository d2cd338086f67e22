"""Translations to and from Anthropic, and provider headers (helper xlate55).

- Chat and Responses requests to a `type: anthropic` pool are requests Anthropic accepts: tool ids outside
  ^[a-zA-Z0-9_-]+$ (Kimi-K2's `functions.f:0`, a Responses `call:1.x`) are mapped alike in the call and its
  result; whitespace-only stop strings are left out; the thinking Weir makes of reasoning_effort leaves out
  temperature/top_k, and is left out itself when tool_choice forces a call.
- The tool ids Weir makes (`toolu_…`, `call_…`) from a client's x-request-id match Anthropic's pattern.
- /v1/messages to an OpenAI-compatible pool maps Anthropic structured outputs (output_config.format, the
  beta output_format) to response_format json_schema; what cannot be mapped is a 400.
- A provider's account headers (anthropic-ratelimit-*, anthropic-organization-id, x-ratelimit-*) never reach
  a tenant, and Weir's own request id is the answer's, not the provider's request-id.

The upstreams are small servers that apply the checks the Anthropic API documents (the attack helper's
repro harness, /tmp/sdk55/repro/) and record what they were sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import httpx
import openai
import pydantic
import pytest

KEY = "sk-xlate55-test"
ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


class Upstream:
    """`handler(path, headers, body) -> (status, dict (JSON) or bytes (an event stream), extra headers)`;
    `requests` records (path, headers, body)."""

    def __init__(self, handler):
        self.handler = handler
        self.requests: list[tuple[str, dict, dict]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.requests.append((self.path, headers, body))
                status, out, extra = outer.handler(self.path, headers, body)
                data = out if isinstance(out, bytes) else json.dumps(out).encode()
                self.send_response(status)
                self.send_header("content-type", "text/event-stream" if isinstance(out, bytes) else "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def last(self) -> dict:
        return self.requests[-1][2]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


PROVIDER_HEADERS = {
    "request-id": "req_provider",
    "anthropic-organization-id": "org-provider-123",
    "anthropic-ratelimit-tokens-remaining": "12345",
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-priority-input-tokens-limit": "9",
    "x-ratelimit-remaining-requests": "77",
}


def anthropic_refusal(body: dict) -> str | None:
    """The request checks the Anthropic API documents that a translation can trip."""
    for i, m in enumerate(body.get("messages", [])):
        for j, b in enumerate(m["content"] if isinstance(m["content"], list) else []):
            if b.get("type") == "tool_use" and not ID_RE.match(b["id"]):
                return f"messages.{i}.content.{j}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
            if b.get("type") == "tool_result" and not ID_RE.match(b["tool_use_id"]):
                return (f"messages.{i}.content.{j}.tool_result.tool_use_id: String should match pattern "
                        "'^[a-zA-Z0-9_-]+$'")
    for s in body.get("stop_sequences") or []:
        if not s.strip():
            return "stop_sequences: each stop sequence must contain non-whitespace"
    if (body.get("thinking") or {}).get("type") == "enabled":
        if "temperature" in body and body["temperature"] != 1:
            return "`temperature` may only be set to 1 when thinking is enabled."
        if "top_k" in body:
            return "`top_k` must be unset when thinking is enabled."
        if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
            return "Thinking may not be enabled when tool_choice forces tool use."
    return None


def anthropic_handler(path, headers, body):
    err = anthropic_refusal(body or {})
    if err:
        return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": err}}, PROVIDER_HEADERS
    message = {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-x",
               "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": 3, "output_tokens": 1}}
    if not body.get("stream"):
        return 200, message, PROVIDER_HEADERS
    events = [("message_start", {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}}),
              ("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}),
              ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": "ok"}}),
              ("content_block_stop", {"type": "content_block_stop", "index": 0}),
              ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                 "usage": {"output_tokens": 1}}),
              ("message_stop", {"type": "message_stop"})]
    return 200, b"".join(f"event: {k}\ndata: {json.dumps(v)}\n\n".encode() for k, v in events), PROVIDER_HEADERS


def vllm_handler(path, headers, body):
    """An OpenAI-compatible server: a tool call without an id when the request has tools; JSON only when a
    json_schema response_format asks for it (guided decoding)."""
    rid = headers.get("x-request-id", "x")
    if body.get("tools"):
        message = {"role": "assistant", "content": None,
                   "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
        finish = "tool_calls"
    else:
        rf = body.get("response_format") or {}
        text = '{"name": "Ann", "age": 31}' if rf.get("type") == "json_schema" else "Sure! Ann is 31 years old."
        message, finish = {"role": "assistant", "content": text}, "stop"
    usage = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    if not body.get("stream"):
        return 200, {"id": "chatcmpl-" + rid, "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                     "usage": usage}, PROVIDER_HEADERS
    delta = dict(message)
    if delta.get("tool_calls"):
        delta["tool_calls"] = [{"index": 0, **delta["tool_calls"][0]}]
    chunks = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
              {"choices": [], "usage": usage}]
    return 200, b"".join(
        b"data: " + json.dumps({"id": "chatcmpl-" + rid, "object": "chat.completion.chunk", "created": 1,
                                "model": "m", **c}).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n", \
        PROVIDER_HEADERS


def auth(tenants: dict) -> dict:
    return {"tenants": tenants,
            "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]}}


@pytest.fixture(scope="module")
def claude():
    up = Upstream(anthropic_handler)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def vllm():
    up = Upstream(vllm_handler)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def gw(module_weir, claude, vllm):
    """A tenant without limits of its own: the case where the provider's x-ratelimit-* used to pass."""
    return module_weir(config={
        "pools": {"claude": {"type": "anthropic", "endpoints": [claude.base_url], "api_key": "k"},
                  "vllm": {"endpoints": [vllm.base_url]}},
        "models": {"claude": {"pool": "claude"}, "m": {"pool": "vllm"}},
        **auth({"t": {}}),
    })


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


def test_tool_ids_anthropic_refuses_are_mapped_alike_in_call_and_result(gw, claude):
    c = openai.OpenAI(base_url=gw.v1, api_key=KEY, max_retries=0)
    # Kimi-K2 on vLLM: functions.NAME:INDEX; two calls whose ids differ only in the replaced bytes.
    hist = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "functions_f_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "functions.f:0", "content": "r0"},
            {"role": "tool", "tool_call_id": "functions_f_0", "content": "r1"}]
    r = c.chat.completions.create(model="claude", messages=hist, tools=TOOLS)
    assert r.choices[0].message.content == "ok"
    sent = claude.last()["messages"]
    calls = [b["id"] for b in sent[1]["content"]]
    results = [b["tool_use_id"] for b in sent[2]["content"]]
    assert calls == results and len(set(calls)) == 2, sent
    assert calls[1] == "functions_f_0"  # a valid id goes as it is
    # Responses: a call_id with '.' and ':'.
    r = c.responses.create(model="claude", tools=[{"type": "function", "name": "f",
                                                   "parameters": {"type": "object", "properties": {}}}],
                           input=[{"role": "user", "content": "q"},
                                  {"type": "function_call", "call_id": "call:1.x", "name": "f", "arguments": "{}"},
                                  {"type": "function_call_output", "call_id": "call:1.x", "output": "r"}])
    assert r.output_text == "ok"
    sent = claude.last()["messages"]
    assert sent[1]["content"][0]["id"] == sent[2]["content"][0]["tool_use_id"]
    assert ID_RE.match(sent[1]["content"][0]["id"])


def test_stop_and_thinking_conflicts_become_requests_anthropic_accepts(gw, claude):
    c = openai.OpenAI(base_url=gw.v1, api_key=KEY, max_retries=0)
    q = [{"role": "user", "content": "q"}]
    c.chat.completions.create(model="claude", messages=q, stop=["\n", "END"])
    assert claude.last()["stop_sequences"] == ["END"]
    c.chat.completions.create(model="claude", messages=q, stop=["\n"])
    assert "stop_sequences" not in claude.last()
    # reasoning_effort with sampling fields: the thinking asked for, the sampling fields left out.
    c.chat.completions.create(model="claude", messages=q, reasoning_effort="low", temperature=0.2,
                              extra_body={"top_k": 5})
    sent = claude.last()
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert "temperature" not in sent and "top_k" not in sent
    # A forced tool call: no thinking (the client asked for the call outright).
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        c.chat.completions.create(model="claude", messages=q, reasoning_effort="low", tools=TOOLS,
                                  tool_choice=choice)
        sent = claude.last()
        assert "thinking" not in sent and sent["tool_choice"]["type"] in ("any", "tool"), sent


def test_tool_ids_weir_makes_of_a_client_request_id_match_anthropics_pattern(gw, vllm):
    a = anthropic.Anthropic(base_url=gw.base_url, api_key=KEY, max_retries=0,
                            default_headers={"x-request-id": "trace.42:7"})
    m = a.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "q"}],
                          tools=[{"name": "f", "input_schema": {"type": "object", "properties": {}}}])
    ids = [b.id for b in m.content if b.type == "tool_use"]
    assert len(ids) == 1 and ID_RE.match(ids[0]), ids
    # Streamed too.
    with a.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "q"}],
                           tools=[{"name": "f", "input_schema": {"type": "object", "properties": {}}}]) as s:
        final = s.get_final_message()
    ids = [b.id for b in final.content if b.type == "tool_use"]
    assert len(ids) == 1 and ID_RE.match(ids[0]), ids
    # Responses' call_id.
    c = openai.OpenAI(base_url=gw.v1, api_key=KEY, max_retries=0, default_headers={"x-request-id": "trace.42:7"})
    r = c.responses.create(model="m", input="q", tools=[{"type": "function", "name": "f",
                                                         "parameters": {"type": "object", "properties": {}}}])
    calls = [o.call_id for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and ID_RE.match(calls[0]), calls


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_anthropic_structured_outputs_reach_an_openai_compatible_pool(gw, vllm):
    a = anthropic.Anthropic(base_url=gw.base_url, api_key=KEY, max_retries=0)
    msgs = [{"role": "user", "content": "Ann is 31"}]
    parsed = a.messages.parse(model="m", max_tokens=100, messages=msgs, output_format=Person).parsed_output
    assert parsed == Person(name="Ann", age=31)
    rf = vllm.last()["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"]["properties"].keys() == {"name", "age"}
    a.messages.create(model="m", max_tokens=100, messages=msgs,
                      output_config={"format": {"type": "json_schema", "schema": Person.model_json_schema()}})
    assert vllm.last()["response_format"]["json_schema"]["schema"] == Person.model_json_schema()
    # The beta's top-level output_format.
    r = httpx.post(gw.base_url + "/v1/messages", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "m", "max_tokens": 100, "messages": msgs,
                         "output_format": {"type": "json_schema", "schema": Person.model_json_schema()}})
    assert r.status_code == 200 and json.loads(r.json()["content"][0]["text"]) == {"name": "Ann", "age": 31}
    # What cannot be mapped: Anthropic's 400, never a silently unconstrained answer.
    n = len(vllm.requests)
    with pytest.raises(anthropic.BadRequestError) as e:
        a.messages.create(model="m", max_tokens=100, messages=msgs,
                          output_config={"format": {"type": "json_object"}})
    assert "output_config.format.type" in e.value.message
    assert len(vllm.requests) == n


def provider_fields(r: httpx.Response) -> dict:
    return {k: v for k, v in r.headers.items() if k in PROVIDER_HEADERS and k != "request-id"}


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "claude", "max_tokens": 5, "stream": True,
                      "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/chat/completions", {"model": "claude", "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
])
def test_provider_account_headers_never_reach_a_tenant(gw, path, body):
    r = httpx.post(gw.base_url + path, json=body, headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                                                           "x-request-id": "mine-55"})
    assert r.status_code == 200, r.text
    assert provider_fields(r) == {}, r.headers
    assert r.headers["x-request-id"] == "mine-55"
    if path == "/v1/messages":
        assert r.headers.get_list("request-id") == ["mine-55"]  # Weir's own, once; never the provider's
    else:
        assert "request-id" not in r.headers


def test_provider_errors_carry_weirs_request_id_not_the_providers(gw):
    r = httpx.post(gw.base_url + "/v1/messages", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "claude", "max_tokens": 5, "stop_sequences": [" "],
                         "messages": [{"role": "user", "content": "x"}]})  # (as it came: Anthropic's 400)
    assert r.status_code == 400
    assert r.headers.get_list("request-id") == [r.headers["x-request-id"]]
    assert provider_fields(r) == {}


def test_without_tenants_the_providers_limits_pass_but_not_its_request_id(weir, claude):
    w = weir(config={"pools": {"claude": {"type": "anthropic", "endpoints": [claude.base_url], "api_key": "k"}},
                     "models": {"claude": {"pool": "claude"}}})
    r = httpx.post(w.base_url + "/v1/messages", headers={"anthropic-version": "2023-06-01"},
                   json={"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    assert provider_fields(r) == {k: v for k, v in PROVIDER_HEADERS.items() if k != "request-id"}
    assert r.headers.get_list("request-id") == [r.headers["x-request-id"]]
