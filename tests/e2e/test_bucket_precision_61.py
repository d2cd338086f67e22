"""A bucket of burst 1 at a high rate (a unit refills in a fraction of a millisecond, a non-integer number of
ns and µs) admits every request that comes after a refill, in-process and shared through Redis
(docs/admission.md, "Precision, the same at any uptime"). The in-process limiter's uptime dependence (a full
bucket refused a request of cost = depth after about a day) is tested at 0 to 1000 days by
tests/unit/admission/bucket_precision_test.cpp; here the same limits run end to end, Redis's `lease.lua`
included (Redis TIME in integer µs: exact)."""

from __future__ import annotations

import time

import openai
import pytest

from test_redis import sha

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2", "--model", "m")


def config(mock, redis_url: str | None, limits: dict) -> dict:
    cfg = {"pools": {"p": {"endpoints": [mock.base_url]}},
           "models": {"m": {"pool": "p", "default_max_tokens": 2}},
           "tenants": {"acme": {"limits": limits}},
           "auth": {"api_keys": [{"id": "a", "sha256": sha("sk-prec61"), "tenant": "acme"}]}}
    if redis_url:
        cfg["redis"] = {"url": redis_url, "key_prefix": "prec61:"}
    return cfg


@pytest.mark.parametrize("shared", [False, True], ids=["local", "redis"])
@pytest.mark.parametrize("limits", [{"requests_per_minute": 123457, "requests_burst": 1},
                                    {"requests_per_minute": 3001, "requests_burst": 1}], ids=["123457", "3001"])
def test_burst_of_one_admits_each_request_after_a_refill(mock, weir, redis, shared, limits):
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis.url if shared else None, limits))
    client = openai.OpenAI(base_url=w.v1, api_key="sk-prec61", max_retries=0, timeout=30)
    refill_s = 60 / limits["requests_per_minute"]
    statuses = []
    for _ in range(8):
        # Each after the last one's refill: a request takes longer than 0.5 ms; at 3001 a minute (20 ms) wait it out.
        if refill_s > 0.001:
            time.sleep(refill_s * 1.5)  # the wait the limit itself asks for, not a race
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            statuses.append(200)
        except openai.RateLimitError as e:
            statuses.append((429, e.response.headers.get("retry-after")))
    assert statuses == [200] * 8, statuses
