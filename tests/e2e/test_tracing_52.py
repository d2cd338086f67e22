"""Tracing fixes of stop 52: a stream that broke after its 200 head is an ERROR span."""

from __future__ import annotations

import secrets
import threading
import time

import httpx

from conftest import free_port, wait_until
from otlp import Collector, attrs, parse_traceparent

SERVER, CLIENT, INTERNAL = 2, 3, 1


def new_ids() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def config(mock_url: str, collector_url: str, pools: dict | None = None, **tracing) -> dict:
    models = {"m": {"pool": "p", "upstream_model": "m-up", "default_max_tokens": 8}}
    for name in pools or {}:
        models[f"m-{name}"] = {"pool": name, "upstream_model": "m-up", "default_max_tokens": 4}
    return {
        "pools": {"p": {"endpoints": [mock_url]}, **(pools or {})},
        "models": models,
        "tracing": {"otlp_endpoint": collector_url, "flush_interval": "10ms", **tracing},
    }


def chat(w, trace_id: str, parent: str, stream: bool = False) -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream},
                      headers={"traceparent": f"00-{trace_id}-{parent}-01"})


# --- 1. a 200 that then failed --------------------------------------------------------------------------------------

# DEFECT: a stream whose upstream broke after the 200 head (Weir writes an in-band upstream_unavailable error) had
# a SERVER span with status UNSET and no error.type, only weir.error.code: OpenTelemetry's HTTP conventions ask
# for status Error when a 1xx-3xx response ends in an error. The request span is ERROR with error.type the code.
def test_a_stream_that_broke_after_its_head_is_an_error_span(mock, weir):
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "20", "--model", "m-up", "--reset-after", "3")
    c = Collector()
    try:
        w = weir(config=config(m.base_url, c.url))
        trace_id, parent = new_ids()
        r = chat(w, trace_id, parent, stream=True)
        assert r.status_code == 200 and "upstream_unavailable" in r.text, r.text
        spans = c.wait_trace(trace_id, n=3)
        root = next(s for s in spans if s["kind"] == SERVER)
        a = attrs(root)
        assert a["http.response.status_code"] == 200 and a["weir.error.code"] == "upstream_unavailable"
        assert root["status"]["code"] == 2, root["status"]
        assert a["error.type"] == "upstream_unavailable"
        # The client's own errors stay UNSET: a 4xx.
        trace_id, parent = new_ids()
        r = httpx.post(w.v1 + "/chat/completions", timeout=30, json={"model": "nope", "messages": []},
                       headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        assert 400 <= r.status_code < 500
        root = next(s for s in c.wait_trace(trace_id) if s["kind"] == SERVER)
        assert root.get("status", {}).get("code", 0) == 0 and "error.type" not in attrs(root)
    finally:
        c.close()

