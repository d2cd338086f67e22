"""Defects found in stop 40's black-box rounds: micro-batch and coalesce framing of multi-line SSE data (a budget
bypass), streams made from a whole answer and their counts, in-band errors (`"error": null`, vLLM's old shape, billed
as a token), fallbacks whose target cannot take the request, the Responses API on an Anthropic pool, empty 2xx
answers to translated routes, Anthropic's adaptive thinking, and credentials from the environment."""
from __future__ import annotations

import hashlib
import json
import subprocess
import time

import httpx
import pytest

from conftest import binary, wait_until
from test_batching import in_parallel
from test_defect_fixes import RawUpstream

KEY = "sk-test-40-0123456789abcdef"
AUTH = {"authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "hi"}]


def governed(pools: dict, models: dict | None = None, budget_usd: float = 100000, **extra) -> dict:
    # $1 a prompt token and $1 a completion token: spend_usd counts the tokens a request is charged.
    cfg = {"pools": pools, "pricing": {"*": {"input": 1000000, "output": 1000000}},
           "tenants": {"t": {"budget": {"usd": budget_usd}}},
           "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                                                    "tenant": "t"}]}}
    if models:
        cfg["models"] = models
    else:
        cfg["default_pool"] = next(iter(pools))
    cfg.update(extra)
    return cfg


def chunk(content=None, role=None, finish=None, idx=0, **top) -> dict:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {**top, "id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": idx, "delta": delta, "finish_reason": finish}]}


def sse_answer(events: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(events)
            + events)


def json_answer(doc: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(doc) + doc


def two_line_event(obj: dict) -> bytes:
    # One JSON value on two `data:` lines: WHATWG SSE joins them with a line feed.
    s = json.dumps(obj)
    k = s.index(", ")
    return f"data: {s[:k + 1]}\ndata: {s[k + 2:]}\n\n".encode()


def data_lines(text: str) -> list[str]:
    # Each event's data (its `data:` lines joined by line feeds, WHATWG SSE). Every non-empty line must be a
    # field: a JSON continuation line without `data: ` is none.
    bad = [ln for ln in text.split("\n") if ln and not ln.startswith(("data:", ":", "event:", "id:", "retry:"))]
    assert not bad, bad[:3]
    out = []
    for block in text.split("\n\n"):
        lines = [ln[6:] if ln.startswith("data: ") else ln[5:] for ln in block.split("\n") if ln.startswith("data:")]
        if lines:
            out.append("\n".join(lines))
    return out


def test_a_coalesced_stream_keeps_multi_line_events_framed_and_is_charged(weir):
    # Coalesce wrote "data: " + data by hand: a joined `\n` became a line of no field, every chunk broke for the
    # client, the usage chunk leaked, and the request was charged $0 (a budget bypass).
    events = [chunk("", role="assistant")] + [chunk(w) for w in ("Hel", "lo")] + [chunk("", finish="stop")]
    usage = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}}
    body = b"".join(two_line_event(e) for e in events + [usage]) + b"data: [DONE]\n\n"
    up = RawUpstream(lambda h, b: sse_answer(body))
    try:
        w = weir(config=governed({"p": {"endpoints": [up.url], "coalesce": True}}), workers=1)
        r = httpx.post(w.v1 + "/chat/completions", headers={**AUTH, "x-request-id": "co-ml"}, timeout=10,
                       json={"model": "m", "messages": MSG, "stream": True, "temperature": 0})
        assert r.status_code == 200, r.text
        datas = data_lines(r.text)
        assert datas[-1] == "[DONE]", datas
        chunks = [json.loads(d) for d in datas[:-1]]  # each event's lines join into its JSON again
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello"
        assert all(c["choices"] for c in chunks), "the usage chunk Weir asked for reached the client"
        line = w.log_for("co-ml")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (7, 4), line
        assert line["spend_usd"] == pytest.approx(11), line
        # The SDK reads the same stream.
        from openai import OpenAI
        c = OpenAI(base_url=w.v1, api_key=KEY, max_retries=0)
        text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="m", messages=MSG, stream=True, temperature=0) if ch.choices)
        assert text == "Hello"
    finally:
        up.close()


def test_micro_batch_members_keep_multi_line_events_framed(weir):
    def answer(headers, body) -> bytes:
        prompts = json.loads(body)["prompt"]
        n = len(prompts) if isinstance(prompts, list) else 1
        out = b""
        for i in range(n):
            for text, finish in (("a", None), ("b", "length")):
                out += two_line_event({"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "m",
                                       "choices": [{"index": i, "text": text, "finish_reason": finish}],
                                       "usage": None})
        return sse_answer(out + b"data: [DONE]\n\n")
    up = RawUpstream(answer)
    try:
        w = weir(config=governed({"b": {"endpoints": [up.url], "batch": {"window": "1s", "max_size": 2}}}),
                 workers=1)
        got = in_parallel(lambda i: httpx.post(
            w.v1 + "/completions", timeout=15, headers={**AUTH, "x-request-id": f"bm-{i}"},
            json={"model": "m", "prompt": f"p{i}", "max_tokens": 2, "stream": True}), [(0,), (1,)])
        for i, r in enumerate(got):
            assert r.status_code == 200, r.text
            datas = data_lines(r.text)
            assert datas[-1] == "[DONE]", datas
            assert "".join(json.loads(d)["choices"][0]["text"] for d in datas[:-1]) == "ab"
            line = w.log_for(f"bm-{i}")
            assert line["events"] == 3 and line["spend_usd"] > 0, line
        assert max(w.log_for(f"bm-{i}").get("batch", {}).get("size", 0) for i in range(2)) == 2
    finally:
        up.close()


def test_a_stream_made_from_a_whole_answer_is_counted_as_one(weir):
    # An upstream that answered JSON to stream: true: the client got its chunk and [DONE], the log said events 0,
    # ttft_ms null, and neither metric counted it.
    doc = json.dumps({"id": "chatcmpl-w", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                                   "finish_reason": "stop"}]}).encode()
    up = RawUpstream(lambda h, b: json_answer(doc))
    try:
        w = weir(config=governed({"p": {"endpoints": [up.url]}}), workers=1)
        before = (w.metric("weir_sse_events_total"), w.metric("weir_time_to_first_token_seconds_count"))
        r = httpx.post(w.v1 + "/chat/completions", headers={**AUTH, "x-request-id": "whole"}, timeout=10,
                       json={"model": "m", "messages": MSG, "stream": True})
        assert r.status_code == 200 and "Hello there" in r.text, r.text
        line = w.log_for("whole")
        assert line["events"] == 2 and line["ttft_ms"] is not None, line
        assert line["completion_tokens"] is None
        # No usage: charged the prompt estimate and one token for the one content event, as a relayed stream.
        prompt = line["spend_usd"] - 1
        assert prompt >= 1 and prompt == round(prompt), line
        after = (w.metric("weir_sse_events_total"), w.metric("weir_time_to_first_token_seconds_count"))
        assert (after[0] - before[0], after[1] - before[1]) == (2, 1)
        # A translated client's stream counts the upstream's chat events it was made from (docs/observability.md):
        # the one chunk and its end.
        r = httpx.post(w.base_url + "/v1/messages", headers={**AUTH, "x-request-id": "whole-a"}, timeout=10,
                       json={"model": "m", "max_tokens": 5, "messages": MSG, "stream": True})
        assert r.status_code == 200 and "Hello there" in r.text and "message_stop" in r.text, r.text
        line = w.log_for("whole-a")
        assert line["events"] == 2 and line["ttft_ms"] is not None, line
    finally:
        up.close()


