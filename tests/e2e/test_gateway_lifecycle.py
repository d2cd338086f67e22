"""Configuration errors and --check; drain on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import REPO, binary, free_port, wait_until
from httpwire import RawConn, request

GOOD = """\
listen: 127.0.0.1:{port}
pools:
  p:
    endpoints: [http://127.0.0.1:9]
    timeouts:
      connect: 1s
      first_byte: 2s
models:
  m: {{pool: p, aliases: [mm]}}
"""

# (name, yaml, line, key): the error must name the file, this line and this key.
BAD = [
    ("unknown-key", GOOD.replace("      first_byte: 2s", "      frist_byte: 2s"), 7, "frist_byte"),
    ("bad-duration", GOOD.replace("first_byte: 2s", "first_byte: soon"), 7, "pools.p.timeouts.first_byte"),
    ("unknown-pool", GOOD.replace("{{pool: p,", "{{pool: q,"), 9, "models.m.pool"),
    ("bad-endpoint", GOOD.replace("[http://127.0.0.1:9]", "[ftp://127.0.0.1:9]"), 4, "pools.p.endpoints[0]"),
    ("duplicate-alias", GOOD.replace("aliases: [mm]", "aliases: [m]"), 9, "models.m.aliases[0]"),
    ("small-buffer", GOOD + "server:\n  max_stream_buffer: 1KiB\n", 11, "server.max_stream_buffer"),
    ("bad-workers", GOOD + "workers: many\n", 10, "workers"),
    ("unknown-top-level", GOOD + "poolz: []\n", 10, "poolz"),
    ("yaml-syntax", GOOD.replace("[http://127.0.0.1:9]", "[http://127.0.0.1:9"), 5, None),
    # Resolved by --check as by start-up (one resolver, one message, exit 2).
    ("unresolvable", GOOD.replace("http://127.0.0.1:9", "http://no-such-host.invalid:9"), 4, "pools.p.endpoints[0]"),
    # A key set in a file is read at load, as a CA file is: else every JWT got 503 for as long as Weir ran.
    ("jwks-file-missing", GOOD + "auth:\n  jwt:\n    jwks_file: /nonexistent/jwks.json\n", 12, "auth.jwt.jwks_file"),
    ("jwks-file-not-a-key-set", GOOD + "auth:\n  jwt:\n    jwks_file: /etc/passwd\n", 12, "auth.jwt.jwks_file"),
    ("jwks-file-a-directory", GOOD + "auth:\n  jwt:\n    jwks_file: /etc\n", 12, "auth.jwt.jwks_file"),
]


def weir_run(*args, timeout=10) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("weir")), *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name,text,line,key", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_bad_config_names_file_line_and_key(tmp_path, name, text, line, key, check):
    path = tmp_path / f"{name}.yaml"
    port = free_port()
    path.write_text(text.format(port=port))
    r = weir_run("--config", path, *(["--check"] if check else []))
    assert r.returncode == 2, r.stderr  # a configuration error, as supervisors read it
    err = r.stderr
    assert err.startswith("weir: configuration error: "), err
    assert str(path) in err, err
    assert f":{line}:" in err, err
    if key:
        assert key in err, err
    # it never listened
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.yaml"
    r = weir_run("--config", path)
    assert r.returncode != 0 and str(path) in r.stderr


def test_check_accepts_good_configs(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD.format(port=free_port()))
    r = weir_run("--config", path, "--check")
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout and str(path) in r.stdout
    example = REPO / "config" / "weir.example.yaml"
    r = weir_run("--config", example, "--check")
    assert r.returncode == 0, r.stderr


def test_bad_quick_mode_flags():
    r = weir_run("--listen", "127.0.0.1:1", "--upstream", "ftp://example.com")
    assert r.returncode != 0 and "--upstream" in r.stderr
    r = weir_run("--listen", "nonsense", "--upstream", "http://127.0.0.1:9")
    assert r.returncode != 0 and "--listen" in r.stderr
    r = weir_run()
    assert r.returncode != 0


# --- drain -------------------------------------------------------------------------

def refused(port) -> bool:
    """True if a new connection is refused (or reset: it raced a listener being closed)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True


def start_stream(w, tokens: int, itl_ms: int, request_id: str) -> RawConn:
    conn = RawConn(w.port, timeout=20)
    conn.send(request("POST", "/v1/chat/completions",
                      {"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "stream": True,
                       "max_tokens": tokens},
                      {"x-mock-itl-ms": str(itl_ms), "x-request-id": request_id}))
    assert conn.read_head().status == 200
    return conn


def drain_config(m, drain_timeout):
    return {"server": {"drain_timeout": drain_timeout}, "pools": {"p": {"endpoints": [m.base_url]}},
            "models": {"mock-model": {"pool": "p"}}}


def test_sigterm_drains_in_flight_stream(mock, weir):
    m = mock("--ttft-ms", "1", "--max-tokens", "1000")
    w = weir(config=drain_config(m, "30s"))
    stream = start_stream(w, tokens=50, itl_ms=20, request_id="draining-stream")
    chunks = stream.iter_chunks()
    first = next(chunks)
    idle = RawConn(w.port)  # a keep-alive connection between requests
    idle.send(request("GET", "/health"))
    assert idle.read_response("GET").status == 200

    os.kill(w.process.pid, signal.SIGTERM)
    wait_until(lambda: refused(w.port), 5, interval=0.01, message="new connections refused")
    assert w.process.alive()
    assert idle.closed_by_peer(5), "an idle keep-alive connection is closed on drain"

    body = first + b"".join(chunks)  # the stream runs to its end
    events = [e for e in body.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert sum(1 for e in events if '"content":" ' in e) == 50
    assert w.process.popen.wait(10) == 0
    entry = w.log_for("draining-stream")
    assert entry["status"] == 200 and entry["events"] == len(events)
    assert m.aborts() == 0


def test_drain_deadline_closes_long_streams(mock, weir):
    m = mock("--ttft-ms", "1", "--max-tokens", "1000")
    w = weir(config=drain_config(m, "300ms"))
    stream = start_stream(w, tokens=1000, itl_ms=20, request_id="too-long")
    next(stream.iter_chunks())
    t0 = time.monotonic()
    os.kill(w.process.pid, signal.SIGTERM)
    assert w.process.popen.wait(10) == 0
    assert time.monotonic() - t0 < 5
    rest = stream.read_to_eof()
    # The stream ends in-band, as any failure after the head does: Weir's
    # error, then [DONE] and the last chunk, not a bare close.
    err = rest.rfind(b'"code":"drain_timeout"')
    assert err >= 0 and rest.find(b"data: [DONE]\n\n", err) > err
    assert rest.endswith(b"\r\n0\r\n\r\n")
    wait_until(lambda: m.aborts() == 1, 5, message="the upstream request aborted at the drain deadline")
    entry = w.log_for("too-long")
    # Weir cut it, not the client: the head that went out, and the reason.
    assert entry["status"] == 200
    assert entry["error"]["code"] == "drain_timeout" and entry["error"]["source"] == "internal"


def test_second_sigterm_stops_at_once(mock, weir):
    m = mock("--ttft-ms", "1", "--max-tokens", "1000")
    w = weir(config=drain_config(m, "60s"))
    stream = start_stream(w, tokens=1000, itl_ms=20, request_id="stopped")
    next(stream.iter_chunks())
    os.kill(w.process.pid, signal.SIGTERM)
    wait_until(lambda: refused(w.port), 5, interval=0.01, message="new connections refused")
    os.kill(w.process.pid, signal.SIGTERM)
    assert w.process.popen.wait(5) == 0
    stream.read_to_eof()
    stream.close()


# --- SIGHUP: reopen the access log (log rotation), otherwise ignored ------------------

def hup(w, count: int) -> None:
    """Sends SIGHUP and waits for Weir's stderr line about it (the ``count``-th one)."""
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: w.process.log().count("SIGHUP") >= count or not w.process.alive(), 5,
               message=f"weir's line about SIGHUP number {count}")
    assert w.process.alive(), f"SIGHUP killed weir (status {w.process.popen.returncode})"


def test_sighup_reopens_the_access_log_for_rotation(mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(upstream=m)
    c = w.client()
    c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}],
                              extra_headers={"x-request-id": "before-rotation"})
    w.log_for("before-rotation")
    rotated = w.access_log_path.with_name(w.access_log_path.name + ".1")
    w.access_log_path.rename(rotated)  # logrotate: mv access.log access.log.1; kill -HUP
    hup(w, 1)
    wait_until(w.access_log_path.exists, 5, message="a new access log file")
    c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}],
                              extra_headers={"x-request-id": "after-rotation"})
    assert w.log_for("after-rotation")["status"] == 200  # in the new file
    assert "before-rotation" not in w.access_log_path.read_text()
    old = rotated.read_text()
    assert "before-rotation" in old and "after-rotation" not in old
    hup(w, 2)  # again, with nothing renamed: same file, nothing lost
    c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}],
                              extra_headers={"x-request-id": "after-second-hup"})
    w.log_for("after-second-hup")
    assert w.log_for("after-rotation")
    assert w.process.alive()


