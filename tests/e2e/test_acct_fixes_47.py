"""Accounting and log defects found in stop 47's black-box rounds: per-choice usage (continuous_usage_stats) of a
stream cut short, the request log's columns for invalid UTF-8, C1 controls in log lines, an embeddings request's
"stream", and the error a micro-batch member gets when the batch's stream ends without [DONE]."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import threading

import httpx
import pytest
from conftest import binary, wait_until
from test_defect_fixes import RawUpstream

MSG = [{"role": "user", "content": "hello there friend"}]
PRICING = {"*": {"input": 1.0, "output": 2.0}}  # USD per million tokens
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def _rows(db: str) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM requests ORDER BY id")]
    finally:
        con.close()


def _requests_cli(db: str, *args: str) -> bytes:
    return subprocess.run([str(binary("weir")), "requests", "--db", db, *args], capture_output=True, check=True,
                          timeout=10).stdout


# DEFECT: the request log's model column was made valid UTF-8 with one U+FFFD per bad byte, the access log's
# line with one per ill-formed sequence (and capped counting that), so `weir requests --model <what the log
# shows>` and the admin API's ?model= found nothing, and the column could outgrow its 256-byte cap. One rule now.
def test_the_request_logs_model_column_is_what_the_log_line_shows(tmp_path, mock, weir):
    m = mock("--ttft-ms", "0")
    db = str(tmp_path / "requests.db")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"}}, workers=1)
    models = {"trunc": b"x\xf0\x9f\x98", "long": b"\xe2\x82" * 200, "mixed": b"a\xff\xc0\xafb\xed\xa0\x80" * 40}
    for name, model in models.items():
        r = httpx.post(w.v1 + "/chat/completions", timeout=10,
                       headers={"x-request-id": f"utf8-{name}", "content-type": "application/json"},
                       content=b'{"model":"' + model + b'","messages":[{"role":"user","content":"hi"}]}')
        assert r.status_code in (400, 404), r.text
    wait_until(lambda: len(_rows(db)) == len(models), 5)
    for row in _rows(db):
        shown = json.loads(row["record"])["model"]
        assert row["model"] == shown, row
        assert len(row["model"].encode()) <= 256, row
        found = json.loads(_requests_cli(db, "--model", shown))["data"]
        assert [d["request_id"] for d in found] == [row["request_id"]], found
    assert json.loads(_rows(db)[0]["record"])["model"] == "x\ufffd"


# DEFECT: C1 controls (U+0080..U+009F) and DEL went raw into the access log, the request log and `weir requests`
# output: a model "\u009b2J..." (CSI) cleared the screen of whoever tailed the log. They are escaped as \u00XX.
def test_c1_controls_and_del_are_escaped_in_log_lines(tmp_path, mock, weir):
    m = mock("--ttft-ms", "0")
    db = str(tmp_path / "requests.db")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"}}, workers=1)
    model = "\u009b2J\u009b31mX\u0085\u007f\u009f"
    r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": "c1"}, timeout=10,
                   json={"model": model, "messages": MSG, "max_tokens": 1})
    assert r.status_code == 404, r.text
    assert w.log_for("c1")["model"] == model  # (the escapes read back as the characters)
    raw = w.access_log_path.read_bytes()
    for c in ("\u009b", "\u0085", "\u009f", "\u007f"):
        assert c.encode() not in raw, c
    assert b"\\u009b2J\\u009b31mX\\u0085\\u007f\\u009f" in raw
    wait_until(lambda: len(_rows(db)) == 1, 5)
    out = _requests_cli(db, "--id", "c1")
    assert json.loads(out)["model"] == model
    assert b"\xc2\x9b" not in out and b"\x7f" not in out and b"\\u009b" in out, out