def test_an_in_band_error_event_is_not_billed_as_a_token(weir):
    tokens = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                      for c in (chunk("", role="assistant"), chunk("a"), chunk("b")))
    err = b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n'
    answers = {"cut": [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + tokens, None],
               "error": sse_answer(tokens + err)}
    up = RawUpstream(lambda h, b: answers[json.loads(b)["user"]])
    try:
        w = weir(config=governed({"p": {"endpoints": [up.url]}}), workers=1)
        spend = {}
        for case in answers:
            httpx.post(w.v1 + "/chat/completions", headers={**AUTH, "x-request-id": f"ib-{case}"}, timeout=10,
                       json={"model": "m", "messages": MSG, "stream": True, "user": case})
            spend[case] = w.log_for(f"ib-{case}")["spend_usd"]
        assert spend["error"] == spend["cut"], spend  # two tokens each; the error event is none
    finally:
        up.close()


@pytest.mark.parametrize("falsy", [None, False, 0, "", {}, []], ids=repr)
def test_a_chunk_with_a_falsy_error_member_is_no_error(weir, falsy):
    # `{"error": null, ...}` (first: the member the cheap test looks at) is a chunk like any other: the openai SDK
    # raises only on a truthy `error`. The stream was cut at it (at false, 0, "", {} and [] after the first fix).
    events = [chunk("", role="assistant", error=falsy)] + [chunk(t, error=falsy) for t in ("Hel", "lo")]
    events.append(chunk("", finish="stop", error=falsy))
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    up = RawUpstream(lambda h, b: sse_answer(body))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}, "q": {"endpoints": [up.url]}},
                         "models": {"m": {"pool": "p", "fallbacks": [{"pool": "q"}]}, "n": {"pool": "p"}}}, workers=1)
        for model in ("m", "n"):  # held (a fallback left) and not
            r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": f"en-{model}"}, timeout=10,
                           json={"model": model, "messages": MSG, "stream": True})
            datas = data_lines(r.text)
            assert datas[-1] == "[DONE]"
            assert "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in datas[:-1]) == "Hello"
            line = w.log_for(f"en-{model}")
            assert line["status"] == 200 and line.get("error") is None, line
        # The Anthropic and Responses clients' translations read it the same way.
        r = httpx.post(w.base_url + "/v1/messages", timeout=10,
                       json={"model": "n", "max_tokens": 5, "messages": MSG, "stream": True})
        assert "event: error" not in r.text and "message_stop" in r.text and '"Hel"' in r.text, r.text
        r = httpx.post(w.v1 + "/responses", timeout=10, json={"model": "n", "input": "hi", "stream": True})
        assert "response.completed" in r.text and "response.failed" not in r.text, r.text
    finally:
        up.close()


def test_vllms_old_error_chunk_keeps_its_message_on_translated_streams(weir):
    body = b'data: {"object": "error", "message": "old style boom", "type": "BadRequestError", "code": 400}\n\n'
    up = RawUpstream(lambda h, b: sse_answer(body + b"data: [DONE]\n\n"))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        r = httpx.post(w.base_url + "/v1/messages", timeout=10,
                       json={"model": "m", "max_tokens": 5, "messages": MSG, "stream": True})
        assert "old style boom" in r.text, r.text
        assert "message_start" not in r.text and r.text.count("event: error") == 1, r.text
        r = httpx.post(w.v1 + "/responses", timeout=10, json={"model": "m", "input": "hi", "stream": True})
        assert "old style boom" in r.text and r.text.count("response.failed") >= 1, r.text
    finally:
        up.close()


def anthropic_fallback_config(a_url: str, b_url: str) -> dict:
    return {"pools": {"a": {"endpoints": [a_url]}, "b": {"endpoints": [b_url]},
                      "claude": {"type": "anthropic", "endpoints": [a_url]}},
            "models": {"m": {"pool": "a", "fallbacks": [{"model": "c"}]}, "c": {"pool": "claude"},
                       "c2": {"pool": "claude", "fallbacks": [{"model": "ok"}]}, "ok": {"pool": "b"}}}


def test_a_fallback_that_cannot_take_the_request_leaves_the_upstreams_answer(mock, weir):
    # Pool a answered 503; its fallback (an Anthropic pool) cannot express response_format json_object. The
    # client got that pool's 400 (not retryable, blaming it) and the log lost a's attempt.
    doc = b'{"error": {"message": "overloaded", "type": "server_error"}}'
    up = RawUpstream(lambda h, b: b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(doc) + doc)
    ok = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    try:
        w = weir(config=anthropic_fallback_config(up.url, ok.base_url), workers=1)
        fmt = {"response_format": {"type": "json_object"}}
        r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": "fb-un"}, timeout=10,
                       json={"model": "m", "messages": MSG, **fmt})
        assert r.status_code == 503 and r.headers.get("retry-after"), (r.status_code, r.text)
        line = w.log_for("fb-un")
        assert line["status"] == 503 and line["pool"] == "a", line
        # An Anthropic primary that cannot take it is passed over for a fallback that can.
        fallbacks = w.metric("weir_upstream_fallbacks_total")
        r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": "fb-pri"}, timeout=10,
                       json={"model": "c2", "messages": MSG, **fmt})
        assert r.status_code == 200, r.text
        line = w.log_for("fb-pri")
        assert line["pool"] == "b" and not line.get("retries"), line  # nothing was sent to the passed-over pool
        assert w.metric("weir_upstream_fallbacks_total") == fallbacks
        # With nothing to pass over to, the 400 says why.
        r = httpx.post(w.v1 + "/chat/completions", json={"model": "c", "messages": MSG, **fmt}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    finally:
        up.close()


def test_responses_refused_for_an_anthropic_pool_name_the_requests_own_fields(weir):
    up = RawUpstream(lambda h, b: None)
    try:
        w = weir(config={"pools": {"claude": {"type": "anthropic", "endpoints": [up.url]}},
                         "default_pool": "claude"}, workers=1)
        for body, param in (({"text": {"format": {"type": "json_object"}}}, "text"),
                            ({"max_output_tokens": 500, "reasoning": {"effort": "high"}}, "max_output_tokens")):
            r = httpx.post(w.v1 + "/responses", json={"model": "c", "input": "hi", **body}, timeout=10)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == param, r.text
    finally:
        up.close()


def test_a_whole_response_without_usage_says_null(weir):
    doc = json.dumps({"id": "chatcmpl-n", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                   "finish_reason": "stop"}]}).encode()
    up = RawUpstream(lambda h, b: json_answer(doc))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        r = httpx.post(w.v1 + "/responses", json={"model": "m", "input": "hi"}, timeout=10)
        assert r.status_code == 200 and r.json()["usage"] is None, r.text
    finally:
        up.close()


@pytest.mark.parametrize("route,body", [
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": MSG}),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": MSG, "stream": True}),
    ("/v1/responses", {"model": "m", "input": "hi"}),
    ("/v1/responses", {"model": "m", "input": "hi", "stream": True}),
])
def test_an_empty_2xx_is_no_answer_for_a_translated_route(weir, route, body):
    up = RawUpstream(lambda h, b: b"HTTP/1.1 204 No Content\r\n\r\n")
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        r = httpx.post(w.base_url + route, json=body, headers={"x-request-id": "e204"}, timeout=10)
        assert r.status_code == 502, (r.status_code, r.text)
        assert w.log_for("e204")["status"] == 502
    finally:
        up.close()


