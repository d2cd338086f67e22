"""Observability: one JSON access-log line per request whatever happened to
it, x-request-id passed through or generated, and /metrics in valid
Prometheus text with the documented series.
"""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import wait_until
from httpwire import RawConn, chunked, request, roundtrip

MSG = [{"role": "user", "content": "hello there"}]
LOG_FIELDS = {"ts", "request_id", "method", "path", "model", "pool", "endpoint", "status", "stream", "ttft_ms",
              "duration_ms", "upstream_ms", "bytes_in", "bytes_out", "prompt_tokens", "completion_tokens", "error"}


@pytest.fixture
def stack(mock, weir):
    m = mock("--ttft-ms", "2", "--itl-ms", "2", "--max-tokens", "5")
    w = weir(workers=1, config={
        "server": {"max_body": "64KiB"},
        "pools": {"main": {"endpoints": [m.base_url]}},
        "models": {"public": {"pool": "main", "upstream_model": "mock-model", "aliases": ["pub"]}},
    })
    return m, w


def rid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def test_one_access_log_line_per_request(stack):
    m, w = stack
    c = w.client()
    ids: dict[str, dict] = {}  # request id -> what its line must say

    def expect(request_id, **fields):
        ids[request_id] = fields

    i = rid("chat")
    c.chat.completions.create(model="public", messages=MSG, extra_headers={"x-request-id": i})
    expect(i, status=200, model="public", pool="main", endpoint=m.base_url, prompt_tokens=6, completion_tokens=5,
           stream=False)
    i = rid("stream")
    list(c.chat.completions.create(model="pub", messages=MSG, stream=True, stream_options={"include_usage": True},
                                   extra_headers={"x-request-id": i}))
    expect(i, status=200, model="pub", pool="main", prompt_tokens=6, completion_tokens=5, stream=True)
    i = rid("badjson")
    roundtrip(w.port, request("POST", "/v1/chat/completions", b'{"model":', {"x-request-id": i}))
    expect(i, status=400, model=None, pool=None)
    i = rid("unknown-model")
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=MSG, extra_headers={"x-request-id": i})
    expect(i, status=404, model="nope", pool=None)
    i = rid("unknown-path")
    roundtrip(w.port, request("GET", "/v1/nothing", None, {"x-request-id": i}), "GET")
    expect(i, status=404)
    i = rid("method")
    roundtrip(w.port, request("GET", "/v1/chat/completions", None, {"x-request-id": i}), "GET")
    expect(i, status=405)
    i = rid("too-big")
    roundtrip(w.port, request("POST", "/v1/chat/completions", b"x" * 70_000, {"x-request-id": i}))
    expect(i, status=413)
    i = rid("too-big-chunked")
    roundtrip(w.port, request("POST", "/v1/chat/completions", None, {"x-request-id": i,
                                                                     "transfer-encoding": "chunked"})
              + chunked(b"y" * 70_000))
    expect(i, status=413)
    i = rid("upstream-503")
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model="public", messages=MSG, extra_headers={"x-request-id": i,
                                                                              "x-mock-status": "503"})
    expect(i, status=503, pool="main")
    i = rid("head")
    roundtrip(w.port, request("HEAD", "/health", None, {"x-request-id": i}), "HEAD")
    expect(i, status=200, method="HEAD", path="/health")
    i = rid("gone")
    conn = RawConn(w.port)
    conn.send(request("POST", "/v1/chat/completions", {"model": "public", "messages": MSG, "stream": True},
                      {"x-request-id": i, "x-mock-itl-ms": "300"}))
    conn.read_head()
    next(conn.iter_chunks())
    conn.close()
    w.log_for(i)  # the disconnect is noticed before the next request
    expect(i, status=499, stream=True)
    i = rid("gone-early")
    conn = RawConn(w.port)
    conn.send(request("POST", "/v1/chat/completions", None, {"x-request-id": i, "content-length": "500"})
              + b'{"model":"public"')
    conn.close()
    w.log_for(i)
    expect(i, status=499)
    # requests without a usable id: malformed HTTP, a huge head
    with RawConn(w.port) as raw:
        raw.send(b"NOT HTTP AT ALL\r\n\r\n")
        garbage = raw.read_response("GET")
    with RawConn(w.port) as raw:
        raw.send(request("GET", "/health", None, {"x-big": "z" * 70_000}))
        huge = raw.read_response("GET")
    assert (garbage.status, huge.status) == (400, 431)
    for r in (garbage, huge):
        assert r.header("x-request-id"), r.headers  # generated, returned to the client

    # A sentinel last: with one worker, its line comes after every other one.
    roundtrip(w.port, request("GET", "/health", None, {"x-request-id": "sentinel"}), "GET")
    entries = w.wait_log(lambda es: any(e["request_id"] == "sentinel" for e in es))

    assert len(entries) == len(ids) + 3, json.dumps(entries, indent=1)  # + garbage, huge head, sentinel
    for e in entries:
        assert LOG_FIELDS <= set(e), (LOG_FIELDS - set(e), e)
        assert isinstance(e["request_id"], str) and e["request_id"], e
        assert isinstance(e["status"], int) and isinstance(e["duration_ms"], (int, float)) and e["duration_ms"] >= 0
        assert isinstance(e["bytes_in"], int) and isinstance(e["bytes_out"], int)
        if e["status"] >= 400:
            assert e["error"] and e["error"]["source"] in ("client", "upstream", "internal"), e
    assert len({e["request_id"] for e in entries}) == len(entries)
    by_id = {e["request_id"]: e for e in entries}
    for request_id, fields in ids.items():
        entry = by_id[request_id]
        for k, v in fields.items():
            assert entry[k] == v, (request_id, k, entry)
    assert by_id[garbage.header("x-request-id")]["status"] == 400
    assert by_id[huge.header("x-request-id")]["status"] == 431
    stream_entry = next(e for k, e in by_id.items() if k.startswith("stream-"))
    assert stream_entry["ttft_ms"] is not None and 0 <= stream_entry["ttft_ms"] <= stream_entry["duration_ms"]


