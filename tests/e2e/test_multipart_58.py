"""Speech-to-text forms are read as vLLM's form parser (python-multipart) reads them (docs/protocols.md#speech-to-text):
no preamble but leading line ends, and parameters split in one pass."""
from __future__ import annotations

import json

import httpx
import pytest

from test_defect_fixes import RawUpstream

CT = "multipart/form-data; boundary=B"


def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    fn = f'; filename="{filename}"' if filename else ""
    return b'--B\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n' % (name.encode(), fn.encode(), value)


def sse_answer() -> bytes:
    events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in (
        {"object": "transcription.chunk", "choices": [{"delta": {"content": "hello"}}]},
        {"object": "transcription.chunk", "choices": [{"delta": {"content": ""}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events))


def json_answer() -> bytes:
    body = b'{"text":"hello"}'
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


@pytest.fixture
def upstream():
    # As vLLM: streams when the form it parsed says stream=true (python-multipart skips CR and LF before the first
    # delimiter), answers one JSON object otherwise.
    seen: list[bytes] = []

    def answer(headers, body):
        seen.append(body)
        return sse_answer() if b'name="stream"\r\n\r\ntrue' in body else json_answer()
    up = RawUpstream(answer)
    up.seen = seen
    yield up
    up.close()


# DEFECT: a body opening with a bare LF (or CR, or CRLF LF) before its first delimiter: Weir skipped to the first
# CRLF-delimiter and read the parts before it as a preamble, while python-multipart skips the line ends and reads
# them. A hidden stream=true made vLLM stream to a request Weir took for a JSON one (502 upstream_invalid_response,
# counted against the endpoint: five opened the pool's breaker for every tenant); a hidden prompt passed the token
# limit. Now leading CR and LF are skipped as vLLM does, and any other preamble is a 400.
@pytest.mark.parametrize("lead", [b"\n", b"\r", b"\r\n\n"], ids=["lf", "cr", "crlf_lf"])
def test_parts_after_leading_line_ends_are_read_as_the_upstream_reads_them(weir, upstream, lead):
    w = weir(config={"pools": {"p": {"endpoints": [upstream.url], "breaker": {}}}, "models": {"whisper": {"pool": "p"}}},
             workers=1)
    body = lead + part("stream", b"true") + part("file", b"RIFFxxxx", "a.wav") + part("model", b"whisper") + b"--B--\r\n"
    with httpx.stream("POST", w.v1 + "/audio/transcriptions", content=body, timeout=10,
                      headers={"content-type": CT, "x-request-id": "lead-1"}) as r:
        text = r.read().decode()
        assert r.status_code == 200, text
        assert r.headers["content-type"].startswith("text/event-stream"), text
    assert "hello" in text and "data: [DONE]" in text
    entry = w.log_for("lead-1")
    assert entry["status"] == 200 and entry.get("error_code") is None, entry
    assert w.metric("weir_upstream_failures_total") == 0


@pytest.mark.parametrize("lead", [b"preamble\r\n", b" \r\n", b"x"], ids=["text", "space", "no_line_end"])
def test_any_other_preamble_is_refused(weir, upstream, lead):
    w = weir(config={"pools": {"p": {"endpoints": [upstream.url]}}, "models": {"whisper": {"pool": "p"}}}, workers=1)
    body = lead + part("stream", b"true") + part("file", b"RIFFxxxx", "a.wav") + part("model", b"whisper") + b"--B--\r\n"
    r = httpx.post(w.v1 + "/audio/transcriptions", content=body, headers={"content-type": CT}, timeout=10)
    assert r.status_code == 400, r.text
    assert "preamble" in r.json()["error"]["message"], r.text
    assert not upstream.seen
    # Without it, the same form is served.
    ok = httpx.post(w.v1 + "/audio/transcriptions", headers={"content-type": CT}, timeout=10,
                    content=part("file", b"RIFFxxxx", "a.wav") + part("model", b"whisper") + b"--B--\r\n")
    assert ok.status_code == 200, ok.text


# DEFECT: a part's Content-Disposition was split at ';' by recounting the quotes from the header's start for each
# ';' inside a quoted value: quadratic, on the worker's thread (an 80 KB name took 7.9 s; the 4 MiB body limit,
# hours), stalling every other request of the worker. Now one pass: a 1 MiB quoted name is read at once.
def test_a_huge_quoted_name_is_read_in_one_pass(weir, upstream):
    w = weir(config={"pools": {"p": {"endpoints": [upstream.url]}}, "models": {"whisper": {"pool": "p"}},
                     "server": {"max_body": "8MiB"}}, workers=1)
    body = (b'--B\r\nContent-Disposition: form-data; name="x' + b";" * (1 << 20) + b'"\r\n\r\n1\r\n'
            + part("file", b"RIFFxxxx", "a.wav") + part("model", b"whisper") + b"--B--\r\n")
    r = httpx.post(w.v1 + "/audio/transcriptions", content=body, headers={"content-type": CT}, timeout=60)
    assert r.status_code == 200, r.text
    # Unquoted, the ';' make a parameter each: more than 32 is a 400.
    body = (b'--B\r\nContent-Disposition: form-data; name=x' + b";" * 100000 + b'\r\n\r\n1\r\n'
            + part("file", b"RIFFxxxx", "a.wav") + part("model", b"whisper") + b"--B--\r\n")
    r = httpx.post(w.v1 + "/audio/transcriptions", content=body, headers={"content-type": CT}, timeout=60)
    assert r.status_code == 400 and "parameters" in r.json()["error"]["message"], r.text


# DEFECT: two Content-Type lines were forwarded as they came, Weir reading the form by the first one's boundary; a
# server reading the last (gunicorn's environ does) parses another form. A model part sent as a file was routed by
# its bytes, while Starlette hands vLLM an upload there. Both are 400s now.
def test_two_content_types_and_a_model_file_are_refused(weir, upstream):
    w = weir(config={"pools": {"p": {"endpoints": [upstream.url]}}, "models": {"whisper": {"pool": "p"}}}, workers=1)
    form = part("file", b"RIFFxxxx", "a.wav") + part("model", b"whisper") + b"--B--\r\n"
    r = httpx.post(w.v1 + "/audio/transcriptions", content=form,
                   headers=[("content-type", CT), ("content-type", "multipart/form-data; boundary=C")], timeout=10)
    assert r.status_code == 400 and "Content-Type" in r.json()["error"]["message"], r.text
    form = part("file", b"RIFFxxxx", "a.wav") + part("model", b"whisper", "model.txt") + b"--B--\r\n"
    r = httpx.post(w.v1 + "/audio/transcriptions", content=form, headers={"content-type": CT}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    assert not upstream.seen
