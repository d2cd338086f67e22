"""Attacks on micro-batching and request coalescing (docs/batching.md): each test is a defect found
by breaking the contract "every member gets what the same request gets unbatched, apart from
`created`", and fails until it is fixed. The reference is always the same request through a Weir
without batching (or straight to weir-mock), so the expectations are the unbatched behaviour."""

from __future__ import annotations

import concurrent.futures as cf
import http.server
import json
import threading

import httpx
import pytest

from conftest import wait_until
from test_batching import CREATED, FAST, batch_config, coalesce_config, completion_lines, in_parallel


def post(base_url: str, body, request_id: str, headers: dict | None = None,
         path: str = "/v1/completions") -> tuple[int, bytes, httpx.Headers]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(base_url + path, content=content, timeout=30,
                   headers={"content-type": "application/json", "x-request-id": request_id, **(headers or {})})
    return r.status_code, r.content, r.headers


def plain_config(*mocks, **pool_extra) -> dict:
    """The same pool without batching: the reference."""
    return {"pools": {"gpu": {"endpoints": [m.base_url for m in mocks], **pool_extra}}, "default_pool": "gpu"}


def same(a: bytes, b: bytes) -> bool:
    return CREATED.sub(b"", a) == CREATED.sub(b"", b)


# --- 1. the first member's request headers go upstream for every member ---------------------------

def test_a_members_own_headers_decide_its_own_answer(mock, weir):
    # Without auth: and pools.X.api_key, the client's own headers (its Authorization for a vLLM run
    # with --api-key, here an x-mock-status the upstream acts on) reach the upstream. Batched, only
    # the lead member's headers are sent: whichever of the two leads, one gets the other's answer.
    up = mock(*FAST)
    w = weir(config=batch_config(up, window="1s", max_size=2), workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"tenant {i}", "max_tokens": 3}
    got = in_parallel(post, [(w.base_url, body(0), "refused", {"x-mock-status": "401"}),
                             (w.base_url, body(1), "served", {})])
    assert [s for s, _, _ in got] == [401, 200]


def test_a_members_credential_is_not_lent_to_another(mock, weir):
    # Alice's Authorization must go upstream with Alice's prompt, and never with Bob's.
    up = mock(*FAST)
    w = weir(config=batch_config(up, window="1s", max_size=2), workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"who {i}", "max_tokens": 3}
    got = in_parallel(post, [(w.base_url, body(0), "alice", {"authorization": "Bearer sk-alice", "x-mock-echo": "1"}),
                             (w.base_url, body(1), "bob", {"x-mock-echo": "1"})])
    seen = [h.get("x-mock-headers", "").split(",") for _, _, h in got]
    assert "authorization" in seen[0], "alice's credential did not reach the upstream with her request"
    assert "authorization" not in seen[1], "bob's request went upstream with alice's credential"


def test_a_coalesced_follower_is_not_served_on_the_leaders_headers(mock, weir):
    up = mock("--ttft-ms", "800", "--itl-ms", "5", "--max-tokens", "4")
    w = weir(config=coalesce_config(up), workers=1)
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "q"}], "temperature": 0}
    with cf.ThreadPoolExecutor(2) as ex:
        leader = ex.submit(post, w.base_url, body, "lead", {}, "/v1/chat/completions")
        wait_until(lambda: up.metric("vllm:num_requests_running") >= 1, timeout=10, message="the leader in flight")
        follower = ex.submit(post, w.base_url, body, "follow", {"x-mock-status": "401"}, "/v1/chat/completions")
        assert leader.result()[0] == 200
        assert follower.result()[0] == 401  # what it gets on its own


# --- 2. fallbacks do not apply to batched requests ---------------------------------------------------

def fallback_config(primary, backup, batch: bool) -> dict:
    gpu = {"endpoints": [primary.base_url]}
    if batch:
        gpu["batch"] = {"window": "1s", "max_size": 2}
    return {"pools": {"gpu": gpu, "backup": {"endpoints": [backup.base_url]}},
            "models": {"mock-model": {"pool": "gpu", "fallbacks": [{"pool": "backup"}]}}, "default_pool": "gpu"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fault", [("--error-rate", "1", "--error-status", "503"),
                                   ("--error-rate", "1", "--error-status", "429"),
                                   ("--reset-after", "0")], ids=["503", "429", "reset-before-token"])
