"""Defects of stop 47 around the upstream request: a pooled connection's idle-timeout 408, the count of
connections opened, the x-request-id sent upstream, and request-log records that share an id."""
from __future__ import annotations

import concurrent.futures as cf
import json
import re
import socket
import socketserver
import sqlite3
import subprocess
import threading

import httpx
import pytest

from conftest import binary, free_port, wait_until

MSG = [{"role": "user", "content": "hi"}]
HEX28 = re.compile(r"[0-9a-f]{28}")
ANSWER = json.dumps({"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class IdleTimeoutUpstream:
    """An HTTP/1.1 upstream whose keep-alive connections answer their first request, and every later one with
    `later` (bytes, then the close): the server's idle-timeout answer crossing a request on a pooled
    connection, made deterministic. `requests` lists (connection number, request number on it)."""

    def __init__(self, later: bytes):
        self.requests: list[tuple[int, int]] = []
        self.connections = 0
        outer = self
        lock = threading.Lock()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                sock: socket.socket = self.request
                with lock:
                    outer.connections += 1
                    cid = outer.connections
                buf, n = b"", 0
                while True:
                    while b"\r\n\r\n" not in buf:
                        got = sock.recv(65536)
                        if not got:
                            return
                        buf += got
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
                    while len(buf) < length:
                        buf += sock.recv(65536)
                    buf = buf[length:]
                    n += 1
                    with lock:
                        outer.requests.append((cid, n))
                    if n > 1:
                        sock.sendall(later)
                        sock.shutdown(socket.SHUT_WR)
                        return
                    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                 % len(ANSWER) + ANSWER)

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def chat(w, client: httpx.Client, request_id: str) -> httpx.Response:
    return client.post(w.v1 + "/chat/completions", json={"model": "m", "messages": MSG},
                       headers={"x-request-id": request_id}, timeout=10)


# DEFECT: a 408 with Connection: close answered on a reused pooled connection (Node's or Jetty's idle
# timeout crossing the request: the server never read it) went to the client, logged as the client's error
# (source "client", code upstream_status), where a reset there is resent at once on a fresh connection.
# RFC 9110 §15.5.9: a client MAY repeat the request on a new connection. Now resent the same way (once, free:
# no retry section needed), whether the 408 declares an empty body or ends at the close.
@pytest.mark.parametrize("form", ["content-length-0", "to-the-close"])
def test_a_pooled_connections_idle_timeout_408_is_resent_on_a_fresh_connection(weir, form):
    later = (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
             if form == "content-length-0" else b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n")
    up = IdleTimeoutUpstream(later)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        with httpx.Client() as c:
            assert chat(w, c, "first-408").status_code == 200
            r = chat(w, c, "second-408")
        assert r.status_code == 200, r.text
        # The second request went out on the pooled connection (its 408), then on a new one.
        assert up.requests == [(1, 1), (1, 2), (2, 1)]
        e = w.log_for("second-408")
        assert e["status"] == 200 and e["error"] is None and e["retries"] == 1, e
        assert [a["status"] for a in e["attempts"]] == [408, 200], e
        assert w.metric("weir_upstream_retries_total", reason="stale_connection") == 1
        # Not held against the endpoint.
        assert w.metric("weir_upstream_failures_total") == 0
    finally:
        up.close()


# A 408 that is an answer (it has a body) is not the idle race: it passes through, as any retryable status
# without retries, and the log blames the upstream, not the client (whose request came whole).
def test_a_408_with_a_body_passes_through_as_the_upstreams_error(weir):
    body = b'{"error":{"message":"timed out"}}'
    up = IdleTimeoutUpstream(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json"
                             b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "default_pool": "p"}, workers=1)
        with httpx.Client() as c:
            assert chat(w, c, "first-body").status_code == 200
            r = chat(w, c, "second-body")
        assert r.status_code == 408
        assert up.requests == [(1, 1), (1, 2)]
        e = w.log_for("second-body")
        assert e["error"] == {"source": "upstream", "code": "upstream_status"}, e
        assert e["retries"] == 0
    finally:
        up.close()


# DEFECT: weir_upstream_connects_total ("New TCP connections opened") counted connects that failed
# (refused, timed out): a pool whose endpoint was down showed connections opened. Only opened ones count
# now; a failed connect is in weir_upstream_failures_total.
def test_connects_total_counts_only_connections_opened(mock, weir):
    down = weir(config={"pools": {"p": {"endpoints": [f"http://127.0.0.1:{free_port()}"]}}, "default_pool": "p"},
                workers=1)
    for _ in range(3):
        assert httpx.post(down.v1 + "/chat/completions", json={"model": "m", "messages": MSG},
                          timeout=10).status_code == 502
    assert down.metric("weir_upstream_failures_total", kind="connect_refused") == 3
    assert down.metric("weir_upstream_connects_total") == 0
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    up = weir(m, workers=1)
    with httpx.Client() as c:
        for _ in range(3):
            assert c.post(up.v1 + "/chat/completions", json={"model": "mock-model", "messages": MSG},
                          timeout=10).status_code == 200
    assert up.metric("weir_upstream_connects_total") == 1  # one connection, reused


# DEFECT: a client's x-request-id went upstream as it was, and vLLM takes it as its engine's request id,
# refusing one already running ("Request id ... already running"): two clients (two tenants) choosing the
# same id at once collided there, and one's disconnect aborted by that id. The id sent upstream is now the
# client's with "-" and a generated id after it; the client keeps its own in the answer and the log, and the
# log's upstream_request_id says what vLLM saw.
def test_a_clients_request_id_goes_upstream_made_unique(mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(m, workers=2)

    def send(_):
        return httpx.post(w.v1 + "/chat/completions", json={"model": "mock-model", "messages": MSG},
                          headers={"x-request-id": "shared-id", "x-mock-echo": "1"}, timeout=10)
    with cf.ThreadPoolExecutor(4) as ex:
        rs = list(ex.map(send, range(4)))
    seen = set()
    for r in rs:
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "shared-id"
        upstream = r.headers["x-mock-request-id"]
        assert upstream.startswith("shared-id-") and HEX28.fullmatch(upstream.removeprefix("shared-id-")), upstream
        assert r.json()["id"] == "chatcmpl-" + upstream  # vLLM's id is made of the one it got
        seen.add(upstream)
    assert len(seen) == 4
    lines = w.wait_log(lambda es: len([e for e in es if e["request_id"] == "shared-id"]) == 4)
    assert {e["upstream_request_id"] for e in lines if e["request_id"] == "shared-id"} == seen
    # A generated id is unique already: it goes as it is.
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "mock-model", "messages": MSG},
                   headers={"x-mock-echo": "1"}, timeout=10)
    assert r.headers["x-mock-request-id"] == r.headers["x-request-id"]
    assert w.log_for(r.headers["x-request-id"])["upstream_request_id"] == r.headers["x-request-id"]
    # Nothing sent upstream: no upstream id in the line.
    r = httpx.post(w.v1 + "/chat/completions", content=b"{", headers={"x-request-id": "bad-json"}, timeout=10)
    assert r.status_code == 400 and "upstream_request_id" not in w.log_for("bad-json")


