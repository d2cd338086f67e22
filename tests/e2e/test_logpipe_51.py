"""The access log and its readers: a pipe (stdout or a FIFO) whose reader stops reading costs dropped lines,
counted, never traffic or the drain."""

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

