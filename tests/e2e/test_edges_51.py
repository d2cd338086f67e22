"""Small edges (stop 51).

1. Host: with an explicit allow list (server.allowed_hosts, admin.allowed_hosts) an EMPTY Host, or none at all
   (HTTP/1.0), passed as if it were listed. A list names the hosts served: "" is none of them, so such a request
   now gets 421 host_not_allowed like any unlisted host (the defaults, which no list set, still answer it: no
   browser sends an empty Host or none). RFC 9112 §3.2's 400 for an HTTP/1.1 request without Host or any request
   with two Host fields was already right on both listeners; it is pinned here with a list configured too.
2. GET /v1/models with anthropic-version ignored Anthropic's List Models parameters (limit, after_id, before_id):
   the whole list, has_more false. It now answers the page asked for (default 20), bad values a 400 in
   Anthropic's shape; /v1/models/ (a trailing slash), a 404 in both shapes, now comes in Anthropic's with the
   header (it came in OpenAI's).
3. A SIGTERM in the first moments after exec killed weir: SIGINT and SIGTERM were blocked only once the command
   line was parsed. They are now blocked first of all in main(); --check gives them back before its load, so a
   Ctrl-C during a slow check ends it (it waited for the load to finish).
"""
from __future__ import annotations

import hashlib
import socket

import httpx
import pytest

from conftest import free_port, wait_until
from httpwire import RawConn, assert_openai_error

KEY = "sk-edges-51"
AUTH = {"authorization": f"Bearer {KEY}"}
ADMIN_TOKEN = "edges-51-admin-token-0123456789"


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def raw(port: int, request: bytes):
    with RawConn(port) as c:
        c.send(request)
        return c.read_response(request.split(b" ", 1)[0].decode())


# --- 1. Host ---------------------------------------------------------------------------------------


def host_stack(mock, weir, listed: bool):
    """Weir with both listeners: with `listed`, both allow lists name api.example only."""
    admin_port = free_port()
    admin = {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}
    cfg = {"pools": {"p": {"endpoints": [mock().base_url]}}, "default_pool": "p"}
    if listed:
        admin["allowed_hosts"] = ["api.example"]
        cfg["server"] = {"allowed_hosts": ["api.example"]}
    cfg["admin"] = admin
    w = weir(config=cfg, env={"WEIR_TEST_ADMIN_TOKEN": ADMIN_TOKEN})
    wait_until(lambda: listening(admin_port), 5, message="admin listener")
    return w.port, admin_port


def refused_421(r, listener: str) -> None:
    err = assert_openai_error(r, 421, "host_not_allowed")
    assert err["type"] == "invalid_request_error", err
    assert ("admin.allowed_hosts" if listener == "admin" else "server.allowed_hosts") in err["message"], err
    assert "without a host name" in err["message"], err


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_a_list_answers_an_empty_or_missing_host_421(mock, weir, listener):
    client_port, admin_port = host_stack(mock, weir, listed=True)
    port = client_port if listener == "client" else admin_port
    path = b"/health" if listener == "client" else b"/ready"
    # An empty Host (RFC 9112 §3.2 allows it when the target URI has no authority), on 1.1 and 1.0, with
    # or without whitespace; and none at all on 1.0.
    for req in (b"GET " + path + b" HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
                b"GET " + path + b" HTTP/1.1\r\nHost:   \r\nConnection: close\r\n\r\n",
                b"GET " + path + b" HTTP/1.0\r\nHost: \r\n\r\n",
                b"GET " + path + b" HTTP/1.0\r\n\r\n"):
        refused_421(raw(port, req), listener)
    # /metrics too (what a list protects), and on the client listener the API.
    refused_421(raw(port, b"GET /metrics HTTP/1.0\r\n\r\n"), listener)
    if listener == "client":
        refused_421(raw(port, b"GET /v1/models HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n"), listener)
    # The listed name still passes, on 1.0 as on 1.1.
    assert raw(port, b"GET " + path + b" HTTP/1.0\r\nHost: API.example:8080\r\n\r\n").status == 200
    assert raw(port, b"GET " + path + b" HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n").status == 200


