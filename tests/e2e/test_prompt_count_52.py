"""A stream cut short (its client left, the upstream broke or stalled) whose upstream had already said the
prompt's count in its per-chunk usage (vLLM's continuous_usage_stats, which a client may ask for, which Weir asks
for itself on a stream translated from /v1/messages, and which a micro-batch asks for on every member's behalf)
was charged and logged at Weir's prompt ESTIMATE (bytes / 4 and 8 per message) whenever that was the larger:
the per-chunk count was taken only as a floor under it. A prompt's count is whole on its first chunk: once every
prompt of the request said it, that count is the prompt. Only a /v1/completions prompt list cut before some prompt
said its count keeps the floor (the larger of the list's estimate and what the prompts that spoke said)."""
from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import threading

import httpx
import pytest

PRICING = {"*": {"input": 1.0, "output": 2.0}}  # USD per million tokens
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
# Two tokens, then an upstream that says nothing for a minute: a client that leaves after two tokens cuts a
# stream whose counts so far are known exactly, whatever the host's speed.
STALL = {"x-mock-stall-after": "2", "x-mock-stall-ms": "60000"}

# A conversation of many one-word messages: the mock counts 4 + 1 tokens a message (31 × 5 = 155), Weir's
# estimate 8 a message and the bytes / 4 (266): far above the count, so a charge at the estimate shows.
MESSAGES = [m for i in range(15) for m in ({"role": "user", "content": f"q{i}"},
                                           {"role": "assistant", "content": f"a{i}"})]
MESSAGES.append({"role": "user", "content": "go"})
# 200 words in 1000 bytes: the mock counts 201 tokens (words + BOS), Weir estimates 251.
LONG_PROMPT = "word " * 200


def config(*pools) -> dict:
    cfg = {"pools": {}, "models": {}, "pricing": PRICING}
    for name, url, extra in pools:
        cfg["pools"][name] = {"endpoints": [url], "retry": {"attempts": 1}, **extra}
        cfg["models"][name] = {"pool": name, "upstream_model": "mock-model"}
    return cfg


def tokens(w) -> tuple[float, float, float, float]:
    return (w.metric("weir_prompt_tokens_total"), w.metric("weir_completion_tokens_total"),
            w.metric("weir_estimated_prompt_tokens_total"), w.metric("weir_estimated_completion_tokens_total"))


def spend_of(prompt: int, completion: int) -> float:
    return pytest.approx((prompt * 1.0 + completion * 2.0) / 1e6)


def data_lines(r):
    for line in r.iter_lines():
        if line.startswith("data: {"):
            yield json.loads(line[6:])


def assert_charged_as_logged(w, line, before, prompt: int, completion: int) -> None:
    """The line's counts are the charge: spend, the reported-token counters; no estimate anywhere."""
    assert line["prompt_tokens"] == prompt, line
    assert line["completion_tokens"] == completion, line
    assert "charged_tokens" not in line, line
    assert line["spend_usd"] == spend_of(prompt, completion), line
    after = tokens(w)
    assert (after[0] - before[0], after[1] - before[1]) == (prompt, completion), (before, after)
    assert (after[2], after[3]) == (before[2], before[3]), (before, after)  # nothing charged by estimate


def chat_estimate(w, model: str) -> int:
    """Weir's prompt estimate of MESSAGES: what a stream without any usage is charged (charged_tokens)."""
    rid = "estimate-probe"
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=30,
                      json={"model": model, "messages": MESSAGES, "max_tokens": 12, "stream": True},
                      headers={"x-request-id": rid, **STALL}) as r:
        assert r.status_code == 200
        texts = 0
        for chunk in data_lines(r):
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                texts += 1
                if texts == 2:
                    break
    line = w.log_for(rid, timeout=15)
    assert line["prompt_tokens"] is None, line
    return line["charged_tokens"]["prompt"]


