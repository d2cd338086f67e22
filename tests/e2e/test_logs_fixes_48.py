"""The logs under trouble: a full disk leaves only whole JSON lines in the access log (a torn line is taken
off, counted lost); a new request-log database (and its -wal, -shm) is made 0600, an existing one keeps its
mode; the request log's stderr line says why records were dropped by the reasons that moved."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import subprocess
import uuid

import httpx
import pytest

from conftest import wait_until

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")


def config(m, **extra) -> dict:
    return {"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
            **extra}


def chat(w, request_id: str) -> int:
    r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": request_id}, timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": request_id}], "max_tokens": 4})
    return r.status_code


# --- 1. a full disk: whole lines only ------------------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs (root only: mount(2)); unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(path) -> None:
    """Writes `path` until the file system has no room left."""
    block = b"\0" * 4096
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return


def test_a_full_disk_leaves_only_whole_json_lines_and_counts_the_torn_one(small_tmpfs, mock, weir):
    # Before: a write cut short by ENOSPC left the start of a line with no newline; the next line written
    # was glued to it (two lines, neither JSON), and one was cut at the end of the file.
    m = mock(*MOCK_FLAGS)
    log = small_tmpfs / "access.jsonl"
    w = weir(config=config(m, server={"access_log": str(log)}), workers=2)
    sent = []

    def send(tag: str) -> None:
        rid = f"{tag}-{uuid.uuid4().hex[:10]}"
        assert chat(w, rid) == 200
        sent.append(rid)

    for i in range(10):
        send("before")
    w.wait_log(lambda es: len(es) >= 10, message="the first lines")
    filler = small_tmpfs / "filler"
    fill(filler)
    # Lines until writes fail (the log's last page has at most 4 KiB of room), then a few more.
    for i in range(200):
        send("full")
        if "access log: a write failed" in w.process.log():
            break
    else:
        pytest.fail("no access-log write failed on a full disk")
    for i in range(10):
        send("full")
    os.unlink(filler)
    after = []
    for i in range(10):
        send("after")
        after.append(sent[-1])
    # Every line is JSON (log_entries asserts it), and the lines written after the disk was freed are there.
    entries = w.wait_log(lambda es: {e["request_id"] for e in es} >= set(after), 10, message="the lines after")
    raw = log.read_bytes()
    assert raw.endswith(b"\n")
    for line in raw.split(b"\n")[:-1]:
        json.loads(line)  # also no empty line
    present = [e["request_id"] for e in entries]
    assert len(present) == len(set(present))
    assert set(present) <= set(sent)
    # Exact counts: every request not in the file was counted lost (the torn one too), none twice.
    lost = w.metric("weir_access_log_lines_lost_total")
    assert lost == len(sent) - len(present) > 0
    assert w.metric("weir_access_log_write_errors_total") >= 1


# --- 2. the request log's file mode --------------------------------------------------------------------------------

def file_mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def wait_written(w, n: int) -> None:
    wait_until(lambda: w.metric("weir_request_log_written_total") >= n, 10, message=f"{n} request-log rows")


def test_a_new_request_log_database_and_its_wal_and_shm_are_0600(tmp_path, mock, weir):
    # Before: 0644 under the usual umask (022): prompts, completions, subjects and tenants readable by all.
    m = mock(*MOCK_FLAGS)
    db = tmp_path / "requests.db"
    old = os.umask(0o022)
    try:
        w = weir(config=config(m, request_log={"url": f"sqlite:{db}", "flush_interval": "10ms"}), workers=1)
    finally:
        os.umask(old)
    assert chat(w, "mode-1") == 200
    wait_written(w, 1)
    for suffix in ("", "-wal", "-shm"):
        assert file_mode(f"{db}{suffix}") == 0o600, suffix


def test_an_existing_request_log_database_keeps_the_mode_its_operator_gave_it(tmp_path, mock, weir):
    m = mock(*MOCK_FLAGS)
    db = tmp_path / "requests.db"
    sqlite3.connect(db).close()  # an empty database
    db.touch()
    os.chmod(db, 0o640)
    w = weir(config=config(m, request_log={"url": f"sqlite:{db}", "flush_interval": "10ms"}), workers=1)
    assert chat(w, "mode-2") == 200
    wait_written(w, 1)
    for suffix in ("", "-wal", "-shm"):
        assert file_mode(f"{db}{suffix}") == 0o640, suffix


# --- 3. why records were dropped -----------------------------------------------------------------------------------

def test_records_a_malformed_database_refused_are_not_said_to_be_a_full_queue(tmp_path, mock, weir):
    # Before: "N records dropped in the last Ns (the store is slow: queue full)" for records every batch
    # of which the store refused (weir_request_log_dropped_total{reason="write_error"}), queue_full 0.
    m = mock(*MOCK_FLAGS)
    db = tmp_path / "requests.db"
    w = weir(config=config(m, request_log={"url": f"sqlite:{db}", "flush_interval": "10ms"}), workers=1)
    for i in range(40):
        assert chat(w, f"fill-{i}") == 200
    wait_written(w, 40)
    con = sqlite3.connect(db, isolation_level=None, timeout=5)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    size = os.path.getsize(db)
    assert size > 4096
    with open(db, "r+b") as f:  # every page but the first (the schema) garbage: no b-tree page type
        f.seek(4096)
        f.write(b"\xa5" * (size - 4096))
    for i in range(10):
        assert chat(w, f"lost-{i}") == 200
    wait_until(lambda: w.metric("weir_request_log_dropped_total", reason="write_error") >= 1, 10,
               message="a batch the store refused")
    assert w.metric("weir_request_log_dropped_total", reason="queue_full") == 0
    w.process.stop(15)
    said = [line for line in w.process.log().splitlines() if "records dropped in the last" in line]
    assert said, w.process.log()
    for line in said:
        assert "queue full" not in line and "is slow" not in line, line
        assert "in batches the store failed to write" in line, line
