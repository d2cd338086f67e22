"""Accounting and log defects found in stop 47's black-box rounds: per-choice usage (continuous_usage_stats) of a
stream cut short, the request log's columns for invalid UTF-8, C1 controls in log lines, an embeddings request's
"stream", and the error a micro-batch member gets when the batch's stream ends without [DONE]."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import threading

import httpx
import pytest
from conftest import binary, wait_until
from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hello there friend"}]
PRICING = {"*": {"input": 1.0, "output": 2.0}}  # USD per million tokens
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def _agree(w, line: dict, before: tuple[float, float]) -> None:
    """The log line's token counts are what the spend, and the token counters, say."""
    assert line["prompt_tokens"] is not None, line
    assert line["spend_usd"] == pytest.approx((line["prompt_tokens"] * 1.0 + line["completion_tokens"] * 2.0) / 1e6)
    assert w.metric("weir_prompt_tokens_total") - before[0] == line["prompt_tokens"]
    assert w.metric("weir_completion_tokens_total") - before[1] == line["completion_tokens"]


def _tokens(w) -> tuple[float, float]:
    return w.metric("weir_prompt_tokens_total"), w.metric("weir_completion_tokens_total")


# DEFECT: with vLLM's stream_options.continuous_usage_stats each chunk's usage counts only its own choice and
# prompt (only the final usage-only chunk has the request's total), yet Weir took the last chunk's usage for the
# request's. A stream that ended before that chunk (an upstream reset, the client leaving, a timeout, a drain)
# was charged one choice of one prompt: 8 of 256 completion tokens here, less than without the option (where
# the one-token-per-content-event rule applies). Per-choice counts are now summed, and a stream cut short is
# charged the larger of that rule and them (its prompt exactly their count once every prompt said it: stop 52);
# the log, the token counters and the spend say the same.
def test_a_continuous_usage_stream_the_upstream_cut_is_charged_every_choice_of_every_prompt(mock, weir):
    m = mock("--ttft-ms", "0", "--itl-ms", "1", "--max-tokens", "8")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url], "retry": {"attempts": 1}}}, "default_pool": "p",
                     "pricing": PRICING}, workers=1)
    prompts = [f"prompt number {i} with several words in it" for i in range(8)]
    completion = {}
    for name, options in (("plain", None), ("continuous", CONTINUOUS)):
        body = {"model": "mock-model", "prompt": prompts, "n": 4, "max_tokens": 8, "stream": True}
        if options:
            body["stream_options"] = options
        before = _tokens(w)
        # Every token comes; the upstream resets before its usage-only chunk.
        r = httpx.post(w.v1 + "/completions", json=body, timeout=20,
                       headers={"x-request-id": f"cut-{name}", "x-mock-reset-after": "8"})
        assert r.status_code == 200
        texts = [ln for ln in r.text.splitlines() if ln.startswith("data: {") and '"text":' in ln]
        assert len(texts) == 8 * 4 * 8, r.text[-300:]
        line = w.log_for(f"cut-{name}")
        assert line["error"] is not None, line
        completion[name] = line["completion_tokens"] if options else line["charged_tokens"]["completion"]
        if options:
            assert line["completion_tokens"] == 8 * 4 * 8, line  # (it was 8: one choice's)
            # Every prompt, once, as the mock counts it (8 words + BOS each): every prompt said its count, so
            # that is the prompt, not Weir's estimate of it (test_prompt_count_52.py).
            assert line["prompt_tokens"] == 8 * 9, line
            _agree(w, line, before)
    # (Its spend may be below the plain stream's: that one's prompt is the estimate, bytes / 4 and a token each.)
    assert completion["continuous"] >= completion["plain"] > 0, completion


def test_a_continuous_usage_stream_the_client_left_is_charged_at_least_what_it_got(mock, weir):
    m = mock("--ttft-ms", "0", "--itl-ms", "30", "--max-tokens", "200")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p", "pricing": PRICING},
             workers=1)
    for route, extra in (("/chat/completions", {"messages": MSG}), ("/completions", {"prompt": "hello there"})):
        before = _tokens(w)
        rid = "leave" + route.replace("/", "-")
        body = {"model": "mock-model", "max_tokens": 200, "n": 4, "stream": True, "stream_options": CONTINUOUS,
                **extra}
        got = 0
        with httpx.stream("POST", w.v1 + route, json=body, timeout=20, headers={"x-request-id": rid}) as r:
            for ln in r.iter_lines():
                if ln.startswith("data: {") and ('"content":' in ln or '"text":' in ln) and '"content":""' not in ln:
                    got += 1
                    if got == 24:
                        break  # the client leaves mid-stream
        line = w.log_for(rid)
        assert line["status"] == 499, line
        # Each content event is at least one token: 24 of them reached the client (it was ~6: one choice's).
        assert line["completion_tokens"] >= 24, line
        _agree(w, line, before)


