"""Streams broken before their first token, and a charge on a client that left (stop 62's faults round):
- a chat stream on a pool with `resume: true` whose upstream failed after its head (and vLLM's role-only
  chunk) but before any content (a reset, a half-written chunk, a stall past `timeouts.idle`, a clean end
  without `[DONE]`, vLLM's in-band error) ended with an in-band error, though healthy endpoints and attempts
  were left: only a break after content was resumed. It is now sent again as it was (a plain resend: the new
  attempt's role chunk dropped, one id, usage and spend counted once, both attempts in the log);
- on a pool with `retry.attempts` > 1 and no resume, a stream's head went out at once, so a reset or a stall
  before its first content was never retried: the head now waits for the first content event, as it does
  with a fallback left, and such a stream goes again with nothing sent twice (on /v1/messages too);
- a non-streamed request whose client left while Weir read a stalled 2xx body was charged its prompt
  (logged 499), though a client that waited got a 504 and was charged nothing: nothing reached it either way.

The upstream is a scripted fault server (FaultUpstream) on two ports sharing one count per request: the first
`x-fault-times` attempts of a request (its `x-fault-key`) get the fault named by `x-fault`, later ones a whole
vLLM-like stream (role chunk, tok0..tok4, a finish chunk, the usage chunk when asked, [DONE]) whose id and
created name the attempt, so a test sees which attempt's id the client got."""
from __future__ import annotations

import json
import socket
import struct
import threading

import anthropic
import httpx
import openai
import pytest

from conftest import read_by_peer, wait_until
from test_defect_fixes_40 import AUTH, KEY, governed

MSG = [{"role": "user", "content": "tell me a story"}]
TEXT = "".join(f"tok{i} " for i in range(5))
PROMPT, COMPLETION = 10, 5


