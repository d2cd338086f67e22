"""Browser (CORS) clients: server.cors answers preflights and puts the Fetch standard's CORS fields on every
answer (docs/operations.md#browsers-cors). vLLM answers browsers itself (CORSMiddleware, every origin by
default); Weir answered a preflight 405 (Allow: POST), so openai-node with dangerouslyAllowBrowser and
client-side chat UIs broke behind it. Off by default: a gateway holding API keys opens itself to no page
unless told to."""
from __future__ import annotations

import hashlib

import pytest

from httpwire import RawConn, assert_openai_error, request, roundtrip, sse_data
from test_defect_fixes import RawUpstream

APP = "http://localhost:3000"
MSG = [{"role": "user", "content": "hi"}]
SDK_HEADERS = "authorization, content-type, x-stainless-os, x-stainless-lang, x-stainless-retry-count, " \
              "openai-organization"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def preflight(port: int, path: str = "/v1/chat/completions", origin: str = APP, method: str = "POST",
              headers: str | None = SDK_HEADERS):
    h = {"origin": origin, "access-control-request-method": method}
    if headers is not None:
        h["access-control-request-headers"] = headers
    return roundtrip(port, request("OPTIONS", path, None, h), "OPTIONS")


def cors_fields(r) -> dict[str, str]:
    return {k.lower(): v for k, v in r.headers if k.lower().startswith("access-control-")}


def upstream_cors(headers: dict, body: bytes) -> bytes:
    """A chat answer with the upstream's own CORS fields, as vLLM's CORSMiddleware writes them."""
    import json
    stream = bool(json.loads(body or b"{}").get("stream"))
    acao = ("access-control-allow-origin: *\r\naccess-control-allow-credentials: true\r\n"
            "access-control-allow-private-network: true\r\n")
    if stream:
        sse = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
               b'"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}\n\n'
               b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
               b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\ndata: [DONE]\n\n')
        return (f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{acao}Transfer-Encoding: chunked\r\n\r\n"
                .encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(sse), sse))
    out = (b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":'
           b'{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
           b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{acao}Content-Length: {len(out)}\r\n\r\n"
            .encode() + out)


@pytest.fixture(scope="module")
def gw(module_weir):
    up = RawUpstream(upstream_cors)
    w = module_weir(config={
        "server": {"cors": {"allowed_origins": [APP, "https://chat.example.com"], "max_age": "10m"}},
        "pools": {"p": {"endpoints": [up.url]}},
        "models": {"m": {"pool": "p"}},
        "tenants": {"t": {"limits": {"requests_per_minute": 2, "tokens_per_minute": 100000}}},
        "auth": {"api_keys": [{"id": "k1", "sha256": sha("sk-browser"), "tenant": "t"}]},
    }, workers=1)
    yield w
    up.close()


def test_a_preflight_is_answered_204_before_auth_with_the_granted_fields(gw):
    r = preflight(gw.port)
    assert r.status == 204, (r.status, r.body)
    assert r.header("content-length") is None and r.body == b""  # RFC 9110 §8.6: none on a 204
    f = cors_fields(r)
    assert f["access-control-allow-origin"] == APP
    assert f["access-control-allow-methods"] == "POST"
    # Every SDK header asked for (the x-stainless-* family by its prefix), echoed: CORS has no prefix wildcard.
    assert [h.strip() for h in f["access-control-allow-headers"].split(",")] == \
        [h.strip() for h in SDK_HEADERS.split(",")]
    assert f["access-control-max-age"] == "600"
    assert "access-control-allow-credentials" not in f
    assert "Origin" in ", ".join(r.header_all("vary")) and "Access-Control-Request-Headers" in ", ".join(
        r.header_all("vary"))
    rid = r.header("x-request-id")
    line = gw.log_for(rid)  # one access-log line, as for any request
    assert line["method"] == "OPTIONS" and line["status"] == 204 and line["path"] == "/v1/chat/completions"
    # A GET route's preflight lists its methods; a header the list does not grant is left out (the browser refuses).
    r = preflight(gw.port, "/v1/models", method="GET", headers="authorization, x-secret")
    assert r.status == 204
    assert cors_fields(r)["access-control-allow-methods"] == "GET, HEAD"
    assert cors_fields(r)["access-control-allow-headers"] == "authorization"


