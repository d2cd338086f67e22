"""Redis-shared admission (docs/admission.md, "Distributed mode"): a real
redis-server and one or two Weir replicas. Error replies to Weir's scripts
are an outage that changes state once; a stream cap smaller than the number
of replicas admits a serial client; `redis.username` needs a password."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

import test_redis
from conftest import binary, wait_until
from test_redis import KEY

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4", "--model", "m")


def config(mock, redis, tenant: dict, **redis_extra) -> dict:
    # test_redis's, under a key prefix of this file's own.
    cfg = test_redis.config(mock, redis, tenant, **redis_extra)
    cfg["redis"]["key_prefix"] = f"weir-test45-{redis.port}:"
    return cfg


def call(w, client: httpx.Client | None = None) -> httpx.Response:
    return (client or httpx).post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                                  timeout=30, json={"model": "m", "max_tokens": 1,
                                                    "messages": [{"role": "user", "content": "x"}]})


def lines(w, text: str) -> int:
    return sum(1 for line in w.process.log().splitlines() if text in line)


# How each mode makes Redis answer Weir's scripts with an error, and how it is undone.
BREAK = {
    "oom": (("CONFIG", "SET", "maxmemory", "100kb"), ("CONFIG", "SET", "maxmemory", "0")),
    "readonly": (("REPLICAOF", "127.0.0.1", "1"), ("REPLICAOF", "NO", "ONE")),
    "noperm": (("ACL", "SETUSER", "default", "-evalsha"), ("ACL", "SETUSER", "default", "+@all")),
    "noreplicas": (("CONFIG", "SET", "min-replicas-to-write", "1"), ("CONFIG", "SET", "min-replicas-to-write", "0")),
}


@pytest.mark.parametrize("mode", sorted(BREAK))
def test_an_error_reply_is_one_outage_until_redis_can_do_the_work_again(mock, weir, redis, mode):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, {"limits": {"requests_per_minute": 20}}, fail_open=False)
    w = weir(config=cfg)
    for _ in range(3):
        assert call(w).status_code == 200
    redis.cli(*BREAK[mode][0])

    def refused():
        r = call(w)
        return r.status_code == 503 and r
    r = wait_until(refused, 10, interval=0.05, message="503 once Redis answers errors")
    assert r.json()["error"]["code"] == "service_unavailable"
    assert r.headers.get("retry-after") == "1"
    # It stays an outage: no 429 (the shared bucket seen as empty), no 200
    # (a PING taken for recovery), one state change and one log line.
    statuses = [call(w).status_code for _ in range(25)]
    assert set(statuses) == {503}, statuses
    assert w.metric("weir_redis_degraded") == 1
    assert w.metric("weir_redis_outages_total") == 1
    assert lines(w, "unusable (") == 1, w.process.log()
    assert lines(w, "reachable again") == 0
    assert lines(w, "sync command failed") == 0
    assert all(len(line) < 300 for line in w.process.log().splitlines()), w.process.log()

    redis.cli(*BREAK[mode][1])
    wait_until(lambda: call(w).status_code == 200, 10, interval=0.05, message="admission after Redis recovered")
    assert w.metric("weir_redis_degraded") == 0
    assert w.metric("weir_redis_outages_total") == 1
    assert lines(w, "reachable again") == 1


def test_fail_open_under_oom_uses_the_local_limits_without_flapping(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, {"limits": {"requests_per_minute": 10}}, fail_open=True)
    w = weir(config=cfg)
    assert call(w).status_code == 200
    broken = time.monotonic()
    redis.cli("CONFIG", "SET", "maxmemory", "100kb")
    wait_until(lambda: w.metric("weir_redis_degraded") == 1, 10, interval=0.05,
               message="degraded once Redis answers OOM")
    with httpx.Client(timeout=30) as c:  # one client: 30 of their own took seconds on a loaded machine
        statuses = [call(w, c).status_code for _ in range(30)]
    outage = time.monotonic() - broken
    # The local fallback (10 a minute, x fail_open_share 1): one bucket in the whole outage, and what it refilled
    # meanwhile (one every 6 s: the outage lasts a second or so, more on a loaded machine).
    assert statuses.count(200) <= 10 + int(outage / 6), (outage, statuses)
    assert set(statuses) <= {200, 429}, statuses
    assert w.metric("weir_redis_outages_total") == 1
    assert lines(w, "unusable (OOM") == 1, w.process.log()


@pytest.mark.parametrize("gap", [0.0, 0.4, 0.7])
def test_a_serial_client_alternating_replicas_is_admitted_under_a_cap_of_one(mock, weir, redis, gap):
    """max_concurrent_streams 1 with two replicas: the slot moves to the replica the next request
    reaches (the holder gives its idle slot back once the other's demand is recorded)."""
    m = mock(*MOCK_FLAGS)
    cfg = config(m, redis, {"limits": {"max_concurrent_streams": 1}})
    a, b = weir(config=cfg), weir(config=cfg)
    statuses = []
    for i in range(12):
        statuses.append(call((a, b)[i % 2]).status_code)
        if gap:
            time.sleep(gap)  # the client's think time (the scenario), not a wait for Weir
    assert statuses == [200] * 12, statuses


def test_a_cap_of_one_holds_across_two_replicas_under_concurrency(mock, weir, redis):
    """The cap stays exact: with streams that last, concurrent requests on both replicas never
    have two in flight upstream, and a request refused while the slot is busy gets 429."""
    import asyncio
    m = mock("--ttft-ms", "150", "--itl-ms", "1", "--max-tokens", "2", "--model", "m")
    cfg = config(m, redis, {"limits": {"max_concurrent_streams": 1}})
    a, b = weir(config=cfg), weir(config=cfg)
    running_max = 0
    done = False

    async def watch():
        nonlocal running_max
        async with httpx.AsyncClient(timeout=5) as c:
            while not done:
                text = (await c.get(m.base_url + "/metrics")).text
                for line in text.splitlines():
                    if line.startswith("vllm:num_requests_running"):
                        running_max = max(running_max, float(line.rsplit(" ", 1)[1]))
                await asyncio.sleep(0.005)

    async def burst() -> list[int]:
        nonlocal done
        async with httpx.AsyncClient(timeout=30) as c:
            async def one(i: int) -> int:
                w = (a, b)[i % 2]
                r = await c.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                                 json={"model": "m", "max_tokens": 2, "stream": True,
                                       "messages": [{"role": "user", "content": f"x {i}"}]})
                return r.status_code
            out = []
            for _ in range(3):
                out += await asyncio.gather(*(one(i) for i in range(8)))
            done = True
            return out

    async def main():
        watcher = asyncio.create_task(watch())
        out = await burst()
        await watcher
        return out

    statuses = asyncio.run(main())
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= 3, statuses
    assert statuses.count(429) >= 3, statuses
    assert running_max <= 1, running_max


