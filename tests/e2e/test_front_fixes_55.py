"""Weir behind HAProxy (stop 55: an attack with HAProxy 2.6 in front, h1, h2c and TLS clients).

B2. DEFECT: a request head the client abandoned part-way (a FIN or a reset after some of it) was logged 499
    with ``bytes_in`` of only the lines the parser had finished: ``GET /hea`` then a close logged 0. The
    docs say a head the parser did not finish counts all of it that came: now it does.
B3. DEFECT: a request line in HTTP/2.0 (h2's prior-knowledge preface ``PRI * HTTP/2.0``, or ``GET /
    HTTP/2.0``) got 400 "bad version"; RFC 9110 §15.6.6 names the answer to a major version the server
    does not speak: 505.
B4. DEFECT: a front proxy configured with ``send-proxy`` (PROXY protocol v1 or v2) got 400 "bad version" /
    "bad method", which names neither the protocol nor the fix. Now the 400 says so
    (``proxy_protocol_unsupported``).
"""

from __future__ import annotations

import json

import pytest

from httpwire import RawConn


def gateway(weir, mock):
    m = mock()
    return weir(config={"pools": {"p": {"endpoints": [m.base_url]}}, "models": {"mock-model": {"pool": "p"}}},
                workers=1)


def last_log(w, status: int) -> dict:
    entries = w.wait_log(lambda es: any(e.get("status") == status for e in es), 10, message=f"a {status} line")
    return [e for e in entries if e.get("status") == status][-1]


@pytest.mark.parametrize("sent", [
    b"GET /hea",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty",
])
def test_a_head_the_client_abandons_counts_all_of_it_that_came(weir, mock, sent):
    w = gateway(weir, mock)
    with RawConn(w.port) as raw:
        raw.send(sent)
        raw.close()  # (a FIN after part of a head: 499)
    line = last_log(w, 499)
    assert line["bytes_in"] == len(sent), line
    assert w.metric("weir_request_bytes_total") == len(sent)


@pytest.mark.parametrize("line", [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n",
                                  b"GET /v1/models HTTP/3.0\r\nHost: x\r\n\r\n"])
def test_an_http2_request_line_is_505(weir, mock, line):
    w = gateway(weir, mock)
    with RawConn(w.port) as raw:
        raw.send(line)
        r = raw.read_response("GET")
    assert r.status == 505, r.body
    err = json.loads(r.body)["error"]
    assert err["code"] == "http_version_not_supported", err
    assert "HTTP/1.1" in err["message"], err
    assert last_log(w, 505)["bytes_in"] > 0
    # HTTP/1.0 and 1.1 are served as before.
    with RawConn(w.port) as raw:
        raw.send(b"GET /v1/models HTTP/1.0\r\n\r\n")
        assert raw.read_response("GET").status == 200


@pytest.mark.parametrize("header", [
    b"PROXY TCP4 192.0.2.1 192.0.2.2 56324 443\r\n",
    b"PROXY UNKNOWN\r\n",
    b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c\xc0\x00\x02\x01\xc0\x00\x02\x02\xdc\x04\x01\xbb",
])
def test_a_proxy_protocol_header_is_named_in_the_400(weir, mock, header):
    w = gateway(weir, mock)
    with RawConn(w.port) as raw:
        raw.send(header + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        r = raw.read_response("GET")
    assert r.status == 400, r.body
    err = json.loads(r.body)["error"]
    assert err["code"] == "proxy_protocol_unsupported", err
    assert "PROXY protocol" in err["message"] and "send-proxy" in err["message"], err
    assert r.header("connection") == "close"
