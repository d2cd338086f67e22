"""Speech-to-text through Weir (docs/protocols.md, "vLLM's other routes"):
/v1/audio/transcriptions and /v1/audio/translations take multipart/form-data
bodies, are routed by their `model` field (renamed for the upstream), stream
as SSE when `stream=true`, and get the same auth, limits, metrics and one log
line as the JSON routes. The client is the official openai SDK where it has
the call, httpx for the forms it cannot build."""

from __future__ import annotations

import hashlib
import io
import json

import httpx
import openai
import pytest

AUDIO = bytes(range(256)) * 400  # 102,400 bytes: CR, LF and '-' bytes included


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def served(mock, weir):
    m = mock("--model", "openai/whisper-small")
    w = weir(config={
        "server": {"max_body": "2MiB"},
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"whisper-1": {"pool": "p", "upstream_model": "openai/whisper-small"}},
        "tenants": {"acme": {"limits": {"requests_per_minute": 1000}}},
        "auth": {"api_keys": [{"id": "acme-1", "sha256": sha("sk-acme"), "tenant": "acme"}]},
    }, workers=1)  # one worker: the log lines come in request order
    return m, w


def client(w) -> openai.OpenAI:
    return openai.OpenAI(base_url=w.base_url + "/v1", api_key="sk-acme", max_retries=0)


@pytest.mark.parametrize("route", ["transcriptions", "translations"])
def test_the_sdk_gets_its_transcript_with_the_model_renamed(served, route):
    _, w = served
    api = getattr(client(w).audio, route)
    r = api.create(model="whisper-1", file=("talk.wav", io.BytesIO(AUDIO), "audio/wav"), prompt="Weir rocks")
    # The mock only serves openai/whisper-small: the rename happened, and the whole file arrived.
    assert r.text == f"heard {len(AUDIO)} bytes of talk.wav Weir rocks"
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["path"] == f"/v1/audio/{route}" and entry["status"] == 200
    assert entry["model"] == "whisper-1" and entry["pool"] == "p" and entry["tenant"] == "acme"


def test_text_response_format_passes_through(served):
    _, w = served
    r = client(w).audio.transcriptions.create(model="whisper-1", file=("a.wav", AUDIO), response_format="text")
    assert r.strip() == f"heard {len(AUDIO)} bytes of a.wav"


def test_a_form_without_a_rename_arrives_byte_for_byte(mock, weir):
    m = mock("--model", "whisper")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p"})
    files = {"file": ("b.wav", AUDIO, "audio/wav")}
    req = httpx.Request("POST", w.base_url + "/v1/audio/transcriptions", files=files,
                        data={"model": "whisper", "language": "en"}, headers={"x-mock-echo": "1"})
    body = req.read()
    r = httpx.Client(timeout=10).send(req)
    assert r.status_code == 200, r.text
    assert r.headers["x-mock-body-bytes"] == str(len(body))
    assert r.headers["x-mock-body-sha256"] == hashlib.sha256(body).hexdigest()


def sse_datas(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def test_a_stream_relays_its_chunks_and_its_usage_reaches_the_log(served):
    _, w = served
    auth = {"authorization": "Bearer sk-acme"}
    r = httpx.post(w.base_url + "/v1/audio/transcriptions", headers=auth, timeout=10,
                   files={"file": ("s.wav", AUDIO)}, data={"model": "whisper-1", "stream": "true"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    datas = sse_datas(r.text)
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    # Weir asked for the usage chunk on the client's behalf, and dropped it from the client's stream.
    assert all(c["choices"] for c in chunks), chunks
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text == f"heard {len(AUDIO)} bytes of s.wav"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["completion_tokens"] == 5 and entry["prompt_tokens"] > 0

    # A client that asks for it gets it.
    r = httpx.post(w.base_url + "/v1/audio/transcriptions", headers=auth, timeout=10,
                   files={"file": ("s.wav", AUDIO)},
                   data={"model": "whisper-1", "stream": "true", "stream_include_usage": "true"})
    chunks = [json.loads(d) for d in sse_datas(r.text)[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_bad_forms_auth_and_methods(served):
    _, w = served
    auth = {"authorization": "Bearer sk-acme"}
    url = w.base_url + "/v1/audio/transcriptions"
    # JSON instead of a form: 400 in OpenAI's shape
    r = httpx.post(url, headers=auth, json={"model": "whisper-1"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "multipart/form-data" in r.json()["error"]["message"]
    # no file
    r = httpx.post(url, headers=auth, files={"model": (None, "whisper-1")}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    # a bad stream flag
    r = httpx.post(url, headers=auth, files={"file": ("a.wav", b"x")}, data={"model": "whisper-1", "stream": "x"},
                   timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    # a repeated model: the upstream would read the last, Weir routes by the first
    r = httpx.post(url, headers=auth, files=[("file", ("a.wav", b"x")), ("model", (None, "whisper-1")),
                                             ("model", (None, "other"))], timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    # a repeated prompt: the token estimate would be the first's (a short one ahead of a long one passed a limit)
    r = httpx.post(url, headers=auth, files=[("file", ("a.wav", b"x")), ("model", (None, "whisper-1")),
                                             ("prompt", (None, "hi")), ("prompt", (None, "word " * 2000))],
                   timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    # a truncated form
    r = httpx.post(url, headers={**auth, "content-type": "multipart/form-data; boundary=zz"},
                   content=b"--zz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc",
                   timeout=10)
    assert r.status_code == 400
    # an unknown model: 404 from Weir; no model and no default pool: 400 naming it
    r = httpx.post(url, headers=auth, files={"file": ("a.wav", b"x")}, data={"model": "nope"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(url, headers=auth, files={"file": ("a.wav", b"x")}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    # no key: 401; GET: 405
    r = httpx.post(url, files={"file": ("a.wav", b"x")}, data={"model": "whisper-1"}, timeout=10)
    assert r.status_code == 401
    r = httpx.get(url, headers=auth, timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    # a file over server.max_body: 413
    r = httpx.post(url, headers=auth, files={"file": ("big.wav", b"\0" * (3 << 20))}, data={"model": "whisper-1"},
                   timeout=10)
    assert r.status_code == 413
    entries = w.wait_log(lambda es: len(es) >= 11)
    assert [e["status"] for e in entries] == [400, 400, 400, 400, 400, 400, 404, 400, 401, 405, 413]
    assert all(e["upstream_ms"] is None for e in entries), "none of them reached the upstream"


def test_requests_count_against_the_tenants_limit(mock, weir):
    m = mock("--model", "whisper")
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"whisper": {"pool": "p"}},
        "tenants": {"acme": {"limits": {"requests_per_minute": 2}}},
        "auth": {"api_keys": [{"id": "acme-1", "sha256": sha("sk-acme"), "tenant": "acme"}]},
    })
    c = openai.OpenAI(base_url=w.base_url + "/v1", api_key="sk-acme", max_retries=0)
    for _ in range(2):
        c.audio.transcriptions.create(model="whisper", file=("a.wav", b"abc"))
    with pytest.raises(openai.RateLimitError):
        c.audio.transcriptions.create(model="whisper", file=("a.wav", b"abc"))
