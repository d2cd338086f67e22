"""vLLM's finish reasons that say a generation failed, on every route (fixwire62).

vLLM ends a request with `finish_reason: "abort"` when its engine aborts it (preempted without recompute, a KV
transfer that failed, an abort that reached it upstream of Weir), `"error"` for a request-level internal error,
`"repetition"` when its repetition detection stops a degenerate answer (vllm/v1/engine FINISH_REASON_STRINGS). The translated APIs passed every one of them to their clients as a normal end: a
Responses answer `status: "completed"`, an Anthropic message `stop_reason: "end_turn"`. Now a failed finish
(one of those three; any other value, such as TGI's `eos_token`, is an ending as before) is a failure in the
client's dialect:
a 502 for a whole answer, `response.failed` or Anthropic's `error` event for a stream. Chat and completions
clients get vLLM's value as it came (vLLM's wire), and the access log and the upstream failure counter record
the failure there too.
"""

from __future__ import annotations

import json
import uuid

import anthropic
import httpx
import openai
import pytest

from scripted_upstream import ScriptedUpstream

FAILED = ["abort", "error", "repetition"]
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def stack(module_weir):
    up = ScriptedUpstream().start()
    w = module_weir(config={
        "pools": {"vllm": {"endpoints": [up.base_url]}},
        "models": {"m": {"pool": "vllm", "upstream_model": "mock-model"}},
    })
    yield up, w
    up.stop()


def rid() -> str:
    return "wire62-" + uuid.uuid4().hex[:16]


def script(finish: str, request_id: str) -> dict:
    return {"x-script": f"vllm-finish-{finish}", "x-request-id": request_id}


def failures(w) -> float:
    return sum(v for n, labels, v in w.metrics()
               if n == "weir_upstream_failures_total" and labels.get("kind") == "protocol")


# --- Responses ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("finish", FAILED)
def test_responses_whole_answer_is_an_error(stack, finish):
    _, w = stack
    r = rid()
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as e:
        client.responses.create(model="m", input="hello", extra_headers=script(finish, r))
    assert e.value.status_code == 502
    err = e.value.response.json()["error"]
    assert err["code"] == "upstream_unfinished"
    assert f'finish_reason "{finish}"' in err["message"]
    line = w.log_for(r)
    assert line["status"] == 502 and line["error"] == {"source": "upstream", "code": "upstream_unfinished"}


@pytest.mark.parametrize("finish", FAILED)
def test_responses_stream_ends_failed(stack, finish):
    _, w = stack
    r = rid()
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=30)
    events = list(client.responses.create(model="m", input="hello", stream=True, extra_headers=script(finish, r)))
    types = [e.type for e in events]
    assert types[-1] == "response.failed", types
    assert "response.completed" not in types and "response.incomplete" not in types
    failed = events[-1].response
    assert failed.status == "failed"
    assert failed.error.code == "server_error"
    assert f'finish_reason "{finish}"' in failed.error.message
    # The text that came before the abort is in the failed response's output, and its usage is the upstream's.
    assert "hello" in json.dumps(failed.model_dump())
    assert failed.usage is not None and failed.usage.output_tokens == 3
    line = w.log_for(r)
    assert line["status"] == 200 and line["error"] == {"source": "upstream", "code": "upstream_unfinished"}
    assert line["completion_tokens"] == 3


# --- Anthropic Messages ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("finish", FAILED)
def test_messages_whole_answer_is_an_error(stack, finish):
    _, w = stack
    r = rid()
    client = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    with pytest.raises(anthropic.APIStatusError) as e:
        client.messages.create(model="m", max_tokens=16, messages=HELLO, extra_headers=script(finish, r))
    assert e.value.status_code == 502
    body = e.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert f'finish_reason "{finish}"' in body["error"]["message"]
    assert w.log_for(r)["error"] == {"source": "upstream", "code": "upstream_unfinished"}


@pytest.mark.parametrize("finish", FAILED)
def test_messages_stream_ends_with_an_error_event(stack, finish):
    _, w = stack
    r = rid()
    client = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    seen = []
    with pytest.raises(anthropic.APIStatusError) as e:
        with client.messages.stream(model="m", max_tokens=16, messages=HELLO, extra_headers=script(finish, r)) as s:
            for ev in s:
                seen.append(ev.type)
    assert f'finish_reason "{finish}"' in str(e.value)
    assert "message_delta" not in seen and "message_stop" not in seen, seen
    assert "content_block_delta" in seen  # (the text before the abort reached the client)
    line = w.log_for(r)
    assert line["status"] == 200 and line["error"] == {"source": "upstream", "code": "upstream_unfinished"}


def test_messages_stream_of_a_whole_generation_still_ends_with_end_turn(stack):
    _, w = stack
    client = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    with client.messages.stream(model="m", max_tokens=16, messages=HELLO,
                                extra_headers=script("stop", rid())) as s:
        final = s.get_final_message()
    assert final.stop_reason == "end_turn"


# --- Chat completions: vLLM's wire as it came, the failure logged ----------------------------------------------

