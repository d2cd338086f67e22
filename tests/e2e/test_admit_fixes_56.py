"""Admission's estimate and prices cover what Weir knows a request can cost (docs/admission.md):

- the completion of a request without max_tokens is the cap Weir sends an Anthropic pool
  (pools.X.anthropic.max_tokens, reasoning_effort's thinking on top), on the first target or a
  fallback, and at least vLLM's min_tokens;
- a media part (an image, audio or video part; an Anthropic image or document block; a Responses
  input_image) counts models.X.media_tokens prompt tokens, not nothing;
- Anthropic's cache writes are priced at pricing.X.cache_write (and the 1-hour ones at cache_write_1h)
  in the spend and in the reservation;
- an admin PATCH of a key's budget alone keeps its rate buckets as they were (a reload does);
- a budget's 429 says its exact wait in retry-after-ms.

The estimates are read from the 429 a small tokens bucket answers ("Request too large ... requested
N"), which names the estimate: no upstream is reached for those.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.server
import json
import re
import subprocess
import threading
import time

import anthropic
import httpx
import openai
import pytest

from conftest import binary, free_port, wait_until

TOKEN = "admin-test-token-0123456789"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN, "ANTHROPIC_TEST_KEY": "sk-ant-test"}
KEY = "sk-tenant-t"


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


class Upstream:
    """An Anthropic Messages API (POST /v1/messages: a message, or its event stream) and an
    OpenAI-compatible chat server (POST /v1/chat/completions) in one, on a thread of the test: it
    records the bodies it was sent and reports `usage` (Anthropic's shape) on every answer."""

    def __init__(self, usage: dict | None = None):
        self.usage = usage or {"input_tokens": 10, "output_tokens": 5}
        self.bodies: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json"):
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, json.dumps({"data": [], "object": "list"}).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                outer.bodies.append(body)
                u = outer.usage
                if self.path.startswith("/v1/chat/completions"):
                    prompt = u["input_tokens"]
                    self._send(200, json.dumps({
                        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body.get("model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": prompt, "completion_tokens": u["output_tokens"],
                                  "total_tokens": prompt + u["output_tokens"]}}).encode())
                    return
                msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model"),
                       "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                       "stop_sequence": None, "usage": u}
                if not body.get("stream"):
                    self._send(200, json.dumps(msg).encode())
                    return
                start = dict(msg, content=[], stop_reason=None, usage=dict(u, output_tokens=1))
                events = [
                    ("message_start", {"type": "message_start", "message": start}),
                    ("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": {"type": "text", "text": ""}}),
                    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": "ok"}}),
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    ("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                       "usage": {"output_tokens": u["output_tokens"]}}),
                    ("message_stop", {"type": "message_stop"}),
                ]
                data = "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()
                self._send(200, data, "text/event-stream")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    ups: list[Upstream] = []

    def make(**kw) -> Upstream:
        ups.append(Upstream(**kw))
        return ups[-1]

    yield make
    for u in ups:
        u.close()


class Admin:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def __call__(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, self.base + path, headers={"authorization": f"Bearer {TOKEN}"}, timeout=10, **kw)

    def ready(self) -> bool:
        try:
            return httpx.get(self.base + "/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False


def gateway(weir, pools: dict, models: dict, tenant: dict, pricing: dict | None = None, keys=None):
    admin_port = free_port()
    cfg = {
        "pools": pools,
        "models": models,
        "tenants": {"t": tenant},
        "auth": {"api_keys": keys if keys is not None else [{"id": "k", "sha256": sha(KEY), "tenant": "t"}]},
        "pricing": pricing or {"*": {"input": 1.0, "output": 2.0}},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
    }
    w = weir(config=cfg, env=ENV)
    admin = Admin(admin_port)
    wait_until(admin.ready, 5, message="admin listener")
    return w, admin


def anthropic_pool(url: str, **anthropic_settings) -> dict:
    p = {"type": "anthropic", "endpoints": [url], "api_key_env": "ANTHROPIC_TEST_KEY"}
    if anthropic_settings:
        p["anthropic"] = anthropic_settings
    return p


TINY_TPM = {"limits": {"tokens_per_minute": 50}}  # every request here is larger: its 429 names the estimate


def requested(r: httpx.Response) -> int:
    """The token estimate a 'Request too large' 429 names."""
    assert r.status_code == 429, r.text
    m = re.search(r"requested (\d+)", r.json()["error"]["message"] if "error" in r.json() else r.text)
    assert m, r.text
    return int(m.group(1))


def post(w, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(w.base_url + path, json=body, timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "x-api-key": KEY, **headers})


def spent(admin) -> float:
    """The tenant's budget spend (USD)."""
    return admin("GET", "/admin/v1/tenants/t").json()["usage"]["budget"]["spent_usd"]


HI = [{"role": "user", "content": "hi"}]  # 2 bytes: 1 token, plus 8 of the chat template: 9


# --- 1a. The cap Weir sends an Anthropic pool is what a request without max_tokens reserves ---

def test_a_request_without_max_tokens_to_an_anthropic_pool_reserves_the_max_tokens_sent(weir, upstream):
    up = upstream()
    w, _ = gateway(weir,
                   {"a": anthropic_pool(up.url), "b": anthropic_pool(up.url, max_tokens=1000)},
                   {"claude": {"pool": "a"}, "small": {"pool": "b", "upstream_model": "claude"}}, TINY_TPM)
    # Chat completions: anthropic.max_tokens (4096 unless set), not default_max_tokens (256).
    assert requested(post(w, "/v1/chat/completions", {"model": "claude", "messages": HI})) == 9 + 4096
    assert requested(post(w, "/v1/chat/completions", {"model": "small", "messages": HI})) == 9 + 1000
    # reasoning_effort's thinking budget comes on top of the default (translation: 1000 + 4096 for medium).
    assert requested(post(w, "/v1/chat/completions",
                          {"model": "small", "messages": HI, "reasoning_effort": "medium"})) == 9 + 1000 + 4096
    # The request's own max_tokens is what goes, and what is reserved.
    assert requested(post(w, "/v1/chat/completions", {"model": "small", "messages": HI, "max_tokens": 60})) == 9 + 60
    # Responses: the same cap (its chat translation goes to Anthropic).
    assert requested(post(w, "/v1/responses", {"model": "small", "input": "hi"})) == 9 + 1000
    assert up.bodies == []


def test_an_anthropic_fallback_raises_the_reservation_to_its_cap(weir, upstream, mock):
    up = upstream()
    m = mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "4", "--any-model")
    w, _ = gateway(weir, {"v": {"endpoints": [m.base_url]}, "a": anthropic_pool(up.url, max_tokens=2000)},
                   {"m": {"pool": "v", "default_max_tokens": 100, "fallbacks": [{"pool": "a", "upstream_model": "c"}]},
                    "solo": {"pool": "v", "default_max_tokens": 100}}, TINY_TPM)
    # Whichever target answers, the reservation holds: the fallback's Anthropic cap, 2000.
    assert requested(post(w, "/v1/chat/completions", {"model": "m", "messages": HI})) == 9 + 2000
    assert requested(post(w, "/v1/chat/completions",
                          {"model": "m", "messages": HI, "reasoning_effort": "low"})) == 9 + 2000 + 1024
    # Without the fallback (x-weir-fallbacks: 0, or a model that has none): the model's default.
    assert requested(post(w, "/v1/chat/completions", {"model": "m", "messages": HI},
                          **{"x-weir-fallbacks": "0"})) == 9 + 100
    assert requested(post(w, "/v1/chat/completions", {"model": "solo", "messages": HI})) == 9 + 100


def test_concurrent_requests_without_max_tokens_cannot_overspend_an_anthropic_budget(weir, upstream):
    # Each answer uses what it was allowed: output_tokens = the max_tokens sent (4096, the default). At $15
    # per 1M output tokens a request costs ~$0.0615 and reserves as much (not 256 tokens' $0.0039): a $0.2
    # budget admits 3 of 20 at once, and is not overspent.
    up = upstream(usage={"input_tokens": 9, "output_tokens": 4096})
    w, admin = gateway(weir, {"a": anthropic_pool(up.url)}, {"claude": {"pool": "a"}},
                       {"budget": {"usd": 0.2, "period": "1h"}}, pricing={"claude": {"input": 3.0, "output": 15.0}})

    def one(_):
        return post(w, "/v1/chat/completions", {"model": "claude", "messages": HI}).status_code

    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        codes = list(ex.map(one, range(20)))
    assert 1 <= codes.count(200) <= 3, codes
    assert all(b["max_tokens"] == 4096 for b in up.bodies), up.bodies
    wait_until(lambda: spent(admin) >= 0.061467 * codes.count(200) - 1e-6, 5, message="the requests settled")
    assert spent(admin) <= 0.2


# --- 1b. min_tokens without max_tokens ---

def test_min_tokens_without_max_tokens_reserves_at_least_min_tokens(weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "4", "--any-model")
    w, _ = gateway(weir, {"v": {"endpoints": [m.base_url]}}, {"m": {"pool": "v"}}, TINY_TPM)
    assert requested(post(w, "/v1/chat/completions", {"model": "m", "messages": HI, "min_tokens": 20000})) == 9 + 20000
    assert requested(post(w, "/v1/chat/completions", {"model": "m", "messages": HI, "min_tokens": "300"})) == 9 + 300
    # Completions too (one BOS, 'hi' one token); with max_tokens, max_tokens (vLLM refuses min above it).
    assert requested(post(w, "/v1/completions", {"model": "m", "prompt": "hi", "min_tokens": 900})) == 2 + 900
    assert requested(post(w, "/v1/chat/completions",
                          {"model": "m", "messages": HI, "min_tokens": 10, "max_tokens": 60})) == 9 + 60
    # A min_tokens under the default changes nothing.
    assert requested(post(w, "/v1/chat/completions", {"model": "m", "messages": HI, "min_tokens": 5})) == 9 + 256


# --- 2. Media parts count ---

IMG = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def test_media_parts_count_media_tokens_each(weir, mock, upstream):
    m = mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "4", "--any-model")
    up = upstream()
    w, _ = gateway(weir, {"v": {"endpoints": [m.base_url]}, "a": anthropic_pool(up.url)},
                   {"m": {"pool": "v"}, "cheap": {"pool": "v", "upstream_model": "m", "media_tokens": 85},
                    "claude": {"pool": "a"}}, TINY_TPM)
    text = {"type": "text", "text": "describe"}  # 8 bytes: 2 tokens
    # 20 images: 20 × 576 (the default), not 0.
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": [text] + [IMG] * 20}]}
    assert requested(post(w, "/v1/chat/completions", body)) == 2 + 8 + 20 * 576 + 16
    assert requested(post(w, "/v1/chat/completions", dict(body, model="cheap"))) == 2 + 8 + 20 * 85 + 16
    # Audio and video parts too, one each however large.
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg" * 1000, "format": "wav"}}
    video = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": [text, audio, video]}]}
    assert requested(post(w, "/v1/chat/completions", body)) == 2 + 8 + 2 * 576 + 16
    # Anthropic's image blocks, to an OpenAI-compatible pool (translated) and to an Anthropic pool (as is).
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    amsg = {"max_tokens": 16, "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}] +
                                            [block] * 3}]}
    assert requested(post(w, "/v1/messages", dict(amsg, model="m"))) == 2 + 8 + 3 * 576 + 16
    assert requested(post(w, "/v1/messages", dict(amsg, model="claude"))) == 2 + 16 + 3 * 576 + 16
    # Responses' input_image.
    rbody = {"model": "m", "max_output_tokens": 16,
             "input": [{"role": "user", "content": [{"type": "input_text", "text": "describe"},
                                                    {"type": "input_image", "image_url": "https://e.com/a.png"}]}]}
    assert requested(post(w, "/v1/responses", rbody)) == 2 + 8 + 576 + 16
    assert up.bodies == []


