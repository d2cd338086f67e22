"""vLLM's other routes through Weir (docs/protocols.md, "vLLM routes"): /tokenize, /detokenize,
/rerank (three paths), /score, /pooling, /classify routed by the body's `model` like the API
routes, and GET /version to the default pool; with the same auth, limits and one log line each."""

from __future__ import annotations

import hashlib

import httpx
import pytest

ROUTES = [
    ("/tokenize", {"prompt": "one two three"}, lambda j: j["count"] >= 3),
    ("/detokenize", {"tokens": [1, 2, 3]}, lambda j: j["prompt"] == "w w w"),
    ("/rerank", {"query": "q", "documents": ["a", "b c"]}, lambda j: len(j["results"]) == 2),
    ("/v1/rerank", {"query": "q", "documents": ["a", "b c"], "top_n": 1}, lambda j: len(j["results"]) == 1),
    ("/v2/rerank", {"query": "q", "documents": ["a"]}, lambda j: j["results"][0]["index"] == 0),
    ("/score", {"text_1": "a", "text_2": ["b", "c"]}, lambda j: [d["index"] for d in j["data"]] == [0, 1]),
    ("/v1/score", {"text_1": "a", "text_2": "b"}, lambda j: j["data"][0]["object"] == "score"),
    ("/pooling", {"input": "hello there"}, lambda j: j["data"][0]["object"] == "pooling"),
    ("/classify", {"input": ["good", "bad"]}, lambda j: len(j["data"]) == 2),
]


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def served(mock, weir):
    m = mock("--model", "mock-embed")
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"embed": {"pool": "p", "upstream_model": "mock-embed"}},
        "tenants": {"acme": {"limits": {"requests_per_minute": 1000}}},
        "auth": {"api_keys": [{"id": "acme-1", "sha256": sha("sk-acme"), "tenant": "acme"}]},
    }, workers=1)  # one worker: the log lines come in request order
    return m, w


@pytest.mark.parametrize("path,body,check", ROUTES, ids=[r[0] for r in ROUTES])
def test_each_route_is_routed_by_model_with_auth_and_one_log_line(served, path, body, check):
    m, w = served
    auth = {"authorization": "Bearer sk-acme"}
    r = httpx.post(w.base_url + path, json={"model": "embed", **body}, headers=auth, timeout=10)
    assert r.status_code == 200, r.text
    assert check(r.json()), r.text
    assert r.headers.get("x-request-id")
    # the model was renamed for the upstream (the mock serves only mock-embed)
    if "model" in r.json():
        assert r.json()["model"] == "mock-embed"
    # without a key: 401 in OpenAI's shape, nothing reaches the mock
    r = httpx.post(w.base_url + path, json={"model": "embed", **body}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # an unknown model: 404 from Weir
    r = httpx.post(w.base_url + path, json={"model": "nope", **body}, headers=auth, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # no model and no default pool: 400 naming it
    r = httpx.post(w.base_url + path, json=body, headers=auth, timeout=10)
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    # the wrong method: 405 with Allow
    r = httpx.get(w.base_url + path, headers=auth, timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    entries = w.wait_log(lambda es: len(es) >= 5)
    assert [e["status"] for e in entries] == [200, 401, 404, 400, 405]
    assert entries[0]["path"] == path and entries[0]["model"] == "embed" and entries[0]["pool"] == "p"
    assert all(e["upstream_ms"] is None for e in entries[1:]), "none of them reached the upstream"


def test_usage_reaches_the_log(served):
    _, w = served
    auth = {"authorization": "Bearer sk-acme"}
    r = httpx.post(w.base_url + "/v1/score", json={"model": "embed", "text_1": "a b", "text_2": "c"},
                   headers=auth, timeout=10)
    assert r.status_code == 200
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["prompt_tokens"] == r.json()["usage"]["prompt_tokens"] == 3


def test_quick_mode_passes_them_through_with_or_without_a_model(mock, weir):
    m = mock()
    w = weir(upstream=m, workers=1)
    r = httpx.post(w.base_url + "/tokenize", json={"prompt": "a b c"}, timeout=10)
    assert r.status_code == 200 and r.json()["count"] >= 3
    r = httpx.post(w.base_url + "/tokenize", json={"model": "mock-model", "prompt": "a b c"}, timeout=10)
    assert r.status_code == 200
    r = httpx.get(w.base_url + "/version", timeout=10)
    assert r.status_code == 200 and r.json() == {"version": "0.10.1"}
    # the upstream's own validation error passes through
    r = httpx.post(w.base_url + "/rerank", json={"documents": ["a"]}, timeout=10)
    assert r.status_code == 400
    entries = w.wait_log(lambda es: len(es) >= 4)
    assert [e["path"] for e in entries] == ["/tokenize", "/tokenize", "/version", "/rerank"]


def test_version_needs_the_key_when_auth_is_on(served):
    _, w = served
    assert httpx.get(w.base_url + "/version", timeout=10).status_code == 401
    r = httpx.get(w.base_url + "/version", headers={"authorization": "Bearer sk-acme"}, timeout=10)
    assert r.status_code == 200 and r.json()["version"]
