"""Stop 61 (vllm61): vLLM's context-length refusals, and vLLM answers that are one request's own state.

F1: vLLM's 400 for a prompt past the context length reached OpenAI clients with code null (vLLM writes its
status there) and type BadRequestError: openai-python, LangChain and LiteLLM compare `code ==
"context_length_exceeded"` to trim the conversation. Anthropic clients got vLLM's words, not Anthropic's
"prompt is too long: I tokens > L maximum" / "input length and `max_tokens` exceed context limit: I + O > L, ..."
that Claude Code parses to compact or lower max_tokens. weir-mock refused in vLLM's old words.

F2: with pools.X.coalesce, two identical prefill requests of vLLM's disaggregated serving (`kv_transfer_params:
{"do_remote_decode": true}`) shared one generation: both clients got the same kv_transfer_params (the same
remote_block_ids and remote_request_id), and two decoders would pull the same KV blocks.
"""
from __future__ import annotations

import itertools
import json
import threading

import anthropic
import httpx
import openai
import pytest

from conftest import wait_until
from test_defect_fixes import RawUpstream

OLD = ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4900 in the "
       "messages, 100 in the completion). Please reduce the length of the messages or completion.")
CURRENT = ("This model's maximum context length is 4096 tokens. However, you requested 1000 output tokens and your "
           "prompt contains 3500 input tokens, for a total of 4500 tokens. Please reduce the length of the input "
           "prompt or the number of requested output tokens.")
NEWEST = ("Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
          "5000 tokens: 4900 tokens from the input messages and 100 tokens for the completion. Please reduce the "
          "number of tokens in the input messages or the completion to fit within the limit.")
RENDERER = ("You passed 3997 input tokens and requested 100 output tokens. However, the model's context length is "
            "only 4096 tokens, resulting in a maximum input length of 3996 tokens. Please reduce the length of the "
            "input prompt.")
TOO_LONG = "prompt is too long: 4900 tokens > 4096 maximum"
WORDINGS = {
    "old": (OLD, TOO_LONG),
    "current": (CURRENT, "input length and `max_tokens` exceed context limit: 3500 + 1000 > 4096, decrease input "
                         "length or `max_tokens` and try again"),
    "newest": (NEWEST, TOO_LONG),
    "renderer": (RENDERER, "input length and `max_tokens` exceed context limit: 3997 + 100 > 4096, decrease input "
                           "length or `max_tokens` and try again"),
}


def _shape(shape: str, message: str) -> bytes:
    if shape == "flat":  # vLLM before 0.10.1
        return json.dumps({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                           "code": 400}).encode()
    return json.dumps({"error": {"message": message, "type": "BadRequestError", "param": None,
                                 "code": 400}}).encode()


def _answer(status: int, body: bytes) -> bytes:
    return (b"HTTP/1.1 %d Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, len(body)) + body)


@pytest.fixture
def upstream():
    ups = []

    def make(answer):
        up = RawUpstream(answer)
        ups.append(up)
        return up

    yield make
    for up in ups:
        up.close()


def _gateway(weir, url, **pool):
    return weir(config={"pools": {"p": {"endpoints": [url], **pool}}, "models": {"m": {"pool": "p"}}}, workers=1)


@pytest.mark.parametrize("shape", ["flat", "nested"])
@pytest.mark.parametrize("wording", list(WORDINGS))
def test_context_length_refusals_reach_each_sdk_as_its_own_error(weir, upstream, wording, shape):
    message, anthropic_message = WORDINGS[wording]
    up = upstream(lambda h, b: _answer(400, _shape(shape, message)))
    w = _gateway(weir, up.url)
    client = openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0)
    calls = {
        "messages": lambda: client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=100),
        "prompt": lambda: client.completions.create(model="m", prompt="hi", max_tokens=100),
        "input": lambda: client.responses.create(model="m", input="hi", max_output_tokens=100),
    }
    for param, call in calls.items():
        with pytest.raises(openai.BadRequestError) as e:
            call()
        # OpenAI's error for it, vLLM's words kept (they give the counts).
        assert (e.value.code, e.value.type, e.value.param) == ("context_length_exceeded", "invalid_request_error",
                                                               param), (param, e.value.body)
        assert e.value.body["message"] == message
    with pytest.raises(openai.BadRequestError) as e:  # (vLLM refuses before the stream starts)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=100,
                                       stream=True)
    assert e.value.code == "context_length_exceeded", e.value.body
    a = anthropic.Anthropic(base_url=w.base_url, api_key="k", max_retries=0, timeout=30)
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as e:
            a.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}], stream=stream)
        assert e.value.body["error"] == {"type": "invalid_request_error", "message": anthropic_message}, e.value.body


