"""Fixes to the Anthropic Messages translation (helper anth50).

- A streamed message_start carries the prompt's input_tokens: Weir asks a
  self-hosted (http://) upstream for vLLM's continuous_usage_stats, whose
  role chunk has the usage (pools.X.continuous_usage); never counted twice.
- /v1/messages/count_tokens refuses an empty messages list as /v1/messages does.
- A translated stream has Anthropic's `event: ping` after message_start, in the same write.
- /v1/models and /v1/models/{id} asked with anthropic-version (the anthropic SDK's models.list() and
  models.retrieve()) answer in Anthropic's shapes, a missing model with Anthropic's 404.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import httpx
import openai
import pytest

from conftest import free_port
from scripted_upstream import ScriptedUpstream

KEY = "sk-anth50-test"
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "2", "--itl-ms", "1", "--max-tokens", "12")
    w = module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},  # http://: continuous_usage auto is on
        "models": {"claude-test": {"pool": "p", "upstream_model": "mock-model"},
                   "claude-other": {"pool": "p", "upstream_model": "mock-model"}},
        "tenants": {"t": {"limits": {"requests_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    })
    return m, w, None


@pytest.fixture(scope="module")
def configured(module_weir):
    up = ScriptedUpstream().start()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: a connect failure, then the fallback
    w = module_weir(config={
        "pools": {
            "quiet": {"endpoints": [up.base_url], "continuous_usage": False},
            "told": {"endpoints": [up.base_url], "continuous_usage": True},
            "dead": {"endpoints": [dead]},
        },
        "models": {
            "claude-quiet": {"pool": "quiet", "upstream_model": "mock-model"},
            "claude-told": {"pool": "told", "upstream_model": "mock-model"},
            "claude-dead": {"pool": "dead", "upstream_model": "mock-model", "fallbacks": [{"model": "claude-quiet"}]},
        },
        "tenants": {"t": {"limits": {"requests_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    })
    yield None, w, up
    up.stop()


def rid() -> str:
    return "a50-" + uuid.uuid4().hex[:16]


def sse_events(raw: str) -> list[tuple[str, dict]]:
    assert raw.endswith("\n\n"), raw[-200:]
    out = []
    for block in raw[:-2].split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        kind, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == kind, block
        out.append((kind, data))
    return out


def stream(w, body: dict, **headers) -> list[tuple[str, dict]]:
    with httpx.stream("POST", w.base_url + "/v1/messages", json={**body, "stream": True}, timeout=30,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", **headers}) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.read().decode())


def tokens(w) -> tuple[float, float]:
    """weir_prompt_tokens_total and weir_completion_tokens_total of claude-test (0 before any)."""
    got = [0.0, 0.0]
    for name, labels, value in w.metrics():
        if labels.get("model") == "claude-test":
            if name == "weir_prompt_tokens_total":
                got[0] += value
            elif name == "weir_completion_tokens_total":
                got[1] += value
    return got[0], got[1]


def reference_prompt_tokens(m, upstream_id: str) -> int:
    ref = openai.OpenAI(base_url=m.v1, api_key="x", max_retries=0).chat.completions.create(
        model="mock-model", max_tokens=1, messages=HELLO, extra_headers={"x-request-id": upstream_id})
    return ref.usage.prompt_tokens


@pytest.mark.parametrize("tools", [0, 2])
def test_message_start_has_input_tokens(stack, tools):
    m, w, _ = stack
    r = rid()
    body = {"model": "claude-test", "max_tokens": 6, "messages": HELLO}
    if tools:
        body["tools"] = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    before = tokens(w)
    ev = stream(w, body, **{"x-request-id": r, "x-mock-tool-calls": str(tools)})
    prompt = reference_prompt_tokens(m, w.upstream_id(r))
    assert prompt > 0
    start = ev[0][1]["message"]["usage"]
    assert start["input_tokens"] == prompt, start
    assert start["output_tokens"] == 0, start
    final = [d for k, d in ev if k == "message_delta"]
    assert len(final) == 1
    # The last chunk's totals, not a sum over the chunks that each carried usage.
    assert final[0]["usage"]["input_tokens"] == prompt and final[0]["usage"]["output_tokens"] == 6, final
    log = w.log_for(r)
    assert (log["prompt_tokens"], log["completion_tokens"]) == (prompt, 6)
    after = tokens(w)
    assert (after[0] - before[0], after[1] - before[1]) == (prompt, 6)


def test_sdk_stream_usage(stack):
    import anthropic
    m, w, _ = stack
    r = rid()
    c = anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)
    with c.messages.stream(model="claude-test", max_tokens=5, messages=HELLO,
                           extra_headers={"x-request-id": r}) as s:
        first = next(iter(s))
        assert first.type == "message_start"
        start_usage = first.message.usage
        final = s.get_final_message()
    prompt = reference_prompt_tokens(m, w.upstream_id(r))
    assert start_usage.input_tokens == prompt
    assert final.usage.input_tokens == prompt and final.usage.output_tokens == 5


def test_upstream_asked_only_where_configured(configured):
    _, w, up = configured
    up.clear()
    for model in ("claude-told", "claude-quiet"):
        stream(w, {"model": model, "max_tokens": 5, "messages": HELLO}, **{"x-script": "vllm-echo"})
    told, quiet = [r.json() for r in up.requests if r.target.endswith("/chat/completions")]
    assert told["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert quiet["stream_options"] == {"include_usage": True}


def test_no_first_chunk_usage_keeps_zero(configured):
    # An upstream that sends no usage before its last chunk: message_start says 0, message_delta the count.
    _, w, _ = configured
    ev = stream(w, {"model": "claude-quiet", "max_tokens": 5, "messages": HELLO}, **{"x-script": "vllm-echo"})
    assert ev[0][1]["message"]["usage"]["input_tokens"] == 0
    assert [k for k, _ in ev][-1] == "message_stop"


def test_fallback_pool_gets_its_own_choice(configured):
    # The translation made for the first pool (continuous_usage on: http://) is made again for a fallback
    # pool that has it off: that upstream never sees the field.
    _, w, up = configured
    up.clear()
    ev = stream(w, {"model": "claude-dead", "max_tokens": 5, "messages": HELLO}, **{"x-script": "vllm-echo"})
    assert [k for k, _ in ev][-1] == "message_stop"
    sent = [r.json() for r in up.requests if r.target.endswith("/chat/completions")]
    assert len(sent) == 1 and sent[0]["stream_options"] == {"include_usage": True}


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_empty_messages_refused_on_both_routes(stack, path):
    _, w, _ = stack
    r = httpx.post(w.base_url + path, json={"model": "claude-test", "max_tokens": 5, "messages": []},
                   headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}, timeout=30)
    assert "messages" in anthropic_error(r, 400, "invalid_request_error")


def test_count_tokens_still_counts(stack):
    _, w, _ = stack
    r = httpx.post(w.base_url + "/v1/messages/count_tokens", json={"model": "claude-test", "messages": HELLO},
                   headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}, timeout=30)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text


def test_ping_after_message_start(stack):
    _, w, _ = stack
    body = {"model": "claude-test", "max_tokens": 3, "stream": True, "messages": HELLO}
    with httpx.stream("POST", w.base_url + "/v1/messages", json=body, timeout=30,
                      headers={"x-api-key": KEY, "x-mock-itl-ms": "50"}) as r:
        assert r.status_code == 200
        # The first piece the client reads (one write, one HTTP chunk): message_start and the ping, byte for
        # byte as Anthropic writes it.
        it = r.iter_raw()
        raw = next(it)
        rest = b"".join(it)
    first = raw.decode()
    blocks = first[:-2].split("\n\n")
    assert blocks[0].startswith("event: message_start\n"), first
    assert blocks[1] == 'event: ping\ndata: {"type": "ping"}', first
    kinds = [k for k, _ in sse_events((raw + rest).decode())]
    assert kinds.count("ping") == 1 and kinds[:2] == ["message_start", "ping"]


RFC3339 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"


def test_anthropic_sdk_models_list_and_retrieve(stack):
    import re

    import anthropic
    _, w, _ = stack
    c = anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)
    page = c.models.list()
    ids = [m.id for m in page.data]
    assert ids == ["claude-test", "claude-other"]
    for m in page.data:
        assert m.type == "model" and m.display_name == m.id
    assert page.has_more is False and page.first_id == "claude-test" and page.last_id == "claude-other"
    raw = httpx.get(w.base_url + "/v1/models", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}).json()
    assert set(raw) == {"data", "has_more", "first_id", "last_id"}
    assert set(raw["data"][0]) == {"type", "id", "display_name", "created_at", "lifecycle", "max_input_tokens",
                                   "max_tokens", "capabilities", "line", "deprecated_at", "retires_at"}
    assert re.match(RFC3339, raw["data"][0]["created_at"]), raw
    one = c.models.retrieve("claude-test")
    assert one.id == "claude-test" and one.type == "model" and one.display_name == "claude-test"
    with pytest.raises(anthropic.NotFoundError) as e:
        c.models.retrieve("claude-nope")
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"


def test_openai_clients_keep_openai_models_shape(stack):
    _, w, _ = stack
    oc = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0)
    models = oc.models.list()
    assert [m.id for m in models.data][0] == "claude-test" and models.data[0].object == "model"
    r = httpx.get(w.base_url + "/v1/models/claude-nope", headers={"authorization": "Bearer " + KEY})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_quick_mode_upstream_list_in_anthropic_shape(mock, weir):
    import anthropic
    m = mock()
    w = weir(config={"default_pool": "p", "pools": {"p": {"endpoints": [m.base_url]}}})
    c = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    page = c.models.list()
    upstream = httpx.get(m.v1 + "/models").json()["data"]
    assert [x.id for x in page.data] == [x["id"] for x in upstream] and page.data
    assert page.first_id == upstream[0]["id"] and page.has_more is False
    one = c.models.retrieve(upstream[0]["id"])
    assert one.id == upstream[0]["id"] and one.type == "model"
    with pytest.raises(anthropic.NotFoundError):
        c.models.retrieve("nope")
