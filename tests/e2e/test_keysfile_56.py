"""One admin.keys_file, two Weirs: the zero-downtime restart (docs/operations.md) runs the old and the new
instance side by side on the same ports (--reuse-port), both serving the admin API. A key created, changed or
revoked on either is kept in the file and in force on both (the other reads the file again within about a
second); after the old one handed the admin port over, a write on a connection still open to it is refused
with 503, never applied there (docs/admin-api.md, Persistence).

Which instance serves a request is never left to chance: each check runs on a connection whose server end
/proc shows held by the instance meant."""

from __future__ import annotations

import json
import os
import signal

import httpx
import openai
import pytest

from conftest import _ports, binary, free_port, wait_until
from httpwire import RawConn, assert_openai_error, request

TOKEN = "keysfile-admin-token-0123456789abcdef"
ENV = {"WEIR_KF_ADMIN": TOKEN}
AUTH = {"authorization": f"Bearer {TOKEN}"}


def config(m, aport: int, keys_file) -> dict:
    return {"server": {"drain_timeout": "30s"}, "pools": {"p": {"endpoints": [m.base_url]}},
            "models": {"mock-model": {"pool": "p"}}, "tenants": {"acme": {"models": ["mock-model"]}},
            "auth": {"required": True},
            "admin": {"listen": f"127.0.0.1:{aport}", "token_env": "WEIR_KF_ADMIN", "keys_file": str(keys_file)}}


def owner(conn: RawConn, port: int, pids: tuple[int, ...]) -> int | None:
    """The pid among `pids` holding the server end of `conn` (a connection to `port`, answered once: accepted)."""
    mine = conn.sock.getsockname()[1]
    inodes = {f"socket:[{inode}]" for local, remote, state, inode in _ports.tcp_sockets()
              if state == "01" and local == port and remote == mine}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
            except OSError:
                continue
    return None


def conn_to(port: int, pid: int, pids: tuple[int, ...], probe: str) -> RawConn:
    """A kept-alive connection to `port` that instance `pid` serves (the kernel spreads new connections between
    the instances sharing the port: connect until one is its)."""
    for _ in range(400):
        c = RawConn(port)
        c.send(request("GET", probe))
        assert c.read_response().status in (200, 401), probe
        if owner(c, port, pids) == pid:
            return c
        c.close()
    raise AssertionError(f"no connection to {port} reached pid {pid}")


def admin(c: RawConn, method: str, path: str, body: dict | None = None):
    c.send(request(method, path, body, AUTH))
    return c.read_response(method)


