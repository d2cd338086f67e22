"""What Weir does with an upstream's 2xx answer it cannot take as sent (stop 51): usage counts out of any real
request's range."""
from __future__ import annotations

import httpx
import openai
import pytest

from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hi"}]
CHAT_OK = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
           b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
           b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')


def answer(body: bytes, status: bytes = b"200 OK", ctype: bytes = b"application/json") -> bytes:
    if status.startswith(b"204"):
        return b"HTTP/1.1 204 No Content\r\n\r\n"
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (status, ctype, len(body), body)


# --- usage out of range -------------------------------------------------------------------------------------

KEY = "sk-stop51-usage"


def usage_config(url: str) -> dict:
    import hashlib
    return {"pools": {"p": {"endpoints": [url]}},
            "models": {"m": {"pool": "p", "default_max_tokens": 8}},
            # 100k tokens a minute: one request billed 2^31 tokens sank the bucket for ~15 days.
            "tenants": {"t": {"limits": {"tokens_per_minute": 100000}, "budget": {"usd": 10.0}}},
            "auth": {"api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
            "pricing": {"*": {"input": 1.0, "output": 2.0}}}


def chat_answer(usage: bytes) -> bytes:
    body = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
            b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":%s}' % usage)
    return answer(body)


def stream_answer(usage: bytes) -> bytes:
    events = [
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":"ok"},"finish_reason":null}]}',
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{},"finish_reason":"stop"}]}',
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":%s}' % usage,
        b"[DONE]",
    ]
    body = b"".join(b"data: %s\n\n" % e for e in events)
    return answer(body, ctype=b"text/event-stream")


BAD_USAGE = {
    "2^31": b'{"prompt_tokens":2147483648,"completion_tokens":1,"total_tokens":2147483649}',
    "over_2^24": b'{"prompt_tokens":5,"completion_tokens":16777217,"total_tokens":16777222}',
    "1e300": b'{"prompt_tokens":1e300,"completion_tokens":1,"total_tokens":1}',
    "negative": b'{"prompt_tokens":-5,"completion_tokens":1,"total_tokens":-4}',
    "fraction": b'{"prompt_tokens":3.7,"completion_tokens":1,"total_tokens":4.7}',
}


# DEFECT: upstream usage was trusted as sent: prompt_tokens 2^31 (under the old bound of 2^53) was billed, sinking
# the tenant's token bucket and budget (every later request a 429); a negative, fractional or huge count was
# dropped silently. A count out of range (negative, not an integer, over 2^24 = 16,777,216 tokens) is now invalid
# usage: the request is charged as one without usage is (its estimate: charged_tokens), counted in
# weir_upstream_invalid_usage_total, and its log line says "usage_invalid": true.
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("bad", list(BAD_USAGE))
def test_usage_out_of_range_is_not_billed_as_sent(weir, bad, stream):
    good_usage = b'{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}'
    make = stream_answer if stream else chat_answer
    up = RawUpstream(lambda h, b: make(BAD_USAGE[bad] if b"bad-usage" in b else good_usage))
    try:
        w = weir(config=usage_config(up.url), workers=1)
        hdrs = {"authorization": f"Bearer {KEY}"}
        body = {"model": "m", "stream": stream, "max_tokens": 8}
        r = httpx.post(w.v1 + "/chat/completions", timeout=10, headers=hdrs | {"x-request-id": "bad"},
                       json=body | {"messages": [{"role": "user", "content": "bad-usage"}]})
        assert r.status_code == 200, r.text
        line = w.log_for("bad")
        assert line["usage_invalid"] is True, line
        assert line["prompt_tokens"] is None and line["completion_tokens"] is None, line
        charged = line["charged_tokens"]
        assert charged["source"] == "estimate" and charged["prompt"] < 100 and charged["completion"] <= 8, line
        assert line["spend_usd"] < 0.001, line
        assert w.metric("weir_upstream_invalid_usage_total", model="m") == 1
        assert w.metric("weir_prompt_tokens_total") == 0
        # The tenant's bucket and budget were not sunk: the next request is admitted and billed its own usage.
        r = httpx.post(w.v1 + "/chat/completions", timeout=10, headers=hdrs | {"x-request-id": "next"},
                       json=body | {"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        line = w.log_for("next")
        assert line["prompt_tokens"] == 3 and "usage_invalid" not in line, line
        assert w.metric("weir_upstream_invalid_usage_total", model="m") == 1
    finally:
        up.close()


def test_the_bound_itself_is_billed(weir):
    up = RawUpstream(lambda h, b: chat_answer(b'{"prompt_tokens":16777216,"completion_tokens":0,"total_tokens":16777216}'))
    try:
        cfg = usage_config(up.url)
        cfg["tenants"]["t"] = {"budget": {"usd": 100.0}}
        w = weir(config=cfg, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       headers={"authorization": f"Bearer {KEY}", "x-request-id": "max"},
                       json={"model": "m", "max_tokens": 8, "messages": MSG})
        assert r.status_code == 200, r.text
        line = w.log_for("max")
        assert line["prompt_tokens"] == 16777216 and "usage_invalid" not in line, line
    finally:
        up.close()
