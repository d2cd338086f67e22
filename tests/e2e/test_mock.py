"""weir-mock against the official openai SDK and raw sockets.

Checks the wire format vLLM v0.10.1 uses, determinism, timing, fault
injection, cancellation and a moderate concurrency. Run:

    WEIR_BUILD_DIR=build-mock/bin .venv/bin/python -m pytest tests/e2e/test_mock.py -q
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import math
import socket
import struct
import time

import httpx
import openai
import pytest

import subprocess

from conftest import binary, metric_value, parse_prometheus, wait_until

FAST = {"x-mock-ttft-ms": "5", "x-mock-itl-ms": "1"}  # per-request timing for quick tests


@pytest.fixture(scope="module")
def m(module_mock):
    """One default weir-mock (max_tokens 16) shared by the read-only tests of this module."""
    return module_mock("--max-tokens", "16")


def client(mock, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=mock.v1, api_key="test", max_retries=0, timeout=30, **kw)


def chat(mock, content="hello world", stream=False, headers=FAST, **kw):
    return client(mock).chat.completions.create(
        model="mock-model", messages=[{"role": "user", "content": content}], stream=stream,
        extra_headers=headers, **kw)


def sse_events(body: str) -> list[str]:
    """The data of every SSE event of a complete body (asserts vLLM's framing)."""
    assert body.endswith("data: [DONE]\n\n"), body[-200:]
    events = body.split("\n\n")
    assert events[-1] == ""
    out = []
    for ev in events[:-1]:
        assert ev.startswith("data: ") and "\n" not in ev, ev
        out.append(ev[len("data: "):])
    return out


def raw_http(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Sends raw bytes, returns everything read until the server closes or `timeout`."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        try:
            while data := s.recv(65536):
                chunks.append(data)
        except (socket.timeout, ConnectionResetError):
            pass
        return b"".join(chunks)


def post_request(path: str, body: dict | bytes, headers: dict[str, str] | None = None,
                 connection: str = "close") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    head += f"connection: {connection}\r\n\r\n"
    return head.encode() + data


# ---------------------------------------------------------------------------
# Simple endpoints


def test_models_list_has_vllm_shape(mock):
    mk = mock("--model", "alpha", "--model", "beta", "--max-model-len", "4096")
    models = client(mk).models.list()
    assert [x.id for x in models.data] == ["alpha", "beta"]
    raw = httpx.get(mk.v1 + "/models").json()
    assert raw["object"] == "list"
    card = raw["data"][0]
    assert set(card) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
    assert (card["object"], card["owned_by"], card["root"], card["parent"], card["max_model_len"]) == (
        "model", "vllm", "alpha", None, 4096)
    assert card["permission"][0]["object"] == "model_permission"


def test_health_version_404_405(m):
    r = httpx.get(m.base_url + "/health")
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "0"
    assert httpx.get(m.base_url + "/version").json() == {"version": "0.10.1"}
    r = httpx.get(m.base_url + "/no/such/path")
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "Not Found", "type": "Not Found", "param": None, "code": 404}}
    r = httpx.get(m.v1 + "/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == 405
    r = httpx.post(m.base_url + "/health")
    assert r.status_code == 405


# ---------------------------------------------------------------------------
# Chat completions


def test_chat_non_streaming(m):
    r = chat(m, "one two three", max_tokens=5)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "mock-model"
    (c,) = r.choices
    assert c.index == 0 and c.message.role == "assistant" and c.finish_reason == "length"
    words = c.message.content.split(" ")
    assert words[0] == "" and len(words) == 6  # each token is " word"
    # prompt tokens: 4 per message + words
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (7, 5, 12)

    raw = httpx.post(m.v1 + "/chat/completions", headers=FAST,
                     json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}).json()
    assert list(raw) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                         "usage", "prompt_logprobs", "kv_transfer_params"]
    assert list(raw["choices"][0]) == ["index", "message", "logprobs", "finish_reason", "stop_reason"]
    assert list(raw["choices"][0]["message"]) == ["role", "content", "refusal", "annotations", "audio",
                                                  "function_call", "tool_calls", "reasoning_content"]
    assert raw["usage"] == {"prompt_tokens": 5, "total_tokens": 7, "completion_tokens": 2,
                            "prompt_tokens_details": None}


