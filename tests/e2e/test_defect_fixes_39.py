"""Defects found in stop 39's black-box rounds: micro-batch errors that quoted other members' prompts, the close
watch, budgets across a rollover, include_usage, admission's Retry-After, settlement without usage, the admin API's
and /v1/models' paths, the bytes metric, fallbacks and held streams, sessions, deadlines and the queue's log line."""
from __future__ import annotations

import json

import httpx
import pytest

from test_batching import in_parallel


def echoing_error(status: int):
    # An error body that quotes every prompt of the list, as an exception's text can.
    def answer(headers, body) -> bytes:
        prompts = json.loads(body)["prompt"]
        doc = json.dumps({"object": "error", "message": f"engine failed on {prompts!r}", "type": "InternalError",
                          "code": status}).encode()
        return (b"HTTP/1.1 %d Error\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (status, len(doc)) + doc)
    return answer


@pytest.mark.parametrize("status,stream", [(500, False), (500, True), (401, False), (429, True)])
def test_a_batch_error_body_reaches_no_member(weir, status, stream):
    from test_defect_fixes import RawUpstream
    up = RawUpstream(echoing_error(status))
    try:
        # (A 1 s window, sent when its four are in: 100 ms split them on a busy host, and a lone member's
        # error body is its own, passed on whole.)
        w = weir(config={"pools": {"b": {"endpoints": [up.url],
                                         "batch": {"window": "1s", "max_size": 4}}},
                         "default_pool": "b"}, workers=1)
        got = dict(enumerate(in_parallel(lambda i: httpx.post(
            w.v1 + "/completions", timeout=15, headers={"x-request-id": f"b39-{status}-{i}"},
            json={"model": "m", "prompt": f"tenant{i} private", "max_tokens": 5, "stream": stream}),
            [(i,) for i in range(4)])))
        sizes = set()
        for i, r in got.items():
            assert "private" not in r.text, (i, r.status_code, r.text[:300])
            assert r.status_code == status, (i, r.status_code, r.text[:300])  # the status, as unbatched
            err = r.json()["error"]
            assert err["code"] == "upstream_error" and str(status) in err["message"], err
            if status == 429:
                assert r.headers["retry-after"] == "1", r.headers
            line = w.log_for(f"b39-{status}-{i}")
            assert line["status"] == status and line["error"]["code"] == "upstream_error", line
            sizes.add(line.get("batch", {}).get("size"))
        assert max(s or 0 for s in sizes) > 1, sizes  # they did share a batch
        assert w.metric("weir_batches_aborted_total") == 0  # answered, not abandoned by its members
    finally:
        up.close()


def test_a_lone_members_error_body_is_the_upstreams(weir):
    # One member: the body is its own, passed on as it came (status and all), as unbatched.
    from test_defect_fixes import RawUpstream
    up = RawUpstream(echoing_error(500))
    try:
        w = weir(config={"pools": {"b": {"endpoints": [up.url],
                                         "batch": {"window": "5ms", "max_size": 4}}},
                         "default_pool": "b"}, workers=1)
        r = httpx.post(w.v1 + "/completions", timeout=15, json={"model": "m", "prompt": "mine", "max_tokens": 5})
        assert r.status_code == 500 and "mine" in r.text, (r.status_code, r.text)
    finally:
        up.close()


def echoing_error_event(headers, body) -> bytes:
    # A stream whose in-band error event quotes every prompt of the list.
    prompts = json.loads(body)["prompt"]
    chunks = "".join("data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                                            "choices": [{"index": i, "text": "tok", "finish_reason": None}]}) + "\n\n"
                     for i in range(len(prompts)))  # one choice per chunk, as vLLM sends them
    err = json.dumps({"error": {"object": "error", "message": f"engine failed on {prompts!r}",
                                "type": "InternalServerError", "param": None, "code": 500}})
    events = f"{chunks}data: {err}\n\ndata: [DONE]\n\n".encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(events)
            + events)


