"""A request without `model` (or with null or "") on chat completions, completions and embeddings: vLLM answers it
with its served model, and Weir's vLLM routes (/tokenize, ...) already went to the default pool; these were a
400 "you must provide a model parameter". With a default pool (quick mode, or `default_pool`) the body now
goes to it unchanged; without one it stays the 400; a tenant or key restricted to some models may not send
one (403); Anthropic's Messages API and the Responses API require a model (400)."""
from __future__ import annotations

import hashlib
import json

from httpwire import assert_openai_error, request, roundtrip, sse_data
from test_defect_fixes import RawUpstream, completion_answer

MSG = [{"role": "user", "content": "hi"}]


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def post(port, path, body, **headers):
    return roundtrip(port, request("POST", path, body, headers))


def test_quick_mode_sends_a_model_less_request_to_the_upstream(weir, mock):
    m = mock()
    w = weir(upstream=m, workers=1)
    r = post(w.port, "/v1/chat/completions", {"messages": MSG, "max_tokens": 3}, **{"x-request-id": "nomodel-chat"})
    assert r.status == 200, r.body
    assert r.json()["model"] == "mock-model"  # the upstream's served model
    line = w.log_for("nomodel-chat")
    assert line["status"] == 200 and line["model"] is None and line["completion_tokens"] == 3
    r = post(w.port, "/v1/chat/completions", {"model": None, "messages": MSG, "max_tokens": 2, "stream": True})
    assert r.status == 200 and sse_data(r.body)[-1] == "[DONE]"
    assert post(w.port, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status == 200
    assert post(w.port, "/v1/embeddings", {"input": "hi"}).status == 200
    # Counted under the default pool's label, as a model it serves without a models: entry.
    assert w.metric("weir_requests_total", route="/v1/chat/completions", model="*", status="200") == 2


def test_the_body_goes_to_the_default_pool_unchanged(weir):
    seen = []

    def answer(headers, body):
        seen.append(body)
        return completion_answer(False)
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}},
                         "default_pool": "p"}, workers=1)
        body = json.dumps({"messages": MSG, "temperature": 0}).encode()
        r = roundtrip(w.port, request("POST", "/v1/chat/completions", body))
        assert r.status == 200, r.body
        # An empty model is vLLM's served model too (serving.py's _is_model_supported): it was a 400 here.
        empty = json.dumps({"model": "", "messages": MSG}).encode()
        r = roundtrip(w.port, request("POST", "/v1/chat/completions", empty))
        assert r.status == 200, r.body
        assert seen == [body, empty]
    finally:
        up.close()


def test_without_a_default_pool_it_is_still_the_400(weir, mock):
    m = mock()
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"mock-model": {"pool": "p"}}}, workers=1)
    for path, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "x"}),
                       ("/v1/embeddings", {"input": "x", "model": None}),
                       ("/v1/chat/completions", {"messages": MSG, "model": ""})):
        err = assert_openai_error(post(w.port, path, body), 400)
        assert err["param"] == "model" and "you must provide a model parameter" in err["message"], err


def test_a_tenant_restricted_to_some_models_may_not_send_one(weir, mock):
    m = mock()
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}}, "models": {"mock-model": {"pool": "p"}}, "default_pool": "p",
        "tenants": {"narrow": {"models": ["mock-model"]}, "wide": {}},
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
        "auth": {"api_keys": [{"id": "n1", "sha256": sha("sk-narrow"), "tenant": "narrow"},
                              {"id": "w1", "sha256": sha("sk-wide"), "tenant": "wide"},
                              {"id": "w2", "sha256": sha("sk-wide-key"), "tenant": "wide", "models": ["mock-model"]}]},
    }, workers=1)
    for key, who in (("sk-narrow", "tenant `narrow`"), ("sk-wide-key", "API key `w2`")):
        for path, body in (("/v1/chat/completions", {"messages": MSG}), ("/tokenize", {"prompt": "hi"})):
            r = post(w.port, path, body, authorization=f"Bearer {key}")
            err = assert_openai_error(r, 403, "model_not_allowed")
            assert who in err["message"], err
    # Naming the model it may use passes; a tenant that may use any model sends none, priced at `*`.
    assert post(w.port, "/v1/chat/completions", {"model": "mock-model", "messages": MSG},
                authorization="Bearer sk-narrow").status == 200
    r = post(w.port, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2}, authorization="Bearer sk-wide",
             **{"x-request-id": "nomodel-wide"})
    assert r.status == 200, r.body
    line = w.log_for("nomodel-wide")
    assert line["tenant"] == "wide" and line["model"] is None and line["spend_usd"] > 0, line


def test_anthropic_and_responses_still_require_a_model(weir, mock):
    m = mock()
    w = weir(upstream=m, workers=1)
    r = post(w.port, "/v1/messages", {"max_tokens": 5, "messages": MSG}, **{"anthropic-version": "2023-06-01"})
    assert r.status == 400 and r.json()["type"] == "error", r.body
    r = post(w.port, "/v1/responses", {"input": "hi"})
    assert_openai_error(r, 400)
    # A default pool that speaks Anthropic's Messages API has no served model: a chat request must name one.
    w = weir(config={"pools": {"a": {"endpoints": [m.base_url], "type": "anthropic"}}, "default_pool": "a"},
             workers=1)
    err = assert_openai_error(post(w.port, "/v1/chat/completions", {"messages": MSG}), 400)
    assert err["param"] == "model" and "Anthropic" in err["message"], err
