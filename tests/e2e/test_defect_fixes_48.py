"""Defects left open at stop 47 and fixed in stop 48."""
from __future__ import annotations

import httpx

from test_defect_fixes import RawUpstream

ERR_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


# DEFECT: a micro-batch's retry sent the upstream the x-request-id of the attempt it replaced (Batch::send set
# the id once): vLLM refuses an id it is still running, and an attempt Weir gave up on may run until its abort is
# processed. Each send after the first carries the batch's id with "-N" after it, as an unbatched request's do;
# the log's batch.id stays the batch's own.
def test_a_micro_batchs_retry_carries_an_upstream_id_of_its_own(weir):
    seen = []

    def answer(headers, body):
        seen.append(headers.get("x-request-id"))
        return ERR_503
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"b": {"endpoints": [up.url], "retry": {"attempts": 3},
                                         "batch": {"window": "20ms", "max_size": 4}}},
                         "models": {"m": {"pool": "b"}}}, workers=1)
        r = httpx.post(w.v1 + "/completions", headers={"x-request-id": "member"}, timeout=10,
                       json={"model": "m", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert len(seen) == 3, seen
        first = seen[0]
        assert seen[1:] == [first + "-1", first + "-2"], seen
        line = w.log_for("member")
        assert line["batch"]["id"] == first and line["retries"] == 2, line
    finally:
        up.close()