def test_a_preflight_from_an_origin_not_listed_is_refused_without_cors_fields(gw):
    r = preflight(gw.port, origin="https://evil.example")
    err = assert_openai_error(r, 403, "origin_not_allowed")
    assert "https://evil.example" in err["message"]
    assert cors_fields(r) == {}
    # An unknown path is a 404 whatever the method.
    assert preflight(gw.port, "/v1/nothing").status == 404
    # An OPTIONS that is no preflight (no Access-Control-Request-Method) is the 405 it was.
    r = roundtrip(gw.port, request("OPTIONS", "/v1/chat/completions", None, {"origin": APP}), "OPTIONS")
    assert r.status == 405 and r.header("allow") == "POST"


def chat(port: int, origin: str | None, key: str = "sk-browser", stream: bool = False, rid: str | None = None):
    h = {"authorization": f"Bearer {key}"}
    if origin:
        h["origin"] = origin
    if rid:
        h["x-request-id"] = rid
    return roundtrip(port, request("POST", "/v1/chat/completions", {"model": "m", "messages": MSG, "stream": stream},
                                   h))


def test_actual_answers_carry_allow_origin_and_exposed_fields_once(gw):
    for stream in (False, True):
        r = chat(gw.port, APP, stream=stream, rid=f"cors-ok-{int(stream)}")
        assert r.status == 200, r.body
        # The upstream's own `*` (and its credentials) dropped: one Allow-Origin, Weir's.
        assert r.header_all("access-control-allow-origin") == [APP], r.headers
        assert r.header("access-control-allow-credentials") is None
        # Every Access-Control-* field of the upstream's is dropped, Private Network Access's too (stop 47).
        assert r.header("access-control-allow-private-network") is None
        exposed = [h.strip() for h in r.header("access-control-expose-headers").split(",")]
        for h in ("x-request-id", "retry-after", "x-ratelimit-remaining-requests", "x-ratelimit-reset-tokens"):
            assert h in exposed, exposed
        assert "Origin" in ", ".join(r.header_all("vary"))
        if stream:
            assert r.chunked and sse_data(r.body)[-1] == "[DONE]"
        else:
            assert r.json()["choices"][0]["message"]["content"] == "ok"


def test_errors_carry_the_cors_fields_too(gw):
    # 401: no credential (a browser page must be able to read why).
    r = chat(gw.port, APP, key="sk-wrong")
    assert_openai_error(r, 401)
    assert r.header("access-control-allow-origin") == APP
    # 404 model, 400 body, 405 method: each readable by the page.
    r = roundtrip(gw.port, request("POST", "/v1/chat/completions", {"model": "nope", "messages": MSG},
                                   {"authorization": "Bearer sk-browser", "origin": APP}))
    assert_openai_error(r, 404, "model_not_found")
    assert r.header("access-control-allow-origin") == APP
    r = roundtrip(gw.port, request("GET", "/v1/chat/completions", None, {"origin": APP}), "GET")
    assert r.status == 405 and r.header("access-control-allow-origin") == APP
    # 429 with Retry-After exposed (2 requests a minute; earlier tests used some).
    for _ in range(3):
        r = chat(gw.port, APP)
    assert_openai_error(r, 429, "rate_limit_exceeded")
    assert r.header("access-control-allow-origin") == APP
    assert "retry-after" in r.header("access-control-expose-headers")


def test_an_origin_not_listed_gets_no_cors_fields_and_is_served_as_usual(gw):
    # (Answered as usual: its 401 here, the browser withholding the answer from the page.)
    for origin in ("https://evil.example", "http://localhost:3000.evil.example", None):
        r = chat(gw.port, origin, key="sk-wrong")
        assert_openai_error(r, 401)
        assert cors_fields(r) == {}, (origin, r.headers)
        assert r.header_all("vary") == ["Origin"]  # a cache keeps one origin's answer from another


