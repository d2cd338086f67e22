"""The pool's admission queue is fair between tenants of one priority (docs/reliability.md#overload): start-time
fair queuing, so a tenant with one request waiting is not behind another tenant's whole backlog, and a full queue
sheds the newest request of the tenant with the most waiting rather than refusing the other tenant's newcomer."""

from __future__ import annotations

import hashlib
import threading

import httpx

from conftest import wait_until
from httpwire import RawConn, request

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def chat(**extra) -> dict:
    return {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **extra}


def gateway(mock, weir, size: int):
    m = mock(*FAST)
    w = weir(config={
        "tenants": {"bulk": {}, "interactive": {}},
        "auth": {"api_keys": [{"id": "bulk", "sha256": sha("sk-bulk"), "tenant": "bulk"},
                              {"id": "inter", "sha256": sha("sk-inter"), "tenant": "interactive"}]},
        "pools": {"gpu": {"endpoints": [m.base_url],
                          "queue": {"max_concurrent": 1, "size": size, "timeout": "30s", "saturation": False}}},
        "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    return m, w


KEY = {"bulk": "Bearer sk-bulk", "inter": "Bearer sk-inter"}


class Client:
    """Requests sent from threads, one kept-alive httpx client (a client per request costs ~50 ms of CPU under
    load), each waited into the queue before the next is sent, so the queue's order is the sending order."""

    def __init__(self, w):
        self.w = w
        self.http = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=64))
        self.done: dict[str, int] = {}
        self.threads: list[threading.Thread] = []

    def send(self, rid: str, who: str, waiting: int | None):
        def run():
            r = self.http.post(self.w.base_url + "/v1/chat/completions", json=chat(),
                               headers={"authorization": KEY[who], "x-request-id": rid})
            self.done[rid] = r.status_code
        self.threads.append(threading.Thread(target=run))
        self.threads[-1].start()
        if waiting is not None:
            wait_until(lambda: self.w.metric("weir_queue_waiting", pool="gpu") == waiting, 20,
                       message=f"{waiting} waiting after {rid}")

    def join(self):
        for t in self.threads:
            t.join(60)
        self.http.close()


def occupy(w, m) -> RawConn:
    """The pool's one place, taken by a bulk stream that waits upstream until its client leaves."""
    conn = RawConn(w.port)
    conn.send(request("POST", "/v1/chat/completions", chat(stream=True),
                      {"authorization": KEY["bulk"], "x-mock-ttft-ms": "60000"}))
    wait_until(lambda: m.metric("vllm:num_requests_running") == 1, 20, message="the occupant runs")
    return conn


def served_order(w, ids: list[str]) -> list[str]:
    for rid in ids:
        w.log_for(rid)
    logged = [e.get("request_id") for e in w.log_entries()]
    return sorted(ids, key=logged.index)


# DEFECT: the queue was one line by priority then arrival: with one tenant's backlog of 6 waiting, another tenant's
# single request waited behind all 6 (served 7th). Now the tenants alternate: it is served second.
def test_a_tenant_with_one_waiting_is_not_behind_anothers_backlog(mock, weir):
    m, w = gateway(mock, weir, size=16)
    occupant = occupy(w, m)
    c = Client(w)
    for i in range(6):
        c.send(f"bulk-{i}", "bulk", waiting=i + 1)
    c.send("inter-0", "inter", waiting=7)
    c.send("inter-1", "inter", waiting=8)
    occupant.close()
    c.join()
    ids = [f"bulk-{i}" for i in range(6)] + ["inter-0", "inter-1"]
    assert all(c.done[r] == 200 for r in ids), c.done
    assert served_order(w, ids) == ["bulk-0", "inter-0", "bulk-1", "inter-1", "bulk-2", "bulk-3", "bulk-4",
                                    "bulk-5"]


# DEFECT: a full queue refused every newcomer of the lowest waiting priority: one tenant filling the queue shut
# every other tenant of its priority out (503 overloaded) for as long as it kept it full. Now the newcomer of a
# tenant with fewer waiting displaces the backlogged tenant's newest, which is answered 503 at once.
def test_a_full_queue_sheds_the_backlogged_tenants_newest_not_the_other_tenant(mock, weir):
    m, w = gateway(mock, weir, size=4)
    occupant = occupy(w, m)
    c = Client(w)
    for i in range(4):
        c.send(f"bulk-{i}", "bulk", waiting=i + 1)
    # Full of bulk: another bulk request is refused.
    c.send("bulk-4", "bulk", waiting=None)
    wait_until(lambda: "bulk-4" in c.done, 20, message="bulk-4 refused")
    assert c.done["bulk-4"] == 503
    # An interactive request takes bulk's newest place.
    c.send("inter-0", "inter", waiting=None)
    wait_until(lambda: "bulk-3" in c.done, 20, message="bulk-3 displaced")
    assert c.done["bulk-3"] == 503
    assert w.log_for("bulk-3")["status"] == 503
    assert w.metric("weir_queue_waiting", pool="gpu") == 4
    occupant.close()
    c.join()
    assert {r: c.done[r] for r in ("bulk-0", "bulk-1", "bulk-2", "inter-0")} == dict.fromkeys(
        ("bulk-0", "bulk-1", "bulk-2", "inter-0"), 200)
    assert served_order(w, ["bulk-0", "bulk-1", "bulk-2", "inter-0"]) == ["bulk-0", "inter-0", "bulk-1", "bulk-2"]
    assert w.metric("weir_requests_shed_total", pool="gpu", reason="queue_full") == 2
