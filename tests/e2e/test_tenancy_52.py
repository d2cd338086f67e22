"""Tenant isolation (stop 52): what one tenant could learn of another through a shared Weir.

DEFECT 1: a model the tenant (or its key) may not use answered 403 model_not_allowed "The model `secret-model` is
not available to tenant `beta`." while an unknown one answered 404 model_not_found: a tenant could list which
models exist for others and what an alias points to. It is now answered exactly as an unknown model, on every
route that takes a model; the access log keeps the reason (model_not_allowed).

DEFECT 2: a micro-batch of two tenants' prompts went upstream with its first member's traceparent, tracestate,
baggage (user.email=...) and client address in X-Forwarded-For. A batch whose members are not all of its first
member's tenant now carries none of them; one tenant's batch keeps them. DEFECT 2b: it still carried every other
field of that client (b3, sentry-trace, Forwarded, X-Real-IP, Via, User-Agent, x-stainless-*, ...): of its fields
only Content-Type and Accept now go (an allow-list).

DEFECT 3: /metrics on the client port showed every tenant's spend, budget and request counts without
credentials. With tenants and an admin listener it is now the admin listener's only, unless
server.metrics.client_port says true; with tenants and no admin listener, start-up says so. DEFECT 3b: a reload
that added the first tenant or removed the last one was refused as a change to server.metrics, which the file
never wrote; client_port (default included) now follows a reload, the label sets stay restart-only.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import threading

import httpx
import pytest

from conftest import free_port, wait_until
from test_batching import in_parallel
from test_batching_attack import chunk, final_usage

FAST = ("--ttft-ms", "5", "--itl-ms", "1", "--max-tokens", "4", "--any-model")
MSG = [{"role": "user", "content": "hi"}]


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenancy_config(mock, **extra) -> dict:
    cfg = {
        "pools": {"gpu": {"endpoints": [mock.base_url]}},
        "models": {"public-model": {"pool": "gpu", "aliases": ["pub"]},
                   "secret-model": {"pool": "gpu", "aliases": ["sec"]}},
        "tenants": {"acme": {"models": ["*"]}, "beta": {"models": ["public-model"]}},
        "auth": {"api_keys": [
            {"id": "acme-a", "sha256": sha("key-acme-a"), "tenant": "acme"},
            {"id": "acme-narrow", "sha256": sha("key-acme-narrow"), "tenant": "acme", "models": ["public-model"]},
            {"id": "beta-b", "sha256": sha("key-beta-b"), "tenant": "beta"},
        ]},
    }
    cfg.update(extra)
    return cfg


def form(model: str) -> bytes:
    return (b'--BND\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nAUDIO\r\n'
            b'--BND\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + model.encode() + b"\r\n--BND--\r\n")


# (path, body for a model): every route that takes a model.
ROUTES = [
    ("/v1/completions", lambda m: {"model": m, "prompt": "x", "max_tokens": 2}),
    ("/v1/chat/completions", lambda m: {"model": m, "messages": MSG, "max_tokens": 2}),
    ("/v1/embeddings", lambda m: {"model": m, "input": "x"}),
    ("/tokenize", lambda m: {"model": m, "prompt": "x"}),
    ("/v1/audio/transcriptions", form),
    ("/v1/messages", lambda m: {"model": m, "max_tokens": 2, "messages": MSG}),
    ("/v1/messages/count_tokens", lambda m: {"model": m, "messages": MSG}),
    ("/v1/responses", lambda m: {"model": m, "input": "hi"}),
]


def send(w, key: str, path: str, body, request_id: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "x-request-id": request_id}
    if isinstance(body, bytes):
        headers["content-type"] = "multipart/form-data; boundary=BND"
        return httpx.post(w.base_url + path, content=body, headers=headers, timeout=15)
    return httpx.post(w.base_url + path, json=body, headers=headers, timeout=15)


def answer(r: httpx.Response, model: str) -> tuple:
    """What the client sees, with the model's name (as it wrote it) taken out."""
    headers = sorted(k for k in r.headers if k not in ("date", "x-request-id", "content-length"))
    return r.status_code, headers, r.text.replace(f"`{model}`", "`M`").replace(f": {model}", ": M")


