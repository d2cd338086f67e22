"""Small defects found by stop 50's independent testers: the admin API's body messages, weir-mock's lax counts,
the stale pooled-connection resend in the access log, and configuration errors that echoed control characters."""
from __future__ import annotations

import httpx
import pytest

from test_admin_fixes_46 import ENV as ADMIN_ENV
from test_admin_fixes_46 import TOKEN as ADMIN_TOKEN
from test_admin_fixes_46 import start as start_admin

MSG = [{"role": "user", "content": "hi"}]


# DEFECT: the admin API's request bodies were "We could not parse the JSON body of your request (syntax error)."
# for ill-formed UTF-8 and for a lone surrogate escape, where the client routes say which (stop 49). Now the same
# words as there (one function, api::invalid_body_message), on every admin route that reads a JSON body.
def test_admin_body_messages_name_invalid_utf8_and_lone_surrogates(weir):
    base = start_admin(weir)
    auth = {"authorization": "Bearer " + ADMIN_TOKEN, "content-type": "application/json"}
    made = httpx.post(base + "/admin/v1/keys", headers=auth, json={"tenant": "acme"}, timeout=10)
    assert made.status_code == 201, made.text
    kid = made.json()["id"]
    routes = [("POST", "/admin/v1/keys"), ("PATCH", f"/admin/v1/keys/{kid}"), ("POST", f"/admin/v1/keys/{kid}/rotate")]
    cases = [(b'{"tenant":"\\ud800"}', "lone surrogate escape"), (b'{"tenant":"\\udc00"}', "lone surrogate escape"),
             (b'{"tenant":"a\\ud800\\u0041"}', "lone surrogate escape"),
             (b'{"tenant":"x\xff"}', "invalid UTF-8 (byte 0xFF at offset 12)"),
             (b'{"tenant":"\xed\xa0\x80"}', "invalid UTF-8 (byte 0xED at offset 11)")]
    for method, path in routes:
        for body, says in cases:
            r = httpx.request(method, base + path, headers=auth, content=body, timeout=10)
            assert r.status_code == 400, (method, path, body, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error", err
            assert err["message"].startswith("The request body is not valid JSON: " + says), (method, path, body, err)
        # Plain bad JSON keeps Boost.JSON's word for it, in the same sentence.
        r = httpx.request(method, base + path, headers=auth, content=b'{"tenant":', timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(
            "The request body is not valid JSON: "), r.text