def test_chat_streaming_matches_non_streaming(m):
    full = chat(m, "stream me", max_tokens=6).choices[0].message.content
    chunks = list(chat(m, "stream me", stream=True, max_tokens=6, stream_options={"include_usage": True}))
    first = chunks[0]
    assert first.object == "chat.completion.chunk" and first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == "" and first.usage is None
    content = [c for c in chunks[1:] if c.choices]
    assert len(content) == 6
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert content[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content for c in content) == full
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 6 and usage.usage.prompt_tokens == 6
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_raw_framing(m):
    with httpx.stream("POST", m.v1 + "/chat/completions", headers={**FAST, "x-request-id": "req-42"},
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.headers["transfer-encoding"] == "chunked" and "content-length" not in r.headers
        body = r.read().decode()
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    # vLLM builds the id from X-Request-Id.
    assert {o["id"] for o in objs} == {"chatcmpl-req-42"}
    # exclude_unset: the role chunk and token chunks carry only the fields vLLM sets.
    assert objs[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None}]
    assert list(objs[1]) == ["id", "object", "created", "model", "choices"]
    assert set(objs[1]["choices"][0]) == {"index", "delta", "logprobs", "finish_reason"}
    assert objs[2]["choices"][0]["finish_reason"] == "length" and objs[2]["choices"][0]["stop_reason"] is None
    assert objs[3]["choices"] == [] and set(objs[3]["usage"]) == {"prompt_tokens", "total_tokens",
                                                                  "completion_tokens"}


def raw_chat_stream(m, headers: dict[str, str], **body) -> list[dict]:
    with httpx.stream("POST", m.v1 + "/chat/completions", headers={**FAST, **headers},
                      json={"messages": [{"role": "user", "content": "hi"}], "stream": True,
                            "stream_options": {"include_usage": True}, **body}) as r:
        assert r.status_code == 200
        events = sse_events(r.read().decode())
    return [json.loads(e) for e in events[:-1]]