@pytest.mark.parametrize("path,body", ROUTES, ids=[p for p, _ in ROUTES])
def test_a_model_the_tenant_may_not_use_is_answered_as_an_unknown_one(weir, mock, path, body):
    w = weir(config=tenancy_config(mock(*FAST)), workers=1)
    for key in ("key-beta-b", "key-acme-narrow"):
        unknown = send(w, key, path, body("no-such-model"), f"unknown-{key}")
        assert unknown.status_code == 404, unknown.text
        for model in ("sec", "secret-model"):
            rid = f"refused-{key}-{model}"
            r = send(w, key, path, body(model), rid)
            assert answer(r, model) == answer(unknown, "no-such-model"), (r.text, unknown.text)
            # The name as the client wrote it: an alias is never resolved for the client.
            assert f"`{model}`" in r.text or f": {model}" in r.text, r.text
            assert "secret-model" not in r.text or model == "secret-model", r.text
            assert "beta" not in r.text and "acme" not in r.text, r.text
            # The operator's log keeps the reason.
            line = w.log_for(rid)
            assert line["status"] == 404 and line["error"]["code"] == "model_not_allowed", line
        assert w.log_for(f"unknown-{key}")["error"]["code"] == "model_not_found"
    # The model it may use passes, through an alias too (the mock answers whatever it serves).
    assert send(w, "key-beta-b", "/v1/completions", {"model": "pub", "prompt": "x", "max_tokens": 2},
                "allowed").status_code != 404


