"""Defects found in stop 49's slow-client rounds: server.write_timeout behind an upstream gone quiet."""
from __future__ import annotations

import json
import socket
import socketserver
import threading

import pytest

from conftest import wait_until

MSG = [{"role": "user", "content": "hi"}]
BURST = 600 * 1024  # one content event: under server.max_stream_buffer, so only write_timeout may cut
QUIET = 60.0        # the upstream's silence after its burst (s): far longer than the test waits


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class BurstThenQuiet:
    """An OpenAI-compatible upstream whose stream bursts, then goes quiet: its head, a role chunk and one
    content chunk of BURST bytes at once, then nothing for `quiet` s, then the rest of the stream (the finish,
    usage and [DONE]). A request that did not ask for a stream gets a JSON answer of BURST * 14 bytes of content
    at once (more than a client that reads nothing lets the kernel take). ``closed`` holds the x-request-id
    of each stream whose connection Weir closed in the quiet gap (it aborted the upstream request)."""

    def __init__(self, quiet: float = QUIET):
        self.quiet = quiet
        self.closed: list[str] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                sock: socket.socket = self.request
                buf = b""
                while b"\r\n\r\n" not in buf:
                    got = sock.recv(65536)
                    if not got:
                        return
                    buf += got
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
                while len(buf) < int(headers.get("content-length", "0")):
                    buf += sock.recv(65536)
                body = json.loads(buf)
                outer._answer(sock, path, headers.get("x-request-id", ""), body)

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _chunk(path: str, text: str | None, finish: str | None = None, role: bool = False) -> dict:
        if path.endswith("/completions") and "chat" not in path:
            return {"id": "cmpl-q", "object": "text_completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        return {"id": "chatcmpl-q", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def _answer(self, sock: socket.socket, path: str, rid: str, body: dict):
        if not body.get("stream"):
            content = "x" * (BURST * 14)
            answer = json.dumps({"id": "chatcmpl-q", "object": "chat.completion", "created": 1, "model": "m",
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            return

        def event(obj) -> bytes:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            return b"%x\r\n%s\r\n" % (len(data), data)

        burst = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        if "chat" in path:
            burst += event(self._chunk(path, None, role=True))
        burst += event(self._chunk(path, "x" * BURST))
        sock.sendall(burst)
        sock.settimeout(self.quiet)
        try:
            if not sock.recv(1):  # Weir sends nothing more on this connection: only its close ends the wait
                self.closed.append(rid)
                return
        except socket.timeout:
            pass
        except OSError:
            self.closed.append(rid)
            return
        usage = {"id": "q", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
        try:
            sock.sendall(event(self._chunk(path, None, finish="stop")) + event(usage) + event(b"[DONE]")
                         + b"0\r\n\r\n")
        except OSError:
            pass


def _frozen_client(port: int, path: str, body: dict, rid: str) -> socket.socket:
    """A client with a small receive buffer that sends its request (and reads nothing unless the test does)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    raw = json.dumps(body)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\n"
              f"x-request-id: {rid}\r\nContent-Length: {len(raw)}\r\n\r\n{raw}".encode())
    return s


# DEFECT: a client that stopped reading was cut at server.write_timeout only as the upstream's bytes arrived:
# the kernel took the whole burst (its send buffer autotunes to 4 MiB), so no write of Weir's waited, and the
# acknowledgement counter, read only at the next burst, counted acks seconds old as fresh progress. Behind an
# upstream that bursts then goes quiet the client was never cut (the stream ran to its end, logged 200, the
# generation billed whole). A watch per connection now samples the client's acknowledgements every
# write_timeout / 4 while bytes are outstanding, whatever the upstream does.
@pytest.mark.parametrize("path,body,pool", [
    ("/v1/chat/completions", {"model": "m", "messages": MSG, "stream": True}, {}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "stream": True}, {}),
    ("/v1/messages", {"model": "m", "messages": MSG, "stream": True, "max_tokens": 5}, {}),
    ("/v1/responses", {"model": "m", "input": "hi", "stream": True}, {}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "stream": True}, {"batch": {"window": "5ms", "max_size": 8}}),
    ("/v1/chat/completions", {"model": "m", "messages": MSG}, {}),
], ids=["chat", "completions", "messages", "responses", "batched-member", "not-streamed"])
def test_a_client_that_stops_reading_is_cut_at_write_timeout_behind_a_quiet_upstream(weir, path, body, pool):
    up = BurstThenQuiet()
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url], **pool}}, "models": {"m": {"pool": "p"}},
                         "server": {"write_timeout": "1s"}}, workers=1)
        rid = "frozen-" + path.rsplit("/", 1)[1]
        s = _frozen_client(w.port, path, body, rid)
        try:
            # The quiet gap is QUIET s: the cut comes within a few write_timeouts, never waiting for the upstream.
            line = w.log_for(rid, timeout=QUIET / 3)
            assert line["status"] == 499 and line["error"]["code"] == "client_write_timeout", line
            assert w.metric("weir_slow_client_cutoffs_total") == 1
            assert w.metric("weir_client_disconnects_total") == 1
            if body.get("stream"):
                # The upstream request was aborted in its quiet gap (its connection closed), not run to its end.
                # (A batch goes upstream under the batch's own id.)
                wait_until(lambda: up.closed, 10, message="the upstream request aborted")
        finally:
            s.close()
    finally:
        up.close()


def test_a_client_that_reads_is_not_cut_while_the_upstream_is_quiet(weir):
    # The other side of the watch: a client that took everything it was sent waits out an upstream's silence
    # longer than write_timeout, and gets the whole stream.
    up = BurstThenQuiet(quiet=3.0)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url]}}, "models": {"m": {"pool": "p"}},
                         "server": {"write_timeout": "1s"}}, workers=1)
        s = _frozen_client(w.port, "/v1/chat/completions", {"model": "m", "messages": MSG, "stream": True}, "reader")
        s.settimeout(30)
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            data = s.recv(65536)
            if not data:
                break
            got += data
        s.close()
        assert b"data: [DONE]" in got
        line = w.log_for("reader")
        assert line["status"] == 200 and not line.get("error"), line
    finally:
        up.close()