def test_request_id_passed_through_or_generated(stack):
    m, w = stack
    # given: the client gets it back and the log has it; the mock sees it with a generated id after it
    # (unique per request: vLLM refuses a request id already running), which vLLM's id carries
    raw = w.client().chat.completions.with_raw_response.create(
        model="public", messages=MSG, extra_headers={"x-request-id": "client-id-123", "x-mock-echo": "1"})
    sent = w.upstream_id("client-id-123")
    assert raw.headers["x-mock-request-id"] == sent
    assert raw.headers["x-request-id"] == "client-id-123"
    assert raw.parse().id == "chatcmpl-" + sent
    assert w.log_for("client-id-123")["status"] == 200
    # not given: Weir generates one, sends it upstream and returns it
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "public", "messages": MSG},
                   headers={"x-mock-echo": "1"}, timeout=10)
    generated = r.headers["x-request-id"]
    assert generated and r.headers["x-mock-request-id"] == generated
    assert w.log_for(generated)["status"] == 200
    # streams too
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=10, headers={"x-mock-echo": "1"},
                      json={"model": "public", "messages": MSG, "stream": True}) as s:
        s.read()
        assert s.headers["x-request-id"] and s.headers["x-mock-request-id"] == s.headers["x-request-id"]
    # unusable ids are replaced, never forwarded
    for bad in ("has space", "x" * 200):
        r = httpx.post(w.v1 + "/chat/completions", json={"model": "public", "messages": MSG},
                       headers={"x-mock-echo": "1", "x-request-id": bad}, timeout=10)
        assert r.status_code == 200
        assert r.headers["x-request-id"] != bad and r.headers["x-mock-request-id"] == r.headers["x-request-id"]
    # errors Weir answers itself carry it too
    r = httpx.post(w.v1 + "/chat/completions", content=b"{", headers={"x-request-id": "bad-json-id"}, timeout=10)
    assert r.status_code == 400 and r.headers["x-request-id"] == "bad-json-id"


