"""Transparency defects found at stop 49 by comparing vLLM direct with vLLM through Weir, and fixed."""
from __future__ import annotations

import json
import re

import httpx

from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hi"}]
HEX28 = re.compile(r"[0-9a-f]{28}")


def _ok(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)) + data


def _chat_answer(headers, body):
    return _ok({"id": "chatcmpl-" + headers.get("x-request-id", ""), "object": "chat.completion", "created": 1,
                "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                           "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


# DEFECT: vLLM's chat and completions take the body's `request_id` as the request's id when no X-Request-Id
# header names one (the response's chatcmpl-/cmpl- id, its logs); Weir always sent its own generated
# x-request-id, so a client's body request_id was silently lost: not in the answer's x-request-id, the access
# log, or the id vLLM ran the request under. It is now taken as a client's x-request-id header is: the answer's
# and the log's request_id, and upstream "<id>-<generated>" (two clients choosing one id never collide in vLLM).
def test_a_body_request_id_is_the_requests_id_on_chat_and_completions(mock, weir):
    m = mock("--ttft-ms", "0", "--itl-ms", "0")
    w = weir(upstream=m)
    cases = (("/chat/completions", {"messages": MSG}, "chatcmpl-"),
             ("/chat/completions", {"messages": MSG, "stream": True}, "chatcmpl-"),
             ("/completions", {"prompt": "hi"}, "cmpl-"))
    for i, (path, extra, prefix) in enumerate(cases):
        rid = f"my-trace-42.{i}"
        body = {"model": "mock-model", "max_tokens": 2, "request_id": rid, **extra}
        with httpx.stream("POST", w.v1 + path, json=body, headers={"x-mock-echo": "1"}, timeout=10) as r:
            text = r.read().decode()
            assert r.status_code == 200, text
            assert r.headers["x-request-id"] == rid, (path, extra, r.headers)
            sent = w.upstream_id(rid)  # "<rid>-<28 hex>", the log's upstream_request_id
            assert HEX28.fullmatch(sent[len(rid) + 1:]), sent
            assert r.headers["x-mock-request-id"] == sent
            ids = set(re.findall(r'"id":\s*"([^"]+)"', text))
            assert ids == {prefix + sent}, (path, extra, ids)
        assert w.log_for(rid)["status"] == 200
    # The same id twice: each request its own upstream id, and its own log line.
    for _ in range(2):
        r = httpx.post(w.v1 + "/chat/completions", timeout=10, headers={"x-mock-echo": "1"},
                       json={"model": "mock-model", "messages": MSG, "max_tokens": 2, "request_id": "twice"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "twice"
    lines = w.wait_log(lambda es: sum(e.get("request_id") == "twice" for e in es) == 2)
    ups = {e["upstream_request_id"] for e in lines if e.get("request_id") == "twice"}
    assert len(ups) == 2 and all(u.startswith("twice-") for u in ups), ups


# A header names the id vLLM would use (even one Weir does not take): the body's is then not read. A body id Weir
# would not take from a header (spaces, over 128 bytes, not a string) is not taken either: Weir generates one; a
# non-string goes as it came, the upstream's to refuse (vLLM's pydantic model: a 400). Embeddings: vLLM reads no
# body request_id there (its embeddings id comes from the header only), nor does Weir.
def test_a_body_request_id_yields_to_a_header_and_follows_the_headers_rules(mock, weir):
    m = mock("--ttft-ms", "0", "--itl-ms", "0")
    w = weir(upstream=m)

    def post(path, body, headers=None):
        return httpx.post(w.v1 + path, json={"model": "mock-model", **body}, timeout=10,
                          headers={"x-mock-echo": "1", **(headers or {})})
    chat = {"messages": MSG, "max_tokens": 2}
    r = post("/chat/completions", {**chat, "request_id": "from-body"}, {"x-request-id": "from-header"})
    assert r.headers["x-request-id"] == "from-header"
    assert r.json()["id"] == "chatcmpl-" + w.upstream_id("from-header")
    r = post("/chat/completions", {**chat, "request_id": "from-body-2"}, {"x-request-id": "has space"})
    assert r.status_code == 200 and HEX28.fullmatch(r.headers["x-request-id"]), r.headers
    for bad in ("has space", "x" * 129, ".", "é"):
        r = post("/chat/completions", {**chat, "request_id": bad})
        assert r.status_code == 200, r.text
        assert HEX28.fullmatch(r.headers["x-request-id"]), (bad, r.headers)
        assert r.headers["x-mock-request-id"] == r.headers["x-request-id"]
    # 128 bytes is still an id.
    r = post("/completions", {"prompt": "hi", "max_tokens": 2, "request_id": "k" * 128})
    assert r.headers["x-request-id"] == "k" * 128
    # Not a string: forwarded as it came; the mock (as vLLM) refuses it, and the id is Weir's own.
    r = post("/chat/completions", {**chat, "request_id": 7})
    assert r.status_code == 400 and "request_id" in r.text, r.text
    assert HEX28.fullmatch(r.headers["x-request-id"]), r.headers
    r = post("/embeddings", {"input": "hi", "request_id": "embedding-id"})
    assert r.status_code == 200, r.text
    assert HEX28.fullmatch(r.headers["x-request-id"]), r.headers


# A retry after a body-named id carries the upstream id with "-N" after it, as a header-named id's does.
def test_a_body_request_ids_retries_carry_their_own_upstream_ids(weir):
    seen = []

    def answer(headers, body):
        seen.append(headers.get("x-request-id"))
        return b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url], "retry": {"attempts": 3}}},
                         "models": {"m": {"pool": "p"}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       json={"model": "m", "messages": MSG, "request_id": "retried"})
        assert r.status_code == 503 and r.headers["x-request-id"] == "retried", r.text
        assert len(seen) == 3 and seen[0].startswith("retried-") and HEX28.fullmatch(seen[0][8:]), seen
        assert seen[1:] == [seen[0] + "-1", seen[0] + "-2"], seen
        assert w.log_for("retried")["upstream_request_id"] == seen[0]
    finally:
        up.close()


# DEFECT: a count given as a numeric string ("max_tokens": "3", n, best_of, max_completion_tokens) got Weir's own
# 400, though vLLM's pydantic models (lax mode) read "3" as 3. Weir now reads such a string as pydantic does
# (api::lax_int) and refuses only what pydantic refuses; the body goes upstream as it came.
def test_counts_given_as_numeric_strings_are_read_as_vllm_reads_them(weir):
    bodies = []

    def answer(headers, body):
        bodies.append(body)
        return _chat_answer(headers, body)
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}}}, workers=1)
        for extra in ({"max_tokens": "3"}, {"max_completion_tokens": " 1_000 "}, {"n": "2"}, {"best_of": "4.0"},
                      {"max_tokens": "+3", "n": "1"}):
            sent = json.dumps({"model": "m", "messages": MSG, **extra}).encode()
            r = httpx.post(w.v1 + "/chat/completions", content=sent, timeout=10,
                           headers={"content-type": "application/json"})
            assert r.status_code == 200, (extra, r.text)
            assert bodies[-1] == sent  # as it came
        # What pydantic refuses, Weir still refuses itself (no round trip), naming the field.
        for extra in ({"max_tokens": "3.5"}, {"n": "0"}, {"best_of": "3e0"}, {"max_completion_tokens": ""},
                      {"max_tokens": "-3"}):
            before = len(bodies)
            r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG, **extra}, timeout=10)
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["param"] == next(iter(extra)), r.text
            assert len(bodies) == before
    finally:
        up.close()
