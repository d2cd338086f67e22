"""A small OTLP/HTTP traces receiver for the tests: an http.server on a free port in a thread that
collects every POST to /v1/traces (JSON encoding), answers with scripted statuses, and indexes the spans
by trace id."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import free_port, wait_until


class Collector:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []     # {"path", "headers", "body", "t": time.monotonic() at arrival}
        self.spans: list[dict] = []        # each span with "_resource" (its resource's attributes)
        self.script: list[int] = []        # statuses to answer, in order (then 200)
        self.retry_after = "0"             # the Retry-After of a scripted 503
        self.ok_body = b"{}"               # the body of a 200
        self.gate = threading.Event()      # cleared: each POST waits for it before it is answered
        self.gate.set()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(n)
                arrived = time.monotonic()
                collector.gate.wait()
                with collector.lock:
                    status = collector.script.pop(0) if collector.script else 200
                    collector.requests.append({"path": self.path, "headers": dict(self.headers), "body": raw,
                                               "t": arrived})
                    if status == 200:
                        doc = json.loads(raw)
                        for rs in doc["resourceSpans"]:
                            res = {a["key"]: list(a["value"].values())[0] for a in rs["resource"]["attributes"]}
                            for ss in rs["scopeSpans"]:
                                for sp in ss["spans"]:
                                    collector.spans.append({**sp, "_resource": res, "_scope": ss["scope"]})
                body = collector.ok_body if status == 200 else b'{"code":14,"message":"try later"}'
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                if status == 503:
                    self.send_header("retry-after", collector.retry_after)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["traceId"] == trace_id]

    def wait_trace(self, trace_id: str, n: int | None = None, timeout: float = 10) -> list[dict]:
        """The spans of `trace_id` once its request span (kind SERVER) arrived (and, with n, n spans)."""
        def ready():
            spans = self.trace(trace_id)
            if not any(s["kind"] == 2 for s in spans):
                return None
            return spans if n is None or len(spans) >= n else None
        return wait_until(ready, timeout, interval=0.01, message=f"spans of trace {trace_id}")


def attrs(span: dict) -> dict:
    """A span's attributes as {key: python value} (intValue strings as int)."""
    out = {}
    for a in span.get("attributes", []):
        (kind, v), = a["value"].items()
        out[a["key"]] = int(v) if kind == "intValue" else v
    return out


def parse_traceparent(value: str) -> tuple[str, str, str]:
    version, trace_id, span_id, flags = value.split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16 and len(flags) == 2, value
    return trace_id, span_id, flags