def test_a_batch_streams_error_event_quotes_no_member(weir):
    from test_defect_fixes import RawUpstream
    up = RawUpstream(echoing_error_event)
    try:
        w = weir(config={"pools": {"b": {"endpoints": [up.url], "batch": {"window": "1s", "max_size": 4}}},
                         "default_pool": "b"}, workers=1)
        got = dict(enumerate(in_parallel(lambda i: httpx.post(
            w.v1 + "/completions", timeout=15, headers={"x-request-id": f"e39-{i}"},
            json={"model": "m", "prompt": f"tenant{i} private", "max_tokens": 5, "stream": True}),
            [(i,) for i in range(4)])))
        for i, r in got.items():
            assert r.status_code == 200, (i, r.status_code, r.text[:300])
            assert "private" not in r.text, (i, r.text[:500])
            events = [json.loads(l[6:]) for l in r.text.splitlines() if l.startswith("data: {")]
            errors = [e for e in events if "error" in e]
            assert len(errors) == 1 and "micro-batch" in errors[0]["error"]["message"], events
            assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
            assert w.log_for(f"e39-{i}")["batch"]["size"] == 4
    finally:
        up.close()


def chat_request(request_id: str, stream: bool) -> bytes:
    body = json.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 5, "stream": stream}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"x-request-id: " + request_id.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("extra", [b"\r\n", b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"],
                         ids=["crlf", "pipelined"])
def test_a_client_that_leaves_after_sending_more_still_cancels_the_upstream(mock, weir, stream, extra):
    # RFC 9112 §2.2 lets a client send a CRLF after a body, and pipelining is allowed: once any byte came
    # while the request was in flight, Weir stopped watching the socket, so a client that left then was
    # noticed only at the next write (a stream's first token) or never (a plain answer: logged 200, billed).
    import socket
    from conftest import read_by_peer, wait_until
    # The first token 10 s away: noticed at the first write (the defect), the abort comes past the wait below.
    m = mock("--ttft-ms", "10000", "--itl-ms", "10")
    w = weir(upstream=m, workers=1)
    rid = f"leave-{stream}-{len(extra)}"
    with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
        s.sendall(chat_request(rid, stream))
        wait_until(lambda: m.metric("vllm:num_requests_running") == 1, 5, message="the request reached the mock")
        s.sendall(extra)
        wait_until(lambda: read_by_peer(s), 10, message="Weir read the bytes sent while the request waits")
    wait_until(lambda: m.aborts() == 1, 5, message="the upstream request aborted when the client left")
    line = w.log_for(rid)
    assert line["status"] == 499 and line["error"]["code"] == "client_closed_request", line


@pytest.mark.parametrize("value", [0, "false", "no", "off", 1, "yes"])
def test_include_usage_that_is_not_a_boolean_is_refused(mock, weir, value):
    # vLLM's pydantic reads 0 / "false" / "no" / "off" as false: the stream then carried no usage and Weir charged
    # its estimate, not the real tokens (a client could pay less). A boolean only, as `stream` (OpenAI's type).
    w = weir(upstream=mock("--ttft-ms", "0", "--itl-ms", "0"), workers=1)
    r = httpx.post(w.v1 + "/chat/completions", timeout=10, json={
        "model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": value}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options.include_usage", r.text


def test_models_retrieve_finds_a_long_model_id(mock, weir):
    # The id was looked up in the access log's copy of the path, cut to 256 bytes: the SDK percent-encodes it, so
    # a 30-character CJK name (270 bytes encoded) was a 404 although /v1/models listed it.
    import openai
    names = ["模型" * 15, "a" * 250, "org/" + "b" * 100 + "/" + "c" * 100 + "-中文版本"]
    up = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    w = weir(config={"pools": {"p": {"endpoints": [up.base_url]}}, "models": {n: {"pool": "p"} for n in names}},
             workers=1)
    c = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0)
    for n in names:
        assert c.models.retrieve(n).id == n
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("模型" * 16)


def test_a_stream_the_client_left_is_charged_its_content_events_not_its_role_chunks(mock, weir):
    # With no usage (the client left), a stream is charged its prompt estimate plus one token per content event
    # (docs/admission.md): the role-only chunk each choice opens with counted as one too.
    import hashlib
    import socket
    import time
    key = "sk-test-39-role-0123456789"
    m = mock("--ttft-ms", "0", "--itl-ms", "40", "--max-tokens", "40")
    w = weir(config={
        "pools": {"p": {"endpoints": [m.base_url]}}, "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
        "pricing": {"m": {"input": 1000000, "output": 1000000}},  # $1 a token: spend_usd counts the tokens
        "tenants": {"t": {"budget": {"usd": 100000}}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                                 "tenant": "t"}]}}, workers=1)
    prompt_estimates = []
    for n in (1, 2):
        rid = f"role-{n}"
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "n": n,
                           "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + key.encode() +
                      b"\r\nx-request-id: " + rid.encode() + b"\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            got = b""
            while got.count(b'"content":"') < 2 * n + 4:  # the role chunks, then a few tokens
                got += s.recv(65536)
        time.sleep(0.2)
        line = w.log_for(rid)
        assert line["status"] == 499 and line["completion_tokens"] is None, line
        assert line["events"] > 2 * n, line
        # spend = prompt estimate + content events, and content events = data events - one role chunk per choice.
        prompt_estimates.append(round(line["spend_usd"]) - (line["events"] - n))
    assert prompt_estimates[0] == prompt_estimates[1] > 0, prompt_estimates