def test_an_empty_2xx_to_a_messages_stream_on_an_anthropic_pool_falls_back(weir):
    # A 204 passed to the streaming client (the Anthropic SDK's stream helper failed) and never fell back, where
    # an empty 200 was already no answer.
    msg = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "c",
                      "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                      "usage": {"input_tokens": 1, "output_tokens": 1}}).encode()
    empty = RawUpstream(lambda h, b: b"HTTP/1.1 204 No Content\r\n\r\n")
    whole = RawUpstream(lambda h, b: json_answer(msg))
    try:
        w = weir(config={"pools": {"c1": {"type": "anthropic", "endpoints": [empty.url]},
                                   "c2": {"type": "anthropic", "endpoints": [whole.url]}},
                         "models": {"solo": {"pool": "c1"}, "fb": {"pool": "c1", "fallbacks": [{"pool": "c2"}]}}},
                 workers=1)
        body = {"max_tokens": 5, "messages": MSG, "stream": True}
        r = httpx.post(w.base_url + "/v1/messages", json={"model": "solo", **body}, timeout=10)
        assert r.status_code == 502, (r.status_code, r.text)
        r = httpx.post(w.base_url + "/v1/messages", json={"model": "fb", **body}, timeout=10)
        assert r.status_code == 200 and "message_stop" in r.text and '"ok"' in r.text, r.text
    finally:
        empty.close()
        whole.close()


def test_adaptive_thinking_is_thinking_on(weir):
    seen = []

    def answer(headers, body) -> bytes:
        seen.append(json.loads(body))
        doc = json.dumps({"id": "chatcmpl-t", "object": "chat.completion", "created": 1, "model": "m",
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                       "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        return json_answer(doc)
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        import anthropic
        c = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0)
        m = c.messages.create(model="m", max_tokens=2048, messages=MSG, thinking={"type": "adaptive"})
        assert m.content[0].text == "ok"
        assert seen[-1]["chat_template_kwargs"] == {"enable_thinking": True}
        r = httpx.post(w.base_url + "/v1/messages", timeout=10,
                       json={"model": "m", "max_tokens": 5, "messages": MSG, "thinking": {"type": "sometimes"}})
        assert r.status_code == 400 and "adaptive" in r.text, r.text
    finally:
        up.close()


@pytest.mark.parametrize("section", ["admin", "key"])
def test_a_credential_from_the_environment_that_no_request_can_carry_is_refused(tmp_path, section):
    # A secret made from a file ends in a line feed; HTTP strips it, so the hashed value could never be presented.
    if section == "admin":
        cfg = "admin: {listen: 127.0.0.1:0, token_env: W40_SECRET}\n"
    else:
        cfg = ("tenants: {t: {}}\nauth: {required: true, api_keys: [{id: k, key_env: W40_SECRET, tenant: t}]}\n")
    path = tmp_path / "w.yaml"
    path.write_text("listen: 127.0.0.1:0\npools: {p: {endpoints: ['http://127.0.0.1:9']}}\ndefault_pool: p\n" + cfg)
    import os
    for value, code in (("sk-from-a-file-0123456789\n", 2), ("sk-from-a-file-0123456789", 0)):
        r = subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                           timeout=10, env={**os.environ, "W40_SECRET": value})
        assert r.returncode == code, (value, r.stdout, r.stderr)
        if code:
            assert "W40_SECRET" in r.stderr and "line break" in r.stderr, r.stderr


def test_a_redis_key_record_expired_at_zero_stays_expired_through_the_admin_api(mock, weir, redis):
    # The request path reads expires_at "0" as 1970 (expired); the admin API read it as "never", showed the key
    # as live, and a PATCH of its name rewrote the expiry away, bringing the key back.
    from conftest import free_port, wait_until
    from test_admin_api import ENV, MOCK_FLAGS, Admin, _ready, redis_config
    m = mock(*MOCK_FLAGS)
    port = free_port()
    w = weir(config=redis_config(m, redis, port), env=ENV)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    key = "sk-weir-test-40-epoch"
    redis.cli("HSET", f"weir-admin-{redis.port}:key:" + hashlib.sha256(key.encode()).hexdigest(),
              "id", "epoch-40", "tenant", "acme", "expires_at", "0")

    def chat() -> int:
        return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=10,
                          json={"model": "m", "messages": MSG}).status_code
    assert chat() == 401
    got = admin("GET", "/admin/v1/keys/epoch-40").json()
    assert got["expired"] is True and got["expires_at"] is not None, got
    assert admin("PATCH", "/admin/v1/keys/epoch-40", json={"name": "renamed"}).status_code == 200
    time.sleep(0.5)  # past the key cache TTL (300 ms)
    assert chat() == 401


def test_with_redis_a_budget_whose_period_changes_keeps_the_spend_of_requests_in_flight(mock, weir, redis):
    # A reload that moved a tenant's budget to another period carried only settled spend: a stream in flight
    # settled into the old period's hash, and the new period admitted its whole budget beside it.
    import threading
    from test_config_reload import sighup
    m = mock("--any-model", "--ttft-ms", "1", "--itl-ms", "100")
    cfg = governed({"p": {"endpoints": [m.base_url]}}, budget_usd=30,
                   redis={"url": redis.url, "key_prefix": f"w40-{redis.port}:"})
    w = weir(config=cfg, workers=1)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", httpx.post(
        w.v1 + "/chat/completions", headers=AUTH, timeout=30,
        json={"model": "m", "messages": MSG, "max_tokens": 20, "stream": True})))
    t.start()
    wait = time.monotonic() + 5
    while w.metric("weir_active_streams") < 1 and time.monotonic() < wait:
        time.sleep(0.02)
    text = w.config_path.read_text()
    assert text.count('"usd": 30\n') == 1, text  # as conftest.to_yaml writes the budget
    w.config_path.write_text(text.replace('"usd": 30\n', '"usd": 30\n      "period": "day"\n'))
    sighup(w)
    t.join()
    assert got["r"].status_code == 200
    # The stream's ~$25 (its prompt and 20 tokens) is the new period's too: a request whose worst case is
    # 11 tokens more does not fit in the $30.
    codes = [httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                        json={"model": "m", "messages": MSG, "max_tokens": 8}).status_code for _ in range(3)]
    assert codes == [429, 429, 429], codes


# --- the second round: vLLM's routes, configuration ---


def test_embeddings_of_messages_and_media_are_estimated_as_their_texts(weir):
    # vLLM's embeddings take `messages` instead of `input`: estimated at 0 tokens, they passed any tokens limit
    # (the bucket in debt from settled usage) and any budget. A pooling body's data: URL image was counted as
    # text: a permanent "too large" 429.
    def answer(headers, body) -> bytes:
        doc = json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}],
                          "model": "m", "usage": {"prompt_tokens": 1000, "total_tokens": 1000}}).encode()
        return json_answer(doc)
    up = RawUpstream(answer)
    try:
        cfg = governed({"p": {"endpoints": [up.url]}})
        cfg["tenants"]["t"]["limits"] = {"tokens_per_minute": 100}
        w = weir(config=cfg, workers=1)
        codes = [httpx.post(w.v1 + "/embeddings", headers=AUTH, timeout=10,
                            json={"model": "m", "messages": MSG}).status_code for _ in range(3)]
        assert codes[0] == 200 and codes[1:] == [429, 429], codes  # the first one's 1000 tokens are debt
        image = "data:image/png;base64," + "A" * 800_000
        cfg["tenants"]["t"]["limits"] = {"tokens_per_minute": 100000}
        w2 = weir(config=cfg, workers=1)
        r = httpx.post(w2.base_url + "/pooling", headers=AUTH, timeout=10, json={"model": "m", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}]})
        assert r.status_code == 200, r.text
    finally:
        up.close()


