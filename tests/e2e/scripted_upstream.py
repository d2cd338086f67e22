"""A scripted upstream for Weir's end-to-end tests: a raw HTTP/1.1 server
(keep-alive, one thread per connection) that answers from recorded
Anthropic Messages API and vLLM answers (tests/e2e/streams/) and records
what it was sent.

It speaks Anthropic's wire format as the API reference describes it:
``POST /v1/messages`` (and ``?beta=true``) checks ``x-api-key`` (when the
server has a key) and ``anthropic-version``, validates ``model``,
``max_tokens`` and ``messages``, and answers a message or an SSE stream
(``stream: true``); ``POST /v1/messages/count_tokens`` answers
``{"input_tokens": N}``; errors are ``{"type":"error","error":{...}}`` with
Anthropic's statuses (401, 400, 429 with ``retry-after``, 529). ``POST
/v1/chat/completions`` replays a vLLM stream. The request header
``x-script: NAME`` (a client header Weir forwards) picks the answer:

    text, tools, thinking, error-mid-stream  recorded answers (stream or not)
    vllm-text, vllm-tools, ...               recorded vLLM streams
    vllm-echo                                a vLLM chat answer: the last message's text, then "."
    vllm-finish-REASON                       the same answer ending with finish_reason REASON (abort, error, ...),
                                             then its usage chunk when the request asked for one
    status-529, status-429, status-400 ...   an Anthropic error answer
    cut                                      the text stream, the connection closed in its middle
    hang                                     the text stream's first delta, then nothing until the peer closes
    garbage                                  200 with a body that is not JSON

``x-split`` makes a stream arrive in pieces: ``x-split: 17`` sends the body
bytes up to 17, waits until Weir has read them (its socket's receive queue
in /proc/net/tcp is empty), then the rest; ``x-split: 3,17,40`` several
points; ``x-split: every`` each byte on its own. Each piece is one chunk of
the chunked body, so the chunk framing is split too.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import pathlib
import socket
import struct
import threading
import time

STREAMS = pathlib.Path(__file__).resolve().parent / "streams"


def recorded(name: str) -> bytes:
    return (STREAMS / name).read_bytes()


@dataclasses.dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]   # names lowercased; a repeated name keeps the last value
    raw_headers: list[tuple[str, str]]
    body: bytes

    def json(self):
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def anthropic_error(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message},
                       "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}).encode()


STATUS_ERRORS = {
    400: ("invalid_request_error", "messages: text content blocks must be non-empty"),
    401: ("authentication_error", "invalid x-api-key"),
    404: ("not_found_error", "model: claude-nope"),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


class ScriptedUpstream:
    """Start with ``start()``; ``base_url``; ``requests`` lists every request received."""

    def __init__(self, api_key: str | None = None):
        self.api_key = api_key
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._stopped = False
        self._conns: list[socket.socket] = []
        self.connections = 0
        self.aborted: list[str | None] = []  # x-request-id of "hang" streams whose connection the peer closed

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ScriptedUpstream":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped = True
        try:
            self._sock.close()
        except OSError:
            pass
        for c in list(self._conns):
            try:
                c.close()
            except OSError:
                pass

    def last(self) -> Request:
        with self._lock:
            return self.requests[-1]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    # ------------------------------------------------------------------ serving

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connections += 1
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                raw = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
                headers = {k.lower(): v for k, v in raw}
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                req = Request(method, target, headers, raw, body)
                with self._lock:
                    self.requests.append(req)
                if not self._answer(conn, peer, req):
                    return
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, conn: socket.socket, peer, req: Request) -> bool:
        status, headers, body, stream = self._reply(req)
        split = req.header("x-split")
        if req.header("x-script") == "hang" and stream:
            # The stream stops after its first text delta and stays open until the peer closes it.
            first = body[: body.index(b"event: content_block_delta") + 1]
            first = body[: body.index(b"\n\n", len(first)) + 2]
            conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         f"{len(first):x}\r\n".encode() + first + b"\r\n")
            conn.settimeout(30)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            with self._lock:
                self.aborted.append(req.header("x-request-id"))
            return False
        if req.header("x-script") == "cut" and stream:
            # The connection drops in the middle of the stream (no last chunk).
            half = body[: body.index(b"event: content_block_stop")]
            conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         f"{len(half):x}\r\n".encode() + half + b"\r\n")
            return False
        head = f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if not stream:
            head += f"content-length: {len(body)}\r\n\r\n"
            conn.sendall(head.encode() + body)
            return True
        head += "transfer-encoding: chunked\r\n\r\n"
        if split is None:
            points = []
        elif split == "every":
            points = list(range(1, len(body)))
        else:
            points = sorted({int(p) for p in split.split(",") if 0 < int(p) < len(body)})
        pieces, prev = [], 0
        for p in points + [len(body)]:
            pieces.append(body[prev:p])
            prev = p
        out = head.encode()
        for i, piece in enumerate(pieces):
            out += b"%x\r\n%s\r\n" % (len(piece), piece)
            if i == len(pieces) - 1:
                out += b"0\r\n\r\n"
            conn.sendall(out)
            out = b""
            if i < len(pieces) - 1:
                wait_read(conn, peer)
        return True

    def _reply(self, req: Request) -> tuple[int, dict[str, str], bytes, bool]:
        """(status, headers, body, is_stream) for `req`."""
        script = req.header("x-script") or "text"
        path = req.target.split("?", 1)[0]
        if path == "/v1/chat/completions":
            # (An Anthropic script reaching a chat path, a fallback's, gets the plain text stream.)
            name = script.removeprefix("vllm-") if script.startswith("vllm-") else "text"
            if name == "echo" or name.startswith("finish-"):
                stream = echo_stream(req.json(), name.removeprefix("finish-") if name != "echo" else "stop")
            else:
                stream = recorded(f"vllm_{name}.sse")
            if json.loads(req.body or b"{}").get("stream"):
                return 200, {"content-type": "text/event-stream"}, stream, True
            return 200, {"content-type": "application/json"}, vllm_completion(stream), False
        if path not in ("/v1/messages", "/v1/messages/count_tokens"):
            return 404, {"content-type": "application/json"}, anthropic_error("not_found_error", "Not found"), False
        jh = {"content-type": "application/json", "request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
        if self.api_key is not None and req.header("x-api-key") != self.api_key:
            return 401, jh, anthropic_error("authentication_error", "invalid x-api-key"), False
        if not req.header("anthropic-version"):
            return 400, jh, anthropic_error("invalid_request_error", "anthropic-version: header is required"), False
        try:
            body = req.json()
        except ValueError:
            return 400, jh, anthropic_error("invalid_request_error", "The request body is not valid JSON"), False
        for field in ("model", "messages") + (() if path.endswith("count_tokens") else ("max_tokens",)):
            if field not in body:
                return 400, jh, anthropic_error("invalid_request_error", f"{field}: Field required"), False
        if script == "garbage":
            return 200, {"content-type": "application/json"}, b"<html>upstream proxy error</html>", False
        if script.startswith("status-"):
            code = int(script.split("-")[1])
            kind, message = STATUS_ERRORS[code]
            h = dict(jh)
            if code in (429, 529):
                h["retry-after"] = "0"
            return code, h, anthropic_error(kind, message), False
        if path.endswith("count_tokens"):
            return 200, jh, json.dumps({"input_tokens": 14 + len(json.dumps(body["messages"])) // 8}).encode(), False
        name = {"error-mid-stream": "error", "cut": "text", "hang": "text"}.get(script, script)
        if body.get("stream"):
            sh = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                  "request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
            return 200, sh, recorded(f"anthropic_{name}.sse"), True
        message = json.loads(recorded(f"anthropic_{name}.json"))
        message["model"] = body["model"]
        return 200, jh, json.dumps(message, ensure_ascii=False).encode(), False


def echo_stream(body: dict, finish: str = "stop") -> bytes:
    """vLLM's stream of a chat answer that repeats the last message's text (one content delta), then ".", ending
    with `finish` (vLLM's compact JSON); its usage chunk when the body asks for one and `finish` is not "stop"."""
    text = str(body["messages"][-1].get("content", ""))
    vllm_echo = finish == "stop"  # (the vllm-echo script's bytes, as they always were)
    def chunk(delta: dict, finish: str | None = None) -> bytes:
        c = {"id": "chatcmpl-echo", "object": "chat.completion.chunk", "created": 1735689600, "model": "mock-model",
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if not vllm_echo:  # (vLLM's own bytes: a finish chunk's stop_reason, compact JSON)
            if finish is not None:
                c["choices"][0]["stop_reason"] = None
            return b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
        return b"data: " + json.dumps(c).encode() + b"\n\n"
    out = (chunk({"role": "assistant", "content": ""}) + chunk({"content": text}) + chunk({"content": "."}) +
           chunk({}, finish))
    if finish != "stop" and (body.get("stream_options") or {}).get("include_usage"):
        u = {"id": "chatcmpl-echo", "object": "chat.completion.chunk", "created": 1735689600, "model": "mock-model",
             "choices": [], "usage": {"prompt_tokens": 7, "total_tokens": 10, "completion_tokens": 3}}
        out += b"data: " + json.dumps(u, separators=(",", ":")).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


def vllm_completion(stream: bytes) -> bytes:
    """The chat.completion a vLLM server answers without streaming, for the same generation."""
    content, reasoning, finish, usage, cid = "", "", None, None, None
    calls: dict[int, dict] = {}
    for block in stream.decode().split("\n\n"):
        if not block.startswith("data: ") or block == "data: [DONE]":
            continue
        c = json.loads(block[6:])
        cid = c.get("id", cid)
        usage = c.get("usage") or usage
        for ch in c.get("choices", []):
            d = ch.get("delta", {})
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            finish = ch.get("finish_reason") or finish
            for tc in d.get("tool_calls", []):
                slot = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                      "function": {"name": None, "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function", {})
                slot["function"]["name"] = fn.get("name") or slot["function"]["name"]
                slot["function"]["arguments"] += fn.get("arguments") or ""
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None,
               "tool_calls": [calls[i] for i in sorted(calls)]}
    return json.dumps({"id": cid, "object": "chat.completion", "created": 1735689600, "model": "mock-model",
                       "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                                    "stop_reason": None}], "usage": usage}, ensure_ascii=False).encode()


# ---------------------------------------------------------------------- waiting

SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in the send queue not yet sent
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR = 4, 20, 1, 2


def _unsent(sock: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0"))[0]


def _receive_queue(diag: socket.socket, local_port: int, remote_port: int) -> int | None:
    """The receive queue (bytes not yet read) of the TCP socket 127.0.0.1:local_port →
    127.0.0.1:remote_port, by an exact sock_diag lookup (what `ss` uses; /proc/net/tcp
    walks the whole hash table, ~15 ms). None when there is no such socket."""
    loopback = socket.inet_aton("127.0.0.1") + b"\0" * 12
    sockid = struct.pack("!HH16s16s", local_port, remote_port, loopback, loopback) + struct.pack(
        "=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)  # interface, INET_DIAG_NOCOOKIE
    req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    diag.send(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 0, 0) + req)
    reply = diag.recv(65536)
    _, kind = struct.unpack_from("=IH", reply)
    if kind == NLMSG_ERROR:
        return None
    return struct.unpack_from("=I", reply, 16 + 56)[0]  # inet_diag_msg.idiag_rqueue


def wait_read(conn: socket.socket, peer, timeout: float = 5.0) -> None:
    """Waits until the peer (Weir) has read every byte sent on `conn`: none
    is left unsent on our side, and the peer socket's receive queue is empty
    (on loopback a sent segment is in the receiver's queue when send()
    returns). A condition, not a sleep: Weir's next recv then starts at the
    next piece. (Our unacknowledged bytes are no measure: the peer may delay
    its ACKs by 40 ms.)"""
    ours = conn.getsockname()[1]
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
        while True:
            if _unsent(conn) == 0:
                queued = _receive_queue(diag, peer[1], ours)
                if not queued:
                    return  # read; or the connection is gone: nothing to wait for
            if time.monotonic() > deadline:
                raise AssertionError(f"the peer did not read what was sent within {timeout} s")
            time.sleep(0.0001)
