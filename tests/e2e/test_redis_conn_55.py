"""Redis connections and the Redis-backed admin, stop 55's fixes (docs/admission.md, "Redis requirements";
docs/admin-api.md): TCP keepalive on both connections; a connection a middlebox dropped silently while idle is
caught by a PING before the next commands, which go out on a new connection at once (no 503, no outage); a
connection Redis closes while idle (its `timeout`, CLIENT KILL) is replaced at once, commands queueing meanwhile,
and routine closes do not flood the log; a key_prefix with glob characters works in the admin API and
scripts/weir-key; an evicting maxmemory-policy is warned of; admin writes say what is known of their outcome;
REDIS:// URLs."""

from __future__ import annotations

import asyncio
import datetime
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import binary, free_port, to_yaml, wait_until
from test_admin_api import TOKEN, Admin
from test_redis import sha

ROOT = Path(__file__).resolve().parents[2]
MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2", "--model", "m")
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}


class BlackholeProxy:
    """A TCP proxy that forgets a connection idle for `idle` seconds as a NAT, firewall or cloud load balancer
    does: from then on its bytes are dropped both ways, without a FIN or RST."""

    def __init__(self, target_port: int, idle: float):
        self.port = free_port()
        self.target, self.idle = target_port, idle
        self.conns: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "proxy up"

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        self.loop.close()

    async def _serve(self):
        self.stop = asyncio.Event()
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        reaper = asyncio.create_task(self._reaper())
        self.ready.set()
        await self.stop.wait()
        self.server.close()
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
        await asyncio.gather(reaper, *(asyncio.all_tasks() - {asyncio.current_task()}), return_exceptions=True)

    async def _reaper(self):
        while True:
            await asyncio.sleep(0.05)
            for c in self.conns:
                if not c["dead"] and time.monotonic() - c["last"] > self.idle:
                    c["dead"] = True

    async def _handle(self, cr, cw):
        rr, rw = await asyncio.open_connection("127.0.0.1", self.target)
        c = {"last": time.monotonic(), "dead": False, "open": True}
        self.conns.append(c)

        async def pump(src, dst):
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if c["dead"]:
                    continue
                c["last"] = time.monotonic()
                dst.write(data)
                await dst.drain()
            c["open"] = False
            if not c["dead"]:
                dst.close()

        await asyncio.gather(pump(cr, rw), pump(rr, cw), return_exceptions=True)

    def live(self) -> int:
        return sum(1 for c in self.conns if c["open"] and not c["dead"])

    def blackholed(self) -> int:
        return sum(1 for c in self.conns if c["dead"])

    def close(self):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def gateway(mock, weir, redis_url: str, prefix: str = "weir55:", fail_open: bool = False, **redis_extra):
    """Weir with keys in Redis (admin API), one tenant with a shared rate limit, fail_open off: a Redis command
    that fails is a 503 the client sees."""
    m = mock(*MOCK_FLAGS)
    port = free_port()
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}},
                     "tenants": {"acme": {"limits": {"requests_per_minute": 60000}}},
                     "auth": {"required": True, "redis_keys": True},
                     "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
                     "redis": {"url": redis_url, "key_prefix": prefix, "fail_open": fail_open, **redis_extra}},
             env=ENV, workers=1)
    admin = Admin(port)

    def ready():
        try:
            return admin("GET", "/ready", token=None).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, 10, message="admin listener")
    return w, admin


def use(w, key: str) -> httpx.Response:
    return httpx.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


def redis_lines(w) -> list[str]:
    return [line for line in w.process.log().splitlines() if "redis" in line]


