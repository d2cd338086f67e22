"""Regression tests for defects found in stop 33 (each failed on the build before the fix). Real weir
and weir-mock processes on free ports, raw sockets and scripted upstreams where the bytes matter."""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
import time

import anthropic
import httpx
import pytest

from conftest import answers, free_port, read_by_peer, wait_until
from httpwire import RawConn, roundtrip
from test_defect_fixes import RawUpstream
from test_defect_fixes_32 import CutUpstream

ADMIN_TOKEN = "admin-token-33-0123456789"


@pytest.fixture(scope="module")
def admin(module_mock, module_weir):
    up = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    port = free_port()
    w = module_weir(config={"pools": {"p": {"endpoints": [up.base_url]}}, "default_pool": "p",
                            "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_33"}},
                    env={"WEIR_TEST_ADMIN_33": ADMIN_TOKEN}, workers=1)
    wait_until(lambda: answers(f"http://127.0.0.1:{port}/ready"), 10, message="admin listener")
    return w, port


@pytest.mark.parametrize("end", [b"0\n\r\n", b"0\r\n\n", b"0\r\nX-T: 1\n\r\n"], ids=["size", "last", "trailer"])
def test_the_admin_listener_refuses_a_bare_lf_in_a_chunked_body_at_once(admin, end):
    _, port = admin
    body = json.dumps({"name": "k"}).encode()
    head = (b"POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + ADMIN_TOKEN.encode() +
            b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    t0 = time.monotonic()
    r = roundtrip(port, head + b"%x\r\n" % len(body) + body + b"\r\n" + end, timeout=15)
    assert r.status == 400, r.status
    assert time.monotonic() - t0 < 5  # not the listener's 10 s request timeout


def test_the_admin_listener_answers_and_logs_a_head_or_body_that_never_came(admin):
    # Both at once (each takes the listener's 10 s): a body that stops, and a head that stops
    # after its first bytes (a slowloris is not held for the 30 s idle time).
    w, port = admin
    body_conn, head_conn = RawConn(port, timeout=20), RawConn(port, timeout=20)
    with body_conn, head_conn:
        body_head = (b"POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                     ADMIN_TOKEN.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n")
        body_conn.send(body_head + b"{")
        head_conn.send(b"GET /admin/v1/ke")
        t0 = time.monotonic()
        r = body_conn.read_response("POST")
        assert r.status == 408, r.status
        assert json.loads(r.body)["error"]["code"] == "request_timeout"
        assert head_conn.read_response("GET").status == 408
        assert time.monotonic() - t0 < 15
    entries = w.wait_log(lambda es: len([e for e in es if e.get("listener") == "admin" and e.get("status") == 408]) >= 2)
    lines = [e for e in entries if e.get("listener") == "admin" and e.get("status") == 408]
    # The head and the body's one byte ("{") that came are counted.
    assert any(e["method"] == "POST" and e["path"] == "/admin/v1/keys" and e["bytes_in"] == len(body_head) + 1
               for e in lines), lines
    # Each waited the 10 s from its head's first byte, and its line says so.
    assert all(e["duration_ms"] >= 9000 for e in lines), lines


def test_the_admin_listener_logs_what_came_of_a_body_cut_short(admin):
    w, port = admin
    head = (b"POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + ADMIN_TOKEN.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n")
    with RawConn(port) as c:
        c.send(head + b"{\"name\": \"cut")
        wait_until(lambda: read_by_peer(c.sock), 10, message="Weir read the body's first bytes")  # (before the close)
    entries = w.wait_log(lambda es: any(e.get("listener") == "admin" and e.get("status") == 499 and
                                        e.get("method") == "POST" for e in es))
    line = next(e for e in entries if e.get("listener") == "admin" and e.get("status") == 499 and
                e.get("method") == "POST")
    assert line["bytes_in"] == len(head) + len(b'{"name": "cut'), line  # (the head, and what came of the body)


def test_the_admin_listener_logs_a_client_that_left_mid_head_as_499(admin):
    w, port = admin
    admin_400 = lambda es: [e for e in es if e.get("listener") == "admin" and e.get("status") == 400]  # noqa: E731
    before = len(admin_400(w.log_entries()))
    with RawConn(port) as c:
        c.send(b"GET /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        wait_until(lambda: read_by_peer(c.sock), 10, message="Weir read the head's first bytes")  # (before the close)
    entries = w.wait_log(lambda es: any(e.get("listener") == "admin" and e.get("status") == 499 for e in es))
    assert len(admin_400(entries)) == before, entries


# --- the upstream's side of the wire ------------------------------------------------------------

COMPLETION = json.dumps({
    "id": "chatcmpl-33", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def answer_of(status_line: bytes, fields: bytes, body: bytes) -> bytes:
    return status_line + b"\r\n" + fields + b"Content-Length: %d\r\n\r\n" % len(body) + body


class ByCase:
    """A raw upstream whose answer is chosen by the request's x-case header (the bytes it returns)."""

    def __init__(self, cases: dict):
        self.cases = cases
        self.seen: list[dict] = []

        def answer(headers, body):
            self.seen.append(headers)
            return self.cases[headers.get("x-case", "ok")]
        self.up = RawUpstream(answer)

    @property
    def url(self):
        return self.up.url


@pytest.fixture(scope="module")
def raw(module_weir):
    chunked = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
               b"%x\r\n%s\r\n" % (len(COMPLETION), COMPLETION))
    up = ByCase({
        "ok": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", COMPLETION),
        "trailers": chunked + b"0\r\nContent-Type: text/html\r\nSet-Cookie: session=evil\r\nX-Trailer: t\r\n\r\n",
        "status000": answer_of(b"HTTP/1.1 000 X", b"Content-Type: application/json\r\n", COMPLETION),
        "status099": answer_of(b"HTTP/1.1 099 X", b"Content-Type: application/json\r\n", COMPLETION),
        "status600": answer_of(b"HTTP/1.1 600 X", b"Content-Type: application/json\r\n", COMPLETION),
        "cut": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", COMPLETION[:-20]),
        "garbage": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", COMPLETION + b"garbage"),
        "empty": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", b""),
        "blank": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", b"  \r\n"),
        "html502": answer_of(b"HTTP/1.1 502 Bad Gateway", b"Content-Type: text/html\r\n",
                             b"<html><body>502 Bad Gateway</body></html>"),
        "br": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\nContent-Encoding: br\r\n",
                        b"\x0b\x02\x80brotli-ish bytes"),
    })
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
    yield w, up
    up.up.close()


def test_upstream_trailers_never_become_response_headers(raw):
    w, _ = raw
    r = httpx.post(w.v1 + "/chat/completions", json=CHAT, headers={"x-case": "trailers"}, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == 5
    assert r.headers.get_list("content-type") == ["application/json"], r.headers
    assert "set-cookie" not in r.headers and "x-trailer" not in r.headers, r.headers


# A status outside 100-599 (round 1), and a 2xx body that is no whole object: cut short by its
# Content-Length, bytes after the object, an empty line for a body (round 2).
# The head's failures are the connection's (upstream_unavailable, counted against the endpoint);
# the body's are the answer's (upstream_invalid_response).
@pytest.mark.parametrize("case,code", [(c, "upstream_unavailable") for c in ("status000", "status099", "status600")]
                         + [(c, "upstream_invalid_response") for c in ("cut", "garbage", "blank")])
def test_an_answer_that_is_no_answer_is_a_502(raw, case, code):
    w, _ = raw
    rid = f"no-answer-{case}"
    r = httpx.post(w.v1 + "/chat/completions", json=CHAT, headers={"x-case": case, "x-request-id": rid},
                   timeout=10)
    assert r.status_code == 502, (r.status_code, r.text)
    assert r.json()["error"]["code"] == code
    assert w.log_for(rid)["status"] == 502


def test_an_empty_200_stays_an_empty_200(raw):
    # (shared/cases: content-encoding) Weir does not make a 5xx of an empty answer.
    w, _ = raw
    r = httpx.post(w.v1 + "/chat/completions", json=CHAT, headers={"x-case": "empty"}, timeout=10)
    assert r.status_code == 200 and r.content == b""


def test_an_anthropic_error_rewritten_from_html_is_labelled_json(raw):
    w, _ = raw
    r = httpx.post(w.base_url + "/v1/messages", timeout=10, headers={"x-case": "html502"},
                   json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502
    assert r.headers["content-type"] == "application/json", r.headers
    assert r.json()["type"] == "error"


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", CHAT),
    ("/v1/rerank", {"model": "m", "query": "q", "documents": ["a", "b"]}),
    ("/tokenize", {"model": "m", "prompt": "hi"}),
], ids=["chat", "rerank", "tokenize"])
def test_a_coding_weir_cannot_decode_is_refused_even_to_a_client_that_accepts_it(raw, path, body):
    # Usage cannot be read out of it: passed on, it would escape limits and budgets, on every
    # route whose 2xx answers Weir reads usage from, not only the chat and completion ones.
    w, _ = raw
    r = httpx.post(f"http://127.0.0.1:{w.port}{path}", json=body, timeout=10,
                   headers={"x-case": "br", "accept-encoding": "br"})
    assert r.status_code == 502, r.status_code
    assert r.json()["error"]["code"] == "upstream_invalid_response"


@pytest.mark.parametrize("sent,upstream", [
    ("gzip, deflate, br", "gzip, deflate"),
    ("br;q=1.0, gzip;q=0.5, zstd", "gzip;q=0.5"),
    ("br", "identity"),
    ("*", "identity"),
])
def test_the_upstream_is_asked_only_for_codings_weir_decodes(raw, sent, upstream):
    w, up = raw
    r = httpx.post(w.v1 + "/chat/completions", json=CHAT, timeout=10, headers={"accept-encoding": sent})
    assert r.status_code == 200
    assert up.seen[-1].get("accept-encoding") == upstream, up.seen[-1]


def test_anthropic_routes_carry_the_request_id_header_the_sdk_reads(raw):
    w, _ = raw
    client = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0)
    raw_answer = client.messages.with_raw_response.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert raw_answer.headers["request-id"] == raw_answer.headers["x-request-id"]
    assert raw_answer.parse()._request_id == raw_answer.headers["x-request-id"]
    with pytest.raises(anthropic.APIStatusError) as e:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                               extra_headers={"x-case": "html502"})
    assert e.value.request_id and e.value.request_id == e.value.response.headers["x-request-id"]
    with pytest.raises(anthropic.BadRequestError) as e:  # Weir's own error
        client.messages.create(model="m", max_tokens=5, messages=[])
    assert e.value.request_id == e.value.response.headers["x-request-id"]


