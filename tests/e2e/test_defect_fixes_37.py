"""Defects found in stop 37 (a review, then a black-box round against it): streams that end before their first
content event (an empty event stream passed as an empty 200; a translated route that never failed over; a fallback
sent stream_options on a stream:false body), charging by an earlier target's head or an in-band error, and request
bodies read 512 bytes at a time (every body still arrives whole, at every size and framing)."""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import socket
import time

import anthropic
import httpx
import openai
import pytest

from test_defect_fixes import RawUpstream

KEY = "sk-test-37-charge-0123456789"


def sse_head_then_nothing(headers, body) -> bytes:
    # A 2xx stream head and an empty body: the stream ends before its first token (no [DONE]).
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n"


def test_a_client_that_leaves_a_failed_over_stream_is_not_charged_by_the_first_targets_head(module_weir):
    # Target 1 answered 200 and broke before any event (fail over: nothing reached the client);
    # the client left while target 2 had not answered. No upstream did work the client got: the
    # request (a 499) is charged nothing, as the same request on target 2 alone would be. (The
    # first target's 200 was kept as the request's upstream status, and charged the prompt.)
    seen_second = []

    def never_answers(headers, body):
        seen_second.append(headers.get("x-request-id"))
        time.sleep(3)
        return None

    first, second = RawUpstream(sse_head_then_nothing), RawUpstream(never_answers)
    w = module_weir(config={
        "pools": {"a": {"endpoints": [first.url]}, "b": {"endpoints": [second.url]}},
        "models": {"m": {"pool": "a", "fallbacks": [{"pool": "b"}]}},
        "pricing": {"*": {"input": 1000.0, "output": 1000.0}},
        "tenants": {"t": {"budget": {"usd": 100, "period": "24h"}}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                                                 "tenant": "t"}]}}, workers=1)
    try:
        hdrs = {"authorization": f"Bearer {KEY}", "x-request-id": "fo-499"}
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi " * 200}]}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(w.v1 + "/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.8), headers=hdrs)
        line = w.log_for("fo-499")
        assert line["status"] == 499, line
        # (Upstream, the client's id with a generated one after it.)
        # (The failover's upstream id: the client's, Weir's generated one, and -1, its send's number.)
        assert [re.sub(r"-[0-9a-f]{28}(-\d+)?$", "", s) for s in seen_second] == ["fo-499"], \
            "the request did not fail over"
        assert [a.get("failure") for a in line.get("attempts", [])][:1] == ["protocol"], line
        assert not line.get("spend_usd"), line
    finally:
        first.close()
        second.close()


def test_an_event_stream_with_an_empty_body_is_no_answer(module_weir, module_mock):
    # A 200 text/event-stream whose body is empty (Content-Length: 0, or the last chunk at once) has
    # no event and no [DONE]: it was relayed as an empty 200, logged as a success. It is a stream
    # that broke before its first byte: 502 alone, the fallback's answer with one.
    empties = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"]
    ups = [RawUpstream(lambda headers, body, data=data: data) for data in empties]
    backup = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    pools = {f"e{i}": {"endpoints": [up.url]} for i, up in enumerate(ups)} | {"b": {"endpoints": [backup.base_url]}}
    models = {f"alone{i}": {"pool": f"e{i}"} for i in range(len(ups))}
    models |= {f"fb{i}": {"pool": f"e{i}", "fallbacks": [{"pool": "b"}]} for i in range(len(ups))}
    w = module_weir(config={"pools": pools, "models": models}, workers=1)
    try:
        client = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0)
        for i in range(len(ups)):
            for stream in (True, False):
                with pytest.raises(openai.APIStatusError) as e:
                    r = client.chat.completions.create(model=f"alone{i}", stream=stream, max_tokens=2,
                                                       messages=[{"role": "user", "content": "hi"}])
                    list(r) if stream else r
                assert e.value.status_code == 502, e.value
                assert e.value.body["code"] == "upstream_unavailable", e.value.body
                chunks = client.chat.completions.create(model=f"fb{i}", stream=True, max_tokens=2,
                                                        messages=[{"role": "user", "content": "hi"}])
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), "no tokens"
        assert (w.metric("weir_upstream_failures_total") or 0) >= 2 * len(ups)
    finally:
        for up in ups:
            up.close()