# The ids of a translated answer are made from the upstream id: an Anthropic client that sends the same
# x-request-id every turn gets a message id of its own each time.
def test_translated_and_batched_answers_get_distinct_ids_for_one_client_id(mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]},
                               "b": {"endpoints": [m.base_url], "batch": {"window": "1s", "max_size": 3}}},
                     "models": {"claude-test": {"pool": "p", "upstream_model": "mock-model"},
                                "batched": {"pool": "b", "upstream_model": "mock-model"}}}, workers=1)
    ids = set()
    for stream in (False, True, False):
        r = httpx.post(w.base_url + "/v1/messages", headers={"x-request-id": "turn", "anthropic-version": "2023-06-01"},
                       json={"model": "claude-test", "max_tokens": 2, "messages": MSG, "stream": stream}, timeout=10)
        assert r.status_code == 200 and r.headers["x-request-id"] == "turn"
        msg_id = (json.loads(r.text.split("data: ", 2)[1].split("\n", 1)[0])["message"]["id"] if stream
                  else r.json()["id"])
        assert msg_id.startswith("msg_turn-"), msg_id
        ids.add(msg_id)
    assert len(ids) == 3
    r = httpx.post(w.base_url + "/v1/responses", headers={"x-request-id": "turn"},
                   json={"model": "claude-test", "input": "hi", "max_output_tokens": 2}, timeout=10)
    assert r.status_code == 200 and r.json()["id"].startswith("resp_turn-")

    # Batch members that chose the same id: each its own completion id, as unbatched.
    client = httpx.Client(timeout=10)  # (one, made before the barrier: a client each costs ~50 ms of CPU)

    def member(i):
        return client.post(w.v1 + "/completions", headers={"x-request-id": "same-member"},
                           json={"model": "batched", "prompt": f"prompt {i}", "max_tokens": 2})
    barrier = threading.Barrier(3)

    def run(i):
        barrier.wait()
        return member(i)
    with cf.ThreadPoolExecutor(3) as ex:
        rs = list(ex.map(run, range(3)))
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
    lines = w.wait_log(lambda es: len([e for e in es if e["request_id"] == "same-member"]) == 3)
    assert len({e["batch"]["id"] for e in lines if e["request_id"] == "same-member"}) == 1  # one batch
    cids = {r.json()["id"] for r in rs}
    assert len(cids) == 3 and all(c.startswith("cmpl-same-member-") for c in cids), cids


