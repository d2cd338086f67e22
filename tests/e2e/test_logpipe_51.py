"""The access log and its readers: a pipe (stdout or a FIFO) whose reader stops reading costs dropped lines,
counted, never traffic or the drain; SIGUSR1 reopens the access log without a reload and SIGUSR2 is ignored
(both killed Weir at once); a reopen that fails is counted and retried until it opens."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import uuid

import httpx
import pytest

from conftest import Process, Weir, _wait_for_port, binary, free_port, to_yaml, wait_until

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")


def config(m, **server) -> dict:
    return {"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
            "server": {"drain_timeout": "2s", **server}}


_client = httpx.Client(timeout=15)  # (one client: a new one a request spends more time than the request)


def chat(w, tag: str) -> str:
    """One request (its answer must come, 200); returns its request id."""
    rid = f"{tag}-{uuid.uuid4().hex[:12]}"
    r = _client.post(w.v1 + "/chat/completions", headers={"x-request-id": rid},
                     json={"model": "m", "messages": [{"role": "user", "content": rid}]})
    assert r.status_code == 200, r.text
    return rid


def read_dry(fd: int) -> bytes:
    """What the pipe holds now (its read end is non-blocking)."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def spawn(processes, cfg: dict, argv=None, **popen_kw) -> tuple[Weir, subprocess.Popen]:
    """weir on a free port with `cfg`, started as `argv(config_path)` (default: weir --config PATH) with
    `popen_kw` (its stdout/stderr, a preexec_fn), once its port answers."""
    port = free_port()
    cfg = {**cfg, "listen": f"127.0.0.1:{port}"}
    path = processes.log_dir / f"weir-{port}.yaml"
    path.write_text(to_yaml(cfg) + "\n")
    args = argv(path) if argv else [str(binary("weir")), "--config", str(path)]
    popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True, **popen_kw)
    proc = Process(name="weir", argv=args, host="127.0.0.1", port=port, popen=popen,
                   log_path=processes.log_dir / f"weir-{port}.none")
    processes.started.append(proc)
    _wait_for_port(proc, 10)
    return Weir(proc, pathlib.Path(os.devnull), path), popen


def fill(writer: int) -> int:
    """Fills the pipe of `writer` to the byte, as a stalled reader leaves it, through a description of the
    test's own (so that Weir's descriptors keep the blocking mode they were given); returns it, to close."""
    topper = os.open(f"/proc/self/fd/{writer}", os.O_WRONLY | os.O_NONBLOCK)
    for size in (4096, 1):
        try:
            while True:
                os.write(topper, b"#" * size)
        except BlockingIOError:
            pass
    return topper


# --- 1. a reader that stops reading --------------------------------------------------------------------------------

