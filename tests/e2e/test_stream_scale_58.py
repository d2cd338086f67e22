"""Stream translation stays linear in the number of output items (helper fixcplx58; defects found by cplx58).

A worker runs one event loop: work superlinear in one stream's items stalls every request of the worker.

* /v1/responses gave each output item a unique id by trying _1, _2, ... against every earlier item: the k-th
  item of a kind cost k x N compares, O(N^3) per stream. 4,000 alternating reasoning/text deltas took 8 s of
  a worker's CPU, 8,000 took 64 s; 20,000 (below) would take over 15 minutes. An item's suffix is now its
  count among the items of its stem.
* Tool calls (ToolCallStream, under /v1/messages and /v1/responses) were routed by a scan of every call so
  far per delta, and "is a call held" scanned from the first: quadratic in the calls (64,000 calls: 5.7 s
  on /v1/messages, 22 s from an Anthropic pool to /v1/responses). A map and a cursor now.

The upstream here is a raw socket server that streams N items at once. Every test reads the whole stream and
checks it whole (every item, its id unique, the terminal event); a generous timeout (pytest-timeout) guards
the slow path, far from what the fixed code takes.
"""

from __future__ import annotations

import json
import socket
import threading

import anthropic
import httpx
import pytest

N = 20000


def chat_chunk(delta: dict, finish: str | None = None) -> str:
    c = {"id": "chatcmpl-scale", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return "data: " + json.dumps(c, separators=(",", ":")) + "\n\n"


def ant_event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: " + json.dumps(data, separators=(",", ":")) + "\n\n"


def alternating() -> str:
    """N chat deltas, reasoning_content and content in turn: N output items."""
    parts = [chat_chunk({"role": "assistant", "content": ""})]
    parts += [chat_chunk({"reasoning_content": "r"} if i % 2 == 0 else {"content": "a"}) for i in range(N)]
    parts += [chat_chunk({}, "stop"), "data: [DONE]\n\n"]
    return "".join(parts)


def tool_calls() -> str:
    """N tool calls, each begun (index i, its id and name) before any has arguments; then the arguments of
    each, the last call's first (the first call streams, the others are held)."""
    parts = [chat_chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                         "function": {"name": f"f{i}", "arguments": ""}}]}) for i in range(N)]
    parts += [chat_chunk({"tool_calls": [{"index": i, "function": {"arguments": json.dumps({"n": i})}}]})
              for i in reversed(range(N))]
    parts += [chat_chunk({}, "tool_calls"), "data: [DONE]\n\n"]
    return "".join(parts)


def anthropic_blocks(kind: str) -> str:
    """An Anthropic Messages stream of N blocks: thinking and text in turn, or tool_use blocks."""
    parts = [ant_event("message_start", {"type": "message_start", "message": {
        "id": "msg_scale", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}})]
    for i in range(N):
        if kind == "tools":
            block = {"type": "tool_use", "id": f"toolu_{i}", "name": "f", "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps({"n": i})}
        elif i % 2 == 0:
            block = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": "t"}
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": "a"}
        parts.append(ant_event("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": block}))
        parts.append(ant_event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
        if block["type"] == "thinking":
            parts.append(ant_event("content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "signature_delta", "signature": "s"}}))
        parts.append(ant_event("content_block_stop", {"type": "content_block_stop", "index": i}))
    stop = "tool_use" if kind == "tools" else "end_turn"
    parts.append(ant_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop,
                                                                                "stop_sequence": None},
                                             "usage": {"output_tokens": N}}))
    parts.append(ant_event("message_stop", {"type": "message_stop"}))
    return "".join(parts)


BODIES = {"alt": alternating, "tools": tool_calls, "ant-alt": lambda: anthropic_blocks("alt"),
          "ant-tools": lambda: anthropic_blocks("tools")}


