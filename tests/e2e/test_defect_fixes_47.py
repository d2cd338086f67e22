"""Defects found in stop 47's black-box rounds and left-alone lists."""
from __future__ import annotations

import json

import pytest

from conftest import wait_until
from httpwire import roundtrip


@pytest.fixture(scope="module")
def gw(module_mock, module_weir):
    up = module_mock("--any-model", "--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "2")
    return module_weir(config={"pools": {"p": {"endpoints": [up.base_url]}}, "default_pool": "p",
                               "server": {"max_header": "4KiB"}}, workers=1)


# DEFECT: a request line longer than server.max_header was answered 431 (header fields too large), where RFC 9110
# §15.5.15 and nginx give 414 URI Too Long: what is too long is the target, and a client reading 431 looks for a
# large header it did not send. Header fields over the limit stay 431.
@pytest.mark.parametrize("target,status,code", [
    ("/v1/models?q=" + "a" * 5000, 414, "uri_too_long"),          # the line never ends within the limit
    ("/v1/models?q=" + "a" * 4090, 414, "uri_too_long"),          # a whole line just over it
    ("/v1/models", 431, "request_header_too_large"),              # a short line, a long field
], ids=["unterminated_line", "line_over_limit", "long_field"])
def test_a_request_line_over_max_header_is_414_not_431(gw, target, status, code):
    pad = "X-Pad: " + "b" * 5000 + "\r\n" if status == 431 else ""
    rid = f"line-{status}-{len(target)}"
    head = f"GET {target} HTTP/1.1\r\nHost: localhost\r\nx-request-id: {rid}\r\n{pad}\r\n"
    r = roundtrip(gw.port, head.encode(), method="GET")
    assert r.status == status, r.status
    err = json.loads(r.body)["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error", err
    wait_until(lambda: any(e.get("status") == status for e in gw.log_entries()), 5, message="the refused line's log")
    # Prometheus counts the 414 under its own status, not as "4xx".
    assert f'code="{status}"' in gw.metrics_text() or f'status="{status}"' in gw.metrics_text()


# DEFECT: `weir requests --db DIR` (or --url sqlite:DIR) said only "disk I/O error" (SQLite's words for it).
def test_weir_requests_names_a_directory_given_as_the_store(tmp_path):
    from test_defect_fixes_46 import _weir_run
    for args in (["--db", tmp_path], ["--url", f"sqlite:{tmp_path}"]):
        r = _weir_run("requests", *args)
        assert r.returncode == 2 and "is a directory" in r.stderr, (args, r.stderr)


# DEFECT: a retry (or failover, or fallback) sent the upstream the same x-request-id as the attempt it replaced;
# vLLM refuses an id it is still running ("Request id ... already running": an attempt Weir gave up on may run
# until its abort is processed), and the client got that 400. Each send after the first carries the request's
# upstream id with "-N" after it.
def test_a_retry_carries_an_upstream_id_of_its_own(weir):
    from test_defect_fixes import RawUpstream
    seen = []
    ok = (b'{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
          b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')

    def answer(headers, body):
        seen.append(headers.get("x-request-id"))
        if len(seen) == 1:
            return b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok)
    up = RawUpstream(answer)
    try:
        w = weir(config={"pools": {"p": {"endpoints": [up.url], "retry": {"attempts": 2}}}, "default_pool": "p"},
                 workers=1)
        import httpx
        r = httpx.post(w.v1 + "/chat/completions", headers={"x-request-id": "mine"}, timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "mine"
        first, second = seen
        assert first.startswith("mine-") and second == first + "-1", seen
        line = w.log_for("mine")
        assert line["upstream_request_id"] == first and line["retries"] == 1, line
    finally:
        up.close()