def families(w) -> dict:
    text = w.metrics_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    # every series once
    seen = set()
    for f in fams.values():
        for s in f.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in seen, key
            seen.add(key)
    return fams


def sample(fams, family, name=None, **labels) -> float:
    f = fams[family]
    vals = [s.value for s in f.samples if s.name == (name or family) and all(s.labels.get(k) == v
                                                                             for k, v in labels.items())]
    assert len(vals) == 1, (family, name, labels, vals)
    return vals[0]


def check_histogram(fams, family, expected_count=None, **labels):
    f = fams[family]
    assert f.type == "histogram", f.type
    buckets = [(s.labels["le"], s.value) for s in f.samples if s.name == family + "_bucket"
               and all(s.labels.get(k) == v for k, v in labels.items())]
    assert buckets and buckets[-1][0] == "+Inf"
    values = [v for _, v in buckets]
    assert values == sorted(values), buckets  # cumulative
    count = sample(fams, family, family + "_count", **labels)
    assert values[-1] == count
    assert sample(fams, family, family + "_sum", **labels) >= 0
    if expected_count is not None:
        assert count == expected_count, (family, count, expected_count)


def test_metrics_prometheus_text(stack):
    m, w = stack
    c = w.client()
    for _ in range(3):
        c.chat.completions.create(model="public", messages=MSG)
    for _ in range(2):
        list(c.chat.completions.create(model="pub", messages=MSG, stream=True,
                                       stream_options={"include_usage": True}))
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=MSG)
    roundtrip(w.port, request("POST", "/v1/chat/completions", b"{"))

    fams = families(w)
    # prometheus_client drops the _total suffix from counter family names
    req = "weir_requests"
    assert fams[req].type == "counter"
    assert sample(fams, req, "weir_requests_total", route="/v1/chat/completions", model="public", status="200") == 5
    assert sample(fams, req, "weir_requests_total", route="/v1/chat/completions", status="404") == 1
    assert sample(fams, req, "weir_requests_total", route="/v1/chat/completions", status="400") == 1
    check_histogram(fams, "weir_time_to_first_token_seconds", 2, model="public")
    check_histogram(fams, "weir_upstream_seconds", 5, model="public")
    check_histogram(fams, "weir_request_duration_seconds", 5, model="public")
    check_histogram(fams, "weir_gateway_added_seconds", 5)
    assert sample(fams, "weir_prompt_tokens", "weir_prompt_tokens_total", model="public") == 5 * 6
    assert sample(fams, "weir_completion_tokens", "weir_completion_tokens_total", model="public") == 5 * 5
    assert sample(fams, "weir_active_streams") == 0
    for name in ("weir_upstream_connects", "weir_upstream_retries", "weir_client_disconnects",
                 "weir_slow_client_cutoffs", "weir_sse_events"):
        assert fams[name].type == "counter", name

    # the active-streams gauge follows a stream in flight, and comes back to 0 (a 5 s stream: the scrape may
    # take a second or more on a loaded machine, and must come while it runs)
    conn = RawConn(w.port)
    conn.send(request("POST", "/v1/chat/completions", {"model": "public", "messages": MSG, "stream": True},
                      {"x-mock-itl-ms": "1000"}))
    conn.read_head()
    assert sample(families(w), "weir_active_streams") == 1
    body = b"".join(conn.iter_chunks())
    assert body.endswith(b"data: [DONE]\n\n")
    conn.close()
    wait_until(lambda: sample(families(w), "weir_active_streams") == 0, 5, message="weir_active_streams == 0")
    # the metrics scrapes themselves are counted
    assert sample(families(w), req, "weir_requests_total", route="/metrics", status="200") >= 3
