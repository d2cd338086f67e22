"""Regressions of stop 55's own fixes, found by a regression attack on them.

R1. DEFECT: the Redis client's idle check (a PING before the first command after 1 s of quiet) armed the
    commands' command_timeout when they were queued behind the PING, not when they were written: a Redis
    whose round trip is over half of command_timeout (another region, a proxy, a fork stall) timed them out
    after a PING that answered, and the timeout was taken for an outage (503s, fail_open off). Now their
    timeout starts when they are written.
"""

from __future__ import annotations

import asyncio
import threading
import time

from conftest import free_port
from test_redis_conn_55 import gateway, use


class DelayProxy:
    """A TCP proxy to `target_port` that holds every piece of bytes `delay` seconds, each way."""

    def __init__(self, target_port: int, delay: float):
        self.port = free_port()
        self.target = target_port
        self.delay = delay
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.ready.set()
        await asyncio.Event().wait()

    async def _handle(self, cr, cw):
        rr, rw = await asyncio.open_connection("127.0.0.1", self.target)

        async def pump(src, dst):
            q: asyncio.Queue = asyncio.Queue()

            async def writer():
                while True:
                    t, data = await q.get()
                    if data is None:
                        dst.close()
                        return
                    d = t + self.delay - time.monotonic()
                    if d > 0:
                        await asyncio.sleep(d)
                    dst.write(data)
                    await dst.drain()

            wt = asyncio.create_task(writer())
            while True:
                data = await src.read(65536)
                q.put_nowait((time.monotonic(), data or None))
                if not data:
                    break
            await wt

        await asyncio.gather(pump(cr, rw), pump(rr, cw), return_exceptions=True)


# R1: a 160 ms round trip (under the default command_timeout, 250 ms): every request after an idle second is
# served, with no outage.
def test_a_slow_redis_after_an_idle_second_is_no_outage(mock, weir, redis):
    proxy = DelayProxy(redis.port, 0.08)
    w, admin = gateway(mock, weir, f"redis://127.0.0.1:{proxy.port}")
    keys = [admin.create(tenant="acme")["key"] for _ in range(3)]
    statuses = []
    for k in keys:
        time.sleep(1.3)  # (the condition under test: the connections idle for over idle_check, 1 s)
        r = use(w, k)
        statuses.append((r.status_code, r.text[:200] if r.status_code != 200 else ""))
    assert all(s == 200 for s, _ in statuses), statuses
    assert w.metric("weir_redis_outages_total") == 0
