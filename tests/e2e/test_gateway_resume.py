"""Resume mid-stream (pools.X.resume, docs/upstreams.md#resume-mid-stream): a chat-completions
stream whose upstream breaks after content reached the client goes on from another endpoint of the
pool (vLLM's continue_final_message), on the same SSE stream, with no text lost or repeated, one id,
one finish_reason, one [DONE], usage over both attempts and one access-log line naming both.

The faults are weir-mock's ``x-mock-reset-after: N`` (a client header Weir forwards): an RST when the
message reaches N tokens. A continuation starts at the prefix's length, past N, so the endpoint that
takes the resume does not break again: every endpoint can run the same mock flags."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest

from conftest import Mock, free_port

MSG = [{"role": "user", "content": "tell me a story about a river"}]
TOKENS = 12
FAST = ("--ttft-ms", "1", "--itl-ms", "2", "--max-tokens", str(TOKENS))
BREAK = {"x-mock-reset-after": "4"}


def pool_config(endpoints: list[str], resume: bool = True, **pool_extra) -> dict:
    return {"pools": {"gpu": {"endpoints": endpoints, "resume": resume, **pool_extra}},
            "models": {"mock-model": {"pool": "gpu"}}}


def unbroken(m: Mock, **extra) -> tuple[str, dict]:
    """The same request straight to a healthy mock: its text and usage."""
    direct = openai.OpenAI(base_url=m.v1, api_key="x", max_retries=0)
    chunks = list(direct.chat.completions.create(model="mock-model", messages=MSG, stream=True,
                                                  stream_options={"include_usage": True}, **extra))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return text, chunks[-1].usage.model_dump()


def raw_stream(w, body: dict, headers: dict) -> list[str]:
    """The data fields of every SSE event the client got, in order ([DONE] included)."""
    with httpx.stream("POST", w.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    out = []
    for block in raw.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln.startswith("data: ")]
        if lines:
            out.append("\n".join(ln[6:] for ln in lines))
    return out


def served(m: Mock) -> float:
    return m.metric("vllm:request_success_total") + m.metric("weir_mock_injected_resets_total")


@pytest.fixture
def two(mock):
    return mock(*FAST), mock(*FAST)


def test_a_stream_reset_mid_way_resumes_on_the_other_endpoint_with_the_same_text(two, mock, weir):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url]))
    want, want_usage = unbroken(mock(*FAST))
    c = w.client()
    chunks = list(c.chat.completions.create(model="mock-model", messages=MSG, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_headers={**BREAK, "x-request-id": "resume-1"}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == want
    assert len({ch.id for ch in chunks}) == 1
    assert len({ch.created for ch in chunks}) == 1
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert len([ch for ch in chunks if ch.choices and ch.choices[0].delta.role]) == 1
    usage = chunks[-1].usage
    assert usage.prompt_tokens == want_usage["prompt_tokens"]
    assert usage.completion_tokens == want_usage["completion_tokens"] == TOKENS
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    entry = w.log_for("resume-1")  # exactly one line
    assert entry["status"] == 200 and entry["error"] is None
    assert entry["retries"] == 1
    first, second = entry["attempts"]
    assert first["failure"] == "reset" and first["status"] == 200 and "resume" not in first
    assert second["resume"] is True and second["status"] == 200 and second["failure"] is None
    assert first["endpoint"] != second["endpoint"]
    assert entry["endpoint"] == second["endpoint"]
    assert entry["completion_tokens"] == TOKENS and entry["prompt_tokens"] == want_usage["prompt_tokens"]
    assert w.metric("weir_upstream_resumes_total") == 1
    assert served(a) + served(b) == 2


def test_a_stream_stalled_mid_way_past_the_idle_timeout_resumes(two, mock, weir):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url], timeouts={"idle": "300ms"}))
    want, _ = unbroken(mock(*FAST))
    events = raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True},
                        {"x-mock-stall-after": "5", "x-mock-stall-ms": "5000"})
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == want
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert [x["failure"] for x in entry["attempts"]] == ["timeout", None]
    assert w.metric("weir_upstream_resumes_total") == 1
    assert a.aborts() + b.aborts() == 1  # the stalled generation was cancelled upstream


def test_the_raw_stream_has_one_role_one_finish_one_done_and_no_error(two, mock, weir):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url]))
    want, _ = unbroken(mock(*FAST))
    # no include_usage from the client: Weir asks for it and drops it, also from the continuation
    events = raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True}, BREAK)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in ch for ch in chunks)
    assert not any("usage" in ch and ch.get("usage") for ch in chunks)
    assert len({ch["id"] for ch in chunks}) == 1
    assert sum(1 for ch in chunks if "role" in ch["choices"][0]["delta"]) == 1
    assert sum(1 for ch in chunks if ch["choices"][0]["finish_reason"]) == 1
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == want
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["completion_tokens"] == TOKENS


def test_max_tokens_is_lowered_by_what_was_produced(two, mock, weir):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url]))
    want, want_usage = unbroken(mock(*FAST), max_tokens=7)
    chunks = list(w.client().chat.completions.create(model="mock-model", messages=MSG, stream=True, max_tokens=7,
                                                     stream_options={"include_usage": True}, extra_headers=BREAK))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 7 == want_usage["completion_tokens"]
    assert w.metric("weir_upstream_resumes_total") == 1


def test_a_break_right_after_the_last_token_finishes_the_stream(two, mock, weir):
    # max_tokens 4 is used up exactly where the RST comes: nothing is left to continue, so the stream ends.
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url]))
    want, _ = unbroken(mock(*FAST), max_tokens=4)
    events = raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True, "max_tokens": 4}, BREAK)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in ch for ch in chunks)
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"]) == want
    assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"] and
            ch["choices"][0]["finish_reason"]] == ["length"]
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["status"] == 200 and entry["error"] is None
    assert w.metric("weir_upstream_resumes_total") == 0
    assert served(a) + served(b) == 1


def assert_in_band_error(events: list[str]) -> None:
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert "error" in json.loads(events[-2])
    assert sum(1 for e in events[:-1] if "error" in json.loads(e)) == 1


def test_with_resume_off_the_break_is_an_in_band_error(two, weir):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url], resume=False))
    assert_in_band_error(raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True}, BREAK))
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["status"] == 200 and entry["error"]["code"] == "upstream_unavailable"
    assert "attempts" not in entry
    assert w.metric("weir_upstream_resumes_total") == 0
    assert served(a) + served(b) == 1


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": True}, {"logprobs": True, "top_logprobs": 2}],
                         ids=["n2", "logprobs", "top_logprobs"])
def test_what_a_continuation_cannot_reproduce_is_not_resumed(two, weir, extra):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url]))
    assert_in_band_error(raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True, **extra}, BREAK))
    assert w.metric("weir_upstream_resumes_total") == 0
    assert served(a) + served(b) == 1


def test_other_routes_are_not_resumed(two, weir):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url]))
    with httpx.stream("POST", w.base_url + "/v1/completions", headers=BREAK, timeout=30,
                      json={"model": "mock-model", "prompt": "hi", "stream": True}) as r:
        raw = r.read().decode()
    assert '"error"' in raw and raw.count("data: [DONE]") == 1
    assert w.metric("weir_upstream_resumes_total") == 0


def test_when_every_other_endpoint_is_down_the_break_is_an_in_band_error(mock, weir):
    a = mock(*FAST)
    dead = f"http://127.0.0.1:{free_port()}"
    w = weir(config=pool_config([a.base_url, dead]), workers=1)
    for _ in range(3):
        assert_in_band_error(raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True}, BREAK))
    entries = w.wait_log(lambda es: len(es) >= 3)
    assert len(entries) == 3
    for e in entries:
        assert e["status"] == 200 and e["error"] is not None
        # the live endpoint broke; the resume found only the dead one (refused, or ejected and not tried)
        broke = [x for x in e["attempts"] if x["failure"] == "reset"]
        assert len(broke) == 1 and broke[0]["endpoint"] == a.base_url
        assert all(x.get("resume") for x in e["attempts"][e["attempts"].index(broke[0]) + 1:])
    assert w.metric("weir_upstream_resumes_total") == 0
    assert served(a) == 3  # never sent back to the endpoint that broke


def test_a_one_endpoint_pool_does_not_resume_on_the_endpoint_that_broke(mock, weir):
    a = mock(*FAST)
    w = weir(config=pool_config([a.base_url]))
    assert_in_band_error(raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True}, BREAK))
    assert served(a) == 1


class Replay:
    """A raw upstream that answers every request with a vLLM stream of `deltas` (a role chunk first), then
    ends it without [DONE] or a finish_reason: `ending` "close" (the connection closed mid-body),
    "eof" (a complete chunked body: the upstream just stopped) or "close-delimited" (no length and no
    chunking: the close that ends the body comes early)."""

    def __init__(self, deltas: list[dict], ending: str = "close"):
        self.deltas = [{"role": "assistant", "content": ""}, *deltas]
        self.ending = ending
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                got = conn.recv(65536)
                if not got:
                    return
                data += got
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                          if ln.lower().startswith(b"content-length"))
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            plain = self.ending == "close-delimited"
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n" +
                         (b"" if plain else b"transfer-encoding: chunked\r\n") + b"connection: close\r\n\r\n")
            base = {"id": "chatcmpl-replay", "object": "chat.completion.chunk", "created": 1, "model": "mock-model"}
            for delta in self.deltas:
                ev = b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                  "finish_reason": None}]}).encode() + b"\n\n"
                conn.sendall(ev if plain else b"%x\r\n%s\r\n" % (len(ev), ev))
            if self.ending == "eof":
                conn.sendall(b"0\r\n\r\n")
                conn.recv(1)  # until Weir closes (connection: close)

    def close(self):
        self.sock.close()


def test_a_tool_call_in_flight_is_not_resumed(weir):
    tool = {"tool_calls": [{"id": "call_1", "type": "function", "index": 0, "function": {"name": "f"}}]}
    ups = [Replay([{"content": "Let me look."}, tool]), Replay([{"content": "Let me look."}, tool])]
    try:
        w = weir(config=pool_config([u.base_url for u in ups]))
        events = raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True,
                                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, {})
        assert_in_band_error(events)
        assert any("tool_calls" in json.loads(e)["choices"][0]["delta"] for e in events[:-2])
        assert sum(u.requests for u in ups) == 1
        assert w.metric("weir_upstream_resumes_total") == 0
    finally:
        for u in ups:
            u.close()


@pytest.mark.parametrize("ending", ["close", "eof", "close-delimited"])
def test_a_stream_that_stops_without_done_is_resumed_from_its_text(mock, weir, ending):
    # The replay sends the mock's own first 3 tokens, then stops: the resume on the mock brings the rest.
    healthy = mock(*FAST)
    direct = openai.OpenAI(base_url=healthy.v1, api_key="x", max_retries=0)
    tokens = [ch.choices[0].delta.content for ch in direct.chat.completions.create(
        model="mock-model", messages=MSG, stream=True) if ch.choices and ch.choices[0].delta.content]
    want = "".join(tokens)
    cut = Replay([{"content": t} for t in tokens[:3]], ending)
    try:
        w = weir(config=pool_config([cut.base_url, healthy.base_url]), workers=1)
        for _ in range(24):  # p2c picks either endpoint first: 2^-24 that the replay is never first
            events = raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True}, {})
            assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
            chunks = [json.loads(e) for e in events[:-1]]
            assert not any("error" in ch for ch in chunks)
            assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"]) == want
            # the replay's id and created differ from the mock's: the continuation's chunks carry the replay's
            assert len({ch["id"] for ch in chunks}) == 1 and len({ch["created"] for ch in chunks}) == 1
            if cut.requests:
                assert chunks[-1]["id"] == "chatcmpl-replay" and chunks[-1]["created"] == 1
                break
        assert cut.requests == 1, "the replay endpoint was never picked first"
        assert w.metric("weir_upstream_resumes_total") == 1
        entries = w.wait_log(lambda es: any("attempts" in e for e in es))
        (entry,) = [e for e in entries if "attempts" in e]
        assert entry["attempts"][0]["failure"] in ("protocol", "reset")
        assert entry["attempts"][1]["resume"] is True
    finally:
        cut.close()


def test_the_knob_is_refused_for_an_anthropic_pool(weir, tmp_path):
    import subprocess
    from conftest import binary
    cfg = tmp_path / "w.yaml"
    cfg.write_text("pools:\n  a:\n    type: anthropic\n    endpoints: [http://127.0.0.1:9]\n    resume: true\n"
                   "models:\n  m: {pool: a}\n")
    r = subprocess.run([binary("weir"), "--config", str(cfg), "--check"], capture_output=True, text=True)
    assert r.returncode != 0 and "pools.a.resume" in (r.stdout + r.stderr)


def test_the_requests_deadline_ends_it_without_a_resume(two, weir):
    a, b = two
    w = weir(config=pool_config([a.base_url, b.base_url], timeouts={"idle": "10s"}))
    events = raw_stream(w, {"model": "mock-model", "messages": MSG, "stream": True},
                        {"x-mock-stall-after": "5", "x-mock-stall-ms": "5000", "x-weir-timeout-ms": "400"})
    assert_in_band_error(events)
    assert json.loads(events[-2])["error"]["code"] == "deadline_exceeded"
    assert w.metric("weir_upstream_resumes_total") == 0
    assert served(a) + served(b) == 0 or a.aborts() + b.aborts() == 1
