"""Redis-shared state, stop 61's fixes (docs/admission.md, "Redis outage", "How it works"; docs/auth.md):
a Redis that refuses Weir's connections (NOAUTH: a password Weir does not send; maxclients) is retried
with the backoff, not 12-16 times a second; hand-written slot and allowance entries expiring far beyond
what Weir writes, and a slot hash past the field bound, are bad data (dropped, logged with the key,
counted); a never-resetting budget's running totals of replicas gone long ago are folded away; a sync
timeout names the key; every distinct invalid key record is named in the log."""

from __future__ import annotations

import hashlib
import socket
import time

import httpx
import openai

from conftest import wait_until
from test_redis import sha

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4", "--model", "m")


def prefix(redis) -> str:
    return f"weir-test61-{redis.port}:"


def config(mock, redis, tenants: dict, **redis_extra) -> dict:
    """Tenants by name, each with a key sk-<name>."""
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "default_max_tokens": 4}},
        "tenants": tenants,
        "auth": {"api_keys": [{"id": name, "sha256": sha(f"sk-{name}"), "tenant": name} for name in tenants]},
        "pricing": {"m": {"input": 1.0, "output": 2.0}},
        "redis": {"url": redis.url, "key_prefix": prefix(redis), **redis_extra},
    }


def call(w, tenant: str) -> int:
    return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer sk-{tenant}"}, timeout=30,
                      json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
                      ).status_code


def stream_status(w, tenant: str) -> int:
    client = openai.OpenAI(base_url=w.v1, api_key=f"sk-{tenant}", max_retries=0, timeout=10)
    try:
        s = client.chat.completions.create(model="m", max_tokens=4, stream=True,
                                           messages=[{"role": "user", "content": "hi"}])
        for _ in s:
            pass
        return 200
    except openai.APIStatusError as e:
        return e.status_code


class Conn:
    """One held RESP connection to Redis (the tests' admin connection: kept while others are refused)."""

    def __init__(self, port: int, password: str | None = None):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        if password:
            assert self("AUTH", password) == "OK"

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            assert chunk, "Redis closed the test's connection"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t in (b"+", b"-"):
            return rest.decode()
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data.decode(errors="replace")
        if t == b"*":
            return [self._read() for _ in range(int(rest))]
        raise AssertionError(f"unexpected reply {line!r}")

    def __call__(self, *args: str):
        payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        self.s.sendall(payload.encode())
        return self._read()

    def stat(self, name: str) -> int:
        info = self("INFO", "stats")
        return int(next(line.split(":", 1)[1] for line in info.splitlines() if line.startswith(name + ":")))

    def close(self):
        self.s.close()


def test_a_redis_that_wants_a_password_weir_lacks_is_retried_with_backoff(mock, weir, redis):
    """requirepass set, no password in Weir: every connection's first command gets NOAUTH. Before the fix
    that reply counted as a connection that served (the backoff went back to 50 ms) and Redis closed the
    connection at the next pipelined command: 12-16 connections a second per client, forever."""
    m = mock(*MOCK_FLAGS)
    c = Conn(redis.port)
    assert c("CONFIG", "SET", "requirepass", "pw61") == "OK"
    try:
        # A budget and a stream cap: their scripts' commands (over 10 arguments) are what Redis closes an
        # unauthenticated connection for; the outage's probe replays them every tick.
        before = c.stat("total_connections_received")
        w = weir(config=config(m, redis, {"acme": {"limits": {"requests_per_minute": 6000,
                                                               "max_concurrent_streams": 4},
                                                    "budget": {"usd": 100}}},
                               reconnect_max="2s", fail_open=True))
        wait_until(lambda: c.stat("total_connections_received") > before, 10, message="Weir connecting")
        call(w, "acme")
        before = c.stat("total_connections_received")
        t0 = time.monotonic()
        # 6 s at a backoff doubling from 50 ms to 2 s: about 5 connections. Before the fix: about 90.
        wait_until(lambda: time.monotonic() - t0 >= 6, 10, interval=0.1)
        got = c.stat("total_connections_received") - before
        assert got <= 10, f"{got} connections in 6 s: no backoff"
        log = w.process.log()
        assert "Redis requires a password and Weir has none" in log, log
        # Logged once per streak (the reason does not change), not per connection.
        assert log.count("refused: Redis answered NOAUTH") == 1, log
        assert w.metric("weir_redis_degraded") == 1
        # The password removed: Weir serves from Redis again.
        assert c("CONFIG", "SET", "requirepass", "") == "OK"
        wait_until(lambda: w.metric("weir_redis_degraded") == 0, 10, interval=0.05,
                   message="the outage ended once Redis took Weir's commands")
        assert call(w, "acme") == 200
    finally:
        c("CONFIG", "SET", "requirepass", "")
        c.close()


