"""Redis-shared limits under a burst (docs/admission.md, "Accuracy"): K concurrent requests, each on its own
connection, against a limit of K on one replica are all admitted, and the K+1th is refused, as without
`redis:`. A request that found its lease short waited for one refill and retried once; the units granted
for it went into the lease every request takes from, so requests that had not waited took them and the
waiter's one retry was refused (final) while the shared bucket still held units: 24-40 of 40 admitted."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from test_redis import sha

TRIALS = 6  # fresh tenants: one burst each (on the base build one burst alone lost a request 1 time in 2-4)


def config(mock, redis, limits: dict) -> dict:
    tenants = {f"t{i}": {"limits": limits} for i in range(TRIALS)}
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p"}},
        "tenants": tenants,
        "auth": {"api_keys": [{"id": name, "sha256": sha(f"sk-{name}"), "tenant": name} for name in tenants]},
        "redis": {"url": redis.url, "key_prefix": f"weir-test57b-{redis.port}:"},
    }


async def one(c: openai.AsyncOpenAI, stream: bool, admitted: asyncio.Event | None = None,
              release: asyncio.Event | None = None) -> int:
    """One request: its status (a stream is held open until `release`)."""
    try:
        if not stream:
            await c.chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}])
            return 200
        s = await c.chat.completions.create(model="m", max_tokens=20, stream=True,
                                            messages=[{"role": "user", "content": "x"}])
        async with s:
            if admitted:
                admitted.set()
            if release:
                await release.wait()
        return 200
    except openai.RateLimitError as e:
        return e.status_code


async def burst(w, key: str, k: int, stream: bool) -> tuple[list[int], int]:
    """k concurrent requests (HTTP/1.1: a connection each), then, while the streams among them are still
    open, one more: (statuses, its status)."""
    release = asyncio.Event()
    held: list[asyncio.Future] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=k + 1)) as http:
        c = openai.AsyncOpenAI(base_url=w.v1, api_key=key, max_retries=0, http_client=http)

        async def answered() -> int:
            # A stream is answered once its headers came (it is in flight: held open) or it was refused.
            if not stream:
                return await one(c, False)
            ev = asyncio.Event()
            task = asyncio.ensure_future(one(c, True, admitted=ev, release=release))
            held.append(task)
            opened = asyncio.ensure_future(ev.wait())
            await asyncio.wait({task, opened}, return_when=asyncio.FIRST_COMPLETED)
            opened.cancel()
            return 200 if ev.is_set() else await task

        statuses = await asyncio.gather(*[answered() for _ in range(k)])
        extra = await one(c, stream)
        release.set()
        await asyncio.gather(*held)
    return list(statuses), extra


@pytest.mark.parametrize("limits,stream", [
    ({"requests_per_minute": 1, "requests_burst": 40}, False),
    ({"max_concurrent_streams": 40}, True),
    ({"max_concurrent_streams": 13}, True),
], ids=["requests_burst_40", "streams_40", "streams_13"])
def test_k_concurrent_requests_at_a_limit_of_k_are_all_admitted(mock, weir, redis, limits, stream):
    k = max(limits.get("requests_burst", 0), limits.get("max_concurrent_streams", 0))
    # A stream lasts ~6 s upstream (the test closes it sooner): the K+1th asks while all are in flight.
    m = mock("--ttft-ms", "1", "--itl-ms", "300" if stream else "1", "--max-tokens", "20", "--model", "m")
    w = weir(config=config(m, redis, limits), workers=4)
    results = [asyncio.run(burst(w, f"sk-t{i}", k, stream)) for i in range(TRIALS)]
    admitted = [statuses.count(200) for statuses, _ in results]
    assert admitted == [k] * TRIALS, f"admitted of {k} per burst: {admitted}"
    # The K+1th: the bucket holds no more (its rate is one a minute), the cap is full of open streams.
    assert [extra for _, extra in results] == [429] * TRIALS


def test_a_burst_at_a_requests_per_minute_limit_is_all_admitted(mock, weir, redis):
    """requests_per_minute: 40 (the bucket holds 40, refilling 40 a minute): 40 concurrent requests all pass."""
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4", "--model", "m")
    w = weir(config=config(m, redis, {"requests_per_minute": 40}), workers=4)
    admitted = [asyncio.run(burst(w, f"sk-t{i}", 40, False))[0].count(200) for i in range(TRIALS)]
    assert admitted == [40] * TRIALS, f"admitted of 40 per burst: {admitted}"