def test_request_bytes_metric_counts_a_body_that_failed_midway_as_the_log_does(mock, weir):
    # A body that timed out (408) or whose client left (499) logged its bytes_in; weir_request_bytes_total did not.
    import socket
    w = weir(config={"pools": {"p": {"endpoints": [mock("--ttft-ms", "0").base_url]}}, "default_pool": "p",
                     "server": {"body_timeout": "1s"}}, workers=1)
    before = w.metric("weir_request_bytes_total")
    for rid, leave in (("bytes-408", False), ("bytes-499", True)):
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nx-request-id: " + rid.encode() +
                b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
            s.sendall(head + b'{"model":"m"')
            if leave:  # once Weir read what came (not 200 ms later, which a loaded machine can outlast)
                from conftest import read_by_peer, wait_until
                wait_until(lambda: read_by_peer(s), 10, message="Weir read the head and the body's start")
            else:
                assert s.recv(65536).startswith(b"HTTP/1.1 408 ")
    lines = [w.log_for("bytes-408"), w.log_for("bytes-499")]
    assert [l["status"] for l in lines] == [408, 499], lines
    sizes = [len(head) + 12 for _ in lines]  # the head (both ids are as long) and what came of the body
    assert [l["bytes_in"] for l in lines] == sizes, lines
    assert w.metric("weir_request_bytes_total") - before == sum(sizes)


def test_admin_errors_are_valid_json_whatever_bytes_the_path_holds(mock, weir, tmp_path):
    # A key id, tenant or request id of invalid UTF-8 (%FF, or cut inside a character) was echoed as raw bytes.
    from conftest import free_port, wait_until
    from test_admin_api import ENV, Admin, _ready, config
    port = free_port()
    cfg = config(mock("--ttft-ms", "0"), port)
    cfg["request_log"] = {"url": f"sqlite:{tmp_path}/requests.db"}
    weir(config=cfg, env=ENV, workers=1)
    admin = Admin(port)
    wait_until(lambda: _ready(admin), 10, message="the admin listener")
    for path in ("/admin/v1/keys/%FF", "/admin/v1/requests/%FF", "/admin/v1/tenants/%FF", "/admin/v1/requests?x%FF=1",
                 "/admin/v1/keys/" + "a" * 127 + "%E2%82%AC"):
        r = admin("GET", path)
        assert r.status_code in (400, 404), (path, r.status_code)
        doc = json.loads(r.content.decode("utf-8"))  # strict: raises on invalid UTF-8
        assert doc["error"]["message"], doc


