"""Micro-batching fixes of stop 59 (docs/batching.md).

1. A member cut by its own deadline (x-weir-timeout-ms) after its batch was sent gets its 504 (or, streaming,
   its in-band deadline_exceeded error and the stream's end) at its deadline, as unbatched -- not when its prompt
   ends upstream, which the others' batch keeps generating. Its log line still waits for that end: one line,
   504, charged what the upstream generated for its prompt.
2. A non-streaming member's answer is assembled from the batch's stream in vLLM's non-streamed shape; a request
   whose answer that shape cannot hold whole (vLLM's `return_token_ids`, `kv_transfer_params`, a member Weir
   does not know) is not batched, and gets the answer it gets alone.
3. A member that leaves while its batch waits to retry (a 503 with Retry-After) is not in the retry's prompt
   list, and is charged nothing (499, null tokens), as the same request alone.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading

import httpx
import pytest

from conftest import wait_until

# --- a vLLM-like /v1/completions upstream (prompt lists, streams, return_token_ids, a 503 on demand) ---


class _Upstream(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.failed_once = False
        self.release = threading.Event()  # a stream holding "HOLD" waits for it after each prompt's first token
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def bodies(self) -> list[dict]:
        with self.lock:
            return [r for r in self.requests]


def _usage(p: int, c: int) -> dict:
    return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c, "prompt_tokens_details": None}


class _Handler(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            line = self.rfile.readline()
            if not line:
                return
            headers = {}
            while (h := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                k, v = h.decode("latin1").split(":", 1)
                headers[k.strip().lower()] = v.strip()
            body = self.rfile.read(int(headers.get("content-length", "0")))
            target = line.split()[1].decode()
            if not target.startswith("/v1/completions"):
                self.send(200, "application/json", b'{"object":"list","data":[{"id":"m","object":"model"}]}')
                continue
            j = json.loads(body)
            srv: _Upstream = self.server
            with srv.lock:
                srv.requests.append(j)
            self.answer(j, headers.get("x-request-id", "x"))

    def send(self, status: int, ctype: str, body: bytes, extra: str = ""):
        reason = {200: "OK", 503: "Service Unavailable"}[status]
        self.wfile.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\n{extra}"
                         f"content-length: {len(body)}\r\n\r\n".encode() + body)
        self.wfile.flush()

    def answer(self, j: dict, rid: str):
        srv: _Upstream = self.server
        p = j["prompt"]
        prompts = p if isinstance(p, list) else [p]
        if any("FAIL503" in x for x in prompts) and not srv.failed_once:
            srv.failed_once = True
            self.send(503, "application/json", b'{"object":"error","message":"busy","type":"x","code":503}',
                      "retry-after: 1\r\n")
            return
        cid, created, ids = "cmpl-" + rid, 1700000000, bool(j.get("return_token_ids"))
        outs = []
        for pr in prompts:
            words = pr.split()
            toks = [" " + w for w in words + ["end"]][: j.get("max_tokens") or 16]
            outs.append((pr, words, toks))
        if not j.get("stream"):
            choices = []
            for i, (pr, words, toks) in enumerate(outs):
                ch = {"index": i, "text": "".join(toks), "logprobs": None, "finish_reason": "stop",
                      "stop_reason": None}
                if ids:
                    ch["token_ids"] = [len(t) for t in toks]
                ch["prompt_logprobs"] = None
                if ids:
                    ch["prompt_token_ids"] = [len(w) for w in words]
                choices.append(ch)
            resp = {"id": cid, "object": "text_completion", "created": created, "model": j["model"],
                    "choices": choices, "service_tier": None, "system_fingerprint": None,
                    "usage": _usage(sum(len(o[1]) for o in outs), sum(len(o[2]) for o in outs)),
                    "kv_transfer_params": j.get("kv_transfer_params")}
            self.send(200, "application/json", json.dumps(resp).encode())
            return
        so = j.get("stream_options") or {}
        self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        def event(obj) -> None:
            d = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(d), d))

        for k in range(max(len(o[2]) for o in outs)):
            for i, (pr, words, toks) in enumerate(outs):
                if k >= len(toks):
                    continue
                ch = {"index": i, "text": toks[k], "logprobs": None,
                      "finish_reason": "stop" if k == len(toks) - 1 else None, "stop_reason": None}
                if ids:
                    if k == 0:
                        ch["prompt_token_ids"] = [len(w) for w in words]
                    ch["token_ids"] = [len(toks[k])]
                c = {"id": cid, "object": "text_completion", "created": created, "model": j["model"],
                     "choices": [ch]}
                if so.get("include_usage") and so.get("continuous_usage_stats"):
                    c["usage"] = _usage(len(words), k + 1)
                event(c)
            self.wfile.flush()
            if k == 0 and any("HOLD" in o[0] for o in outs):
                srv.release.wait(30)
        if so.get("include_usage"):
            event({"id": cid, "object": "text_completion", "created": created, "model": j["model"], "choices": [],
                   "usage": _usage(sum(len(o[1]) for o in outs), sum(len(o[2]) for o in outs))})
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


@pytest.fixture
def upstream():
    u = _Upstream()
    yield u
    u.shutdown()
    u.server_close()


def _post_together(url: str, bodies: list[dict]) -> list[httpx.Response]:
    """Sends the bodies at once, each on its own connection; their answers in order."""
    out: list[httpx.Response | None] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def go(i):
        with httpx.Client(timeout=30) as c:
            barrier.wait()
            out[i] = c.post(url, json=bodies[i], headers={"x-request-id": f"r{i}"})

    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return out  # type: ignore[return-value]


# --- 1. a deadline after the send is answered at the deadline ---

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_member_cut_by_its_deadline_is_answered_at_it_not_at_its_prompts_end(upstream, weir, stream):
    w = weir(config={"pools": {"p": {"endpoints": [upstream.base_url], "retry": {"attempts": 1},
                                     "batch": {"window": "1s", "max_size": 2}}},
                     "default_pool": "p", "pricing": {"*": {"input": 1.0, "output": 2.0}}}, workers=1)
    body = {"model": "m", "max_tokens": 9, "stream": stream}
    answers: dict = {}

    def post(rid: str, prompt: str, headers: dict):
        with httpx.Client(timeout=30) as c:
            answers[rid] = c.post(w.v1 + "/completions", json={**body, "prompt": prompt},
                                  headers={"x-request-id": rid, **headers})

    # The upstream holds the batch after each prompt's first token (the stayer's "HOLD") until released: the
    # member's deadline passes while its prompt is still being generated for the batch.
    ts = [threading.Thread(target=post, args=("stay", "stayer HOLD", {})),
          threading.Thread(target=post, args=("dead", "dead one", {"x-weir-timeout-ms": "500"}))]
    [t.start() for t in ts]
    try:
        # Its answer (a 504, or the stream's error and end) comes at its deadline, while the upstream still
        # holds its prompt: not when that prompt ends upstream.
        wait_until(lambda: "dead" in answers, timeout=10, message="the deadline's answer before the prompt's end")
        assert "stay" not in answers
    finally:
        upstream.release.set()
        [t.join() for t in ts]
    dead, stay = answers["dead"], answers["stay"]
    assert stay.status_code == 200, stay.text
    if stream:
        assert dead.status_code == 200
        assert "deadline_exceeded" in dead.text and dead.text.rstrip().endswith("data: [DONE]"), dead.text
    else:
        assert dead.status_code == 504, dead.text
        assert dead.json()["error"]["code"] == "deadline_exceeded", dead.text
        # Its connection is read again only after the settlement: the client's next request goes on another.
        assert dead.headers.get("connection") == "close", dead.headers
    # One log line, written once the prompt ended upstream: charged what was generated for it (its 3 tokens).
    line = w.log_for("dead", timeout=10)
    assert line["status"] == (200 if stream else 504), line
    assert "deadline_exceeded" in json.dumps(line.get("error")), line
    assert line["batch"]["size"] == 2, line
    assert (line["prompt_tokens"], line["completion_tokens"]) == (2, 3), line
    assert line["spend_usd"] == pytest.approx((2 * 1.0 + 3 * 2.0) / 1e6), line
    completions = [e for e in w.log_entries() if e["path"] == "/v1/completions"]
    assert sorted(e["request_id"] for e in completions) == ["dead", "stay"], completions


# --- 2. a non-streaming answer the assembled shape cannot hold is not batched ---

def _batched_config(up) -> dict:
    return {"pools": {"p": {"endpoints": [up.base_url], "batch": {"window": "300ms", "max_size": 2}}},
            "default_pool": "p"}


def test_non_streaming_requests_without_extras_still_batch(upstream, weir):
    w = weir(config=_batched_config(upstream), workers=1)
    rs = _post_together(w.v1 + "/completions",
                        [{"model": "m", "prompt": f"prompt {i}", "max_tokens": 9} for i in range(2)])
    assert [r.status_code for r in rs] == [200, 200]
    assert [b["prompt"] for b in upstream.bodies()] in (
        [["prompt 0", "prompt 1"]], [["prompt 1", "prompt 0"]]), upstream.bodies()


@pytest.mark.parametrize("extra", [
    {"return_token_ids": True},
    {"kv_transfer_params": {"do_remote_decode": True}},
    {"vllm_future_option": {"on": 1}},
], ids=["return_token_ids", "kv_transfer_params", "unknown_member"])
def test_a_non_streaming_answer_the_assembler_cannot_rebuild_is_not_batched(upstream, weir, extra):
    w = weir(config=_batched_config(upstream), workers=1)
    bodies = [{"model": "m", "prompt": f"prompt {i}", "max_tokens": 9, **extra} for i in range(2)]
    rs = _post_together(w.v1 + "/completions", bodies)
    assert [r.status_code for r in rs] == [200, 200], [r.text for r in rs]
    # Each went alone: the upstream got one prompt per request, and each client its own whole answer.
    sent = upstream.bodies()
    assert sorted(b["prompt"] for b in sent) == ["prompt 0", "prompt 1"], sent
    for i, r in enumerate(rs):
        j = r.json()
        ch = j["choices"][0]
        assert ch["text"] == f" prompt {i} end", j
        if "return_token_ids" in extra:
            assert ch["token_ids"] == [7, 2, 4] and ch["prompt_token_ids"] == [6, 1], j
        if "kv_transfer_params" in extra:
            assert j["kv_transfer_params"] == extra["kv_transfer_params"], j
        assert "batch" not in w.log_for(f"r{i}"), w.log_for(f"r{i}")


def test_a_streaming_member_with_token_ids_still_batches_and_gets_them(upstream, weir):
    w = weir(config=_batched_config(upstream), workers=1)
    bodies = [{"model": "m", "prompt": f"prompt {i}", "max_tokens": 9, "stream": True, "return_token_ids": True}
              for i in range(2)]
    rs = _post_together(w.v1 + "/completions", bodies)
    assert len(upstream.bodies()) == 1 and len(upstream.bodies()[0]["prompt"]) == 2, upstream.bodies()
    for i, r in enumerate(rs):
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        assert chunks[0]["choices"][0]["prompt_token_ids"] == [6, 1], chunks
        assert [c["choices"][0]["token_ids"][0] for c in chunks if c["choices"]] == [7, 2, 4], chunks


# --- 3. a member that leaves in the retry's backoff is not sent again, nor charged ---

def _raw(port: int, body: dict, rid: str) -> socket.socket:
    b = json.dumps(body)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\n"
               f"Connection: close\r\nx-request-id: {rid}\r\nContent-Length: {len(b)}\r\n\r\n{b}").encode())
    return s


def _read_all(s: socket.socket) -> bytes:
    s.settimeout(30)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    s.close()
    return got


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_member_that_leaves_in_the_retry_backoff_is_not_retried_nor_charged(upstream, weir, stream):
    w = weir(config={"pools": {"p": {"endpoints": [upstream.base_url], "retry": {"attempts": 3},
                                     "batch": {"window": "1s", "max_size": 2}}},
                     "default_pool": "p", "pricing": {"*": {"input": 1.0, "output": 2.0}}}, workers=1)
    body = {"model": "m", "max_tokens": 5, "stream": stream}
    stayer = _raw(w.port, {**body, "prompt": "stayer"}, "stay")
    leaver = _raw(w.port, {**body, "prompt": "leaver FAIL503"}, "leave")
    # The batch's first attempt was answered 503 (Retry-After: 1): the leaver goes in the backoff.
    wait_until(lambda: len(upstream.bodies()) == 1, timeout=10, message="the batch's first attempt")
    assert sorted(upstream.bodies()[0]["prompt"]) == ["leaver FAIL503", "stayer"]
    leaver.close()
    out = _read_all(stayer)
    assert out.startswith(b"HTTP/1.1 200"), out
    assert b"stayer" in out or b" stayer" in out, out
    # The retry carried only the member still there.
    sent = upstream.bodies()
    assert len(sent) == 2 and sent[1]["prompt"] == ["stayer"], sent
    leave = w.log_for("leave", timeout=10)
    assert leave["status"] == 499, leave
    assert leave["prompt_tokens"] is None and leave["completion_tokens"] is None, leave
    assert not leave.get("spend_usd"), leave
    stay = w.log_for("stay")
    assert stay["status"] == 200 and stay["completion_tokens"] == 2, stay


def test_a_batch_every_member_left_in_the_backoff_sends_nothing_more(upstream, weir):
    w = weir(config={"pools": {"p": {"endpoints": [upstream.base_url], "retry": {"attempts": 3},
                                     "batch": {"window": "1s", "max_size": 2}}},
                     "default_pool": "p"}, workers=1)
    body = {"model": "m", "max_tokens": 5, "stream": True}
    a = _raw(w.port, {**body, "prompt": "a FAIL503"}, "a")
    b = _raw(w.port, {**body, "prompt": "b"}, "b")
    wait_until(lambda: len(upstream.bodies()) == 1, timeout=10, message="the batch's first attempt")
    a.close()
    b.close()
    for rid in ("a", "b"):
        assert w.log_for(rid, timeout=10)["status"] == 499
    # The batch was aborted in its backoff: no retry goes.
    wait_until(lambda: w.metric("weir_batches_aborted_total") >= 1, timeout=5, message="the batch's abort")
    assert w.metric("weir_upstream_retries_total") == 0
    assert len(upstream.bodies()) == 1, upstream.bodies()