def test_usage_in_input_and_output_tokens_is_billed_as_such(weir):
    # OpenAI's transcription usage ({"type": "tokens", "input_tokens", "output_tokens"}) was billed all as prompt.
    doc = json.dumps({"text": "hello", "usage": {"type": "tokens", "input_tokens": 100, "output_tokens": 2,
                                                 "total_tokens": 102}}).encode()
    up = RawUpstream(lambda h, b: json_answer(doc))
    try:
        w = weir(config=governed({"p": {"endpoints": [up.url]}}), workers=1)
        r = httpx.post(w.v1 + "/audio/transcriptions", headers={**AUTH, "x-request-id": "io-usage"}, timeout=10,
                       files={"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}, data={"model": "m"})
        assert r.status_code == 200, r.text
        line = w.log_for("io-usage")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (100, 2), line
    finally:
        up.close()


@pytest.mark.parametrize("name,text,env,args", [
    ("empty api_key_env", "pools: {p: {endpoints: ['http://127.0.0.1:9'], api_key_env: W40_EMPTY}}\n"
     "default_pool: p\n", {"W40_EMPTY": ""}, ()),
    ("api_key and api_key_env", "pools: {p: {endpoints: ['http://127.0.0.1:9'], api_key: sk-a, "
     "api_key_env: W40_SET}}\ndefault_pool: p\n", {"W40_SET": "sk-b"}, ()),
    ("body_timeout 0", "pools: {p: {endpoints: ['http://127.0.0.1:9']}}\ndefault_pool: p\n"
     "server: {body_timeout: 0}\n", {}, ()),
    ("header_timeout 0", "pools: {p: {endpoints: ['http://127.0.0.1:9']}}\ndefault_pool: p\n"
     "server: {header_timeout: 0ms}\n", {}, ()),
    ("two documents", "pools: {p: {endpoints: ['http://127.0.0.1:9']}}\ndefault_pool: p\n---\n"
     "no_such_key: 1\n", {}, ()),
    ("keys_file in no directory", "pools: {p: {endpoints: ['http://127.0.0.1:9']}}\ndefault_pool: p\n"
     "tenants: {t: {}}\nadmin: {listen: 127.0.0.1:0, token_env: W40_ADMIN, keys_file: /nonexistent-w40/k.json}\n",
     {"W40_ADMIN": "admin-token-0123456789"}, ()),
    ("--workers 2000", "pools: {p: {endpoints: ['http://127.0.0.1:9']}}\ndefault_pool: p\n", {},
     ("--workers", "2000")),
    # Start-up and a reload resolve every endpoint: --check answers what they will.
    ("unresolvable endpoint", "pools: {p: {endpoints: ['http://no-such-host.invalid:8000']}}\ndefault_pool: p\n",
     {}, ()),
])
def test_configurations_that_cannot_serve_are_refused_by_check(tmp_path, name, text, env, args):
    import os
    path = tmp_path / "w.yaml"
    path.write_text("listen: 127.0.0.1:0\n" + text)
    r = subprocess.run([str(binary("weir")), "--config", str(path), "--check", *args], capture_output=True,
                       text=True, timeout=10, env={**os.environ, **env})
    assert r.returncode != 0, (name, r.stdout, r.stderr)


def test_the_upstreams_model_list_is_filtered_by_the_allow_list_and_retrieve_works(weir):
    # With a default_pool and no models: section, /v1/models passed the upstream's list unfiltered (a tenant saw
    # models it gets 403 for), and /v1/models/{id} went to vLLM, which has no such route (404 for a listed model).
    listing = json.dumps({"object": "list", "data": [
        {"id": "llama-up", "object": "model", "created": 1, "owned_by": "vllm", "root": "llama-up"},
        {"id": "secret-model", "object": "model", "created": 1, "owned_by": "vllm", "root": "secret-model"},
        {"id": "org/m", "object": "model", "created": 1, "owned_by": "vllm", "root": "org/m"}]}).encode()

    def answer(headers, body) -> bytes:
        return json_answer(listing)
    up = RawUpstream(answer)
    try:
        cfg = governed({"p": {"endpoints": [up.url]}})
        cfg["tenants"]["t"]["models"] = ["llama-up", "org/m"]
        w = weir(config=cfg, workers=1)
        from openai import OpenAI
        c = OpenAI(base_url=w.v1, api_key=KEY, max_retries=0)
        assert sorted(m.id for m in c.models.list()) == ["llama-up", "org/m"]
        assert c.models.retrieve("org/m").id == "org/m"
        for mid in ("secret-model", "nope"):
            r = httpx.get(w.v1 + "/models/" + mid, headers=AUTH, timeout=10)
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        # Without auth (quick mode's case), the list passes as the upstream sent it.
        q = weir(up.url, workers=1)
        assert httpx.get(q.v1 + "/models", timeout=10).content == listing
        assert httpx.get(q.v1 + "/models/org%2Fm", timeout=10).json()["id"] == "org/m"
    finally:
        up.close()


def test_an_audio_stream_gets_no_per_chunk_usage_it_did_not_ask_for(weir):
    # vLLM sends per-chunk usage only with stream_include_usage; Weir adds that field (to meter the stream), so a
    # client's stream_continuous_usage_stats=true alone turned per-chunk usage on for it.
    def field(body: bytes, name: str) -> str | None:
        marker = b'name="' + name.encode() + b'"\r\n\r\n'
        i = body.find(marker)
        return None if i < 0 else body[i + len(marker):body.index(b"\r\n", i + len(marker))].decode()

    def answer(headers, body) -> bytes:
        per_chunk = field(body, "stream_include_usage") == "true" and \
            field(body, "stream_continuous_usage_stats") == "true"
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        out = b""
        for t in ("hel", "lo"):
            c = {"id": "trsc-1", "object": "transcription.chunk", "created": 1, "model": "m",
                 "choices": [{"delta": {"content": t}, "finish_reason": None, "stop_reason": None}]}
            if per_chunk:
                c["usage"] = usage
            out += b"data: " + json.dumps(c).encode() + b"\n\n"
        if field(body, "stream_include_usage") == "true":
            out += b"data: " + json.dumps({"id": "trsc-1", "object": "transcription.chunk", "created": 1,
                                           "model": "m", "choices": [], "usage": usage}).encode() + b"\n\n"
        return sse_answer(out + b"data: [DONE]\n\n")
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        r = httpx.post(w.v1 + "/audio/transcriptions", timeout=10, files={"file": ("a.wav", b"RIFF0000WAVE")},
                       data={"model": "m", "stream": "true", "stream_continuous_usage_stats": "true"})
        assert r.status_code == 200 and '"hel"' in r.text, r.text
        assert '"usage"' not in r.text, r.text  # as the upstream answers the client's own form
    finally:
        up.close()


def test_a_shortened_watch_config_applies_at_once(mock, weir):
    # The watch loop slept out the old interval (up to an hour) before reading the new one.
    from conftest import wait_until
    from test_config_reload import reloads, sighup
    m = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"a": {"pool": "p"}},
                     "server": {"watch_config": "1h"}}, workers=1)
    text = w.config_path.read_text()
    assert text.count('"watch_config": "1h"') == 1, text
    w.config_path.write_text(text.replace('"watch_config": "1h"', '"watch_config": "100ms"'))
    sighup(w)
    before = reloads(w, "success")
    w.config_path.write_text(w.config_path.read_text().replace('"a":', '"b":'))
    wait_until(lambda: reloads(w, "success") > before, 5, message="the edit picked up by the 100ms watch")
    assert httpx.post(w.v1 + "/chat/completions", json={"model": "b", "messages": MSG}, timeout=10).status_code == 200


# --- the third round: hosted upstreams ---


