"""Fixes to the Anthropic Messages translation (helper anth50).

- /v1/messages/count_tokens refuses an empty messages list as /v1/messages does.
- A translated stream has Anthropic's `event: ping` after message_start, in the same write.
- /v1/models and /v1/models/{id} asked with anthropic-version (the anthropic SDK's models.list() and
  models.retrieve()) answer in Anthropic's shapes, a missing model with Anthropic's 404.
"""

from __future__ import annotations

import hashlib
import json
import socket
import uuid

import httpx
import openai
import pytest

from scripted_upstream import ScriptedUpstream

KEY = "sk-anth50-test"
HELLO = [{"role": "user", "content": "hello there"}]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
    assert set(raw["data"][0]) == {"type", "id", "display_name", "created_at"}
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