def test_images_a_bucket_cannot_hold_are_refused_and_admitted_ones_are_charged(weir, mock):
    # A 2000-token bucket: a request with 20 images (11,520 tokens estimated) can never pass; one with 2 can.
    m = mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "4", "--any-model")
    w, _ = gateway(weir, {"v": {"endpoints": [m.base_url]}}, {"m": {"pool": "v"}},
                   {"limits": {"tokens_per_minute": 2000}})
    client = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
    content = [{"type": "text", "text": "describe"}] + [IMG] * 20
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="m", max_tokens=16, messages=[{"role": "user", "content": content}])
    assert "Request too large" in str(e.value) and e.value.response.headers.get("retry-after") is None
    r = client.chat.completions.create(model="m", max_tokens=16, messages=[{"role": "user", "content": content[:3]}])
    assert r.choices[0].message.content


# --- 3. Cache writes have their price ---

CACHE_USAGE = {"input_tokens": 10, "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 200,
               "output_tokens": 5,
               "cache_creation": {"ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 600}}
# input 1, cached 0.1, cache_write 1.25, cache_write_1h 2, output 2 (USD per 1M):
# 10 × 1 + 200 × 0.1 + 400 × 1.25 + 600 × 2 + 5 × 2 = 1740 micro-USD.
CACHE_COST = 0.00174


@pytest.mark.parametrize("route", ["chat", "chat-stream", "messages", "messages-stream"])
def test_anthropic_cache_writes_are_priced_at_cache_write(weir, upstream, route):
    up = upstream(usage=CACHE_USAGE)
    w, admin = gateway(weir, {"a": anthropic_pool(up.url)}, {"claude": {"pool": "a"}},
                       {"budget": {"usd": 100, "period": "1h"}},
                       pricing={"claude": {"input": 1.0, "output": 2.0, "cached_input": 0.1, "cache_write": 1.25,
                                           "cache_write_1h": 2.0}})
    stream = route.endswith("stream")
    if route.startswith("chat"):
        c = openai.OpenAI(base_url=w.v1, api_key=KEY, max_retries=0, timeout=30)
        r = c.chat.completions.create(model="claude", max_tokens=20, messages=HI, stream=stream)
        if stream:
            list(r)
    else:
        c = anthropic.Anthropic(base_url=w.base_url, api_key=KEY, max_retries=0, timeout=30)
        if stream:
            with c.messages.stream(model="claude", max_tokens=20, messages=HI) as s:
                s.until_done()
        else:
            c.messages.create(model="claude", max_tokens=20, messages=HI)

    wait_until(lambda: spent(admin) > 0, 5, message="the request settled")
    assert spent(admin) == pytest.approx(CACHE_COST, abs=2e-9)


def test_cache_write_defaults_to_input_and_raises_the_reservation(weir, upstream):
    # Without cache_write the writes cost input's price (as before); a cache_write above input raises the
    # prompt's price in the reservation: its whole prompt might be written.
    up = upstream(usage=CACHE_USAGE)
    w, admin = gateway(weir, {"a": anthropic_pool(up.url)}, {"claude": {"pool": "a"}, "w": {"pool": "a"}},
                       {"budget": {"usd": 0.000040, "period": "1h"}},
                       pricing={"claude": {"input": 1.0, "output": 2.0},
                                "w": {"input": 1.0, "output": 2.0, "cache_write_1h": 3.0}})
    # 9 prompt tokens + 10 output: 9 × 1 + 10 × 2 = $0.000029 fits $0.00004; at 3 per prompt token, 27 + 20 does not.
    r = post(w, "/v1/chat/completions", {"model": "w", "messages": HI, "max_tokens": 10})
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
    assert "0.000047" in r.json()["error"]["message"], r.text
    r = post(w, "/v1/chat/completions", {"model": "claude", "messages": HI, "max_tokens": 10})
    assert r.status_code == 200, r.text
    # (10 + 200 + 1000) × 1 + 5 × 2 = 1220 micro-USD: the writes at input's price.
    spent = admin("GET", "/admin/v1/tenants/t").json()["usage"]["budget"]["spent_usd"]
    assert spent == pytest.approx(0.00122, abs=2e-9)


def test_pricing_names_a_cache_write_price_it_cannot_read(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text('listen: 127.0.0.1:1\npools: {p: {endpoints: ["http://127.0.0.1:9"]}}\n'
                   'models: {m: {pool: p}}\npricing: {m: {input: 1, cache_write: "a lot"}}\n')
    r = subprocess.run([str(binary("weir")), "--config", str(cfg), "--check"], capture_output=True, text=True,
                       timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "pricing.m.cache_write: expected a number" in out, out


# --- 4. An admin PATCH of a key's budget keeps its buckets ---

def test_patching_a_keys_budget_does_not_refill_its_buckets(weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "4", "--any-model")
    w, admin = gateway(weir, {"v": {"endpoints": [m.base_url]}}, {"m": {"pool": "v", "default_max_tokens": 8}}, {},
                       keys=[])
    r = admin("POST", "/admin/v1/keys", json={"tenant": "t", "budget": {"usd": 1.0, "period": "1h"},
                                              "limits": {"requests_per_minute": 2}})
    assert r.status_code == 201, r.text
    kid, secret = r.json()["id"], r.json()["key"]

    def chat():
        return httpx.post(w.v1 + "/chat/completions", json={"model": "m", "messages": HI}, timeout=30,
                          headers={"authorization": f"Bearer {secret}", "connection": "close"})

    assert [chat().status_code for _ in range(2)] == [200, 200]
    assert chat().status_code == 429
    # The budget alone changes: the requests bucket is as empty as it was.
    assert admin("PATCH", f"/admin/v1/keys/{kid}", json={"budget": {"usd": 2.0, "period": "2h"}}).status_code == 200
    r = chat()
    assert r.status_code == 429 and "requests per min" in r.json()["error"]["message"], r.text
    # New limits carry the level too (capped at the new depth): 2 used of 2, now 2 used of 4 (about).
    assert admin("PATCH", f"/admin/v1/keys/{kid}", json={"limits": {"requests_per_minute": 4}}).status_code == 200
    assert chat().status_code == 429


# --- 5. A budget's retry-after-ms is exact ---

def test_a_budget_refusal_says_its_exact_wait_in_milliseconds(weir, mock):
    m = mock("--ttft-ms", "1", "--itl-ms", "0", "--max-tokens", "4", "--any-model")
    w, admin = gateway(weir, {"v": {"endpoints": [m.base_url]}}, {"m": {"pool": "v", "default_max_tokens": 8}},
                       {"budget": {"usd": 0.00003, "period": "1h"}})
    # 9 × 1 + 8 × 2 = 25 micro-USD reserved, at least 4 × 2 spent: the next does not fit until the hour ends.
    assert post(w, "/v1/chat/completions", {"model": "m", "messages": HI}).status_code == 200
    wait_until(lambda: spent(admin) > 0, 5, message="the request settled")
    waits = []
    for _ in range(3):
        r = post(w, "/v1/chat/completions", {"model": "m", "messages": HI})
        assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
        left = 3600 - time.time() % 3600  # the hour's end (budget periods are UTC-aligned)
        s, ms = int(r.headers["retry-after"]), int(r.headers["retry-after-ms"])
        assert (s - 1) * 1000 < ms <= s * 1000, (s, ms)
        assert abs(ms / 1000 - left) < 2, (ms, left)
        waits.append(ms)
    # Whole seconds × 1000 each time would be a rounded wait, not the exact one.
    assert any(ms % 1000 for ms in waits), waits