def test_the_openai_and_anthropic_shapes_of_the_answer(weir, mock):
    w = weir(config=tenancy_config(mock(*FAST)), workers=1)
    r = send(w, "key-beta-b", "/v1/completions", {"model": "sec", "prompt": "x", "max_tokens": 2}, "o1")
    assert r.json() == {"error": {"message": "The model `sec` does not exist or you do not have access to it.",
                                  "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}
    r = send(w, "key-beta-b", "/v1/messages", {"model": "sec", "max_tokens": 2, "messages": MSG}, "a1")
    assert r.status_code == 404 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "not_found_error", r.text
    # A request without a model from a restricted tenant names nothing to find: still the 403.
    cfg = tenancy_config(mock(*FAST), default_pool="gpu")
    w2 = weir(config=cfg, workers=1)
    r = send(w2, "key-beta-b", "/v1/completions", {"prompt": "x", "max_tokens": 2}, "nomodel")
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed", r.text
    # With a default pool an unlisted name goes there, and is refused to a restricted tenant as unknown too.
    r = send(w2, "key-beta-b", "/v1/completions", {"model": "sec", "prompt": "x", "max_tokens": 2}, "dp1")
    r2 = send(w2, "key-beta-b", "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 2}, "dp2")
    assert answer(r, "sec") == answer(r2, "nope") and r.status_code == 404, (r.text, r2.text)


def test_a_request_control_after_the_model_does_not_tell_a_refused_model_apart(weir, mock):
    # What the route checks after finding the model (x-weir-* controls) is not reached for a refused one.
    w = weir(config=tenancy_config(mock(*FAST)), workers=1)
    for model in ("sec", "nope"):
        r = httpx.post(w.v1 + "/completions", json={"model": model, "prompt": "x"}, timeout=15,
                       headers={"authorization": "Bearer key-beta-b", "x-weir-priority": "bad"})
        assert r.status_code == 404, r.text


# --- 2. a micro-batch of several tenants' prompts ---------------------------------------------------------

def batch_config(upstream) -> dict:
    return {
        "pools": {"gpu": {"endpoints": [upstream.base_url], "batch": {"window": "1s", "max_size": 2}}},
        "default_pool": "gpu",
        "tenants": {"acme": {}, "beta": {}},
        "auth": {"api_keys": [
            {"id": "a1", "sha256": sha("key-a1"), "tenant": "acme"},
            {"id": "a2", "sha256": sha("key-a2"), "tenant": "acme"},
            {"id": "b1", "sha256": sha("key-b1"), "tenant": "beta"},
        ]},
    }


# What else describes a client (other vendors' trace context, addresses, proxies, agents, SDK fields): sent
# alike by both members. The batch key has every field but trace context, baggage, User-Agent, Accept and
# x-stainless-*, so these batch within one tenant; across tenants only requests whose compared fields are
# Content-Type alone batch (KEYLESS_CONTEXT: what is left out of the key).
CLIENT_CONTEXT = {
    "b3": "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1", "x-b3-traceid": "80f198ee56343ba8",
    "sentry-trace": "771a43a4192642f0b136d5159a501700-b7ad6b7169203331",
    "x-amzn-trace-id": "Root=1-5759e988-bd862e3fe1be46a994272793",
    "x-cloud-trace-context": "105445aa7843bc8bf206b12000100000/1;o=1", "uber-trace-id": "abc:def:0:1",
    "x-datadog-trace-id": "123", "grpc-trace-bin": "AAA", "forwarded": "for=10.1.1.1", "x-real-ip": "10.1.1.1",
    "x-client-ip": "10.1.1.1", "true-client-ip": "10.1.1.1", "cf-connecting-ip": "10.1.1.1",
    "x-forwarded-host": "acme.internal", "x-forwarded-proto": "https", "via": "1.1 acme-proxy",
    "user-agent": "AliceApp/1.0", "x-user-email": "alice@acme.example", "x-stainless-os": "Linux",
}


# What of CLIENT_CONTEXT goes upstream (stop 54): a client's Forwarded with Weir's own element appended (RFC 7239
# §4); X-Real-IP as Weir's own, the client it resolved (stop 57: the client's never goes); and, from a peer
# not in server.trusted_proxies, none of what only a front proxy saw (stop 57: X-Forwarded-Host/-Proto, a CDN's
# client field).
FRONT_VIEW = {"x-client-ip", "true-client-ip", "cf-connecting-ip", "x-forwarded-host", "x-forwarded-proto"}
SENT_CONTEXT = dict({k: v for k, v in CLIENT_CONTEXT.items() if k != "x-real-ip" and k not in FRONT_VIEW},
                    # (the client's own Forwarded element is dropped from a peer not in trusted_proxies: stop 59)
                    forwarded="for=127.0.0.1", **{"x-real-ip": "127.0.0.1"})


KEYLESS_CONTEXT = {"user-agent": "AliceApp/1.0", "x-stainless-os": "Linux", "x-stainless-lang": "python"}


def member(base_url: str, key: str, n: int, extra: dict | None = None) -> httpx.Response:
    return httpx.post(base_url + "/v1/completions", timeout=30,
                      json={"model": "mock-model", "prompt": f"prompt of {key}", "max_tokens": 3},
                      headers={"authorization": f"Bearer {key}", "x-request-id": f"m-{key}",
                               "traceparent": f"00-{n:032x}-{n:016x}-01", "tracestate": f"v{n}=x",
                               "baggage": f"user.email=user{n}@{key}.example", **(extra or {})})


def sent_upstream(w, keys, extra: dict | None = None) -> list[list[str]]:
    got = in_parallel(member, [(w.base_url, k, i + 1, extra) for i, k in enumerate(keys)])
    for r in got:
        assert r.status_code == 200, r.text
    lines = [w.log_for(f"m-{k}") for k in keys]
    assert all(l["batch"]["size"] == 2 for l in lines), lines  # one batch
    return [r.headers.get("x-mock-headers", "").split(",") for r in got], got


class CapturingUpstream:
    """A vLLM /v1/completions that answers every prompt of a list and records each request's header lines
    (name lower-cased, value), in order: what weir-mock's x-mock-echo cannot show when Weir sends no client
    field but Content-Type and Accept."""

    def __init__(self):
        outer = self
        self.heads: list[list[tuple[str, str]]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.heads.append([(k.lower(), v) for k, v in self.headers.items()])
                n = len(body["prompt"]) if isinstance(body["prompt"], list) else 1
                # (A batch is always streamed upstream, its members' answers assembled by Weir.)
                events = [chunk("cmpl-capture", i, " ok", "stop", 1) for i in range(n)]
                events += [final_usage("cmpl-capture", n, n), "[DONE]"]
                out = b"".join(f"data: {e}\n\n".encode() for e in events)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def capture():
    up = CapturingUpstream()
    yield up
    up.close()


def batch_head(w, up: CapturingUpstream, keys, extra: dict | None = None) -> list[tuple[str, str]]:
    """The header lines of the one upstream request of `keys`' batch."""
    before = len(up.heads)
    sent_upstream(w, keys, extra)
    assert len(up.heads) == before + 1, up.heads[before:]
    return up.heads[-1]


def client_values(extra: dict) -> list[str]:
    return [v for v in extra.values() if len(v) > 3] + [f"00-{n:032x}-{n:016x}-01" for n in (1, 2)] + [
        "v1=x", "v2=x", "user.email="]


# Weir's own fields, and the client's it lets through for a batch of several tenants.
WEIRS_OWN = {"host", "content-length", "x-request-id", "accept-encoding"}
ALLOWED = {"content-type", "accept"}


def test_a_batch_of_two_tenants_carries_no_members_client_context(weir, capture):
    w = weir(config=batch_config(capture), workers=1)
    head = batch_head(w, capture, ["key-a1", "key-b1"])
    names = [n for n, _ in head]
    for field in ("traceparent", "tracestate", "baggage", "x-forwarded-for"):
        assert field not in names, (field, head)


def test_a_batch_of_two_tenants_sends_only_content_type_and_accept_of_the_clients_fields(weir, capture):
    # An allow-list, not a deny-list: no trace context, agent or SDK field of the first member goes with the
    # other tenant's prompt, under any name.
    w = weir(config=batch_config(capture), workers=1)
    extra = dict(KEYLESS_CONTEXT, accept="application/json")
    head = batch_head(w, capture, ["key-a1", "key-b1"], extra)
    assert {n for n, _ in head} <= WEIRS_OWN | ALLOWED, head
    assert ("content-type", "application/json") in head and ("accept", "application/json") in head, head
    for value in client_values(KEYLESS_CONTEXT):
        assert not any(value in v for _, v in head), (value, head)
    # One tenant's batch keeps them (its first member's, as a request of its own would).
    w = weir(config=batch_config(capture), workers=1)  # (a log of its own: the request ids are the same)
    head = batch_head(w, capture, ["key-a1", "key-a2"], CLIENT_CONTEXT)
    for field, value in SENT_CONTEXT.items():
        assert (field, value) in head, (field, head)
    assert [v for n, v in head if n == "x-real-ip"] == ["127.0.0.1"], head
    assert not FRONT_VIEW & {n for n, _ in head}, head


def test_a_field_the_batch_key_compares_keeps_two_tenants_apart_and_goes_upstream(weir, capture):
    # A field in the batch key (one the model server may act on, as vLLM's X-data-parallel-rank, or another
    # vendor's trace context, an address) is alike in every member of a batch: a batch of two tenants would
    # drop it, and batching must not change what the upstream is asked. So the two tenants' requests go on
    # their own, each with its own fields; one tenant's two requests still batch, with them.
    w = weir(config=batch_config(capture), workers=1)
    extra = dict(CLIENT_CONTEXT, **{"x-data-parallel-rank": "1"})
    before = len(capture.heads)
    got = in_parallel(member, [(w.base_url, k, i + 1, extra) for i, k in enumerate(["key-a1", "key-b1"])])
    assert all(r.status_code == 200 for r in got), [r.text for r in got]
    assert all(w.log_for(f"m-{k}").get("batch", {}).get("size", 1) == 1 for k in ("key-a1", "key-b1"))
    heads = capture.heads[before:]
    assert len(heads) == 2, heads
    sent = dict(SENT_CONTEXT, **{"x-data-parallel-rank": "1"})
    for n, head in enumerate(sorted(heads, key=lambda h: dict(h)["traceparent"]), start=1):
        for field, value in sent.items():
            assert (field, value) in head, (field, head)
        assert ("traceparent", f"00-{n:032x}-{n:016x}-01") in head, head  # each its own client's
    w = weir(config=batch_config(capture), workers=1)  # (a log of its own: the request ids are the same)
    head = batch_head(w, capture, ["key-a1", "key-a2"], extra)
    assert ("x-data-parallel-rank", "1") in head, head


def test_with_tracing_a_batch_of_two_tenants_carries_weirs_traceparent_alone(weir, capture):
    from otlp import Collector
    c = Collector()
    try:
        cfg = batch_config(capture)
        cfg["tracing"] = {"otlp_endpoint": c.url, "flush_interval": "10ms"}
        w = weir(config=cfg, workers=1)
        head = batch_head(w, capture, ["key-a1", "key-b1"], KEYLESS_CONTEXT)
        assert {n for n, _ in head} <= WEIRS_OWN | ALLOWED | {"traceparent"}, head
        sent = [v for n, v in head if n == "traceparent"]
        # Weir's span (its own span id), never a client's traceparent as it came.
        assert len(sent) == 1 and sent[0] not in (f"00-{1:032x}-{1:016x}-01", f"00-{2:032x}-{2:016x}-01"), sent
    finally:
        c.close()


def test_a_batch_of_one_tenant_keeps_its_first_members_context(weir, mock):
    w = weir(config=batch_config(mock(*FAST)), workers=1)
    seen, got = sent_upstream(w, ["key-a1", "key-a2"], {"x-mock-echo": "1"})
    for names in seen:
        for field in ("traceparent", "tracestate", "baggage", "x-forwarded-for"):
            assert field in names, (field, names)
    assert got[0].headers["x-mock-traceparent"] in (f"00-{1:032x}-{1:016x}-01", f"00-{2:032x}-{2:016x}-01")


# --- 3. /metrics and the client port ----------------------------------------------------------------------

ADMIN_ENV = {"WEIR_TEST_ADMIN_TOKEN": "tenancy-52-admin-token-0123456789"}


def metrics_config(mock, admin_port: int | None, **metrics) -> dict:
    cfg = tenancy_config(mock)
    if admin_port:
        cfg["admin"] = {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}
    if metrics:
        cfg["server"] = {"metrics": metrics}
    return cfg


def scrape(port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)


def admin_up(port: int) -> None:
    wait_until(lambda: scrape(port).status_code == 200, 5, message="the admin listener's /metrics")


def test_metrics_with_tenants_and_an_admin_listener_are_the_admin_listeners(weir, mock):
    admin = free_port()
    w = weir(config=metrics_config(mock(*FAST), admin), env=ADMIN_ENV, workers=1)
    admin_up(admin)
    assert send(w, "key-beta-b", "/v1/completions", {"model": "pub", "prompt": "x", "max_tokens": 2},
                "spend").status_code == 200
    assert scrape(w.port).status_code == 404
    assert "weir_requests_total" in scrape(admin).text
    assert "GET /metrics on the client port" not in w.process.log()  # nothing to say: it is where it belongs


def test_client_port_true_keeps_metrics_on_the_client_port(weir, mock):
    admin = free_port()
    w = weir(config=metrics_config(mock(*FAST), admin, client_port=True), env=ADMIN_ENV, workers=1)
    admin_up(admin)
    assert scrape(w.port).status_code == 200


def test_tenants_without_an_admin_listener_keep_metrics_and_say_so(weir, mock):
    w = weir(config=metrics_config(mock(*FAST), None), workers=1)
    assert scrape(w.port).status_code == 200
    notes = [l for l in w.process.log().splitlines() if "GET /metrics" in l and "weir: warning:" in l]
    assert len(notes) == 1 and "admin.listen" in notes[0] and "client_port" in notes[0], w.process.log()
    # Said so only when the file leaves it to the default.
    w2 = weir(config=metrics_config(mock(*FAST), None, client_port=True), workers=1)
    assert scrape(w2.port).status_code == 200
    assert "GET /metrics" not in w2.process.log()


def test_without_tenants_metrics_stay_on_the_client_port(weir, mock):
    admin = free_port()
    m = mock(*FAST)
    w = weir(config={"pools": {"gpu": {"endpoints": [m.base_url]}}, "default_pool": "gpu",
                     "admin": {"listen": f"127.0.0.1:{admin}", "token_env": "WEIR_TEST_ADMIN_TOKEN"}},
             env=ADMIN_ENV, workers=1)
    admin_up(admin)
    assert scrape(w.port).status_code == 200


# --- 4. A reload that adds the first tenant or removes the last one ---------------------------------------


def reload_to(w, cfg: dict) -> None:
    """Writes `cfg`, SIGHUPs and waits until the reload was applied (refused: fails, with the reason)."""
    from test_config_reload import write
    import os
    import signal
    done = lambda: w.process.log().count("configuration reloaded from")  # noqa: E731
    before = done()
    write(w, cfg, workers=1)
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: done() > before or "configuration reload refused" in w.process.log(), 10,
               message="the reload's outcome")
    assert "configuration reload refused" not in w.process.log(), w.process.log()[-2000:]


def test_a_reload_adding_or_removing_every_tenant_is_applied_and_moves_metrics(weir, mock):
    # server.metrics.client_port's default follows tenants: at a reload (it is read per request): the reload
    # was refused as a change to server.metrics, which the file never wrote.
    admin = free_port()
    m = mock(*FAST)
    cfg = metrics_config(m, admin)
    cfg["tenants"], cfg["auth"] = {}, {}
    w = weir(config=cfg, env=ADMIN_ENV, workers=1)
    admin_up(admin)
    assert scrape(w.port).status_code == 200  # no tenants: on the client port too
    reload_to(w, metrics_config(m, admin))
    assert send(w, "key-beta-b", "/v1/completions", {"model": "pub", "prompt": "x", "max_tokens": 2},
                "after-add").status_code == 200  # the tenants are applied
    assert scrape(w.port).status_code == 404  # tenants and an admin listener: the admin listener's only
    assert scrape(admin).status_code == 200
    reload_to(w, cfg)
    assert scrape(w.port).status_code == 200  # back on the client port
    assert scrape(admin).status_code == 200
    # The label sets stay restart-only.
    nxt = dict(cfg, server={"metrics": {"tenant_label": False}})
    from test_config_reload import write
    import os
    import signal
    write(w, nxt, workers=1)
    os.kill(w.process.pid, signal.SIGHUP)
    wait_until(lambda: "configuration reload refused" in w.process.log(), 10, message="the reload refused")
    refused = [l for l in w.process.log().splitlines() if "changes only at restart" in l]
    assert refused and "server.metrics.tenant_label" in refused[-1], refused