def echo_length(headers, body) -> bytes:
    # A chat.completion whose content is the body's length and SHA-256 as the upstream received it.
    msg = f"{len(body)}:{hashlib.sha256(body).hexdigest()}"
    out = json.dumps({"id": "chatcmpl-37", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": msg},
                                   "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out


@pytest.fixture(scope="module")
def echo(module_weir):
    up = RawUpstream(echo_length)
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p",
                            "server": {"max_body": "8MiB"}}, workers=1)
    yield w
    up.close()


def chat_body(n: int) -> bytes:
    head = b'{"model":"m","messages":[{"role":"user","content":"'
    tail = b'"}]}'
    return head + b"x" * (n - len(head) - len(tail)) + tail


def read_answers(s: socket.socket, n: int) -> list[bytes]:
    """Reads `n` Content-Length answers from `s`, each as its status line, CRLF, body."""
    out, buf = [], b""
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            got = s.recv(65536)
            assert got, f"closed after {len(out)} answers"
            buf += got
        head, buf = buf.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(buf) < length:
            got = s.recv(65536)
            assert got, "closed mid-body"
            buf += got
        out.append(head.split(b"\r\n")[0] + b"\r\n" + buf[:length])
        buf = buf[length:]
    return out


def raw_exchange(port: int, requests: list[bytes]) -> list[bytes]:
    """Sends every request on one connection at once (pipelined), then reads the answers in order."""
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        s.sendall(b"".join(requests))
        return read_answers(s, len(requests))
    finally:
        s.close()


def echoed(answer: bytes) -> str:
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    return json.loads(answer.split(b"\r\n", 1)[1])["choices"][0]["message"]["content"]


def digest(body: bytes) -> str:
    return f"{len(body)}:{hashlib.sha256(body).hexdigest()}"


def post(body: bytes, chunked: bool = False, piece: int = 0) -> bytes:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    if not chunked:
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    step = piece or len(body)
    chunks = b"".join(b"%x\r\n" % len(body[i:i + step]) + body[i:i + step] + b"\r\n" for i in range(0, len(body), step))
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


@pytest.mark.parametrize("size", [300, 2_300, 32_769, 70_000, 1 << 20, 3_900_000])
def test_bodies_of_every_size_reach_the_upstream_whole_on_a_kept_alive_connection(echo, size):
    # Reads are sized by what the body still lacks (up to 64 KiB): each of several bodies in a row,
    # pipelined on one connection, reaches the upstream byte for byte, and the next request's head,
    # read together with the last bytes of a body, is still served.
    bodies = [chat_body(size), chat_body(size + 1), chat_body(301)]
    answers = raw_exchange(echo.port, [post(b) for b in bodies])
    assert [echoed(a) for a in answers] == [digest(b) for b in bodies]


@pytest.mark.parametrize("piece", [0, 1000, 70_000])
def test_a_chunked_body_reaches_the_upstream_whole(echo, piece):
    body = chat_body(1 << 20)
    (a,) = raw_exchange(echo.port, [post(body, chunked=True, piece=piece)])
    assert echoed(a) == digest(body)


def test_a_body_that_arrives_in_small_pieces_is_read_whole(echo):
    bodies = [chat_body(5_000), chat_body(40_000)]
    s = socket.create_connection(("127.0.0.1", echo.port), timeout=20)
    try:
        for b in bodies:
            req = post(b)
            for i in range(0, len(req), 700):
                s.sendall(req[i:i + 700])
                time.sleep(0.001)
            (a,) = read_answers(s, 1)
            assert echoed(a) == digest(b)
    finally:
        s.close()


# --- streams that end before their first content event -------------------------------------------------------

SSE_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


