"""Stop 53: an endpoint that fails every request fast, at or after its head, is ejected (docs/routing.md,
"Endpoints that fail fast"). A raw-socket upstream beside a good weir-mock in one pool."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from conftest import wait_until
from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hello"}]
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")
FAILURES = 3  # outlier.consecutive_failures


def head(status: str, fields: dict[str, str], body: bytes) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return f"HTTP/1.1 {status}\r\n{lines}content-length: {len(body)}\r\n\r\n".encode() + body


HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
COMPLETION = json.dumps({"id": "c", "object": "chat.completion", "model": "mock-model",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                      "finish_reason": "stop"}]}).encode()
# What the bad endpoint answers every POST with (None: it closes the connection).
BAD = {
    # A head that does not parse: an invalid HTTP response before the head.
    "garbage": lambda: b"HTTP/1.1 2x0 WHAT\r\ncontent-length: 2\r\n\r\n{}",
    # A 200 head, then a page that is no completion (a proxy in front of the replica).
    "html200": lambda: head("200 OK", {"content-type": "text/html"}, HTML),
    # A 200 head declaring 1000 bytes, 10 of them, then the connection closes.
    "truncated": lambda: [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                          + COMPLETION[:10], None],
    # A 200 labelled gzip whose bytes are no gzip: a body Weir cannot decode.
    "undecodable": lambda: head("200 OK", {"content-type": "application/json", "content-encoding": "gzip"},
                                b"\x1f\x8bnot-gzip-at-all"),
    # A 429 at once (its capacity, or its account's limits).
    "429": lambda: head("429 Too Many Requests", {"content-type": "application/json"},
                        b'{"error":{"message":"rate limited","type":"rate_limit_error","code":429}}'),
}


class Bad:
    """A RawUpstream answering every request with BAD[mode]; counts the requests it got."""

    def __init__(self, mode: str):
        self.count = 0
        self._lock = threading.Lock()

        def answer(headers, body):
            with self._lock:
                self.count += 1
            return BAD[mode]()

        self.up = RawUpstream(answer)
        self.url = self.up.url

    def close(self):
        self.up.close()


def pool_config(bad_url: str, good_url: str, balance: str, **extra) -> dict:
    return {"pools": {"gpu": {"endpoints": [bad_url, good_url], "balance": balance, "load_metrics": False,
                              "eject_for": "60s",
                              "outlier": {"consecutive_failures": FAILURES, "max_ejected_percent": 50}, **extra}},
            "models": {"mock-model": {"pool": "gpu"}}}


def chat(c: httpx.Client, stream: bool = False, **extra) -> httpx.Response:
    return c.post("/v1/chat/completions", json={"model": "mock-model", "messages": MSG, "max_tokens": 4,
                                                "stream": stream, **extra})


# DEFECT: a non-streamed answer was judged at its head: an invalid head (protocol) was no verdict at all, and a
# 200 head was a good one whatever its body then was (an HTML page, a body cut short, one that cannot be decoded),
# so an endpoint whose every answer reached the client as Weir's 502 was never ejected, and under least_load (its
# requests end at once: it looks idle) it took every request. A fast 429 looked idle the same way. Now every
# answer the client gets as a 502/504 for the endpoint's fault, and a 429, counts as a failed answer, and a
# non-streamed 2xx is a good one only once its body was read whole and valid.
@pytest.mark.parametrize("mode", list(BAD))
@pytest.mark.parametrize("balance", ["least_load", "p2c"])
def test_an_endpoint_that_fails_every_answer_fast_is_ejected(mock, weir, mode, balance):
    good = mock(*FAST)
    bad = Bad(mode)
    try:
        w = weir(config=pool_config(bad.url, good.base_url, balance), workers=1)
        c = httpx.Client(base_url=w.base_url, timeout=10)
        codes = [chat(c).status_code for _ in range(40)]
        # The bad endpoint had its FAILURES answers, then was ejected (for 60 s): every later request is the
        # good endpoint's.
        assert bad.count == FAILURES, (bad.count, codes)
        assert w.metric("weir_upstream_ejections_total", endpoint=bad.url, cause="failures") == 1
        assert w.metric("weir_upstream_ejections_total", endpoint=good.base_url) == 0
        want = 429 if mode == "429" else 502
        assert sorted(set(codes)) == sorted({200, want}) and codes.count(want) == FAILURES, codes
        assert codes[-10:] == [200] * 10
    finally:
        bad.close()


# DEFECT: with a retry section, an invalid HTTP response before the head was never retried (a reset was), and
# the client got the 502 though another endpoint was free. Now it is retried as a reset is
# (weir_upstream_retries_total{reason="protocol"}).
def test_an_invalid_head_is_retried_on_another_endpoint(mock, weir):
    good = mock(*FAST)
    bad = Bad("garbage")
    try:
        w = weir(config=pool_config(bad.url, good.base_url, "least_load", retry={"attempts": 2}), workers=1)
        c = httpx.Client(base_url=w.base_url, timeout=10)
        codes = [chat(c).status_code for _ in range(20)]
        assert codes == [200] * 20, codes
        assert 1 <= bad.count <= FAILURES
        assert w.metric("weir_upstream_retries_total", reason="protocol") == bad.count
        assert w.metric("weir_upstream_failures_total", endpoint=bad.url, kind="protocol") == bad.count
    finally:
        bad.close()


# DEFECT: a half-open breaker's trial closed on a 200 head, its body an HTML page: the endpoint was back in use
# (weir_upstream_recoveries_total) though its answer was Weir's 502. Now the trial fails, the breaker opens again.
def test_a_half_open_trial_answered_with_a_page_reopens_the_breaker(mock, weir):
    good = mock(*FAST)
    bad = Bad("html200")
    try:
        cfg = pool_config(bad.url, good.base_url, "least_load", breaker={"half_open_trials": 1}, eject_for="300ms")
        cfg["pools"]["gpu"]["outlier"]["consecutive_failures"] = 1
        w = weir(config=cfg, workers=1)
        c = httpx.Client(base_url=w.base_url, timeout=10)
        for _ in range(40):
            chat(c)
            if bad.count:
                break
        assert bad.count == 1 and w.metric("weir_upstream_ejections_total", endpoint=bad.url) == 1
        wait_until(lambda: w.metric("weir_upstream_endpoint_state", endpoint=bad.url, state="half_open") == 1,
                   timeout=10, interval=0.02, message="half-open")
        for _ in range(60):
            chat(c)
            if bad.count == 2:
                break
        assert bad.count == 2  # its trial
        assert w.metric("weir_upstream_recoveries_total", endpoint=bad.url) == 0
        assert w.metric("weir_upstream_ejections_total", endpoint=bad.url, cause="half_open_failure") == 1
    finally:
        bad.close()


# DEFECT: a replica of a pool that does not serve the pool's model (a wrong --served-model-name) answers vLLM's
# 404 "The model `X` does not exist." at once: it looked idle and took its share, or all of it under
# least_load. Now such a 404, for a listed model the pool routes there, is a failed answer (the client still
# gets it); another 4xx, or an unlisted model's 404 on a default_pool (the client's name), is not.
def test_a_replica_without_the_pools_model_is_ejected(mock, weir):
    good = mock(*FAST)
    wrong = mock(*FAST, "--model", "other-model")
    w = weir(config=pool_config(wrong.base_url, good.base_url, "least_load"), workers=1)
    c = httpx.Client(base_url=w.base_url, timeout=10)
    codes = [chat(c).status_code for _ in range(40)]
    assert codes.count(404) == FAILURES and codes[-10:] == [200] * 10, codes
    assert w.metric("weir_upstream_ejections_total", endpoint=wrong.base_url, cause="failures") == 1
    # Streamed alike: the 404 head waits for its body's verdict.
    w2 = weir(config=pool_config(wrong.base_url, good.base_url, "least_load"), workers=1)
    c2 = httpx.Client(base_url=w2.base_url, timeout=10)
    codes = [chat(c2, stream=True).status_code for _ in range(40)]
    assert codes.count(404) == FAILURES and codes[-10:] == [200] * 10, codes
    assert w2.metric("weir_upstream_ejections_total", endpoint=wrong.base_url, cause="failures") == 1


def test_a_clients_404_ejects_nothing(mock, weir):
    # An unlisted model on a default pool: the name is the client's, and so is the 404 it gets from every replica.
    m1, m2 = mock(*FAST), mock(*FAST)
    w = weir(config={"pools": {"gpu": {"endpoints": [m1.base_url, m2.base_url], "balance": "least_load",
                                       "load_metrics": False,
                                       "outlier": {"consecutive_failures": 1, "max_ejected_percent": 50}}},
                     "default_pool": "gpu"}, workers=1)
    c = httpx.Client(base_url=w.base_url, timeout=10)
    for _ in range(10):
        r = c.post("/v1/chat/completions", json={"model": "no-such-model", "messages": MSG, "max_tokens": 4})
        assert r.status_code == 404 and "does not exist" in r.text, r.text
    # A 404 of another kind for a listed model, and a 400: the client's too.
    other = RawUpstream(lambda h, b: head("404 Not Found", {"content-type": "application/json"},
                                          b'{"detail":"Not Found"}'))
    try:
        w2 = weir(config=pool_config(other.url, m1.base_url, "least_load"), workers=1)
        c2 = httpx.Client(base_url=w2.base_url, timeout=10)
        codes = [chat(c2).status_code for _ in range(20)] + [chat(c2, max_tokens=-1).status_code for _ in range(10)]
        assert 404 in codes and 400 in codes, codes
        assert w2.metric("weir_upstream_ejections_total") == 0
    finally:
        other.close()
    assert w.metric("weir_upstream_ejections_total") == 0


# The same in a micro-batch or coalesced generation (pools.X.batch, coalesce): its one whole answer was judged
# good at its 200 head. Now once its body was read, failed when it is no JSON object.
@pytest.mark.parametrize("shape", [{"coalesce": True}, {"batch": {"window": "2ms", "max_size": 4}}])
def test_a_batched_answer_that_is_a_page_ejects_its_endpoint(mock, weir, shape):
    good = mock(*FAST)
    bad = Bad("html200")
    try:
        w = weir(config=pool_config(bad.url, good.base_url, "least_load", **shape), workers=1)
        c = httpx.Client(base_url=w.base_url, timeout=10)
        if "batch" in shape:  # (a micro-batch takes completions)
            codes = [c.post("/v1/completions", json={"model": "mock-model", "prompt": "hi", "max_tokens": 4,
                                                     "temperature": 0}).status_code for _ in range(40)]
        else:
            codes = [chat(c, temperature=0).status_code for _ in range(40)]
        assert bad.count == FAILURES, (bad.count, codes)
        assert codes.count(502) == FAILURES and codes[-10:] == [200] * 10, codes
        assert w.metric("weir_upstream_ejections_total", endpoint=bad.url, cause="failures") == 1
        assert all("batch" in e for e in w.wait_log(lambda es: len(es) >= 40, timeout=10)), "sent as a batch"
    finally:
        bad.close()


# --- What a client or one caller causes ejects nothing (the regression helper's two findings) ---------------

def _two_mocks_pool(mock, *flags, **pool) -> dict:
    a, b = mock(*flags), mock(*flags)
    return {"endpoints": [a.base_url, b.base_url], "balance": "p2c", "load_metrics": False, "eject_for": "60s",
            "outlier": {"consecutive_failures": 3, "max_ejected_percent": 50}, **pool}


@pytest.mark.parametrize("breaker", [False, True])
def test_an_answer_over_max_response_is_weirs_limit_not_the_endpoints_failure(weir, mock, breaker):
    # A client asking for a long answer (max_tokens, logprobs) past server.max_response gets Weir's 502; the
    # healthy endpoints that sent it are not ejected, nor their breakers opened, for other clients.
    pool = _two_mocks_pool(mock, "--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "2000", breaker=breaker)
    w = weir(config={"server": {"max_response": "4KiB"}, "pools": {"gpu": pool},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    for _ in range(8):
        r = httpx.post(w.v1 + "/chat/completions", timeout=20,
                       json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 1500})
        assert r.status_code == 502 and "larger than" in r.json()["error"]["message"], r.text
    r = httpx.post(w.v1 + "/chat/completions", timeout=20,
                   json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert w.metric("weir_upstream_ejections_total") == 0


def test_429s_never_open_more_than_max_ejected_percent_even_with_a_breaker(weir, mock):
    # An upstream that limits per caller (another gateway, a provider's per-user limit): one tenant's flood of
    # 429s must not open every breaker and turn into a pool-wide 503 for everyone.
    pool = _two_mocks_pool(mock, "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "3", "--error-rate", "1",
                           "--error-status", "429", breaker=True)
    w = weir(config={"pools": {"gpu": pool}, "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    statuses = [httpx.post(w.v1 + "/chat/completions", timeout=20,
                           json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}).status_code
                for _ in range(12)]
    assert statuses == [429] * 12, statuses
    assert w.metric("weir_upstream_ejections_total") <= 1  # one endpoint of two at most
