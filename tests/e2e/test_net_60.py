"""Networking edges (stop 60): name resolution off the control thread, failover past an address that does
not answer, upstream timeouts that start once the request is written, and listen-address checks.

Slow DNS and names with several addresses come from an LD_PRELOAD shim of getaddrinfo(3)
(tests/e2e/gai_shim.c, compiled here): Weir links glibc dynamically, so its resolver is the shim's,
with no DNS server, root or /etc/hosts change. An address that does not answer a connect is a
listener on [::1]:PORT whose backlog is full: its SYNs are dropped, as a host that is down drops them."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest

from conftest import binary, free_port, to_yaml, wait_until

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")
MSG = [{"role": "user", "content": "hello"}]
TOKEN = "admin-net60-token-0123456789"
HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> pathlib.Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler for the getaddrinfo shim: run scripts/setup", pytrace=False)
    out = tmp_path_factory.mktemp("gai") / "gai_shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(HERE / "gai_shim.c"), "-ldl"], check=True)
    return out


def shim_env(shim: pathlib.Path, log: pathlib.Path, names: dict[str, tuple[int, str]]) -> dict[str, str]:
    """`names`: name -> (delay in ms, "addr,addr")."""
    return {"LD_PRELOAD": str(shim), "WEIR_GAI_SHIM_LOG": str(log),
            "WEIR_GAI_SHIM": ";".join(f"{n}={ms}={addrs}" for n, (ms, addrs) in names.items())}


def asked(log: pathlib.Path) -> list[str]:
    try:
        return log.read_text().split()
    except FileNotFoundError:
        return []


def write(w, cfg: dict) -> None:
    full = json.loads(json.dumps(cfg))
    full.setdefault("listen", f"127.0.0.1:{w.port}")
    full.setdefault("workers", 1)
    full.setdefault("server", {}).setdefault("access_log", str(w.access_log_path))
    tmp = w.config_path.with_suffix(".next")
    tmp.write_text(to_yaml(full) + "\n")
    os.replace(tmp, w.config_path)


def exits_within(proc, timeout: float) -> int:
    wait_until(lambda: not proc.alive(), timeout, interval=0.02, message="weir's exit")
    return proc.popen.returncode


def pool_cfg(endpoints, admin_port: int | None = None, **pool) -> dict:
    cfg = {"server": {"drain_timeout": "5s"},
           "pools": {"p": {"endpoints": endpoints, **pool}},
           "models": {"m": {"pool": "p", "upstream_model": "mock-model"}}}
    if admin_port:
        cfg["admin"] = {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_ADMIN_TOKEN"}
    return cfg


def chat(w, timeout: float = 20) -> int:
    return httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG}, timeout=timeout).status_code


# --- R1: name resolution never blocks the control thread ---------------------------------------------------


def test_sigterm_during_a_reload_whose_names_resolve_slowly_drains_at_once(mock, weir, shim, tmp_path):
    m = mock(*FAST)
    names = [f"slow{i}.weir.test" for i in range(3)]
    log = tmp_path / "gai.log"
    ap = free_port()
    base = pool_cfg([m.base_url], ap)
    w = weir(config=base, workers=1,
             env={**shim_env(shim, log, {n: (60_000, "127.0.0.1") for n in names}), "WEIR_ADMIN_TOKEN": TOKEN})
    assert chat(w) == 200
    write(w, pool_cfg([f"http://{n}:{m.process.port}" for n in names], ap))
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: asked(log), 10, message="the reload resolving its names")
    # The control thread still answers: the admin API (on it) and signals.
    # (A control thread held by the names would answer after a minute: 20 s tells that on any machine.)
    assert httpx.get(f"http://127.0.0.1:{ap}/ready", timeout=20).status_code == 200
    os.kill(w.process.pid, signal.SIGTERM)
    # The drain begins at once: /ready says so, and with nothing in flight the process ends, well before
    # the names would have answered (a minute each).
    assert exits_within(w.process, 15) == 0
    out = w.process.log()
    assert "SIGHUP: configuration reload abandoned (draining); still serving generation 1" in out, out[-2000:]


def test_a_reload_resolves_its_names_while_the_admin_api_answers_then_applies(mock, weir, shim, tmp_path):
    m = mock(*FAST)
    names = [f"n{i}.weir.test" for i in range(3)]
    log = tmp_path / "gai.log"
    ap = free_port()
    w = weir(config=pool_cfg([m.base_url], ap), workers=1,
             env={**shim_env(shim, log, {n: (4_000, "127.0.0.1") for n in names}), "WEIR_ADMIN_TOKEN": TOKEN})
    before = w.metric("weir_config_reloads_total", result="success")
    write(w, pool_cfg([f"http://{n}:{m.process.port}" for n in names], ap))
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: asked(log), 10, message="the reload resolving its names")
    assert httpx.get(f"http://127.0.0.1:{ap}/ready", timeout=2).status_code == 200
    # A second SIGHUP meanwhile reads the file again once the first reload is done.
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: "a reload is under way (resolving endpoint names)" in w.process.log(), 5,
               message="the line that says a reload is under way")
    wait_until(lambda: w.metric("weir_config_reloads_total", result="success") >= before + 2, 30,
               message="both reloads applied")
    assert chat(w) == 200
    assert w.process.alive()


def test_sigterm_while_start_up_resolves_slow_names_ends_the_process(mock, shim, tmp_path):
    m = mock(*FAST)
    log = tmp_path / "gai.log"
    port = free_port()
    cfg = pool_cfg([f"http://start.weir.test:{m.process.port}"])
    cfg.update(listen=f"127.0.0.1:{port}", workers=1)
    cfg["server"]["access_log"] = str(tmp_path / "access.log")
    path = tmp_path / "weir.yaml"
    path.write_text(to_yaml(cfg) + "\n")
    out = tmp_path / "weir.out"
    with open(out, "wb") as f:
        p = subprocess.Popen([str(binary("weir")), "--config", str(path)], stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ, **shim_env(shim, log, {"start.weir.test": (60_000, "127.0.0.1")})})
    try:
        wait_until(lambda: asked(log), 10, message="start-up resolving its names")
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
        assert "SIGTERM received while resolving the endpoints' names at start-up: stopped" in out.read_text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def test_check_resolves_names_in_parallel_and_names_the_one_that_fails(mock, shim, tmp_path):
    m = mock(*FAST)
    log = tmp_path / "gai.log"
    cfg = pool_cfg([f"http://ok{i}.weir.test:{m.process.port}" for i in range(2)] +
                   [f"http://gone.weir.test:{m.process.port}"])
    cfg.update(listen=f"127.0.0.1:{free_port()}")
    path = tmp_path / "weir.yaml"
    path.write_text(to_yaml(cfg) + "\n")
    env = {**os.environ, **shim_env(shim, log, {"ok0.weir.test": (0, "127.0.0.1"), "ok1.weir.test": (0, "127.0.0.1"),
                                                 "gone.weir.test": (0, "")})}
    r = subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.returncode == 2, r
    assert "pools.p.endpoints[2]: cannot resolve http://gone.weir.test" in r.stderr, r.stderr


# --- R2: an address that does not answer a connect is failed over ------------------------------------------


@pytest.fixture
def dead_v6(request):
    """A listener on [::1]:port whose backlog is full: connects to it time out (SYNs dropped)."""
    socks = []

    def make(port: int) -> None:
        bh = socket.socket(socket.AF_INET6)
        bh.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bh.bind(("::1", port))
        bh.listen(0)
        socks.append(bh)
        for _ in range(4):
            c = socket.socket(socket.AF_INET6)
            c.setblocking(False)
            c.connect_ex(("::1", port))
            socks.append(c)
        probe = socket.socket(socket.AF_INET6)
        probe.settimeout(0.5)
        try:
            probe.connect(("::1", port))
            pytest.fail("[::1] still accepts with its backlog full: this kernel does not drop the SYNs")
        except (TimeoutError, socket.timeout):
            pass
        finally:
            probe.close()

    yield make
    for s in socks:
        s.close()


def test_a_connect_timeout_on_the_first_address_moves_to_the_next(mock, weir, shim, tmp_path, dead_v6):
    m = mock(*FAST)
    dead_v6(m.process.port)
    env = shim_env(shim, tmp_path / "gai.log", {"dual.weir.test": (0, "::1,127.0.0.1")})
    w = weir(config=pool_cfg([f"http://dual.weir.test:{m.process.port}"], timeouts={"connect": "2s"}),
             workers=1, env=env)
    assert chat(w) == 200  # ::1 within its share of the 2 s, then 127.0.0.1
    assert chat(w) == 200  # 127.0.0.1 at once: the address that answered is kept


class SlowHandshakeRelay:
    """TLS on 0.0.0.0:port (every loopback address) whose handshakes each start `delay` s after the accept (a
    hosted API over a long link), relaying to a plain server on 127.0.0.1:upstream_port."""

    def __init__(self, issued, upstream_port: int, delay: float):
        import ssl
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(issued.cert, issued.key)
        self.upstream_port, self.delay = upstream_port, delay
        self.handshakes = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c: socket.socket):
        try:
            time.sleep(self.delay)
            s = self.ctx.wrap_socket(c, server_side=True)
            self.handshakes += 1
            up = socket.create_connection(("127.0.0.1", self.upstream_port), 5)

            def pipe(a, b):
                try:
                    while data := a.recv(65536):
                        b.sendall(data)
                except OSError:
                    pass
                finally:
                    try:
                        b.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass

            threading.Thread(target=pipe, args=(up, s), daemon=True).start()
            pipe(s, up)
        except OSError:
            c.close()


# regress60: the connect timeout's share per address covered an https:// endpoint's TLS handshake too, so a
# healthy address whose handshake took longer than its share (0.7 s of a 2 s timeout split four ways) was cut
# off mid-handshake, and so was every address after it: 504. The handshake has what is left of the whole
# timeout, and each address's TCP connect at least 1 s of it while that much is left.
def test_a_slow_tls_handshake_at_a_name_with_several_addresses_is_not_cut_to_a_share(mock, weir, shim, tmp_path):
    from test_tls_upstreams import CA
    m = mock(*FAST)
    ca = CA(tmp_path, "net60")
    relay = SlowHandshakeRelay(ca.issue("server", dns=["multi.weir.test"]), m.process.port, 0.7)
    try:
        env = shim_env(shim, tmp_path / "gai.log",
                       {"multi.weir.test": (0, "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4")})
        w = weir(config=pool_cfg([f"https://multi.weir.test:{relay.port}"], timeouts={"connect": "2s"},
                                 tls={"ca_file": str(ca.pem)}), workers=1, env=env)
        assert chat(w) == 200
        assert relay.handshakes == 1
    finally:
        relay.sock.close()


class HealthCounter:
    """A plain HTTP server on 127.0.0.1:port that counts GET /health (200, Connection: close)."""

    def __init__(self, port: int):
        self.count = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.settimeout(2)
                try:
                    data = c.recv(4096)
                    if data.startswith(b"GET /health"):
                        self.count += 1
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass


def test_health_probes_fail_over_past_an_address_that_does_not_answer(weir, shim, tmp_path, dead_v6):
    port = free_port()
    up = HealthCounter(port)
    try:
        dead_v6(port)
        env = shim_env(shim, tmp_path / "gai.log", {"dual.weir.test": (0, "::1,127.0.0.1")})
        w = weir(config=pool_cfg([f"http://dual.weir.test:{port}"],
                                 health={"path": "/health", "interval": "200ms", "timeout": "2s",
                                         "unhealthy_after": 1}), workers=1, env=env)
        wait_until(lambda: up.count >= 3, 15, message="three probes reaching 127.0.0.1")
        ejected = [v for n, labels, v in w.metrics() if n == "weir_upstream_ejections_total" and
                   labels.get("cause") == "probe"]
        assert sum(ejected) == 0
    finally:
        up.sock.close()


# --- R3: first_byte / response count from the request written whole -----------------------------------------


class SlowReader:
    """An upstream that takes the request body slowly (`chunk` bytes every `pause` s) for `slow_for` s, then the
    rest at once, then answers a chat completion; or, with `stall`, never reads the body at all."""

    def __init__(self, chunk: int = 128 * 1024, pause: float = 0.05, stall: bool = False, slow_for: float = 2.5):
        self.chunk, self.pause, self.stall, self.slow_for = chunk, pause, stall, slow_for
        self.read = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        with c:
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
            head, rest = buf.split(b"\r\n\r\n", 1)
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            self.read = len(rest)
            if self.stall:
                time.sleep(30)
                return
            # Slowly for `slow_for` s (past the head's timeout, while Weir is still writing: more of the body is
            # left than the kernel's socket buffers hold), then the rest at once.
            slow_until = time.monotonic() + self.slow_for
            while self.read < length:
                slow = time.monotonic() < slow_until
                d = c.recv(min(self.chunk if slow else 1 << 20, length - self.read))
                if not d:
                    return
                self.read += len(d)
                if slow:
                    time.sleep(self.pause)
            body = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "mock-model",
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                            "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                      + body)


def big_body(size: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "x" * size}]}


def test_a_slow_upload_does_not_eat_into_the_response_timeout(weir):
    up = SlowReader()
    try:
        # 2.5 s at 128 KiB per 50 ms (~6 MiB) and 10 MiB left then: Weir is still writing past the 1 s response
        # timeout, which starts once the body is written.
        size = 16 * 1024 * 1024
        w = weir(config={"server": {"max_body": "32MiB"},
                         "pools": {"p": {"endpoints": [f"http://127.0.0.1:{up.port}"],
                                         "timeouts": {"first_byte": "1s", "response": "1s", "idle": "5s"}}},
                         "models": {"m": {"pool": "p", "upstream_model": "mock-model"}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", json=big_body(size), timeout=60)
        assert r.status_code == 200, r.text[:500]
        assert r.json()["choices"][0]["message"]["content"] == "ok"
    finally:
        up.sock.close()


def test_an_upload_the_upstream_stops_taking_times_out(weir):
    up = SlowReader(stall=True)
    try:
        w = weir(config={"server": {"max_body": "16MiB"},
                         "pools": {"p": {"endpoints": [f"http://127.0.0.1:{up.port}"],
                                         "timeouts": {"first_byte": "30s", "response": "30s", "idle": "1s"}}},
                         "models": {"m": {"pool": "p", "upstream_model": "mock-model"}}}, workers=1)
        r = httpx.post(w.v1 + "/chat/completions", json=big_body(8 * 1024 * 1024), timeout=60)
        assert r.status_code == 504, r.text[:500]
        assert r.json()["error"]["code"] == "upstream_timeout"
    finally:
        up.sock.close()


# --- R5: listen addresses ----------------------------------------------------------------------------------


def check(tmp_path, cfg: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "weir.yaml"
    path.write_text(to_yaml(cfg) + "\n")
    return subprocess.run([str(binary("weir")), "--config", str(path), "--check"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "WEIR_ADMIN_TOKEN": TOKEN})


def test_an_admin_listener_on_the_ipv4_mapped_client_address_is_refused(tmp_path):
    port = free_port()
    cfg = pool_cfg(["http://127.0.0.1:9"])
    cfg.update(listen=f"127.0.0.1:{port}",
               admin={"listen": f"[::ffff:127.0.0.1]:{port}", "token_env": "WEIR_ADMIN_TOKEN"})
    r = check(tmp_path, cfg)
    assert r.returncode == 2, r
    assert "admin.listen: [::ffff:127.0.0.1]:%d binds" % port in r.stderr, r.stderr
    assert "the admin API has its own port" in r.stderr


def test_an_ipv6_listen_address_without_brackets_is_refused(tmp_path):
    cfg = pool_cfg(["http://127.0.0.1:9"])
    cfg.update(listen=f"::1:{free_port()}")
    r = check(tmp_path, cfg)
    assert r.returncode == 2, r
    assert "is ambiguous: write an IPv6 address in brackets, [ipv6]:port" in r.stderr, r.stderr


def test_start_up_shows_an_ipv6_listen_address_in_brackets(mock, tmp_path):
    m = mock(*FAST)
    port = free_port()
    cfg = pool_cfg([m.base_url])
    cfg.update(listen=f"[::1]:{port}", workers=1)
    cfg["server"]["access_log"] = str(tmp_path / "access.log")
    path = tmp_path / "weir.yaml"
    path.write_text(to_yaml(cfg) + "\n")
    out = tmp_path / "weir.out"
    with open(out, "wb") as f:
        p = subprocess.Popen([str(binary("weir")), "--config", str(path)], stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: "weir: listening on" in out.read_text() or p.poll() is not None, 10,
                   message="the start-up line")
        assert f"weir: listening on [::1]:{port} with" in out.read_text(), out.read_text()
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