REDIS_AUTH_CASES = [
    ("username-alone", "  username: weir\n", 8, "redis.username", "needs redis.password"),
    ("empty-password", '  password: ""\n', 8, "redis.password", "must not be empty"),
    ("empty-username", '  username: ""\n  password: secret\n', 8, "redis.username", "must not be empty"),
]


@pytest.mark.parametrize("name,extra,line,key,says", REDIS_AUTH_CASES, ids=[c[0] for c in REDIS_AUTH_CASES])
@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_redis_credentials_that_would_be_ignored_are_refused_at_load(tmp_path, name, extra, line, key, says, check):
    """AUTH is sent only with a password: a username alone used to connect as `default`, silently."""
    path = tmp_path / f"{name}.yaml"
    path.write_text('listen: "127.0.0.1:1"\npools:\n  p: {endpoints: ["http://127.0.0.1:1"]}\n'
                    "models:\n  m: {pool: p}\nredis:\n  url: redis://127.0.0.1:1\n" + extra)
    r = subprocess.run([str(binary("weir")), "--config", str(path), *(["--check"] if check else [])],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{path}:{line}:" in r.stderr, r.stderr
    assert f" {key}: " in r.stderr and says in r.stderr, r.stderr


def test_an_ipv6_redis_address_is_bracketed_in_log_lines(mock, weir, tmp_path):
    """Nothing listens on the port: the connection failure and the outage name `[::1]:port`."""
    import socket
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    m = mock(*MOCK_FLAGS)
    cfg = config(m, type("R", (), {"url": f"redis://[::1]:{port}", "port": port})(), {"limits": {
        "requests_per_minute": 100}}, fail_open=False)
    w = weir(config=cfg)
    r = wait_until(lambda: (x := call(w)).status_code == 503 and x, 10, interval=0.05, message="503: no Redis")
    assert r.json()["error"]["code"] == "service_unavailable"
    wait_until(lambda: f"[::1]:{port}" in w.process.log(), 5, message="bracketed address in the log")
    assert f"::1:{port}" not in w.process.log().replace(f"[::1]:{port}", ""), w.process.log()


def test_a_renamed_evalsha_is_an_outage_from_the_start(mock, weir, redis, tmp_path):
    """EVALSHA renamed away (rename-command): 'unknown command' is an outage, not a healthy sync."""
    import shutil
    redis.kill()
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(redis.port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                             "--rename-command", "EVALSHA", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(redis.ping, 10, message="redis-server answering PING")
        m = mock(*MOCK_FLAGS)
        w = weir(config=config(m, redis, {"limits": {"requests_per_minute": 20}}, fail_open=False))
        r = wait_until(lambda: (x := call(w)).status_code == 503 and x, 10, interval=0.05, message="503")
        assert r.json()["error"]["code"] == "service_unavailable"
        statuses = [call(w).status_code for _ in range(10)]
        assert set(statuses) == {503}, statuses
        assert w.metric("weir_redis_degraded") == 1
        assert w.metric("weir_redis_outages_total") == 1
        assert lines(w, "unusable (ERR unknown command") == 1, w.process.log()
    finally:
        proc.kill()
        proc.wait(10)