# DEFECT: a chat stream whose client asked for continuous_usage_stats saw prompt_tokens 155 on every chunk; the
# client left, and the log, the counters and the spend said 266 (the estimate).
def test_a_chat_stream_the_client_left_is_charged_the_prompt_count_its_chunks_said(mock, weir):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "12", "--any-model")
    w = weir(config=config(("chat", m.base_url, {})), workers=1)
    exact = httpx.post(m.base_url + "/v1/chat/completions", timeout=10,
                       json={"model": "mock-model", "messages": MESSAGES, "max_tokens": 1}).json()["usage"]
    assert chat_estimate(w, "chat") > exact["prompt_tokens"]  # (else the test could not tell them apart)
    before = tokens(w)
    seen = []
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=30,
                      json={"model": "chat", "messages": MESSAGES, "max_tokens": 12, "stream": True,
                            "stream_options": CONTINUOUS},
                      headers={"x-request-id": "chat-left", **STALL}) as r:
        assert r.status_code == 200
        for chunk in data_lines(r):
            seen.append(chunk["usage"])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") and len(seen) == 3:
                break  # the role chunk and two tokens: the client leaves
    assert [u["prompt_tokens"] for u in seen] == [exact["prompt_tokens"]] * 3, seen
    line = w.log_for("chat-left", timeout=15)
    assert line["status"] == 499, line
    assert_charged_as_logged(w, line, before, exact["prompt_tokens"], seen[-1]["completion_tokens"])


# DEFECT: a /v1/messages stream (translated; the pool's continuous_usage is on for an http:// endpoint) told its
# client message_start input_tokens 155, and the client that left after two deltas was logged and charged 266.
def test_a_messages_stream_the_client_left_is_charged_its_message_start_input_tokens(mock, weir):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "12", "--any-model")
    w = weir(config=config(("chat", m.base_url, {})), workers=1)
    assert chat_estimate(w, "chat") > 155
    before = tokens(w)
    buf = ""
    with httpx.stream("POST", w.base_url + "/v1/messages", timeout=30,
                      json={"model": "chat", "messages": MESSAGES, "max_tokens": 12, "stream": True},
                      headers={"x-request-id": "messages-left", "anthropic-version": "2023-06-01", **STALL}) as r:
        assert r.status_code == 200
        for text in r.iter_text():
            buf += text
            if buf.count("event: content_block_delta") >= 2 and buf.endswith("\n\n"):
                break
    start = [json.loads(ln[5:]) for ln in buf.splitlines() if ln.startswith("data:") and "message_start" in ln]
    input_tokens = start[0]["message"]["usage"]["input_tokens"]
    assert input_tokens == 155, start  # the upstream's count of the translated prompt
    line = w.log_for("messages-left", timeout=15)
    assert line["status"] == 499, line
    assert_charged_as_logged(w, line, before, input_tokens, 2)


# DEFECT: a micro-batch member that leaves (the batch asks for continuous_usage_stats on its behalf) was charged
# the larger of its estimate (251) and its own per-chunk prompt count (201).
def test_a_batched_completions_member_that_left_is_charged_its_prompt_count(mock, weir):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "12", "--any-model")
    w = weir(config=config(("batched", m.base_url, {"batch": {"window": "1s", "max_size": 2}})), workers=1)
    exact = httpx.post(m.base_url + "/v1/completions", timeout=10,
                       json={"model": "mock-model", "prompt": LONG_PROMPT, "max_tokens": 1}).json()["usage"]
    assert exact["prompt_tokens"] == 201 < len(LONG_PROMPT) // 4
    before = tokens(w)
    barrier = threading.Barrier(2)
    client = httpx.Client(timeout=30)  # (one, made before the barrier: a client each costs ~50 ms of CPU)

    def member(rid: str) -> int:
        barrier.wait()
        texts = 0
        with client.stream("POST", w.v1 + "/completions",
                           json={"model": "batched", "prompt": LONG_PROMPT, "max_tokens": 12, "stream": True},
                           headers={"x-request-id": rid, **STALL}) as r:
            assert r.status_code == 200
            for chunk in data_lines(r):
                if chunk["choices"]:
                    texts += 1
                    if texts == 2:
                        return texts  # the member leaves
        return texts

    with cf.ThreadPoolExecutor(2) as ex:
        got = list(ex.map(member, ["member-0", "member-1"]))
    assert got == [2, 2]
    lines = [w.log_for(rid, timeout=15) for rid in ("member-0", "member-1")]
    for line in lines:
        assert line["batch"]["size"] == 2 and line["status"] == 499, line
        assert line["prompt_tokens"] == exact["prompt_tokens"], line
        assert line["completion_tokens"] == 2 and "charged_tokens" not in line, line
        assert line["spend_usd"] == spend_of(exact["prompt_tokens"], 2), line
    after = tokens(w)
    assert after[0] - before[0] == 2 * exact["prompt_tokens"] and after[2] == before[2], (before, after)