def test_chat_reasoning_content(m):
    objs = raw_chat_stream(m, {"x-mock-reasoning": "2"}, max_tokens=4)
    deltas = [o["choices"][0]["delta"] for o in objs if o["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert [list(d) for d in deltas[1:]] == [["reasoning_content"]] * 2 + [["content"]] * 2
    full = chat(m, content="hi", max_tokens=4, headers={**FAST, "x-mock-reasoning": "2"}).choices[0].message
    assert full.reasoning_content == "".join(d["reasoning_content"] for d in deltas[1:3])
    assert full.content == "".join(d["content"] for d in deltas[3:])
    only = chat(m, max_tokens=2, headers={**FAST, "x-mock-reasoning": "5"}).choices[0].message
    assert only.content is None and only.reasoning_content


def test_chat_tool_calls_in_vllm_format(m):
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b")]
    objs = raw_chat_stream(m, {"x-mock-tool-calls": "2"}, max_tokens=1, tools=tools)
    calls = [o["choices"][0] for o in objs if o["choices"] and "tool_calls" in o["choices"][0]["delta"]]
    assert len(calls) == 6
    first = calls[0]["delta"]["tool_calls"][0]
    assert set(first) == {"id", "type", "index", "function"} and first["function"] == {"name": "a"}
    assert first["id"].startswith("chatcmpl-tool-") and len(first["id"]) == len("chatcmpl-tool-") + 32
    args = "".join(c["delta"]["tool_calls"][0]["function"].get("arguments", "") for c in calls[:3])
    assert set(json.loads(args)) == {"q"}
    assert calls[3]["delta"]["tool_calls"][0]["index"] == 1
    finish = [o["choices"][0] for o in objs if o["choices"] and o["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["finish_reason"] == "tool_calls" and finish[0]["delta"] == {}
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 1
    full = client(m).chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=1, tools=tools,
                                             extra_headers={**FAST, "x-mock-tool-calls": "2"})
    c = full.choices[0]
    assert c.finish_reason == "tool_calls"
    assert [t.function.name for t in c.message.tool_calls] == ["a", "b"]
    assert c.message.tool_calls[0].id == first["id"]
    assert json.loads(c.message.tool_calls[0].function.arguments) == json.loads(args)


def test_chat_stop_hit_reports_the_stop_string(m):
    objs = raw_chat_stream(m, {"x-mock-stop-hit": "1"}, max_tokens=3, stop=["###", "@@"])
    last = [o["choices"][0] for o in objs if o["choices"]][-1]
    assert last["finish_reason"] == "stop" and last["stop_reason"] == "###"
    # Without a stop string the header changes nothing.
    objs = raw_chat_stream(m, {"x-mock-stop-hit": "1"}, max_tokens=3)
    assert [o["choices"][0] for o in objs if o["choices"]][-1]["finish_reason"] == "length"


def test_tokenize(m):
    r = httpx.post(m.base_url + "/tokenize", json={"model": "mock-model",
                                                  "messages": [{"role": "user", "content": "hello world"}]})
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["count", "max_model_len", "tokens", "token_strs"]
    ref = chat(m, content="hello world", max_tokens=1)
    assert body["count"] == ref.usage.prompt_tokens == len(body["tokens"])
    assert httpx.post(m.base_url + "/tokenize", json={"prompt": "a b c"}).json()["count"] == 4
    assert httpx.post(m.base_url + "/tokenize", json={"model": "nope", "prompt": "a"}).status_code == 404
    assert httpx.get(m.base_url + "/tokenize").status_code == 405


def test_chat_without_limit_stops_naturally(m):
    r = chat(m, "no limit")
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 16
    r = chat(m, "limit above natural", max_tokens=100)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 16
    r = chat(m, "max_completion_tokens wins", max_tokens=10, max_completion_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_chat_n_choices(m):
    r = chat(m, "several", n=3, max_tokens=4)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) == 3
    assert r.usage.completion_tokens == 12
    chunks = list(chat(m, "several", stream=True, n=3, max_tokens=4, stream_options={"include_usage": True}))
    texts = {0: "", 1: "", 2: ""}
    roles = [c.choices[0].index for c in chunks[:3]]
    assert roles == [0, 1, 2] and all(c.choices[0].delta.role == "assistant" for c in chunks[:3])
    for c in chunks[3:]:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == {c.index: c.message.content for c in r.choices}
    assert chunks[-1].usage.completion_tokens == 12


def test_continuous_usage_stats(m):
    chunks = list(chat(m, "count along", stream=True, max_tokens=4,
                       stream_options={"include_usage": True, "continuous_usage_stats": True}))
    per_chunk = [c.usage.completion_tokens for c in chunks if c.choices]
    assert per_chunk == [0, 1, 2, 3, 4]
    assert all(c.usage.prompt_tokens == 6 for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 10


def test_stream_options_need_stream(m):
    with pytest.raises(openai.BadRequestError) as e:
        chat(m, stream=False, stream_options={"include_usage": True})
    assert "Stream options can only be defined when `stream=True`." in e.value.body["message"]


def test_determinism(m):
    a = chat(m, "same prompt here", max_tokens=8)
    b = chat(m, "same prompt here", max_tokens=8)
    c = chat(m, "another prompt here", max_tokens=8)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage == b.usage and a.id != b.id
    assert a.choices[0].message.content != c.choices[0].message.content
    # A shorter limit yields a prefix of the longer text.
    d = chat(m, "same prompt here", max_tokens=3)
    assert a.choices[0].message.content.startswith(d.choices[0].message.content)


# ---------------------------------------------------------------------------
# Completions and embeddings


def test_completions_prompt_list_stream_interleaves(m):
    prompts = ["one", "two words", "three more words"]
    chunks = list(client(m).completions.create(model="mock-model", prompt=prompts, n=2, max_tokens=3, stream=True,
                                               stream_options={"include_usage": True}, extra_headers=FAST))
    indices = [c.choices[0].index for c in chunks if c.choices]
    assert indices == list(range(6)) * 3  # every step: prompt_idx * n + i for all prompts
    finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(f.index for f in finals) == list(range(6)) and {f.finish_reason for f in finals} == {"length"}
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == (1 + 1) + (1 + 2) + (1 + 3)  # words + BOS per prompt
    assert usage.completion_tokens == 6 * 3 and usage.total_tokens == 9 + 18
    full = client(m).completions.create(model="mock-model", prompt=prompts, n=2, max_tokens=3, extra_headers=FAST)
    streamed = {i: "" for i in range(6)}
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] += ch.text
    assert {c.index: c.text for c in full.choices} == streamed
    assert full.object == "text_completion" and full.id.startswith("cmpl-")


def test_completions_token_prompts(m):
    r = client(m).completions.create(model="mock-model", prompt=[[1, 2, 3], [4, 5]], max_tokens=2, extra_headers=FAST)
    assert len(r.choices) == 2 and r.usage.prompt_tokens == 5
    r = client(m).completions.create(model="mock-model", prompt=[7, 8, 9, 10], max_tokens=2, extra_headers=FAST)
    assert len(r.choices) == 1 and r.usage.prompt_tokens == 4
    raw = httpx.post(m.v1 + "/completions", headers=FAST, json={"prompt": "x", "max_tokens": 1}).json()
    assert list(raw["choices"][0]) == ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs"]


def test_completions_raw_chunks_keep_nulls(m):
    r = httpx.post(m.v1 + "/completions", headers=FAST, json={"prompt": "x", "max_tokens": 1, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and len(events) == 2  # no usage chunk without stream_options
    obj = json.loads(events[0])
    assert obj["usage"] is None
    assert obj["choices"][0] == {"index": 0, "text": obj["choices"][0]["text"], "logprobs": None,
                                 "finish_reason": "length", "stop_reason": None}


def test_embeddings_float_and_base64(m):
    c = client(m)
    f = c.embeddings.create(model="mock-model", input=["alpha", "beta gamma"], encoding_format="float",
                            extra_headers=FAST)
    assert [d.index for d in f.data] == [0, 1] and all(len(d.embedding) == 16 for d in f.data)
    for d in f.data:
        assert math.isclose(sum(x * x for x in d.embedding), 1.0, rel_tol=1e-5)
    assert f.data[0].embedding != f.data[1].embedding
    assert f.usage.prompt_tokens == 2 + 3 and f.usage.total_tokens == 5
    # The SDK asks for base64 by default and decodes it: same vectors.
    b = c.embeddings.create(model="mock-model", input=["alpha", "beta gamma"], extra_headers=FAST)
    for x, y in zip(f.data, b.data):
        assert all(math.isclose(p, q, rel_tol=1e-6) for p, q in zip(x.embedding, y.embedding))
    raw = httpx.post(m.v1 + "/embeddings", headers=FAST,
                     json={"input": "alpha", "encoding_format": "base64", "dimensions": 8}).json()
    vec = struct.unpack("<8f", base64.b64decode(raw["data"][0]["embedding"]))
    assert math.isclose(sum(x * x for x in vec), 1.0, rel_tol=1e-5)
    assert raw["object"] == "list" and raw["id"].startswith("embd-")
    assert raw["usage"] == {"prompt_tokens": 2, "total_tokens": 2, "completion_tokens": 0,
                            "prompt_tokens_details": None}
    tok = c.embeddings.create(model="mock-model", input=[[1, 2, 3]], encoding_format="float", dimensions=4,
                              extra_headers=FAST)
    assert len(tok.data[0].embedding) == 4 and tok.usage.prompt_tokens == 3


# ---------------------------------------------------------------------------
# Errors


def test_unknown_model_is_404_and_any_model_echoes(mock):
    mk = mock("--model", "served-a", "--model", "served-b")
    with pytest.raises(openai.NotFoundError) as e:
        client(mk).chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    assert e.value.body == {"message": "The model `other` does not exist.", "type": "NotFoundError",
                            "param": None, "code": 404}
    # vLLM answers with its first served name.
    r = client(mk).chat.completions.create(model="served-b", messages=[{"role": "user", "content": "x"}],
                                           max_tokens=1, extra_headers=FAST)
    assert r.model == "served-a"
    anym = mock("--any-model")
    r = client(anym).chat.completions.create(model="whatever/you-like", messages=[{"role": "user", "content": "x"}],
                                             max_tokens=1, extra_headers=FAST)
    assert r.model == "whatever/you-like"


@pytest.mark.parametrize("path,body,needle", [
    ("/chat/completions", b"{not json", "json_invalid"),
    ("/chat/completions", b"[1,2]", "model_attributes_type"),
    ("/chat/completions", b'{"model":"mock-model"}', "'messages'"),
    ("/chat/completions", b'{"messages":"hi"}', "list_type"),
    ("/chat/completions", b'{"messages":[{"content":"x"}]}', "'role'"),
    ("/chat/completions", b'{"messages":[],"max_tokens":"many"}', "int_parsing"),
    ("/chat/completions", b'{"messages":[],"max_tokens":[3]}', "int_type"),
    ("/chat/completions", b'{"messages":[],"max_tokens":0}', "max_tokens must be at least 1"),
    ("/chat/completions", b'{"messages":[],"n":0}', "n must be at least 1"),
    ("/chat/completions", b'{"messages":[],"stream":"yes"}', "bool_type"),
    ("/completions", b'{"model":"mock-model"}', "At least one of `prompt`"),
    ("/completions", b'{"prompt":[1,"a"]}', "list_type"),
    ("/completions", b'{"prompt":[]}', "cannot be empty"),
    ("/embeddings", b'{"model":"mock-model"}', "'input'"),
    ("/embeddings", b'{"input":"x","encoding_format":"hex"}', "literal_error"),
])
def test_validation_errors_are_vllm_400(m, path, body, needle):
    r = httpx.post(m.v1 + path, content=body, headers={"content-type": "application/json", **FAST})
    assert r.status_code == 400, r.text
    err = r.json()
    assert set(err) == {"error"} and err["error"]["type"] == "BadRequestError" and err["error"]["code"] == 400
    assert needle in err["error"]["message"]


def test_injected_status_header(m):
    with pytest.raises(openai.APIStatusError) as e:
        chat(m, headers={**FAST, "x-mock-status": "503"})
    assert e.value.status_code == 503
    assert e.value.body["type"] == "ServiceUnavailableError" and e.value.body["code"] == 503
    with pytest.raises(openai.RateLimitError):
        chat(m, stream=True, headers={**FAST, "x-mock-status": "429"})
    r = httpx.post(m.v1 + "/chat/completions", headers={"x-mock-status": "abc"},
                   json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "x-mock-status" in r.json()["error"]["message"]


def test_error_rate_flag(mock):
    mk = mock("--error-rate", "1", "--error-status", "502")
    with pytest.raises(openai.APIStatusError) as e:
        chat(mk)
    assert e.value.status_code == 502 and e.value.body["type"] == "BadGatewayError"
    assert mk.metric("weir_mock_injected_errors_total") == 1
    assert httpx.get(mk.base_url + "/health").status_code == 200  # only generation endpoints fail


# ---------------------------------------------------------------------------
# Timing, stalls, resets


def token_arrivals(m, headers: dict[str, str], max_tokens: int) -> list[float]:
    """Seconds from sending a streamed chat request until each content token's bytes arrive, read on a raw
    socket: an SDK's first request costs CPU that a loaded machine turns into seconds (a token seen 8 s late
    with 2 cores at load 12), and would pass for the mock's own timing."""
    req = post_request("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello world"}],
                                                "max_tokens": max_tokens, "stream": True}, headers)
    stamps: list[float] = []
    data = b""
    with socket.create_connection(("127.0.0.1", m.process.port), timeout=30) as s:
        start = time.monotonic()
        s.sendall(req)
        while chunk := s.recv(65536):
            now = time.monotonic() - start
            data += chunk
            stamps += [now] * (data.count(b'"delta":{"content"') - len(stamps))
    assert b"data: [DONE]\n\n" in data, data[-200:]
    return stamps


# Tokens may arrive late on a busy machine, never early (the scheduler may
# send up to 0.2 ms ahead; 1 ms of slack here): each is checked against its
# due time (request sent -> ttft + k * itl), with only a generous upper bound.
def test_ttft_and_itl_timing(m):
    stamps = token_arrivals(m, {"x-mock-ttft-ms": "200", "x-mock-itl-ms": "20"}, max_tokens=6)
    assert len(stamps) == 6
    for k, t in enumerate(stamps):
        assert t >= 0.199 + 0.02 * k, (k, stamps)
    assert stamps[-1] < 3.0, stamps
    start = time.monotonic()
    chat(m, headers={"x-mock-ttft-ms": "100", "x-mock-itl-ms": "10"}, max_tokens=11)
    assert time.monotonic() - start >= 0.2  # non-streaming: whole answer at ttft + 10 * itl


def test_stall_header(m):
    # A stall long enough that a loaded machine's delays cannot pass for it: token 3 comes well before it,
    # tokens 4-6 never before it is over.
    headers = {"x-mock-ttft-ms": "5", "x-mock-itl-ms": "5", "x-mock-stall-after": "3", "x-mock-stall-ms": "4000"}
    stamps = token_arrivals(m, headers, max_tokens=6)
    assert len(stamps) == 6
    assert stamps[2] < 3.0, stamps  # token 3 is due at 15 ms, before the stall
    for k in range(3, 6):  # token k+1 is due at 5 + 5k + 4000 ms
        assert stamps[k] >= 4.004 + 0.005 * k, (k, stamps)


def read_until(sock: socket.socket, marker: bytes, limit: float = 5.0) -> bytes:
    data = b""
    deadline = time.monotonic() + limit
    while marker not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_reset_header_sends_rst(m):
    before = m.metric("weir_mock_injected_resets_total")
    req = post_request("/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10, "stream": True},
                       {**FAST, "x-mock-reset-after": "2"}, connection="keep-alive")
    data = b""
    with socket.create_connection(("127.0.0.1", m.process.port), timeout=5) as s:
        s.sendall(req)
        with pytest.raises(ConnectionResetError):
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    assert data.count(b'"delta":{"content"') == 2 and b"[DONE]" not in data
    assert m.metric("weir_mock_injected_resets_total") == before + 1
    # Through the SDK: an APIConnectionError mid-stream.
    with pytest.raises((openai.APIConnectionError, httpx.HTTPError)):
        list(chat(m, stream=True, max_tokens=10, headers={**FAST, "x-mock-reset-after": "1"}))


def test_reset_flag_non_streaming(mock):
    mk = mock("--reset-after", "0", "--ttft-ms", "5")
    with pytest.raises(openai.APIConnectionError):
        chat(mk, headers={})


# ---------------------------------------------------------------------------
# gzip, empty bodies, echo


def test_gzip_and_empty_body(m):
    body = {"messages": [{"role": "user", "content": "zip me"}], "max_tokens": 3}
    raw = raw_http(m.process.port, post_request("/v1/chat/completions", body, {**FAST, "x-mock-gzip": "1"}))
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert b"content-encoding: gzip" in head and payload[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(payload))["object"] == "chat.completion"
    # httpx decodes it transparently.
    r = httpx.post(m.v1 + "/chat/completions", json=body, headers={**FAST, "x-mock-gzip": "1"})
    assert r.headers["content-encoding"] == "gzip" and r.json()["usage"]["completion_tokens"] == 3
    # Error bodies too.
    r = httpx.post(m.v1 + "/chat/completions", json=body, headers={"x-mock-gzip": "1", "x-mock-status": "500"})
    assert r.status_code == 500 and r.headers["content-encoding"] == "gzip" and r.json()["error"]["code"] == 500
    # Empty body, and an empty body labelled gzip.
    raw = raw_http(m.process.port, post_request("/v1/chat/completions", body, {**FAST, "x-mock-empty-body": "1"}))
    assert raw.startswith(b"HTTP/1.1 200 OK") and b"content-length: 0\r\n" in raw and raw.endswith(b"\r\n\r\n")
    raw = raw_http(m.process.port, post_request("/v1/chat/completions", body,
                                                 {**FAST, "x-mock-empty-body": "1", "x-mock-gzip": "1"}))
    assert b"content-length: 0\r\n" in raw and b"content-encoding: gzip\r\n" in raw and raw.endswith(b"\r\n\r\n")


def test_echo_headers_prove_body_intact(m):
    body = json.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "caf\u00e9 \u2603"}],
                       "max_tokens": 1}, ensure_ascii=False).encode() + b"   "
    r = httpx.post(m.v1 + "/chat/completions", content=body,
                   headers={**FAST, "x-mock-echo": "1", "x-request-id": "rid-7", "X-Custom-Thing": "v",
                            "content-type": "application/json"})
    assert r.status_code == 200
    assert r.headers["x-mock-body-bytes"] == str(len(body))
    assert r.headers["x-mock-body-sha256"] == hashlib.sha256(body).hexdigest()
    assert r.headers["x-mock-request-id"] == "rid-7"
    assert r.headers["x-mock-model"] == "mock-model"
    names = r.headers["x-mock-headers"].split(",")
    assert {"x-custom-thing", "x-request-id", "content-type", "content-length", "host"} <= set(names)
    # Streaming responses carry them too, and errors.
    with httpx.stream("POST", m.v1 + "/chat/completions", content=body.replace(b'"max_tokens": 1', b'"stream": true, "max_tokens": 1'),
                      headers={**FAST, "x-mock-echo": "1"}) as s:
        assert s.headers["x-mock-body-sha256"] and s.headers["content-type"].startswith("text/event-stream")
        s.read()
    r = httpx.post(m.v1 + "/chat/completions", content=b'{"model":"nope","messages":[]}',
                   headers={"x-mock-echo": "1"})
    assert r.status_code == 404 and r.headers["x-mock-model"] == "nope"


