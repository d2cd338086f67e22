"""Regression tests for defects black-box testing found in the client API and the configuration
(each failed on the build before the fix): x-weir-timeout-ms ignored by coalesced and micro-batched
requests, a percent-encoded id in GET /v1/models/{id}, duplicate keys in the YAML configuration,
OpenAI-shaped 417/501 errors on the Anthropic route, x-weir-fallbacks checked only on models with
fallbacks, and a translated route's 502 for an answer it cannot read. Real weir and weir-mock
processes on free ports, raw sockets where the bytes on the wire matter."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from conftest import binary, free_port
from httpwire import RawConn, assert_openai_error, request, roundtrip, sse_data
from test_config_check import BASE, weir_run
from test_defect_fixes import RawUpstream


# ---------------------------------------------------------------------------- the deadline, batched

def slow_batching_config(mock, kind: str) -> dict:
    pool = {"endpoints": [mock.base_url]}
    if kind == "coalesce":
        pool["coalesce"] = True
    else:
        pool["batch"] = {"window": "20ms", "max_size": 4}
    return {"pools": {"gpu": pool}, "default_pool": "gpu"}


@pytest.mark.parametrize("kind", ["coalesce", "batch"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_deadline_holds_for_batched_and_coalesced_requests(mock, weir, kind, stream):
    # Alone in its batch, a deterministic request is still bounded by its own x-weir-timeout-ms:
    # a 504 before the head, the in-band error after it, and the generation cancelled upstream.
    slow = mock("--ttft-ms", "50", "--itl-ms", "40", "--max-tokens", "100")
    w = weir(config=slow_batching_config(slow, kind), workers=1)
    if kind == "coalesce":
        path, body = "/v1/chat/completions", {"model": "mock-model", "temperature": 0, "max_tokens": 100,
                                              "messages": [{"role": "user", "content": "same"}]}
    else:
        path, body = "/v1/completions", {"model": "mock-model", "prompt": "p", "max_tokens": 100, "temperature": 0}
    body["stream"] = stream
    headers = {"x-weir-timeout-ms": "300", "x-request-id": f"deadline-{kind}-{stream}"}
    t0 = time.monotonic()
    with RawConn(w.port) as c:
        c.send(request("POST", path, body, headers))
        r = c.read_response("POST")
    took = time.monotonic() - t0
    if stream:
        assert r.status == 200, r.body[:300]
        data = sse_data(r.decoded())
        assert data[-1] == "[DONE]" and '"deadline_exceeded"' in data[-2], data[-3:]
    else:
        err = assert_openai_error(r, 504, "deadline_exceeded")
        assert "300 ms" in err["message"], err
    # The whole generation takes ~4 s; Weir's clock (the access log's duration_ms), not the client's stopwatch,
    # which counts its own delays on a loaded machine.
    assert w.log_for(headers["x-request-id"])["duration_ms"] < 3000, took
    # Weir gave up: the model server stops generating it.
    t1 = time.monotonic()
    while slow.aborts() < 1 and time.monotonic() - t1 < 5:
        time.sleep(0.05)
    assert slow.aborts() == 1
    assert w.metric("weir_deadline_exceeded_total") == 1
    line = w.wait_log(lambda es: any(e.get("request_id") == headers["x-request-id"] for e in es))
    mine = [e for e in line if e.get("request_id") == headers["x-request-id"]]
    assert len(mine) == 1 and mine[0]["error"]["code"] == "deadline_exceeded", mine


# ---------------------------------------------------------------------------- /v1/models/{id}

def test_a_percent_encoded_model_id_is_decoded(mock, weir):
    m = mock("--model", "meta-llama/Llama-3.1-8B-Instruct", "--model", "mock-model")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                     "models": {"meta-llama/Llama-3.1-8B-Instruct": {"pool": "p"},
                                "mock-model": {"pool": "p", "aliases": ["org/alias"]}}})
    client = openai.OpenAI(base_url=w.v1, api_key="unused")
    # The SDK sends "meta-llama%2FLlama-3.1-8B-Instruct".
    assert client.models.retrieve("meta-llama/Llama-3.1-8B-Instruct").id == "meta-llama/Llama-3.1-8B-Instruct"
    assert client.models.retrieve("org/alias").id == "org/alias"
    r = httpx.get(w.v1 + "/models/mock%2Dmodel", timeout=10)
    assert r.status_code == 200 and r.json()["id"] == "mock-model", r.text
    r = httpx.get(w.v1 + "/models/meta-llama/Llama-3.1-8B-Instruct", timeout=10)   # unencoded, as before
    assert r.status_code == 200, r.text
    for bad in ("%zz", "nope%2Fmodel", "%"):
        r = httpx.get(w.v1 + "/models/" + bad, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", (bad, r.text)


# ---------------------------------------------------------------------------- duplicate YAML keys

@pytest.mark.parametrize("extra,line,key", [
    # A second server: block was dropped unread, its unknown key too.
    ("server:\n  max_body: 1MiB\nserver:\n  this_key_does_not_exist: 1\n", 9, "server"),
    # A model listed twice under models: took the last one.
    ("tenants:\n  acme: {}\n  acme: {priority: 5}\n", 9, "tenants.acme"),
    ("pools:\n  q:\n    endpoints: [http://127.0.0.1:9]\n", 7, "pools"),
])
@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_a_key_given_twice_in_the_configuration_is_an_error(tmp_path, extra, line, key, check):
    path = tmp_path / "dup.yaml"
    port = free_port()
    path.write_text(BASE.format(port=port) + extra)
    r = weir_run("--config", path, *(["--check"] if check else []))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{path}:{line}:" in r.stderr and f" {key}: duplicate key (first at line " in r.stderr, r.stderr


# ---------------------------------------------------------------------------- head errors on /v1/messages

@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    m = module_mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "4")
    return module_weir(config={"pools": {"p": {"endpoints": [m.base_url]}},
                               "models": {"m": {"pool": "p", "upstream_model": "mock-model"}}})


MESSAGE = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("headers,status", [
    ({"Expect": "something-else"}, 417),
    ({"Transfer-Encoding": "gzip, chunked"}, 501),
])
def test_head_errors_on_the_anthropic_route_have_anthropics_shape(gw, headers, status):
    data = request("POST", "/v1/messages", MESSAGE, {**headers, "x-request-id": f"head-{status}"},
                   content_length="Transfer-Encoding" not in headers)
    if "Transfer-Encoding" in headers:
        body = json.dumps(MESSAGE).encode()
        data += b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    r = roundtrip(gw.port, data)
    assert r.status == status, (r.status, r.body)
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], body
    # The same on an OpenAI route stays OpenAI's.
    r = roundtrip(gw.port, request("POST", "/v1/chat/completions", {"model": "m", "messages": []}, headers)
                  if "Expect" in headers
                  else data.replace(b"/v1/messages", b"/v1/chat/completions", 1).replace(b"head-", b"openai-head-", 1))
    assert_openai_error(r, status)
    # The log names the request (its route was known), one line each.
    entries = gw.wait_log(lambda es: any(e.get("request_id") == f"head-{status}" for e in es))
    mine = [e for e in entries if e.get("request_id") == f"head-{status}"]
    assert len(mine) == 1 and mine[0]["path"] == "/v1/messages" and mine[0]["method"] == "POST", mine


@pytest.mark.parametrize("head", [
    b"Host: localhost\r\nTransfer-Encoding: chunked, chunked\r\n",  # refused for its framing
    b"Content-Length: 0\r\n",                                # refused for its Host (none)
], ids=["framing", "host"])
def test_a_refused_head_with_a_bad_target_is_logged_as_a_head_without_one(gw, head):
    # Framing and Host are checked before the target, so these heads are refused for them; their
    # target names no route, so each is answered and logged like a head without a usable target
    # (method "-"), never with an empty path and the client's method. The client's own x-request-id,
    # read before the head failed, names it in the answer and the log (stop 44).
    rid = b"bad-both-" + head[:4]
    r = roundtrip(gw.port, b"POST v1/messages HTTP/1.1\r\nx-request-id: " + rid + b"\r\n" + head + b"\r\n0\r\n\r\n")
    assert_openai_error(r, 400)
    entries = gw.wait_log(lambda es: any(e.get("status") == 400 and e.get("method") == "-" for e in es))
    mine = [e for e in entries if e.get("request_id") == rid.decode()]
    assert all(e["method"] == "-" and not e["path"] for e in mine), entries
    if head.startswith(b"Host"):
        assert len(mine) == 1, entries
    assert not [e for e in entries if e.get("method") == "POST" and not e.get("path")], entries


def test_a_bad_x_weir_fallbacks_is_a_400_on_every_model(gw):
    for v in ("zz", "-1", "1,2"):
        r = httpx.post(gw.v1 + "/chat/completions", headers={"x-weir-fallbacks": v}, timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 400 and "x-weir-fallbacks" in r.json()["error"]["message"], (v, r.text)
    for v in ("0", "none", "3"):
        r = httpx.post(gw.v1 + "/chat/completions", headers={"x-weir-fallbacks": v}, timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200, (v, r.text)


# ---------------------------------------------------------------------------- a translated answer Weir cannot read

def not_a_completion(headers: dict, body: bytes) -> bytes:
    payload = b'{"object":"something.else","ok":true}'
    return (b"HTTP/1.1 200 OK\r\nServer: uvicorn\r\nDate: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", MESSAGE),
    ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 4}),
])
def test_a_translated_route_names_pool_model_and_request_in_its_502(weir, path, body):
    up = RawUpstream(not_a_completion)
    try:
        w = weir(config={"pools": {"raw": {"endpoints": [up.url], "outlier": {"consecutive_failures": 0}}},
                         "models": {"m": {"pool": "raw"}}})
        rid = "untranslatable-" + path.rsplit("/", 1)[1]
        r = httpx.post(w.base_url + path, json=body, headers={"x-request-id": rid}, timeout=10)
        assert r.status_code == 502, r.text
        text = json.dumps(r.json())
        assert "`raw`" in text and "`m`" in text and rid in text, text
        # Weir's own answer: not the upstream's Server or Date.
        assert r.headers.get("server", "").lower() != "uvicorn", r.headers
        assert "01 Jan 2026" not in r.headers.get("date", ""), r.headers
        entries = w.wait_log(lambda es: any(e.get("request_id") == rid for e in es))
        mine = [e for e in entries if e.get("request_id") == rid]
        assert len(mine) == 1 and mine[0]["status"] == 502, mine
        assert mine[0]["error"]["code"] == "upstream_invalid_response", mine
    finally:
        up.close()
