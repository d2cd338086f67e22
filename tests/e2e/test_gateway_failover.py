"""Retries and fallbacks before the commit point (docs/reliability.md), against real weir-mock
upstreams with injected faults, through the official openai SDK: each request gets exactly one
correct outcome, no duplicated or lost text, one access-log line naming every attempt."""

from __future__ import annotations

import httpx
import openai
import pytest

from conftest import Mock
from httpwire import RawConn, request

MSG = [{"role": "user", "content": "hello"}]
FAST = ("--ttft-ms", "1", "--itl-ms", "1", "--max-tokens", "6")


def served(m: Mock) -> float:
    return m.metric("vllm:request_success_total")


def stream_text(c: openai.OpenAI, **extra) -> tuple[str, list]:
    chunks = list(c.chat.completions.create(model="big", messages=MSG, stream=True, **extra))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return text, chunks


def failover_config(primary: Mock, backup: Mock, **pool_extra) -> dict:
    return {
        "pools": {"gpu": {"endpoints": [primary.base_url], **pool_extra},
                  "backup": {"endpoints": [backup.base_url]}},
        "models": {"big": {"pool": "gpu", "upstream_model": "mock-model",
                           "fallbacks": [{"pool": "backup", "upstream_model": "small-model"}]}},
    }


def test_a_pool_answering_503_falls_back_for_plain_and_streamed_requests(mock, weir):
    primary = mock(*FAST, "--error-rate", "1", "--error-status", "503")
    backup = mock(*FAST, "--model", "small-model")
    reference = mock(*FAST)
    w = weir(config=failover_config(primary, backup))
    c = w.client()
    r = c.chat.completions.create(model="big", messages=MSG)
    assert r.model == "small-model"  # the fallback's upstream name
    # the same request unbroken, straight to a healthy mock: the same text
    direct = openai.OpenAI(base_url=reference.base_url + "/v1", api_key="x")
    want = direct.chat.completions.create(model="mock-model", messages=MSG).choices[0].message.content
    assert r.choices[0].message.content == want
    text, chunks = stream_text(c)
    assert text == want
    roles = [ch for ch in chunks if ch.choices and ch.choices[0].delta.role]
    assert len(roles) == 1
    assert chunks[-1].choices[0].finish_reason == "stop" or chunks[-2].choices[0].finish_reason == "stop"
    entries = w.wait_log(lambda es: len(es) >= 2)
    assert [e["status"] for e in entries] == [200, 200]
    for e in entries:
        assert e["pool"] == "backup"
        assert e["model"] == "big"
        assert e["retries"] == 1
        assert [(a["pool"], a["status"]) for a in e["attempts"]] == [("gpu", 503), ("backup", 200)]
    assert w.metric("weir_upstream_fallbacks_total") == 2
    assert served(backup) == 2


def test_without_a_fallback_the_upstreams_503_passes_through(mock, weir):
    primary = mock(*FAST, "--error-rate", "1", "--error-status", "503")
    w = weir(config={"pools": {"gpu": {"endpoints": [primary.base_url]}},
                     "models": {"mock-model": {"pool": "gpu"}}})
    with pytest.raises(openai.InternalServerError) as e:
        w.client(max_retries=0).chat.completions.create(model="mock-model", messages=MSG)
    assert e.value.status_code == 503
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["status"] == 503 and entry["retries"] == 0 and "attempts" not in entry


def test_the_request_header_turns_the_chain_off(mock, weir):
    primary = mock(*FAST, "--error-rate", "1", "--error-status", "503")
    backup = mock(*FAST, "--model", "small-model")
    w = weir(config=failover_config(primary, backup))
    with pytest.raises(openai.InternalServerError):
        w.client(max_retries=0).chat.completions.create(model="big", messages=MSG,
                                                        extra_headers={"x-weir-fallbacks": "0"})
    assert served(backup) == 0
    r = httpx.post(w.base_url + "/v1/chat/completions", json={"model": "big", "messages": MSG},
                   headers={"x-weir-fallbacks": "many"})
    assert r.status_code == 400 and "x-weir-fallbacks" in r.json()["error"]["message"]