# ---------------------------------------------------------------------------
# Cancellation


def test_abort_counter_moves_within_50ms_of_disconnect(m):
    # The next token is 2 s away, so only watching the socket (not a failed
    # write) can count the abort in time. Up to 3 tries absorb a busy test
    # machine descheduling this process; the mock must make it in one.
    req = post_request("/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "long"}], "max_tokens": 1000, "stream": True},
                       {"x-mock-ttft-ms": "5", "x-mock-itl-ms": "2000"}, connection="keep-alive")
    metrics = httpx.Client(base_url=m.base_url)  # keep-alive: each poll costs ~1 ms

    def aborts() -> float:
        return metric_value(parse_prometheus(metrics.get("/metrics").text), "vllm:request_success_total",
                            finished_reason="abort")

    tries = []
    for _ in range(3):
        before = aborts()
        running_before = m.metric("vllm:num_requests_running")
        s = socket.create_connection(("127.0.0.1", m.process.port))
        s.sendall(req)
        assert b'"delta":{"content"' in read_until(s, b'"delta":{"content"')
        assert m.metric("vllm:num_requests_running") == running_before + 1
        s.close()
        closed = time.monotonic()
        # (10 s: a loaded machine may delay any try; the defect counts at the next token, 2 s on, every try)
        wait_until(lambda: aborts() > before, timeout=10, interval=0.001, message="abort counter")
        tries.append(time.monotonic() - closed)
        assert aborts() == before + 1
        assert m.metric("vllm:num_requests_running") == running_before
        if tries[-1] < 0.05:
            break
    assert min(tries) < 0.05, f"abort counted {[round(t * 1000, 1) for t in tries]} ms after the disconnect"