def test_a_redis_at_maxclients_is_retried_with_backoff_and_its_answer_logged(mock, weir, redis):
    """maxclients reached: Redis accepts, answers "-ERR max number of clients reached" and closes. Before
    the fix the reply was dropped as "reply without a command" (or counted as a connection that served)."""
    m = mock(*MOCK_FLAGS)
    c = Conn(redis.port)
    n = int(next(line.split(":", 1)[1] for line in c("INFO", "clients").splitlines()
                 if line.startswith("connected_clients:")))
    assert c("CONFIG", "SET", "maxclients", str(n)) == "OK"
    try:
        before = c.stat("rejected_connections")
        w = weir(config=config(m, redis, {"acme": {"limits": {"requests_per_minute": 6000}}},
                               reconnect_max="2s", fail_open=True))
        wait_until(lambda: c.stat("rejected_connections") > before, 10, message="Weir's connection refused")
        before = c.stat("rejected_connections")
        t0 = time.monotonic()
        # 6 s: about 5 connections; before the fix about 22.
        wait_until(lambda: time.monotonic() - t0 >= 6, 10, interval=0.1)
        got = c.stat("rejected_connections") - before
        assert got <= 10, f"{got} connections refused in 6 s: no backoff"
        log = w.process.log()
        assert "refused: Redis answered ERR max number of clients reached" in log, log
        assert "reply without a command" not in log
    finally:
        c("CONFIG", "SET", "maxclients", "10000")
        c.close()


def test_hand_written_slot_and_allowance_entries_expiring_far_ahead_are_dropped(mock, weir, redis):
    """An entry whose expiry lies beyond what any replica writes (now + slot_ttl) was honoured forever
    (every renewal re-PEXPIREs the hash): streams refused, or every request refused with insufficient_quota,
    nothing logged. Now: dropped, the key and field named, weir_redis_data_resets_total counted."""
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, {"acme": {"limits": {"max_concurrent_streams": 2},
                                                "budget": {"usd": 100}}}, slot_ttl="1s"))
    assert stream_status(w, "acme") == 200
    p = prefix(redis)
    c = Conn(redis.port)
    try:
        slots = p + "slots:tenant:acme"
        budget = p + "budget:tenant:acme:0"
        wait_until(lambda: c("EXISTS", budget) == 1, 10, message="the budget's hash written")
        assert c("HSET", slots, "ghost/0", "2:99999999999999:2:2:0") == 1
        assert c("HSET", budget, "a:ghost/0", "999000000000:99999999999999") == 1
        wait_until(lambda: c("HEXISTS", slots, "ghost/0") == 0 and c("HEXISTS", budget, "a:ghost/0") == 0, 10,
                   interval=0.05, message="both ghost entries dropped")
        wait_until(lambda: w.metric("weir_redis_data_resets_total") >= 2, 5, interval=0.05)
        log = w.process.log()
        assert f"{slots} entry ghost/0 expiring" in log, log
        assert f"{budget} field a:ghost/0 expiring" in log, log
        for _ in range(4):
            assert stream_status(w, "acme") == 200
            assert call(w, "acme") == 200
    finally:
        c.close()


def test_a_slot_hash_past_the_field_bound_is_reset_and_named(mock, weir, redis):
    """5,000 well-formed entries (a legitimate hash has one per replica and scope): the script's work per
    sync grows with them (300,000 put every sync past command_timeout: an outage of every scope on every
    replica). Past 4096 fields the hash is bad data: reset, its key logged, counted."""
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, {"acme": {"limits": {"max_concurrent_streams": 2}}}, slot_ttl="10s"))
    assert stream_status(w, "acme") == 200
    c = Conn(redis.port)
    try:
        slots = prefix(redis) + "slots:tenant:acme"
        # Entries expiring within slot_ttl of now (not "far"): only their number is wrong.
        assert c("EVAL", "local t = redis.call('TIME') local exp = t[1] * 1000 + 20000 "
                 "for i = 1, 5000 do redis.call('HSET', KEYS[1], 'r' .. i, '0:' .. exp .. ':0:0:0') end return 1",
                 "1", slots) == 1
        wait_until(lambda: stream_status(w, "acme") == 200 and c("HLEN", slots) < 10, 10, interval=0.05,
                   message="the hash reset")
        wait_until(lambda: w.metric("weir_redis_data_resets_total") >= 1, 5, interval=0.05)
        assert f"{slots} held 5001 entries (more than 4096)" in w.process.log() or \
            f"{slots} held 5000 entries (more than 4096)" in w.process.log(), w.process.log()
        assert w.metric("weir_redis_degraded") == 0
    finally:
        c.close()


