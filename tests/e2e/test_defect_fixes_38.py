"""Defects found in stop 38's black-box round: credentials checked only after the whole body was read, a 429's
Retry-After shorter than the wait, x-ratelimit-remaining above x-ratelimit-limit, an admin DELETE that left a
second key of the id working, an endpoint listed twice making duplicate metric series, an attempt's ms that
stopped at its head, and a chunked coding with parameters read as chunked."""
from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import time

import httpx
import openai
import pytest

from conftest import binary, free_port, wait_until
from test_admin_api import ENV, Admin, _ready, redis_config, MOCK_FLAGS as ADMIN_MOCK_FLAGS

KEY = "sk-test-38-good-0123456789"
SHA = hashlib.sha256(KEY.encode()).hexdigest()


def auth_config(mock, **tenant) -> dict:
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
        "tenants": {"acme": tenant},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": SHA, "tenant": "acme"}]},
        "server": {"max_body": "8MiB", "body_timeout": "20s"},
    }


def test_a_bad_credential_is_answered_from_the_head_before_the_body(mock, weir):
    # The client declared a 4 MB body and sent 8 bytes of it: the 401 comes at once (it came as a 408 after
    # body_timeout, the body never read as far as the credential).
    w = weir(config=auth_config(mock("--ttft-ms", "0", "--itl-ms", "0")), workers=1)
    for i, auth in enumerate((b"Authorization: Bearer sk-wrong\r\n", b"", b"Authorization: Basic eDp5\r\n")):
        with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
            t0 = time.monotonic()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: early-401-%d\r\n" % i + auth +
                      b"Content-Length: 4000000\r\nContent-Type: application/json\r\n\r\n{\"model\"")
            head = s.recv(65536)
            assert head.startswith(b"HTTP/1.1 401 "), head[:200]
            assert time.monotonic() - t0 < 3, "the 401 waited for the body"
            assert b"connection: close" in head.lower(), head  # the body is never read: no next request
    for i in range(3):  # (one id each: log_for asserts one line, and all three may be flushed by now)
        line = w.log_for(f"early-401-{i}")
        assert line["status"] == 401 and line["error"]["code"] == "invalid_api_key", line


@pytest.mark.parametrize("size", [200_000, 3_000_000, 7_000_000])
def test_the_sdk_gets_its_401_with_a_large_prompt_and_a_good_key_still_works(mock, weir, size):
    # The refused body is read and discarded (until the client ends it), so the SDK reads the 401, not a reset
    # while it sends; a good key's large prompt reaches the upstream whole.
    w = weir(config=auth_config(mock("--ttft-ms", "0", "--itl-ms", "0")), workers=1)
    prompt = "x" * size
    bad = openai.OpenAI(base_url=w.v1, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], max_tokens=2)
    good = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0)
    r = good.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], max_tokens=2)
    assert r.choices[0].message.content
    # Unknown routes refused from the head are drained the same way: the client reads its 404.
    r = httpx.post(w.base_url + "/v1/nowhere", content=b"x" * size, timeout=20,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 404, r.text


def test_retry_after_is_the_longest_wait_of_the_requests_and_tokens_buckets(mock, weir):
    # requests: 1 a second, 1 deep; tokens: 200 a minute. After one request of ~159 tokens, the next is
    # refused by the requests bucket (1 s), but its tokens need ~28 s: Retry-After says so, and a retry
    # after the old answer (1 s) was refused again.
    w = weir(config=auth_config(mock("--ttft-ms", "0", "--itl-ms", "0"), limits={
        "requests_per_minute": 60, "requests_burst": 1, "tokens_per_minute": 200}), workers=1)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 150}
    hdrs = {"authorization": f"Bearer {KEY}"}
    assert httpx.post(w.v1 + "/chat/completions", json=body, headers=hdrs, timeout=10).status_code == 200
    r = httpx.post(w.v1 + "/chat/completions", json=body, headers=hdrs, timeout=10)
    assert r.status_code == 429, r.text
    wait = int(r.headers["retry-after"])
    assert 20 <= wait <= 60, r.headers
    assert f"try again in {wait}s" in r.json()["error"]["message"], r.text
    # The answer's own headers agree: fewer tokens remain than the request needs.
    assert int(r.headers["x-ratelimit-remaining-tokens"]) < 150