def test_abort_while_non_streaming_request_pending(m):
    before = m.aborts()
    req = post_request("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5},
                       {"x-mock-ttft-ms": "10000"}, connection="keep-alive")
    s = socket.create_connection(("127.0.0.1", m.process.port))
    s.sendall(req)
    wait_until(lambda: m.metric("vllm:num_requests_running") >= 1, message="request running")
    s.close()
    wait_until(lambda: m.aborts() == before + 1, timeout=5, message="abort counted")  # (not the 10 s answer)


# ---------------------------------------------------------------------------
# Metrics, keep-alive, robustness, concurrency


def test_metrics_count_tokens_and_finishes(mock):
    mk = mock("--max-tokens", "8", "--ttft-ms", "5", "--itl-ms", "1")
    chat(mk, "a b c", headers={}, max_tokens=3)                     # length, 7 prompt + 3 generated
    list(chat(mk, "a b c", stream=True, headers={}))                # stop, 7 + 8
    text = mk.metrics_text()
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"]:
        assert f"# TYPE {name} " in text, name
    assert 'model_name="mock-model"' in text and 'engine="0"' in text
    assert mk.metric("vllm:prompt_tokens_total") == 14
    assert mk.metric("vllm:generation_tokens_total") == 11
    assert mk.metric("vllm:request_success_total", finished_reason="length") == 1
    assert mk.metric("vllm:request_success_total", finished_reason="stop") == 1
    assert mk.metric("vllm:time_to_first_token_seconds_count") == 2
    assert mk.metric("vllm:num_requests_running") == 0 and mk.metric("vllm:kv_cache_usage_perc") == 0