def client_sockets(redis_port: int) -> list[tuple[str, int]]:
    """(timer kind, timer expiry in clock ticks) of every established TCP socket connected to `redis_port`
    (the client side: its remote port), from /proc/net/tcp: kind "02" is the keepalive timer."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if int(f[2].rsplit(":", 1)[1], 16) == redis_port and f[3] == "01":
                kind, when = f[5].split(":")
                out.append((kind, int(when, 16)))
    return out


def test_both_redis_connections_have_tcp_keepalive(mock, weir, redis):
    w, admin = gateway(mock, weir, redis.url)
    key = admin.create(tenant="acme")["key"]
    assert use(w, key).status_code == 200  # the limiter's connection and the key store's both in use
    wait_until(lambda: len(client_sockets(redis.port)) >= 2, 10, message="two connections to Redis")
    socks = client_sockets(redis.port)
    # Idle established sockets with SO_KEEPALIVE run the keepalive timer, due within TCP_KEEPIDLE (30 s).
    assert all(kind == "02" for kind, _ in socks), socks
    assert all(when <= 30 * 100 for _, when in socks), socks  # USER_HZ ticks


def test_a_connection_a_middlebox_dropped_while_idle_is_replaced_without_a_503(mock, weir, redis):
    """A NAT/firewall/LB forgets idle flows without a FIN: the next command used to wait command_timeout, answer
    503 key_store_unavailable (an uncached key) and start a limiter outage. A PING now goes first on a connection
    idle for 1 s; unanswered, the commands go out on a new connection."""
    proxy = BlackholeProxy(redis.port, idle=1.5)
    try:
        w, admin = gateway(mock, weir, f"redis://127.0.0.1:{proxy.port}")
        keys = [admin.create(tenant="acme")["key"] for _ in range(3)]
        assert use(w, keys[0]).status_code == 200
        for round_, key in enumerate(keys[1:]):
            # Both connections idle and forgotten by the middlebox.
            wait_until(lambda: proxy.live() == 0 and proxy.blackholed() >= 2 * (round_ + 1), 20,
                       message="the connections blackholed")
            r = use(w, key)  # uncached: a lookup in Redis, then the shared limit's sync
            assert r.status_code == 200, r.text
        assert w.metric("weir_redis_outages_total") == 0, redis_lines(w)
        lost = [line for line in redis_lines(w) if "no reply to a PING" in line]
        assert lost, redis_lines(w)  # every loss is logged
    finally:
        proxy.close()


def test_a_connection_redis_closes_while_idle_is_replaced_at_once(mock, weir, redis):
    """Redis closes an idle connection (CLIENT KILL here; its `timeout` alike): the client used to wait 50 ms
    before reconnecting and fail every command meanwhile (503 for an uncached key). The first attempt is now
    immediate and commands queue for it."""
    w, admin = gateway(mock, weir, redis.url)
    keys = [admin.create(tenant="acme")["key"] for _ in range(6)]
    statuses = []
    with httpx.Client(timeout=30) as client, socket.create_connection(("127.0.0.1", redis.port)) as ctl:
        def chat(key: str) -> int:
            return client.post(w.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                               json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
                               ).status_code

        assert chat(keys[0]) == 200  # (the HTTP connection is open: the next requests follow the kill closely)
        kill = b"*6\r\n$6\r\nCLIENT\r\n$4\r\nKILL\r\n$4\r\nTYPE\r\n$6\r\nnormal\r\n$6\r\nSKIPME\r\n$3\r\nyes\r\n"
        for key in keys[1:]:
            time.sleep(1.1)  # the connections have been up for 1 s: a close now is routine, not a server in trouble
            ctl.sendall(kill)
            assert ctl.recv(64).startswith(b":")
            statuses.append(chat(key))
    assert statuses == [200] * len(statuses), (statuses, redis_lines(w))
    assert w.metric("weir_redis_outages_total") == 0, redis_lines(w)


def test_routine_idle_closes_do_not_flood_the_log(mock, weir, redis):
    """Redis `timeout 1`: every idle connection is closed, and replaced, every second or two. That used to log
    "lost: closed by server" and "connected" each time a command had run in between."""
    w, admin = gateway(mock, weir, redis.url)
    keys = [admin.create(tenant="acme")["key"] for _ in range(4)]
    assert use(w, keys[0]).status_code == 200

    def weir_clients() -> set[str]:
        """Redis's ids of the connections other than the one asking (Weir's two)."""
        rows = redis.cli("CLIENT", "LIST").decode().split("\n")
        return {r.split()[0] for r in rows if r.startswith("id=") and "cmd=client|list" not in r}

    redis.cli("CONFIG", "SET", "timeout", "1")
    for key in keys[1:]:
        before = weir_clients()
        # Both connections closed by Redis's timeout and replaced, then used again.
        wait_until(lambda: len(weir_clients() - before) >= 2, 20, message="idle closes")
        assert use(w, key).status_code == 200, redis_lines(w)
    closes = [line for line in redis_lines(w) if "closed by server" in line]
    assert len(closes) <= 2, redis_lines(w)  # the first per connection, then counted only
    assert len([line for line in redis_lines(w) if "connected to" in line]) <= 2, redis_lines(w)
    assert w.metric("weir_redis_outages_total") == 0


@pytest.mark.parametrize("prefix", ["app?:", "weir[prod]:", "a*b:", "x\\y:"])
def test_a_key_prefix_with_glob_characters_is_taken_literally(mock, weir, redis, prefix):
    """SCAN MATCH <prefix>key:* unescaped: "weir[prod]:" found none of its own keys (revoke answered 404 while
    the key kept working) and "app?:" listed another deployment's ("apps:")."""
    other = "apps:key:" + sha("sk-other-deployment")
    redis.cli("HSET", other, "id", "other-id", "tenant", "acme", "revoked", "0")
    w, admin = gateway(mock, weir, redis.url, prefix=prefix)
    k = admin.create(tenant="acme")
    assert use(w, k["key"]).status_code == 200
    listed = admin("GET", "/admin/v1/keys").json()["data"]
    assert [x["id"] for x in listed] == [k["id"]]
    assert admin("GET", "/admin/v1/keys/other-id").status_code == 404
    assert admin("GET", f"/admin/v1/keys/{k['id']}").status_code == 200
    assert admin("DELETE", f"/admin/v1/keys/{k['id']}").status_code == 200
    assert redis.cli("HGET", other, "revoked").endswith(b"0\r\n")  # the other deployment's key untouched

    def weir_key(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "scripts/weir-key"), args[0], "--redis", redis.url,
                               "--prefix", prefix, *args[1:]], capture_output=True, text=True, timeout=30)

    added = weir_key("add", "--tenant", "acme", "--id", "by-script")
    assert added.returncode == 0, added.stderr
    rows = weir_key("list").stdout
    assert "by-script" in rows and k["id"] in rows and "other-id" not in rows, rows
    revoked = weir_key("revoke", "--id", "by-script")
    assert revoked.returncode == 0, revoked.stderr
    assert use(w, added.stdout.strip()).status_code == 401


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "noeviction"])
def test_an_evicting_maxmemory_policy_is_warned_of(mock, weir, redis, policy):
    redis.cli("CONFIG", "SET", "maxmemory-policy", policy)
    w, admin = gateway(mock, weir, redis.url, fail_open=True)
    if policy == "noeviction":
        # A sync has run on the connection (the check comes before it): nothing to warn of.
        assert use(w, admin.create(tenant="acme")["key"]).status_code == 200
        wait_until(lambda: w.metric("weir_redis_syncs_total") >= 1, 10, message="a sync")
        assert w.metric("weir_redis_evicting") == 0
        assert not [line for line in redis_lines(w) if "maxmemory-policy" in line]
        return
    wait_until(lambda: w.metric("weir_redis_evicting") == 1, 10, message="weir_redis_evicting")
    wait_until(lambda: [line for line in redis_lines(w) if f"maxmemory-policy {policy}" in line], 10)
    assert len([line for line in redis_lines(w) if "maxmemory-policy" in line]) == 1


