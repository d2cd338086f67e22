"""The fault matrix (issue 12, docs/reliability.md): every upstream fault Weir must survive, for streamed
and non-streamed chat completions, with no fallback and with a fallback to a healthy pool. Each request
gets exactly one correct outcome: the fallback's full answer, or one clear error (a whole response
before the commit point, an in-band error and [DONE] after it); the text the client got is the unbroken
answer or a prefix of it (nothing duplicated, nothing lost before the break); exactly one access-log
line; the fallback and failure counters move as they should.

One Weir serves the whole matrix: one pool per fault (weir-mock with its fault flags, or a small
scripted upstream in this file for what the mock cannot do), each model once without and once with a
fallback to the healthy pool. Short timeouts keep the module fast."""

from __future__ import annotations

import dataclasses
import json
import socket
import socketserver
import struct
import threading

import httpx
import pytest

from conftest import free_port, wait_until

FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")
MSG = [{"role": "user", "content": "hello there"}]
IDLE = "200ms"        # pools.X.timeouts.idle: a stall between events
FIRST_BYTE = "400ms"  # pools.X.timeouts.first_byte and .response: no response head (streamed, not)


# ---------------------------------------------------------------------------- scripted upstreams

class _Scripted(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class ScriptedUpstream:
    """An HTTP/1.1 upstream that reads one request and then does `behaviour`:

    rst              reset the connection (RST) before any byte of the response
    head_then_rst    send the response head (an SSE head for a streamed request, a JSON head with a
                     Content-Length for the others), then reset: after the head, before the first token
    status_429       answer 429 with Retry-After: 30 and vLLM's error body
    """

    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.requests = 0
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                sock: socket.socket = self.request
                data = b""
                while b"\r\n\r\n" not in data:
                    got = sock.recv(65536)
                    if not got:
                        return
                    data += got
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v.strip())
                while len(body) < length:
                    got = sock.recv(65536)
                    if not got:
                        return
                    body += got
                outer.requests += 1
                stream = b'"stream":true' in body.replace(b" ", b"")
                if outer.behaviour == "status_429":
                    err = json.dumps({"error": {"message": "rate limited upstream", "type": "TooManyRequestsError",
                                                "param": None, "code": 429}}).encode()
                    sock.sendall(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                                 b"Retry-After: 30\r\nContent-Length: " + str(len(err)).encode() + b"\r\n\r\n" + err)
                    return
                if outer.behaviour == "head_then_rst":
                    if stream:
                        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n")
                    else:
                        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: 400\r\n\r\n{\"id\":\"chatcmpl-")
                # rst (and the end of head_then_rst): an abortive close
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()

        self.server = _Scripted(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class SlowAccept:
    """A listening socket nobody accepts on: connects complete (the kernel's queue), nothing answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------------------- the matrix

@dataclasses.dataclass(frozen=True)
class Expect:
    """What the client gets without a fallback."""
    status: int            # the response's status
    in_band: bool = False  # a 200 stream ending in an in-band error (after the commit point)
    tokens: int = 0        # content tokens before the break (in-band only)
    code: str = ""         # the error's code (Weir's own errors)


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    failure: str | None                 # weir_upstream_failures_total kind it counts (None: a 429)
    stream: Expect
    plain: Expect
    # With a fallback: the fallback's full answer, unless the stream had passed its first token.
    stream_fails_over: bool = True


FAULTS = [
    Fault("status_5xx", "status", Expect(503), Expect(503)),
    Fault("status_429", None, Expect(429), Expect(429)),
    Fault("reset_before_head", "reset", Expect(502, code="upstream_unavailable"),
          Expect(502, code="upstream_unavailable")),
    Fault("reset_after_head", "reset", Expect(200, in_band=True, code="upstream_unavailable"),
          Expect(502, code="upstream_unavailable")),
    Fault("reset_mid_stream", "reset", Expect(200, in_band=True, tokens=3, code="upstream_unavailable"),
          Expect(502, code="upstream_unavailable"), stream_fails_over=False),
    Fault("stall_before_first_token", "timeout", Expect(200, in_band=True, code="upstream_timeout"),
          Expect(504, code="upstream_timeout")),
    Fault("stall_mid_stream", "timeout", Expect(200, in_band=True, tokens=3, code="upstream_timeout"),
          Expect(504, code="upstream_timeout"), stream_fails_over=False),
    Fault("slow_accept", "timeout", Expect(504, code="upstream_timeout"), Expect(504, code="upstream_timeout")),
    Fault("refused", "connect_refused", Expect(502, code="upstream_unavailable"),
          Expect(502, code="upstream_unavailable")),
    Fault("tls_failure", "tls", Expect(502, code="upstream_unavailable"), Expect(502, code="upstream_unavailable")),
]


@pytest.fixture(scope="module")
def gateway(module_mock, module_weir):
    healthy = module_mock(*FAST)
    reference = module_mock(*FAST)  # the same request, unbroken
    mocks = {
        "status_5xx": module_mock(*FAST, "--error-rate", "1", "--error-status", "503"),
        "reset_mid_stream": module_mock(*FAST, "--reset-after", "3"),
        "stall_before_first_token": module_mock(*FAST, "--stall-after", "0", "--stall-ms", "5000"),
        "stall_mid_stream": module_mock(*FAST, "--stall-after", "3", "--stall-ms", "5000"),
    }
    scripted = {"status_429": ScriptedUpstream("status_429"), "reset_before_head": ScriptedUpstream("rst"),
                "reset_after_head": ScriptedUpstream("head_then_rst")}
    slow = SlowAccept()
    urls = {name: m.base_url for name, m in mocks.items()}
    urls.update({name: s.url for name, s in scripted.items()})
    urls["slow_accept"] = slow.url
    urls["refused"] = f"http://127.0.0.1:{free_port()}"
    urls["tls_failure"] = "https://" + healthy.base_url.removeprefix("http://")  # it speaks HTTP, not TLS
    timeouts = {"connect": "500ms", "first_byte": FIRST_BYTE, "response": FIRST_BYTE, "idle": IDLE}
    pools = {"healthy": {"endpoints": [healthy.base_url]}}
    models = {}
    for f in FAULTS:
        pools[f.name] = {"endpoints": [urls[f.name]], "timeouts": timeouts,
                         "outlier": {"consecutive_failures": 0}, "eject_for": "1ms"}
        models[f.name] = {"pool": f.name, "upstream_model": "mock-model"}
        models[f.name + "+fb"] = {"pool": f.name, "upstream_model": "mock-model", "fallbacks": [{"pool": "healthy"}]}
    w = module_weir(config={"pools": pools, "models": models})
    yield w, healthy, reference_text(reference)
    for s in scripted.values():
        s.close()
    slow.close()


def sse_events(raw: bytes) -> list[str]:
    """The data of every SSE event of a (de-chunked) body."""
    out = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out


def content_of(events: list[str]) -> tuple[str, int, int, list[dict]]:
    """(text, role chunks, content chunks, error objects) of a chat stream's events."""
    text, roles, contents, errors = "", 0, 0, []
    for data in events:
        if data == "[DONE]":
            continue
        obj = json.loads(data)
        if "error" in obj:
            errors.append(obj["error"])
            continue
        for ch in obj.get("choices", []):
            delta = ch.get("delta", {})
            if delta.get("role"):
                roles += 1
            if delta.get("content"):
                contents += 1
                text += delta["content"]
    return text, roles, contents, errors


def reference_text(reference) -> str:
    r = httpx.post(reference.base_url + "/v1/chat/completions",
                   json={"model": "mock-model", "messages": MSG}, timeout=10)
    return r.json()["choices"][0]["message"]["content"]


def counters(w, fault: str) -> dict[str, float]:
    samples = w.metrics()

    def value(name, **labels):
        return sum(v for n, lbl, v in samples if n == name and all(lbl.get(k) == x for k, x in labels.items()))

    return {"fallbacks": value("weir_upstream_fallbacks_total"),
            "failures": value("weir_upstream_failures_total", pool=fault),
            "healthy": value("weir_upstream_attempts_total", pool="healthy")}


CASES = [(f, stream, fb) for f in FAULTS for stream in (True, False) for fb in (False, True)]


@pytest.mark.parametrize("fault,stream,fallback", CASES,
                         ids=[f"{f.name}-{'stream' if s else 'plain'}-{'fallback' if fb else 'alone'}"
                              for f, s, fb in CASES])
def test_fault(gateway, fault: Fault, stream: bool, fallback: bool):
    w, healthy, want = gateway
    model = fault.name + ("+fb" if fallback else "")
    rid = f"fm-{fault.name}-{int(stream)}-{int(fallback)}"
    before = counters(w, fault.name)
    with httpx.stream("POST", w.v1 + "/chat/completions", timeout=20, headers={"x-request-id": rid},
                      json={"model": model, "messages": MSG, "stream": stream}) as r:
        body = r.read()
        status, headers = r.status_code, r.headers
    expect = fault.stream if stream else fault.plain
    fails_over = fallback and (fault.stream_fails_over or not stream)
    entry = w.log_for(rid)  # exactly one access-log line
    after = counters(w, fault.name)

    if fails_over:
        # The fallback's whole answer, as if nothing had failed.
        assert status == 200, body[:500]
        if stream:
            text, roles, _, errors = content_of(sse_events(body))
            assert errors == [] and roles == 1
            assert sse_events(body)[-1] == "[DONE]"
        else:
            text = json.loads(body)["choices"][0]["message"]["content"]
        assert text == want
        assert entry["status"] == 200 and entry["pool"] == "healthy" and entry["error"] is None
        assert [a["pool"] for a in entry["attempts"]] == [fault.name, "healthy"]
        assert after["fallbacks"] - before["fallbacks"] == 1
        assert after["healthy"] - before["healthy"] == 1
    elif expect.in_band:
        # Committed: a 200 stream, the text up to the break, one in-band error, then [DONE].
        assert status == 200
        events = sse_events(body)
        text, roles, contents, errors = content_of(events)
        # The role chunk comes with the first token (vLLM's order): none when it broke before it.
        assert roles == (1 if expect.tokens else 0) and contents == expect.tokens
        assert want.startswith(text) and (text == "") == (expect.tokens == 0)
        assert len(errors) == 1 and errors[0]["code"] == expect.code, errors
        assert events[-1] == "[DONE]"
        assert entry["status"] == 200 and entry["error"]["code"] == expect.code
        assert after["fallbacks"] == before["fallbacks"]
        assert after["healthy"] == before["healthy"]
    else:
        # One whole error response before anything was committed.
        assert status == expect.status, body[:500]
        err = json.loads(body)["error"]
        assert err["message"]
        if expect.code:
            assert err["code"] == expect.code
        if fault.name == "status_429":
            assert headers.get("retry-after") == "30"  # the upstream's, passed on
        assert entry["status"] == expect.status
        assert after["fallbacks"] == before["fallbacks"]
        assert after["healthy"] == before["healthy"]
    assert entry["model"] == model
    if fault.failure:
        assert after["failures"] - before["failures"] == 1, (before, after)
    else:
        assert after["failures"] == before["failures"]


def test_the_matrix_left_weir_healthy(gateway):
    """After every fault: no stream left running, and the healthy pool answers at once."""
    w, healthy, _ = gateway
    wait_until(lambda: w.metric("weir_active_streams") == 0, 5, message="no stream left open")
    r = httpx.post(w.v1 + "/chat/completions", json={"model": "status_5xx+fb", "messages": MSG}, timeout=10)
    assert r.status_code == 200