EMPTY = gzip.compress(b"")
NO_USAGE = json.dumps({"id": "chatcmpl-nu", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                    "finish_reason": "stop"}]}).encode()
SCENARIOS = {
    # comments only, then the body's end: no event at all
    "comment_only": [SSE_CHUNKED + chunk(b": ping\n\n") + b"0\r\n\r\n"],
    # a head with no length, then a close
    "empty_close": [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n", 0.1],
    # the body's end in a later read
    "chunk0_slow": [SSE_CHUNKED, 0.2, b"0\r\n\r\n"],
    # [DONE] and nothing before it
    "done_only": [SSE_CHUNKED + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"],
    # an event stream in gzip that decodes to nothing
    "gzip_empty": [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(EMPTY) + EMPTY],
    # a role chunk and a usage chunk (50k / 50k tokens), then a close: no content
    "usage_no_content": [SSE_CHUNKED + chunk(b'data: {"id":"c","object":"chat.completion.chunk","created":1,'
                                             b'"model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
                                             b'"content":""},"finish_reason":null}]}\n\n')
                         + chunk(b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
                                 b'"choices":[],"usage":{"prompt_tokens":50000,"completion_tokens":50000,'
                                 b'"total_tokens":100000}}\n\n'), 0.05],
    "status_500": [b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 50"
                   b"\r\n\r\n" + json.dumps({"error": {"message": "boom", "type": "x", "code": 500}}).encode()[:50]],
    # a whole completion, no usage in it, whatever the client asked
    "json_no_usage": [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(NO_USAGE), NO_USAGE)],
    # empty answers that are not streams: passed as they came
    "json_empty": [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n"],
    "no_content": [b"HTTP/1.1 204 No Content\r\n\r\n"],
}


@pytest.fixture(scope="module")
def scripted(module_weir, module_mock):
    # Each request gets the steps of the scenario its model names ("fb-X" is X's), then a close.
    up = RawUpstream(lambda headers, body: SCENARIOS[json.loads(body)["model"].removeprefix("fb-")] + [None])
    backup = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "3")
    models = {name: {"pool": "s"} for name in SCENARIOS}
    models |= {f"fb-{name}": {"pool": "s", "fallbacks": [{"pool": "b", "upstream_model": "mock-model"}]}
               for name in SCENARIOS}
    # A target that reports usage and breaks before content, then one that answers 500 or a stream.
    models["usage-then-500"] = {"pool": "s", "upstream_model": "usage_no_content",
                                "fallbacks": [{"pool": "s", "upstream_model": "status_500"}]}
    models["usage-then-answer"] = {"pool": "s", "upstream_model": "usage_no_content",
                                   "fallbacks": [{"pool": "b", "upstream_model": "mock-model"}]}
    w = module_weir(config={
        "pools": {"s": {"endpoints": [up.url], "max_idle_per_endpoint": 0}, "b": {"endpoints": [backup.base_url]}},
        "models": models,
        "pricing": {"*": {"input": 1000.0, "output": 1000.0}},
        "tenants": {"t": {"budget": {"usd": 100, "period": "24h"}}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                                                 "tenant": "t"}]}}, workers=1)
    yield w
    up.close()


@pytest.mark.parametrize("scenario", ["comment_only", "empty_close", "chunk0_slow"])
def test_a_non_streamed_request_fails_over_an_empty_stream_as_a_non_streamed_request(scripted, scenario):
    # The first target streamed (no event) to a stream:false request; the fallback was then asked for
    # stream_options with stream still false, which vLLM (and the mock) refuse with a 400.
    client = openai.OpenAI(base_url=scripted.v1, api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model=f"fb-{scenario}", max_tokens=3, stream=False,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_headers={"x-request-id": f"d1-{scenario}"})
    assert r.choices[0].message.content and r.usage.completion_tokens == 3, r
    line = scripted.log_for(f"d1-{scenario}")
    assert line["status"] == 200 and [a["failure"] for a in line["attempts"]] == ["protocol", None], line