def test_keep_alive_many_requests_one_connection(m):
    before = m.metric("weir_mock_connections_total")
    with httpx.Client(base_url=m.v1, headers=FAST) as c:
        for i in range(30):
            r = c.post("/chat/completions", json={"messages": [{"role": "user", "content": str(i)}], "max_tokens": 2,
                                                  "stream": i % 2 == 0})
            assert r.status_code == 200
    # one connection for the 30 requests, one for each metrics read
    assert m.metric("weir_mock_connections_total") == before + 2


def test_survives_bad_input(m):
    port = m.process.port
    assert raw_http(port, b"\x00\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request")
    huge = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n"
    assert raw_http(port, huge).startswith(b"HTTP/1.1 431")
    big_body = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 70000000\r\n\r\n{"
    r = raw_http(port, big_body)
    assert r.startswith(b"HTTP/1.1 413") and b'"code":413' in r
    bad_chunked = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
    assert raw_http(port, bad_chunked).startswith(b"HTTP/1.1 400")
    # Slowloris: a connection trickling a header does not block others.
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET /health HTTP/1.1\r\nhost")
    half_closed = socket.create_connection(("127.0.0.1", port))
    half_closed.sendall(post_request("/v1/chat/completions", {"messages": []}, FAST)[:40])
    half_closed.shutdown(socket.SHUT_WR)
    for _ in range(3):
        assert httpx.get(m.base_url + "/health").status_code == 200
    slow.close()
    half_closed.close()
    assert m.process.alive()


def test_expect_100_continue(m):
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
            f"expect: 100-continue\r\nx-mock-ttft-ms: 1\r\nconnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", m.process.port), timeout=5) as s:
        s.sendall(head)
        assert read_until(s, b"\r\n\r\n", limit=2) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        assert read_until(s, b'"kv_transfer_params":null}').startswith(b"HTTP/1.1 200 OK")