def test_an_answer_sent_before_the_body_was_read_is_relayed(module_weir):
    # An upstream that refuses a large body answers 413 and closes while Weir is still sending:
    # the client gets that 413, not a 502, and the endpoint is not blamed for a reset.
    page = b'{"error":{"message":"too big","type":"invalid_request_error","code":413}}'
    # CutUpstream reads the head only, answers at once and closes, leaving the body unread.
    up = CutUpstream(answer_of(b"HTTP/1.1 413 Payload Too Large", b"Content-Type: application/json\r\n"
                               b"Connection: close\r\n", page))
    w = module_weir(config={"pools": {"p": {"endpoints": [f"http://127.0.0.1:{up.port}"]}}, "default_pool": "p",
                            "server": {"max_body": "64MiB"}}, workers=1)
    try:
        before = w.metric("weir_upstream_failures_total") or 0
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * (12 << 20)}]}
        r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=30, headers={"x-request-id": "early-413"})
        assert r.status_code == 413, (r.status_code, r.text)
        assert r.json()["error"]["message"] == "too big"
        assert w.log_for("early-413")["status"] == 413
        assert (w.metric("weir_upstream_failures_total") or 0) == before
    finally:
        up.close()


def gz_sse(events: list[bytes]) -> bytes:
    body = gzip.compress(b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n")
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


def chunk_event(delta: dict, finish=None, usage=None) -> bytes:
    ev = {"id": "chatcmpl-gz", "object": "chat.completion.chunk", "created": 1, "model": "m",
          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else []}
    if usage is not None:
        ev["usage"] = usage
    return json.dumps(ev).encode()


@pytest.fixture(scope="module")
def gz_stream(module_weir):
    usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    data = gz_sse([chunk_event({"role": "assistant", "content": ""}), chunk_event({"content": "Hel"}),
                   chunk_event({"content": "lo"}), chunk_event({}, "stop"), chunk_event({}, usage=usage)])
    up = RawUpstream(lambda headers, body: data)
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
    yield w
    up.close()


def test_a_stream_the_upstream_compressed_anyway_is_refused_on_a_chat_route(gz_stream):
    # Relayed as decoded bytes, it would skip the relay's checks (a cut event, no [DONE], the
    # usage chunk Weir asked for on the client's behalf): a 502, charged nothing.
    w = gz_stream
    r = httpx.post(w.v1 + "/chat/completions", timeout=10, headers={"x-request-id": "gz-chat"},
                   json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_invalid_response", r.text
    line = w.log_for("gz-chat")
    assert line["status"] == 502, line


def test_a_stream_the_upstream_compressed_anyway_is_translated_for_an_anthropic_client(gz_stream):
    w = gz_stream
    client = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0)
    with client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert final.content[0].text == "Hello" and final.stop_reason == "end_turn"


def test_an_answer_weir_refused_with_a_502_is_charged_nothing(module_weir):
    key = "sk-test-33-charge-0123456789"
    up = ByCase({"cut": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", COMPLETION[:-20]),
                 "ok": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", COMPLETION)})
    w = module_weir(config={
        "pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p",
        "pricing": {"*": {"input": 1000.0, "output": 1000.0}},
        "tenants": {"t": {"budget": {"usd": 100, "period": "24h"}}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                                 "tenant": "t"}]}}, workers=1)
    try:
        hdrs = {"authorization": f"Bearer {key}"}
        r = httpx.post(w.v1 + "/chat/completions", json=CHAT, timeout=10,
                       headers=hdrs | {"x-case": "cut", "x-request-id": "refused-502"})
        assert r.status_code == 502
        assert not w.log_for("refused-502").get("spend_usd"), w.log_for("refused-502")
        r = httpx.post(w.v1 + "/chat/completions", json=CHAT, timeout=10, headers=hdrs | {"x-request-id": "paid-200"})
        assert r.status_code == 200 and w.log_for("paid-200")["spend_usd"] > 0
    finally:
        up.up.close()


def test_a_bom_before_a_whole_object_is_an_answer_and_counted(module_weir):
    up = ByCase({"ok": answer_of(b"HTTP/1.1 200 OK", b"Content-Type: application/json\r\n", b"\xef\xbb\xbf" + COMPLETION)})
    w = module_weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
    try:
        r = httpx.post(w.v1 + "/chat/completions", json=CHAT, timeout=10, headers={"x-request-id": "bom-200"})
        assert r.status_code == 200, r.text
        # Its usage is read past the BOM (else its tokens escape limits and budgets).
        line = w.log_for("bom-200")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (3, 2), line
    finally:
        up.up.close()


def test_a_client_within_its_concurrent_streams_is_never_refused_across_workers(module_mock, module_weir):
    # Each client sends its next request on a new connection as soon as it has read the last
    # answer; with 2 workers that request may land on the other one. The slot must be free by
    # then: max_concurrent_streams is exact, not "exact once the other worker has logged".
    key = "sk-test-33-streams-0123456789"
    up = module_mock("--any-model", "--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "2")
    w = module_weir(config={
        "pools": {"p": {"endpoints": [up.base_url]}}, "default_pool": "p",
        "tenants": {"t": {"limits": {"max_concurrent_streams": 3}}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                                 "tenant": "t"}]}}, workers=2)
    body = json.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    stream_body = json.dumps({"model": "m", "max_tokens": 2, "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]}).encode()
    statuses: list[int] = []

    def client(n: int, payload: bytes):
        for _ in range(n):
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + key.encode() +
                    b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload))
            statuses.append(roundtrip(w.port, head + payload).status)

    threads = [threading.Thread(target=client, args=(400, body if i % 2 else stream_body)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(statuses) == 1200
    assert statuses.count(429) == 0, {s: statuses.count(s) for s in set(statuses)}
