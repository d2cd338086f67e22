"""Bytes that are not UTF-8 (issue 8, defect 6): whatever a request holds in
its path, model, x-request-id or headers, every access-log line and every
error body is valid JSON (invalid bytes become U+FFFD) and echoed fields are
capped at 256 bytes, cut on a UTF-8 boundary.
"""

from __future__ import annotations

import json
import random

import pytest

from conftest import wait_until
from httpwire import ConnectionClosed, RawConn

BAD_BYTES = [b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf5\x80\x80\x80",
             b"\xf0\x9f\x98", b"\xfe\xfe\xff"]


@pytest.fixture
def stack(mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "3", "--any-model")
    w = weir(workers=1, config={
        "pools": {"main": {"endpoints": [m.base_url]}},
        "models": {"mock-model": {"pool": "main"}},
    })
    return m, w


def raw(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]] = (), body: bytes | None = None) -> bytes:
    hs = [(b"host", b"weir.test"), *headers]
    if body is not None:
        hs += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return (method + b" " + target + b" HTTP/1.1\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in hs) + b"\r\n"
            + (body or b""))


def send(w, data: bytes, method: str = "POST"):
    """The response to `data` on a fresh connection, or None if Weir closed it without one."""
    with RawConn(w.port, timeout=10) as c:
        c.send(data)
        try:
            return c.read_response(method)
        except ConnectionClosed:
            return None


def strict_json(data: bytes):
    return json.loads(data.decode("utf-8"))  # strict: invalid UTF-8 or surrogates raise


def assert_error_body_valid(r):
    if r is None or not (r.header("content-type") or "").startswith("application/json"):
        return None
    body = strict_json(r.body)
    if r.status < 400:
        return None
    assert set(body) == {"error"}, body
    return body["error"]


def log_lines(w, whole: bool = False) -> list[dict]:
    data = w.access_log_path.read_bytes()
    lines = data.split(b"\n")
    # A line may be on its way (a reader can see part of a write): only `whole` asks that none is.
    assert not whole or lines[-1] == b"", "the access log ends mid-line"
    out = []
    for line in lines[:-1]:
        try:
            out.append(strict_json(line))
        except ValueError as e:
            raise AssertionError(f"access log line is not valid JSON: {line!r}") from e
    return out


def chat(model: bytes) -> bytes:
    return b'{"model":"' + model + b'","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


def test_invalid_utf8_in_path_model_request_id_and_headers(stack):
    m, w = stack
    sent = 0
    for bad in BAD_BYTES:
        cases = [
            (b"GET", b"/v1/" + bad, [], None, "GET"),                                   # 404 echoes the path
            (b"GET", b"/v1/models/x" + bad, [], None, "GET"),                            # model_not_found
            (b"DELETE", b"/v1/models/" + bad, [], None, "DELETE"),                       # 405 echoes the path
            (b"POST", b"/v1/chat/completions?q=" + bad, [], chat(b"mock-model"), "POST"),
            (b"POST", b"/v1/chat/completions", [], chat(b"m" + bad), "POST"),           # raw bytes in JSON
            (b"POST", b"/v1/chat/completions", [], chat(b"m\\ud800"), "POST"),        # lone surrogate escapes
            (b"POST", b"/v1/chat/completions", [], chat(b"\\udc00" + b"x" * 300), "POST"),
            (b"POST", b"/v1/chat/completions", [(b"x-request-id", b"id-" + bad)], chat(b"nope" + bad), "POST"),
            (b"POST", b"/v1/chat/completions", [(b"x-request-id", b"id-" + bad), (b"x-anything", bad),
                                                (b"authorization", b"Bearer " + bad), (b"user-agent", bad)],
             chat(b"mock-model"), "POST"),
        ]
        for method, target, headers, body, verb in cases:
            r = send(w, raw(method, target, headers, body), verb)
            sent += 1
            err = assert_error_body_valid(r)
            if err is not None and target.startswith(b"/v1/" + bad):
                assert "\ufffd" in err["message"], err  # the path is echoed, replaced
    wait_until(lambda: len(log_lines(w)) >= sent, 5, message=f"{sent} access-log lines")
    entries = log_lines(w, whole=True)  # every line is in: none may end without its newline
    paths = [e["path"] for e in entries]
    assert any("\ufffd" in p for p in paths), paths
    for e in entries:
        assert e["request_id"] and "\ufffd" not in e["request_id"], e  # an invalid x-request-id is replaced


def test_long_fields_are_capped_on_a_utf8_boundary(stack):
    m, w = stack
    euro = "€".encode()
    path = b"/" + b"a" * 254 + euro + b"tail"                  # byte 256 is inside the euro sign
    r = send(w, raw(b"GET", path), "GET")
    err = assert_error_body_valid(r)
    assert r.status == 404 and "a" * 254 in err["message"] and "tail" not in err["message"], err
    model = "é".encode() * 3000                                # 6000 bytes, valid UTF-8
    r = send(w, raw(b"POST", b"/v1/chat/completions", [], chat(model)))
    err = assert_error_body_valid(r)
    assert r.status == 404 and err["code"] == "model_not_found"
    assert len(err["message"].encode()) < 400, len(err["message"])
    entries = wait_until(lambda: (lambda es: es if len(es) >= 2 else None)(log_lines(w)), 5, message="2 log lines")
    assert entries[0]["path"] == "/" + "a" * 254                # cut before the euro sign, not inside it
    assert entries[1]["model"] == "é" * 128                     # 256 bytes
    assert "\ufffd" not in entries[0]["path"] + entries[1]["model"]


def test_mutated_requests_all_log_valid_json(stack):
    """A small version of the fuzzing that found it: random bytes in the path and a header."""
    m, w = stack
    rng = random.Random(8)
    n = 300
    for i in range(n):
        target = bytearray(b"/v1/chat/completions")
        for _ in range(rng.randint(1, 4)):
            target.insert(rng.randrange(1, len(target) + 1), rng.choice([0x80, 0xbf, 0xc3, 0xe2, 0xed, 0xf0, 0xff]))
        r = send(w, raw(b"POST", bytes(target), [(b"x-note", bytes(rng.randrange(0x80, 0x100) for _ in range(4)))],
                        chat(b"mock-model")))
        assert_error_body_valid(r)
    entries = wait_until(lambda: (lambda es: es if len(es) >= n else None)(log_lines(w)), 10,
                         message=f"{n} access-log lines")
    assert len(entries) == n