@pytest.mark.parametrize("access_log", ["-", "off"])
def test_sighup_is_ignored_without_an_access_log_file(mock, weir, access_log):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(config={"server": {"access_log": access_log}, "pools": {"p": {"endpoints": [m.base_url]}},
                     "models": {"mock-model": {"pool": "p"}}})
    for i in range(2):
        hup(w, i + 1)
    out = w.client().chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content
    assert w.process.alive()
    # SIGTERM still drains and exits 0.
    os.kill(w.process.pid, signal.SIGTERM)
    assert w.process.popen.wait(10) == 0


# --- one listener per address, unless the operator says otherwise -------------------

REFUSAL = "is already in use by another process"


def second_weir(argv, timeout=10) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = weir_run(*argv, timeout=timeout)
    return r, time.monotonic() - t0


def wait_listening(proc) -> None:
    """For a process that shares a port already accepting: wait for its start-up line."""
    wait_until(lambda: "listening on" in proc.log() or not proc.alive(), 10,
               message=f"{proc.name}'s start-up line")
    assert proc.alive(), proc.log()


def serves(w, n: int = 5) -> bool:
    for _ in range(n):
        with RawConn(w.port) as c:
            c.send(request("GET", "/health"))
            assert c.read_response().status == 200
    return True


def test_second_weir_on_the_same_address_refuses_to_start(mock, weir):
    m = mock()
    w = weir(upstream=m)
    r, took = second_weir(["--listen", f"127.0.0.1:{w.port}", "--upstream", m.base_url, "--access-log", "off"])
    assert r.returncode != 0, r.stderr
    assert f"127.0.0.1:{w.port} {REFUSAL}" in r.stderr and "--reuse-port" in r.stderr, r.stderr
    assert took < 5
    assert w.process.alive() and serves(w)