def redis_answers(redis) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", redis.port), timeout=0.05) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_an_admin_write_without_a_reply_in_time_says_its_outcome_is_unknown(mock, weir, redis):
    """Redis answering after command_timeout runs the write anyway: "nothing was changed" was wrong."""
    w, admin = gateway(mock, weir, redis.url)
    admin.create(tenant="acme")
    busy = "local t = redis.call('TIME'); local stop = t[1] * 1e6 + t[2] + 1.5e6; " \
           "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop; return 1"
    blocker = threading.Thread(target=redis.cli, args=("EVAL", busy, "0"), daemon=True)
    blocker.start()  # Redis runs a 1.5 s script: the commands sent meanwhile are read and run after it
    wait_until(lambda: not redis_answers(redis), 5, message="Redis busy")
    r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", "name": "late"})
    blocker.join(10)
    assert r.status_code == 503, r.text
    assert "may still be applied" in r.json()["error"]["message"], r.text
    assert "nothing was changed" not in r.json()["error"]["message"], r.text
    # It was: once Redis runs again, the key is there.
    wait_until(lambda: any(k.get("name") == "late" for k in admin("GET", "/admin/v1/keys").json().get("data", [])),
               10, message="the late write landed")


def test_an_admin_write_redis_refuses_is_said_as_refused(mock, weir, redis):
    w, admin = gateway(mock, weir, redis.url)
    admin.create(tenant="acme")
    redis.cli("CONFIG", "SET", "maxmemory", "1")
    try:
        r = admin("POST", "/admin/v1/keys", json={"tenant": "acme"})
    finally:
        redis.cli("CONFIG", "SET", "maxmemory", "0")
    assert r.status_code == 503, r.text
    msg = r.json()["error"]["message"]
    assert "refused the change (OOM" in msg and "nothing was changed" in msg and "did not answer" not in msg, msg


