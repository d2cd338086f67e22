"""Defects found by stop 49's regression round in the stop's own fixes (helpers 233 and 234):
- a keys file written by an older build, whose admin API took a tab in a key's name, stopped the new build from
  starting (the name check meant for new names was applied to the file's);
- a reload that listed admin.allowed_hosts in another order was refused as a change;
- added_us was 1 µs above duration_ms on a request that waited on nothing (rounded against truncated)."""
from __future__ import annotations

import json

import httpx

from conftest import wait_until
from test_admin_api import ENV, MOCK_FLAGS, _ready, chat, config, start
from test_config_reload import sighup, write as write_config


def test_a_keys_file_with_a_control_character_in_a_key_name_still_loads(mock, weir, tmp_path):
    m = mock(*MOCK_FLAGS)
    keys_file = tmp_path / "keys.json"
    w, admin = start(m, weir, keys_file=str(keys_file))
    k = admin.create(tenant="acme", name="CI key (prod)")
    w.process.stop()
    # As a build before stop 49 wrote it: its admin API took the tab.
    text = keys_file.read_text()
    assert '"CI key (prod)"' in text
    keys_file.write_text(text.replace('"CI key (prod)"', json.dumps("CI key\t(prod)")))

    w2 = weir(config=config(m, int(admin.base.rsplit(":", 1)[1]), keys_file=str(keys_file)), env=ENV)
    wait_until(lambda: _ready(admin), 5, message="admin listener after the restart")
    assert chat(w2, k["key"]).status_code == 200
    assert admin("GET", f"/admin/v1/keys/{k['id']}").json()["name"] == "CI key\t(prod)"
    # New names keep the rule.
    r = admin("POST", "/admin/v1/keys", json={"tenant": "acme", "name": "tab\tname"})
    assert r.status_code == 400, r.text


def test_a_reload_that_reorders_admin_allowed_hosts_applies(mock, weir):
    m = mock(*MOCK_FLAGS)
    w, admin = start(m, weir, allowed_hosts=["weir-admin.internal", "127.0.0.1"])
    port = int(admin.base.rsplit(":", 1)[1])
    write_config(w, config(m, port, allowed_hosts=["127.0.0.1", "weir-admin.internal"]))
    sighup(w, "success")  # (it was refused: "admin.allowed_hosts[0]: changes only at restart")
    assert admin("GET", "/ready", token=None).status_code == 200


def test_added_us_is_never_above_duration(mock, weir):
    w = weir(mock(*MOCK_FLAGS), workers=1)
    for i in range(40):
        httpx.get(w.base_url + f"/nowhere-{i}", timeout=10)  # answered by Weir: no wait on anyone
    lines = w.wait_log(lambda es: len(es) >= 40)
    over = [(e["added_us"], e["duration_ms"]) for e in lines if e["added_us"] > round(e["duration_ms"] * 1000)]
    assert not over, over


def test_response_failed_says_the_estimate_a_stream_without_usage_was_charged(mock, weir):
    # An upstream that resets after 3 tokens and never sent usage: Weir charges the estimate (charged_tokens),
    # and response.failed said "usage": null (only a per-choice count was replaced by the charge).
    m = mock("--ttft-ms", "5", "--itl-ms", "5", "--max-tokens", "10")
    w = weir(config={"pools": {"p": {"endpoints": [m.base_url], "retry": {"attempts": 1}}},
                     "models": {"m": {"pool": "p", "upstream_model": "mock-model"}},
                     "pricing": {"*": {"input": 1.0, "output": 2.0}}}, workers=1)
    with httpx.stream("POST", w.base_url + "/v1/responses", timeout=30,
                      headers={"x-request-id": "resp-cut", "x-mock-reset-after": "3"},
                      json={"model": "m", "input": "hello there", "stream": True, "max_output_tokens": 10}) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    failed = [e for e in events if e.get("type") == "response.failed"]
    assert len(failed) == 1, events
    charged = w.log_for("resp-cut")["charged_tokens"]
    usage = failed[0]["response"]["usage"]
    assert usage and (usage["input_tokens"], usage["output_tokens"]) == (charged["prompt"], charged["completion"]), \
        (usage, charged)


def test_a_head_refused_in_its_request_line_counts_the_bytes_it_took(mock, weir):
    # bytes_in is what Weir took of the request from the connection: a head whose request line (or a field) the
    # parser refused was counted 0 (or the request line alone), though it was read and its line logged.
    from httpwire import roundtrip
    w = weir(mock(*MOCK_FLAGS), workers=1)
    heads = [b"GET /v1/models HTTP/01.1\r\nHost: localhost\r\n\r\n", b"GARBAGE STUFF\r\n\r\n",
             b"GET /v1/models HTTP/1.1\r\nHost x\r\n\r\n"]
    for h in heads:
        assert roundtrip(w.port, h, method="GET").status == 400
    lines = w.wait_log(lambda es: len(es) >= len(heads))
    assert [e["bytes_in"] for e in lines] == [len(h) for h in heads], lines


def test_an_http_1_0_host_is_checked_as_1_1s(mock, weir):
    # HTTP/1.0 may leave Host out, but one it sends was not checked: `Host: localhost:1@attacker.example` passed
    # the admin listener's allow list (which compares what comes before the first ':').
    from httpwire import roundtrip
    w, admin = start(mock(*MOCK_FLAGS), weir)
    port = int(admin.base.rsplit(":", 1)[1])
    for bad in (b"localhost:1@attacker.example", b"127.0.0.1:@attacker.example", b"localhost:80 attacker"):
        for p in (port, w.port):
            r = roundtrip(p, b"GET /metrics HTTP/1.0\r\nHost: " + bad + b"\r\n\r\n", method="GET")
            assert r.status == 400, (p, bad, r.status)
    assert roundtrip(port, b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n", method="GET").status == 200
    assert roundtrip(port, b"GET /metrics HTTP/1.0\r\n\r\n", method="GET").status == 200
