"""Faults an ASan+UBSan fuzzing pass found (session 50): numbers from outside
that overflowed a clock's int64 nanoseconds or a mock's int64, and Beast's
false assertion on an empty chunked body whose last chunk came split.

The first two are undefined behaviour that the release build survives by
luck; the ASan build (``scripts/build asan weir weir-mock``, then
``WEIR_BUILD_DIR=build-asan/bin``) aborted on each, so run this file against
it too.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import wait_until
from scripted_upstream import wait_read

MOCK_FLAGS = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4", "--model", "m-up")


def chat(w, headers: dict | None = None, **body) -> httpx.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], **body}
    return httpx.post(w.v1 + "/chat/completions", json=payload, headers=headers or {}, timeout=30)


# --- JWT exp past 2262 -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def jwt_gw(module_mock, module_weir, rsa_key, tmp_path_factory):
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    jwk.update({"kid": "r1", "alg": "RS256", "use": "sig"})
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    m = module_mock(*MOCK_FLAGS)
    return module_weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "m-up"}},
        "tenants": {"acme": {}},
        "auth": {"jwt": {"jwks_file": str(path), "issuer": "https://idp.test/", "audience": "weir",
                         "leeway": "60s"}},
    })


# 253402300799 is 9999-12-31T23:59:59Z, a common "never expires"; 9223372037 is the first second past
# what int64 nanoseconds hold (2262-04-11). The exp (+ the 60 s leeway) was turned into the clock's
# nanoseconds by a duration_cast from double: undefined past that, and the ASan build aborted.
@pytest.mark.parametrize("exp", [9_000_000_000, 9_223_372_000, 9_223_372_037, 10_000_000_000, 253402300799,
                                 2**63 - 1, 2**64 - 1, 1e19, 1e300])
def test_a_validly_signed_jwt_with_a_far_future_exp_is_accepted(jwt_gw, rsa_key, exp):
    tok = jwt.encode({"iss": "https://idp.test/", "aud": "weir", "sub": "u", "tenant": "acme", "exp": exp},
                     rsa_key, algorithm="RS256", headers={"kid": "r1"})
    for _ in range(2):  # verified, then from the token cache (its expiry compared there)
        r = chat(jwt_gw, {"authorization": f"Bearer {tok}"})
        assert r.status_code == 200, r.text
    assert jwt_gw.process.alive()


def test_a_far_future_nbf_is_not_yet_valid_and_an_expired_token_still_expires(jwt_gw, rsa_key):
    now = int(time.time())
    for claims, says in [({"exp": now + 600, "nbf": 10**19}, "not valid yet"),
                         ({"exp": now - 3600}, "expired")]:
        tok = jwt.encode({"iss": "https://idp.test/", "aud": "weir", "tenant": "acme", **claims}, rsa_key,
                         algorithm="RS256", headers={"kid": "r1"})
        r = chat(jwt_gw, {"authorization": f"Bearer {tok}"})
        assert r.status_code == 401, r.text
        assert says in r.json()["error"]["message"]


# --- An empty chunked body whose last chunk arrives split ----------------------------------------------------

class SplitLastChunkUpstream:
    """Answers every request 200 with an empty chunked body: "0\\r\\n", then, once Weir has read it (no
    sleep: scripted_upstream.wait_read), the final "\\r\\n". Beast 345's chunk parser asserts n >= 5 on
    the 3 bytes it resumes with (boostorg/beast PR #2861): builds with assertions on aborted."""

    def __init__(self, content_type: str):
        self.content_type = content_type
        self.served = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn, peer):
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buf) < length:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    buf = buf[length:]
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: " + self.content_type.encode() +
                                 b"\r\ntransfer-encoding: chunked\r\n\r\n0\r\n")
                    wait_read(conn, peer)
                    conn.sendall(b"\r\n")
                    self.served += 1
            except OSError:
                return

    def close(self):
        self._sock.close()


@pytest.mark.parametrize("stream,content_type", [(False, "application/json"), (True, "text/event-stream")])
def test_an_empty_chunked_body_whose_last_chunk_comes_split_is_parsed(mock, weir, stream, content_type):
    up = SplitLastChunkUpstream(content_type)
    try:
        m = mock(*MOCK_FLAGS)
        w = weir(config={"pools": {"split": {"endpoints": [up.url], "retry": {"attempts": 1}},
                                   "ok": {"endpoints": [m.base_url]}},
                         "models": {"m": {"pool": "split", "upstream_model": "m-up"},
                                    "good": {"pool": "ok", "upstream_model": "m-up"}}}, workers=1)
        for i in range(2):
            r = chat(w, {"x-request-id": f"split-{stream}-{i}"}, stream=stream)
            if stream:
                # No event before the end: the stream's error event, as for any stream cut short.
                assert r.status_code == 200, r.text
                assert "ended the stream before it was complete" in r.text, r.text
            else:
                assert r.status_code == 200 and r.content == b"", r.text  # relayed as it came: empty
        # (The upstream counts a response once its last CRLF is sent; Weir may answer its client as soon as it
        # has read the last chunk's line, a moment before.)
        wait_until(lambda: up.served >= 2, 5, message="both last chunks sent whole")
        assert w.process.alive()
        r = chat(w, model="good")
        assert r.status_code == 200, r.text
    finally:
        up.close()


# --- weir-mock: max_tokens near int64's top ---------------------------------------------------------------

@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [2**63 - 1, 2**63 - 2, 2**64 - 1, 2**63])
def test_mock_refuses_a_max_tokens_past_the_context_length_without_overflow(mock, field, value):
    # prompt tokens + max_tokens overflowed int64 (5 + 9223372036854775807): the ASan build's UBSan
    # reported it, and the release build's wrapped sum let the request through as if it fitted.
    m = mock("--max-model-len", "64")
    r = httpx.post(m.v1 + "/chat/completions", timeout=10,
                   json={"model": "mock-model", "messages": [{"role": "user", "content": "x"}], field: value})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    want = min(value, 2**63 - 1)  # a uint64 past int64 is read as its top
    assert f"max_tokens={want} cannot be greater than max_model_len=64" in msg, msg
    assert m.process.alive()