def test_an_endpoint_port_past_65535_is_refused_not_wrapped(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("listen: 127.0.0.1:0\npools: {p: {endpoints: ['http://127.0.0.1:80800']}}\ndefault_pool: p\n")
    r = subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 2 and "port" in r.stderr, (r.stdout, r.stderr)


def test_what_a_hosted_upstream_is_sent(weir):
    # With the pool's key in place, the client's Cookie and OpenAI account headers went with it (billing another
    # org or project the key reaches), and so did Weir's own x-weir-* controls; an explicit default port stayed in
    # the Host header.
    seen = []

    def answer(headers, body) -> bytes:
        seen.append(headers)
        doc = b'{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[]}'
        return json_answer(doc)
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url], "api_key": "sk-operator"}}, "default_pool": "p"},
                 workers=1)
        httpx.post(w.v1 + "/chat/completions", timeout=10, json={"model": "m", "messages": MSG}, headers={
            "cookie": "session=abc", "openai-organization": "org-other", "openai-project": "proj_other",
            "x-weir-timeout-ms": "5000", "x-weir-fallbacks": "none", "x-custom": "kept"})
        h = seen[-1]
        assert h["authorization"] == "Bearer sk-operator", h
        for name in ("cookie", "openai-organization", "openai-project", "x-weir-timeout-ms", "x-weir-fallbacks"):
            assert name not in h, (name, h)
        assert h["x-custom"] == "kept"
    finally:
        up.close()


def test_the_host_header_drops_the_schemes_default_port(tmp_path):
    # Checked through the Host a pool sends: http://host:80 is "host" (RFC 3986 §6.2.3), as without the port.
    import socket
    import threading
    try:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.77", 80))
    except OSError:
        pytest.skip("port 80 is not free here")
    srv.listen(4)
    heads = []

    def serve():
        c, _ = srv.accept()
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += c.recv(65536)
        heads.append(buf.decode("latin-1"))
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        c.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        from conftest import free_port
        import os
        port = free_port()
        cfg = tmp_path / "w.yaml"
        cfg.write_text(f"listen: 127.0.0.1:{port}\npools: {{p: {{endpoints: ['http://127.0.0.77:80']}}}}\n"
                       "default_pool: p\nworkers: 1\nserver: {access_log: off}\n")
        proc = subprocess.Popen([str(binary("weir")), "--config", str(cfg)], stderr=subprocess.PIPE,
                                env=dict(os.environ))
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m", "messages": MSG},
                       timeout=10)
        finally:
            proc.terminate()
            proc.wait(10)
        t.join(5)
        host = [ln for ln in heads[0].split("\r\n") if ln.lower().startswith("host:")]
        assert host == ["Host: 127.0.0.77"], heads[0]
    finally:
        srv.close()


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/responses"])
def test_azures_preamble_chunk_does_not_name_the_translated_stream(weir, route):
    # Azure OpenAI's first chunk (prompt_filter_results, id "", model "", created 0) started the message: every
    # Anthropic and Responses stream got the id msg_ / resp_ and model "".
    pre = {"choices": [], "created": 0, "id": "", "model": "", "object": "",
           "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]}
    events = [pre, chunk("", role="assistant"), chunk("ok"), chunk("", finish="stop")]
    for e in events[1:]:
        e["id"], e["model"] = "chatcmpl-AZ1", "gpt-4o-2024-08-06"
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    up = RawUpstream(lambda h, b: sse_answer(body))
    try:
        w = weir(config={"pools": {"az": {"endpoints": [up.url]}}, "default_pool": "az"}, workers=1)
        payload = ({"model": "gpt-4o", "max_tokens": 5, "messages": MSG, "stream": True} if route == "/v1/messages"
                   else {"model": "gpt-4o", "input": "hi", "stream": True})
        r = httpx.post(w.base_url + route, json=payload, timeout=10)
        assert r.status_code == 200, r.text
        assert "chatcmpl-AZ1" in r.text or "AZ1" in r.text, r.text
        assert '"model":"gpt-4o-2024-08-06"' in r.text and '"model":""' not in r.text, r.text
    finally:
        up.close()


# --- the third round: resume ---


@pytest.mark.parametrize("options", [{"include_usage": True}, {}, {"continuous_usage_stats": True},
                                     {"include_usage": True, "continuous_usage_stats": True}], ids=repr)
def test_a_stream_a_resume_finishes_still_carries_the_usage_chunk_asked_for(mock, weir, options):
    # max_tokens used up where the stream broke: Weir ends it (finish_reason length, [DONE]) and sent no usage
    # chunk, though the client asked for one (OpenAI always sends it then; vLLM too for a stream_options
    # without include_usage, which it reads as true).
    from test_gateway_resume import BREAK, FAST, MSG as RMSG, pool_config, raw_stream
    a, b = mock(*FAST), mock(*FAST)
    w = weir(config=pool_config([a.base_url, b.base_url]))
    events = raw_stream(w, {"model": "mock-model", "messages": RMSG, "stream": True, "max_tokens": 4,
                            "stream_options": options}, BREAK)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4, last
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 4


def test_a_continuation_that_ends_without_finishing_is_no_whole_stream(weir):
    # A continuation that answered only its role chunk and [DONE] was passed off as the message's end: no
    # finish_reason, no error, logged whole.
    first = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                     for c in (chunk("", role="assistant"), chunk("Hello"), chunk(" world")))
    cont = b"data: " + json.dumps(chunk("", role="assistant")).encode() + b"\n\ndata: [DONE]\n\n"
    calls = []

    def answer(headers, body):
        calls.append(json.loads(body))
        if len(calls) == 1:
            return [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + first, None]
        return sse_answer(cont)
    a, b = RawUpstream(answer), RawUpstream(answer)
    try:
        w = weir(config={"pools": {"gpu": {"endpoints": [a.url, b.url], "resume": True}},
                         "models": {"m": {"pool": "gpu"}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": "cont-nofinish"}, timeout=15,
                       json={"model": "m", "messages": MSG, "stream": True})
        datas = data_lines(r.text)
        assert datas[-1] == "[DONE]" and "error" in json.loads(datas[-2]), datas
        line = w.log_for("cont-nofinish")
        assert line["error"] is not None
        # One resume was sent; the second found no endpoint left (both broke): it is no retry.
        assert line["retries"] == 1 and w.metric("weir_upstream_resumes_total") == 1, line
    finally:
        a.close()
        b.close()


def test_a_continuations_first_chunk_is_held_to_the_first_token_timeout(weir):
    # The continuation was cut only by the idle timeout: it sent its role chunk, then nothing.
    first = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                     for c in (chunk("", role="assistant"), chunk("Hello")))
    cont = b"data: " + json.dumps(chunk("", role="assistant")).encode() + b"\n\n"
    calls = []

    def answer(headers, body):
        calls.append(1)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
        return [head + first, None] if len(calls) == 1 else [head + cont, 10.0, None]
    a, b = RawUpstream(answer), RawUpstream(answer)
    try:
        w = weir(config={"pools": {"gpu": {"endpoints": [a.url, b.url], "resume": True,
                                           "timeouts": {"first_token": "300ms", "idle": "5s"}}},
                         "models": {"m": {"pool": "gpu"}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", timeout=15, json={"model": "m", "messages": MSG, "stream": True},
                       headers={"x-request-id": "resumed-ft"})
        # (On Weir's clock: a client's stopwatch counts its own delays on a loaded machine.)
        assert w.log_for("resumed-ft")["duration_ms"] < 3000, "cut by the idle timeout (5 s), not the first-token one"
        assert "error" in json.loads(data_lines(r.text)[-2])
        assert w.metric("weir_upstream_first_token_timeouts_total") >= 1
    finally:
        a.close()
        b.close()


def test_a_held_stream_whose_client_leaves_relayed_no_event(weir):
    import socket
    body = b"data: " + json.dumps(chunk("", role="assistant")).encode() + b"\n\n"
    up = RawUpstream(lambda h, b: [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + body, 5.0, None])
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}, "q": {"endpoints": [up.url]}},
                         "models": {"m": {"pool": "p", "fallbacks": [{"pool": "q"}]}}}, workers=1)
        req = json.dumps({"model": "m", "messages": MSG, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", w.port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: held-left\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(req) + req)
            time.sleep(0.5)
        line = w.log_for("held-left")
        assert line["status"] == 499 and line["events"] == 0, line
    finally:
        up.close()


def test_proxied_answers_to_a_tenant_carry_its_rate_limit_headers(weir):
    # GET /version (and the upstream's model list) went out without the x-ratelimit-* every answer to a
    # tenant's request carries.
    doc = b'{"version": "0.10.1"}'
    up = RawUpstream(lambda h, b: json_answer(doc))
    try:
        cfg = governed({"p": {"endpoints": [up.url]}})
        cfg["tenants"]["t"]["limits"] = {"requests_per_minute": 60}
        w = weir(config=cfg, workers=1)
        r = httpx.get(w.base_url + "/version", headers=AUTH, timeout=10)
        assert r.status_code == 200 and r.json() == {"version": "0.10.1"}, r.text
        assert r.headers.get("x-ratelimit-limit-requests") == "60", r.headers
    finally:
        up.close()


# --- the fourth round: observability ---


def test_a_usage_count_no_request_can_have_is_none(weir):
    # prompt_tokens 2^64-1 wrapped weir_prompt_tokens_total (a counter that went down) and became -1 in traces.
    doc = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                   "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 18446744073709551615, "completion_tokens": 4294967297}}).encode()
    up = RawUpstream(lambda h, b: json_answer(doc))
    try:
        w = weir(config=governed({"p": {"endpoints": [up.url]}}), workers=1)
        before = w.metric("weir_prompt_tokens_total")
        r = httpx.post(w.v1 + "/chat/completions", headers={**AUTH, "x-request-id": "huge"}, timeout=10,
                       json={"model": "m", "messages": MSG})
        assert r.status_code == 200
        line = w.log_for("huge")
        assert line["prompt_tokens"] is None, line  # no usage: the estimate is charged, as for -1 or 1.5
        assert w.metric("weir_prompt_tokens_total") >= before
    finally:
        up.close()


def test_a_late_joiner_of_a_coalesced_generation_adds_no_negative_latency(mock, weir):
    import socket
    import threading
    m = mock("--ttft-ms", "2000", "--itl-ms", "5", "--max-tokens", "4")
    w = weir(config={"pools": {"c": {"endpoints": [m.base_url], "coalesce": True}}, "default_pool": "c"}, workers=1)
    body = json.dumps({"model": "mock-model", "messages": MSG, "stream": True, "temperature": 0,
                       "max_tokens": 4}).encode()
    lead = threading.Thread(target=lambda: httpx.post(w.v1 + "/chat/completions", timeout=15, content=body,
                                                      headers={"x-request-id": "co-lead",
                                                               "content-type": "application/json"}))
    lead.start()
    wait_until(lambda: m.metric("vllm:num_requests_running") == 1, 10, message="the leader's generation")
    with socket.create_connection(("127.0.0.1", w.port)) as s:  # its body in two pieces, 300 ms apart
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: co-late\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(0.3)
        s.sendall(body[10:])
        s.settimeout(10)
        got = b""
        while b"[DONE]" not in got:
            chunk_ = s.recv(65536)
            assert chunk_
            got += chunk_
    lead.join()
    late = w.log_for("co-late")
    assert late.get("batch", {}).get("coalesced") or late.get("batch"), late
    assert late["added_us"] >= 0, late


def test_a_head_refused_for_its_framing_is_traced(mock, weir):
    import socket
    from otlp import Collector
    c = Collector()
    try:
        m = mock("--ttft-ms", "0", "--itl-ms", "0")
        w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                         "tracing": {"otlp_endpoint": c.url, "flush_interval": "10ms", "sample_ratio": 1}},
                 workers=1)
        for rid, head in (("tr-expect", b"Expect: foo\r\nContent-Length: 2\r\n"),
                          ("tr-te", b"Transfer-Encoding: gzip, chunked\r\n")):
            with socket.create_connection(("127.0.0.1", w.port)) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: " + rid.encode() +
                          b"\r\n" + head + b"\r\n")
                s.settimeout(5)
                assert s.recv(65536).split(b" ")[1] in (b"417", b"501"), rid
            line = w.log_for(rid)
            from conftest import wait_until
            wait_until(lambda: any(sp["kind"] == 2 and any(a["key"] == "weir.request_id" and
                                                          a["value"].get("stringValue") == rid
                                                          for a in sp.get("attributes", []))
                                   for sp in list(c.spans)), 10, message=f"a server span for {rid}")
            assert line["status"] in (417, 501)
    finally:
        c.close()


