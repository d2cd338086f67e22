"""Body capture (request_log.capture_bodies) end to end: the request and response bodies of the tenants that
opted in, stored with their record and shown by GET /admin/v1/requests/{id}; capped with a flag; never the
request's key or token, in a header or pasted into the body; nothing for the other tenants."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid

import httpx
import pytest

from conftest import free_port, wait_until

MOCK_FLAGS = ("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "64", "--model", "m-up")
TOKEN = "admin-test-token-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
ACME_KEY = "sk-acme-Zx81kQ0pLm4Tn7Wc2Ve5"
TINY_KEY = "sk-tiny-Pq93mN2bVc6Xz1Lk4Jh8"
PLAIN_KEY = "acme-Q7vR2mX9pL4tK8wZ"  # in no key pattern's shape: only the exact redaction of the credential finds it


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def gw(module_mock, module_weir, tmp_path_factory):
    m = module_mock(*MOCK_FLAGS)
    port = free_port()
    db = tmp_path_factory.mktemp("bodies") / "requests.db"
    w = module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "m-up", "default_max_tokens": 8}},
        "tenants": {"acme": {}, "tiny": {}},
        "auth": {"api_keys": [{"id": "acme-1", "sha256": sha(ACME_KEY), "tenant": "acme"},
                              {"id": "tiny-1", "sha256": sha(TINY_KEY), "tenant": "tiny"},
                              {"id": "acme-2", "sha256": sha(PLAIN_KEY), "tenant": "acme"}]},
        "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms",
                        "capture_bodies": {"tenants": ["acme"], "max_request_bytes": 400,
                                           "max_response_bytes": "4KiB"}},
        "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
    }, env=ENV)
    return w, f"http://127.0.0.1:{port}/admin/v1/requests"


def stored(admin_base: str, request_id: str) -> dict:
    def get():
        r = httpx.get(f"{admin_base}/{request_id}", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
        return r.json() if r.status_code == 200 else None
    return wait_until(get, 10, message=f"stored record {request_id}")


def rid() -> str:
    return "bd-" + uuid.uuid4().hex[:12]


def test_an_opted_in_tenants_bodies_are_stored_with_its_record(gw):
    w, admin = gw
    i = rid()
    client = w.client(api_key=ACME_KEY)
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}],
                                         extra_headers={"x-request-id": i})
    rec = stored(admin, i)
    req, res = rec["bodies"]["request"], rec["bodies"]["response"]
    assert json.loads(req["text"])["messages"] == [{"role": "user", "content": "hi there"}]
    assert req["truncated"] is False and req["size"] == len(req["text"].encode())
    assert json.loads(res["text"])["choices"][0]["message"]["content"] == out.choices[0].message.content
    # The list stays light: bodies only on the one-request route.
    r = httpx.get(admin, params={"tenant": "acme"}, headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert all("bodies" not in x for x in r.json()["data"])


def test_a_stream_is_captured_as_the_client_read_it_and_capped(gw):
    w, admin = gw
    i = rid()
    client = w.client(api_key=ACME_KEY)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "stream"}], stream=True, max_tokens=8,
        extra_headers={"x-request-id": i}) if c.choices)
    res = stored(admin, i)["bodies"]["response"]
    assert res["text"].startswith("data: {") and res["text"].rstrip().endswith("data: [DONE]")
    assert res["size"] == len(res["text"].encode()) and not res["truncated"]
    assert text.strip() and text.split()[0] in res["text"]
    # A long answer: the first 4 KiB, flagged.
    j = rid()
    list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "long"}], stream=True,
                                        max_tokens=200, extra_headers={"x-request-id": j, "x-mock-itl-ms": "0"}))
    res = stored(admin, j)["bodies"]["response"]
    assert res["truncated"] is True and len(res["text"].encode()) <= 4096 and res["size"] > 4096


def test_keys_and_tokens_never_reach_the_store(gw):
    w, admin = gw
    i = rid()
    other = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx"
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
    prompt = f"my key is {ACME_KEY} and {other}, token Bearer abcdefgh12345678 and {jwt}"
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "api_key": "hunter2-secret",
            "metadata": {"password": "p@ss"}}
    r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=30,
                   headers={"authorization": f"Bearer {ACME_KEY}", "x-request-id": i})
    assert r.status_code == 200
    rec = stored(admin, i)
    text = json.dumps(rec)
    for secret in (ACME_KEY, other, "abcdefgh12345678", jwt, "hunter2-secret", "p@ss"):
        assert secret not in text, secret
    stored_prompt = json.loads(rec["bodies"]["request"]["text"])["messages"][0]["content"]
    assert stored_prompt.startswith("my key is [REDACTED] and [REDACTED]")
    # A key cut by the cap is still not stored: its prefix goes too.
    j = rid()
    pad = "x" * (400 - len('{"model":"m","messages":[{"role":"user","content":"') - 10)
    body = {"model": "m", "messages": [{"role": "user", "content": pad + ACME_KEY}]}
    httpx.post(w.v1 + "/chat/completions", json=body, timeout=30,
               headers={"authorization": f"Bearer {ACME_KEY}", "x-request-id": j})
    req = stored(admin, j)["bodies"]["request"]
    assert req["truncated"] is True and ACME_KEY[:6] not in req["text"] and req["text"].endswith("[REDACTED]")


@pytest.mark.parametrize("authorization", ["Bearer\t{key}", "bearer \t {key}", "BEARER {key}"])
def test_the_key_is_redacted_whatever_spelling_of_bearer_authenticated_it(gw, authorization):
    # "Bearer<TAB>KEY" authenticated (RFC 9110's whitespace) but the capture looked for "bearer " alone: the
    # key a client pasted into its prompt was stored in clear.
    w, admin = gw
    i = rid()
    r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": f"my key is {PLAIN_KEY}"}]},
                   headers={"authorization": authorization.format(key=PLAIN_KEY), "x-request-id": i})
    assert r.status_code == 200, r.text
    rec = stored(admin, i)
    assert rec["tenant"] == "acme" and PLAIN_KEY not in json.dumps(rec), rec


def test_the_key_spelled_with_json_escapes_never_reaches_the_store(gw):
    # JSON text may spell any character as \\u00XX (RFC 8259 §7): the stored body is JSON text, so its decoded
    # form must not hold the key either.
    w, admin = gw
    spellings = {
        "all": "".join(f"\\u{ord(c):04x}" for c in ACME_KEY),
        "one": ACME_KEY[:-1] + f"\\u{ord(ACME_KEY[-1]):04x}",
        "upper": ACME_KEY.replace("sk-", "\\u0073k\\u002D", 1),
    }
    for name, spelled in spellings.items():
        i = rid()
        raw = '{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"key ' + spelled + ' ok"}]}'
        r = httpx.post(w.v1 + "/chat/completions", content=raw, timeout=30,
                       headers={"authorization": f"Bearer {ACME_KEY}", "x-request-id": i,
                                "content-type": "application/json"})
        assert r.status_code == 200, (name, r.text)
        text = stored(admin, i)["bodies"]["request"]["text"]
        decoded = json.loads(text)["messages"][0]["content"]
        assert ACME_KEY not in decoded and ACME_KEY[-12:] not in decoded, (name, text)
        assert decoded == "key [REDACTED] ok", (name, text)


def test_other_tenants_and_refused_requests_have_no_bodies(gw):
    w, admin = gw
    i = rid()
    assert w.client(api_key=TINY_KEY).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-request-id": i}).choices
    assert "bodies" not in stored(admin, i)
    j = rid()
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": []}, timeout=30,
                   headers={"authorization": "Bearer sk-wrong-0123456789abcdef", "x-request-id": j})
    assert r.status_code == 401
    assert "bodies" not in stored(admin, j)


def test_an_error_weir_answers_is_captured(gw):
    w, admin = gw
    i = rid()
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "nope", "messages": []}, timeout=30,
                   headers={"authorization": f"Bearer {ACME_KEY}", "x-request-id": i})
    assert r.status_code == 404
    res = stored(admin, i)["bodies"]["response"]
    assert json.loads(res["text"]) == r.json()


def test_a_binary_upload_is_stored_as_base64(gw):
    w, admin = gw
    i = rid()
    audio = bytes(range(256)) * 4
    client = w.client(api_key=ACME_KEY)
    client.audio.transcriptions.create(model="m", file=("a.wav", audio, "audio/wav"),
                                       extra_headers={"x-request-id": i})
    req = stored(admin, i)["bodies"]["request"]
    assert "text" not in req and req["truncated"] is True and req["size"] > len(audio)
    raw = base64.b64decode(req["base64"])
    assert len(raw) == 400 and raw.startswith(b"--") and b"\x80\x81" in raw


def test_a_key_the_model_repeats_is_not_stored_from_a_stream_or_an_answer(module_weir, tmp_path_factory):
    # The request's own key, in a shape no pattern knows, repeated by the model: taken out of the stored
    # response by its exact value, for a stream (whose request head Weir frees once the stream commits) as
    # for a whole answer.
    from scripted_upstream import ScriptedUpstream
    up = ScriptedUpstream().start()
    try:
        key = "acme-Q7vR2mX9pL4tK8wZ"
        port = free_port()
        db = tmp_path_factory.mktemp("echo") / "requests.db"
        w = module_weir(config={
            "pools": {"p": {"endpoints": [up.base_url]}},
            "models": {"m": {"pool": "p"}},
            "tenants": {"acme": {}},
            "auth": {"api_keys": [{"id": "acme-1", "sha256": sha(key), "tenant": "acme"}]},
            "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms",
                            "capture_bodies": {"tenants": ["acme"]}},
            "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
        }, env=ENV)
        admin = f"http://127.0.0.1:{port}/admin/v1/requests"
        client = w.client(api_key=key)
        for stream in (True, False):
            i = rid()
            messages = [{"role": "user", "content": f"say {key} back"}]
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    model="m", messages=messages, stream=True,
                    extra_headers={"x-request-id": i, "x-script": "vllm-echo"}) if c.choices)
            else:
                text = client.chat.completions.create(
                    model="m", messages=messages,
                    extra_headers={"x-request-id": i, "x-script": "vllm-echo"}).choices[0].message.content
            assert text == f"say {key} back."  # the client gets the answer as it is
            bodies = stored(admin, i)["bodies"]
            assert key not in json.dumps(bodies), (stream, bodies)
            assert "[REDACTED]" in bodies["request"]["text"] and "[REDACTED]" in bodies["response"]["text"], bodies
    finally:
        up.stop()
