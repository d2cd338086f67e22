"""The process-wide bound on buffered bytes (server.max_buffered, docs/reliability.md#memory-bounds).

Request bodies (up to server.max_body each) and whole upstream answers (up to server.max_response each) are
charged to one budget shared by every worker, before their bytes are read: a body's Content-Length at once, a
chunked body chunk by chunk as each is announced, an answer's Content-Length at once or each read. One that
would take the total over the budget gets 503 gateway_overloaded (Retry-After: 1) and is never read; a refused
answer's upstream connection is closed. An upstream answer whose Content-Length is over server.max_response is a
502 at its head, no byte of it read.

The budget is held here by "holders": connections that send a head with a 3 MiB Content-Length and a few bytes
of the body, then nothing (as a slow or hostile client does). Every wait is for a state (the
weir_buffered_bytes gauge, a log line, a closed socket), never for time to pass.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from conftest import wait_until
from httpwire import RawConn, request

MiB = 1 << 20
CONFIG_SERVER = {"max_body": "3MiB", "max_response": "4MiB", "max_buffered": "8MiB"}


class RawUpstream:
    """An upstream that answers every POST with a large JSON body, by ``mode``:

    cl_head   a head with Content-Length ``size`` and no byte of the body
    cl        a head with Content-Length ``size``, then the body
    chunked   a chunked body of ``size`` bytes in 64 KiB chunks
    chat      a chat completion of ``size`` bytes (its text most of it), with its Content-Length

    and notes (``closed``) when Weir closes one of its connections."""

    def __init__(self, mode: str, size: int):
        self.mode, self.size = mode, size
        self.closed = threading.Event()
        self.served = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self):
        self.sock.close()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def body(self) -> bytes:
        lead, tail = b'{"object":"list","data":[],"pad":"', b'"}'
        if self.mode == "chat":
            lead = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"big-model","choices":'
                    b'[{"index":0,"message":{"role":"assistant","content":"')
            tail = (b'"},"finish_reason":"stop"}],'
                    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
        return lead + b"x" * (self.size - len(lead) - len(tail)) + tail

    def _serve(self, conn: socket.socket):
        conn.settimeout(60)
        buf = b""
        with conn:
            try:
                while True:  # (requests one after the other: Weir keeps a connection whose answer it read whole)
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            self.closed.set()
                            return
                        buf += data
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    length = 0
                    for line in lines[1:]:
                        k, _, v = line.partition(":")
                        if k.strip().lower() == "content-length":
                            length = int(v.strip())
                    while len(buf) < length:
                        data = conn.recv(65536)
                        if not data:
                            self.closed.set()
                            return
                        buf += data
                    buf = buf[length:]
                    if not lines[0].startswith("POST "):
                        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        continue
                    self.served += 1
                    if self.mode == "chunked":
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n")
                        body = self.body()
                        for i in range(0, len(body), 65536):
                            part = body[i:i + 65536]
                            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
                        conn.sendall(b"0\r\n\r\n")
                    else:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: %d\r\n\r\n" % self.size)
                        if self.mode != "cl_head":
                            conn.sendall(self.body())
            except OSError:  # reset (Weir closed with our bytes unread), broken pipe, or our timeout
                self.closed.set()


@pytest.fixture
def upstreams():
    made = []

    def make(mode: str, size: int) -> RawUpstream:
        u = RawUpstream(mode, size)
        made.append(u)
        return u

    yield make
    for u in made:
        u.stop()


def gateway(weir, mock, big: RawUpstream | None = None, server: dict | None = None):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    pools = {"p": {"endpoints": [m.base_url]}}
    models = {"mock-model": {"pool": "p"}}
    if big is not None:
        pools["big"] = {"endpoints": [big.base_url]}
        models["big-model"] = {"pool": "big"}
    return weir(config={"server": dict(server or CONFIG_SERVER), "pools": pools, "models": models}, workers=2)


def hold_body(port: int, length: int = 3 * MiB) -> RawConn:
    """A client that announces a body of ``length`` bytes, sends 1 KiB of it, and stops there."""
    c = RawConn(port, timeout=30)
    c.send(request("POST", "/v1/chat/completions", headers={"content-type": "application/json",
                                                             "content-length": str(length)}) + b" " * 1024)
    return c


def buffered(w) -> float:
    return w.metric("weir_buffered_bytes")


def hold_six_mib(w) -> list[RawConn]:
    holders = [hold_body(w.port), hold_body(w.port)]
    wait_until(lambda: buffered(w) >= 6 * MiB, 10, message="two held bodies charged (6 MiB)")
    return holders


def padded_chat(total: int) -> bytes:
    """A valid chat request of exactly ``total`` bytes (JSON whitespace pads it: the model sees one word)."""
    body = json.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()
    return body[:-1] + b" " * (total - len(body)) + b"}"


def assert_overloaded(r, what: str):
    assert r.status == 503, r.body[:300]
    err = json.loads(r.body)["error"]
    assert err["code"] == "gateway_overloaded" and err["type"] == "server_error", err
    assert "server.max_buffered" in err["message"] and what in err["message"], err
    assert r.header("retry-after") == "1"


def log_of(w, rid: str) -> dict:
    return w.log_for(rid)


def test_a_body_past_the_budget_is_refused_at_its_head_and_the_charge_comes_back(weir, mock):
    w = gateway(weir, mock)
    assert buffered(w) == 0
    holders = hold_six_mib(w)
    # 6 MiB held, 3 MiB more would be 9 > 8: refused from its Content-Length, before a byte of it is sent.
    with RawConn(w.port, timeout=30) as c:
        c.send(request("POST", "/v1/chat/completions",
                       headers={"content-type": "application/json", "content-length": str(3 * MiB),
                                "x-request-id": "over-budget-cl"}))
        r = c.read_response("POST")
        assert_overloaded(r, "body")
        assert c.closed_by_peer(10)  # (its body was never read: the connection cannot go on)
    e = log_of(w, "over-budget-cl")
    assert e["status"] == 503 and e["error"]["code"] == "gateway_overloaded", e
    assert w.metric("weir_buffer_refusals_total", reason="request_body") == 1
    assert w.metric("weir_buffer_refusals_total", reason="response") == 0
    # What is left (2 MiB, less room for its answer) passes, and is answered.
    with RawConn(w.port, timeout=30) as c:
        c.send(request("POST", "/v1/chat/completions", padded_chat(2 * MiB - 64 * 1024),
                       headers={"x-request-id": "fits"}))
        r = c.read_response("POST")
        assert r.status == 200, r.body[:300]
    # A holder that leaves gives its 3 MiB back; so does the one that stays, once its body times out or it
    # leaves: every charge comes back to 0.
    holders[0].close()
    wait_until(lambda: buffered(w) == 3 * MiB, 10, message="the first holder's charge given back")
    with RawConn(w.port, timeout=30) as c:
        c.send(request("POST", "/v1/chat/completions", padded_chat(3 * MiB), headers={"x-request-id": "now-fits"}))
        assert c.read_response("POST").status == 200
    holders[1].close(reset=True)
    wait_until(lambda: buffered(w) == 0, 10, message="every charge given back")


def test_a_chunked_body_is_refused_at_the_chunk_that_would_pass_the_budget(weir, mock):
    w = gateway(weir, mock)
    holders = hold_six_mib(w)
    with RawConn(w.port, timeout=30) as c:
        c.send(request("POST", "/v1/chat/completions",
                       headers={"content-type": "application/json", "transfer-encoding": "chunked",
                                "x-request-id": "over-budget-chunked"}, content_length=False))
        c.send(b"%x\r\n%s\r\n" % (MiB, b" " * MiB))  # 7 MiB: within
        c.send(b"%x\r\n" % (2 * MiB))  # 9 MiB announced: refused before its bytes come
        r = c.read_response("POST")
        assert_overloaded(r, "body")
    e = log_of(w, "over-budget-chunked")
    assert e["status"] == 503 and e["error"]["code"] == "gateway_overloaded", e
    assert w.metric("weir_buffer_refusals_total", reason="request_body") == 1
    for h in holders:
        h.close()
    wait_until(lambda: buffered(w) == 0, 10, message="every charge given back")


@pytest.mark.parametrize("mode", ["cl", "chunked"])
def test_an_answer_past_the_budget_is_503_and_its_upstream_connection_closed(weir, mock, upstreams, mode):
    big = upstreams(mode, 3 * MiB)
    w = gateway(weir, mock, big)
    holders = hold_six_mib(w)
    # The client's SDK sees Weir's 503 (its retry would come after Retry-After).
    import openai
    client = openai.OpenAI(base_url=w.v1, api_key="test", max_retries=0, timeout=30)
    with pytest.raises(openai.InternalServerError) as ex:
        client.embeddings.create(model="big-model", input="hi", extra_headers={"x-request-id": f"big-{mode}"})
    assert ex.value.status_code == 503
    assert ex.value.response.json()["error"]["code"] == "gateway_overloaded", ex.value.response.text
    assert ex.value.response.headers.get("retry-after") == "1"
    assert big.closed.wait(10), "Weir kept reading (or holding) the refused answer's connection"
    e = log_of(w, f"big-{mode}")
    assert e["status"] == 503 and e["error"] == {"source": "internal", "code": "gateway_overloaded"}, e
    assert w.metric("weir_buffer_refusals_total", reason="response") == 1
    # Not the endpoint's fault: it is no failure of its, and nothing was charged for a failed answer.
    assert w.metric("weir_upstream_failures_total", pool="big") == 0
    for h in holders:
        h.close()
    wait_until(lambda: buffered(w) == 0, 10, message="every charge given back")
    # With the room back, the same answer passes (and is given back once written).
    r = client.embeddings.with_raw_response.create(model="big-model", input="hi")
    assert r.http_response.status_code == 200 and len(r.http_response.content) == 3 * MiB
    wait_until(lambda: buffered(w) == 0, 10, message="the answer's charge given back")


def test_a_translated_answer_is_charged_with_the_answer_it_was_made_from(weir, mock, upstreams):
    # An Anthropic client of an OpenAI pool: the chat completion as read (1.5 MiB: 7.5 of 8 held) and the
    # message made from it (as large again) would both be held until the client reads it: refused before a
    # byte is sent, the upstream's connection kept (it was read whole).
    big = upstreams("chat", 3 * MiB // 2)
    w = gateway(weir, mock, big)
    holders = hold_six_mib(w)
    with RawConn(w.port, timeout=30) as c:
        c.send(request("POST", "/v1/messages",
                       {"model": "big-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                       headers={"anthropic-version": "2023-06-01", "x-request-id": "translated"}))
        r = c.read_response("POST")
    assert r.status == 503, r.body[:300]
    err = json.loads(r.body)
    assert err["type"] == "error" and "server.max_buffered" in err["error"]["message"], err  # Anthropic's shape
    assert r.header("retry-after") == "1"
    e = log_of(w, "translated")
    assert e["status"] == 503 and e["error"] == {"source": "internal", "code": "gateway_overloaded"}, e
    assert w.metric("weir_buffer_refusals_total", reason="response") == 1
    assert not big.closed.is_set()
    for h in holders:
        h.close()
    wait_until(lambda: buffered(w) == 0, 10, message="every charge given back")
    # With room, the same answer passes, translated.
    with RawConn(w.port, timeout=30) as c:
        c.send(request("POST", "/v1/messages",
                       {"model": "big-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                       headers={"anthropic-version": "2023-06-01"}))
        r = c.read_response("POST")
    assert r.status == 200, r.body[:300]
    assert json.loads(r.body)["type"] == "message"
    wait_until(lambda: buffered(w) == 0, 10, message="the answer's charge given back")


def test_an_answer_whose_content_length_is_over_max_response_is_502_at_its_head(weir, mock, upstreams):
    # (No server.max_buffered here: the base build read up to max_response of a body it would refuse, and waited
    # for it: this one never sends it.)
    big = upstreams("cl_head", 5 * MiB)
    w = gateway(weir, mock, big, server={"max_response": "4MiB"})
    with RawConn(w.port, timeout=30) as c:
        c.send(request("POST", "/v1/embeddings", {"model": "big-model", "input": "hi"},
                       headers={"x-request-id": "cl-over"}))
        r = c.read_response("POST")
    assert r.status == 502, r.body[:300]
    err = json.loads(r.body)["error"]
    assert err["code"] == "upstream_unavailable" and f"larger than {4 * MiB} bytes" in err["message"], err
    assert big.closed.wait(10), "Weir kept the connection of an answer it refused at its head"
    e = log_of(w, "cl-over")
    assert e["status"] == 502, e
