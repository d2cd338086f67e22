"""Usage defects found in stop 49's black-box rounds (helper-226): a micro-batch member cut short (its client
left, the batch broke, its deadline) was charged the rough estimate (prompt bytes / 4, one token per content
event) with null token counts, although the batch asks for continuous_usage_stats on every member's behalf and
so had its real counts; and a line charged without any usage reported carried spend but null token counts,
with nothing saying which tokens the spend and the buckets were charged."""
from __future__ import annotations

import concurrent.futures as cf
import json
import threading

import httpx
import pytest

PROMPT = "a b c d e f g h i j k l m n o p q r s t"  # 20 words, 39 bytes: the estimate (bytes / 4) is well below
PRICING = {"*": {"input": 1.0, "output": 2.0}}  # USD per million tokens
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
# Two tokens, then an upstream that says nothing for a minute: a client that leaves, or a deadline, cuts a stream
# whose tokens so far are known exactly, whatever the host's speed.
STALL = {"x-mock-stall-after": "2", "x-mock-stall-ms": "60000"}


def config(mock) -> dict:
    return {
        "pools": {"plain": {"endpoints": [mock.base_url], "retry": {"attempts": 1}},
                  "bp": {"endpoints": [mock.base_url], "retry": {"attempts": 1},
                         "batch": {"window": "1s", "max_size": 2}}},
        "models": {"plain": {"pool": "plain", "upstream_model": "mock-model"},
                   "batched": {"pool": "bp", "upstream_model": "mock-model"}},
        "pricing": PRICING,
    }


# One client for the members (httpx.post/stream build one, with its TLS context, per call: ~50 ms of CPU each, spent
# after the barrier, one member after the other under the GIL; on a loaded machine past the batch's window).
_http = httpx.Client(timeout=90)


def exact_prompt_tokens(mock) -> int:
    """The prompt's count as the upstream reports it."""
    r = httpx.post(mock.base_url + "/v1/completions", timeout=10,
                   json={"model": "mock-model", "prompt": PROMPT, "max_tokens": 1})
    n = r.json()["usage"]["prompt_tokens"]
    assert n > len(PROMPT.encode()) // 4 + 1  # (else the estimate and the exact count could not be told apart)
    return n


