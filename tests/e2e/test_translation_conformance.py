"""Conformance of Weir's stream translators at every split point, end to end.

Recorded upstream streams (tests/e2e/streams/: vLLM chunk streams for the
/v1/messages and /v1/responses translators, Anthropic event streams for the
Anthropic-upstream translator) are replayed by a scripted upstream that
splits the body bytes at a position and waits until Weir has read the first
piece before sending the rest (scripted_upstream.py, ``x-split``), through
one running Weir. For each route × stream the client's bytes must equal
those of the unsplit replay at every split point tested: every event
boundary and the bytes on either side of it, every byte inside a multi-byte
UTF-8 character, and a stride through the rest; and once with every byte in
a read of its own. The unsplit answer is checked against the target
protocol's event grammar.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import threading

import pytest

from scripted_upstream import ScriptedUpstream, recorded

VLLM = ["text", "tools", "reasoning", "repeated_finish", "error"]
ANTHROPIC = ["text", "tools", "thinking", "error"]

# (client route, model, body, streams, grammar)
CASES = (
    [("/v1/messages", "m-vllm", {"max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
      f"vllm_{s}.sse", "anthropic") for s in VLLM]
    + [("/v1/responses", "m-vllm", {"input": "Hi", "stream": True}, f"vllm_{s}.sse", "responses") for s in VLLM]
    + [("/v1/chat/completions", "m-claude",
        {"stream": True, "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": "Hi"}]},
        f"anthropic_{s}.sse", "chat") for s in ANTHROPIC]
    + [("/v1/responses", "m-claude", {"input": "Hi", "stream": True}, f"anthropic_{s}.sse", "responses")
       for s in ANTHROPIC]
    + [("/v1/messages", "m-claude",
        {"max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
        f"anthropic_{s}.sse", "passthrough") for s in ANTHROPIC]
)


@pytest.fixture(scope="module")
def stack(module_weir):
    up = ScriptedUpstream().start()
    w = module_weir(config={
        "pools": {"vllm": {"endpoints": [up.base_url]},
                  "claude": {"type": "anthropic", "endpoints": [up.base_url]}},
        "models": {"m-vllm": {"pool": "vllm"}, "m-claude": {"pool": "claude"}},
    }, workers=2)
    yield up, w
    up.stop()


def split_points(body: bytes, stride: int = 53) -> list[int]:
    """Every event boundary and its neighbours, every byte inside a multi-byte
    UTF-8 character, the field names' edges, and a stride through the rest."""
    points: set[int] = set()
    for m in re.finditer(rb"\n\n", body):
        end = m.end()
        points.update({end - 2, end - 1, end, end + 1})
    for m in re.finditer(rb"(?:event|data): ", body):
        points.update({m.start() + 1, m.end() - 1, m.end()})
    for i, b in enumerate(body):
        if 0x80 <= b < 0xC0:  # a continuation byte: the split falls inside a character
            points.add(i)
    points.update(range(stride // 2, len(body), stride))
    return sorted(p for p in points if 0 < p < len(body))


_local = threading.local()


def post(w, path: str, body: dict, script: str, split: str | None) -> bytes:
    """One keep-alive connection per thread; the response body, de-chunked."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = http.client.HTTPConnection("127.0.0.1", w.port, timeout=30)
    headers = {"content-type": "application/json", "x-script": script}
    if split is not None:
        headers["x-split"] = split
    try:
        conn.request("POST", path, json.dumps(body), headers)
        resp = conn.getresponse()
        data = resp.read()
    except (http.client.HTTPException, OSError):
        _local.conn = None
        raise
    assert resp.status == 200, data
    return data


def normalize(raw: bytes) -> bytes:
    # Chunks made from an Anthropic stream carry Weir's clock (Anthropic sends none), as does a completed
    # Response's completed_at.
    return re.sub(rb'"(created|created_at|completed_at)":\d+', rb'"\1":0', raw)


def sse(raw: bytes) -> list[tuple[str | None, str]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((name, "\n".join(data)))
    return out


def check_anthropic(raw: bytes) -> None:
    ev = sse(raw)
    types = [t for t, _ in ev]
    assert types[0] == "message_start" and types.count("message_start") == 1, types
    datas = [json.loads(d) for _, d in ev]
    assert all(d["type"] == t for (t, _), d in zip(ev, datas))
    if types[-1] == "error":
        assert "message_stop" not in types and types.count("error") == 1
    else:
        assert types[-2:] == ["message_delta", "message_stop"] and types.count("message_delta") == 1, types
    expect, open_ = 0, False
    for d in datas:
        if d["type"] == "content_block_start":
            assert not open_ and d["index"] == expect
            open_ = True
        elif d["type"] == "content_block_delta":
            assert open_ and d["index"] == expect
        elif d["type"] == "content_block_stop":
            assert open_ and d["index"] == expect
            open_, expect = False, expect + 1
    assert not open_ or types[-1] == "error"


def check_responses(raw: bytes) -> None:
    ev = sse(raw)
    datas = [json.loads(d) for _, d in ev]
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    assert all(d["type"] == t for (t, _), d in zip(ev, datas))
    types = [d["type"] for d in datas]
    assert types[:2] == ["response.created", "response.in_progress"]
    terminal = [t for t in types if t in ("response.completed", "response.incomplete", "response.failed")]
    assert terminal == [types[-1]], types
    items = [d["output_index"] for d in datas if d["type"] == "response.output_item.added"]
    assert items == list(range(len(items)))


def check_chat(raw: bytes) -> None:
    ev = sse(raw)
    assert all(name is None for name, _ in ev) and ev[-1][1] == "[DONE]" and [d for _, d in ev].count("[DONE]") == 1
    chunks = [json.loads(d) for _, d in ev[:-1]]
    if "error" in chunks[-1]:
        chunks = chunks[:-1]
    else:
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(finishes) == 1
        assert chunks[-1]["choices"] == [] and "usage" in chunks[-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len({c["id"] for c in chunks}) == 1
    seen: set[int] = set()
    for c in chunks:
        for ch in c["choices"]:
            for tc in ch["delta"].get("tool_calls", []):
                if tc["index"] not in seen:
                    assert tc["id"] and tc["function"]["name"], tc
                    seen.add(tc["index"])


GRAMMAR = {"anthropic": check_anthropic, "passthrough": check_anthropic, "responses": check_responses,
           "chat": check_chat}


@pytest.mark.parametrize("path,model,body,stream,grammar", CASES,
                         ids=[f"{c[0].rsplit('/', 1)[1]}-{c[1]}-{c[3][:-4]}" for c in CASES])
def test_every_split_point_gives_the_same_client_stream(stack, path, model, body, stream, grammar):
    _, w = stack
    body = dict(body, model=model)
    script = stream[:-4].replace("anthropic_", "").replace("_", "-") if stream.startswith("anthropic") \
        else "vllm-" + stream[5:-4]
    if script == "error":
        script = "error-mid-stream"
    whole = post(w, path, body, script, None)
    GRAMMAR[grammar](normalize(whole))
    if grammar == "passthrough":
        assert whole == recorded(stream)  # an Anthropic client gets Anthropic's bytes
    reference = normalize(whole)
    upstream = recorded(stream)
    splits = [str(p) for p in split_points(upstream)] + ["every"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda s: (s, normalize(post(w, path, body, script, s))), splits))
    bad = [s for s, g in got if g != reference]
    assert not bad, f"{len(bad)} of {len(splits)} split points differ, first at {bad[0]}: " \
                    f"{next(g for s, g in got if s == bad[0])!r}\n!=\n{reference!r}"