def test_threads_flag(mock):
    mk = mock("--threads", "2", "--ttft-ms", "1", "--itl-ms", "1")
    for _ in range(4):
        assert chat(mk, headers={}, max_tokens=2).usage.completion_tokens == 2
    assert mk.metric("vllm:request_success_total", finished_reason="length") == 4


def test_300_concurrent_streams_complete(mock):
    m = mock()  # default timings: ttft 90 ms, itl 14 ms

    async def one(c: openai.AsyncOpenAI, i: int) -> tuple[str, int]:
        stream = await c.chat.completions.create(
            model="mock-model", messages=[{"role": "user", "content": f"stream {i}"}], max_tokens=32, stream=True,
            stream_options={"include_usage": True})
        text, tokens, usage = "", 0, None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                tokens += 1
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        assert usage == 32
        return text, tokens

    async def main():
        import httpx as hx
        http = hx.AsyncClient(limits=hx.Limits(max_connections=400, max_keepalive_connections=400), timeout=60)
        c = openai.AsyncOpenAI(base_url=m.v1, api_key="x", max_retries=0, http_client=http)
        try:
            return await asyncio.gather(*(one(c, i) for i in range(300)))
        finally:
            await http.aclose()

    results = asyncio.run(main())
    assert len(results) == 300 and all(tokens == 32 for _, tokens in results)
    # Deterministic per prompt: the text of stream 7 is what a fresh request yields.
    again = chat(m, "stream 7", max_tokens=32, headers=FAST).choices[0].message.content
    assert results[7][0] == again
    assert m.metric("vllm:num_requests_running") == 0