def test_ratelimit_remaining_never_exceeds_the_limit_with_a_burst(mock, weir):
    w = weir(config=auth_config(mock("--ttft-ms", "0", "--itl-ms", "0"), limits={
        "requests_per_minute": 10, "requests_burst": 100, "tokens_per_minute": 1000, "tokens_burst": 50000}),
        workers=1)
    r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    for kind, limit in (("requests", 100), ("tokens", 50000)):
        assert int(r.headers[f"x-ratelimit-limit-{kind}"]) == limit, r.headers
        assert 0 < int(r.headers[f"x-ratelimit-remaining-{kind}"]) <= limit, r.headers


def test_admin_delete_revokes_every_redis_record_of_the_id(mock, weir, redis):
    # Two records written by hand (docs/auth.md) under one id: DELETE answered deleted: true and one of
    # the two keys still worked (which one followed SCAN order).
    m = mock(*ADMIN_MOCK_FLAGS)
    port = free_port()
    cfg = redis_config(m, redis, port)
    w = weir(config=cfg, env=ENV)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 5, message="admin listener")
    prefix = cfg["redis"]["key_prefix"]
    keys = ["sk-38-first-0123456789abcdef", "sk-38-second-0123456789abcdef"]
    for k in keys:
        assert redis.cli("HSET", prefix + "key:" + hashlib.sha256(k.encode()).hexdigest(),
                         "id", "acme-hand", "tenant", "acme").startswith(b":")

    def chat(key: str) -> int:
        return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=10,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code

    # One key per id (stop 60, docs/auth.md): the record with the lower SHA-256 holds the id, the other is refused.
    digests = {k: hashlib.sha256(k.encode()).hexdigest() for k in keys}
    holder = min(keys, key=lambda k: digests[k])
    assert {k: chat(k) for k in keys} == {k: 200 if k == holder else 401 for k in keys}

    def field(k: str, name: str) -> bytes:
        return redis.cli("HGET", prefix + "key:" + digests[k], name)

    r = admin("PATCH", "/admin/v1/keys/acme-hand", json={"models": ["other"]})
    assert r.status_code == 200, r.text
    wait_until(lambda: chat(holder) == 404, 5, 0.05, "the narrowed models")
    for k in keys:  # the change reached both records
        assert b"other" in field(k, "models"), field(k, "models")
    r = admin("DELETE", "/admin/v1/keys/acme-hand")
    assert r.status_code == 200 and r.json()["deleted"] is True, r.text
    wait_until(lambda: chat(holder) == 401, 5, 0.05, "the id revoked")
    for k in keys:  # every record of the id revoked
        assert b"\r\n1\r\n" in field(k, "revoked"), field(k, "revoked")
        assert chat(k) == 401
    assert admin("GET", "/admin/v1/keys/acme-hand").status_code == 404


def test_an_endpoint_listed_twice_in_a_pool_is_a_configuration_error(tmp_path):
    cfg = tmp_path / "dup.yaml"
    cfg.write_text("listen: 127.0.0.1:9\npools:\n  p:\n    endpoints: [http://127.0.0.1:19101, "
                   "http://127.0.0.1:19102, http://127.0.0.1:19101]\nmodels:\n  m: {pool: p}\n")
    out = subprocess.run([str(binary("weir")), "--config", str(cfg), "--check"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "pools.p.endpoints[2]: is pools.p.endpoints[0] again" in out.stderr, out.stderr


def test_an_attempt_that_fails_after_its_head_logs_its_time_to_the_failure(mock, weir):
    # The first endpoint sends the head, then stalls: its idle timeout (1 s) fails it over. Its attempt's ms
    # is the second it took (it was the head's 0.3 ms).
    stall = mock("--ttft-ms", "5", "--max-tokens", "10", "--stall-after", "0", "--stall-ms", "60000")
    good = mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(config={
        "pools": {"stall": {"endpoints": [stall.base_url], "timeouts": {"idle": "1s"}},
                  "good": {"endpoints": [good.base_url]}},
        "models": {"m": {"pool": "stall", "upstream_model": "mock-model", "fallbacks": [{"pool": "good"}]}}},
        workers=1)
    client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0,
                           default_headers={"x-request-id": "late-fail"})
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True) if c.choices)
    assert text
    line = w.log_for("late-fail")
    first = line["attempts"][0]
    assert first["failure"] == "timeout" and first["status"] == 200, line
    assert 900 <= first["ms"] <= 5000, line


