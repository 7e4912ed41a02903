"""Auth, isolation and bad input on every endpoint (the real app in-process)."""

from __future__ import annotations

import re

import logging

import httpx
import pytest
from litestar.testing import TestClient

from datadesk.api.guards.auth import RedactSecrets, redact
from datadesk.llm.scripted import ScriptedModel
from tests.conftest import parse_sse

ENDPOINTS = [
    ("GET", "/api/me"),
    ("GET", "/api/threads"),
    ("POST", "/api/threads"),
    ("GET", "/api/threads/{tid}"),
    ("DELETE", "/api/threads/{tid}"),
    ("POST", "/api/threads/{tid}/messages"),
    ("POST", "/api/threads/{tid}/cancel"),
    ("POST", "/api/logout"),
]
BODIES = {"/api/threads": {}, "/api/threads/{tid}/messages": {"content": "hi"}}


@pytest.fixture
def env(harness_factory):
    h = harness_factory(ScriptedModel(then="fine"), auth={"login_attempts_per_minute": 5})
    with h.client(signed_in=False) as api:  # each request names its credential
        yield h, api.client, api.tid


def call(client, method, path, tid, headers=None):
    url = path.format(tid=tid)
    body = BODIES.get(path)
    return client.request(method, url, json=body if method == "POST" else None, headers=headers or {})


@pytest.mark.parametrize("method,path", ENDPOINTS)
def test_no_token_is_401(env, method, path) -> None:
    h, client, tid = env
    r = call(client, method, path, tid)
    assert r.status_code == 401, r.text
    assert "authentication required" in r.json()["error"]


@pytest.mark.parametrize("method,path", ENDPOINTS)
def test_revoked_or_bad_token_is_401(env, method, path) -> None:
    h, client, tid = env
    for headers in (h.auth("carol"), {"Authorization": "Bearer ddt_nope"}, {"Authorization": "Basic abc"}):
        r = call(client, method, path, tid, headers)
        assert r.status_code == 401, (headers, r.text)


@pytest.mark.parametrize("method,path", [e for e in ENDPOINTS if "{tid}" in e[1]])
def test_other_users_thread_is_404(env, method, path) -> None:
    h, client, tid = env
    r = call(client, method, path, tid, h.auth("bob"))
    assert r.status_code == 404, r.text
    assert tid in r.json()["error"]
    # and alice's thread is untouched
    assert client.get(f"/api/threads/{tid}", headers=h.auth("alice")).status_code == 200


@pytest.mark.parametrize("bad", ["..", "a.b", "x" * 65, "%2e%2e", "a%2Fb", "..%2F..%2Fusers.json", "a b", "é"])
@pytest.mark.parametrize("method,path", [e for e in ENDPOINTS if "{tid}" in e[1]])
def test_traversal_shaped_ids_are_refused(env, method, path, bad) -> None:
    h, client, tid = env
    r = call(client, method, path, bad, h.auth("alice"))
    assert r.status_code in (400, 404, 405), r.text
    if r.status_code == 400:
        assert "invalid thread id" in r.json()["error"]
    assert h.rt.users.by_token(h.tokens["alice"]) is not None  # the user store (users.json) untouched


def test_thread_listing_is_per_user(env) -> None:
    h, client, tid = env
    assert [t["id"] for t in client.get("/api/threads", headers=h.auth("alice")).json()] == [tid]
    assert client.get("/api/threads", headers=h.auth("bob")).json() == []


def test_workspace_choice_and_membership(env) -> None:
    h, client, _ = env
    r = client.post("/api/threads", json={"workspace": "sales"}, headers=h.auth("alice"))
    assert r.status_code == 201 and r.json()["workspace"] == "sales"
    r = client.post("/api/threads", json={"workspace": "sales"}, headers=h.auth("bob"))
    assert r.status_code == 404 and "sales" in r.json()["error"]
    r = client.post("/api/threads", json={"workspace": "../x"}, headers=h.auth("bob"))
    assert r.status_code == 400
    # a thread in any of alice's workspaces is found by id alone
    sid = client.post("/api/threads", json={"workspace": "sales"}, headers=h.auth("alice")).json()["id"]
    assert client.get(f"/api/threads/{sid}", headers=h.auth("alice")).json()["thread"]["workspace"] == "sales"


def test_bad_bodies(env) -> None:
    h, client, tid = env
    auth = {**h.auth("alice"), "Content-Type": "application/json"}
    r = client.post(f"/api/threads/{tid}/messages", content=b"{not json", headers=auth)
    assert r.status_code == 400
    r = client.post(f"/api/threads/{tid}/messages", json={"content": "x", "evil": 1}, headers=h.auth("alice"))
    assert r.status_code == 400 and "evil" in r.text
    r = client.post(f"/api/threads/{tid}/messages", json={"content": 5}, headers=h.auth("alice"))
    assert r.status_code == 400 and "content" in r.text
    r = client.post(f"/api/threads/{tid}/messages", json={}, headers=h.auth("alice"))
    assert r.status_code == 400 and "content" in r.text
    r = client.post(f"/api/threads/{tid}/messages", json={"content": "   "}, headers=h.auth("alice"))
    assert r.status_code == 400 and "empty" in r.json()["error"]
    big = b'{"content": "' + b"a" * (1024 * 1024 + 10) + b'"}'
    r = client.post(f"/api/threads/{tid}/messages", content=big, headers=auth)
    assert r.status_code == 413
    r = client.get(f"/api/threads/{tid}?limit=0", headers=h.auth("alice"))
    assert r.status_code == 400 and "limit" in r.text
    # nothing was recorded by the refused requests
    assert client.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["records"] == []


