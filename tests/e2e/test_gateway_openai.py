"""The official openai SDK through Weir against the same request straight to weir-mock.

Every result must be identical in content and token usage (the direct
request carries the x-request-id Weir sent upstream, the log's
upstream_request_id: vLLM's ids are then equal too; only `created` may differ), model
renames and aliases must reach the upstream with only the model value
changed, and /v1/models must answer in OpenAI's shape.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import uuid

import httpx
import openai
import pytest

from httpwire import RawConn, request

MOCK_FLAGS = ("--ttft-ms", "2", "--itl-ms", "1", "--max-tokens", "12")


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    """A mock and a quick-mode weir in front of it."""
    m = module_mock(*MOCK_FLAGS)
    w = module_weir(upstream=m)
    return m, w


def direct(m) -> openai.OpenAI:
    return openai.OpenAI(base_url=m.v1, api_key="test", max_retries=0, timeout=30)


def rid() -> str:
    return "t-" + uuid.uuid4().hex[:16]


def strip_created(obj):
    """model_dump() of an SDK object without `created` (a timestamp) anywhere."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(warnings=False)
    if isinstance(obj, dict):
        return {k: strip_created(v) for k, v in obj.items() if k != "created"}
    if isinstance(obj, list):
        return [strip_created(v) for v in obj]
    return obj


def both(stack, call):
    """Runs ``call(client, headers)`` through Weir, then direct with the x-request-id Weir sent upstream (the
    client's with a generated suffix: the log's upstream_request_id)."""
    m, w = stack
    request_id = rid()
    via = call(w.client(), {"x-request-id": request_id})
    ref = call(direct(m), {"x-request-id": w.upstream_id(request_id)})
    return via, ref, request_id


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me about rivers"}]


def test_chat_non_streaming_identical(stack):
    via, ref, request_id = both(stack, lambda c, h: c.chat.completions.create(
        model="mock-model", messages=MESSAGES, max_tokens=7, extra_headers=h))
    assert strip_created(via) == strip_created(ref)
    assert via.id == f"chatcmpl-{stack[1].upstream_id(request_id)}"
    assert via.choices[0].message.content and via.choices[0].finish_reason == "length"
    assert (via.usage.prompt_tokens, via.usage.completion_tokens, via.usage.total_tokens) == (14, 7, 21)
    _, w = stack
    entry = w.log_for(request_id)
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (14, 7)
    assert entry["status"] == 200 and entry["stream"] is False


def test_chat_streaming_identical(stack):
    def run(c, h):
        return [strip_created(ch) for ch in c.chat.completions.create(
            model="mock-model", messages=MESSAGES, stream=True, extra_headers=h)]
    via, ref, request_id = both(stack, run)
    assert via == ref
    text = "".join(ch["choices"][0]["delta"]["content"] or "" for ch in via if ch["choices"])
    assert len(text.split()) == 12
    assert via[-1]["choices"][0]["finish_reason"] == "stop"
    _, w = stack
    entry = w.log_for(request_id)
    assert entry["stream"] is True and entry["status"] == 200 and entry["ttft_ms"] is not None
    assert entry["events"] == len(via) + 1  # every chunk and [DONE]


@pytest.mark.parametrize("continuous", [False, True])
def test_chat_stream_usage_chunks_pass_through(stack, continuous):
    options = {"include_usage": True}
    if continuous:
        options["continuous_usage_stats"] = True

    def run(c, h):
        return [strip_created(ch) for ch in c.chat.completions.create(
            model="mock-model", messages=MESSAGES, stream=True, stream_options=options, max_tokens=5,
            extra_headers=h)]
    via, ref, request_id = both(stack, run)
    assert via == ref
    last = via[-1]
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == 14
    assert last["usage"]["completion_tokens"] == 5 and last["usage"]["total_tokens"] == 19
    with_usage = [ch for ch in via if ch.get("usage")]
    if continuous:
        assert len(with_usage) == len(via)  # every chunk carries running usage
        assert [ch["usage"]["completion_tokens"] for ch in via[1:-1]] == [1, 2, 3, 4, 5]
    else:
        assert with_usage == [last]
    _, w = stack
    entry = w.log_for(request_id)
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (14, 5)