def test_a_batch_the_primary_pool_fails_falls_back(mock, weir, stream, fault):
    bad = mock(*FAST, *fault)
    good = mock(*FAST)
    batched = weir(config=fallback_config(bad, good, batch=True), workers=1)
    plain = weir(config=fallback_config(bad, good, batch=False), workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"fall back {i}", "max_tokens": 3, "stream": stream}
    got = in_parallel(post, [(batched.base_url, body(i), f"fb-{i}") for i in range(2)])
    want = [post(plain.base_url, body(i), f"fb-{i}") for i in range(2)]
    for (gs, gb, _), (ws, wb, _) in zip(got, want):
        assert ws == 200  # unbatched: the backup pool answers
        assert gs == ws and same(gb, wb)


# --- 3. fields vLLM validates are normalised away ------------------------------------------------------

def test_a_non_streaming_request_with_stream_options_is_refused_as_unbatched(mock, weir):
    # vLLM (and weir-mock) refuse stream_options without "stream": true with 400; the batch's
    # body replaces stream_options and sets stream, so the members get 200.
    up = mock(*FAST)
    batched = weir(config=batch_config(up, window="1s", max_size=2), workers=1)
    plain = weir(config=plain_config(up), workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"so {i}", "max_tokens": 3,
                      "stream_options": {"include_usage": True}}
    got = in_parallel(post, [(batched.base_url, body(i), f"so-{i}") for i in range(2)])
    want = [post(plain.base_url, body(i), f"so-{i}") for i in range(2)]
    assert [s for s, _, _ in want] == [400, 400]
    for (gs, gb, _), (ws, wb, _) in zip(got, want):
        assert gs == ws and gb == wb


def test_a_coalesced_follower_with_stream_options_is_refused_as_unbatched(mock, weir):
    # The coalescing key leaves stream_options out: an invalid request (stream_options on a
    # non-streaming chat) joins a valid one's generation and is answered 200 instead of 400.
    up = mock("--ttft-ms", "800", "--itl-ms", "5", "--max-tokens", "4")
    w = weir(config=coalesce_config(up), workers=1)
    good = {"model": "mock-model", "messages": [{"role": "user", "content": "q"}], "temperature": 0}
    bad = dict(good, stream_options={"include_usage": True})
    with cf.ThreadPoolExecutor(2) as ex:
        leader = ex.submit(post, w.base_url, good, "good", {}, "/v1/chat/completions")
        wait_until(lambda: up.metric("vllm:num_requests_running") >= 1, timeout=10, message="the leader in flight")
        follower = ex.submit(post, w.base_url, bad, "bad", {}, "/v1/chat/completions")
        assert leader.result()[0] == 200
        assert follower.result()[0] == 400


# --- 4. a non-streaming member is held to the stream's idle timeout ----------------------------------

def test_a_non_streaming_member_is_not_cut_by_the_idle_timeout(mock, weir):
    # Unbatched, a non-streaming request waits for its whole answer (timeouts.response); batched,
    # it is served from a stream, and a pause between two tokens longer than timeouts.idle is a 504.
    up = mock(*FAST, "--stall-after", "2", "--stall-ms", "1500")
    pool = {"timeouts": {"idle": "300ms"}}
    batched = weir(config=batch_config(up, window="1s", max_size=2, **pool), workers=1)
    plain = weir(config=plain_config(up, **pool), workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"pause {i}", "max_tokens": 5}
    got = in_parallel(post, [(batched.base_url, body(i), f"idle-{i}") for i in range(2)])
    want = [post(plain.base_url, body(i), f"idle-{i}") for i in range(2)]
    for (gs, gb, _), (ws, wb, _) in zip(got, want):
        assert ws == 200
        assert gs == ws and same(gb, wb)


# --- a scripted vLLM: what weir-mock cannot do (choices of one list ending apart, in-band errors) ----

