"""Routing policies through the gateway (docs/routing.md): prefix_affinity keeps a shared-prefix group on one
endpoint of four weir-mocks with a prefix cache, session_header pins a session, and least_load follows the load
the mocks report on /metrics. Every request goes through the official openai SDK; where each one went is read
from the access log's `endpoint`."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import uuid


from conftest import wait_until
from httpwire import RawConn, request

FAST = {"x-mock-ttft-ms": "1", "x-mock-itl-ms": "1"}
_ids = itertools.count()


def words(n: int, salt: str) -> str:
    return " ".join(f"{salt}{i}" for i in range(n))


def pool_config(mocks, **pool) -> dict:
    return {"pools": {"p": {"endpoints": [m.base_url for m in mocks], **pool}},
            "models": {"mock-model": {"pool": "p"}}}


def send(w, content: str, system: str = "", headers: dict | None = None) -> str:
    """One chat completion through the gateway; returns its request id."""
    rid = f"rt-{next(_ids)}-{uuid.uuid4().hex[:8]}"
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    w.client().chat.completions.create(model="mock-model", messages=msgs, max_tokens=2,
                                       extra_headers={**FAST, "x-request-id": rid, **(headers or {})})
    return rid


def endpoints_of(w, ids: list[str]) -> list[str]:
    entries = w.wait_log(lambda es: {e.get("request_id") for e in es} >= set(ids), timeout=10)
    where = {e["request_id"]: e["endpoint"] for e in entries}
    return [where[i] for i in ids]


def test_prefix_affinity_keeps_a_shared_prefix_group_on_one_endpoint(mock, weir):
    mocks = [mock("--prefix-cache-tokens", "8192", "--prefill-us-per-token", "20", "--max-tokens", "2")
             for _ in range(4)]
    # The guard stays out of it (this test is about the index): absolute 64.
    w = weir(config=pool_config(mocks, balance="prefix_affinity", imbalance={"absolute": 64}), workers=2)
    groups = {g: words(500, f"g{g}x") for g in range(6)}  # ~3,000 characters each
    ids: dict[int, list[str]] = {g: [send(w, "first question", groups[g])] for g in groups}
    with cf.ThreadPoolExecutor(8) as ex:  # the rest concurrently, over both workers' connections
        futs = {ex.submit(send, w, f"question {i}", groups[g]): g for g in groups for i in range(7)}
        for f, g in futs.items():
            ids[g].append(f.result())
    for g, rids in ids.items():
        eps = endpoints_of(w, rids)
        assert len(set(eps)) == 1, (g, eps)
    # The mocks found the prefixes cached: every request but each group's first hit.
    queries = sum(m.metric("vllm:prefix_cache_queries_total") for m in mocks)
    hits = sum(m.metric("vllm:prefix_cache_hits_total") for m in mocks)
    assert hits / queries > 0.75, (hits, queries)
    # Weir's own count of how it picked: each group's first request a miss, the rest matches.
    assert w.metric("weir_routing_picks_total", rule="prefix_miss") == len(groups)
    assert w.metric("weir_routing_picks_total", rule="prefix_match") == 7 * len(groups)


def test_session_header_pins_each_session_to_one_endpoint(mock, weir):
    mocks = [mock("--max-tokens", "2") for _ in range(4)]
    w = weir(config=pool_config(mocks, session_header="x-session-id"), workers=2)
    sessions = [f"session-{i}" for i in range(8)]
    with cf.ThreadPoolExecutor(8) as ex:
        futs = {ex.submit(send, w, f"turn {t} {uuid.uuid4().hex}", "", {"x-session-id": s}): s
                for s in sessions for t in range(6)}
        by_session: dict[str, list[str]] = {}
        for f, s in futs.items():
            by_session.setdefault(s, []).append(f.result())
    homes = set()
    for s, rids in by_session.items():
        eps = endpoints_of(w, rids)
        assert len(set(eps)) == 1, (s, eps)
        homes.add(eps[0])
    assert len(homes) >= 2  # rendezvous spreads the sessions (8 sessions all on one of 4: p = 4^-7)
    # Without the header the pool balances as usual (p2c): requests spread.
    free = endpoints_of(w, [send(w, f"q {i}") for i in range(40)])
    assert len(set(free)) >= 2


def test_least_load_avoids_the_endpoint_vllm_reports_busy(mock, weir):
    busy, idle = mock("--max-tokens", "2"), mock("--max-tokens", "2")
    w = weir(config=pool_config([busy, idle], balance="least_load", load_metrics={"interval": "50ms"}), workers=2)
    # Six requests straight to `busy`, past the gateway (only its /metrics shows them), held for as long as the
    # test runs: their connections close at its end (the mock aborts them), however long the sends below take.
    hold = {"x-mock-ttft-ms": "60000", "x-mock-itl-ms": "1"}
    held = [RawConn(busy.process.port, timeout=30) for _ in range(6)]
    try:
        for c in held:
            c.send(request("POST", "/v1/chat/completions", {"model": "mock-model", "max_tokens": 2,
                                                             "messages": [{"role": "user", "content": "hold"}]},
                           hold))
        wait_until(lambda: busy.metric("vllm:num_requests_running") == 6, 10)
        # The gateway's scrape has seen them (one scraper; the workers read what it stored).
        wait_until(lambda: w.metric("weir_load_requests", state="running") == 6, 10,
                   message="the gateway's load scrape showing busy's six")
        eps = endpoints_of(w, [send(w, f"q {i}") for i in range(12)])
        # In-flight alone (the gateway has none anywhere) would split these between the two.
        assert set(eps) == {idle.base_url}, eps
    finally:
        for c in held:
            c.close()