def chat_status(port: int, pid: int, pids: tuple[int, ...], key: str) -> int:
    """A chat completion with `key` on instance `pid` (a connection of its own each time)."""
    with conn_to(port, pid, pids, "/health") as c:
        c.send(request("POST", "/v1/chat/completions",
                       {"model": "mock-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                       {"authorization": f"Bearer {key}"}))
        return c.read_response("POST").status


def file_ids(path) -> set[str]:
    return {k["id"] for k in json.loads(path.read_text())["keys"]}


def start_second(processes, old):
    """The restart's new instance: the old one's configuration, --reuse-port."""
    new = processes.start([binary("weir"), "--config", old.config_path, "--reuse-port"], old.port,
                          name="weir-new", env=ENV)
    wait_until(lambda: "listening on" in new.log() or not new.alive(), 10, message="the new instance's start-up")
    assert new.alive(), new.log()
    return new


def test_two_instances_sharing_the_keys_file_lose_no_change_and_a_revocation_holds_on_both(mock, weir, processes,
                                                                                          tmp_path):
    # The new instance read the file at start and never again: keys the old one created after that were
    # unknown to it (a DELETE there: 404), its next write dropped them from the file, and a revocation on one
    # instance left the key working on the other.
    m = mock()
    aport = free_port()
    keys_file = tmp_path / "keys.json"
    a = weir(config=config(m, aport, keys_file), workers=1, env=ENV)
    with httpx.Client(base_url=f"http://127.0.0.1:{aport}", headers=AUTH, timeout=10) as alone:
        k0 = alone.post("/admin/v1/keys", json={"tenant": "acme", "name": "before"}).json()  # only A runs
    b = start_second(processes, a)
    pids = (a.process.pid, b.pid)
    ca = conn_to(aport, a.process.pid, pids, "/ready")
    cb = conn_to(aport, b.pid, pids, "/ready")

    r = admin(ca, "POST", "/admin/v1/keys", {"tenant": "acme", "name": "on-a"})
    assert r.status == 201, r.body
    k1 = r.json()
    r = admin(cb, "POST", "/admin/v1/keys", {"tenant": "acme", "name": "on-b"})
    assert r.status == 201, r.body
    k2 = r.json()
    assert file_ids(keys_file) == {k0["id"], k1["id"], k2["id"]}  # B's write kept A's key

    # Created on A, revoked on B; created before both, revoked on A.
    r = admin(cb, "DELETE", f"/admin/v1/keys/{k1['id']}")
    assert r.status == 200, r.body
    assert r.json() == {"object": "key", "id": k1["id"], "deleted": True}
    r = admin(ca, "DELETE", f"/admin/v1/keys/{k0['id']}")
    assert r.status == 200, r.body
    # A rename on B keeps the key's limits: it is read again on A, not made anew.
    r = admin(cb, "PATCH", f"/admin/v1/keys/{k2['id']}", {"name": "renamed-on-b"})
    assert r.status == 200, r.body
    assert file_ids(keys_file) == {k2["id"]}

    # In force on the instance that made the change before its answer; on the other within about a second.
    assert chat_status(a.port, b.pid, pids, k1["key"]) == 401
    assert chat_status(a.port, a.process.pid, pids, k0["key"]) == 401
    for pid in pids:
        wait_until(lambda: chat_status(a.port, pid, pids, k1["key"]) == 401, 5, message=f"k1 revoked on {pid}")
        wait_until(lambda: chat_status(a.port, pid, pids, k0["key"]) == 401, 5, message=f"k0 revoked on {pid}")
        assert chat_status(a.port, pid, pids, k2["key"]) == 200
    for c in (ca, cb):  # (the rename, B's last write, reaches A within about a second)
        wait_until(lambda: [(k["id"], k["name"]) for k in admin(c, "GET", "/admin/v1/keys").json()["data"]]
                   == [(k2["id"], "renamed-on-b")], 5, interval=0.05, message="the keys listed")

    # A revocation the other instance made is no longer there to revoke.
    r = admin(ca, "DELETE", f"/admin/v1/keys/{k1['id']}")
    assert r.status == 404, r.body
    ca.close()
    cb.close()

    # The old instance goes; what both did stays with the new one (a user's view: the OpenAI SDK).
    os.kill(a.process.pid, signal.SIGTERM)
    assert a.process.popen.wait(30) == 0
    ok = openai.OpenAI(base_url=a.v1, api_key=k2["key"], max_retries=0, timeout=30)
    assert ok.chat.completions.create(model="mock-model", max_tokens=2,
                                      messages=[{"role": "user", "content": "hi"}]).choices
    for gone in (k0, k1):
        client = openai.OpenAI(base_url=a.v1, api_key=gone["key"], max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="mock-model", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
    assert file_ids(keys_file) == {k2["id"]}


def test_a_write_on_a_connection_kept_alive_to_the_instance_that_handed_over_is_refused_not_lost(
        mock, weir, processes, tmp_path):
    # After the old instance closed its admin listener ("takes it over"), a DELETE on a connection still
    # open to it was answered 200 there, and the key kept working on the new instance.
    m = mock()
    aport = free_port()
    keys_file = tmp_path / "keys.json"
    a = weir(config=config(m, aport, keys_file), workers=1, env=ENV)
    writer = RawConn(aport)  # opened while A alone listens: A's
    reader = RawConn(aport)
    r = admin(writer, "POST", "/admin/v1/keys", {"tenant": "acme"})
    assert r.status == 201, r.body
    k = r.json()
    assert admin(reader, "GET", "/admin/v1/keys").status == 200
    # A stream keeps the old instance draining.
    stream = RawConn(a.port, timeout=30)
    stream.send(request("POST", "/v1/chat/completions",
                        {"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "stream": True,
                         "max_tokens": 400},
                        {"x-mock-itl-ms": "50", "authorization": f"Bearer {k['key']}"}))
    assert stream.read_head().status == 200
    b = start_second(processes, a)
    os.kill(a.process.pid, signal.SIGTERM)
    wait_until(lambda: "admin API closed" in a.process.log(), 5, message="the old instance's admin hand-over")
    assert a.process.alive()

    r = admin(writer, "DELETE", f"/admin/v1/keys/{k['id']}")
    err = assert_openai_error(r, 503, "service_unavailable")
    assert "handing over" in err["message"] and "retry" in err["message"], err
    assert (r.header("connection") or "").lower() == "close", r.headers
    assert writer.closed_by_peer()
    assert file_ids(keys_file) == {k["id"]}  # not applied
    # Reads are still answered there (and that connection ends too).
    r = admin(reader, "GET", f"/admin/v1/keys/{k['id']}")
    assert r.status == 200, r.body
    assert (r.header("connection") or "").lower() == "close", r.headers

    # Retried: a new connection reaches the new instance, where the key is revoked before the answer.
    with httpx.Client(base_url=f"http://127.0.0.1:{aport}", headers=AUTH, timeout=10) as retry:
        r = retry.delete(f"/admin/v1/keys/{k['id']}")
        assert r.status_code == 200, r.text
    assert chat_status(a.port, b.pid, (b.pid,), k["key"]) == 401
    assert file_ids(keys_file) == set()
    stream.close()