@pytest.mark.parametrize("listener", ["client", "admin"])
def test_without_a_list_an_empty_or_missing_host_is_answered(mock, weir, listener):
    # The defaults (loopback: IP literals and localhost for /metrics and the admin listener) take a request
    # without a name: only a browser's request rebinds a name, and a browser always names one.
    client_port, admin_port = host_stack(mock, weir, listed=False)
    port = client_port if listener == "client" else admin_port
    for path in (b"/metrics", b"/ready"):
        assert raw(port, b"GET " + path + b" HTTP/1.0\r\n\r\n").status == 200
        assert raw(port, b"GET " + path + b" HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n").status == 200


@pytest.mark.parametrize("listed", [False, True], ids=["default", "listed"])
@pytest.mark.parametrize("listener", ["client", "admin"])
def test_rfc9112_host_count_is_400_before_the_host_check(mock, weir, listener, listed):
    # RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host, and for any request with two (1.0 included),
    # whether or not a list is configured (the malformed request is refused as such, not as a host).
    client_port, admin_port = host_stack(mock, weir, listed=listed)
    port = client_port if listener == "client" else admin_port
    for req in (b"GET /ready HTTP/1.1\r\nConnection: close\r\n\r\n",
                b"GET /ready HTTP/1.1\r\nHost: api.example\r\nHost: api.example\r\nConnection: close\r\n\r\n",
                b"GET /ready HTTP/1.1\r\nHost: api.example\r\nHost:\r\nConnection: close\r\n\r\n",
                b"GET /ready HTTP/1.0\r\nHost: api.example\r\nHost: api.example\r\n\r\n"):
        err = assert_openai_error(raw(port, req), 400)
        assert "Host" in err["message"], err


# --- 2. Anthropic's List Models: limit, after_id, before_id; the trailing slash ------------------------------

AV = {"anthropic-version": "2023-06-01"}
MODELS = [f"m{i:02}" for i in range(25)]


@pytest.fixture
def models_weir(mock, weir):
    m = mock("--any-model")
    return weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                        "models": {name: {"pool": "p"} for name in MODELS}})


def page(w, query: str = "", headers: dict | None = None) -> dict:
    r = httpx.get(w.base_url + "/v1/models" + query, headers={**AV, **(headers or {})}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"data", "has_more", "first_id", "last_id"}, body
    ids = [x["id"] for x in body["data"]]
    assert body["first_id"] == (ids[0] if ids else None) and body["last_id"] == (ids[-1] if ids else None), body
    return {"ids": ids, "has_more": body["has_more"]}


def test_anthropic_models_list_pages_by_limit_after_id_and_before_id(models_weir):
    w = models_weir
    # Anthropic's default page is 20 models.
    assert page(w) == {"ids": MODELS[:20], "has_more": True}
    assert page(w, "?after_id=m19") == {"ids": MODELS[20:], "has_more": False}
    assert page(w, "?limit=1000") == {"ids": MODELS, "has_more": False}
    assert page(w, "?limit=25") == {"ids": MODELS, "has_more": False}
    assert page(w, "?limit=3") == {"ids": MODELS[:3], "has_more": True}
    assert page(w, "?limit=3&after_id=m02") == {"ids": MODELS[3:6], "has_more": True}
    assert page(w, "?after_id=m21&limit=3") == {"ids": MODELS[22:], "has_more": False}
    assert page(w, "?limit=3&after_id=m24") == {"ids": [], "has_more": False}
    # before_id: the page right before it; has_more says whether models remain before the page.
    assert page(w, "?limit=3&before_id=m10") == {"ids": MODELS[7:10], "has_more": True}
    assert page(w, "?limit=3&before_id=m03") == {"ids": MODELS[:3], "has_more": False}
    assert page(w, "?limit=3&before_id=m01") == {"ids": MODELS[:1], "has_more": False}
    assert page(w, "?before_id=m00") == {"ids": [], "has_more": False}
    # Other parameters are no business of this API's; a value is percent-decoded.
    assert page(w, "?beta=true&limit=%32&after_id=m%30%30") == {"ids": MODELS[1:3], "has_more": True}