@pytest.mark.parametrize("options", [None, {"include_usage": False}, {"include_usage": False,
                                                                     "continuous_usage_stats": True},
                                     {"continuous_usage_stats": False}],
                         ids=["none", "usage-off", "usage-off-continuous-on", "continuous-off"])
def test_chat_stream_usage_exactly_as_vllm_sends_it(stack, options):
    """Whatever Weir asks upstream to learn the token counts, the client gets exactly the chunks
    vLLM would have sent it (vLLM's stream_options.include_usage defaults to true)."""
    kw = {} if options is None else {"stream_options": options}

    def run(c, h):
        return [strip_created(ch) for ch in c.chat.completions.create(
            model="mock-model", messages=MESSAGES, stream=True, max_tokens=4, extra_headers=h, **kw)]
    via, ref, request_id = both(stack, run)
    assert via == ref
    vllm_sends_usage = options is not None and options.get("include_usage", True)
    assert [ch for ch in via if ch.get("usage")] == ([via[-1]] if vllm_sends_usage else [])
    _, w = stack
    entry = w.log_for(request_id)
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (14, 4)  # Weir learns them either way


def test_completions_string_prompt_identical(stack):
    via, ref, _ = both(stack, lambda c, h: c.completions.create(
        model="mock-model", prompt="once upon a time", max_tokens=6, extra_headers=h))
    assert strip_created(via) == strip_created(ref)
    assert via.usage.prompt_tokens == 5 and via.usage.completion_tokens == 6


def test_completions_prompt_list_identical(stack):
    prompts = ["one two", "three four five", "six"]
    via, ref, _ = both(stack, lambda c, h: c.completions.create(
        model="mock-model", prompt=prompts, n=2, max_tokens=4, extra_headers=h))
    assert strip_created(via) == strip_created(ref)
    assert [ch.index for ch in via.choices] == list(range(6))
    assert via.usage.prompt_tokens == 3 + 4 + 2 and via.usage.completion_tokens == 24


@pytest.mark.parametrize("usage", [True, False])
def test_completions_prompt_list_streaming_interleaved(stack, usage):
    prompts = ["alpha beta", "gamma", "delta epsilon zeta"]
    kw = {"stream_options": {"include_usage": True}} if usage else {}

    def run(c, h):
        return [strip_created(ch) for ch in c.completions.create(
            model="mock-model", prompt=prompts, n=2, max_tokens=3, stream=True, extra_headers=h, **kw)]
    via, ref, request_id = both(stack, run)
    assert via == ref
    indexes = [ch["choices"][0]["index"] for ch in via if ch["choices"]]
    assert indexes == list(range(6)) * 3  # each step visits every prompt × n
    if usage:
        assert via[-1]["usage"]["completion_tokens"] == 18
    else:
        assert all(ch["choices"] for ch in via)
    _, w = stack
    assert w.log_for(request_id)["completion_tokens"] == 18


@pytest.mark.parametrize("encoding", ["float", "base64", None])
def test_embeddings_identical(stack, encoding):
    inputs = ["first input", "second input here", "third"]
    kw = {} if encoding is None else {"encoding_format": encoding}
    via, ref, _ = both(stack, lambda c, h: c.embeddings.create(
        model="mock-model", input=inputs, dimensions=32, extra_headers=h, **kw))
    assert strip_created(via) == strip_created(ref)
    assert len(via.data) == 3 and via.usage.prompt_tokens == 3 + 4 + 2
    if encoding == "base64":
        vec = struct.unpack("<32f", base64.b64decode(via.data[0].embedding))
    else:
        vec = via.data[0].embedding
    assert len(vec) == 32 and abs(sum(x * x for x in vec) - 1.0) < 1e-3


