"""Regression tests for defects found in stop 32 (each failed on the build before the fix): the
access log of a refused head named no method or path, a body that timed out logged no bytes,
HEAD /version lacked the Content-Length its GET has, and an Anthropic or Responses client that
asked for a stream got a whole JSON body when the upstream ignored `stream: true`. Real weir and
weir-mock processes on free ports, raw sockets and a scripted upstream where the bytes matter."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from conftest import wait_until
from httpwire import RawConn, roundtrip
from test_defect_fixes import RawUpstream


@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    up = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    return module_weir(config={"pools": {"p": {"endpoints": [up.base_url]}}, "default_pool": "p",
                               "server": {"max_header": "4KiB", "body_timeout": "1s"}}, workers=1)


def lines_for(gw, path: str, status: int) -> list[dict]:
    return [e for e in gw.log_entries() if e.get("path") == path and e.get("status") == status]


@pytest.mark.parametrize("head,status", [
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 5000 + b"\r\n\r\n", 431),
    (b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", 400),
], ids=["too_large", "malformed"])
def test_a_refused_head_is_logged_with_its_request_line(gw, head, status):
    method, target = head.split(b" ")[:2]
    path = target.decode().split("?")[0]
    before = len(lines_for(gw, path, status))
    r = roundtrip(gw.port, head, method=method.decode())
    assert r.status == status
    wait_until(lambda: len(lines_for(gw, path, status)) > before, 5, message="the refused head's line")
    line = lines_for(gw, path, status)[-1]
    assert line["method"] == method.decode(), line
    assert "request_id" in line and line["request_id"], line


def test_a_head_with_no_request_line_is_logged_without_one(gw):
    before = len([e for e in gw.log_entries() if e.get("status") == 400 and e.get("method") == "-"])
    r = roundtrip(gw.port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
    assert r.status == 400
    entries = gw.wait_log(lambda es: len([e for e in es if e.get("status") == 400 and e.get("method") == "-"]) > before)
    line = [e for e in entries if e.get("status") == 400 and e.get("method") == "-"][-1]
    assert not line.get("path"), line


def test_a_body_that_times_out_logs_the_bytes_that_came(gw):
    with RawConn(gw.port) as c:
        c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"x-request-id: slow-body-32\r\nContent-Length: 100\r\n\r\n" + b"{" * 37)
        r = c.read_response("POST")
        assert r.status == 408
    line = gw.log_for("slow-body-32")
    assert line["bytes_in"] == 37, line


def test_head_version_has_the_content_length_of_its_get(gw):
    get = httpx.get(gw.base_url + "/version", timeout=10)
    assert get.status_code == 200, get.text
    head = httpx.head(gw.base_url + "/version", timeout=10)
    assert head.status_code == 200
    assert head.headers.get("content-length") == str(len(get.content)), head.headers


# ------------------------------------------------------- an upstream that ignores stream: true

def whole_answer(headers, body):
    """An OpenAI-compatible upstream that answers every request with the whole chat completion."""
    asked = json.loads(body)
    page = json.dumps({
        "id": "chatcmpl-whole", "object": "chat.completion", "created": 1, "model": asked.get("model", "m"),
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Hello there",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))


@pytest.fixture(scope="module")
def whole(module_weir):
    raw = RawUpstream(whole_answer)
    w = module_weir(config={"pools": {"raw": {"endpoints": [raw.url]}}, "default_pool": "raw"}, workers=1)
    yield w
    raw.close()


def test_an_anthropic_stream_is_made_from_an_upstream_answer_that_ignored_stream(whole):
    client = anthropic.Anthropic(base_url=whole.base_url, api_key="k", max_retries=0, timeout=30)
    with client.messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}],
                                tools=[{"name": "get_weather", "input_schema": {"type": "object"}}]) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop", events
    assert [b.type for b in final.content] == ["text", "tool_use"], final
    assert final.content[0].text == "Hello there"
    assert final.content[1].name == "get_weather" and final.content[1].input == {"city": "Oslo"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 5


def test_a_responses_stream_is_made_from_an_upstream_answer_that_ignored_stream(whole):
    client = openai.OpenAI(base_url=whole.v1, api_key="k", max_retries=0, timeout=30)
    events = list(client.responses.create(model="m", input="hi", stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello there"
    done = events[-1].response
    assert done.usage.output_tokens == 5
    assert [o.type for o in done.output] == ["message", "function_call"], done.output


def test_a_plain_chat_stream_passes_the_whole_answer_as_sent(whole):
    # The client's and the upstream's dialect are the same: Weir relays what came, as any proxy would.
    r = httpx.post(whole.v1 + "/chat/completions", timeout=10,
                   json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), r.headers
    assert r.json()["choices"][0]["message"]["content"] == "Hello there"