def test_the_anthropic_sdk_pages_through_the_whole_list(models_weir):
    import anthropic
    c = anthropic.Anthropic(base_url=models_weir.base_url, api_key="x", max_retries=0, timeout=30)
    first = c.models.list(limit=7)
    assert [m.id for m in first.data] == MODELS[:7] and first.has_more is True
    assert [m.id for m in c.models.list(limit=7)] == MODELS  # auto-paging: after_id = last_id while has_more
    back = c.models.list(limit=4, before_id="m10")
    assert [m.id for m in back.data] == MODELS[6:10] and back.has_more is True


@pytest.mark.parametrize("query,param", [
    ("?limit=0", "limit"), ("?limit=1001", "limit"), ("?limit=-1", "limit"), ("?limit=abc", "limit"),
    ("?limit=", "limit"), ("?limit=2.5", "limit"), ("?limit=+5", "limit"), ("?limit=99999999999999999999", "limit"),
    ("?limit=2&limit=3", "limit"), ("?after_id=", "after_id"), ("?before_id=", "before_id"),
    ("?after_id=m01&after_id=m02", "after_id"), ("?after_id=m01&before_id=m05", "before_id"),
    ("?after_id=nope", "after_id"), ("?before_id=nope", "before_id"), ("?after_id=%zz", "after_id"),
])
def test_a_bad_page_is_an_anthropic_400(models_weir, query, param):
    r = httpx.get(models_weir.base_url + "/v1/models" + query, headers=AV, timeout=10)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert param in body["error"]["message"], body


def test_openai_shaped_models_list_has_no_pages(models_weir):
    # OpenAI's GET /v1/models takes no parameters: the whole list, whatever the query says.
    r = httpx.get(models_weir.base_url + "/v1/models?limit=abc&after_id=nope", timeout=10)
    assert r.status_code == 200 and [x["id"] for x in r.json()["data"]] == MODELS, r.text