@pytest.mark.parametrize("stream", [False, True])
def test_the_requests_own_deadline_is_not_the_endpoints_failure(mock, weir, stream):
    # docs/reliability.md#deadlines: mid-stream, the deadline was counted in weir_upstream_failures_total{kind=timeout}.
    m = mock("--ttft-ms", "2000", "--itl-ms", "50", "--max-tokens", "50")
    w = weir(upstream=m, workers=1)
    r = httpx.post(w.v1 + "/chat/completions", timeout=10, headers={"x-weir-timeout-ms": "300"},
                   json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    assert "deadline_exceeded" in r.text, r.text
    w.wait_log(lambda es: len(es) >= 1)
    assert w.metric("weir_upstream_failures_total") == 0


def test_a_pool_skipped_for_a_full_queue_is_in_the_attempts(mock, weir):
    # retries said 1, with no attempts list: the skip of pa (its max_concurrent reached) was nowhere.
    import threading
    from conftest import wait_until
    slow = mock("--ttft-ms", "1500", "--itl-ms", "1", "--max-tokens", "2")
    fast = mock("--ttft-ms", "0", "--itl-ms", "0", "--max-tokens", "2")
    w = weir(config={"pools": {"pa": {"endpoints": [slow.base_url], "queue": {"size": 4, "max_concurrent": 1}},
                               "pb": {"endpoints": [fast.base_url]}},
                     "models": {"mock-model": {"pool": "pa", "fallbacks": [{"pool": "pb"}]}}}, workers=1)
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}
    t = threading.Thread(target=lambda: httpx.post(w.v1 + "/chat/completions", json=body, timeout=10))
    t.start()
    wait_until(lambda: slow.metric("vllm:num_requests_running") == 1, 5, message="pa busy")
    r = httpx.post(w.v1 + "/chat/completions", json=body, timeout=10, headers={"x-request-id": "skipper"})
    t.join()
    assert r.status_code == 200, r.text
    line = w.log_for("skipper")
    assert line["pool"] == "pb" and line["retries"] == 1, line
    assert [(a["pool"], a["endpoint"], a["failure"]) for a in line["attempts"]][0] == ("pa", None, "overloaded"), line
    assert line["attempts"][1]["pool"] == "pb" and line["attempts"][1]["status"] == 200, line


def test_a_fallback_model_the_principal_may_not_use_is_passed_over(mock, weir):
    # A tenant allowed only `big` got `small` (a 404 when asked for directly) by making `big` fail: a {model: M}
    # fallback is checked against the principal's allow-list as M itself would be; a {pool: P} one is the same model.
    import hashlib
    key = "sk-test-39-fallback-0123456789"
    down = mock("--ttft-ms", "0", "--error-rate", "1", "--error-status", "503")
    other = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    spare = mock("--ttft-ms", "0", "--itl-ms", "0", "--any-model")
    w = weir(config={
        "pools": {"pa": {"endpoints": [down.base_url]}, "pb": {"endpoints": [other.base_url]},
                  "pc": {"endpoints": [spare.base_url]}},
        "models": {"big": {"pool": "pa", "fallbacks": [{"model": "small"}, {"pool": "pc"}]},
                   "small": {"pool": "pb", "upstream_model": "small-up"}},
        "tenants": {"t": {"models": ["big"]}},
        "auth": {"required": True, "api_keys": [{"id": "k", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                                 "tenant": "t"}]}}, workers=1)
    auth = {"authorization": f"Bearer {key}"}
    msg = [{"role": "user", "content": "hi"}]
    assert httpx.post(w.v1 + "/chat/completions", headers=auth, json={"model": "small", "messages": msg},
                      timeout=10).status_code == 404
    r = httpx.post(w.v1 + "/chat/completions", headers={**auth, "x-request-id": "fb-allow"}, timeout=10,
                   json={"model": "big", "messages": msg})
    assert r.status_code == 200, r.text
    line = w.log_for("fb-allow")
    assert line["pool"] == "pc", line  # small's pool passed over, the pool fallback (big itself) taken
    assert other.metric("vllm:request_success_total") == 0
    # Only the forbidden fallback left: the primary's answer stands.
    r = httpx.post(w.v1 + "/chat/completions", headers={**auth, "x-weir-fallbacks": "1"}, timeout=10,
                   json={"model": "big", "messages": msg})
    assert r.status_code == 503, r.text
    assert other.metric("vllm:request_success_total") == 0