def test_embeddings_5mb_response_untruncated(stack):
    m, w = stack
    inputs = [f"input number {i}" for i in range(64)]
    request_id = rid()
    via = w.client().embeddings.create(model="mock-model", input=inputs, dimensions=4096,
                                       encoding_format="float", extra_headers={"x-request-id": request_id})
    ref = direct(m).embeddings.create(model="mock-model", input=inputs, dimensions=4096, encoding_format="float",
                                      extra_headers={"x-request-id": w.upstream_id(request_id)})
    assert strip_created(via) == strip_created(ref)
    assert len(via.data) == 64 and all(len(d.embedding) == 4096 for d in via.data)
    entry = w.log_for(request_id)
    assert entry["status"] == 200 and entry["bytes_out"] > 5_000_000
    assert entry["prompt_tokens"] == 64 * 4


def test_models_quick_mode_proxies_upstream_list(stack):
    m, w = stack
    via = w.client().models.list()
    ref = direct(m).models.list()
    assert [x.id for x in via.data] == [x.id for x in ref.data] == ["mock-model"]
    assert [x.owned_by for x in via.data] == ["vllm"]
    # vLLM's extra fields (max_model_len) pass through untouched
    assert via.data[0].model_extra.get("max_model_len") == 32768


CONFIG_MODELS = {
    "public-llama": {"pool": "main", "upstream_model": "mock-model", "aliases": ["llama", "llama-8b"]},
    "second": {"pool": "main", "aliases": ["second-alias"]},
}


@pytest.fixture(scope="module")
def renamed(module_mock, module_weir):
    """A mock serving mock-model and second, behind a weir config that renames and aliases them."""
    m = module_mock(*MOCK_FLAGS, "--model", "mock-model", "--model", "second")
    w = module_weir(config={"pools": {"main": {"endpoints": [m.base_url]}}, "models": CONFIG_MODELS})
    return m, w


def test_models_config_mode_lists_models_and_aliases(renamed):
    _, w = renamed
    raw = httpx.get(w.v1 + "/models", timeout=10)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("application/json")
    body = raw.json()
    assert body["object"] == "list"
    ids = [x["id"] for x in body["data"]]
    assert sorted(ids) == sorted(["public-llama", "llama", "llama-8b", "second", "second-alias"])
    for x in body["data"]:
        assert x["object"] == "model" and isinstance(x["created"], int) and isinstance(x["owned_by"], str)
    listed = w.client().models.list()
    assert sorted(x.id for x in listed.data) == sorted(ids)
    one = w.client().models.retrieve("llama-8b")
    assert one.id == "llama-8b" and one.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        w.client().models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


def echo_post(w, body: bytes, path="/v1/chat/completions") -> httpx.Response:
    r = httpx.post(w.base_url + path, content=body, timeout=30,
                   headers={"content-type": "application/json", "x-mock-echo": "1"})
    assert r.status_code == 200, r.text
    return r


@pytest.mark.parametrize("name,upstream", [("public-llama", "mock-model"), ("llama", "mock-model"),
                                           ("llama-8b", "mock-model"), ("second-alias", "second")])
def test_rename_changes_only_the_model_value(renamed, name, upstream):
    _, w = renamed
    # Odd spacing, escapes, non-ASCII and a nested decoy "model" before the real one.
    template = ('{\n  "messages" : [ {"role":"user", "content":"say \\"model\\": \\"x\\" caf\\u00e9 caf\u00e9"} ],'
                '\n  "metadata": {"model": "decoy"},\n  "model" :\t"%s" ,  "max_tokens": 3\n}\n')
    sent = (template % name).encode()
    expected = (template % upstream).encode()
    r = echo_post(w, sent)
    assert r.headers["x-mock-model"] == upstream
    assert int(r.headers["x-mock-body-bytes"]) == len(expected)
    assert r.headers["x-mock-body-sha256"] == hashlib.sha256(expected).hexdigest()
    assert "transfer-encoding" not in r.headers["x-mock-headers"].split(",")
    assert r.json()["usage"]["completion_tokens"] == 3