# --- the fourth round: this stop's fixes again ---


def test_a_resume_that_ends_the_stream_adds_no_second_usage_chunk(weir):
    # The stream broke after its finish_reason and its usage chunk (only [DONE] was lost): Weir added a usage
    # chunk of its own that contradicted the upstream's and the log.
    usage = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}
    events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                      for c in (chunk("", role="assistant"), chunk("A"), chunk("", finish="stop"), usage))
    up = RawUpstream(lambda h, b: [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + events, None])
    up2 = RawUpstream(lambda h, b: [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + events, None])
    try:
        w = weir(config={"pools": {"gpu": {"endpoints": [up.url, up2.url], "resume": True}},
                         "models": {"m": {"pool": "gpu"}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": "one-usage"}, timeout=15,
                       json={"model": "m", "messages": MSG, "stream": True,
                             "stream_options": {"include_usage": True}})
        datas = data_lines(r.text)
        usages = [json.loads(d)["usage"] for d in datas[:-1] if json.loads(d).get("usage")]
        assert datas[-1] == "[DONE]" and usages == [usage["usage"]], datas
        line = w.log_for("one-usage")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (7, 2), line
    finally:
        up.close()
        up2.close()


def test_an_anthropic_default_pool_gets_the_model_list_and_version_paths(weir):
    # GET /v1/models and /version went to an Anthropic default pool as GET /v1/messages, and its answer was
    # "translated" into a chat completion, charged.
    import socket
    import threading
    listing = json.dumps({"data": [{"id": "claude-x", "type": "model", "display_name": "X",
                                    "created_at": "2025-01-01T00:00:00Z"}], "has_more": False}).encode()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    lines = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            buf = b""
            while b"\r\n\r\n" not in buf:
                got = c.recv(65536)
                if not got:
                    break
                buf += got
            lines.append(buf.split(b"\r\n", 1)[0].decode())
            c.sendall(json_answer(listing).replace(b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nConnection: close\r\n"))
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d" % srv.getsockname()[1]
        w = weir(config={"pools": {"p": {"type": "anthropic", "endpoints": [url], "api_key": "ak"}},
                         "default_pool": "p"}, workers=1)
        r = httpx.get(w.v1 + "/models", timeout=10)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "claude-x", r.text
        assert lines[-1] == "GET /v1/models HTTP/1.1", lines
        r = httpx.get(w.v1 + "/models/claude-x", timeout=10)
        assert r.status_code == 200 and r.json()["id"] == "claude-x", r.text
        httpx.get(w.base_url + "/version", timeout=10)
        assert lines[-1] == "GET /version HTTP/1.1", lines
    finally:
        srv.close()


def test_head_of_the_upstream_model_list_answers_as_its_get(weir):
    listing = json.dumps({"object": "list", "data": [
        {"id": "pub", "object": "model", "created": 1, "owned_by": "vllm"},
        {"id": "secret", "object": "model", "created": 1, "owned_by": "vllm"}]}).encode()

    def answer(headers, body):
        return json_answer(listing)
    up = RawUpstream(answer)
    try:
        cfg = governed({"p": {"endpoints": [up.url]}})
        cfg["tenants"]["t"]["models"] = ["pub"]
        w = weir(config=cfg, workers=1)
        for path in ("/models", "/models/pub", "/models/secret"):
            g = httpx.get(w.v1 + path, headers=AUTH, timeout=10)
            h = httpx.head(w.v1 + path, headers=AUTH, timeout=10)
            assert h.status_code == g.status_code, (path, g.status_code, h.status_code)
            if g.status_code == 200:
                assert h.headers["content-length"] == str(len(g.content)), (path, h.headers)
    finally:
        up.close()


def test_an_audio_form_may_not_repeat_the_continuous_usage_field(weir):
    up = RawUpstream(lambda h, b: sse_answer(b"data: [DONE]\n\n"))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        files = [("file", ("a.wav", b"RIFF0000WAVE")), ("model", (None, "m")), ("stream", (None, "true")),
                 ("stream_continuous_usage_stats", (None, "true")), ("stream_continuous_usage_stats", (None, "true"))]
        r = httpx.post(w.v1 + "/audio/transcriptions", timeout=10, files=files)
        assert r.status_code == 400 and "stream_continuous_usage_stats" in r.text, r.text
    finally:
        up.close()


@pytest.mark.parametrize("tail", ["---\n", "---\n# nothing else\n", "...\n"])
def test_a_file_ending_in_an_empty_document_is_accepted(tmp_path, tail):
    path = tmp_path / "w.yaml"
    path.write_text("listen: 127.0.0.1:0\npools: {p: {endpoints: ['http://127.0.0.1:9']}}\ndefault_pool: p\n" + tail)
    r = subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0, (r.stdout, r.stderr)


# --- the fourth round: the SDKs' tools and usage ---


@pytest.mark.parametrize("options", [{}, {"include_obfuscation": False}])
def test_stream_options_without_include_usage_are_metered_on_an_openai_style_upstream(weir, options):
    # An upstream that sends usage only when include_usage is true (OpenAI's reading) was never asked for it when
    # stream_options had no include_usage: the stream was charged the estimate. vLLM (the reference) reads the
    # absent member as true: the client asked for usage, and gets it from this upstream too.
    def answer(headers, body):
        so = json.loads(body).get("stream_options") or {}
        out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                       for c in (chunk("", role="assistant"), chunk("hi"), chunk("", finish="stop")))
        if so.get("include_usage") is True:
            out += b"data: " + json.dumps({"id": "u", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                           "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 50,
                                                                    "total_tokens": 1050}}).encode() + b"\n\n"
        return sse_answer(out + b"data: [DONE]\n\n")
    up = RawUpstream(answer)
    try:
        w = weir(config=governed({"p": {"endpoints": [up.url], "api_key": "sk-op"}}), workers=1)
        r = httpx.post(w.v1 + "/chat/completions", headers={**AUTH, "x-request-id": "so-metered"}, timeout=10,
                       json={"model": "m", "messages": MSG, "stream": True, "stream_options": options})
        usages = [json.loads(d)["usage"] for d in data_lines(r.text)[:-1] if json.loads(d).get("usage")]
        assert usages == [{"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050}], r.text
        line = w.log_for("so-metered")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (1000, 50), line
    finally:
        up.close()


def test_a_streamed_function_call_without_arguments_ends_with_empty_object_arguments(weir):
    call = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                                "function": {"name": "now", "arguments": ""}}]},
                         "finish_reason": None}]}
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                    for c in (chunk("", role="assistant"), call, chunk(None, finish="tool_calls")))
    up = RawUpstream(lambda h, b: sse_answer(body + b"data: [DONE]\n\n"))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        from openai import OpenAI
        c = OpenAI(base_url=w.v1, api_key="x", max_retries=0)
        with c.responses.stream(model="m", input="time?",
                                tools=[{"type": "function", "name": "now", "parameters": {}}]) as s:
            final = s.get_final_response()
        fc = [o for o in final.output if o.type == "function_call"]
        assert fc and fc[0].name == "now" and json.loads(fc[0].arguments) == {}, final
    finally:
        up.close()