def test_a_held_stream_that_breaks_before_its_first_token_is_retried_on_its_pool_first(mock, weir):
    # docs/reliability.md: a fallback is tried when the pool before it is spent. A held stream (a fallback left)
    # that broke before its first token went straight to the fallback, the pool's other endpoint and attempts unused.
    bad = mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "3", "--reset-after", "0")  # role chunk, then RST
    good = mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "3")
    spare = mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "3", "--any-model")
    w = weir(config={
        "pools": {"primary": {"endpoints": [bad.base_url, good.base_url], "outlier": {"consecutive_failures": 0},
                              "retry": {"attempts": 3, "backoff": "1ms"}},
                  "backup": {"endpoints": [spare.base_url]}},
        "models": {"mock-model": {"pool": "primary", "fallbacks": [{"pool": "backup"}]}}}, workers=1)
    import openai
    c = openai.OpenAI(base_url=w.v1, api_key="x", max_retries=0)
    for i in range(16):
        chunks = list(c.chat.completions.create(model="mock-model", stream=True, messages=[{"role": "user",
                      "content": "hi"}], extra_headers={"x-request-id": f"held-{i}"}))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices), chunks
    lines = [w.log_for(f"held-{i}") for i in range(16)]
    assert {l["pool"] for l in lines} == {"primary"}, [(l["pool"], l.get("attempts")) for l in lines]
    retried = [l for l in lines if l["retries"]]
    assert retried, "the bad endpoint was never picked first"
    for l in retried:
        assert l["retries"] == 1 and [(a["pool"], a["status"], a["failure"]) for a in l["attempts"]] == [
            ("primary", 200, "reset"), ("primary", 200, None)], l
        assert l["attempts"][0]["endpoint"] != l["attempts"][1]["endpoint"], l
    assert spare.metric("vllm:request_success_total") == 0


def test_a_held_stream_goes_to_the_fallback_once_its_pools_attempts_are_spent(mock, weir):
    bad = mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "3", "--reset-after", "0")
    spare = mock("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "3", "--any-model")
    w = weir(config={
        "pools": {"primary": {"endpoints": [bad.base_url], "outlier": {"consecutive_failures": 0},
                              "retry": {"attempts": 3, "backoff": "1ms"}},
                  "backup": {"endpoints": [spare.base_url]}},
        "models": {"mock-model": {"pool": "primary", "fallbacks": [{"pool": "backup"}]}}}, workers=1)
    r = httpx.post(w.v1 + "/chat/completions", timeout=10, headers={"x-request-id": "held-spent"},
                   json={"model": "mock-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and "[DONE]" in r.text, r.text
    line = w.log_for("held-spent")
    assert line["pool"] == "backup", line
    assert [(a["pool"], a["failure"]) for a in line["attempts"]] == [("primary", "reset"), ("backup", None)], line


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_after_pipelining_a_full_buffer_still_cancels_the_upstream(mock, weir, stream):
    # 140 KB pipelined behind an in-flight request fill the read buffer (server.max_header + 64 KiB): the watch
    # could read no more, and a client that then left was noticed at the next write (a plain answer: never). Now
    # the socket's TCP state says it (the FIN came behind the bytes the kernel holds; a client whose unsent bytes
    # outrun the kernel's receive window too cannot send its FIN before Weir reads: the next write finds it).
    import socket
    import time
    from conftest import wait_until
    # The first token 10 s away: noticed at the first write (the defect), the abort comes past the wait below.
    m = mock("--ttft-ms", "10000", "--itl-ms", "10")
    w = weir(upstream=m, workers=1)
    rid = f"full-{stream}"
    body = json.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "x" * 140_000}]}).encode()
    pipelined = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
        s.sendall(chat_request(rid, stream))
        wait_until(lambda: m.metric("vllm:num_requests_running") == 1, 5, message="the request reached the mock")
        s.sendall(pipelined)
        time.sleep(0.2)  # (the client's pace: Weir reads what its buffer takes, or not; the kernel holds the rest)
    wait_until(lambda: m.aborts() == 1, 5, message="the upstream request aborted when the client left")
    line = w.log_for(rid)
    assert line["status"] == 499 and line["error"]["code"] == "client_closed_request", line


def test_a_client_that_pipelines_a_full_buffer_and_stays_gets_both_answers(mock, weir):
    import socket
    m = mock("--ttft-ms", "300", "--itl-ms", "1", "--max-tokens", "3")
    w = weir(upstream=m, workers=1)
    body = json.dumps({"model": "mock-model", "max_tokens": 3,
                       "messages": [{"role": "user", "content": "x" * 200_000}]}).encode()
    pipelined = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"x-request-id: second\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    with socket.create_connection(("127.0.0.1", w.port), timeout=10) as s:
        s.sendall(chat_request("first", False) + pipelined)
        got = b""
        while got.count(b"HTTP/1.1 200 ") < 2 or not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, got[-300:]
            got += chunk
    assert w.log_for("first")["status"] == 200 and w.log_for("second")["status"] == 200