def test_a_sync_timeout_names_the_key_redis_did_not_answer_for(mock, weir, redis):
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, {"acme": {"limits": {"max_concurrent_streams": 2}}},
                           command_timeout="100ms", slot_ttl="600ms"))
    assert stream_status(w, "acme") == 200
    c = Conn(redis.port)
    try:
        # Writes (scripts) paused: the next slot renewal gets no reply within command_timeout.
        assert c("CLIENT", "PAUSE", "3000", "WRITE") == "OK"
        wanted = "the first unanswered command: the slots script on " + prefix(redis) + "slots:tenant:acme"

        def named() -> bool:
            stream_status(w, "acme")  # (a stream asks for its slot: a renewal is due)
            return wanted in w.process.log()

        wait_until(named, 10, interval=0.05, message="the outage names the key")
    finally:
        c("CLIENT", "UNPAUSE")
        c.close()


def test_running_totals_of_replicas_gone_for_a_day_are_folded_away(mock, weir, redis):
    """A never-resetting budget's hash kept one s:<replica>/<scope> field per replica process and scope for
    ever (no expiry), read at every sync. One whose t:<member> (last push) is over a day old goes, with its
    t:; `total` already counts its spend and is unchanged. One without a t: (an older Weir's) is stamped."""
    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, {"acme": {"budget": {"usd": 100}}}, slot_ttl="600ms"))
    assert call(w, "acme") == 200
    c = Conn(redis.port)
    try:
        budget = prefix(redis) + "budget:tenant:acme:0"
        wait_until(lambda: c("HEXISTS", budget, "total") == 1, 10, message="the spend pushed")
        # Two replicas gone: one pushed last 2 days ago; one from before t: existed.
        c("HINCRBY", budget, "total", "5000")
        c("HSET", budget, "s:gone/3", "3000", "t:gone/3", str(int(time.time() * 1000) - 2 * 86400000),
          "s:older/4", "2000")
        total = int(c("HGET", budget, "total"))
        wait_until(lambda: c("HEXISTS", budget, "s:gone/3") == 0 and c("HEXISTS", budget, "t:older/4") == 1,
                   10, interval=0.05, message="the dead replica's field folded, the older one's stamped")
        assert c("HEXISTS", budget, "t:gone/3") == 0
        assert c("HEXISTS", budget, "s:older/4") == 1
        assert int(c("HGET", budget, "total")) >= total  # nothing taken off (this replica may have pushed more)
        # This replica's own running total is stamped with its pushes and stays.
        mine = [f for f in c("HKEYS", budget) if f.startswith("s:") and f != "s:older/4"]
        assert len(mine) == 1 and c("HEXISTS", budget, "t:" + mine[0][2:]) == 1
        assert call(w, "acme") == 200
    finally:
        c.close()


def test_each_distinct_invalid_key_record_is_named_in_the_log(mock, weir, redis):
    """23 broken records: before the fix one line per 10 s for all of them, naming only the first."""
    m = mock(*MOCK_FLAGS)
    p = f"weir-keys61-{redis.port}:"
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}},
                     "tenants": {"acme": {}},
                     "auth": {"required": True, "redis_keys": True, "key_cache_ttl": "300ms",
                              "key_negative_ttl": "100ms"},
                     "redis": {"url": redis.url, "key_prefix": p}})
    c = Conn(redis.port)
    try:
        for i in range(8):
            key = f"sk-weir-broken-{i}"
            c("HSET", p + "key:" + hashlib.sha256(key.encode()).hexdigest(), "id", f"broken-{i}", "tenant", "acme",
              "limits", "{not json")
            r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 401, r.text
        wait_until(lambda: all(f"'broken-{i}'" in w.process.log() for i in range(8)), 5, interval=0.05,
                   message="every broken record named")
        # The same record again is not logged again.
        before = w.process.log().count("'broken-0'")
        key = "sk-weir-broken-0"
        for _ in range(3):
            assert httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                              ).status_code == 401
            time.sleep(0.15)  # past key_negative_ttl: each one is looked up again
        assert w.process.log().count("'broken-0'") == before
    finally:
        c.close()