def test_second_mock_on_the_same_address_refuses_to_start(mock):
    """Two mocks answering one port would mix two runs' traffic (and their timing flags)."""
    first = mock("--max-tokens", "3")
    port = first.process.port
    t0 = time.monotonic()
    r = subprocess.run([str(binary("weir-mock")), "--listen", f"127.0.0.1:{port}"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode != 0, r.stdout + r.stderr
    assert f"127.0.0.1:{port} is already in use by another process" in r.stderr, r.stderr
    assert "--reuse-port" in r.stderr and time.monotonic() - t0 < 5
    assert first.process.alive()
    assert chat(first).usage.completion_tokens == 3


def test_second_mock_shares_the_address_with_reuse_port(mock, processes):
    first = mock("--max-tokens", "3")
    port = first.process.port
    second = processes.start([binary("weir-mock"), "--listen", f"127.0.0.1:{port}", "--reuse-port",
                              "--max-tokens", "4"], port, name="weir-mock-second")
    wait_until(lambda: "listening on" in second.log() or not second.alive(), 10, message="its start-up line")
    assert second.alive(), second.log()
    # Both answer, each new connection one or the other (3 tokens: the first, 4: the second). One HTTP
    # client that keeps no connection: every request a new one, none paying for a client of its own.
    seen = set()
    with httpx.Client(base_url=first.v1, timeout=30, headers=FAST,
                      limits=httpx.Limits(max_keepalive_connections=0)) as c:
        def ask() -> int:
            r = c.post("/chat/completions",
                       json={"model": "mock-model", "messages": [{"role": "user", "content": "x"}]})
            return r.json()["usage"]["completion_tokens"]
        for _ in range(200):  # each new connection lands on either with 1/2: 2^-199 to miss one
            seen.add(ask())
            if seen == {3, 4}:
                break
    assert seen == {3, 4}, seen


def test_a_continuation_of_a_prefix_streams_exactly_the_rest(mock):
    # continue_final_message (vLLM's chat-template parameter): the final assistant message's K words are the
    # first K tokens, so the continuation is the rest of the unbroken run (what Weir's resume relies on).
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "10")
    c = openai.OpenAI(base_url=m.v1, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "hi there"}]
    full = c.chat.completions.create(model="mock-model", messages=msgs)
    tokens = [" " + w for w in full.choices[0].message.content.split(" ")[1:]]
    assert len(tokens) == 10
    cont = {"continue_final_message": True, "add_generation_prompt": False}
    prefix = [*msgs, {"role": "assistant", "content": "".join(tokens[:4])}]
    chunks = list(c.chat.completions.create(model="mock-model", messages=prefix, stream=True, extra_body=cont,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "".join(tokens[4:])
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens + 4
    # max_tokens counts the new tokens; non-streaming too
    r = c.chat.completions.create(model="mock-model", messages=prefix, max_tokens=3, extra_body=cont)
    assert r.choices[0].message.content == "".join(tokens[4:7]) and r.choices[0].finish_reason == "length"
    # without the flag the assistant message is a closed turn: another text
    other = c.chat.completions.create(model="mock-model", messages=prefix).choices[0].message.content
    assert other != "".join(tokens[4:])
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="mock-model", messages=prefix, extra_body={"continue_final_message": True})


def test_a_reset_at_the_messages_length_comes_after_its_last_token(mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "10")
    with httpx.stream("POST", m.base_url + "/v1/chat/completions", timeout=10, headers={"x-mock-reset-after": "4"},
                      json={"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "stream": True,
                            "max_tokens": 4}) as r:
        raw = b""
        with pytest.raises(httpx.HTTPError):
            for piece in r.iter_raw():
                raw += piece
    text = raw.decode()
    assert text.count('"finish_reason":"length"') == 1 and "[DONE]" not in text and '"usage"' not in text