def start_with_stdout(processes, cfg: dict, stdout: int) -> Weir:
    """weir with `server.access_log: "-"` and its stdout the descriptor `stdout`; stderr to a file."""
    port = free_port()
    cfg = {**cfg, "listen": f"127.0.0.1:{port}", "workers": 2}
    cfg["server"] = {**cfg["server"], "access_log": "-"}
    path = processes.log_dir / f"weir-{port}.yaml"
    path.write_text(to_yaml(cfg) + "\n")
    log_path = processes.log_dir / f"weir-{port}.stderr"
    argv = [str(binary("weir")), "--config", str(path)]
    with open(log_path, "wb") as err:
        popen = subprocess.Popen(argv, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
    proc = Process(name="weir", argv=argv, host="127.0.0.1", port=port, popen=popen, log_path=log_path)
    processes.started.append(proc)
    _wait_for_port(proc, 10)
    wait_until(lambda: "weir: listening on" in proc.log() or not proc.alive(), 10, message="weir's start-up line")
    return Weir(proc, pathlib.Path(os.devnull), path)


# Before: Weir's own messages (a signal's, a reload's, a store's) were blocking writes to stderr: with stderr the
# same stalled pipe (`weir 2>&1 | shipper`), SIGTERM's "draining" line blocked the control thread, so the drain
# never ran and the process outlived drain_timeout until the reader read again (a SIGHUP's or SIGUSR2's line
# did the same). Every such message now goes through one descriptor that does not wait (core/note.hpp).
@pytest.mark.parametrize("first", [None, "SIGHUP", "SIGUSR2"])
def test_a_stalled_stderr_pipe_holds_neither_a_signal_nor_the_drain(first, processes, mock):
    m = mock(*MOCK_FLAGS)
    reader, writer = os.pipe()
    topper = -1
    try:
        w, popen = spawn(processes, {**config(m, access_log="-"), "workers": 2}, stdout=writer, stderr=writer)
        chat(w, "before")
        topper = fill(writer)  # the shipper stalls
        chat(w, "stalled")
        if first:
            popen.send_signal(getattr(signal, first))
            chat(w, "after-" + first.lower())  # (its handler ran, or the control thread is stuck: the drain says)
        popen.send_signal(signal.SIGTERM)
        try:
            rc = popen.wait(8)  # drain_timeout 2s: well within
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, f"exit {rc} (None: still running 8 s after SIGTERM, drain_timeout 2s)"
    finally:
        if topper >= 0:
            os.close(topper)
        os.close(writer)
        os.close(reader)


@pytest.mark.parametrize("where", ["stdout", "fifo"])
def test_a_log_reader_that_stops_reading_stops_neither_traffic_nor_the_drain(where, tmp_path, processes, mock, weir):
    # Before: once the pipe's 64 KiB filled, a worker blocked in write(2) holding the sink's mutex: every
    # request hung (and /health), and SIGTERM's drain_timeout was not honoured, until the reader read again.
    m = mock(*MOCK_FLAGS)
    if where == "stdout":
        reader, writer = os.pipe()
        try:
            w = start_with_stdout(processes, config(m), writer)
        finally:
            os.close(writer)  # (Weir has its own)
        os.set_blocking(reader, False)
    else:
        fifo = tmp_path / "access.fifo"
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that reads nothing (yet)
        w = weir(config=config(m, access_log=str(fifo)), workers=2)
    try:
        # ~450 bytes a line: 500 lines are several times what the pipe holds (64 KiB).
        for i in range(500):
            chat(w, "stalled")
        assert httpx.get(w.base_url + "/health", timeout=15).status_code == 200
        wait_until(lambda: w.metric("weir_access_log_lines_lost_total") > 0, 10, message="lines counted lost")
        assert w.metric("weir_access_log_write_errors_total") > 0
        wait_until(lambda: "the reader is not keeping up" in w.process.log(), 10, message="the stderr note")

        # The reader reads again: new lines flow again, whole.
        read_dry(reader)
        after = [chat(w, "after") for _ in range(5)]
        got = b""

        def arrived() -> bool:
            nonlocal got
            got += read_dry(reader)
            return all(rid.encode() in got for rid in after)

        wait_until(arrived, 10, message="the lines written after the reader resumed")
        lines = got.decode().splitlines(keepends=True)
        assert all(line.endswith("\n") for line in lines)
        seen = [json.loads(line)["request_id"] for line in lines if "after-" in line]
        assert sorted(seen) == sorted(after)

        # It stops again; the drain still ends (server.drain_timeout 2s), with exit 0.
        for i in range(250):
            chat(w, "stalled-again")
        # Said on stderr at most once per 10 s, not once a failed write.
        wait_until(lambda: w.metric("weir_access_log_write_errors_total") > 5, 10, message="failed writes")
        assert w.process.log().count("the reader is not keeping up") < w.metric("weir_access_log_write_errors_total")
        w.process.popen.send_signal(signal.SIGTERM)
        try:
            code = w.process.popen.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM did not end Weir while its log reader was not reading")
        assert code == 0, w.process.log()[-2000:]
    finally:
        os.close(reader)


# --- 2. SIGUSR1 and SIGUSR2 ----------------------------------------------------------------------------------------

def test_sigusr1_reopens_the_access_log_without_a_reload_and_sigusr2_is_ignored(tmp_path, mock, weir):
    # Before: both killed Weir at once (exit 138/140): no drain, the lines still buffered lost.
    m = mock(*MOCK_FLAGS)
    log = tmp_path / "access.log"
    w = weir(config=config(m, access_log=str(log)), workers=2)
    before = [chat(w, "before") for _ in range(3)]
    w.wait_log(lambda es: len(es) >= 3, message="the first lines")
    os.rename(log, tmp_path / "access.log.1")
    # A changed file: SIGUSR1 must not load it (only SIGHUP reloads).
    cfg = json.loads(json.dumps(config(m, access_log=str(log))))
    cfg["models"]["m2"] = {"pool": "p", "upstream_model": "mock-model"}
    cfg["listen"] = f"127.0.0.1:{w.port}"
    cfg["workers"] = 2
    w.config_path.write_text(to_yaml(cfg) + "\n")
    reloads = sum(v for n, _, v in w.metrics() if n == "weir_config_reloads_total")

    os.kill(w.process.pid, signal.SIGUSR1)
    wait_until(lambda: f"SIGUSR1 received, access log {log} reopened" in w.process.log(), 10,
               message="the reopen said on stderr")
    assert w.process.alive()
    after = chat(w, "after")
    w.log_for(after)  # in the new access.log
    old = [json.loads(line)["request_id"] for line in (tmp_path / "access.log.1").read_text().splitlines()]
    assert old == before
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "m2", "messages": [{"role": "user", "content": "x"}]},
                   timeout=15)
    assert r.status_code == 404, "SIGUSR1 must not reload the configuration"
    assert sum(v for n, _, v in w.metrics() if n == "weir_config_reloads_total") == reloads

    for _ in range(2):
        os.kill(w.process.pid, signal.SIGUSR2)
    wait_until(lambda: "SIGUSR2 received and ignored" in w.process.log(), 10, message="the SIGUSR2 note")
    last = chat(w, "last")
    assert w.process.alive()
    assert w.process.log().count("SIGUSR2 received") == 1

    # A drain as usual: every line written.
    assert w.process.stop(30) == 0
    ids = {e["request_id"] for e in w.log_entries()}
    assert {after, last} <= ids