def test_weir_mock_refuses_in_vllms_current_words_and_clients_read_them(mock, weir):
    m = mock("--max-model-len", "64")
    w = weir(m, workers=1)
    long = " ".join(["word"] * 400)
    # vLLM's renderer counts the prompt up to one token past what fits (64 - 10 + 1).
    with pytest.raises(openai.BadRequestError) as e:
        openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0).chat.completions.create(
            model="mock-model", messages=[{"role": "user", "content": long}], max_tokens=10)
    assert (e.value.code, e.value.param) == ("context_length_exceeded", "messages"), e.value.body
    assert e.value.body["message"] == (
        "You passed 55 input tokens and requested 10 output tokens. However, the model's context length is only 64 "
        "tokens, resulting in a maximum input length of 54 tokens. Please reduce the length of the input prompt.")
    a = anthropic.Anthropic(base_url=w.base_url, api_key="k", max_retries=0, timeout=30)
    with pytest.raises(anthropic.BadRequestError) as e:
        a.messages.create(model="mock-model", max_tokens=10, messages=[{"role": "user", "content": long}])
    assert e.value.body["error"]["message"] == (
        "input length and `max_tokens` exceed context limit: 55 + 10 > 64, decrease input length or `max_tokens` "
        "and try again"), e.value.body


# --- F2: coalescing and vLLM's disaggregated serving ---------------------------------------------------------

def _prefill_upstream(upstream):
    """Answers each completion with its own kv_transfer_params (a fresh remote_request_id), held until `release`."""
    seen: list[bytes] = []
    release = threading.Event()
    ids = itertools.count(1)
    lock = threading.Lock()

    def answer(h, b):
        with lock:
            seen.append(b)
            n = next(ids)
        body = json.dumps({
            "id": f"cmpl-{n}", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length", "stop_reason": None}],
            "usage": {"prompt_tokens": 5, "total_tokens": 6, "completion_tokens": 1},
            "kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [n],
                                   "remote_engine_id": "eng-A", "remote_request_id": f"req-{n}",
                                   "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1}}).encode()
        return [release, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % len(body) + body]
    return upstream(answer), seen, release


@pytest.mark.parametrize("member", ["kv_transfer_params", "ec_transfer_params"])
def test_disaggregated_prefills_never_share_a_generation(weir, upstream, member):
    up, seen, release = _prefill_upstream(upstream)
    w = _gateway(weir, up.url, coalesce=True)
    body = {"model": "m", "prompt": "hello world", "max_tokens": 1, "temperature": 0,
            member: {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}}
    out: list = [None, None]

    def post(i):
        out[i] = httpx.post(f"{w.v1}/completions", json=body, timeout=30)
    first = threading.Thread(target=post, args=(0,))
    first.start()
    wait_until(lambda: len(seen) == 1, 10)
    second = threading.Thread(target=post, args=(1,))
    second.start()
    # The second either reaches the upstream on its own or joins the first's generation.
    wait_until(lambda: len(seen) == 2 or w.metric("weir_coalesced_requests_total") >= 1, 10)
    release.set()
    first.join(30)
    second.join(30)
    assert [r.status_code for r in out] == [200, 200], [r.text for r in out]
    assert len(seen) == 2 and w.metric("weir_coalesced_requests_total") == 0
    handles = [r.json()["kv_transfer_params"]["remote_request_id"] for r in out]
    assert sorted(handles) == ["req-1", "req-2"], handles


def test_identical_requests_without_transfer_params_still_share_a_generation(weir, upstream):
    up, seen, release = _prefill_upstream(upstream)
    w = _gateway(weir, up.url, coalesce=True)
    body = {"model": "m", "prompt": "hello world", "max_tokens": 1, "temperature": 0, "kv_transfer_params": None}
    out: list = [None, None]

    def post(i):
        out[i] = httpx.post(f"{w.v1}/completions", json=body, timeout=30)
    first = threading.Thread(target=post, args=(0,))
    first.start()
    wait_until(lambda: len(seen) == 1, 10)
    second = threading.Thread(target=post, args=(1,))
    second.start()
    wait_until(lambda: len(seen) == 2 or w.metric("weir_coalesced_requests_total") >= 1, 10)
    release.set()
    first.join(30)
    second.join(30)
    assert [r.status_code for r in out] == [200, 200], [r.text for r in out]
    assert len(seen) == 1 and w.metric("weir_coalesced_requests_total") == 1