def test_retries_on_the_same_pool_reach_the_healthy_endpoint(mock, weir):
    sick = mock(*FAST, "--error-rate", "1", "--error-status", "502")
    healthy = mock(*FAST)
    w = weir(config={"pools": {"gpu": {"endpoints": [sick.base_url, healthy.base_url],
                                       "retry": {"attempts": 2, "backoff": "1ms", "max_backoff": "5ms",
                                                 "min_concurrent": 100}}},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    c = w.client(max_retries=0)
    for _ in range(10):
        assert c.chat.completions.create(model="mock-model", messages=MSG).choices[0].message.content
        text = "".join(ch.choices[0].delta.content or ""
                       for ch in c.chat.completions.create(model="mock-model", messages=MSG, stream=True)
                       if ch.choices)
        assert text
    entries = w.wait_log(lambda es: len(es) >= 20)
    assert [e["status"] for e in entries] == [200] * 20
    retried = [e for e in entries if e["retries"]]
    assert retried, "the sick endpoint was never picked in 20 requests"
    for e in retried:
        assert [a["status"] for a in e["attempts"]] == [502, 200]
    assert w.metric("weir_upstream_retries_total", reason="status") == len(retried)
    assert served(healthy) == 20


def test_a_stream_reset_before_its_first_token_fails_over_without_duplicated_text(mock, weir):
    primary = mock(*FAST, "--reset-after", "0")
    backup = mock(*FAST, "--model", "small-model")
    w = weir(config=failover_config(primary, backup))
    text, chunks = stream_text(w.client(max_retries=0))
    direct = openai.OpenAI(base_url=backup.base_url + "/v1", api_key="x")
    want = "".join(ch.choices[0].delta.content or "" for ch in
                   direct.chat.completions.create(model="small-model", messages=MSG, stream=True) if ch.choices)
    assert text == want
    assert len([ch for ch in chunks if ch.choices and ch.choices[0].delta.role]) == 1
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["status"] == 200 and entry["error"] is None
    assert [a["pool"] for a in entry["attempts"]] == ["gpu", "backup"]
    assert entry["attempts"][0]["failure"] == "reset"


def test_a_stream_stalled_before_its_first_token_fails_over(mock, weir):
    primary = mock("--ttft-ms", "5000", "--itl-ms", "1", "--max-tokens", "6")
    backup = mock(*FAST, "--model", "small-model")
    w = weir(config=failover_config(primary, backup, timeouts={"idle": "300ms"}))
    text, _ = stream_text(w.client(max_retries=0))
    assert text
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["status"] == 200
    assert entry["attempts"][0]["failure"] == "timeout"
    assert primary.aborts() == 1  # the stalled generation was cancelled upstream


def test_after_the_first_token_a_failure_is_in_band_and_never_retried(mock, weir):
    primary = mock(*FAST, "--reset-after", "2")
    backup = mock(*FAST, "--model", "small-model")
    w = weir(config=failover_config(primary, backup))
    with RawConn(w.port) as conn:
        conn.send(request("POST", "/v1/chat/completions", {"model": "big", "messages": MSG, "stream": True}))
        resp = conn.read_response("POST")
    assert resp.status == 200
    raw = resp.decoded().decode()
    assert raw.count('"role"') == 1
    assert '"error"' in raw and "data: [DONE]" in raw
    assert served(backup) == 0
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["status"] == 200 and entry["error"]["code"] == "upstream_unavailable"


def test_every_target_down_is_one_502_and_one_log_line(mock, weir):
    from conftest import free_port
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    w = weir(config={"pools": {"gpu": {"endpoints": [dead[0]]}, "backup": {"endpoints": [dead[1]]}},
                     "models": {"big": {"pool": "gpu", "fallbacks": [{"pool": "backup"}]}}})
    for stream in (False, True):
        r = httpx.post(w.base_url + "/v1/chat/completions",
                       json={"model": "big", "messages": MSG, "stream": stream})
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_unavailable"
    entries = w.wait_log(lambda es: len(es) >= 2)
    assert len(entries) == 2
    for e in entries:
        assert [a["failure"] for a in e["attempts"]] == ["connect_refused", "connect_refused"]


def test_an_endpoint_failing_answers_in_a_row_is_ejected(mock, weir):
    sick = mock(*FAST, "--error-rate", "1", "--error-status", "500")
    healthy = mock(*FAST)
    w = weir(config={"pools": {"gpu": {"endpoints": [sick.base_url, healthy.base_url], "eject_for": "60s",
                                       "outlier": {"consecutive_failures": 2}}},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    statuses = [httpx.post(w.base_url + "/v1/chat/completions",
                           json={"model": "mock-model", "messages": MSG}).status_code for _ in range(30)]
    assert statuses.count(500) == 2, statuses  # passed through (no retry section), then never picked again
    assert statuses.count(200) == 28
    assert w.metric("weir_upstream_outlier_ejections_total") == 1


def test_an_anthropic_stream_reset_before_its_first_token_fails_over(mock, weir):
    import anthropic
    primary = mock(*FAST, "--reset-after", "0")
    backup = mock(*FAST, "--model", "small-model")
    w = weir(config=failover_config(primary, backup))
    c = anthropic.Anthropic(base_url=w.base_url, api_key="x", max_retries=0, timeout=30)
    with c.messages.stream(model="big", max_tokens=6, messages=MSG) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events.count("message_start") == 1 and events.count("message_stop") == 1
    direct = openai.OpenAI(base_url=backup.base_url + "/v1", api_key="x")
    want = direct.chat.completions.create(model="small-model", messages=MSG, max_tokens=6).choices[0].message.content
    assert final.content[0].text == want
    (entry,) = w.wait_log(lambda es: len(es) >= 1)
    assert entry["status"] == 200 and [a["pool"] for a in entry["attempts"]] == ["gpu", "backup"]


def test_active_health_probes_eject_an_unresponsive_endpoint_and_readmit_it(mock, weir):
    import os
    import signal

    from conftest import wait_until
    good = mock(*FAST)
    frozen = mock(*FAST)
    w = weir(config={"pools": {"gpu": {"endpoints": [good.base_url, frozen.base_url],
                                       "health": {"interval": "200ms", "timeout": "100ms", "unhealthy_after": 1},
                                       "timeouts": {"first_byte": "5s"}}},
                     "models": {"mock-model": {"pool": "gpu"}}}, workers=1)
    os.kill(frozen.process.pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        wait_until(lambda: w.metric("weir_upstream_health_transitions_total") >= 1, timeout=10,
                   message="the frozen endpoint was marked unhealthy")
        c = w.client()
        for _ in range(20):
            # (4 s: room for a loaded machine, still short of the frozen endpoint's 5 s first_byte)
            assert c.chat.completions.create(model="mock-model", messages=MSG, timeout=4).choices
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    wait_until(lambda: w.metric("weir_upstream_health_transitions_total") >= 2, timeout=10,
               message="the endpoint came back")
    before = served(frozen)
    c = w.client()
    for _ in range(20):
        c.chat.completions.create(model="mock-model", messages=MSG)
    assert served(frozen) > before, "the healthy-again endpoint takes traffic again"
    entries = w.wait_log(lambda es: len(es) >= 40)
    assert all(e["status"] == 200 for e in entries)
    assert "unhealthy" in w.process.log() and "healthy again" in w.process.log()