ADMIN_TOKEN = "admin-test-token-0123456789"


# DEFECT: GET /admin/v1/requests/{id} and `weir requests --id` returned only the newest record with an id;
# ids are the clients' choice, so one tenant's request could hide another's record under the same id. The
# record now says how many others share its id (others_with_id), and the list filters by request_id.
def test_records_sharing_a_request_id_are_all_found(tmp_path, mock, weir):
    m = mock("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    db = tmp_path / "requests.db"
    port = free_port()
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "default_pool": "p",
                     "request_log": {"url": f"sqlite:{db}", "flush_interval": "10ms"},
                     "admin": {"listen": f"127.0.0.1:{port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
             env={"WEIR_TEST_ADMIN_TOKEN": ADMIN_TOKEN}, workers=1)
    for status in ("", "503", "429"):
        httpx.post(w.v1 + "/chat/completions", json={"model": "mock-model", "messages": MSG},
                   headers={"x-request-id": "dup-id", **({"x-mock-status": status} if status else {})}, timeout=10)
    httpx.post(w.v1 + "/chat/completions", json={"model": "mock-model", "messages": MSG},
               headers={"x-request-id": "alone-id"}, timeout=10)

    def stored() -> int:
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                return con.execute("SELECT count(*) FROM requests").fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error:
            return 0
    wait_until(lambda: stored() == 4, 10, message="rows stored")
    admin = f"http://127.0.0.1:{port}/admin/v1/requests"
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    one = httpx.get(admin + "/dup-id", headers=auth, timeout=10).json()
    assert one["status"] == 429 and one["others_with_id"] == 2, one
    assert httpx.get(admin + "/alone-id", headers=auth, timeout=10).json()["others_with_id"] == 0
    page = httpx.get(admin, params={"request_id": "dup-id"}, headers=auth, timeout=10)
    assert page.status_code == 200, page.text
    assert [r["status"] for r in page.json()["data"]] == [429, 503, 200]
    r = httpx.get(admin, params={"request_id": ""}, headers=auth, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "request_id"
    # The CLI: --id as the GET, --request-id as the list; a filter beside --id is refused, not ignored.
    weir_bin = str(binary("weir"))
    p = subprocess.run([weir_bin, "requests", "--db", str(db), "--id", "dup-id"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0 and json.loads(p.stdout)["others_with_id"] == 2, p.stderr
    p = subprocess.run([weir_bin, "requests", "--db", str(db), "--request-id", "dup-id"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and [r["status"] for r in json.loads(p.stdout)["data"]] == [429, 503, 200], p.stderr
    p = subprocess.run([weir_bin, "requests", "--db", str(db), "--id", "dup-id", "--status", "5xx"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p.stdout
