"""Weir reads a request body as the upstream will (stop 53's parser-differential findings).

A member name Weir does not read but that a server matching names in any case would read as one it does
(Go's encoding/json, which Ollama's and LocalAI's OpenAI layers use: case-insensitive, and U+017F / U+212A
fold to s / k) made Weir route, allow and charge one request while the upstream ran another: with a tenant
allowed `good` only, {"model":"good","Model":"bad"} ran `bad`; "MAX_TOKENS": 900 beside "max_tokens": 5
generated 900 tokens against a reservation of 5. Such a body is refused, on every JSON route, before it
reaches a pool. And a number beyond a double's range (1e400) is refused on chat and completions as on the
translated routes (Python's json reads it as inf, other parsers refuse it).
"""

from __future__ import annotations

import hashlib
import httpx
import pytest

KEY = "sk-parse53-tenant-key"


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    w = module_weir(config={
        "pools": {"gpu": {"endpoints": [m.base_url]}},
        "models": {"good": {"pool": "gpu"}, "bad": {"pool": "gpu"}},
        "tenants": {"t1": {"models": ["good"]}},
        "auth": {"api_keys": [{"id": "k1", "sha256": sha(KEY), "tenant": "t1"}]},
    })
    return m, w


def post(w, path: str, raw: str) -> httpx.Response:
    return httpx.post(w.base_url + path, content=raw.encode(), timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})


CHAT = '"messages":[{"role":"user","content":"hi"}]'


@pytest.mark.parametrize("path,raw,name", [
    ("/v1/chat/completions", '{"model":"good","Model":"bad",' + CHAT + '}', "Model"),
    ("/v1/chat/completions", '{"model":"good","MODEL":"bad",' + CHAT + '}', "MODEL"),
    ("/v1/chat/completions", '{"model":"good","max_tokens":5,"MAX_TOKENS":900,' + CHAT + '}', "MAX_TOKENS"),
    ("/v1/chat/completions", '{"model":"good","\\u017ftream":true,' + CHAT + '}', "\u017ftream"),
    ("/v1/chat/completions", '{"model":"good","max_to\\u212aens":900,' + CHAT + '}', "max_to\u212aens"),
    ("/v1/chat/completions",
     '{"model":"good","stream":true,"stream_options":{"Include_Usage":false},' + CHAT + '}', "Include_Usage"),
    ("/v1/completions", '{"model":"good","prompt":"p","Prompt":"other"}', "Prompt"),
    ("/v1/embeddings", '{"model":"good","input":"p","Model":"bad"}', "Model"),
])
def test_a_member_that_folds_to_one_weir_reads_is_refused(stack, path, raw, name):
    _, w = stack
    r = post(w, path, raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == name, err
    assert "case-sensitive" in err["message"], err


def test_the_refused_body_never_reaches_the_upstream_and_a_plain_one_does(stack):
    m, w = stack
    before = m.metric("vllm:e2e_request_latency_seconds_count")
    r = post(w, "/v1/chat/completions", '{"model":"good","Model":"bad",' + CHAT + '}')
    assert r.status_code == 400
    line = w.log_for(r.headers["x-request-id"])
    assert line["status"] == 400 and line.get("pool") in (None, ""), line
    # Names Weir reads exactly, names of no field, and the same letters deeper in the body are the client's.
    ok = post(w, "/v1/chat/completions",
              '{"model":"good","user":"u","Top_P":1,"metadata":{"MODEL":"x"},'
              '"messages":[{"role":"user","content":"hi","Model":"x"}]}')
    assert ok.status_code == 200, ok.text
    assert m.metric("vllm:e2e_request_latency_seconds_count") == before + 1  # the refused one never went


@pytest.mark.parametrize("path,raw", [
    ("/v1/chat/completions", '{"model":"good","temperature":1e400,' + CHAT + '}'),
    ("/v1/completions", '{"model":"good","prompt":"p","top_p":-1e999}'),
])
def test_a_number_beyond_a_double_is_refused_on_every_route(stack, path, raw):
    _, w = stack
    r = post(w, path, raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