@pytest.mark.parametrize("finish", FAILED)
def test_chat_stream_passes_the_value_and_logs_the_failure(stack, finish):
    _, w = stack
    r = rid()
    before = failures(w)
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=30)
    chunks = list(client.chat.completions.create(model="m", messages=HELLO, stream=True,
                                                 extra_headers=script(finish, r)))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [finish]
    line = w.log_for(r)
    assert line["status"] == 200 and line["error"] == {"source": "upstream", "code": "upstream_unfinished"}
    assert failures(w) == before + 1


@pytest.mark.parametrize("finish", FAILED)
def test_chat_whole_answer_passes_the_value_and_logs_the_failure(stack, finish):
    _, w = stack
    r = rid()
    before = failures(w)
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=30)
    c = client.chat.completions.create(model="m", messages=HELLO, extra_headers=script(finish, r))
    assert c.choices[0].finish_reason == finish
    line = w.log_for(r)
    assert line["status"] == 200 and line["error"] == {"source": "upstream", "code": "upstream_unfinished"}
    assert failures(w) == before + 1


def test_chat_stream_that_finished_logs_no_error(stack):
    _, w = stack
    r = rid()
    before = failures(w)
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=30, headers=script("length", r),
                      json={"model": "m", "messages": HELLO, "stream": True}) as resp:
        body = b"".join(resp.iter_bytes())
    assert b'"finish_reason":"length"' in body
    assert w.log_for(r)["error"] is None
    assert failures(w) == before


# --- /v1/models: max_model_len, as vLLM lists it ----------------------------------------------------------------

def test_models_list_the_configured_max_model_len(weir, mock):
    m = mock()
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"big": {"pool": "p", "upstream_model": "mock-model", "aliases": ["big-alias"],
                           "max_model_len": 131072},
                   "plain": {"pool": "p", "upstream_model": "mock-model"}},
    })
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=30)
    listed = {x.id: x.model_extra for x in client.models.list().data}
    assert listed["big"]["max_model_len"] == 131072
    assert listed["big-alias"]["max_model_len"] == 131072
    assert "max_model_len" not in listed["plain"]  # (not configured: none made up)
    assert client.models.retrieve("big").model_extra["max_model_len"] == 131072
    # Anthropic's shape has no such field: it is max_input_tokens there, with the fields its SDKs' ModelInfo
    # requires (the Java SDK's validate() refused a model without `lifecycle`); none where Weir does not know.
    a = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    assert "max_model_len" not in a.models.retrieve("big").model_dump()
    h = {"x-api-key": "x", "anthropic-version": "2023-06-01"}
    raw = {x["id"]: x for x in httpx.get(w.base_url + "/v1/models", headers=h, timeout=10).json()["data"]}
    for mid, want in (("big", 131072), ("big-alias", 131072), ("plain", None)):
        assert raw[mid]["lifecycle"] == "active" and raw[mid]["max_input_tokens"] == want, raw[mid]
        assert all(raw[mid][f] is None for f in ("max_tokens", "capabilities", "line", "deprecated_at",
                                                   "retires_at")), raw[mid]
    one = httpx.get(w.base_url + "/v1/models/big", headers=h, timeout=10).json()
    assert one["max_input_tokens"] == 131072 and one["lifecycle"] == "active", one


def test_models_quick_mode_passes_the_pools_own_max_model_len(weir, mock):
    m = mock()
    w = weir(m)
    up = httpx.get(m.base_url + "/v1/models", timeout=10).json()["data"][0]
    mine = httpx.get(w.v1 + "/models", timeout=10).json()["data"][0]
    assert "max_model_len" in up and mine["max_model_len"] == up["max_model_len"]
    h = {"anthropic-version": "2023-06-01"}
    theirs = httpx.get(w.base_url + "/v1/models", headers=h, timeout=10).json()["data"][0]
    assert theirs["max_input_tokens"] == up["max_model_len"] and theirs["lifecycle"] == "active", theirs


# --- Other servers' endings (regress62): only vLLM's three failure values fail ---------------------------------

@pytest.mark.parametrize("finish,stop_reason,status", [("eos_token", "end_turn", "completed"),
                                                       ("stop_sequence", "end_turn", "completed"),
                                                       ("model_length", "max_tokens", "incomplete"),
                                                       ("a_value_weir_does_not_know", "end_turn", "completed")])
def test_other_servers_endings_are_endings(stack, finish, stop_reason, status):
    # TGI's eos_token and stop_sequence, Mistral's model_length: an OpenAI-compatible pool's normal ends were
    # turned into 502s and failed streams when every value Weir did not know was a failure.
    _, w = stack
    a = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    r = rid()
    assert a.messages.create(model="m", max_tokens=16, messages=HELLO,
                             extra_headers=script(finish, r)).stop_reason == stop_reason
    assert w.log_for(r)["error"] is None
    r = rid()
    with a.messages.stream(model="m", max_tokens=16, messages=HELLO, extra_headers=script(finish, r)) as s:
        assert s.get_final_message().stop_reason == stop_reason
    o = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=30)
    r = rid()
    assert o.responses.create(model="m", input="hello", extra_headers=script(finish, r)).status == status
    r = rid()
    chunks = list(o.chat.completions.create(model="m", messages=HELLO, stream=True, extra_headers=script(finish, r)))
    assert any(c.choices and c.choices[0].finish_reason == finish for c in chunks)
    assert w.log_for(r)["error"] is None