@pytest.mark.parametrize("how", ["flag", "yaml"])
def test_second_weir_shares_the_address_with_reuse_port(mock, weir, processes, tmp_path, how):
    m = mock()
    w = weir(upstream=m)
    if how == "flag":
        argv = [binary("weir"), "--listen", f"127.0.0.1:{w.port}", "--upstream", m.base_url,
                "--access-log", "off", "--reuse-port"]
    else:
        path = tmp_path / "second.yaml"
        path.write_text(f"listen: 127.0.0.1:{w.port}\nserver:\n  reuse_port: true\n  access_log: \"off\"\n"
                        f"pools:\n  p:\n    endpoints: [{m.base_url}]\nmodels:\n  mock-model: {{pool: p}}\n")
        argv = [binary("weir"), "--config", path]
    second = processes.start(argv, w.port, name="weir-second")
    wait_listening(second)
    assert w.process.alive() and serves(w)


def test_a_wildcard_listener_blocks_a_specific_address(weir, mock):
    """Another program on 0.0.0.0:P (even with SO_REUSEPORT, so the kernel would let Weir
    share it) owns 127.0.0.1:P too."""
    m = mock()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("0.0.0.0", 0))
        other.listen()
        port = other.getsockname()[1]
        r, took = second_weir(["--listen", f"127.0.0.1:{port}", "--upstream", m.base_url, "--access-log", "off"])
        assert r.returncode != 0 and f"127.0.0.1:{port} {REFUSAL}" in r.stderr, r.stderr
        assert took < 5


def time_wait_on(port: int) -> int:
    """Sockets in TIME_WAIT (state 06) whose local port is ``port`` (/proc/net/tcp)."""
    n = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "06":
            n += 1
    return n


def test_restart_on_the_same_port_is_not_blocked_by_time_wait(mock, weir):
    m = mock()
    w = weir(upstream=m)
    idle = [RawConn(w.port) for _ in range(3)]
    for c in idle:
        c.send(request("GET", "/health"))
        assert c.read_response().status == 200
    assert w.process.stop() == 0  # the drain closes the idle connections: Weir's side is in TIME_WAIT
    for c in idle:
        c.close()
    assert time_wait_on(w.port) >= 1
    again = weir(config={"listen": f"127.0.0.1:{w.port}", "pools": {"p": {"endpoints": [m.base_url]}},
                         "models": {"mock-model": {"pool": "p"}}})
    assert serves(again)


# --- at rest: an idle worker makes no system call --------------------------------------

def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of `pid` so far (each wait that ended)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def test_an_idle_gateway_rests_until_a_client_comes(mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    w = weir(config={"workers": 1, "pools": {"p": {"endpoints": [m.base_url], "idle_keepalive": "300ms"}},
                     "models": {"mock-model": {"pool": "p"}}})
    c = w.client()
    c.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}],
                              extra_headers={"x-request-id": "before-rest"})
    w.log_for("before-rest")
    # The client's connection closed, the pooled upstream one aged out (300 ms), the heap was
    # trimmed (1 s after the last session): then nothing is due, and the worker waits on nothing.
    c.close()
    deadline = time.monotonic() + 10
    while True:
        before = wakeups(w.process.pid)
        time.sleep(1.0)
        woke = wakeups(w.process.pid) - before
        if woke == 0 or time.monotonic() > deadline:
            break
    assert woke == 0, f"{woke} wake-ups in a second at rest"
    # A client wakes it: served, and its line written as promptly as ever.
    c2 = w.client()
    c2.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "x"}],
                               extra_headers={"x-request-id": "after-rest"})
    # (A flush timer left off at rest would write it never, or at exit: 10 s tells that from 50 ms on any machine.)
    assert w.log_for("after-rest", timeout=10)["status"] == 200
