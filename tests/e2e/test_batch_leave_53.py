"""A micro-batch member that leaves after its batch was sent is charged its prompt's generation (stop 53).

vLLM cannot abort one prompt of a list: a member whose client leaves after the batch went upstream still has its
prompt generated to its end while another member keeps the batch alive. Such a member was settled at once with
its usage so far: a streamed leaver was charged the tokens it had read (one, say), a non-streamed one nothing,
while the upstream generated its whole completion -- generation outside its tenant's tokens_per_minute and budget.
Now it stays the batch's (reading nothing) until its prompt ends upstream, then writes its one log line: 499 with
the prompt and completion tokens the upstream generated for it, and its spend; the member that stays is
unaffected, and the token counters agree with the log.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from conftest import wait_until

MAX_TOKENS = 12
# A prompt list of two: each prompt's 12 tokens, 100 ms apart (about 1.2 s each, generated side by side).
UPSTREAM = ("--ttft-ms", "50", "--itl-ms", "100", "--max-tokens", str(MAX_TOKENS))
PRICING = {"*": {"input": 1.0, "output": 2.0}}  # USD per million tokens


def config(up) -> dict:
    return {"pools": {"p": {"endpoints": [up.base_url], "retry": {"attempts": 1},
                            "batch": {"window": "1s", "max_size": 2}}},
            "default_pool": "p", "pricing": PRICING}


def body(prompt: str, stream: bool) -> dict:
    return {"model": "mock-model", "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": stream}


def prompt_tokens(up, prompt: str) -> int:
    """The prompt's count as the upstream reports it."""
    r = httpx.post(up.v1 + "/completions", timeout=10, json={"model": "mock-model", "prompt": prompt, "max_tokens": 1})
    return r.json()["usage"]["prompt_tokens"]


def spend_of(prompt: int, completion: int):
    return pytest.approx((prompt * 1.0 + completion * 2.0) / 1e6)


def tokens(w) -> tuple[float, float]:
    return w.metric("weir_prompt_tokens_total"), w.metric("weir_completion_tokens_total")


def leave_streamed(w, prompt: str, rid: str, extra: str = "") -> None:
    """Streams, and leaves after its first text chunk (the batch was sent: its tokens came)."""
    s = send_raw(w, prompt, rid, True, extra)
    s.settimeout(30)
    got = b""
    while b'"text"' not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    s.close()


def send_raw(w, prompt: str, rid: str, stream: bool, extra: str = "") -> socket.socket:
    """Sends the request on a connection of its own (the same head for every request: they batch together)."""
    b = json.dumps(body(prompt, stream))
    s = socket.create_connection(("127.0.0.1", w.port))
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\n"
               f"Connection: close\r\nx-request-id: {rid}\r\n{extra}Content-Length: {len(b)}\r\n\r\n{b}").encode())
    return s


def read_all(s: socket.socket) -> bytes:
    s.settimeout(30)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    s.close()
    return got


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_member_that_leaves_after_the_send_is_charged_its_prompts_generation(mock, weir, stream):
    up = mock(*UPSTREAM)
    w = weir(config=config(up), workers=1)
    stay_prompt, leave_prompt = "the stayer stays", "the leaver leaves"
    exact = {p: prompt_tokens(up, p) for p in (stay_prompt, leave_prompt)}
    gen_before = up.metric("vllm:generation_tokens_total")
    requests_before = up.metric("vllm:e2e_request_latency_seconds_count")
    tok_before = tokens(w)
    stayed: dict[str, bytes] = {}
    if stream:
        stay_conn = send_raw(w, stay_prompt, "stay", True)
        t = threading.Thread(target=lambda: stayed.setdefault("r", read_all(stay_conn)))
        t.start()
        # (The two join one batch within its window; the second fills it, and it goes at once.)
        leave_streamed(w, leave_prompt, "leave")
    else:
        stay_conn = send_raw(w, stay_prompt, "stay", False)
        t = threading.Thread(target=lambda: stayed.setdefault("r", read_all(stay_conn)))
        t.start()
        leave_conn = send_raw(w, leave_prompt, "leave", False)
        # Leaves once the batch is at the upstream, before its answer.
        wait_until(lambda: up.metric("vllm:num_requests_running") >= 1 or
                   up.metric("vllm:e2e_request_latency_seconds_count") > requests_before, timeout=10,
                   message="the batch reached the upstream")
        leave_conn.close()
    t.join()
    assert stayed["r"].startswith(b"HTTP/1.1 200"), stayed["r"]
    # The upstream generated every prompt whole: the leaver's went on for the stayer's sake.
    wait_until(lambda: up.metric("vllm:generation_tokens_total") - gen_before >= 2 * MAX_TOKENS, timeout=10,
               message="the upstream finished the batch")
    assert up.metric("vllm:generation_tokens_total") - gen_before == 2 * MAX_TOKENS
    assert up.aborts() == 0
    leave = w.log_for("leave", timeout=10)
    stay = w.log_for("stay")
    assert leave["batch"]["size"] == stay["batch"]["size"] == 2, (leave, stay)
    assert leave["batch"]["id"] == stay["batch"]["id"], (leave, stay)
    # The leaver: 499, charged what the upstream generated for its prompt (were 1 token, or nothing).
    assert leave["status"] == 499, leave
    assert leave["prompt_tokens"] == exact[leave_prompt], leave
    assert leave["completion_tokens"] == MAX_TOKENS, leave
    assert "charged_tokens" not in leave, leave  # the upstream's count, not an estimate
    assert leave["spend_usd"] == spend_of(exact[leave_prompt], MAX_TOKENS), leave
    # The stayer: its own answer and charge, as before.
    assert stay["status"] == 200, stay
    assert stay["prompt_tokens"] == exact[stay_prompt] and stay["completion_tokens"] == MAX_TOKENS, stay
    assert stay["spend_usd"] == spend_of(exact[stay_prompt], MAX_TOKENS), stay
    # One line each, and the token counters say what the lines say.
    completions = [e for e in w.log_entries() if e["path"] == "/v1/completions"]
    assert sorted(e["request_id"] for e in completions) == ["leave", "stay"], completions
    tok_after = tokens(w)
    assert tok_after[0] - tok_before[0] == exact[stay_prompt] + exact[leave_prompt]
    assert tok_after[1] - tok_before[1] == 2 * MAX_TOKENS


# The batch breaks (the upstream resets its connection after 6 tokens of each prompt) after the leaver left and
# before its prompt ended: it is charged what was generated for it by then.
def test_a_member_that_left_is_charged_what_was_generated_when_the_batch_breaks(mock, weir):
    up = mock(*UPSTREAM)
    w = weir(config=config(up), workers=1)
    reset = "x-mock-reset-after: 6\r\n"
    leave_prompt = "the leaver leaves"
    exact = prompt_tokens(up, leave_prompt)
    stay_conn = send_raw(w, "the stayer stays", "stay", True, reset)
    got: dict[str, bytes] = {}
    t = threading.Thread(target=lambda: got.setdefault("r", read_all(stay_conn)))
    t.start()
    leave_streamed(w, leave_prompt, "leave", reset)
    t.join()
    assert b'"error"' in got["r"], got["r"]  # the stayer's stream ended in-band with the failure
    leave = w.log_for("leave", timeout=10)
    assert leave["batch"]["size"] == 2, leave
    assert leave["status"] == 499, leave
    assert leave["prompt_tokens"] == exact and leave["completion_tokens"] == 6, leave
    assert leave["spend_usd"] == spend_of(exact, 6), leave
    assert len([e for e in w.log_entries() if e["request_id"] == "leave"]) == 1