def test_cors_off_by_default_keeps_the_405_and_passes_upstream_fields(weir):
    up = RawUpstream(upstream_cors)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        r = preflight(w.port)
        assert_openai_error(r, 405, "method_not_allowed")
        assert cors_fields(r) == {}
        r = chat(w.port, APP, key="x")
        assert r.status == 200
        assert r.header_all("access-control-allow-origin") == ["*"]  # the upstream's, as it sent it
        assert r.header("vary") is None
    finally:
        up.close()


def test_any_origin_answers_a_star_and_credentials_with_it_are_refused_at_check(weir, mock, tmp_path):
    m = mock()
    w = weir(config={"server": {"cors": {"allowed_origins": "*", "allowed_headers": "*"}},
                     "pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p"}, workers=1)
    r = preflight(w.port, headers="authorization, x-anything")
    assert r.status == 204
    assert cors_fields(r)["access-control-allow-origin"] == "*"
    assert cors_fields(r)["access-control-allow-headers"] == "authorization, x-anything"
    with RawConn(w.port) as c:
        c.send(request("POST", "/v1/chat/completions", {"model": "mock-model", "messages": MSG, "stream": True},
                       {"origin": "https://anywhere.example"}))
        r = c.read_response()
    assert r.status == 200 and r.header("access-control-allow-origin") == "*"
    assert r.header("vary") is None  # the same answer for every origin

    import subprocess
    from conftest import binary
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: {cors: {allowed_origins: '*', allow_credentials: true}}\n"
                   f"pools: {{p: {{endpoints: ['{m.base_url}']}}}}\ndefault_pool: p\n")
    p = subprocess.run([binary("weir"), "--config", str(bad), "--check"], capture_output=True, text=True, timeout=10)
    assert p.returncode != 0 and "server.cors.allow_credentials" in p.stderr, (p.returncode, p.stderr)


# DEFECT (stop 47): a preflight's Access-Control-Request-Headers was checked name by name against every name
# granted before it: a 64 KiB list of distinct names (before authentication) held the worker for seconds. At most
# 64 names are granted now; a preflight still counts in weir_requests_total under its own status, 204.
def test_a_preflight_asking_for_thousands_of_headers_is_granted_at_most_64(gw):
    names = ", ".join(f"x-stainless-h{i}" for i in range(3000))
    r = preflight(gw.port, headers=names)
    assert r.status == 204, r.status
    granted = cors_fields(r)["access-control-allow-headers"].split(", ")
    assert len(granted) == 64 and granted[0] == "x-stainless-h0" and len(set(granted)) == 64
    assert 'status="204"' in gw.metrics_text()


# DEFECT (stop 47): origins a browser never sends were accepted (an explicit default port, an empty or non-numeric
# port, a control character), so CORS failed silently; a max_age under a second was sent as 0.
@pytest.mark.parametrize("cors,want", [
    ({"allowed_origins": ["https://app.example.com:443"]}, "default port"),
    ({"allowed_origins": ["http://app.example.com:80"]}, "default port"),
    ({"allowed_origins": ["https://app.example.com:"]}, "is no origin"),
    ({"allowed_origins": ["https://app.example.com:abc"]}, "is no origin"),
    ({"allowed_origins": ["https://app.example.com\\"]}, "is no origin"),
    ({"allowed_origins": ["https://app.example.com\t"]}, "is no origin"),
    ({"allowed_origins": ["https://app.example.com"], "max_age": "900ms"}, "whole seconds"),
], ids=["https-443", "http-80", "empty-port", "letters-port", "backslash", "tab", "max-age-ms"])
def test_origins_a_browser_never_sends_are_refused_at_check(mock, tmp_path, cors, want):
    import json
    import subprocess
    from conftest import binary
    m = mock()
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps({"server": {"cors": cors}, "pools": {"p": {"endpoints": [m.base_url]}},
                             "default_pool": "p"}))
    p = subprocess.run([binary("weir"), "--config", str(f), "--check"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and want in p.stderr, (p.returncode, p.stderr)
    ok = tmp_path / "ok.yaml"
    ok.write_text(json.dumps({"server": {"cors": {"allowed_origins": ["https://app.example.com:8443", "http://[::1]:3000"]}},
                              "pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p"}))
    p = subprocess.run([binary("weir"), "--config", str(ok), "--check"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0, p.stderr