@pytest.mark.parametrize("path", ["/v1/models/", "/v1/models/m01/", "/v1/models//"])
def test_a_trailing_slash_is_404_in_the_clients_shape(models_weir, path):
    # Decided the same way for both shapes: a trailing slash is another path (as on every route, and vLLM's),
    # 404; its error is in the shape the client reads.
    r = httpx.get(models_weir.base_url + path, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    r = httpx.get(models_weir.base_url + path, headers=AV, timeout=10)
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error", body


def test_the_upstreams_list_pages_too(mock, weir):
    m = mock()
    w = weir(config={"default_pool": "p", "pools": {"p": {"endpoints": [m.base_url]}}})
    upstream = [x["id"] for x in httpx.get(m.v1 + "/models").json()["data"]]
    assert upstream
    assert page(w, "?limit=1") == {"ids": upstream[:1], "has_more": len(upstream) > 1}
    assert page(w, f"?after_id={upstream[0]}") == {"ids": upstream[1:21], "has_more": len(upstream) > 21}
    for query in ("?limit=0", "?after_id=nope"):
        r = httpx.get(w.base_url + "/v1/models" + query, headers=AV, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_a_cursor_the_tenant_may_not_use_names_no_model(mock, weir):
    m = mock("--any-model")
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {name: {"pool": "p"} for name in ("a", "b", "c")},
        "tenants": {"t": {"models": ["a", "c"]}},
        "auth": {"api_keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "t"}]},
    })
    assert page(w, "?limit=1", AUTH) == {"ids": ["a"], "has_more": True}
    assert page(w, "?after_id=a", AUTH) == {"ids": ["c"], "has_more": False}
    r = httpx.get(w.base_url + "/v1/models?after_id=b", headers={**AV, **AUTH}, timeout=10)
    assert r.status_code == 400 and "after_id" in r.json()["error"]["message"], r.text


# --- 3. SIGINT and SIGTERM held from the top of main() ---------------------------------------------------------

GDB_SCRIPT = """
import gdb, os, signal
gdb.execute("set pagination off")
gdb.execute("set startup-with-shell off")
gdb.execute("handle SIGTERM nostop noprint pass")
gdb.execute("break mallopt")
gdb.execute("run")
print("weir-test: at mallopt")
os.kill(gdb.selected_inferior().pid, signal.SIGTERM)
gdb.execute("delete")
gdb.execute("continue")
"""


def test_a_sigterm_before_the_command_line_is_read_drains(mock, tmp_path):
    # A SIGTERM in the first moments after exec killed weir: SIGINT and SIGTERM were blocked only once the
    # command line was parsed. Aimed with a debugger (the window is too short to hit reliably from here):
    # stopped in mallopt (main() bounds the allocator's retention at its top, before it reads its command
    # line; the old build before it blocked the signals), weir gets a SIGTERM and goes on. Held, it is
    # taken once the drain handler is in place: exit 0; taken at once, its default action kills the process.
    import shutil
    import subprocess
    from conftest import binary
    if shutil.which("gdb") is None:
        pytest.skip("needs gdb")
    script = tmp_path / "sigterm.py"
    script.write_text(GDB_SCRIPT)
    m = mock("--any-model")
    argv = ["gdb", "-nx", "-batch", "-x", str(script), "--args", str(binary("weir")), "--listen",
            f"127.0.0.1:{free_port()}", "--upstream", m.base_url, "-w", "1", "--access-log", "off"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    text = out.stdout + out.stderr
    if "weir-test: at mallopt" not in text:
        pytest.skip(f"gdb cannot run weir here (ptrace refused, or no mallopt symbol):\n{text[-2000:]}")
    assert "terminated with signal SIGTERM" not in text, text[-3000:]
    # The held signal is taken at the first point that looks for it: while start-up resolves the endpoints'
    # names (stop at once) or once the server runs (drain). Which one depends on how fast resolution ends.
    taken = "SIGTERM received, draining" in text or "SIGTERM received while resolving" in text
    assert taken and "exited normally" in text, text[-3000:]


# A hang-up (SIGHUP: the terminal closed) ends it as well: SIGHUP, SIGUSR1 and SIGUSR2 are ignored from the top
# of main() until a server's handler takes them, and given back as exec handed them down where none runs.
@pytest.mark.parametrize("sig", ["SIGINT", "SIGHUP"])
def test_ctrl_c_ends_a_slow_config_check(tmp_path, sig):
    # --check runs no server: a Ctrl-C while it loads (here a configuration read from a pipe whose writer
    # has not finished: `weir --check -c <(generator)`) ends it at once. It waited, blocked, for the load.
    import os
    import signal
    sig = getattr(signal, sig)
    import subprocess
    from conftest import binary
    fifo = tmp_path / "weir.yaml"
    os.mkfifo(fifo)
    wfd = os.open(fifo, os.O_RDWR)  # (the writer: weir's open does not wait, its read does)
    try:
        os.write(wfd, b"pools:\n")
        # Handed down with its default action, as a terminal's shell does: weir gives back what exec handed
        # down, and the tests may run where the signal is ignored (under nohup, SIGHUP; a background job, SIGINT).
        p = subprocess.Popen([str(binary("weir")), "--check", "-c", str(fifo)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
        try:
            # weir read what was written: it is in the load, past the command line, waiting for the rest.
            import fcntl
            import struct
            import termios

            def unread() -> int:
                return struct.unpack("i", fcntl.ioctl(wfd, termios.FIONREAD, b"\0\0\0\0"))[0]

            wait_until(lambda: unread() == 0, 10, message="weir reading the configuration")
            p.send_signal(sig)
            try:
                rc = p.wait(10)
            except subprocess.TimeoutExpired:
                rc = None
            assert rc == -sig, f"exit {rc} (None: the signal was held or ignored until the load ended)"
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    finally:
        os.close(wfd)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["--check", "-c", "/nonexistent.yaml"], ["--bogus"]])
def test_the_exits_without_a_server_are_unchanged(args):
    import subprocess
    from conftest import binary
    r = subprocess.run([str(binary("weir")), *args], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == {"--help": 0, "--version": 0}.get(args[0], 2), r.stdout + r.stderr
    if args[0] == "--version":
        assert r.stdout.startswith("weir "), r.stdout