def stream(w, model: str, rid: str, *, continuous: bool, leave_after: int | None = None,
           headers: dict | None = None, text: list | None = None) -> int:
    """Streams PROMPT; leaves after `leave_after` text chunks (None: reads to the end). Returns the text chunks
    (and appends their text to `text`, when given)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "stream": True}
    if continuous:
        body["stream_options"] = CONTINUOUS
    texts = 0
    with _http.stream("POST", w.v1 + "/completions", json=body,
                      headers={"x-request-id": rid, **(headers or {})}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and '"choices":[{' in line:
                texts += 1
                if text is not None:
                    text.append(json.loads(line[6:])["choices"][0]["text"])
                if texts == leave_after:
                    return texts  # the connection closes here
    return texts


def together(fn, args: list) -> list:
    """fn(*a) for every a at once (a barrier: they join one batch)."""
    barrier = threading.Barrier(len(args))

    def run(a):
        barrier.wait()
        return fn(*a)

    with cf.ThreadPoolExecutor(len(args)) as ex:
        return list(ex.map(run, args))


def tokens(w) -> tuple[float, float]:
    return w.metric("weir_prompt_tokens_total"), w.metric("weir_completion_tokens_total")


def spend_of(prompt: int, completion: int) -> float:
    return pytest.approx((prompt * 1.0 + completion * 2.0) / 1e6)


CUTS = {
    # The client leaves after the two tokens.
    "client_left": ({**STALL}, 2),
    # The upstream resets the batch's connection after three tokens.
    "upstream_broke": ({"x-mock-reset-after": "3"}, None),
    # The request's own deadline cuts it in the stall.
    "deadline": ({**STALL, "x-weir-timeout-ms": "1500"}, None),
}


# DEFECT: a streamed micro-batch member cut short was charged the estimate (its prompt as bytes / 4, one token per
# content event) and logged null token counts, unless its own client had asked for continuous_usage_stats: the
# batch always asks for it upstream, but the member's chunks reach its client with "usage": null, and only what
# the client's stream carried was read. The same member asking for per-chunk usage was charged its exact counts,
# as a request sent alone with per-chunk usage is. Now the member's own per-chunk usage is read either way.
@pytest.mark.parametrize("continuous", [False, True], ids=["client_did_not_ask", "client_asked"])
@pytest.mark.parametrize("cut", list(CUTS))
def test_a_batch_member_cut_short_is_charged_its_own_per_chunk_usage(mock, weir, cut, continuous):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "12", "--any-model")
    w = weir(config=config(m), workers=1)
    exact = exact_prompt_tokens(m)
    headers, leave_after = CUTS[cut]
    before = tokens(w)
    rids = [f"{cut}-{int(continuous)}-{i}" for i in range(2)]
    texts = together(lambda rid: stream(w, "batched", rid, continuous=continuous, leave_after=leave_after,
                                        headers=headers), [(rid,) for rid in rids])
    lines = [w.log_for(rid, timeout=15) for rid in rids]
    for got, line in zip(texts, lines):
        assert line["batch"]["size"] == 2, line  # (members of one batch of several)
        assert line["error"] is not None, line
        assert got == (3 if cut == "upstream_broke" else 2), (got, line)
        # Its prompt's exact count and its completion so far (were the estimate, and null in the log).
        assert line["prompt_tokens"] == exact, line
        assert line["completion_tokens"] == got, line
        assert line["spend_usd"] == spend_of(exact, got), line
        assert "charged_tokens" not in line, line  # its usage is the upstream's per-chunk counts, not an estimate
    after = tokens(w)
    assert after[0] - before[0] == sum(line["prompt_tokens"] for line in lines)
    assert after[1] - before[1] == sum(line["completion_tokens"] for line in lines)


# A non-streamed member that got no answer is charged nothing, as before (its batch's 2xx head is not its own):
# reading its per-chunk usage changes no charge the rule does not make.
def test_a_non_streamed_batch_member_cut_by_its_deadline_is_still_charged_nothing(mock, weir):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "12", "--any-model")
    w = weir(config=config(m), workers=1)

    def ask(rid):
        return _http.post(w.v1 + "/completions", timeout=30,
                          json={"model": "batched", "prompt": PROMPT, "max_tokens": 12},
                          headers={"x-request-id": rid, **STALL, "x-weir-timeout-ms": "1000"}).status_code

    assert together(ask, [("ns-0",), ("ns-1",)]) == [504, 504]
    for rid in ("ns-0", "ns-1"):
        line = w.log_for(rid)
        assert line["batch"]["size"] == 2, line
        assert line["spend_usd"] == 0 and line["prompt_tokens"] is None and "charged_tokens" not in line, line


# DEFECT: a request charged without any usage reported (the client left, or the stream broke, after its first
# token) logged spend with null token counts: an operator could not recompute spend = tokens x price, and the
# token counters said less than the buckets were charged, with nothing to tell. The token counts still say what
# the upstream reported (null); `charged_tokens` says what was charged, and weir_estimated_*_tokens_total count it.
@pytest.mark.parametrize("cut", ["client_left", "upstream_broke"])
def test_a_line_charged_by_estimate_says_which_tokens_were_charged(mock, weir, cut):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "12", "--any-model")
    w = weir(config=config(m), workers=1)
    headers, leave_after = CUTS[cut]
    before = tokens(w)
    estimated = (w.metric("weir_estimated_prompt_tokens_total"), w.metric("weir_estimated_completion_tokens_total"))
    text: list[str] = []
    got = stream(w, "plain", f"est-{cut}", continuous=False, leave_after=leave_after, headers=headers, text=text)
    line = w.log_for(f"est-{cut}", timeout=15)
    assert "batch" not in line and line["error"] is not None, line
    assert line["prompt_tokens"] is None and line["completion_tokens"] is None, line  # none reported
    charged = line.get("charged_tokens")
    assert charged is not None, line
    assert charged["source"] == "estimate" and charged["cached"] == 0, line
    assert charged["prompt"] > 0, line
    assert got == (3 if cut == "upstream_broke" else 2), (got, line)
    # The text that reached the client at 4 bytes a token, at least a token per content event (stop 55: was one
    # per event whatever it carried; the mock's words are 5 to 8 bytes each).
    assert charged["completion"] == max(got, (len("".join(text).encode()) + 3) // 4), (got, text, line)
    assert line["spend_usd"] == spend_of(charged["prompt"], charged["completion"]), line
    # The reported-token counters stay as they were; the estimate counters move by the charge.
    assert tokens(w) == before
    assert w.metric("weir_estimated_prompt_tokens_total") - estimated[0] == charged["prompt"]
    assert w.metric("weir_estimated_completion_tokens_total") - estimated[1] == charged["completion"]


# A whole stream's line has its reported counts and no charged_tokens.
def test_a_whole_stream_has_no_charged_tokens(mock, weir):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "4", "--any-model")
    w = weir(config=config(m), workers=1)
    assert stream(w, "plain", "whole", continuous=False) == 4
    line = w.log_for("whole")
    assert line["status"] == 200 and line["error"] is None, line
    assert line["completion_tokens"] == 4 and "charged_tokens" not in line, line
