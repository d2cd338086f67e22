"""Observability fixes of stop 49: the tracer's stderr line about dropped spans names only the reasons that
moved, one failed attempt counts one failure, a scrape's interim 100 Continue stays out of the byte counters,
bytes_in is what Weir took of the request from the connection, and the admin API's request-log reader follows
a database file that was renamed."""

from __future__ import annotations

import httpx
import pytest

from conftest import free_port, wait_until
from otlp import Collector

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4", "--model", "m-up")


def chat(w, request_id: str, **kw) -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": request_id}, timeout=10,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, **kw)


# --- 1. the tracer's drop line -------------------------------------------------------------------------------------

# DEFECT: the tracer's stderr line about dropped spans summed every reason and added "; last error: ..." whenever
# an export had ever failed: spans a full queue dropped minutes after one refused batch were blamed on the
# collector ("... answered 400"). The line names each reason of weir_tracing_spans_dropped_total that moved since
# the last one, and the collector's error only with the drops it caused.
def test_spans_a_full_queue_dropped_are_not_blamed_on_an_old_export_error(mock, weir):
    m = mock(*MOCK_FLAGS)
    c = Collector()
    try:
        w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                         "models": {"m": {"pool": "p", "upstream_model": "m-up"}},
                         "tracing": {"otlp_endpoint": c.url, "flush_interval": "10ms", "queue": 16, "batch": 1,
                                     "timeout": "30s"}}, workers=1)
        with c.lock:
            c.script = [400]  # final: the batch is dropped at once
        assert chat(w, "refused").status_code == 200
        wait_until(lambda: w.metric("weir_tracing_spans_dropped_total", reason="export_failed") > 0, 10,
                   message="the refused batch")
        wait_until(lambda: "answered 400" in w.process.log(), 5, message="the refused batch said at once")
        said = [ln for ln in w.process.log().splitlines() if "spans dropped" in ln]
        assert "answered 400" in said[0] and "queue full" not in said[0], said
        # The collector now holds every answer: the exporter's one POST waits, the worker's queue fills.
        c.gate.clear()
        n = 0
        while w.metric("weir_tracing_spans_dropped_total", reason="queue_full") == 0:
            assert chat(w, f"fill-{n}").status_code == 200
            n += 1
            assert n < 200, "the queue never filled"
        c.gate.set()
        assert w.process.stop(15) == 0  # the drain's report says the rest
        said = [ln for ln in w.process.log().splitlines() if "spans dropped" in ln]
        assert len(said) >= 2, w.process.log()
        for line in said[1:]:
            assert "queue full" in line, line
            assert "400" not in line and "could not be exported" not in line and "last error" not in line, line
    finally:
        c.gate.set()
        c.close()
