"""A long whole answer on a translated route (stop 50).

An OpenAI pool's 20 MB chat completion, answered to an Anthropic or Responses client (and, as a whole JSON body,
to a streamed request of theirs or of a chat client): its text arrives intact, every escape and multi-byte
character kept. The translation now writes its output by hand into room reserved once (the body reserved by its
Content-Length, no DOM serialized into a string grown by doubling, the stream's one chunk made once), where it
copied the body several times over on the worker's thread; this checks that the rewritten paths lose nothing.
(How long the worker is held is measured, not tested: tests check behaviour, never speed.)
"""
from __future__ import annotations

import json

import httpx
import pytest

from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hi"}]
# Every kind of byte the translation escapes or passes: quotes, backslashes, control bytes, 2- to 4-byte UTF-8.
PIECE = 'plain text, "quoted", back\\slash, tab\there, new\nline, héllo wörld, 日本語, 😀, ctrl\x01\x1f. '
TEXT = PIECE * ((20 << 20) // len(PIECE.encode()))
ANSWER = json.dumps({"id": "chatcmpl-big", "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}},
                    ensure_ascii=False).encode()


def _events(body: bytes) -> list[dict]:
    out = []
    for block in body.decode().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out.append(json.loads(line[5:]))
    return out


def _text(path: str, stream: bool, r: httpx.Response) -> str:
    if not stream:
        doc = r.json()
        if path == "/messages":
            return "".join(b["text"] for b in doc["content"] if b["type"] == "text")
        return "".join(p["text"] for item in doc["output"] if item["type"] == "message" for p in item["content"])
    events = _events(r.content)
    if path == "/messages":
        return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    if path == "/responses":
        return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))


@pytest.mark.parametrize("path,stream", [("/messages", False), ("/responses", False), ("/messages", True),
                                         ("/responses", True), ("/chat/completions", True)],
                         ids=["messages", "responses", "messages-stream", "responses-stream", "chat-stream"])
def test_a_20mb_translated_answer_arrives_intact(weir, path, stream):
    up = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(ANSWER), ANSWER))
    try:
        w = weir(config={"server": {"max_response": "64MiB"}, "pools": {"p": {"endpoints": [up.url]}},
                         "models": {"m": {"pool": "p"}}}, workers=1)
        body = {"model": "m", "input": "hi"} if path == "/responses" else {"model": "m", "messages": MSG,
                                                                             "max_tokens": 5}
        body["stream"] = stream
        r = httpx.post(w.v1 + path, json=body, headers={"x-request-id": "big", "anthropic-version": "2023-06-01"},
                       timeout=120)
        assert r.status_code == 200, r.text[:500]
        assert _text(path, stream, r) == TEXT
        if path == "/messages" and not stream:
            assert r.json()["usage"]["output_tokens"] == 7 and r.json()["stop_reason"] == "end_turn", r.json()["usage"]
        if path == "/responses" and not stream:
            assert r.json()["usage"]["output_tokens"] == 7 and r.json()["status"] == "completed"
    finally:
        up.close()