class StreamUpstream:
    """Answers every POST (chat completions or Anthropic messages) with the SSE body its model names
    (BODIES), one answer per connection."""

    def __init__(self):
        self.bodies: dict[str, bytes] = {}
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self):
        self.sock.close()

    def body(self, model: str) -> bytes:
        if model not in self.bodies:
            self.bodies[model] = BODIES[model]().encode()
        return self.bodies[model]

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        conn.settimeout(120)
        with conn:
            try:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    k, _, v = line.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip())
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                body = self.body(json.loads(buf[:length])["model"])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                conn.sendall(body)
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass


@pytest.fixture(scope="module")
def gateway(module_weir):
    up = StreamUpstream()
    config = {
        "workers": 1,
        "pools": {"chat": {"endpoints": [up.base_url]},
                  "ant": {"type": "anthropic", "endpoints": [up.base_url]}},
        "default_pool": "chat",
        "models": {"ant-alt": {"pool": "ant"}, "ant-tools": {"pool": "ant"}},
    }
    yield module_weir(config=config)
    up.stop()


def responses_stream(w, model: str) -> list[dict]:
    """The events of a streamed /v1/responses answer, each event's data (read with httpx and json: the openai
    SDK's models cost the test more CPU than Weir spends on the stream)."""
    events = []
    with httpx.stream("POST", w.v1 + "/responses", json={"model": model, "input": "hi", "stream": True},
                      headers={"authorization": "Bearer test"}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def check_items(events: list[dict], kinds: list[str]) -> list[str]:
    """Every output item added once, done once, in order, each with its own id; the terminal response has
    them all with the same ids."""
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == list(range(len(kinds)))
    assert [e["item"]["type"] for e in added] == kinds
    ids = [e["item"]["id"] for e in added]
    assert len(set(ids)) == len(ids)
    assert [e["item"]["id"] for e in done] == ids
    assert events[-1]["type"] == "response.completed", events[-1]
    assert [o["id"] for o in events[-1]["response"]["output"]] == ids
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return ids


@pytest.mark.timeout(60)
def test_twenty_thousand_alternating_items_have_unique_ids(gateway):
    events = responses_stream(gateway, "alt")
    ids = check_items(events, ["reasoning", "message"] * (N // 2))
    assert ids[:4] == ["rs_scale", "msg_scale", "rs_scale_1", "msg_scale_1"]
    assert ids[-1] == f"msg_scale_{N // 2 - 1}"
    # Each delta names its item.
    texts = [e["item_id"] for e in events if e["type"] == "response.output_text.delta"]
    assert texts == ids[1::2]


@pytest.mark.timeout(60)
def test_twenty_thousand_tool_calls_to_responses(gateway):
    events = responses_stream(gateway, "tools")
    check_items(events, ["function_call"] * N)
    out = events[-1]["response"]["output"]
    assert [(o["call_id"], o["name"], json.loads(o["arguments"])) for o in out] == \
        [(f"call_{i}", f"f{i}", {"n": i}) for i in range(N)]


@pytest.mark.timeout(60)
def test_twenty_thousand_tool_calls_to_messages(gateway):
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key="test", max_retries=0, timeout=120)
    with client.messages.stream(model="tools", max_tokens=10,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    assert [(b.type, b.id, b.name, b.input) for b in message.content] == \
        [("tool_use", f"call_{i}", f"f{i}", {"n": i}) for i in range(N)]


@pytest.mark.timeout(60)
def test_anthropic_pool_alternating_blocks_to_responses(gateway):
    events = responses_stream(gateway, "ant-alt")
    check_items(events, ["reasoning", "message"] * (N // 2))


@pytest.mark.timeout(60)
def test_anthropic_pool_tool_use_blocks_to_responses(gateway):
    events = responses_stream(gateway, "ant-tools")
    check_items(events, ["function_call"] * N)
    out = events[-1]["response"]["output"]
    assert [(o["call_id"], json.loads(o["arguments"])) for o in out] == [(f"toolu_{i}", {"n": i}) for i in range(N)]