# A prompt list: each prompt's count comes with its own choices. An upstream (a raw script) that streams some
# chunks with per-chunk usage and then breaks the connection.
class ListUpstream:
    """POST /v1/completions: the chunks of the script named by the request's x-script header, then the
    connection closes mid-body."""

    PROMPT_TOKENS = {0: 3, 1: 4}  # what the script says each prompt counted (far below Weir's estimate)
    SCRIPTS = {
        "first-prompt-only": [0, 0, 0],
        "both-prompts": [0, 1, 0, 1],
        "no-usage": [0, 0, 0],
    }

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (ln.partition(":") for ln in head.decode("latin-1").split("\r\n")[1:])}
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                body += conn.recv(65536)
            script = headers.get("x-script", "no-usage")
            out = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"]
            said: dict[int, int] = {}
            for index in self.SCRIPTS[script]:
                said[index] = said.get(index, 0) + 1
                chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "mock-model",
                         "choices": [{"index": index, "text": " w", "logprobs": None, "finish_reason": None,
                                      "stop_reason": None}], "usage": None}
                if script != "no-usage":
                    p = self.PROMPT_TOKENS[index]
                    chunk["usage"] = {"prompt_tokens": p, "completion_tokens": said[index],
                                      "total_tokens": p + said[index]}
                event = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
                out.append(b"%x\r\n%s\r\n" % (len(event), event))
            # Then the upstream breaks: the connection closes with no last chunk, no usage chunk, no [DONE].
            conn.sendall(b"".join(out))

    def close(self):
        self.sock.close()


def list_stream(w, rid: str, script: str) -> dict:
    body = {"model": "list", "prompt": [LONG_PROMPT, LONG_PROMPT], "max_tokens": 12, "stream": True,
            "stream_options": CONTINUOUS}
    with httpx.stream("POST", w.v1 + "/completions", json=body, timeout=30,
                      headers={"x-request-id": rid, "x-script": script}) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            pass
    return w.log_for(rid, timeout=15)


def test_a_prompt_list_cut_before_every_prompt_said_its_count_keeps_the_floor(weir):
    up = ListUpstream()
    try:
        w = weir(config=config(("list", up.base_url, {})), workers=1)
        # Weir's estimate of the list: what the stream without usage is charged.
        none = list_stream(w, "list-no-usage", "no-usage")
        assert none["error"] is not None and none["prompt_tokens"] is None, none
        estimate = none["charged_tokens"]["prompt"]
        assert estimate > sum(ListUpstream.PROMPT_TOKENS.values())
        # Both prompts said their counts before the break: the prompt is their sum, the estimate no part of it.
        before = tokens(w)
        both = list_stream(w, "list-both", "both-prompts")
        assert both["error"] is not None, both
        assert_charged_as_logged(w, both, before, 3 + 4, 2 + 2)
        # Only the first prompt said its count: the second's is unknown, so the list keeps its estimate as a
        # floor (the larger of it and the 3 the first said).
        first = list_stream(w, "list-first", "first-prompt-only")
        assert first["error"] is not None, first
        assert first["prompt_tokens"] == estimate and first["completion_tokens"] == 3, first
        assert first["spend_usd"] == spend_of(estimate, 3), first
    finally:
        up.close()