# --- 3. a reopen that fails ----------------------------------------------------------------------------------------

def test_a_failed_reopen_is_counted_shown_and_retried_until_it_opens(tmp_path, mock, weir):
    # Before: said once on stderr, no metric moved, and the lines went to the rotated file until the next
    # SIGHUP.
    m = mock(*MOCK_FLAGS)
    log = tmp_path / "access.log"
    w = weir(config=config(m, access_log=str(log)), workers=2)
    chat(w, "before")
    w.wait_log(lambda es: len(es) >= 1, message="the first line")
    assert w.metric("weir_access_log_reopen_failures_total") == 0
    os.rename(log, tmp_path / "access.log.1")
    log.mkdir()  # any open(2) failure: EACCES, EMFILE, ...
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: w.metric("weir_access_log_reopen_failures_total") == 1, 10, message="the failure counted")
    samples = w.metrics()
    assert ("weir_access_log_reopen_pending", {}, 1.0) in samples
    meanwhile = chat(w, "meanwhile")  # still the old file: not lost
    wait_until(lambda: meanwhile in (tmp_path / "access.log.1").read_text(), 10, message="the line in the old file")

    log.rmdir()  # the cause goes away: no second signal needed
    wait_until(lambda: log.is_file(), 15, message="the retried reopen")
    wait_until(lambda: ("weir_access_log_reopen_pending", {}, 0.0) in w.metrics(), 10, message="pending 0")
    assert w.metric("weir_access_log_reopen_failures_total") == 1
    later = chat(w, "later")
    w.log_for(later)
    assert "reopened (retried after a failed reopen)" in w.process.log()


# Before: the "cannot accept connections" line a worker writes when descriptors run short was a blocking write
# to stderr: with stderr a stalled pipe, the worker's accept loop stopped until the reader read (regression
# helper). It goes through core::note now.
def test_a_descriptor_shortage_with_a_stalled_stderr_does_not_stop_the_worker(processes, mock):
    import fcntl
    import resource
    import socket
    m = mock(*MOCK_FLAGS)
    reader, writer = os.pipe()
    fcntl.fcntl(writer, 1031, 4096)  # F_SETPIPE_SZ: a small pipe, filled below

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    topper = -1
    try:
        w, _ = spawn(processes, {**config(m), "workers": 1}, stdout=subprocess.DEVNULL, stderr=writer,
                     preexec_fn=few_descriptors)
        port = w.port
        chat(w, "before")
        topper = fill(writer)
        held = []
        try:
            for _ in range(60):  # past the descriptor limit: accept() fails (EMFILE) and the worker says so
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            # Held until the worker has taken all it can (a busy host's worker accepted them only after the
            # test had closed them, with no shortage).
            wait_until(lambda: len(os.listdir(f"/proc/{w.process.pid}/fd")) >= 38, 10,
                       message="the worker's descriptors used up")
        finally:
            for s in held:
                s.close()
        chat(w, "after")  # (a worker blocked on its stderr line would never answer)
        assert w.metric("weir_accept_errors_total", listener="client") >= 1  # (the shortage did happen)
    finally:
        if topper >= 0:
            os.close(topper)
        os.close(writer)
        os.close(reader)


# Before: with stderr closed at exec (`2>&-`), the access log opened as descriptor 2 and every message meant for
# stderr (listening, reloads, signals, stopped) was written into it among the JSON lines (regression helper;
# stop 50's build too). Descriptors 0-2 are opened on /dev/null first when closed.
def test_stderr_closed_at_exec_keeps_messages_out_of_the_access_log(processes, mock, tmp_path):
    m = mock(*MOCK_FLAGS)
    log = tmp_path / "access.log"
    w, popen = spawn(processes, {**config(m, access_log=str(log)), "workers": 1},
                     argv=lambda path: ["/bin/sh", "-c", f'exec "{binary("weir")}" --config "{path}" 2>&-'],
                     stdout=subprocess.DEVNULL)
    ids = [chat(w, "closed") for _ in range(3)]
    popen.send_signal(signal.SIGHUP)
    ids.append(chat(w, "closed"))
    popen.send_signal(signal.SIGTERM)
    assert popen.wait(10) == 0
    lines = log.read_text().splitlines()
    assert all(line.startswith("{") for line in lines), lines
    assert [json.loads(line)["request_id"] for line in lines] == ids
