"""Retry-safety defects found in stop 49's black-box round (helper-232), seen through the openai and anthropic
SDKs, which retry a request that timed out, and a 429 or 5xx, twice more unless told not to:
- a stream whose head Weir held (a fallback is configured, so the head waits for the first content event) and
  whose client left before any byte was charged the prompt's estimate; an SDK whose timeout ran out retried it,
  and each attempt paid again for an answer that never came;
- a refusal whose Retry-After is longer than the SDKs wait out (60 s; a day's spent budget) said no
  `x-should-retry: false`, so the SDKs retried it at once after their own short backoff, to be refused again."""
from __future__ import annotations

import hashlib

import httpx
import pytest

from test_defect_fixes_40 import AUTH, KEY, governed

MSG = [{"role": "user", "content": "a b c d e f g h i j k l m n o p q r s t"}]


def _slow_stream_config(mock, *, fallback: bool) -> dict:
    models = {"m": {"pool": "p", "upstream_model": "mock-model"}}
    pools = {"p": {"endpoints": [mock.base_url], "retry": {"attempts": 1}}}
    if fallback:
        pools["fb"] = {"endpoints": [mock.base_url], "retry": {"attempts": 1}}
        models["m"]["fallbacks"] = [{"pool": "fb"}]
    return governed(pools, models)


def _leave_before_the_first_token(w, rid: str) -> bool:
    """Streams and gives up after 0.5 s without a first token (an SDK's timeout); True if the head came."""
    got_head = False
    try:
        with httpx.stream("POST", w.v1 + "/chat/completions", headers={**AUTH, "x-request-id": rid},
                          timeout=httpx.Timeout(10, read=0.5),
                          json={"model": "m", "messages": MSG, "stream": True, "max_tokens": 4}) as r:
            got_head = True
            assert r.status_code == 200
            for _ in r.iter_raw():
                pass
    except httpx.ReadTimeout:
        return got_head
    raise AssertionError("the stream ended before its first token (the mock's time to first token is 3 s)")


@pytest.mark.parametrize("fallback", [True, False], ids=["head-held", "head-sent"])
def test_a_client_that_left_before_any_byte_of_a_held_stream_is_charged_nothing(mock, weir, fallback):
    m = mock("--ttft-ms", "3000", "--itl-ms", "0")
    w = weir(config=_slow_stream_config(m, fallback=fallback), workers=1)
    got_head = _leave_before_the_first_token(w, "left-early")
    assert got_head == (not fallback)  # (a fallback holds the head until the first content event)
    line = w.log_for("left-early", timeout=10)
    assert line["status"] == 499, line
    if fallback:
        # Nothing reached the client: nothing charged (an SDK's retry would pay again for nothing).
        assert not line.get("spend_usd"), line
        assert "charged_tokens" not in line, line
    else:
        # The head reached the client, which left a generation under way: the prompt's estimate, as before.
        assert line["spend_usd"] > 0, line


def test_a_refusal_longer_than_the_sdks_wait_tells_them_not_to_retry(mock, weir):
    # A spent budget of a day: Retry-After is hours away. The SDKs take a Retry-After of at most 60 s; past
    # that they retried at once (their own backoff) and were refused twice more.
    import anthropic
    import openai
    m = mock("--any-model", "--ttft-ms", "0", "--itl-ms", "0")
    cfg = governed({"p": {"endpoints": [m.base_url]}}, budget_usd=100)  # (about 4 requests at $1 a token)
    cfg["tenants"]["t"]["budget"]["period"] = "24h"
    w = weir(config=cfg, workers=1)
    for sent in range(1, 51):
        r = httpx.post(w.v1 + "/chat/completions", headers=AUTH, timeout=10,
                       json={"model": "m", "messages": MSG, "max_tokens": 4})
        if r.status_code == 429:
            break
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
    assert int(r.headers["retry-after"]) > 60, r.headers  # (the day's end: the wait stays said)
    assert r.headers.get("x-should-retry") == "false", r.headers
    before = len(w.wait_log(lambda es: len(es) >= sent))
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=2).chat.completions.create(
            model="m", messages=MSG, max_tokens=4)
    with pytest.raises(anthropic.RateLimitError):
        anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=2).messages.create(
            model="m", messages=MSG, max_tokens=4)
    w.wait_log(lambda es: len(es) >= before + 2)
    assert len(w.log_entries()) == before + 2, "an SDK retried a refusal it could not wait out"