def check(tmp_path, url: str) -> tuple[int, str]:
    cfg = {"pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}}, "models": {"m": {"pool": "p"}},
           "redis": {"url": url}}
    p = tmp_path / "c.yaml"
    p.write_text(to_yaml(cfg) + "\n")
    r = subprocess.run([binary("weir"), "--check", "--config", str(p)], capture_output=True, text=True, timeout=20)
    return r.returncode, r.stdout + r.stderr


def test_redis_url_scheme_is_case_insensitive_and_a_trailing_dot_is_named(tmp_path):
    assert check(tmp_path, "REDIS://127.0.0.1:6379/1")[0] == 0
    assert check(tmp_path, "Redis://localhost")[0] == 0
    rc, out = check(tmp_path, "redis://127.0.0.1.:6379")
    assert rc == 2 and "trailing dot" in out and "path" not in out, out
    rc, out = check(tmp_path, "REDISS://127.0.0.1:6379")
    assert rc == 2 and "TLS" in out, out


FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="libfaketime not installed")
@pytest.mark.parametrize("period", ["day", "1h"])
def test_the_admin_budget_window_is_redis_s_as_its_spend_is(mock, weir, redis, period):
    """Weir's clock 36 h behind Redis's: spend and Retry-After follow Redis TIME (budget.lua), the admin's
    usage.budget window followed the local clock, another day."""
    m = mock(*MOCK_FLAGS)
    aport = free_port()
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p"}},
                     "tenants": {"t": {"budget": {"usd": 100, "period": period}}},
                     "auth": {"api_keys": [{"id": "t", "sha256": sha("sk-t"), "tenant": "t"}]},
                     "pricing": {"m": {"input": 1.0, "output": 2.0}},
                     "admin": {"listen": f"127.0.0.1:{aport}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
                     "redis": {"url": redis.url, "budget_sync_interval": "50ms"}},
             env={**ENV, "LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": "-36h", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": "Bearer sk-t"}, timeout=30,
                   json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    admin = Admin(aport)
    wait_until(lambda: admin("GET", "/admin/v1/tenants/t").json()["usage"]["budget"]["spent_usd"] > 0, 10,
               message="the spend synced")
    u = admin("GET", "/admin/v1/tenants/t").json()["usage"]["budget"]
    parts = redis.cli("TIME").split(b"\r\n")
    now = int(parts[2]) + int(parts[4]) / 1e6

    def unix(text: str) -> float:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    assert unix(u["window_start"]) <= now < unix(u["window_end"]), (u, now)