def test_login_code_cookie_logout_and_rate_limit(env) -> None:
    h, client, _ = env
    code = h.rt.users.new_login_code("alice", 60)
    r = client.get(f"/login?code={code}", follow_redirects=False)  # a confirm page; the form POSTs
    assert r.status_code == 200 and "datadesk_session=" not in r.headers.get("set-cookie", "")
    confirm = re.search(r'name="confirm" value="([0-9a-f]+)"', r.text).group(1)
    r = client.post("/login", data={"code": code, "confirm": confirm}, follow_redirects=False)
    assert r.status_code in (302, 303, 307)
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "datadesk_session=" in cookie
    me = client.get("/api/me").json()
    assert me["id"] == "alice" and me["csrf"]
    # a cookie session needs the CSRF token on state-changing requests
    r = client.post("/api/logout")
    assert r.status_code == 403 and "CSRF" in r.json()["error"]
    r = client.post("/api/logout", headers={"X-CSRF-Token": "0" * 40})
    assert r.status_code == 403 and "invalid CSRF" in r.json()["error"]
    assert client.post("/api/logout", headers={"X-CSRF-Token": me["csrf"]}).status_code == 200
    client.cookies.clear()
    assert client.get("/api/me").status_code == 401
    # the code was one-time
    assert client.get(f"/login?code={code}", follow_redirects=False).status_code == 401
    # a token can also be exchanged for a cookie; the cookie is not the token
    r = client.post("/api/login", json={"token": h.tokens["bob"]})
    assert r.status_code == 200 and h.tokens["bob"] not in r.headers["set-cookie"]
    assert client.get("/api/me").json()["id"] == "bob"
    client.cookies.clear()
    statuses = [client.post("/api/login", json={"code": "wrong"}).status_code for _ in range(6)]
    assert statuses[:2] == [401, 401] and 429 in statuses


def test_revoking_kills_sessions(env) -> None:
    h, client, _ = env
    client.post("/api/login", json={"token": h.tokens["bob"]})
    assert client.get("/api/me").status_code == 200
    h.rt.users.revoke("bob")
    assert client.get("/api/me").status_code == 401


def test_health_and_me_label_the_demo_model(harness_factory) -> None:
    from datadesk.llm.scripted import demo_model

    h = harness_factory(demo_model())
    with TestClient(h.app()) as client:
        assert client.get("/api/health").json()["model"]["label"] == "demo model, no LLM configured"
        me = client.get("/api/me", headers=h.auth("alice")).json()
        assert me["model"]["demo"] is True and me["permissions"] == ["code_execution"]
        assert me["workspaces"] == ["demo", "sales"]
        assert client.get("/schema/openapi.json").status_code == 200
        assert "demo" in client.get("/").text.lower() or client.get("/static/app.js").status_code == 200


def test_secrets_are_redacted_from_access_logs() -> None:
    rec = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                            ("127.0.0.1:5", "GET", "/login?code=SECRETCODE&x=1", "1.1", 302), None)
    RedactSecrets().filter(rec)
    assert "SECRETCODE" not in rec.getMessage() and "code=[REDACTED]" in rec.getMessage()
    assert "ddt_abc" not in redact("token ddt_abcdef used")
    assert "xyz" not in redact("Authorization: Bearer xyz")


def test_sse_error_event_for_tool_failure_then_recovery(harness_factory) -> None:
    from datadesk.llm.scripted import tool_step

    h = harness_factory(ScriptedModel([
        tool_step("sql_query", {"sql": "DROP TABLE readings"}, call_id="c1"),
        tool_step("sql_query", {"sql": "SELECT * FROM nope"}, call_id="c2"),
        tool_step("no_such_tool", {}, call_id="c3"),
        tool_step("sql_query", '{"sql": ', call_id="c4"),
        "ok, giving up",
    ]))
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("bob")).json()["id"]
        events = parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "x"},
                                       headers=h.auth("bob")).text)
    fin = [d for e, d in events if e == "tool.finished"]
    assert [f["ok"] for f in fin] == [False] * 4
    assert "DROP" in fin[0]["preview"] or "read" in fin[0]["preview"].lower()
    assert "nope" in fin[1]["preview"]
    assert "unknown tool" in fin[2]["preview"]
    assert "not valid JSON" in fin[3]["preview"]
    assert events[-1][1]["status"] == "ok"


def test_csrf_and_security_headers(env) -> None:
    h, client, _ = env
    r = client.post("/api/login", json={"token": h.tokens["alice"]})
    token = r.json()["csrf"]
    for method, url, body in [("POST", "/api/threads", {"title": "x"}), ("DELETE", "/api/memory", None),
                              ("PUT", "/api/memory/settings", {"enabled": False})]:
        r = client.request(method, url, json=body)
        assert r.status_code == 403 and "X-CSRF-Token" in r.json()["error"], (method, url, r.text)
    r = client.post("/api/threads", json={"title": "with token"}, headers={"X-CSRF-Token": token})
    assert r.status_code == 201
    # another session's token does not fit this session
    other = httpx.Client(transport=client._transport, base_url=str(client.base_url))
    other_token = other.post("/api/login", json={"token": h.tokens["bob"]}).json()["csrf"]
    assert client.post("/api/threads", json={}, headers={"X-CSRF-Token": other_token}).status_code == 403
    # bearer clients need no token (no ambient credential)
    client.cookies.clear()
    assert client.post("/api/threads", json={}, headers=h.auth("alice")).status_code == 201
    # every page carries the strict CSP and nosniff
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "img-src 'self' data:" in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/api/health").headers["content-security-policy"] == csp