@pytest.mark.parametrize("te", [b"chunked;foo", b"chunked;q=1", b"chunked ;q=1", b"chunked;"])
def test_a_chunked_coding_with_parameters_is_bad_framing(mock, weir, te):
    w = weir(mock("--ttft-ms", "0", "--itl-ms", "0"))
    body = json.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: " + te + b"\r\n\r\n" +
                  b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 400 "), head[:200]


def sse_stream_with_a_large_event(headers, body) -> list:
    # vLLM's framing: one chunked body holding a role chunk, a ~1 MB content chunk, the finish, usage, [DONE];
    # then the upstream closes, as its head said (Connection: close). Unsaid, Weir would pool the connection and
    # the next request could be sent on it as the close came (the keep-alive race; a loaded machine let the close
    # come more than 5 ms after that send, past what Weir resends as a stale connection: a 502).
    def chunk(delta, finish=None, choices=None, usage=None) -> bytes:
        o = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
             if choices is None else choices}
        if usage:
            o["usage"] = usage
        return b"data: " + json.dumps(o, separators=(",", ":")).encode() + b"\n\n"
    events = (chunk({"role": "assistant", "content": ""}) + chunk({"content": "x" * 1_000_000}) +
              chunk({}, "stop") + chunk(None, choices=[], usage={"prompt_tokens": 7, "completion_tokens": 5,
                                                                  "total_tokens": 12}) + b"data: [DONE]\n\n")
    return [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n" +
            b"%x\r\n" % len(events) + events + b"\r\n0\r\n\r\n", None]


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"model": "m", "input": "hi", "stream": True}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}),
])
def test_a_stream_whose_last_bytes_go_out_at_once_ends_at_once(weir, path, body):
    # A 1 MB event fills the sockets: the write loop takes it, the stream's end is queued behind it, and goes
    # out at once when the loop's write completes. The stream ended (and was logged) only at write_timeout.
    from test_defect_fixes import RawUpstream
    up = RawUpstream(sse_stream_with_a_large_event)
    try:
        w = weir(config={"pools": {"s": {"endpoints": [up.url]}}, "default_pool": "s",
                         "server": {"write_timeout": "8s"}}, workers=1)
        for i in range(5):
            rid = f"big-{path.rsplit('/', 1)[1]}-{i}"
            data = json.dumps(body).encode()
            with socket.create_connection(("127.0.0.1", w.port), timeout=15) as s:
                t0 = time.monotonic()
                s.sendall(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\n"
                          b"x-request-id: %s\r\nContent-Length: %d\r\n\r\n" % (path.encode(), rid.encode(), len(data))
                          + data)
                got = b""
                while chunk := s.recv(1 << 20):
                    got += chunk
                took = time.monotonic() - t0
            assert got.endswith(b"0\r\n\r\n"), got[-200:]
            assert took < 4, f"the stream ended {took:.1f} s after it began (write_timeout 8 s)"
            line = w.log_for(rid)
            assert line["status"] == 200 and line["error"] is None and line["duration_ms"] < 4000, line
    finally:
        up.close()


def chat_stream_answer(headers, body) -> bytes:
    # A whole, valid vLLM chat stream, whatever the request asked.
    events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in [
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": "streamed"}, "finish_reason": "stop"}]}]) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(events)
            + events)


def json_200(doc: dict):
    """An upstream answer: 200, application/json, `doc`, whatever the request asked."""
    def answer(headers, body) -> bytes:
        text = json.dumps(doc).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(text) + text
    return answer


