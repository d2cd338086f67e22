"""Stop 59's admin API defects end to end (each test fails on the build before its fix; docs/admin-api.md):

- an `expires_at` written as a JSON number past 64-bit integers (1e30, -1e30, 1e19, 9.3e18) threw from an
  unchecked std::stoll: the admin API dropped the connection without an answer, a keys file holding one aborted
  start-up and `weir --check` (SIGABRT, not the configuration error and exit 2), and one written into the keys
  file while Weir ran ended the file's watcher silently, so a key removed from the file later stayed accepted;
- with the request log on PostgreSQL, a filter that is not valid UTF-8 (`tenant=%FF`) was a 503 that dropped
  the reader's connection, where SQLite answered no rows (no such value is ever stored);
- the admin routes that take no query parameter ignored one: `GET /admin/v1/keys?tenant=nobody` listed every
  tenant's keys (a script that revoked what it listed would revoke them all);
- a key's `name` was limited to 256 bytes where the OpenAPI file's maxLength counts 256 characters."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid

import httpx
import openai
import pytest

from conftest import answers, binary, free_port, wait_until
from pg import Postgres

TOKEN = "admin-59-token-0123456789abcdef"
ENV = {"WEIR_TEST_ADMIN_TOKEN": TOKEN}
AUTH = {"authorization": f"Bearer {TOKEN}"}
CFG_KEY = "sk-acme-cfg-59-0123456789"


def config(m, admin_port: int, keys_file=None, request_log: str | None = None) -> dict:
    cfg = {
        "pools": {"p": {"endpoints": [m.base_url]}},
        "models": {"mock-model": {"pool": "p", "default_max_tokens": 4}},
        "tenants": {"acme": {"models": ["mock-model"]}, "other": {"models": ["mock-model"]}},
        "auth": {"required": True, "api_keys": [{"id": "acme-cfg", "tenant": "acme",
                                                 "sha256": hashlib.sha256(CFG_KEY.encode()).hexdigest()}]},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token_env": "WEIR_TEST_ADMIN_TOKEN"},
    }
    if keys_file:
        cfg["admin"]["keys_file"] = str(keys_file)
    if request_log:
        cfg["request_log"] = {"url": request_log, "flush_interval": "10ms"}
    return cfg


def start(weir, cfg: dict):
    w = weir(config=cfg, env=ENV)
    base = "http://" + cfg["admin"]["listen"]
    wait_until(lambda: answers(base + "/ready", (200, 503)), 10, message="admin listener")
    return w, base


def chat(w, key: str, request_id: str | None = None) -> int:
    """A chat completion through the openai SDK: its status (200, or the error's)."""
    c = w.client(api_key=key)
    try:
        c.chat.completions.create(model="mock-model", max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                                  extra_headers={"x-request-id": request_id} if request_id else None)
        return 200
    except openai.APIStatusError as e:
        return e.status_code


def replace(path, doc: dict) -> None:
    """Writes the keys file as Weir does: a new file renamed over the old (a read sees one version whole)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(json.dumps(doc))
    os.rename(tmp, path)


# --- 1. expires_at past int64 ------------------------------------------------------------------------------------

BIG = ["1e30", "-1e30", "1e19", "9.3e18", "-9.3e18", "1e300"]


def test_an_expiry_past_int64_is_a_400_on_create_and_update(mock, weir, tmp_path):
    port = free_port()
    w, base = start(weir, config(mock(), port, keys_file=tmp_path / "keys.json"))
    with httpx.Client(headers=AUTH, timeout=10) as c:
        for v in BIG:
            r = c.post(base + "/admin/v1/keys", content=f'{{"tenant":"acme","expires_at":{v}}}',
                       headers={"content-type": "application/json"})
            assert r.status_code == 400, (v, r.text)
            assert r.json()["error"]["param"] == "expires_at", r.text
        k = c.post(base + "/admin/v1/keys", json={"tenant": "acme", "expires_at": 2e9})  # a whole double: seconds
        assert k.status_code == 201, k.text
        assert k.json()["expires_at"] == 2_000_000_000
        for v in BIG:
            r = c.patch(base + f"/admin/v1/keys/{k.json()['id']}", content=f'{{"expires_at":{v}}}',
                        headers={"content-type": "application/json"})
            assert r.status_code == 400, (v, r.text)
            assert r.json()["error"]["param"] == "expires_at", r.text
        assert c.get(base + f"/admin/v1/keys/{k.json()['id']}").json()["expires_at"] == 2_000_000_000
    assert w.process.alive()
    assert "stoll" not in w.process.log()


@pytest.mark.parametrize("value", ["1e30", "-1e30", "9.3e18"])
def test_a_keys_file_with_an_expiry_past_int64_is_a_configuration_error(mock, tmp_path, value):
    keys = tmp_path / "keys.json"
    keys.write_text('{"version":1,"keys":[{"id":"vk_1","tenant":"acme","sha256":"' + "a" * 64 +
                    f'","expires_at":{value}}}]}}')
    cfg = tmp_path / "weir.yaml"
    cfg.write_text(f"""listen: 127.0.0.1:{free_port()}
pools: {{p: {{endpoints: ["http://127.0.0.1:9"]}}}}
models: {{m: {{pool: p}}}}
tenants: {{acme: {{models: [m]}}}}
auth: {{required: true}}
admin: {{listen: 127.0.0.1:{free_port()}, token_env: WEIR_TEST_ADMIN_TOKEN, keys_file: {keys}}}
""")
    for extra in (["--check"], []):  # --check, and a start-up (which ends the same way, before it serves)
        r = subprocess.run([str(binary("weir")), "--config", str(cfg), *extra], capture_output=True, text=True,
                           timeout=20, env={**os.environ, **ENV})
        assert r.returncode == 2, (extra, r.returncode, r.stderr)
        assert f"admin.keys_file {keys}: keys[0]: expires_at: " in r.stderr, r.stderr


def test_an_invalid_keys_file_at_run_time_is_said_once_and_the_watcher_keeps_watching(mock, weir, tmp_path):
    keys = tmp_path / "keys.json"
    port = free_port()
    w, base = start(weir, config(mock(), port, keys_file=keys))
    victim = httpx.post(base + "/admin/v1/keys", headers=AUTH, json={"tenant": "acme", "name": "victim"}).json()
    other = httpx.post(base + "/admin/v1/keys", headers=AUTH, json={"tenant": "acme", "name": "other"}).json()
    assert chat(w, victim["key"]) == 200
    good = json.loads(keys.read_text())
    bad = json.loads(json.dumps(good))
    for e in bad["keys"]:
        if e["id"] == victim["id"]:
            e["expires_at"] = 1e30
    replace(keys, bad)
    said = "expires_at: must be after 1970 and before the year 10000"
    wait_until(lambda: said in w.process.log(), 10, message="the invalid keys file said on stderr")
    assert "the runtime keys stay as they were" in w.process.log()
    assert chat(w, victim["key"]) == 200  # the keys as they were
    # The other instance of a zero-downtime restart revokes the key: the file without it.
    revoked = json.loads(json.dumps(good))
    revoked["keys"] = [e for e in revoked["keys"] if e["id"] != victim["id"]]
    replace(keys, revoked)
    wait_until(lambda: chat(w, victim["key"]) == 401, 10, interval=0.1, message="the key removed from the file")
    assert chat(w, other["key"]) == 200
    assert w.process.log().count(said) == 1, w.process.log()
    assert w.process.alive()


# --- 2. PostgreSQL filters that are not valid UTF-8 ----------------------------------------------------------------

@pytest.fixture(scope="module")
def pg():
    p = Postgres()
    p.start()
    yield p
    p.stop()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_filter_that_is_not_utf8_matches_no_record_on_either_store(mock, weir, tmp_path, request, store):
    if store == "postgres":
        p = request.getfixturevalue("pg")
        url = p.url(p.new_database())
    else:
        url = f"sqlite:{tmp_path / 'requests.db'}"
    port = free_port()
    w, base = start(weir, config(mock(), port, request_log=url))
    rid = "r59-" + uuid.uuid4().hex[:8]
    assert chat(w, CFG_KEY, rid) == 200
    with httpx.Client(headers=AUTH, timeout=30) as c:
        wait_until(lambda: c.get(base + f"/admin/v1/requests/{rid}").status_code == 200, 10,
                   message="the record written")
        for q in ["tenant=%FF", "model=%C3%28", "key_id=%ED%A0%80", "request_id=%FF", "tenant=acme&model=%C0%AF",
                  "request_id=%F4%90%80%80"]:
            r = c.get(base + "/admin/v1/requests?" + q)
            assert r.status_code == 200, (q, r.text)
            assert r.json()["data"] == [] and r.json()["has_more"] is False, (q, r.text)
        for path in ["%FF", "%C3%28", "%ED%A0%80"]:
            r = c.get(base + f"/admin/v1/requests/{path}")
            assert r.status_code == 404, (path, r.text)
        # The reader still reads (on PostgreSQL: its connection kept).
        r = c.get(base + "/admin/v1/requests?tenant=acme")
        assert r.status_code == 200 and [x["request_id"] for x in r.json()["data"]] == [rid], r.text
    if store == "postgres":
        assert "cannot be read" not in w.process.log()


# --- 3. query parameters a route does not take ----------------------------------------------------------------------

def test_a_query_parameter_a_route_does_not_take_is_a_400_naming_it(mock, weir, tmp_path):
    port = free_port()
    w, base = start(weir, config(mock(), port, keys_file=tmp_path / "keys.json"))
    with httpx.Client(headers=AUTH, timeout=10) as c:
        mine = c.post(base + "/admin/v1/keys", json={"tenant": "acme"}).json()
        theirs = c.post(base + "/admin/v1/keys", json={"tenant": "other"}).json()
        cases = [("GET", "/admin/v1/keys?tenant=nobody", "tenant"), ("GET", "/admin/v1/keys?limit=1", "limit"),
                 ("GET", "/admin/v1/keys?&cursor=zzz", "cursor"), ("HEAD", "/admin/v1/keys?tenant=acme", "tenant"),
                 ("GET", "/admin/v1/tenants?tenant=nobody", "tenant"), ("GET", "/admin/v1/stats?model=m", "model"),
                 ("GET", "/admin/v1/pools?pool=p", "pool"), ("GET", "/admin/v1/tenants/acme?x=1", "x"),
                 ("GET", f"/admin/v1/keys/{mine['id']}?expand", "expand"),
                 ("DELETE", f"/admin/v1/keys/{theirs['id']}?tenant=acme", "tenant"),
                 ("PATCH", f"/admin/v1/keys/{theirs['id']}?dry_run=1", "dry_run"),
                 ("POST", f"/admin/v1/keys/{theirs['id']}/rotate?dry_run=1", "dry_run"),
                 ("POST", "/admin/v1/keys?tenant=acme", "tenant"), ("GET", "/admin/v1/keys?=1", None)]
        for method, path, param in cases:
            body = {"name": "x"} if method == "PATCH" else {"tenant": "acme"} if method == "POST" else None
            r = c.request(method, base + path, json=body)
            assert r.status_code == 400, (method, path, r.status_code, r.text)
            if method != "HEAD":
                err = r.json()["error"]
                assert err["param"] == param and err["type"] == "invalid_request_error", (path, err)
                assert "Unrecognized query parameter" in err["message"], err
        # Nothing was changed by the refused writes.
        listed = c.get(base + "/admin/v1/keys").json()["data"]
        got = {k["id"]: k for k in listed}
        assert theirs["id"] in got and got[theirs["id"]]["name"] is None
        assert chat(w, theirs["key"]) == 200
        assert len([k for k in listed if k["source"] == "admin"]) == 2
        # No pair at all is no parameter; /metrics and /ready take any (a Prometheus job's params:).
        for path in ["/admin/v1/keys?", "/admin/v1/keys?&&", "/metrics?name[]=x", "/ready?probe=1"]:
            assert c.get(base + path).status_code == 200, path
        # /admin/v1/requests' own parameters (404 here: no request_log).
        assert c.get(base + "/admin/v1/requests?tenant=acme").status_code == 404
    # Unauthenticated is still the token's 401, not the parameter's 400.
    assert httpx.get(base + "/admin/v1/keys?tenant=nobody").status_code == 401


# --- 4. a name's limit in characters ------------------------------------------------------------------------------

def test_a_names_limit_counts_characters_as_the_openapi_file_says(mock, weir, tmp_path):
    port = free_port()
    w, base = start(weir, config(mock(), port))
    with httpx.Client(headers=AUTH, timeout=10) as c:
        r = c.post(base + "/admin/v1/keys", json={"tenant": "acme", "name": "é" * 256})  # 512 bytes
        assert r.status_code == 201, r.text
        assert r.json()["name"] == "é" * 256
        r = c.patch(base + f"/admin/v1/keys/{r.json()['id']}", json={"name": "🦀" * 256})  # 1,024 bytes
        assert r.status_code == 200, r.text
        for name in ["é" * 257, "a" * 257]:
            r = c.post(base + "/admin/v1/keys", json={"tenant": "acme", "name": name})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "name"
            assert "256 characters" in r.json()["error"]["message"]