def test_canonical_name_without_upstream_model_is_byte_identical(renamed):
    _, w = renamed
    sent = b'{"model":"second","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
    r = echo_post(w, sent)
    assert r.headers["x-mock-model"] == "second"
    assert r.headers["x-mock-body-sha256"] == hashlib.sha256(sent).hexdigest()


def test_rename_with_the_sdk(renamed):
    """What the SDK sends for an alias reaches the mock with only the model value renamed."""
    _, w = renamed
    captured = []
    http_client = httpx.Client(event_hooks={"request": [lambda req: captured.append(req.read())]})
    client = w.client(http_client=http_client)
    raw = client.chat.completions.with_raw_response.create(
        model="llama", messages=[{"role": "user", "content": "model llama please"}], max_tokens=2,
        extra_headers={"x-mock-echo": "1"})
    completion = raw.parse()
    sent = captured[-1]
    expected, n = re.subn(rb'("model"\s*:\s*)"llama"', rb'\1"mock-model"', sent)
    assert n == 1, sent
    assert raw.headers["x-mock-model"] == "mock-model"
    assert raw.headers["x-mock-body-sha256"] == hashlib.sha256(expected).hexdigest()
    assert completion.usage.completion_tokens == 2
    # streaming too
    stream = client.chat.completions.create(model="public-llama", messages=[{"role": "user", "content": "x"}],
                                            stream=True, max_tokens=3)
    chunks = list(stream)
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 3


def test_rename_of_a_chunked_body(renamed):
    """A chunked request body (no Content-Length) is renamed and sent with a correct Content-Length."""
    _, w = renamed
    template = '{"model":"%s","messages":[{"role":"user","content":"%s"}],"max_tokens":2}'
    filler = "word " * 20000
    sent = (template % ("llama-8b", filler)).encode()
    expected = (template % ("mock-model", filler)).encode()

    def pieces():
        for i in range(0, len(sent), 7000):
            yield sent[i:i + 7000]
    r = httpx.post(w.base_url + "/v1/chat/completions", content=pieces(), timeout=30,
                   headers={"content-type": "application/json", "x-mock-echo": "1"})
    assert r.status_code == 200, r.text
    assert r.headers["x-mock-body-sha256"] == hashlib.sha256(expected).hexdigest()
    names = r.headers["x-mock-headers"].split(",")
    assert "content-length" in names and "transfer-encoding" not in names


def test_raw_stream_framing_is_vllms(stack):
    """Weir forwards each SSE event intact: `data: {...}\\n\\n` ... `data: [DONE]\\n\\n`."""
    _, w = stack
    body = {"model": "mock-model", "messages": MESSAGES, "stream": True, "max_tokens": 4}
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", body))
        r = c.read_response("POST")
    assert r.status == 200 and r.chunked
    assert r.header("content-type").startswith("text/event-stream")
    text = r.body.decode()
    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for ev in events[:-2]:
        assert ev.startswith("data: {") and "\n" not in ev
        json.loads(ev[6:])


def test_client_headers_reach_upstream_hop_by_hop_do_not(stack):
    """End-to-end headers (the API key vLLM may check, custom ones) pass; hop-by-hop ones stop at Weir."""
    _, w = stack
    body = {"model": "mock-model", "messages": MESSAGES, "max_tokens": 1}
    hdrs = {"authorization": "Bearer sk-user-key", "x-custom": "1", "openai-organization": "org",
            "connection": "keep-alive, x-hop", "x-hop": "secret", "keep-alive": "timeout=5", "te": "trailers",
            "proxy-authorization": "Basic abc", "x-mock-echo": "1"}
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", body, hdrs))
        r = c.read_response("POST")
    assert r.status == 200
    seen = r.header("x-mock-headers").split(",")
    for name in ("authorization", "x-custom", "openai-organization", "x-request-id", "content-length", "host"):
        assert name in seen, (name, seen)
    for name in ("connection", "x-hop", "keep-alive", "te", "proxy-authorization", "transfer-encoding"):
        assert name not in seen, (name, seen)