# A server that puts each choice's counts on its chunks and no usage-only chunk, and ends its stream whole:
# the choices' counts summed are its usage (it was the last chunk's: one choice).
def test_a_whole_stream_with_only_per_choice_usage_is_counted_by_its_choices(weir):
    def chunk(i, done, finish=None):
        return ("data: " + json.dumps({
            "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": i, "delta": {"content": " t"}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": done, "total_tokens": 11 + done}}) + "\n\n").encode()
    events = b"".join(chunk(i, k, "stop" if k == 5 else None) for k in range(1, 6) for i in range(3))
    events += b"data: [DONE]\n\n"
    up = RawUpstream(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(events), events))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p", "pricing": PRICING},
                 workers=1)
        before = _tokens(w)
        r = httpx.post(w.v1 + "/chat/completions", timeout=10, headers={"x-request-id": "whole-per-choice"},
                       json={"model": "m", "messages": MSG, "n": 3, "stream": True, "stream_options": CONTINUOUS})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text[-200:]
        line = w.log_for("whole-per-choice")
        assert line["error"] is None, line
        assert (line["prompt_tokens"], line["completion_tokens"]) == (11, 15), line
        _agree(w, line, before)
    finally:
        up.close()


# NIT: POST /v1/embeddings with "stream": true was logged "stream": true; embeddings never stream (the answer
# is one JSON object): the log says what happened.
def test_an_embeddings_request_asking_to_stream_is_logged_as_not_streamed(mock, weir):
    m = mock("--ttft-ms", "0")
    w = weir(m, workers=1)
    r = httpx.post(w.v1 + "/embeddings", json={"model": "mock-model", "input": "hi", "stream": True},
                   headers={"x-request-id": "emb-stream"}, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), r.text
    assert w.log_for("emb-stream")["stream"] is False


def _rows(db: str) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM requests ORDER BY id")]
    finally:
        con.close()


def _requests_cli(db: str, *args: str) -> bytes:
    return subprocess.run([str(binary("weir")), "requests", "--db", db, *args], capture_output=True, check=True,
                          timeout=10).stdout


# DEFECT: the request log's model column was made valid UTF-8 with one U+FFFD per bad byte, the access log's
# line with one per ill-formed sequence (and capped counting that), so `weir requests --model <what the log
# shows>` and the admin API's ?model= found nothing, and the column could outgrow its 256-byte cap. One rule now.
def test_the_request_logs_model_column_is_what_the_log_line_shows(tmp_path, mock, weir):
    m = mock("--ttft-ms", "0")
    db = str(tmp_path / "requests.db")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"}}, workers=1)
    models = {"trunc": b"x\xf0\x9f\x98", "long": b"\xe2\x82" * 200, "mixed": b"a\xff\xc0\xafb\xed\xa0\x80" * 40}
    for name, model in models.items():
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       headers={"x-request-id": f"utf8-{name}", "content-type": "application/json"},
                       content=b'{"model":"' + model + b'","messages":[{"role":"user","content":"hi"}]}')
        assert r.status_code in (400, 404), r.text
    wait_until(lambda: len(_rows(db)) == len(models), 5)
    for row in _rows(db):
        shown = json.loads(row["record"])["model"]
        assert row["model"] == shown, row
        assert len(row["model"].encode()) <= 256, row
        found = json.loads(_requests_cli(db, "--model", shown))["data"]
        assert [d["request_id"] for d in found] == [row["request_id"]], found
    assert json.loads(_rows(db)[0]["record"])["model"] == "x\ufffd"


# DEFECT: C1 controls (U+0080..U+009F) and DEL went raw into the access log, the request log and `weir requests`
# output: a model "\u009b2J..." (CSI) cleared the screen of whoever tailed the log. They are escaped as \u00XX.
def test_c1_controls_and_del_are_escaped_in_log_lines(tmp_path, mock, weir):
    m = mock("--ttft-ms", "0")
    db = str(tmp_path / "requests.db")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"}}, workers=1)
    model = "\u009b2J\u009b31mX\u0085\u007f\u009f"
    r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": "c1"}, timeout=10,
                   json={"model": model, "messages": MSG, "max_tokens": 1})
    assert r.status_code == 404, r.text
    assert w.log_for("c1")["model"] == model  # (the escapes read back as the characters)
    raw = w.access_log_path.read_bytes()
    for c in ("\u009b", "\u0085", "\u009f", "\u007f"):
        assert c.encode() not in raw, c
    assert b"\\u009b2J\\u009b31mX\\u0085\\u007f\\u009f" in raw
    wait_until(lambda: len(_rows(db)) == 1, 5)
    out = _requests_cli(db, "--id", "c1")
    assert json.loads(out)["model"] == model
    assert b"\xc2\x9b" not in out and b"\x7f" not in out and b"\\u009b" in out, out


# NIT: a micro-batch whose stream ended without [DONE] (cleanly: a valid HTTP body) gave its non-streaming
# members a 502 "sent an invalid HTTP response", its streaming members the accurate "ended the stream before it
# was complete". Both now get the accurate one.
def test_a_batch_stream_cut_before_done_says_so_to_every_member(weir):
    def answer(h, raw):
        body = json.loads(raw)
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        # Two tokens of each prompt, no finish_reason, no [DONE]: the body ends there.
        sse = b"".join(b"data: " + json.dumps({
            "id": "cmpl-b", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": i, "text": " a", "logprobs": None, "finish_reason": None, "stop_reason": None}],
            "usage": None}).encode() + b"\n\n" for _ in range(2) for i in range(len(prompts)))
        return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                % (len(sse), sse))
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url], "retry": {"attempts": 1},
                                         "batch": {"window": "1s", "max_size": 2}}},
                         "default_pool": "p"}, workers=1)
        for stream in (False, True):
            got = {}

            def one(i, stream=stream):
                got[i] = httpx.post(w.v1 + "/completions", timeout=10, headers={"x-request-id": f"nodone-{stream}-{i}"},
                                    json={"model": "m", "prompt": f"p {i}", "max_tokens": 4, "stream": stream})
            ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
            [t.start() for t in ts]
            [t.join(15) for t in ts]
            assert w.log_for(f"nodone-{stream}-0")["batch"]["size"] == 2
            for r in got.values():
                if stream:
                    assert r.status_code == 200 and "ended the stream before it was complete" in r.text, r.text
                else:
                    assert r.status_code == 502, r.text
                    assert "ended the stream before it was complete" in r.json()["error"]["message"], r.text
    finally:
        up.close()