# --- the fifth round: overload, the admin listener ---


def raw_post(port: int, path: str, body: dict, headers: dict | None = None):
    import socket
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + extra +
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


@pytest.mark.parametrize("pool_extra,path,body", [
    ({"coalesce": True}, "/v1/chat/completions",
     {"model": "mock-model", "messages": MSG, "temperature": 0, "max_tokens": 2}),
    ({"batch": {"window": "2ms", "max_size": 4}}, "/v1/completions", {"model": "mock-model", "prompt": "hi",
                                                                      "max_tokens": 2}),
], ids=["coalesce", "batch"])
def test_a_queued_batch_member_whose_client_leaves_as_it_is_let_in_gives_its_place_back(mock, weir, pool_extra,
                                                                                       path, body):
    # The place it was given as its client left was never given back: with max_concurrent 1 the pool was wedged
    # (every later request waited out queue.timeout and was shed) until a restart.
    from conftest import wait_until
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(config={"pools": {"gpu": {"endpoints": [m.base_url], **pool_extra,
                                       "queue": {"max_concurrent": 1, "size": 4, "timeout": "3s",
                                                 "saturation": False}}},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    for i in range(3):
        occupant = raw_post(w.port, "/v1/chat/completions", {"model": "mock-model", "messages": MSG},
                            {"x-mock-ttft-ms": "60000"})
        wait_until(lambda: m.metric("vllm:num_requests_running") == 1, 5, message="the occupant upstream")
        waiter = raw_post(w.port, path, body)
        wait_until(lambda: w.metric("weir_queue_waiting", pool="gpu") == 1, 5, message="the waiter queued")
        occupant.close()
        waiter.close()  # both leave at once
        wait_until(lambda: m.metric("vllm:num_requests_running") == 0 and
                   w.metric("weir_queue_waiting", pool="gpu") == 0, 5, message="both gone")
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "mock-model", "messages": MSG}, timeout=10,
                   headers={"x-request-id": "after-leavers"})
    assert r.status_code == 200, (r.status_code, r.text[:200])
    # On Weir's clock (not a client's stopwatch, which counts its own delays on a loaded machine): no wait for a
    # place that never comes back (queue.timeout, 3 s).
    assert w.log_for("after-leavers")["duration_ms"] < 2000


