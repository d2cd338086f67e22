"""Attacks on /v1/responses and /v1/audio/{transcriptions,translations}.

Tests marked DEFECT found a defect when they were written (plain asserts
of the correct behaviour, fixed since); the others are regression tests for
cases test_responses.py / test_audio_routes.py do not cover.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
import time
import uuid

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response as SdkResponse
from openai.types.responses import ResponseStreamEvent

KEY, BOB = "sk-acme", "sk-bob"
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


def sha(k: str) -> str:
    return hashlib.sha256(k.encode()).hexdigest()


@pytest.fixture(scope="module")
def stack(module_mock, module_weir):
    m = module_mock("--ttft-ms", "2", "--itl-ms", "1", "--max-tokens", "12",
                    "--model", "mock-model", "--model", "openai/whisper-small", "--model", "openai/whisper-large")
    w = module_weir(config={
        "server": {"max_body": "1MiB"},
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"gpt-test": {"pool": "p", "upstream_model": "mock-model"},
                   "whisper-1": {"pool": "p", "upstream_model": "openai/whisper-small"},
                   "secret-whisper": {"pool": "p", "upstream_model": "openai/whisper-large"}},
        "tenants": {"acme": {"models": ["gpt-test", "whisper-1", "secret-whisper"],
                             "limits": {"requests_per_minute": 100000}},
                    "bob": {"models": ["gpt-test", "whisper-1"], "limits": {"requests_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "a1", "sha256": sha(KEY), "tenant": "acme"},
                              {"id": "b1", "sha256": sha(BOB), "tenant": "bob"}]},
    })
    return m, w


def rid() -> str:
    return "atk-" + uuid.uuid4().hex[:16]


def strict_json(text: str):
    def bad(c):
        raise ValueError(f"non-JSON constant {c}")
    return json.loads(text, parse_constant=bad)


# ---------------------------------------------------------------------------
# A capturing upstream: records the exact body Weir sends, answers a chat completion.

class _Capture(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self):  # noqa: N802
        n = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(n)
        type(self).bodies.append(body)
        out = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": "ok"}}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.fixture
def capture(weir):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    _Capture.bodies = []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    w = weir(upstream=f"http://127.0.0.1:{srv.server_address[1]}")
    yield w, _Capture.bodies
    srv.shutdown()


def post(w, body, key=KEY, raw: bytes | None = None, **headers) -> httpx.Response:
    return httpx.post(w.base_url + "/v1/responses", content=raw if raw is not None else json.dumps(body),
                      headers={"authorization": f"Bearer {key}", **headers}, timeout=15)


# ---------------------------------------------------------------------------
# /v1/responses: DEFECTS


# DEFECT: 1e400 was re-serialized as `Infinity`: Weir sent invalid JSON upstream (vLLM: "JSON decode error").
@pytest.mark.parametrize("body", [
    b'{"model":"m","input":"x","temperature":1e400}',
    b'{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":{"maximum":1e400}}]}',
    b'{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"maximum":-1e400}}}}',
])
def test_responses_never_sends_invalid_json_upstream(capture, body):
    w, bodies = capture
    r = post(w, None, raw=body)
    assert r.status_code in (200, 400), r.text
    for b in bodies:
        strict_json(b.decode())  # raises on Infinity / -Infinity / NaN


# DEFECT: metadata {"k": 1e400} was echoed back to the client as `"k":Infinity` (not JSON).
def test_responses_answer_is_strict_json_with_huge_number_in_metadata(stack):
    _, w = stack
    r = post(w, None, raw=b'{"model":"gpt-test","input":"x","metadata":{"k":1e400}}')
    assert r.status_code in (200, 400), r.text
    strict_json(r.text)


# DEFECT: an upstream failing before its first chunk gave response.created/failed with created_at 0 and model "".
def test_responses_stream_failing_before_first_chunk_still_has_created_at_and_model(stack):
    _, w = stack
    with httpx.stream("POST", w.base_url + "/v1/responses", timeout=15,
                      json={"model": "gpt-test", "input": "hi", "stream": True},
                      headers={"authorization": f"Bearer {KEY}", "x-mock-reset-after": "0"}) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    events = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: ")]
    assert events[-1]["type"] == "response.failed"
    for e in (events[0], events[-1]):
        assert e["response"]["created_at"] > 0, e
        assert e["response"]["model"] == "gpt-test", e


# ---------------------------------------------------------------------------
# /v1/responses: passing regression tests


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": [{"type": "bogus", "role": "user", "content": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": 5}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input"),
    ({"input": 5}, "input"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools"),
    ({"input": "x", "tools": [{"type": "function", "name": 5}]}, "tools"),
    ({"input": "x", "tools": {"type": "function", "name": "f"}}, "tools"),
    ({"input": "x", "tool_choice": "bogus"}, "tool_choice"),
    ({"input": "x", "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"input": "x", "tool_choice": 5}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "bogus"}}}, "text"),
    ({"input": "x", "text": "json"}, "text"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 10 ** 30}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 5.5}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": "5"}, "max_output_tokens"),
    ({"input": "x", "temperature": "1"}, "temperature"),
    ({"input": "x", "stream": "true"}, "stream"),
    ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
    ({"input": "x", "reasoning": {"effort": "minimal"}}, "reasoning"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
])
def test_responses_wrong_types_are_400_in_openai_shape_with_one_log_line(stack, body, param):
    _, w = stack
    r_id = rid()
    r = post(w, {"model": "gpt-test", **body}, **{"x-request-id": r_id})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    entry = w.log_for(r_id)
    assert entry["status"] == 400 and entry["upstream_ms"] is None


@pytest.mark.parametrize("raw", [b"\xef\xbb\xbf{}", b'{"model":"gpt-test","input":"\xff"}',
                                 b'{"model":"gpt-test","input":"x","metadata":' + b"[" * 100000 + b"]" * 100000 + b"}",
                                 b'{"model":"gpt-test","input":"\\udc00"}', b"null", b""])
def test_responses_bad_json_is_400_not_500(stack, raw):
    _, w = stack
    r = post(w, None, raw=raw)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


def _sse(raw: str):
    out = []
    for block in raw.strip("\n").split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append(json.loads(lines[1][6:]))
    return out


@pytest.mark.parametrize("headers", [{}, {"x-mock-reasoning": "3"}, {"x-mock-tool-calls": "2", "x-mock-reasoning": "1"},
                                     {"x-mock-reset-after": "4"}, {"x-mock-reset-after": "2", "x-mock-reasoning": "4"},
                                     {"x-mock-stall-after": "2", "x-mock-stall-ms": "300"}])
def test_responses_stream_events_validate_against_the_sdk_types_and_match_chat(stack, headers):
    _, w = stack
    r_id = rid()
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    tools = [{"type": "function", "name": "f"}]
    with httpx.stream("POST", w.base_url + "/v1/responses", timeout=15,
                      json={"model": "gpt-test", "input": "hello there", "stream": True, "tools": tools},
                      headers={"authorization": f"Bearer {KEY}", "x-request-id": r_id, **headers}) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    assert "[DONE]" not in raw
    events = _sse(raw)
    for e in events:
        adapter.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert sum(e["type"] in TERMINAL for e in events) == 1 and events[-1]["type"] in TERMINAL
    ids = {}
    for e in events:
        if e["type"] == "response.output_item.added":
            ids[e["output_index"]] = e["item"]["id"]
        elif "item_id" in e:
            assert ids[e["output_index"]] == e["item_id"], e
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    # Same request id through /v1/chat/completions: the same words, none lost or doubled.
    chat = httpx.post(w.base_url + "/v1/chat/completions", timeout=15,
                      json={"model": "gpt-test", "messages": [{"role": "user", "content": "hello there"}],
                            "stream": True, "tools": [{"type": "function", "function": {"name": "f"}}]},
                      headers={"authorization": f"Bearer {KEY}", "x-request-id": r_id, **headers})
    ctext = ""
    for line in chat.text.split("\n"):
        if line.startswith("data: {"):
            for ch in json.loads(line[6:]).get("choices", []):
                ctext += ch["delta"].get("content") or ""
    assert text == ctext
    entries = w.wait_log(lambda es: sum(e["request_id"] == r_id for e in es) >= 2)
    # Each worker flushes its own log buffer: the two lines may come in either order.
    assert sorted(e["path"] for e in entries if e["request_id"] == r_id) == ["/v1/chat/completions", "/v1/responses"]


def test_responses_non_stream_validates_against_sdk_type(stack):
    _, w = stack
    r = post(w, {"model": "gpt-test", "input": "x", "tools": [{"type": "function", "name": "f"}]},
             **{"x-mock-tool-calls": "2", "x-mock-reasoning": "2"})
    assert r.status_code == 200
    SdkResponse.model_validate(r.json())


def test_responses_client_disconnect_mid_stream_is_one_499_line_and_an_upstream_abort(stack):
    m, w = stack
    r_id = rid()
    aborts = m.aborts()
    body = json.dumps({"model": "gpt-test", "input": "hi", "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", w.port))
    s.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nx-request-id: {r_id}\r\n"
              f"x-mock-itl-ms: 200\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
              + body)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.close()
    entry = w.log_for(r_id)
    assert entry["status"] == 499 and entry["stream"] is True
    from conftest import wait_until
    wait_until(lambda: m.aborts() > aborts, 5, message="upstream abort")
    time.sleep(0.2)
    assert len([e for e in w.log_entries() if e["request_id"] == r_id]) == 1


def test_responses_store_routes_404_in_openai_shape(stack):
    _, w = stack
    c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=10)
    for call in (lambda: c.responses.retrieve("resp_1"), lambda: c.responses.delete("resp_1"),
                 lambda: c.responses.cancel("resp_1"), lambda: list(c.responses.input_items.list("resp_1"))):
        with pytest.raises(openai.NotFoundError):
            call()


# ---------------------------------------------------------------------------
# Speech to text: raw multipart helpers

def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    cd = f'Content-Disposition: form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return cd.encode() + b"\r\n\r\n" + value


def form(parts, boundary: bytes = b"BND", close: bool = True, nl: bytes = b"\r\n") -> bytes:
    out = b"".join(b"--" + boundary + nl + p + nl for p in parts)
    return out + (b"--" + boundary + b"--" + nl if close else b"")


FILE = part("file", b"AUDIO", "a.wav")


def send(w, body: bytes, ctype: str = "multipart/form-data; boundary=BND", key: str = BOB,
         route: str = "transcriptions", **headers) -> httpx.Response:
    return httpx.post(f"{w.base_url}/v1/audio/{route}", content=body, timeout=15,
                      headers={"authorization": f"Bearer {key}", "content-type": ctype, **headers})


# ---------------------------------------------------------------------------
# Speech to text: DEFECTS


# DEFECT: two boundary params: Weir parsed the form with the first (model whisper-1, allowed for bob),
# Starlette/python-multipart (vLLM) with the last (a second form naming the forbidden model) -> tenant allow-list bypass.
def test_audio_two_boundary_parameters_are_rejected(stack):
    _, w = stack
    allowed = form([FILE, part("model", b"whisper-1")], b"BND")
    smuggled = form([FILE, part("model", b"openai/whisper-large")], b"XYZ")
    r = send(w, allowed + smuggled, "multipart/form-data; boundary=BND; boundary=XYZ")
    assert r.status_code == 400, r.text


# DEFECT: an RFC 2231 `name*=UTF-8''model` part was not seen by Weir, but python's email parser (Starlette) reads it
# as a second `model` (the last wins upstream) -> the repeated-model rule and the allow-list are bypassed.
def test_audio_rfc2231_model_field_is_not_smuggled(stack):
    _, w = stack
    body = form([FILE, part("model", b"whisper-1"),
                 b"Content-Disposition: form-data; name*=UTF-8''model\r\n\r\nopenai/whisper-large"])
    r = send(w, body)
    assert r.status_code == 400 and "name*" in r.json()["error"]["message"], r.text


# DEFECTS (stop 39): a second `model` part only the upstream's parser (python-multipart through Python's
# email.message) reads as one, so the forbidden model ran on bob's allow-list: a bare LF or CR in a part's header
# line (Weir ended the line there, python-multipart only at CRLF, keeping the LF in the value); RFC 2231
# continuations (name*0=..., joined into `name`); a `;` after an unquoted \" (no quote to Python, so the split
# differs); <model> (unquoted to `model`). Each is a 400 now: the message says why.
@pytest.mark.parametrize("head,why", [
    (b'Content-Disposition: form-data; name="x"\nX: y; name="model"', "CRLF"),
    (b'Content-Disposition: form-data; name="x"\rX: y; name="model"', "CRLF"),
    (b'Content-Disposition: form-data; name="model"\nX-A: b', "CRLF"),
    (b'Content-Disposition: form-data; name*0="model"', "name*"),
    (b"Content-Disposition: form-data; name*0*=UTF-8''model", "name*"),
    (b'Content-Disposition: form-data; name*0="mo"; name*1="del"', "name*"),
    (b'Content-Disposition: form-data; a=\\"; name="model"', "more than once"),
    (b'Content-Disposition: form-data; name="note"; a=\\"; name="model"', "more than one name"),
    # (Since stop 59 refused for itself: python-multipart 0.0.30 and later read `<model>`, older ones `model`.)
    (b'Content-Disposition: form-data; name=<model>', "reads differently"),
])
def test_audio_a_model_part_only_the_upstream_would_see_is_refused(stack, head, why):
    _, w = stack
    body = form([FILE, part("model", b"whisper-1"), head + b"\r\n\r\nopenai/whisper-large"])
    r = send(w, body)
    assert r.status_code == 400 and why in r.json()["error"]["message"], r.text


# A refusal of a valid upload is a defect too: httpx (the openai SDK) writes a filename's backslash as \\\\, Go's
# mime/multipart a quote as \\", and Python reads both as Weir now does.
@pytest.mark.parametrize("filename", ["back\\slash.wav", 'it"s.wav', "a;b=c.wav", "ü ñ.wav"])
def test_audio_uploads_with_odd_filenames_pass(stack, filename):
    import openai
    _, w = stack
    c = openai.OpenAI(base_url=w.base_url + "/v1", api_key=BOB, max_retries=0)
    r = c.audio.transcriptions.create(model="whisper-1", file=(filename, b"AUDIO", "audio/wav"))
    assert r.text is not None


# DEFECT: a file part named only by RFC 2231 `filename*=` (valid for Starlette) was refused as having no filename.
def test_audio_rfc2231_filename_is_a_filename(stack):
    _, w = stack
    body = form([b"Content-Disposition: form-data; name=\"file\"; filename*=UTF-8''a.wav\r\n\r\nAUDIO",
                 part("model", b"whisper-1")])
    r = send(w, body)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------
# Speech to text: passing regression tests


@pytest.mark.parametrize("ctype", ['multipart/form-data; boundary="BND"', "Multipart/Form-Data; Boundary=BND",
                                   "multipart/form-data; boundary=BND; charset=utf-8",
                                   'multipart/form-data; foo="; boundary=XX"; boundary=BND'])
def test_audio_boundary_spellings(stack, ctype):
    _, w = stack
    r = send(w, form([FILE, part("model", b"whisper-1")]), ctype)
    assert r.status_code == 200 and r.json()["text"] == "heard 5 bytes of a.wav", r.text


def test_audio_xboundary_param_is_not_the_boundary(stack):
    _, w = stack
    body = form([FILE, part("model", b"secret-whisper")], b"XYZ") + form([FILE, part("model", b"whisper-1")], b"BND")
    r = send(w, body, "multipart/form-data; xboundary=BND; boundary=XYZ")
    assert r.status_code == 404, r.text  # Weir read the XYZ form, as the upstream will (a refused model: unknown)


@pytest.mark.parametrize("variant", [
    b'Content-Disposition: form-data; name = "model"',
    b'Content-Disposition: form-data;name="model"',
    b'CONTENT-DISPOSITION: FORM-DATA; NAME="model"',
    b'Content-Disposition : form-data; name="model"',
    b'Content-Disposition: form-data; filename="a"; name="model"',
    b'Content-Disposition: form-data; name="x"\r\nContent-Disposition: form-data; name="model"',
])
def test_audio_second_model_in_other_spellings_is_400(stack, variant):
    _, w = stack
    r = send(w, form([FILE, part("model", b"whisper-1"), variant + b"\r\n\r\nsecret-whisper"]))
    err = r.json()["error"]
    # A repeated model names it; a part with two Content-Disposition headers is refused as such, one with a space
    # before a header's colon too (python-multipart 0.0.30 and later refuse the form: stop 59).
    assert r.status_code == 400 and (err["param"] == "model" or "Content-Disposition" in err["message"]
                                     or "header name must be a token" in err["message"]), r.text


@pytest.mark.parametrize("body,status", [
    (form([FILE, part("model", b"whisper-1")], nl=b"\n"), 400),             # LF-only delimiters
    (form([FILE, part("model", b"whisper-1")], close=False), 400),          # no close delimiter
    (form([FILE]) + b"--BND\r\n" + part("model", b"secret-whisper") + b"\r\n", 400),   # model after the close
    (form([part("file", b"xx\r\n--BNDyy", "a.wav"), part("model", b"whisper-1")]), 400),
    (form([FILE, part("model", b"whisper-1"), b"X-Foo: y\r\n\r\nv"]), 400),  # part without Content-Disposition
    (form([FILE, part("model", b"whisper-1")] + [part(f"x{i}", b"v") for i in range(300)]), 400),
    (form([FILE, part("model", b"secret-whisper")]), 404),  # a model the tenant may not use: as unknown
    (form([FILE, part("model", b"whisper-1\r\n")]), 404),
])
def test_audio_malformed_forms(stack, body, status):
    _, w = stack
    r = send(w, body)
    assert r.status_code == status, r.text
    assert "error" in r.json()


def _raw(port: int, data: bytes, then: bytes | None = None, timeout: float = 5) -> bytes:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    s.sendall(data)
    out = s.recv(65536)
    if then is not None:
        s.sendall(then)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    s.close()
    return out


def test_audio_expect_100_continue_over_max_body_is_413_without_continue(stack):
    _, w = stack
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {BOB}\r\n"
            f"Content-Type: multipart/form-data; boundary=BND\r\nContent-Length: {2 << 20}\r\n"
            "Expect: 100-continue\r\n\r\n").encode()
    out = _raw(w.port, head)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert b"100 Continue" not in out


def test_audio_chunked_bodies(stack):
    _, w = stack
    from httpwire import chunked
    ok = form([FILE, part("model", b"whisper-1")])
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {BOB}\r\n"
            "Content-Type: multipart/form-data; boundary=BND\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n").encode()
    out = _raw(w.port, head + chunked(ok, 7))
    assert out.startswith(b"HTTP/1.1 200") and b"heard 5 bytes of a.wav" in out, out[:300]
    big = form([part("file", b"\0" * (2 << 20), "a.wav"), part("model", b"whisper-1")])
    out = _raw(w.port, head + chunked(big))
    assert out.startswith(b"HTTP/1.1 413"), out[:200]


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_audio_sdk_response_formats(stack, fmt):
    _, w = stack
    c = openai.OpenAI(base_url=w.v1, api_key=BOB, max_retries=0, timeout=10)
    r = c.audio.transcriptions.create(model="whisper-1", file=("a.wav", b"xyz"), response_format=fmt)
    text = r if isinstance(r, str) else r.text
    assert text.strip() == "heard 3 bytes of a.wav"


def test_audio_sdk_stream_and_translation_stream(stack):
    _, w = stack
    c = openai.OpenAI(base_url=w.v1, api_key=BOB, max_retries=0, timeout=10)
    chunks = list(c.audio.transcriptions.create(model="whisper-1", file=("a.wav", b"xyz"), stream=True))
    assert chunks
    r = send(w, form([FILE, part("model", b"whisper-1"), part("stream", b"1")]), route="translations")
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert '"object":"translation.chunk"' in r.text


# ---------------------------------------------------------------------------
# /v1/responses with a fallback: a stream failing before its first token fails over invisibly (passing)

@pytest.mark.parametrize("flags", [("--reset-after", "0"), ("--stall-after", "0", "--stall-ms", "3000")])
def test_responses_stream_fails_over_to_the_fallback_with_one_created_event(mock, weir, flags):
    bad = mock("--ttft-ms", "2", "--itl-ms", "1", "--max-tokens", "8", *flags)
    good = mock("--ttft-ms", "2", "--itl-ms", "1", "--max-tokens", "8")
    w = weir(config={
        "pools": {"a": {"endpoints": [bad.base_url], "timeouts": {"idle": "300ms"}}, "b": {"endpoints": [good.base_url]}},
        "models": {"gpt-test": {"pool": "a", "upstream_model": "mock-model",
                                "fallbacks": [{"pool": "b", "upstream_model": "mock-model"}]}},
    })
    r_id = rid()
    with httpx.stream("POST", w.base_url + "/v1/responses", timeout=15,
                      json={"model": "gpt-test", "input": "hello there", "stream": True},
                      headers={"x-request-id": r_id}) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    events = _sse(raw)
    kinds = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed", kinds
    entry = w.log_for(r_id)
    assert entry["pool"] == "b" and entry["status"] == 200


# Audio with a fallback whose upstream model name differs: the form is re-sent whole, renamed for the fallback.
def test_audio_fallback_renames_the_form_for_the_fallback_pool(mock, weir):
    from conftest import free_port
    dead = f"http://127.0.0.1:{free_port()}"  # weir-mock injects no faults on audio routes: a refused connection
    good = mock("--model", "openai/whisper-large")
    w = weir(config={
        "pools": {"a": {"endpoints": [dead]}, "b": {"endpoints": [good.base_url]}},
        "models": {"whisper-1": {"pool": "a", "upstream_model": "openai/whisper-small",
                                 "fallbacks": [{"pool": "b", "upstream_model": "openai/whisper-large"}]}},
    })
    audio = bytes(range(256)) * 64
    c = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0, timeout=15)
    r = c.audio.transcriptions.create(model="whisper-1", file=("f.wav", audio), prompt="p")
    assert r.text == f"heard {len(audio)} bytes of f.wav p"
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["pool"] == "b" and entry["status"] == 200