def _chunk(attempt: int, delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
    obj = {"id": f"chatcmpl-attempt{attempt}", "object": "chat.completion.chunk", "created": attempt,
           "model": "mock-model",
           "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                                 "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _framed(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


class FaultUpstream:
    """A raw vLLM-like upstream on two ports (one count of attempts per `x-fault-key`, shared by both)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.hits: dict[str, int] = {}
        self.sent_partial: dict[str, socket.socket] = {}  # key -> the connection of a stalled 2xx body
        self.socks = []
        for _ in range(2):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(64)
            self.socks.append(s)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{s.getsockname()[1]}" for s in self.socks]

    def attempts(self, key: str) -> int:
        with self.lock:
            return self.hits.get(key, 0)

    def close(self):
        for s in self.socks:
            s.close()

    def _accept(self, s):
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _rst(conn):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    @staticmethod
    def _wait_close(conn):
        conn.settimeout(60)
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass

    def _serve(self, conn):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buf += got
                head, buf = buf.split(b"\r\n\r\n", 1)
                h = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    k, v = line.split(":", 1)
                    h[k.strip().lower()] = v.strip()
                length = int(h.get("content-length", "0"))
                while len(buf) < length:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buf += got
                body, buf = buf[:length], buf[length:]
                req = json.loads(body or b"{}")
                key = h.get("x-fault-key", "")
                with self.lock:
                    self.hits[key] = nth = self.hits.get(key, 0) + 1
                spec = h.get("x-fault", "ok") if nth <= int(h.get("x-fault-times", "1")) else "ok"
                if not self._answer(conn, key, nth, spec, req):
                    return
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, conn, key: str, nth: int, spec: str, req: dict) -> bool:
        """Answers one request; False when the connection is done."""
        if not req.get("stream"):
            answer = json.dumps({
                "id": f"chatcmpl-attempt{nth}", "object": "chat.completion", "created": nth, "model": "mock-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION,
                          "total_tokens": PROMPT + COMPLETION}}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                         % len(answer) + (answer[:20] if spec == "stall" else answer))
            if spec == "stall":  # the head and 20 bytes of the body, then nothing until Weir leaves
                with self.lock:
                    self.sent_partial[key] = conn
                self._wait_close(conn)
                return False
            return True
        usage = {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "total_tokens": PROMPT + COMPLETION}
        events = [_chunk(nth, {"role": "assistant", "content": ""})]
        events += [_chunk(nth, {"content": f"tok{i} "}) for i in range(5)]
        events.append(_chunk(nth, {}, "stop"))
        if (req.get("stream_options") or {}).get("include_usage"):
            events.append(_chunk(nth, None, usage=usage))
        events.append(b"data: [DONE]\n\n")
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        name, _, n = spec.partition(":")
        n = int(n or 0)
        if name == "headreset":  # the head alone, then a reset: no role chunk reached anyone
            self._rst(conn)
            return False
        if name == "ok":
            conn.sendall(b"".join(_framed(e) for e in events) + b"0\r\n\r\n")
            return True
        conn.sendall(b"".join(_framed(e) for e in events[:1 + n]))  # the role chunk and n tokens
        if name == "reset":
            self._rst(conn)
        elif name == "halfchunk":  # half of the next chunk, then the connection closed
            e = events[1 + n]
            conn.sendall(b"%x\r\n%s" % (len(e), e[:len(e) // 2]))
            conn.close()
        elif name == "nodone":  # a clean end of the body without [DONE]
            conn.sendall(b"0\r\n\r\n")
            return True
        elif name == "error":  # vLLM's in-band error event, then [DONE]
            err = b'data: {"error": {"object": "error", "message": "engine fault", "type": "InternalServerError", ' \
                  b'"param": null, "code": 500}}\n\n'
            conn.sendall(_framed(err) + _framed(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            return True
        elif name == "stall":
            self._wait_close(conn)
        return False


@pytest.fixture
def up():
    u = FaultUpstream()
    yield u
    u.close()


def _config(up: FaultUpstream, *, resume: bool, attempts: int = 3) -> dict:
    pool = {"endpoints": up.urls, "retry": {"attempts": attempts, "backoff": "10ms"},
            "timeouts": {"idle": "1s"}, "resume": resume}
    return governed({"p": pool}, {"m": {"pool": "p", "upstream_model": "mock-model"}})


def _events(w, rid: str, fault: str, path: str = "/v1/chat/completions", **body) -> list[str]:
    """The data of every SSE event the client got ([DONE] included)."""
    headers = {**AUTH, "x-request-id": rid, "x-fault": fault, "x-fault-key": rid}
    with httpx.stream("POST", w.base_url + path, headers=headers, timeout=30,
                      json={"model": "m", "messages": MSG, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        raw = r.read().decode()
    out = []
    for block in raw.split("\n\n"):
        lines = [ln[6:] for ln in block.split("\n") if ln.startswith("data: ")]
        if lines:
            out.append("\n".join(lines))
    return out


def _assert_one_whole_stream(events: list[str], first_id: str) -> None:
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1, events
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), events
    assert {c["id"] for c in chunks} == {first_id}, events  # one stream: the id the client saw first
    roles = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert len(roles) == 1, events
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == TEXT
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]].count("stop") == 1, events
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage == [{"prompt_tokens": PROMPT, "completion_tokens": COMPLETION,
                      "total_tokens": PROMPT + COMPLETION}], events


def _assert_logged_once(w, rid: str, *, resume: bool, failures: tuple[str, ...]) -> None:
    line = w.log_for(rid, timeout=10)
    assert line["status"] == 200 and line.get("error") is None, line
    assert line["prompt_tokens"] == PROMPT and line["completion_tokens"] == COMPLETION, line
    assert "charged_tokens" not in line, line
    assert line["spend_usd"] == PROMPT + COMPLETION, line  # ($1 a token: charged once)
    assert line["retries"] == 1, line
    first, second = line["attempts"]
    assert first["failure"] in failures, line
    assert second.get("resume", False) is resume, line


# (The fault, what the access log calls it.) Each breaks the stream after its role chunk (headreset: before it).
BEFORE_CONTENT = {
    "reset:0": ("reset",),
    "headreset": ("reset",),
    "halfchunk:0": ("reset", "protocol"),
    "nodone:0": ("protocol",),
    "stall:0": ("timeout",),
    "error:0": ("protocol",),
}


@pytest.mark.parametrize("fault", list(BEFORE_CONTENT))
def test_under_resume_a_break_before_any_content_is_sent_again(up, weir, fault):
    w = weir(config=_config(up, resume=True), workers=1)
    rid = "resend-" + fault.replace(":", "")
    events = _events(w, rid, fault, stream_options={"include_usage": True})
    # The client's stream is the first attempt's, whose role chunk it had (with headreset it had none: the
    # second attempt's goes out, with that attempt's id).
    _assert_one_whole_stream(events, "chatcmpl-attempt2" if fault == "headreset" else "chatcmpl-attempt1")
    assert up.attempts(rid) == 2
    _assert_logged_once(w, rid, resume=True, failures=BEFORE_CONTENT[fault])
    assert w.metric("weir_upstream_resumes_total") == 1


def test_under_resume_the_openai_sdk_reads_one_whole_answer(up, weir):
    w = weir(config=_config(up, resume=True), workers=1)
    client = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=MSG, stream=True, stream_options={"include_usage": True},
        extra_headers={"x-request-id": "sdk", "x-fault": "reset:0", "x-fault-key": "sdk"})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    assert chunks[-1].usage.completion_tokens == COMPLETION
    _assert_logged_once(w, "sdk", resume=True, failures=("reset",))


def test_under_resume_a_break_after_content_is_still_a_continuation_not_a_resend(up, weir):
    # (The continuation's body carries the text so far; the upstream here answers it whole, so only the
    # request it got tells a resend from a continuation: the log's attempts and one role chunk do.)
    w = weir(config=_config(up, resume=True), workers=1)
    events = _events(w, "after2", "reset:2")
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), events
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.startswith("tok0 tok1 "), text
    assert up.attempts("after2") == 2


@pytest.mark.parametrize("fault", ["reset:0", "headreset", "stall:0", "halfchunk:0"])
def test_retry_attempts_without_resume_hold_the_head_and_retry_a_stream_that_broke_before_content(
        up, weir, fault):
    w = weir(config=_config(up, resume=False), workers=1)
    rid = "held-" + fault.replace(":", "")
    events = _events(w, rid, fault, stream_options={"include_usage": True})
    # Nothing of the first attempt reached the client: the stream is the second's whole.
    _assert_one_whole_stream(events, "chatcmpl-attempt2")
    assert up.attempts(rid) == 2
    _assert_logged_once(w, rid, resume=False, failures=BEFORE_CONTENT[fault])


def test_retry_attempts_without_resume_cover_a_translated_stream_too(up, weir):
    # /v1/messages (translated to a chat stream upstream; its message_start comes from the role chunk): the
    # same hold and retry, on a pool with resume on as well (resume covers chat completions only).
    for resume in (False, True):
        w = weir(config=_config(up, resume=resume), workers=1)
        rid = f"messages-{resume}"
        client = anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0)
        with client.messages.stream(model="m", max_tokens=64, messages=MSG,
                                    extra_headers={"x-request-id": rid, "x-fault": "reset:0",
                                                   "x-fault-key": rid}) as s:
            types = [ev.type for ev in s]
            message = s.get_final_message()
        assert types.count("message_start") == 1 and types.count("message_stop") == 1, types
        assert "".join(b.text for b in message.content if b.type == "text") == TEXT
        assert up.attempts(rid) == 2
        line = w.log_for(rid, timeout=10)
        assert line["status"] == 200 and line.get("error") is None and line["retries"] == 1, line


def test_the_access_log_and_the_attempts_with_a_single_attempt_and_no_resume_stay_in_band(up, weir):
    # retry.attempts 1, no resume: nothing to go to; the head goes out at once, the break is in-band, as before.
    w = weir(config=_config(up, resume=False, attempts=1), workers=1)
    events = _events(w, "single", "reset:0")
    assert events[-1] == "[DONE]" and any("error" in json.loads(e) for e in events[:-1]), events
    assert up.attempts("single") == 1
    line = w.log_for("single", timeout=10)
    assert line["status"] == 200 and line["error"]["code"] == "upstream_unavailable", line
    assert not line.get("spend_usd"), line  # (broken before its first content: charged nothing)


def _send_unstreamed(w, rid: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", w.port), timeout=30)
    body = json.dumps({"model": "m", "messages": MSG}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"authorization: Bearer %s\r\nx-request-id: %s\r\nx-fault: stall\r\nx-fault-key: %s\r\n"
              b"content-length: %d\r\n\r\n" % (KEY.encode(), rid.encode(), rid.encode(), len(body)) + body)
    return s


def test_a_client_that_leaves_while_a_2xx_body_stalls_is_charged_nothing(up, weir):
    cfg = _config(up, resume=False, attempts=1)
    cfg["pools"]["p"]["timeouts"] = {"idle": "1s", "response": "30s"}
    w = weir(config=cfg, workers=1)
    # The client that waits gets the 504 (the body's idle timeout) and is charged nothing (as before).
    s = _send_unstreamed(w, "stayed")
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
        if b"\r\n\r\n" in answer and answer.startswith(b"HTTP/1.1 504"):
            break
    s.close()
    assert answer.startswith(b"HTTP/1.1 504"), answer
    stayed = w.log_for("stayed", timeout=10)
    assert stayed["status"] == 504 and not stayed.get("spend_usd"), stayed
    # The one that leaves while Weir reads the stalled body got no byte either: charged nothing (it was charged
    # the prompt's estimate).
    cfg["pools"]["p"]["timeouts"] = {"idle": "30s", "response": "30s"}
    w = weir(config=cfg, workers=1)
    s = _send_unstreamed(w, "left")
    wait_until(lambda: "left" in up.sent_partial, timeout=10, message="the upstream's partial body")
    wait_until(lambda: read_by_peer(up.sent_partial["left"]), timeout=10, message="Weir read the partial body")
    s.close()
    left = w.log_for("left", timeout=10)
    assert left["status"] == 499, left
    assert not left.get("spend_usd"), left
    assert "charged_tokens" not in left, left
