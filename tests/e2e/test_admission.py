"""Identity and admission end to end: API keys, JWT with a JWKS (file and URL,
key rotation), tenants' model lists, token-bucket limits with OpenAI's
x-ratelimit-* headers, concurrent-stream caps and budgets. One replica, local
limits (the Redis-backed mode has its own tests)."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import socket
import threading
import time

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from conftest import free_port, wait_until

MOCK_FLAGS = ("--ttft-ms", "5", "--itl-ms", "2", "--max-tokens", "8", "--model", "m-up")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def base_config(mock, **extra) -> dict:
    cfg = {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        # default_max_tokens: the mock generates 8 tokens, so a request without
        # max_tokens reserves its real worst case against budgets.
        "models": {"m": {"pool": "p", "upstream_model": "m-up", "aliases": ["m-alias"], "default_max_tokens": 8},
                   "other": {"pool": "p", "upstream_model": "m-up", "default_max_tokens": 8}},
        "tenants": {
            "acme": {"models": ["m"], "limits": {"requests_per_minute": 1000}},
            "tiny": {"limits": {"requests_per_minute": 3}},
            "capped": {"limits": {"max_concurrent_streams": 2}},
            "poor": {"budget": {"usd": 0.00005}},
        },
        "auth": {"api_keys": [
            {"id": "acme-1", "sha256": sha("sk-acme"), "tenant": "acme"},
            {"id": "tiny-1", "sha256": sha("sk-tiny"), "tenant": "tiny"},
            {"id": "capped-1", "sha256": sha("sk-capped"), "tenant": "capped"},
            {"id": "poor-1", "sha256": sha("sk-poor"), "tenant": "poor"},
        ]},
        # 1 USD per 1M input tokens, 2 USD per 1M output tokens.
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
    }
    cfg.update(extra)
    return cfg


def chat(w, key: str | None, model: str = "m", **body) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    payload = {"model": model, "messages": [{"role": "user", "content": "hello there"}], **body}
    return httpx.post(w.v1 + "/chat/completions", json=payload, headers=headers, timeout=30)


def assert_openai_error(r: httpx.Response, status: int, code: str | None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code
    return err


@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    m = module_mock(*MOCK_FLAGS)
    return module_weir(config=base_config(m)), m


def test_missing_and_bad_credentials_get_401(gw):
    w, _ = gw
    err = assert_openai_error(chat(w, None), 401, "invalid_api_key")
    assert "API key" in err["message"]
    err = assert_openai_error(chat(w, "sk-nope"), 401, "invalid_api_key")
    assert "sk-nope" not in err["message"]  # never echo a credential
    # x-api-key works as well as Authorization: Bearer.
    r = httpx.post(w.v1 + "/chat/completions", headers={"x-api-key": "sk-acme"},
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}]}, timeout=30)
    assert r.status_code == 200, r.text
    # The SDK's own error types see the right classes.
    with pytest.raises(openai.AuthenticationError):
        w.client(api_key="sk-wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_model_outside_the_tenants_list_gets_404_and_models_list_is_filtered(gw):
    w, _ = gw
    # Answered as an unknown model (no tenant learns what exists for others); the log says why.
    r = chat(w, "sk-acme", model="other")
    assert_openai_error(r, 404, "model_not_found")
    assert w.log_for(r.headers["x-request-id"])["error"]["code"] == "model_not_allowed"
    # An alias of an allowed model is allowed: the list names the configured model.
    assert chat(w, "sk-acme", model="m-alias").status_code == 200
    ids = [m.id for m in w.client(api_key="sk-acme").models.list().data]
    assert ids == ["m", "m-alias"]
    ids = {m.id for m in w.client(api_key="sk-tiny").models.list().data}
    assert ids == {"m", "m-alias", "other"}
    assert httpx.get(w.v1 + "/models", timeout=10).status_code == 401


def test_ratelimit_headers_on_success_and_429_with_retry_after(gw):
    w, _ = gw
    seen = []
    for _ in range(3):
        r = chat(w, "sk-tiny")
        assert r.status_code == 200, r.text
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        seen.append(int(r.headers["x-ratelimit-remaining-requests"]))
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    assert seen == sorted(seen, reverse=True) and seen[-1] == 0, seen
    r = chat(w, "sk-tiny")
    err = assert_openai_error(r, 429, "rate_limit_exceeded")
    assert err["type"] == "requests"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    # The SDK maps it to RateLimitError.
    with pytest.raises(openai.RateLimitError):
        w.client(api_key="sk-tiny").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    entry = w.log_for(r.headers["x-request-id"])
    assert entry["status"] == 429 and entry["tenant"] == "tiny" and entry["key_id"] == "tiny-1"
    assert "sk-tiny" not in json.dumps(w.log_entries())


def test_concurrent_stream_cap_and_release_on_every_path(gw):
    w, m = gw
    client = w.client(api_key="sk-capped")
    # Two slow streams hold both slots; a third is refused; when they end the slots come back.
    slow = {"x-mock-ttft-ms": "3000"}  # (long enough that both still run when the third asks on a loaded machine)
    results: list[object] = []

    def run():
        try:
            s = client.chat.completions.create(model="m", stream=True, messages=[{"role": "user", "content": "x"}],
                                               extra_headers=slow)
            results.append("".join(c.choices[0].delta.content or "" for c in s if c.choices))
        except Exception as e:  # noqa: BLE001
            results.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: m.metric("vllm:num_requests_running") >= 2, 5, message="two streams running")
    r = chat(w, "sk-capped")
    err = assert_openai_error(r, 429, "rate_limit_exceeded")
    assert "concurrent" in err["message"]
    for t in threads:
        t.join(10)
    assert all(isinstance(x, str) and x for x in results), results
    # A client that disconnects mid-stream frees its slot too.
    with socket.create_connection(("127.0.0.1", w.port)) as s:
        body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sk-capped\r\n"
                  b"x-mock-ttft-ms: 5000\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.recv(1)  # the head arrives before the first token
    for _ in range(2):
        assert chat(w, "sk-capped").status_code == 200


def test_budget_cut_off_with_insufficient_quota(gw):
    w, _ = gw
    # Each request costs prompt × 1 + 8 completion tokens × 2 USD per 1M: a few
    # 1e-5 USD; the budget is 5e-5 USD, so a handful pass and then it is spent.
    statuses = []
    for _ in range(10):
        r = chat(w, "sk-poor")
        statuses.append(r.status_code)
        if r.status_code == 429:
            err = assert_openai_error(r, 429, "insufficient_quota")
            assert err["type"] == "insufficient_quota"
            break
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
    with pytest.raises(openai.RateLimitError):
        w.client(api_key="sk-poor").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    # A request's log line is written once its answer has gone out: wait for every served one's.
    served = statuses.count(200)
    entries = w.wait_log(lambda es: sum(e.get("tenant") == "poor" and e["status"] == 200 for e in es) >= served)
    spent = [e["spend_usd"] for e in entries if e.get("tenant") == "poor" and e["status"] == 200]
    assert spent and all(s > 0 for s in spent)
    assert sum(spent) >= 0.00005 * 0.5


# --- Budgets under concurrency (docs/admission.md, "Budgets") -----------------

# One request: "hello there" (11 bytes, 1 message) and max_tokens 8 at $1 / $2
# per 1M tokens. Weir reserves ceil(11/4) + 8 template tokens = 11 prompt tokens
# and 8 completion tokens: $0.000027. The mock uses 6 prompt tokens (4 per
# message + 2 words) and 8 completion tokens: $0.000022.
WORST_USD = 11e-6 + 16e-6
REAL_USD = 6e-6 + 16e-6


def budget_config(mock, budget_usd: float, on_key: bool) -> dict:
    scope = {"budget": {"usd": budget_usd}}
    return {
        "pools": {"p": {"endpoints": [mock.base_url]}},
        "models": {"m": {"pool": "p", "upstream_model": "m-up"}},
        "tenants": {"t": {} if on_key else scope},
        "auth": {"api_keys": [{"id": "k", "sha256": sha("sk-k"), "tenant": "t", **(scope if on_key else {})}]},
        "pricing": {"*": {"input": 1.0, "output": 2.0}},
    }


async def concurrent_chats(url: str, key: str, n: int, **body) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        payload = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hello there"}], **body}
        return await asyncio.gather(*(client.post(url + "/v1/chat/completions", json=payload,
                                                  headers={"authorization": f"Bearer {key}"}) for _ in range(n)))


@pytest.mark.parametrize("on_key", [False, True], ids=["tenant", "key"])
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_concurrent_requests_cannot_overspend_a_budget(mock, weir, on_key, stream):
    # The reported fault: every one of N simultaneous requests passed a budget
    # that covers a few, because spend was added only when a request ended.
    m = mock("--ttft-ms", "300", "--itl-ms", "5", "--max-tokens", "8", "--model", "m-up")
    k = 3
    budget = k * WORST_USD + WORST_USD / 2
    w = weir(config=budget_config(m, budget, on_key), workers=2)
    responses = asyncio.run(concurrent_chats(w.base_url, "sk-k", 16, stream=stream))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert 1 <= statuses.count(200) <= k, statuses
    for r in responses:
        if r.status_code == 429:
            assert_openai_error(r, 429, "insufficient_quota")
    entries = w.wait_log(lambda es: len(es) >= 16)
    served = [e for e in entries if e["status"] == 200]
    assert len(served) == statuses.count(200)
    assert all(e["prompt_tokens"] is not None for e in served), served
    assert sum(e["spend_usd"] for e in served) <= budget + 1e-12
    # The upstream saw only the admitted ones.
    assert m.metric("vllm:request_success_total") == statuses.count(200)


def test_a_budget_of_zero_freezes_the_tenant(mock, weir):
    m = mock(*MOCK_FLAGS)
    w = weir(config=budget_config(m, 0, on_key=False))
    err = assert_openai_error(chat(w, "sk-k", max_tokens=1), 429, "insufficient_quota")
    assert "$0" in err["message"]
    assert m.metric("vllm:request_success_total") == 0


def test_a_budget_below_one_worst_case_admits_nothing(mock, weir):
    m = mock(*MOCK_FLAGS)
    w = weir(config=budget_config(m, WORST_USD * 0.9, on_key=True))
    statuses = [r.status_code for r in asyncio.run(concurrent_chats(w.base_url, "sk-k", 8))]
    assert statuses == [429] * 8, statuses
    # A request with a smaller worst case (max_tokens 2) still fits.
    assert chat(w, "sk-k", max_tokens=2).status_code == 200


def test_an_upstream_error_without_usage_is_not_charged(mock, weir):
    m = mock(*MOCK_FLAGS)
    w = weir(config=budget_config(m, 1.0, on_key=False))
    for status in (500, 503, 400):
        r = httpx.post(w.v1 + "/chat/completions", headers={"authorization": "Bearer sk-k", "x-mock-status": str(status)},
                       json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hello there"}]},
                       timeout=30)
        assert r.status_code == status
    assert chat(w, "sk-k").status_code == 200
    entries = w.wait_log(lambda es: len(es) >= 4)
    # By status, not by line order: each worker writes its own lines as its requests end.
    by_status = {e["status"]: e for e in entries}
    assert [by_status[s]["spend_usd"] for s in (500, 503, 400)] == [0, 0, 0], entries
    assert by_status[200]["spend_usd"] > 0


def test_stream_usage_is_charged_and_not_shown_to_a_client_that_did_not_ask(gw):
    w, m = gw
    client = w.client(api_key="sk-acme")
    chunks = list(client.chat.completions.create(model="m", stream=True, max_tokens=6,
                                                 messages=[{"role": "user", "content": "count to six"}]))
    assert all(c.usage is None for c in chunks)
    assert not any(c.choices == [] for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # The same request with include_usage gets the usage chunk, and the same text.
    chunks2 = list(client.chat.completions.create(model="m", stream=True, max_tokens=6,
                                                  stream_options={"include_usage": True},
                                                  messages=[{"role": "user", "content": "count to six"}]))
    assert chunks2[-1].choices == [] and chunks2[-1].usage.completion_tokens == 6
    assert text == "".join(c.choices[0].delta.content or "" for c in chunks2 if c.choices)
    # Both were charged with real usage.
    entries = w.wait_log(lambda es: sum(1 for e in es if e.get("stream") and e.get("tenant") == "acme") >= 2)
    streams = [e for e in entries if e.get("stream") and e.get("tenant") == "acme"][-2:]
    assert all(e["completion_tokens"] == 6 and e["spend_usd"] > 0 for e in streams), streams


# --- JWT ----------------------------------------------------------------------


def rsa_jwk(key, kid: str) -> dict:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "alg": "RS256", "use": "sig"})
    return jwk


def ec_jwk(key, kid: str) -> dict:
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "alg": "ES256", "use": "sig"})
    return jwk


class JwksServer:
    """A JWKS endpoint on a free port whose key set the test can change."""

    def __init__(self):
        self.jwks = {"keys": []}
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.hits += 1
                body = json.dumps(outer.jwks).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.port = free_port()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks.json"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def token(key, kid: str, alg: str = "RS256", **claims) -> str:
    now = int(time.time())
    payload = {"iss": "https://idp.test/", "aud": "weir", "sub": "user-1", "tenant": "acme",
               "iat": now, "exp": now + 600, **claims}
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})


@pytest.fixture
def jwks_server():
    s = JwksServer()
    yield s
    s.close()


def jwt_config(mock, jwks: dict) -> dict:
    cfg = base_config(mock)
    cfg["auth"]["jwt"] = {"issuer": "https://idp.test/", "audience": "weir", **jwks,
                          "min_refetch_interval": "100ms", "refresh_interval": "10m"}
    return cfg


def test_jwt_from_a_jwks_url_with_key_rotation(mock, weir, jwks_server):
    m = mock(*MOCK_FLAGS)
    k1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    k2 = ec.generate_private_key(ec.SECP256R1())
    jwks_server.jwks = {"keys": [rsa_jwk(k1, "k1")]}
    w = weir(config=jwt_config(m, {"jwks_url": jwks_server.url}))
    wait_until(lambda: jwks_server.hits >= 1, 5, message="first JWKS fetch")

    good = token(k1, "k1")
    r = chat(w, good)
    assert r.status_code == 200, r.text
    assert w.log_for(r.headers["x-request-id"])["tenant"] == "acme"
    # Expired, wrong audience, wrong issuer, bad signature, alg none: 401.
    bad = [token(k1, "k1", exp=int(time.time()) - 3600, iat=int(time.time()) - 7200),
           token(k1, "k1", aud="someone-else"), token(k1, "k1", iss="https://evil.test/"),
           good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB"),
           jwt.encode({"sub": "x", "tenant": "acme", "aud": "weir", "iss": "https://idp.test/",
                       "exp": int(time.time()) + 600}, None, algorithm="none")]
    for t in bad:
        assert_openai_error(chat(w, t), 401, "invalid_api_key")
    # A tenant that is not configured: 403, and the log says who the
    # verified token names (its subject and the tenant it claims).
    r = chat(w, token(k1, "k1", tenant="nobody", sub="user-9"))
    assert r.status_code == 403
    line = w.log_for(r.headers["x-request-id"])
    assert (line["tenant"], line["subject"], line["key_id"]) == ("nobody", "user-9", None), line
    # A signed token that expired names its subject; one with a bad signature vouches for no one.
    r = chat(w, bad[0])
    line = w.log_for(r.headers["x-request-id"])
    assert (r.status_code, line["tenant"], line["subject"]) == (401, "acme", "user-1"), line
    r = chat(w, bad[3])
    assert "tenant" not in w.log_for(r.headers["x-request-id"])
    # Rotation: the IdP adds k2 and signs with it. The first request with the
    # new kid makes Weir refetch and succeeds once the new set is in.
    hits = jwks_server.hits
    jwks_server.jwks = {"keys": [rsa_jwk(k1, "k1"), ec_jwk(k2, "k2")]}
    r = chat(w, token(k2, "k2", alg="ES256"))
    assert r.status_code == 200, r.text
    assert jwks_server.hits > hits
    # A kid that no refetch will find is still refused, and quickly refused
    # again (refetches are rate-limited, the second does not wait).
    k3 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert chat(w, token(k3, "k3")).status_code == 401
    r = chat(w, token(k3, "k3"))
    assert r.status_code == 401
    assert w.log_for(r.headers["x-request-id"])["duration_ms"] < 1500  # (Weir's clock: not the client's start-up)


def test_jwks_down_keeps_serving_with_cached_keys(mock, weir, jwks_server):
    m = mock(*MOCK_FLAGS)
    k1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks_server.jwks = {"keys": [rsa_jwk(k1, "k1")]}
    w = weir(config=jwt_config(m, {"jwks_url": jwks_server.url}))
    wait_until(lambda: jwks_server.hits >= 1, 5, message="first JWKS fetch")
    assert chat(w, token(k1, "k1")).status_code == 200
    jwks_server.close()
    # A token never seen before (not in the verified-token cache) still verifies.
    assert chat(w, token(k1, "k1", sub="user-2")).status_code == 200
    # An unknown kid triggers a refetch that fails: 401, and the known key still works.
    k2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert chat(w, token(k2, "k2")).status_code == 401
    assert chat(w, token(k1, "k1", sub="user-3")).status_code == 200
    # The failed fetch is on stderr, with what Weir goes on with.
    wait_until(lambda: "weir: JWKS fetch from " in w.process.log(), 5, message="the failed fetch's line")
    assert "still verifying with the 1 key fetched before" in w.process.log(), w.process.log()


def test_jwt_from_a_jwks_file(mock, weir, tmp_path):
    m = mock(*MOCK_FLAGS)
    k1 = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [ec_jwk(k1, "e1")]}))
    w = weir(config=jwt_config(m, {"jwks_file": str(path)}))
    r = chat(w, token(k1, "e1", alg="ES256"))
    assert r.status_code == 200, r.text


def test_client_credentials_never_reach_the_upstream(gw):
    w, _ = gw
    for headers in ({"authorization": "Bearer sk-acme"}, {"x-api-key": "sk-acme"}):
        r = httpx.post(w.v1 + "/chat/completions", timeout=30,
                       headers={**headers, "x-mock-echo": "1"},
                       json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200, r.text
        received = r.headers["x-mock-headers"].split(",")
        assert "authorization" not in received and "x-api-key" not in received, received