# A whole chat completion, whatever the request asked (an upstream that ignores `stream: true`).
chat_json_answer = json_200({"id": "c2", "object": "chat.completion", "created": 1, "model": "m",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole answer"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})


def test_an_event_stream_to_a_request_that_did_not_ask_for_one_is_no_answer(weir):
    # The SDKs got the events' text as the answer (a str) on chat, /v1/messages and /v1/responses.
    import anthropic
    from test_defect_fixes import RawUpstream
    streams, good = RawUpstream(chat_stream_answer), RawUpstream(chat_json_answer)
    try:
        w = weir(config={"pools": {"s": {"endpoints": [streams.url]}, "g": {"endpoints": [good.url]}},
                         "models": {"m": {"pool": "s"}, "fb": {"pool": "s", "fallbacks": [{"pool": "g"}]}}},
                 workers=1)
        o = openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0)
        a = anthropic.Anthropic(base_url=w.base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 502 and e.value.body["code"] == "upstream_invalid_response"
        with pytest.raises(openai.InternalServerError):
            o.responses.create(model="m", input="hi")
        with pytest.raises(anthropic.InternalServerError):
            a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        # With a fallback, the fallback answers.
        r = o.chat.completions.create(model="fb", messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "whole answer"
        # A client that asked for the stream still gets it as it came.
        text = "".join(c.choices[0].delta.content or "" for c in o.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True) if c.choices)
        assert text == "streamed"
    finally:
        streams.close()
        good.close()


def test_a_whole_answer_to_a_streamed_chat_request_becomes_its_stream(weir):
    # The openai SDK read the JSON body of a stream it opened as no chunk and no error.
    from test_defect_fixes import RawUpstream
    up = RawUpstream(chat_json_answer)
    try:
        w = weir(config={"pools": {"s": {"endpoints": [up.url]}}, "default_pool": "s"}, workers=1)
        o = openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0,
                          default_headers={"x-request-id": "whole-as-stream"})
        chunks = list(o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "whole answer"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        line = w.log_for("whole-as-stream")
        assert line["status"] == 200 and line["error"] is None and line["completion_tokens"] == 2, line
    finally:
        up.close()


def completions_json_answer(headers, body) -> bytes:
    # A whole text completion with one choice per prompt of the list, whatever `stream` asked.
    prompts = json.loads(body)["prompt"]
    prompts = prompts if isinstance(prompts, list) else [prompts]
    doc = json.dumps({"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "m",
                      "choices": [{"index": i, "text": f"answer for {p}", "finish_reason": "stop"}
                                  for i, p in enumerate(prompts)]}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(doc) + doc


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_answered_whole_gives_no_member_another_members_completion(weir, stream):
    # Eight members in one batch; the upstream ignored "stream": true and answered one JSON body with every
    # prompt's completion. Every member got that whole body (other tenants' prompts and answers).
    import threading
    from test_defect_fixes import RawUpstream
    up = RawUpstream(completions_json_answer)
    try:
        w = weir(config={"pools": {"b": {"endpoints": [up.url], "batch": {"window": "1s", "max_size": 8}}},
                         "default_pool": "b"}, workers=1)
        got: dict[int, httpx.Response] = {}

        def go(i: int) -> None:
            got[i] = httpx.post(w.v1 + "/completions", timeout=15, json={
                "model": "m", "prompt": f"tenant{i} private", "max_tokens": 5, "stream": stream})

        threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, r in got.items():
            others = [f"tenant{j} private" for j in range(8) if j != i]
            assert not any(o in r.text for o in others), (i, r.text[:300])
            assert r.status_code == 502 or f"tenant{i} private" in r.text, (i, r.status_code, r.text[:300])
    finally:
        up.close()


text_completion_json_answer = json_200({
    "id": "cmpl-3", "object": "text_completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "text": "whole text", "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})


def test_a_whole_answer_made_a_stream_carries_usage_only_when_asked_and_completions_too(weir):
    from test_defect_fixes import RawUpstream
    chat, text = RawUpstream(chat_json_answer), RawUpstream(text_completion_json_answer)
    try:
        w = weir(config={"pools": {"c": {"endpoints": [chat.url]}, "t": {"endpoints": [text.url]}},
                         "models": {"chat": {"pool": "c"}, "text": {"pool": "t"}}}, workers=1)
        o = openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        plain = list(o.chat.completions.create(model="chat", messages=msgs, stream=True))
        assert all(c.usage is None for c in plain), plain  # not asked: none (it rode in the content chunk)
        asked = list(o.chat.completions.create(model="chat", messages=msgs, stream=True,
                                               stream_options={"include_usage": True}))
        assert asked[-1].choices == [] and asked[-1].usage.total_tokens == 5, asked
        assert "".join(c.choices[0].delta.content or "" for c in asked if c.choices) == "whole answer"
        # /v1/completions: the openai SDK's stream got no chunk and no error.
        chunks = list(o.completions.create(model="text", prompt="hi", stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == "whole text", chunks
        assert all(c.usage is None for c in chunks)
        chunks = list(o.completions.create(model="text", prompt="hi", stream=True,
                                           stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == 2, chunks
    finally:
        chat.close()
        text.close()


def three_large_events(headers, body) -> list:
    def chunk(delta, finish=None) -> bytes:
        return b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"
    events = chunk({"role": "assistant", "content": ""}) + b"".join(
        chunk({"content": c * 3_000_000}) for c in "abc") + chunk({}, "stop") + b"data: [DONE]\n\n"
    return [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(events)
            + events]


def test_a_client_that_keeps_reading_is_not_cut_behind_a_burst_of_large_events(weir):
    # Three 3 MB events back to back to a client reading at ~30 MB/s: it falls behind by more than
    # max_stream_buffer (1 MiB), and catches up. It was cut as slow_client.
    from test_defect_fixes import RawUpstream
    up = RawUpstream(three_large_events)
    try:
        w = weir(config={"pools": {"s": {"endpoints": [up.url]}}, "default_pool": "s"}, workers=1)
        body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
        with socket.create_connection(("127.0.0.1", w.port), timeout=30) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Connection: close\r\nx-request-id: paced\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            got = bytearray()
            while chunk := s.recv(65536):
                got += chunk
                time.sleep(0.002)
        assert got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), bytes(got[-200:])
        line = w.log_for("paced")
        assert line["status"] == 200 and line["error"] is None, line
    finally:
        up.close()


@pytest.mark.parametrize("doc", [
    {"object": "error", "message": "vllm error", "type": "BadRequestError", "param": None, "code": 400},
    {"error": {"message": "boom", "type": "server_error"}},
    {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"content": "x"}}]},
])
def test_a_streamed_completions_request_answered_by_no_text_completion_is_no_answer(weir, doc):
    # /v1/completions made any 2xx JSON object its stream's chunk (an error object too: logged 200, no fallback).
    from test_defect_fixes import RawUpstream
    up = RawUpstream(json_200(doc))
    try:
        w = weir(config={"pools": {"s": {"endpoints": [up.url]}}, "default_pool": "s"}, workers=1)
        r = httpx.post(w.v1 + "/completions", timeout=10, json={"model": "m", "prompt": "hi", "stream": True})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_invalid_response", r.text
    finally:
        up.close()


def test_an_empty_2xx_to_a_streamed_request_is_no_answer(weir):
    # The openai SDK read an empty 200 (or a 204) given to the stream it opened as a whole stream with no chunk.
    from test_defect_fixes import RawUpstream
    empty = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n")
    good = RawUpstream(chat_json_answer)
    try:
        w = weir(config={"pools": {"e": {"endpoints": [empty.url]}, "g": {"endpoints": [good.url]}},
                         "models": {"m": {"pool": "e"}, "fb": {"pool": "e", "fallbacks": [{"pool": "g"}]}}}, workers=1)
        o = openai.OpenAI(base_url=w.v1, api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            list(o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in o.chat.completions.create(
            model="fb", messages=[{"role": "user", "content": "hi"}], stream=True) if c.choices)
        assert text == "whole answer"
        # Not asked for a stream: the empty 200 passes as it came (the upstream's word).
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.content == b""
    finally:
        empty.close()
        good.close()
