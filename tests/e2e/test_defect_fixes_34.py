"""Defects found in stop 34 (a review of stops 33-34's diff and a black-box round against it):
a 2xx that is no answer Weir can read falls back on every route, as a 5xx does."""
from __future__ import annotations

import json

import httpx
import pytest

from test_defect_fixes import RawUpstream

COMPLETION = json.dumps({
    "id": "chatcmpl-34", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()


def answer(fields: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + fields + b"Content-Length: %d\r\n\r\n" % len(body) + body


CASES = {
    "br": answer(b"Content-Type: application/json\r\nContent-Encoding: br\r\n", b"\x0b\x02\x80brotli-ish bytes"),
    "html": answer(b"Content-Type: text/html\r\n", b"<html><body>502 from a load balancer</body></html>"),
}

ROUTES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/tokenize", {"prompt": "hi"}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/v1/responses", {"input": "hi"}),
]


@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    backup = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    ups = {case: RawUpstream(lambda headers, body, data=data: data) for case, data in CASES.items()}
    pools = {f"bad-{case}": {"endpoints": [up.url]} for case, up in ups.items()}
    pools["backup"] = {"endpoints": [backup.base_url]}
    models = {f"with-fallback-{case}": {"pool": f"bad-{case}", "upstream_model": "m",
                                        "fallbacks": [{"pool": "backup", "upstream_model": "mock-model"}]}
              for case in CASES}
    models |= {f"alone-{case}": {"pool": f"bad-{case}", "upstream_model": "m"} for case in CASES}
    w = module_weir(config={"pools": pools, "models": models, "default_pool": "backup"}, workers=1)
    yield w
    for up in ups.values():
        up.close()


def post(w, path: str, body: dict, model: str, rid: str) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{w.port}{path}", json=body | {"model": model}, timeout=10,
                      headers={"x-request-id": rid, "accept-encoding": "br, gzip", "anthropic-version": "2023-06-01"})


@pytest.mark.parametrize("fallback", [True, False], ids=["with-fallback", "alone"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("path,body", ROUTES, ids=[p for p, _ in ROUTES])
def test_a_2xx_that_is_no_answer_falls_back_else_is_a_502(gw, case, path, body, fallback):
    model = f"with-fallback-{case}" if fallback else f"alone-{case}"
    rid = f"{model}-{path.strip('/').replace('/', '-')}"
    r = post(gw, path, body, model, rid)
    line = gw.log_for(rid)
    if fallback:
        assert r.status_code == 200, (r.status_code, r.text[:300])
        assert line["pool"] == "backup" and line["retries"] == 1, line
        assert [a["pool"] for a in line["attempts"]] == [f"bad-{case}", "backup"], line
        return
    # Without one: a 502 in the client's dialect.
    assert r.status_code == 502, (r.status_code, r.text[:300])
    if path == "/v1/messages":
        assert r.json()["type"] == "error", r.text
    else:
        assert r.json()["error"]["code"] == "upstream_invalid_response", r.text
    assert line["status"] == 502
