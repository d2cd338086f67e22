"""Micro-batching fixes found by this stop's testers (stop 51).

1. A non-streamed member of a micro-batch (`pools.X.batch`) was cut by `timeouts.first_byte` while it waited for
   the batch's first event: a micro-batch goes upstream as a stream, and a non-streamed member's gaps were bounded
   by first_byte where an unbatched non-streamed request now waits `timeouts.response`.
2. The access-log line of a coalesced member logged after its generation ended through a failure (every member
   left, or the upstream failed) said `"size": 0`: the count was read from the member list, which the failure
   clears.
"""

from __future__ import annotations

import asyncio

import httpx

from conftest import wait_until


def test_a_non_streamed_batch_member_waits_timeouts_response_not_first_byte(mock, weir):
    up = mock("--ttft-ms", "1500", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(config={"pools": {"p": {"endpoints": [up.base_url], "batch": {"window": "5ms"},
                                     "timeouts": {"first_byte": "500ms", "response": "5s"}}},
                     "default_pool": "p"}, workers=1)
    for stream in (False, True):
        r = httpx.post(w.v1 + "/completions", timeout=30,
                       json={"model": "mock-model", "prompt": "hi", "max_tokens": 2, "stream": stream})
        assert r.status_code == 200, (stream, r.text)
        if stream:
            assert "[DONE]" in r.text


def test_a_coalesced_generation_that_everyone_left_logs_its_size_on_every_line(mock, weir):
    # A first token 5 s away: both members are in the generation, and leave, long before it.
    up = mock("--ttft-ms", "5000", "--itl-ms", "10", "--max-tokens", "16")
    w = weir(config={"pools": {"gpu": {"endpoints": [up.base_url], "coalesce": True}}, "default_pool": "gpu"},
             workers=1)

    async def member(body: dict, rid: str, leave: asyncio.Event) -> None:
        """Posts, and leaves (closes the connection) once `leave` is set."""
        async with httpx.AsyncClient(timeout=30) as c:
            post = asyncio.ensure_future(c.post(w.v1 + "/chat/completions", json=body, headers={"x-request-id": rid}))
            await leave.wait()
            assert not post.done(), post.result()
            post.cancel()
            try:
                await post
            except asyncio.CancelledError:
                pass

    async def both(stream: bool) -> None:
        body = {"model": "mock-model", "messages": [{"role": "user", "content": f"left {stream}"}],
                "temperature": 0, "max_tokens": 16, "stream": stream}
        leave = asyncio.Event()
        joined = w.metric("weir_coalesced_requests_total")
        first = asyncio.create_task(member(body, f"left-{stream}-0", leave))
        await asyncio.to_thread(wait_until, lambda: up.metric("vllm:num_requests_running") >= 1, 10)
        second = asyncio.create_task(member(body, f"left-{stream}-1", leave))
        # Both leave once the second has joined the first's generation (not after a guess at how long that takes).
        await asyncio.to_thread(wait_until, lambda: w.metric("weir_coalesced_requests_total") > joined, 10,
                                message="the second member joining the generation")
        leave.set()
        await asyncio.gather(first, second)

    for stream in (False, True):
        asyncio.run(both(stream))
        lines = [w.log_for(f"left-{stream}-{i}") for i in range(2)]
        assert [e["status"] for e in lines] == [499, 499], lines
        assert all(e["batch"]["coalesced"] is True for e in lines), lines
        assert len({e["batch"]["id"] for e in lines}) == 1, lines
        assert [e["batch"]["size"] for e in lines] == [2, 2], lines