@pytest.mark.parametrize("scenario", ["comment_only", "empty_close", "chunk0_slow", "done_only"])
def test_a_translated_stream_that_ends_before_its_first_content_fails_over(scripted, scenario):
    # /v1/chat/completions held the head and failed over; /v1/messages and /v1/responses relayed the
    # first target's head and ended in the translation's error, with no fallback tried.
    client = anthropic.Anthropic(base_url=scripted.base_url, api_key=KEY, max_retries=0)
    with client.messages.stream(model=f"fb-{scenario}", max_tokens=3, messages=[{"role": "user", "content": "hi"}],
                                extra_headers={"x-request-id": f"d2m-{scenario}"}) as s:
        final = s.get_final_message()
    assert final.content[0].text and final.stop_reason in ("end_turn", "max_tokens"), final
    line = scripted.log_for(f"d2m-{scenario}")
    assert line["status"] == 200 and [a["failure"] for a in line["attempts"]] == ["protocol", None], line
    r = httpx.post(scripted.v1 + "/responses", timeout=10,
                   headers={"authorization": f"Bearer {KEY}", "x-request-id": f"d2r-{scenario}"},
                   json={"model": f"fb-{scenario}", "input": "hi", "max_output_tokens": 3, "stream": True})
    assert r.status_code == 200 and "event: response.completed" in r.text, r.text[-400:]
    assert "response.failed" not in r.text


