"""An OTLP/HTTP traces sink for `bench/run --tracing`: accepts POST /v1/traces (JSON), answers 200 `{}` on
kept-alive connections, and counts requests, bytes and spans; GET / answers the counts as JSON. Stands in
for an OpenTelemetry Collector on the load CPU, so Weir's exporter does its whole job (encode, send, read
the answer) while the sink's own cost stays off the gateway CPU.

    python3 bench/harness/otlp_sink.py PORT
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts = {"requests": 0, "bytes": 0, "spans": 0}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(n)
        # Counting spans by their "spanId" keys costs less than a full JSON parse.
        spans = body.count(b'"spanId"')
        with lock:
            counts["requests"] += 1
            counts["bytes"] += n
            counts["spans"] += spans
        self._answer(b"{}")

    def do_GET(self):
        with lock:
            body = json.dumps(counts).encode()
        self._answer(body)

    def _answer(self, body: bytes):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
