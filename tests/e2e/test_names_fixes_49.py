"""Defects of names and error text found by stop 49's text-encoding round: names that are not valid UTF-8 or
hold control characters, yaml-cpp's Latin-1 \\N and \\_, upstream errors relayed to Responses clients as they
came, and request-body messages that did not say what was wrong."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from conftest import binary, free_port, wait_until
from test_config_check import weir_run
from test_defect_fixes import RawUpstream

SHA = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
BASE = b"listen: 127.0.0.1:%d\npools:\n  p:\n    endpoints: [http://127.0.0.1:9]\n"  # 4 lines

# (id, YAML after BASE, line (and column), key, what the message says). Each was loaded, `weir --check` said
# ok. Bytes that are not UTF-8 yaml-cpp reads as U+FFFD: they are said where they are, with no key.
BAD = [
    ("model-raw-ff", b'models:\n  "bad\xffm": {pool: p}\n', "6:7", None, b"the file is not valid UTF-8 (byte 0xFF"),
    ("model-nul", b'models:\n  "nul\\0m": {pool: p}\n', 6, "models", b'"nul\\u0000m" holds the control character U+0000'),
    ("model-esc", b'models:\n  "esc\\em": {pool: p}\n', 6, "models", b"U+001B"),
    ("model-nel", b'models:\n  "nel\\Nm\\L": {pool: p}\n', 6, "models", b"U+0085 (NEL, YAML's \\N escape)"),
    ("model-c1-csi", b'models:\n  "c\\u009b": {pool: p}\n', 6, "models", b"U+009B"),
    ("upstream-model-nel", b'models:\n  m: {pool: p, upstream_model: "n\\Nx"}\n', 6, "models.m.upstream_model",
     b"U+0085"),
    ("upstream-model-raw", b'models:\n  m: {pool: p, upstream_model: "r\xc3(x"}\n', "6:34", None,
     b"the file is not valid UTF-8 (byte 0xC3"),
    ("alias-del", b'models:\n  m: {pool: p, aliases: ["a\\x7f"]}\n', 6, "models.m.aliases[0]", b"U+007F"),
    ("pool-name-esc", b'models:\n  m: {pool: p}\n  n: {pool: "q\\e"}\n', 7, "models.n.pool", b"U+001B"),
    ("tenant-name", b'models:\n  m: {pool: p}\ntenants:\n  "t\\xff\\0": {}\n', 8, "tenants", b"U+0000"),
    ("tenant-raw", b'models:\n  m: {pool: p}\ntenants:\n  "raw\xfft": {}\n', "8:7", None, b"not valid UTF-8"),
    ("key-id", b'models:\n  m: {pool: p}\ntenants:\n  t: {}\nauth:\n  api_keys:\n    - {id: "k\\e", sha256: '
     + SHA.encode() + b", tenant: t}\n", 11, "auth.api_keys[0].id", b"U+001B"),
    ("key-tenant", b'models:\n  m: {pool: p}\ntenants:\n  t: {}\nauth:\n  api_keys:\n    - {id: k, sha256: '
     + SHA.encode() + b', tenant: "t\\0"}\n', 11, "auth.api_keys[0].tenant", b"U+0000"),
    ("allow-list", b'models:\n  m: {pool: p}\ntenants:\n  t: {models: ["m\\e"]}\n', 8, "tenants.t.models[0]",
     b"U+001B"),
    ("comment-raw", b"# caf\xe9\nmodels:\n  m: {pool: p}\n", "5:6", None, b"the file is not valid UTF-8 (byte 0xE9)"),
]


@pytest.mark.parametrize("name,extra,line,key,says", BAD, ids=[b[0] for b in BAD])
def test_names_that_are_not_utf8_or_hold_control_characters_are_refused(tmp_path, name, extra, line, key, says):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(BASE % free_port() + extra)
    r = weir_run("--config", path, "--check")
    err = r.stderr.encode("utf-8", "surrogateescape")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{path}:{line}:".encode() in err, err
    if key:
        assert f" {key}: ".encode() in err, err
    assert says in err, err
    # The message itself is safe to print: valid UTF-8, no control byte but its newline.
    err.decode("utf-8")
    assert not any(c < 0x20 and c != 0x0A for c in err), err


def start_weir(processes, path, port):
    proc = processes.start([binary("weir"), "--config", path], port, name="weir")
    wait_until(lambda: "weir: listening on" in proc.log() or not proc.alive(), 10, message="weir's start-up line")
    return proc


# yaml-cpp 0.7 decodes \_ (U+00A0) and \N (U+0085) to the single Latin-1 bytes 0xA0 and 0x85: a model owned by
# "x\_y" was listed as "x\ufffdy". They are re-encoded as UTF-8 at load (and \N is then a control character).
def test_yaml_no_break_space_escape_is_the_character(processes, tmp_path):
    port = free_port()
    path = tmp_path / "w.yaml"
    path.write_bytes(BASE % port + b'models:\n  "a\\_b": {pool: p, owned_by: "x\\_y"}\n')
    start_weir(processes, path, port)
    r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    assert r.status_code == 200
    (model,) = r.json()["data"]
    assert model["id"] == "a\u00a0b" and model["owned_by"] == "x\u00a0y", model  # (\L, U+2028, is no name's since stop 62)


# A runtime key's name is a name too: a control character in it is refused with the admin API's 400.
def test_admin_api_refuses_control_characters_in_a_key_name(weir):
    admin_port = free_port()
    weir(config={"pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}}, "models": {"m": {"pool": "p"}},
                 "tenants": {"acme": {}},
                 "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
         env={"WEIR_TEST_ADMIN_TOKEN": "names-49-admin-token-0123456789"})
    base = f"http://127.0.0.1:{admin_port}"
    hdr = {"authorization": "Bearer names-49-admin-token-0123456789"}

    def ready() -> bool:
        try:
            return httpx.get(base + "/ready", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False

    wait_until(ready, 5, message="admin listener")
    for bad in ["a\x00b", "\x1b[31mred", "del\x7f", "c1\x9b"]:
        r = httpx.post(base + "/admin/v1/keys", json={"tenant": "acme", "name": bad}, headers=hdr, timeout=5)
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert r.json()["error"]["param"] == "name" and "control character" in r.json()["error"]["message"], r.text
    ok = httpx.post(base + "/admin/v1/keys", json={"tenant": "acme", "name": "caf\u00e9 \u6a21"}, headers=hdr,
                    timeout=5)
    assert ok.status_code in (200, 201), ok.text
    kid = ok.json()["id"]
    r = httpx.patch(base + f"/admin/v1/keys/{kid}", json={"name": "x\x1by"}, headers=hdr, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "name", r.text


def _json_answer(status: int, body: bytes) -> bytes:
    return (b"HTTP/1.1 %d Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, len(body)) + body)


# vLLM's answers to a request it refuses: its older shape (top-level object "error"), the same with bytes that
# are not UTF-8 in the message, and the current OpenAI shape.
LEGACY = b'{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}'
LEGACY_BAD = b'{"object":"error","message":"bad \xff\xc3 byte","type":"BadRequestError","param":null,"code":400}'
CURRENT = b'{"error":{"message":"no such tool","type":"invalid_request_error","param":"tools","code":"bad_tool"}}'


# /v1/responses relayed the upstream's error body as it came: vLLM's older {"object":"error",...} reached the
# Responses client (its SDK reads `error.message`), ill-formed UTF-8 with it. docs/protocols.md says
# Responses errors keep OpenAI's shape; /v1/messages already reshaped them into Anthropic's.
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("body,status,message,etype,param,code", [
    (LEGACY, 400, "max_tokens is too large", "BadRequestError", None, None),
    # (Since stop 50 an upstream's ill-formed UTF-8 is repaired to U+FFFD before anything reads it, as Python's
    # errors="replace" decodes it, so the message survives.)
    (LEGACY_BAD, 400, "bad \ufffd\ufffd byte", "BadRequestError", None, None),
    (CURRENT, 422, "no such tool", "invalid_request_error", "tools", "bad_tool"),
    # (Since stop 60 a body that is no JSON object is the message, cut to 256 bytes, as on every OpenAI route.)
    (b"<html>Bad Request</html>", 400, "Upstream answered 400: <html>Bad Request</html>", "invalid_request_error",
     None, None),
], ids=["legacy", "legacy-not-utf8", "openai-shape", "not-json"])
def test_responses_reshapes_upstream_errors_into_openais(weir, stream, body, status, message, etype, param, code):
    up = RawUpstream(lambda h, b: _json_answer(status, body))
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}},
                         "models": {"m": {"pool": "p"}}}, workers=1)
        r = httpx.post(w.v1 + "/responses", json={"model": "m", "input": "hi", "stream": stream}, timeout=10)
        assert r.status_code == status, r.content
        r.content.decode("utf-8")  # never ill-formed UTF-8
        assert r.headers["content-type"].startswith("application/json")
        assert r.json() == {"error": {"message": message, "type": etype, "param": param, "code": code}}, r.content
    finally:
        up.close()


def _raw_post(port: int, path: str, body: bytes) -> tuple[int, dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\n"
                  b"connection: close\r\ncontent-length: %d\r\n\r\n" % (path.encode(), len(body)) + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, rest = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(rest)


# A lone surrogate escape was "not valid JSON: syntax error." ("\ud800") or "illegal trailing surrogate."
# ("\udc00"), and ill-formed UTF-8 "syntax error.": the message now says which, on every route, in the
# route's shape.
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                                  "/v1/messages"])
def test_body_messages_name_invalid_utf8_and_lone_surrogates(weir, path):
    w = weir(config={"pools": {"p": {"endpoints": ["http://127.0.0.1:9"]}}, "models": {"m": {"pool": "p"}}},
             workers=1)
    port = int(w.base_url.rsplit(":", 1)[1])
    field = {"/v1/chat/completions": b'"messages":[{"role":"user","content":"%s"}]', "/v1/completions": b'"prompt":"%s"',
             "/v1/embeddings": b'"input":"%s"', "/v1/responses": b'"input":"%s"',
             "/v1/messages": b'"max_tokens":5,"messages":[{"role":"user","content":"%s"}]'}[path]
    for text, says in [(b"\\ud800", "lone surrogate escape"), (b"\\udc00", "lone surrogate escape"),
                       (b"a\\ud800\\u0041", "lone surrogate escape"), (b"x\xff", "invalid UTF-8 (byte 0xFF"),
                       (b"\xed\xa0\x80", "invalid UTF-8 (byte 0xED")]:
        status, err = _raw_post(port, path, b'{"model":"m",' + field % text + b"}")
        assert status == 400, (text, err)
        if path == "/v1/messages":
            assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        else:
            assert err["error"]["type"] == "invalid_request_error", err
        assert err["error"]["message"].startswith("The request body is not valid JSON: " + says), (text, err)


# A key record in Redis (written by anyone with access to it) is a name's source too: an id or tenant with a
# control character was served, its id a metrics label and an access-log field. Now refused as one that does
# not read, and said once, escaped.
def test_a_redis_key_record_whose_id_is_no_name_is_refused(mock, weir, redis):
    import hashlib

    from test_redis_keys import MOCK_FLAGS, chat, config, prefix

    m = mock(*MOCK_FLAGS)
    w = weir(config=config(m, redis, key_cache_ttl="300ms", key_negative_ttl="100ms"))

    def hset(key: str, *fields: str) -> None:
        redis.cli("HSET", prefix(redis) + "key:" + hashlib.sha256(key.encode()).hexdigest(), *fields)

    hset("sk-weir-names-ok", "id", "ok-key", "tenant", "acme")
    assert chat(w, "sk-weir-names-ok").status_code == 200
    hset("sk-weir-names-esc", "id", "k\x1b[31mred", "tenant", "acme")
    assert chat(w, "sk-weir-names-esc").status_code == 401
    wait_until(lambda: "its id field is no name" in w.process.log(), 5, message="the record logged")
    assert "\x1b" not in w.process.log()
    hset("sk-weir-names-c1", "id", "c1-key", "tenant", "acme", "tier", "t\u009b")
    assert chat(w, "sk-weir-names-c1").status_code == 401