def test_a_resumed_stream_keeps_its_queue_place(weir):
    # The broken stream gave its place to a waiter while its continuation ran: 2 upstream requests on a pool
    # capped at 1. Told by order, not by time: the waiter may reach an upstream only after the continuation's
    # last bytes, which come PAUSE seconds after the continuation arrived.
    import threading
    PAUSE = 0.8
    arrivals = {}
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"

    def ev(c):
        return b"data: " + json.dumps(c).encode() + b"\n\n"

    def answer(headers, body):
        doc = json.loads(body)
        now = time.monotonic()
        if doc.get("continue_final_message"):
            arrivals["continuation"] = now
            return [head + ev(chunk("", role="assistant")), PAUSE / 2, ev(chunk(" world")), PAUSE / 2,
                    ev(chunk("", finish="stop")) + b"data: [DONE]\n\n", None]
        if doc.get("stream"):
            arrivals.setdefault("first", now)
            return [head + ev(chunk("", role="assistant")) + ev(chunk("Hel")) + ev(chunk("lo")), None]
        arrivals["waiter"] = now
        return json_answer(json.dumps({"id": "w", "object": "chat.completion", "created": 1, "model": "m",
                                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                    "finish_reason": "stop"}]}).encode())
    a, b = RawUpstream(answer), RawUpstream(answer)
    try:
        w = weir(config={"pools": {"gpu": {"endpoints": [a.url, b.url], "resume": True, "retry": {"attempts": 2},
                                           "queue": {"max_concurrent": 1, "size": 4, "saturation": False}}},
                         "models": {"m": {"pool": "gpu"}}}, workers=1)
        got = {}
        s = threading.Thread(target=lambda: got.setdefault("s", httpx.post(
            w.v1 + "/chat/completions", timeout=30, json={"model": "m", "messages": MSG, "stream": True})))
        s.start()
        from conftest import wait_until
        wait_until(lambda: "first" in arrivals, 5, message="the stream upstream")
        waiter = httpx.post(w.v1 + "/chat/completions", timeout=30, json={"model": "m", "messages": MSG})
        s.join()
        assert got["s"].status_code == 200 and "world" in got["s"].text and waiter.status_code == 200
        assert w.metric("weir_upstream_resumes_total") == 1
        assert arrivals["waiter"] >= arrivals["continuation"] + PAUSE, arrivals
    finally:
        a.close()
        b.close()


def test_with_redis_a_patch_racing_a_delete_never_brings_the_key_back(mock, weir, redis):
    # PATCH read the record, DELETE revoked it, PATCH wrote the whole record back with revoked 0: the revoked
    # secret worked again (6 of 40 races). The write now happens only while the record is live.
    import threading
    from conftest import free_port, wait_until
    from test_admin_api import ENV, MOCK_FLAGS, Admin, _ready, redis_config
    m = mock(*MOCK_FLAGS)
    port = free_port()
    cfg = redis_config(m, redis, port)
    cfg["auth"].update({"key_cache_ttl": "100ms", "key_negative_ttl": "100ms"})
    w = weir(config=cfg, env=ENV)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    resurrected = []
    for i in range(20):
        k = admin.create(tenant="acme", models=["m"], name=f"k{i}")
        res = {}
        t1 = threading.Thread(target=lambda: res.setdefault("del", admin("DELETE", f"/admin/v1/keys/{k['id']}")))
        t2 = threading.Thread(target=lambda: res.setdefault("patch", admin("PATCH", f"/admin/v1/keys/{k['id']}",
                                                                         json={"name": f"renamed{i}"})))
        t1.start()
        time.sleep((i % 8) * 0.0005)
        t2.start()
        t1.join()
        t2.join()
        assert res["del"].status_code == 200, res["del"].text
        assert res["patch"].status_code in (200, 404), res["patch"].text
        time.sleep(0.2)  # past the key caches
        r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {k['key']}"}, timeout=10,
                       json={"model": "m", "messages": MSG})
        if r.status_code != 401:
            resurrected.append(i)
    assert resurrected == [], resurrected


def test_a_tenant_named_other_is_the_overflow_series_not_a_second_one(mock, weir):
    m = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    keys = {t: f"sk-test-40-{t}-0123456789" for t in ("a", "other", "z")}
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "tenants": {t: {} for t in keys},
                     "auth": {"required": True, "api_keys": [{"id": f"k-{t}", "tenant": t,
                                                              "sha256": hashlib.sha256(k.encode()).hexdigest()}
                                                             for t, k in keys.items()]},
                     "server": {"metrics": {"max_tenants": 3}}}, workers=1)
    for k in keys.values():
        assert httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {k}"}, timeout=10,
                          json={"model": "m", "messages": MSG}).status_code == 200
    lines = [ln.rsplit(" ", 1)[0] for ln in w.metrics_text().splitlines()
             if ln.startswith("weir_requests_total{")]
    assert len(lines) == len(set(lines)), [ln for ln in lines if lines.count(ln) > 1]


def test_the_admin_listeners_refusals_carry_its_security_fields_and_allow_lists_head(mock, weir):
    import socket
    from conftest import free_port, wait_until
    from test_admin_api import ENV, MOCK_FLAGS, Admin, _ready
    from test_admin_api import config as admin_config
    m = mock(*MOCK_FLAGS)
    port = free_port()
    weir(config=admin_config(m, port), env=ENV)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    for head in (b"GET /admin/v1/stats HTTP/1.1\r\n\r\n",  # no Host: 400
                 b"GET /admin/v1/stats HTTP/1.1\r\nHost: localhost\r\nExpect: foo\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(head)
            s.settimeout(5)
            got = b""
            while b"\r\n\r\n" not in got:
                got += s.recv(65536)
        fields = got.split(b"\r\n\r\n")[0].decode().lower()
        for name in ("content-security-policy", "x-content-type-options: nosniff", "x-frame-options: deny",
                     "referrer-policy"):
            assert name in fields, (head, fields)
    r = admin("PUT", "/admin/v1/stats")
    assert r.status_code == 405 and "HEAD" in r.headers["allow"] and "GET" in r.headers["allow"], r.headers


@pytest.mark.parametrize("options", [{}, {"continuous_usage_stats": True}], ids=repr)
def test_a_chat_stream_on_an_anthropic_pool_gets_the_usage_chunk_a_stream_options_asks_for(weir, options):
    # A stream_options without include_usage asks for usage as vLLM reads it (and Weir does on OpenAI pools):
    # from an Anthropic pool it got none.
    def ev(name, data):
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    body = b"".join([
        ev("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "c", "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 1}}}),
        ev("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}}),
        ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "hi"}}),
        ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"output_tokens": 3}}),
        ev("message_stop", {"type": "message_stop"})])
    up = RawUpstream(lambda h, b: sse_answer(body))
    try:
        w = weir(config={"pools": {"claude": {"type": "anthropic", "endpoints": [up.url], "api_key": "ak"}},
                         "default_pool": "claude"}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       json={"model": "c", "messages": MSG, "stream": True, "stream_options": options})
        chunks = [json.loads(d) for d in data_lines(r.text)[:-1]]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 12, r.text
    finally:
        up.close()


def test_a_deleted_request_log_file_is_opened_again_and_the_loss_said(mock, weir, tmp_path):
    # Deleted under the open connection, the file took every later record into an unlinked inode: counted as
    # written, lost at the restart, with no error.
    import sqlite3
    from conftest import wait_until
    m = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    db = tmp_path / "requests.db"
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"}}, workers=1)

    def send(rid):
        assert httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": rid}, timeout=10,
                          json={"model": "m", "messages": MSG}).status_code == 200
    for i in range(3):
        send(f"before-{i}")
    wait_until(lambda: w.metric("weir_request_log_written_total") >= 3, 5, message="the first rows")
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / ("requests.db" + suffix)).unlink(missing_ok=True)
    for i in range(3):
        send(f"after-{i}")

    def stored():
        if not db.exists():
            return []
        try:
            with sqlite3.connect(db) as c:
                return [r[0] for r in c.execute("SELECT request_id FROM requests")]
        except sqlite3.OperationalError:  # the new file, its table not made yet
            return []
    wait_until(lambda: {f"after-{i}" for i in range(3)} <= set(stored()), 10, message="the later rows in a new file")
    assert w.metric("weir_request_log_errors_total") >= 1  # the loss is said
