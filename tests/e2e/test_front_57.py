"""Weir behind Caddy and other front proxies (stop 57: /tmp/h57/task-fix-front.md).

F3. DEFECT: a client's own ``X-Real-IP`` went upstream whenever the peer was in ``server.trusted_proxies``:
    through a proxy that neither sets nor strips it (Caddy, HAProxy's ``option forwardfor``), any client's
    value reached the upstream as if Weir vouched for it. Now Weir sends its own ``X-Real-IP``, the client
    it resolved (the access log's ``client``), and never the client's, from any peer. The same class: what
    only a front proxy saw (``X-Forwarded-Proto``/``-Host``/``-Port``/``-Prefix``, a CDN's client field)
    went upstream from any client; now only from a trusted proxy.
F5 (a request already in the socket when the keep-alive deadline fired was reset unread) is tested in
tests/unit/http/downstream_test.cpp (HttpDownstreamIdleDeadline): it needs the deadline's handler to run
before the read's completion, which only a test that steps the io_context can order. (SIGSTOP cannot: at
SIGCONT the socket's readiness runs before the timer in the same epoll batch, and read_head moves the
deadline on before the timer's handler looks at it; the request is then served on either build.)
"""

from __future__ import annotations

import httpx
import openai
import pytest

from test_front_fixes_54 import Upstream


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


def gateway(weir, upstream, trusted=None):
    config = {"pools": {"p": {"endpoints": [upstream.url], "retry": {"attempts": 1}}},
              "models": {"m": {"pool": "p"}}}
    if trusted is not None:
        config["server"] = {"trusted_proxies": trusted}
    return weir(config=config, workers=1)


def sdk_chat(w, probe: str, headers: dict[str, str], source: str) -> None:
    """A chat completion through the openai SDK from local address `source` (127.x.y.z reaches loopback)."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as http:
        client = openai.OpenAI(base_url=w.v1, api_key="sk-front-57", http_client=http, max_retries=0,
                               default_headers={"x-probe": probe, "x-request-id": probe, **headers})
        out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "done"


# --- F3: X-Real-IP and the front proxy's view ----------------------------------------------------------------

# DEFECT: through a trusted proxy that passes the client's X-Real-IP on (Caddy does), the upstream got
# 7.7.7.7, the client's word. Now it gets the client Weir resolved from X-Forwarded-For, the one it logs.
def test_x_real_ip_is_the_client_weir_resolved_through_a_trusted_proxy(weir, upstream):
    w = gateway(weir, upstream, trusted=["127.0.0.1"])
    # The proxy (127.0.0.1) appended the client it saw; the client wrote its own X-Real-IP.
    sdk_chat(w, "caddy", {"X-Forwarded-For": "203.0.113.7", "X-Real-IP": "7.7.7.7"}, source="127.0.0.1")
    assert w.log_for("caddy")["client"] == "203.0.113.7"
    assert upstream.values("caddy", "x-real-ip") == ["203.0.113.7"]
    assert upstream.values("caddy", "x-forwarded-for") == ["203.0.113.7, 127.0.0.1"]
    # Two X-Real-IP lines (a client's and a proxy's): still only Weir's.
    sdk_chat(w, "two", {"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "7.7.7.7, 8.8.8.8"}, source="127.0.0.1")
    assert upstream.values("two", "x-real-ip") == ["203.0.113.9"]


# From a peer that is no proxy, the client is the peer: X-Real-IP says so (it was dropped before, and the
# client's own never goes).
def test_x_real_ip_from_an_untrusted_peer_is_the_peer(weir, upstream):
    w = gateway(weir, upstream, trusted=["127.0.0.1"])
    sdk_chat(w, "direct", {"X-Forwarded-For": "203.0.113.7", "X-Real-IP": "7.7.7.7"}, source="127.0.0.2")
    assert w.log_for("direct")["client"] == "127.0.0.2"
    assert upstream.values("direct", "x-real-ip") == ["127.0.0.2"]
    w2 = gateway(weir, upstream)  # no trusted_proxies at all
    sdk_chat(w2, "no-list", {"X-Real-IP": "7.7.7.7"}, source="127.0.0.3")
    assert upstream.values("no-list", "x-real-ip") == ["127.0.0.3"]


FRONT_VIEW = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example", "X-Forwarded-Port": "443",
              "X-Forwarded-Prefix": "/admin", "True-Client-IP": "6.6.6.6", "CF-Connecting-IP": "6.6.6.6"}


# DEFECT: a client talking to Weir directly could claim https, a host, a prefix or a CDN's client address,
# and the upstream (uvicorn trusts X-Forwarded-Proto from 127.0.0.1) read it as Weir's word.
def test_the_front_proxys_view_goes_up_only_from_a_trusted_proxy(weir, upstream):
    w = gateway(weir, upstream, trusted=["127.0.0.1"])
    sdk_chat(w, "forged", FRONT_VIEW, source="127.0.0.2")
    for name in FRONT_VIEW:
        assert upstream.values("forged", name.lower()) == [], name
    sdk_chat(w, "proxied", FRONT_VIEW, source="127.0.0.1")
    for name, value in FRONT_VIEW.items():
        assert upstream.values("proxied", name.lower()) == [value], name