def test_an_event_stream_that_decodes_to_nothing_is_no_answer(scripted):
    client = openai.OpenAI(base_url=scripted.v1, api_key=KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        list(client.chat.completions.create(model="gzip_empty", max_tokens=3, stream=True,
                                            messages=[{"role": "user", "content": "hi"}]))
    assert e.value.status_code == 502, e.value
    chunks = client.chat.completions.create(model="fb-gzip_empty", max_tokens=3, stream=True,
                                            messages=[{"role": "user", "content": "hi"}])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("scenario", ["empty_close", "chunk0_slow"])
def test_a_stream_that_ends_before_its_first_content_is_not_charged(scripted, scenario):
    # Alone (no fallback): only the head and the in-band error reach the client, as Content-Length: 0
    # gives a 502; neither is charged (the estimate was charged when the end came in a later read).
    rid = f"d5-{scenario}"
    r = httpx.post(scripted.v1 + "/chat/completions", timeout=10,
                   headers={"authorization": f"Bearer {KEY}", "x-request-id": rid},
                   json={"model": scenario, "stream": True, "max_tokens": 3,
                         "messages": [{"role": "user", "content": "hi " * 100}]})
    assert '"code":"upstream_unavailable"' in r.text, r.text
    line = scripted.log_for(rid)
    assert line["error"]["code"] == "upstream_unavailable", line
    assert not line.get("spend_usd"), line


@pytest.mark.parametrize("scenario,status", [("json_empty", 200), ("no_content", 204)])
@pytest.mark.parametrize("stream", [True, False])
def test_an_empty_answer_passes_as_it_came_and_is_not_charged(scripted, scenario, status, stream):
    # It carried no completion: it was charged the prompt estimate. (Since stop 38 an empty 2xx to a
    # streamed request is a stream that ended before its first byte: a 502, as an empty event stream is,
    # since the openai SDK read it as a whole stream with no chunk.)
    rid = f"empty-{scenario}-{stream}"
    r = httpx.post(scripted.v1 + "/chat/completions", timeout=10,
                   headers={"authorization": f"Bearer {KEY}", "x-request-id": rid},
                   json={"model": scenario, "stream": stream, "max_tokens": 3,
                         "messages": [{"role": "user", "content": "hi " * 100}]})
    want = 502 if stream else status
    assert r.status_code == want and (stream or r.content == b""), (r.status_code, r.content)
    line = scripted.log_for(rid)
    assert line["status"] == want and not line.get("spend_usd"), line


@pytest.mark.parametrize("stream", [True, False])
def test_usage_of_a_failed_over_attempt_is_not_the_requests(scripted, stream):
    # The first target's usage chunk (100k tokens) was kept after it failed over: a fallback that
    # answered 500 left the request charged 100 USD, one that answered was charged for the first's tokens.
    hdrs = {"authorization": f"Bearer {KEY}"}
    body = {"stream": stream, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(scripted.v1 + "/chat/completions", timeout=10, headers=hdrs | {"x-request-id": f"u500-{stream}"},
                   json=body | {"model": "usage-then-500"})
    assert r.status_code in (500, 502), r.text
    line = scripted.log_for(f"u500-{stream}")
    assert not line.get("spend_usd") and not line.get("prompt_tokens"), line
    r = httpx.post(scripted.v1 + "/chat/completions", timeout=10, headers=hdrs | {"x-request-id": f"uok-{stream}"},
                   json=body | {"model": "usage-then-answer"})
    assert r.status_code == 200, r.text
    line = scripted.log_for(f"uok-{stream}")
    assert line["status"] == 200 and 0 < line["spend_usd"] < 1, line
    assert line.get("prompt_tokens", 0) < 1000, line


def test_a_chat_stream_with_nothing_but_done_is_not_charged(scripted):
    rid = "done-only-chat"
    r = httpx.post(scripted.v1 + "/chat/completions", timeout=10,
                   headers={"authorization": f"Bearer {KEY}", "x-request-id": rid},
                   json={"model": "done_only", "stream": True, "max_tokens": 3,
                         "messages": [{"role": "user", "content": "hi " * 100}]})
    assert r.status_code == 200 and "data: [DONE]" in r.text, r.text
    line = scripted.log_for(rid)
    assert not line.get("spend_usd"), line


def content_chunk(delta: dict) -> bytes:
    return chunk(b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode()
                 + b"\n\n")


@pytest.mark.parametrize("refusal", [400, 500])
def test_a_resumed_stream_whose_continuation_is_refused_is_still_charged(module_weir, refusal):
    # Content ("he") reached the client, then the stream broke; the resume's continuation was refused.
    # The continuation's head replaced the request's 2xx upstream status, so it was charged nothing.
    def answer(headers, body):
        if json.loads(body).get("continue_final_message"):
            err = b'{"error":{"message":"no","type":"x","code":%d}}' % refusal
            return [b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (refusal, len(err))
                    + err, None]
        return [SSE_CHUNKED + content_chunk({"role": "assistant", "content": ""}) + content_chunk({"content": "he"}),
                0.1, None]

    ups = [RawUpstream(answer), RawUpstream(answer)]
    w = module_weir(config={
        "pools": {"r": {"endpoints": [u.url for u in ups], "resume": True, "retry": {"attempts": 3}}},
        "models": {"m": {"pool": "r"}},
        "pricing": {"*": {"input": 1000.0, "output": 1000.0}},
        "tenants": {"t": {"budget": {"usd": 100, "period": "24h"}}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                                                 "tenant": "t"}]}}, workers=1)
    try:
        rid = f"resume-refused-{refusal}"
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       headers={"authorization": f"Bearer {KEY}", "x-request-id": rid},
                       json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi " * 100}]})
        assert '"content": "he"' in r.text and "upstream_unavailable" in r.text, r.text
        line = w.log_for(rid)
        assert [a.get("resume") for a in line["attempts"]][-1] is True, line
        assert line.get("spend_usd", 0) > 0, line
    finally:
        for u in ups:
            u.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_whole_answer_without_usage_is_charged_the_estimate_whatever_the_client_asked(scripted, stream):
    # (A stream:true request answered with a whole body has no content event: it is no stream that
    # broke before its first token.)
    rid = f"no-usage-{stream}"
    r = httpx.post(scripted.v1 + "/chat/completions", timeout=10,
                   headers={"authorization": f"Bearer {KEY}", "x-request-id": rid},
                   json={"model": "json_no_usage", "stream": stream, "max_tokens": 3,
                         "messages": [{"role": "user", "content": "hi " * 100}]})
    assert r.status_code == 200, r.text
    if stream:  # (since stop 38 the whole answer becomes the stream's one chunk, then [DONE])
        data = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert data[-1] == "[DONE]" and json.loads(data[0])["choices"][0]["delta"]["content"] == "ok", r.text
    else:
        assert r.json()["choices"][0]["message"]["content"] == "ok", r.text
    line = scripted.log_for(rid)
    assert line.get("spend_usd", 0) > 0, line