class ScriptedVllm:
    """A one-shot fake vLLM /v1/completions: `script(prompts, send)` writes the SSE events."""

    def __init__(self, script):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                rid = self.headers.get("x-request-id", "x")
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()

                def send(data: str):
                    ev = f"data: {data}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                    self.wfile.flush()

                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                script(f"cmpl-{rid}", prompts, send)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def chunk(cid: str, index: int, text: str, finish, completion_tokens: int) -> str:
    return json.dumps({"id": cid, "object": "text_completion", "created": 1, "model": "mock-model",
                       "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish,
                                    "stop_reason": None, "prompt_logprobs": None}],
                       "usage": {"prompt_tokens": 2, "total_tokens": 2 + completion_tokens,
                                 "completion_tokens": completion_tokens, "prompt_tokens_details": None}},
                      separators=(",", ":"))


def final_usage(cid: str, n: int, completion_tokens: int) -> str:
    return json.dumps({"id": cid, "object": "text_completion", "created": 1, "model": "mock-model", "choices": [],
                       "usage": {"prompt_tokens": 2 * n, "total_tokens": 2 * n + completion_tokens,
                                 "completion_tokens": completion_tokens, "prompt_tokens_details": None}},
                      separators=(",", ":"))


@pytest.fixture
def scripted():
    made: list[ScriptedVllm] = []

    def make(script):
        s = ScriptedVllm(script)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_member_whose_generation_ended_is_not_held_for_the_longest(weir, scripted, stream):
    # vLLM ends each prompt of a list on its own (EOS, a stop string): a member whose choice has
    # finished must get its end then, as it would unbatched, not when the batch's last prompt ends.
    release = threading.Event()

    def script(cid, prompts, send):
        assert len(prompts) == 2
        send(chunk(cid, 0, " short", "stop", 1))
        send(chunk(cid, 1, " long", None, 1))
        release.wait(20)  # the other prompt is still generating
        send(chunk(cid, 1, " tail", "length", 2))
        send(final_usage(cid, 2, 3))
        send("[DONE]")

    up = scripted(script)
    w = weir(config={"pools": {"gpu": {"endpoints": [up.base_url], "batch": {"window": "1s", "max_size": 2}}},
                     "default_pool": "gpu"}, workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"p{i}", "max_tokens": 2, "stream": stream}
    barrier = threading.Barrier(2)

    def member(i):
        barrier.wait()
        return post(w.base_url, body(i), f"len-{i}")

    try:
        with cf.ThreadPoolExecutor(2) as ex:
            futures = [ex.submit(member, i) for i in range(2)]
            wait_until(lambda: any(f.done() for f in futures), timeout=5,
                       message="the member whose prompt finished got its whole answer")
            release.set()
            done = [f.result() for f in futures if b" short" in f.result()[1]]
        assert len(done) == 1 and done[0][0] == 200
        if stream:
            assert done[0][1].endswith(b"data: [DONE]\n\n")
        else:
            assert json.loads(done[0][1])["choices"][0]["finish_reason"] == "stop"
    finally:
        release.set()


def test_a_non_streaming_member_does_not_get_200_for_a_generation_that_failed(weir, scripted):
    # vLLM ends a failed stream with an in-band {"error": ...} event. A streaming member gets it
    # (right); a non-streaming one is answered 200 with the text so far and finish_reason null, a
    # truncated answer that looks complete. Unbatched, vLLM answers such a request with an error.
    def script(cid, prompts, send):
        for i in range(len(prompts)):
            send(chunk(cid, i, " partial", None, 1))
        send(json.dumps({"error": {"message": "engine dead", "type": "InternalServerError", "param": None,
                                   "code": 500}}))
        send("[DONE]")

    up = scripted(script)
    w = weir(config={"pools": {"gpu": {"endpoints": [up.base_url], "batch": {"window": "1s", "max_size": 2}}},
                     "default_pool": "gpu"}, workers=1)
    body = lambda i: {"model": "mock-model", "prompt": f"p{i}", "max_tokens": 4}
    got = in_parallel(post, [(w.base_url, body(i), f"err-{i}") for i in range(2)])
    for status, content, _ in got:
        assert status >= 500 and "error" in json.loads(content), content
    assert all(e["status"] >= 500 for e in completion_lines(w, 2))
