"""A batched non-streamed request's whole wait (stop 52).

A non-streamed member of a micro-batch (`pools.X.batch`) gets its answer assembled from the batch's upstream
stream. Each gap between the stream's events was bounded by `timeouts.response`, but not the whole wait: an
upstream that kept sending tokens (one every response/2, say) held the member for the whole generation,
where the same request alone gets a 504 once `timeouts.response` has passed without its head (vLLM sends a
non-streamed head only when the generation is done). Now the member's whole wait is bounded by
`timeouts.response` from the batch's send: it gets the 504 `upstream_timeout` the same request alone gets,
its log line says the attempt timed out, and it leaves the batch (a batch every member left is aborted
upstream). Streaming members are unchanged: their gaps are bounded by `timeouts.idle`.

A non-streamed coalesced generation (`pools.X.coalesce`) goes upstream unstreamed: its head is its whole
answer, bounded by `timeouts.response` from the send already; checked here as the same rule.

The mock's generation (10 tokens, 300 ms apart: about 3 s) is the upstream's behaviour, not a wait for Weir.
"""

from __future__ import annotations

import threading
import time

import httpx

from conftest import wait_until

SLOW = ("--ttft-ms", "100", "--itl-ms", "300", "--max-tokens", "10")  # about 3 s, a token every 300 ms


def pool(up, **extra) -> dict:
    return {"pools": {"p": {"endpoints": [up.base_url], "timeouts": {"response": "1s"},
                            "retry": {"attempts": 1}, **extra}},
            "default_pool": "p"}


def test_a_non_streamed_batch_member_is_cut_at_timeouts_response_while_tokens_keep_coming(mock, weir):
    up = mock(*SLOW)
    # max_size 2: the two members' batch leaves when both are in (the window only bounds how far apart a loaded
    # machine starts them); the streaming request is a batch of its own, sent at its window's end.
    w = weir(config=pool(up, batch={"window": "1s", "max_size": 2}), workers=1)
    client = httpx.Client(timeout=30)  # (one, made before the threads start: a client each costs ~50 ms of CPU)
    stream_done = threading.Event()
    stream_text: list[str] = []

    def streamer() -> None:
        # A streaming request on the same pool, in flight while the non-streamed ones wait: its gaps are bounded
        # by idle, not response, and it gets every token.
        with httpx.stream("POST", w.v1 + "/completions", timeout=30, headers={"x-request-id": "wait-stream"},
                          json={"model": "mock-model", "prompt": "s", "max_tokens": 10, "stream": True}) as r:
            assert r.status_code == 200
            stream_text.append(r.read().decode())
        stream_done.set()

    def member(i: int, out: dict) -> None:
        out[i] = client.post(w.v1 + "/completions", headers={"x-request-id": f"wait-{i}"},
                             json={"model": "mock-model", "prompt": f"p{i}", "max_tokens": 10})

    got: dict[int, httpx.Response] = {}
    threads = [threading.Thread(target=streamer)] + [threading.Thread(target=member, args=(i, got)) for i in (0, 1)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    waited = time.monotonic() - t0
    # The non-streamed members ended while the generation (the streaming request's, as long) still ran.
    streaming_still = not stream_done.is_set()
    threads[0].join()
    for i in (0, 1):
        r = got[i]
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "upstream_timeout", r.text
        line = w.log_for(f"wait-{i}")
        # Its one attempt (the batch's) timed out: the upstream's timeout, logged as the same request's alone.
        assert line["status"] == 504 and line["error"]["code"] == "upstream_timeout", line
        assert line["error"]["source"] == "upstream", line
        assert line["batch"]["size"] == 2, line  # the two went in one batch
        assert line["retries"] == 0 and "attempts" not in line, line  # cut, not started over on the pool
    assert streaming_still, "the non-streamed members waited for the whole generation"
    assert waited < 2.9  # about timeouts.response (1 s), not the generation (about 3 s): a bound, not a speed
    # Every member left: the batch's generation was aborted upstream.
    wait_until(lambda: up.aborts() >= 1, timeout=5, message="the mock saw the batch aborted")
    assert w.metric("weir_batches_aborted_total") == 1
    # The streaming request, its own batch, got every token and its end.
    text = stream_text[0]
    assert text.count('"text"') >= 10 and "data: [DONE]" in text, text
    assert w.log_for("wait-stream")["status"] == 200


def test_a_non_streamed_batch_member_within_timeouts_response_is_answered(mock, weir):
    up = mock("--ttft-ms", "20", "--itl-ms", "20", "--max-tokens", "10")
    w = weir(config=pool(up, batch={"window": "20ms", "max_size": 4}), workers=1)
    r = httpx.post(w.v1 + "/completions", timeout=30,
                   json={"model": "mock-model", "prompt": "quick", "max_tokens": 10})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]
    assert r.json()["usage"]["completion_tokens"] == 10


# Cut by its response timeout, a member fails over as the same request alone would: its model's fallback
# answers it (unbatched there), not a 504.
def test_a_non_streamed_batch_member_cut_at_timeouts_response_falls_back(mock, weir):
    up = mock(*SLOW)
    backup = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "10", "--model", "small-model")
    w = weir(config={
        "pools": {"p": {"endpoints": [up.base_url], "timeouts": {"response": "1s"}, "retry": {"attempts": 1},
                        "batch": {"window": "20ms", "max_size": 4}},
                  "backup": {"endpoints": [backup.base_url]}},
        "models": {"big": {"pool": "p", "upstream_model": "mock-model",
                           "fallbacks": [{"pool": "backup", "upstream_model": "small-model"}]}},
    }, workers=1)
    r = httpx.post(w.v1 + "/completions", timeout=30, headers={"x-request-id": "wait-fb"},
                   json={"model": "big", "prompt": "fb", "max_tokens": 10})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 10
    line = w.log_for("wait-fb")
    assert [a["failure"] for a in line["attempts"]][0] == "timeout", line
    assert backup.metric("vllm:e2e_request_latency_seconds_count") == 1
    wait_until(lambda: up.aborts() >= 1, timeout=5, message="the mock saw the abandoned batch aborted")


def test_a_non_streamed_coalesced_generation_is_cut_at_timeouts_response(mock, weir):
    up = mock(*SLOW)
    # timeouts.response 2 s (the generation takes about 3): the late member has that long to join on a loaded
    # machine before the generation is cut.
    w = weir(config=pool(up, coalesce=True, timeouts={"response": "2s"}), workers=1)
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "c"}], "max_tokens": 10,
            "temperature": 0}
    got: dict[int, httpx.Response] = {}
    client = httpx.Client(timeout=30)  # (one, made before: a client each costs ~50 ms of CPU)

    def member(i: int) -> None:
        got[i] = client.post(w.v1 + "/chat/completions", json=body, headers={"x-request-id": f"co-{i}"})

    first = threading.Thread(target=member, args=(0,))
    first.start()
    wait_until(lambda: up.metric("vllm:num_requests_running") >= 1, timeout=5)
    late = threading.Thread(target=member, args=(1,))
    late.start()
    first.join()
    late.join()
    for i in (0, 1):
        assert got[i].status_code == 504, got[i].text
        assert got[i].json()["error"]["code"] == "upstream_timeout"
        line = w.log_for(f"co-{i}")
        assert line["status"] == 504 and line["error"]["code"] == "upstream_timeout", line
        assert line["batch"]["coalesced"] is True and line["batch"]["size"] == 2, line
