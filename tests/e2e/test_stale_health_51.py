"""Stop 51: a stale pooled connection is no verdict on its endpoint's health."""
from __future__ import annotations

import httpx

from test_defect_fixes import RawUpstream
from test_defect_fixes_48 import KeptConnectionCloser, stale_rounds


# DEFECT: a pooled connection the upstream had closed as the request went out (vLLM's uvicorn closes a
# keep-alive connection idle for 5 s; Weir resends such a request at once on a fresh connection) was reported to
# the endpoint's health as a failed answer before the resend was decided, unbatched and in a micro-batch: the
# consecutive-failures count, a half-open trial, and with outlier.consecutive_failures 1 an ejection, of an
# endpoint that did no wrong (under light load, when connections sit idle, every request may meet one). Now the
# stale decision comes first, in one place for both paths (routing::Attempts::judge), and a stale resend is no
# verdict. A real reset (here on a fresh connection: never stale) still counts and ejects.
def test_stale_resends_do_not_eject_a_healthy_endpoint(weir):
    u, b = KeptConnectionCloser(), KeptConnectionCloser()
    dead = RawUpstream(lambda headers, body: None)  # closes every request as it arrives: real resets
    # One failed answer ejects (max_ejected_percent 100: even a pool's only endpoint), for a period short
    # enough that a real reset met while waiting for the stale ones leaves the endpoint in use.
    health = {"outlier": {"consecutive_failures": 1, "max_ejected_percent": 100}, "eject_for": "1ms"}
    try:
        w = weir(config={"pools": {"u": {"endpoints": [u.url], **health},
                                   "b": {"endpoints": [b.url], "batch": {"window": "5ms", "max_size": 4}, **health},
                                   "r": {"endpoints": [dead.url], **health}},
                         "models": {"mu": {"pool": "u"}, "mb": {"pool": "b"}, "mr": {"pool": "r"}}}, workers=1)
        for model, pool in (("mu", "u"), ("mb", "b")):
            sent, stale, resets = stale_rounds(w, model, want=3)
            # Each real reset (a close that came after the 5 ms window on a loaded machine) ejected the endpoint
            # once; the stale resends never did.
            assert w.metric("weir_upstream_ejections_total", pool=pool) == resets, (pool, sent, stale, resets)
            assert w.metric("weir_upstream_failures_total", pool=pool) == resets, pool
        r = httpx.post(w.v1 + "/completions", headers={"x-request-id": "real"}, timeout=10,
                       json={"model": "mr", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 502, r.text
        assert w.metric("weir_upstream_ejections_total", pool="r", cause="failures") == 1
        assert w.metric("weir_upstream_failures_total", pool="r", kind="reset") == 1
    finally:
        u.close()
        b.close()
        dead.close()
