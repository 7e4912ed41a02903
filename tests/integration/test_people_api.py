"""The admin people API (`/api/people/...`) and the join page (`/join`), on the real app: every
route, refusals (not an admin, bad input naming the field, the last admin), CSRF, the audit
entry of every change, and an invitation joined, used up, expired, revoked and guessed at."""

from __future__ import annotations

import re
import time

import pytest
from litestar.testing import TestClient

from datadesk.audit.event import AuditFilter
from datadesk.llm.scripted import ScriptedModel

ROUTES = [  # (method, path, JSON body) of every people route
    ("GET", "/api/people/users", None),
    ("POST", "/api/people/users", {"name": "zed", "workspaces": ["demo"]}),
    ("PATCH", "/api/people/users/bob", {"workspaces": ["sales"]}),
    ("POST", "/api/people/users/bob/revoke", None),
    ("POST", "/api/people/users/bob/restore", None),
    ("POST", "/api/people/users/bob/tokens", None),
    ("DELETE", "/api/people/users/bob/tokens/k1", None),
    ("POST", "/api/people/users/bob/login-link", None),
    ("DELETE", "/api/people/users/bob?yes=true", None),
    ("GET", "/api/people/invitations", None),
    ("POST", "/api/people/invitations", {"workspaces": ["demo"]}),
    ("DELETE", "/api/people/invitations/inv_x", None),
]


@pytest.fixture
def env(harness_factory):
    """The harness (alice, bob, a revoked carol) plus an admin `root`; a client with no credential."""
    h = harness_factory(ScriptedModel(then="ok"), auth={"login_attempts_per_minute": 4})
    _, h.tokens["root"] = h.rt.users.add("root", ["demo"], ["admin"])
    with TestClient(h.app()) as client:
        yield h, client


def admin_entries(h, **match) -> list:
    """The trail's "admin" entries matching `match`, oldest first."""
    return [e for e in reversed(list(h.rt.audit.entries(AuditFilter(action="admin"))))
            if all(getattr(e, k) == v for k, v in match.items())]


def call(client, method, path, body=None, headers=None):
    return client.request(method, path, json=body, headers=headers or {})


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_every_route_is_for_admins_only(env, method, path, body) -> None:
    h, client = env
    assert call(client, method, path, body).status_code == 401
    r = call(client, method, path, body, h.auth("alice"))
    assert r.status_code == 403, r.text
    assert "managed by admins" in r.json()["error"]
    assert call(client, method, path, body, h.auth("carol")).status_code == 401  # a revoked admin
    refused = [e for e in h.rt.audit.entries(AuditFilter(action="admin", outcome="refused"))]
    assert len(refused) == (0 if method == "GET" else 1), refused
    assert h.rt.users.get("bob") is not None and h.rt.users.get("zed") is None  # nothing changed


def test_the_list_shows_grants_logins_and_tokens_but_no_hash(env) -> None:
    h, client = env
    assert client.post("/api/login", json={"token": h.tokens["bob"]}).status_code == 200
    client.cookies.clear()
    r = client.get("/api/people/users", headers=h.auth("root"))
    assert r.status_code == 200, r.text
    doc = r.json()
    users = {u["id"]: u for u in doc["users"]}
    assert list(users) == ["alice", "bob", "carol", "root"] and doc["me"] == "root"
    assert users["alice"]["workspaces"] == ["demo", "sales"] and users["alice"]["permissions"] == ["code_execution"]
    assert users["carol"]["revoked"] and all(t["revoked"] for t in users["carol"]["tokens"])
    assert users["bob"]["last_login"] == pytest.approx(time.time(), abs=30) and users["alice"]["last_login"] is None
    assert set(users["bob"]["tokens"][0]) == {"id", "created", "revoked"}
    assert doc["permissions"] == ["code_execution", "memory", "admin"] and "sales" in doc["workspaces"]
    stored = [t.hash for u in h.rt.users.list() for t in u.tokens]
    assert not any(x in r.text for x in stored) and "hash" not in r.text


def test_add_returns_a_working_token_once_and_bad_input_names_the_field(env) -> None:
    h, client = env
    admin = h.auth("root")
    r = client.post("/api/people/users", json={"name": "dana", "workspaces": ["sales"], "permissions": ["memory"]},
                    headers=admin)
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    assert r.json()["user"]["workspaces"] == ["sales"] and token.startswith("ddt_dana.")
    me = client.get("/api/me", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200 and me.json()["workspaces"] == ["sales"]
    assert token not in client.get("/api/people/users", headers=admin).text  # shown once only
    for body, status, words, field in [
        ({"name": "dana", "workspaces": ["demo"]}, 400, "already exists", "name"),
        ({"name": "erin", "workspaces": ["demo"], "permissions": ["root"]}, 400, "unknown permission", "permissions"),
        ({"name": "erin", "workspaces": []}, 400, "at least one workspace", "workspaces"),
        ({"name": "../erin", "workspaces": ["demo"]}, 400, "invalid user name id", "name"),
        ({"name": "erin", "workspaces": ["../etc"]}, 400, "invalid workspace id", "workspaces"),
    ]:
        r = client.post("/api/people/users", json=body, headers=admin)
        assert r.status_code == status and words in r.json()["error"], (body, r.text)
        assert r.json()["extra"] == {"field": field}, r.text
    for body, words in [({"name": "erin"}, "workspaces"), ({"name": "erin", "workspaces": "demo"}, "workspaces"),
                        ({"name": "erin", "workspaces": ["demo"], "admin": True}, "admin")]:
        r = client.post("/api/people/users", json=body, headers=admin)
        assert r.status_code == 400 and words in r.json()["error"], (body, r.text)
    assert h.rt.users.get("erin") is None
    assert [e.target for e in admin_entries(h)] == ["dana"]
    assert admin_entries(h)[0].detail == "added dana: workspaces sales; permissions memory"


def test_edit_changes_what_the_user_can_reach(env) -> None:
    h, client = env
    admin = h.auth("root")
    r = client.patch("/api/people/users/bob", json={"workspaces": ["sales"], "permissions": ["memory"]}, headers=admin)
    assert r.status_code == 200 and r.json()["user"]["workspaces"] == ["sales"], r.text
    me = client.get("/api/me", headers=h.auth("bob")).json()
    assert me["workspaces"] == ["sales"] and me["permissions"] == ["memory"]
    assert client.patch("/api/people/users/bob", json={}, headers=admin).status_code == 400
    r = client.patch("/api/people/users/bob", json={"permissions": ["wizard"]}, headers=admin)
    assert r.status_code == 400 and r.json()["extra"] == {"field": "permissions"}
    r = client.patch("/api/people/users/nobody", json={"workspaces": ["demo"]}, headers=admin)
    assert r.status_code == 404 and "no user named 'nobody'" in r.json()["error"]
    assert client.patch("/api/people/users/..%2fx", json={"workspaces": ["demo"]}, headers=admin).status_code in (400, 404)
    [entry] = admin_entries(h, target="bob")
    assert entry.user == "root" and entry.detail == "changed bob: workspaces demo -> sales; permissions none -> memory"


def test_revoke_restore_and_tokens(env) -> None:
    h, client = env
    admin, bob = h.auth("root"), h.auth("bob")
    r = client.post("/api/people/users/bob/revoke", headers=admin)
    assert r.status_code == 200 and r.json()["user"]["revoked"], r.text
    assert client.get("/api/me", headers=bob).status_code == 401
    r = client.post("/api/people/users/bob/tokens", headers=admin)
    assert r.status_code == 409 and "restore them first" in r.json()["error"]
    assert client.post("/api/people/users/bob/login-link", headers=admin).status_code == 409
    r = client.post("/api/people/users/bob/restore", headers=admin)
    assert r.status_code == 200 and not r.json()["user"]["revoked"]
    assert client.get("/api/me", headers=bob).status_code == 401  # the old token stays revoked
    r = client.post("/api/people/users/bob/tokens", headers=admin)
    assert r.status_code == 201, r.text
    fresh = {"Authorization": f"Bearer {r.json()['token']}"}
    assert client.get("/api/me", headers=fresh).json()["id"] == "bob"
    second = client.post("/api/people/users/bob/tokens", headers=admin).json()
    tid = second["user"]["tokens"][-1]["id"]
    r = client.delete(f"/api/people/users/bob/tokens/{tid}", headers=admin)
    assert r.status_code == 200 and r.json()["user"]["tokens"][-1]["revoked"]
    assert client.get("/api/me", headers={"Authorization": f"Bearer {second['token']}"}).status_code == 401
    assert client.get("/api/me", headers=fresh).status_code == 200  # the other token still works
    r = client.delete("/api/people/users/bob/tokens/k_nope", headers=admin)
    assert r.status_code == 404 and "has no token" in r.json()["error"]
    details = [e.detail for e in admin_entries(h, target="bob")]
    assert details[:3] == ["revoked bob: all tokens and sessions stopped working",
                           "restored bob (old tokens stay revoked)", details[2]]
    assert details[2].startswith("new token id k") and details[-1] == f"revoked token id {tid} of bob"
    assert len(details) == 5


def test_a_login_link_signs_the_user_in_once(env) -> None:
    h, client = env
    r = client.post("/api/people/users/bob/login-link", headers=h.auth("root"))
    assert r.status_code == 201, r.text
    url = r.json()["url"]
    assert re.search(r"/login\?code=bob\.", url) and r.json()["expires_in_s"] == h.rt.settings.auth.login_code_ttl_s
    code = url.split("code=", 1)[1]
    assert h.rt.users.redeem_login_code(code).id == "bob"
    assert admin_entries(h, target="bob")[0].detail == "login link for bob"


def test_delete_needs_confirming_like_the_cli(env) -> None:
    h, client = env
    admin = h.auth("root")
    r = client.delete("/api/people/users/bob", headers=admin)
    assert r.status_code == 400 and r.json()["error"] == (
        "this deletes user bob and ALL their threads, artifacts and memory; repeat with yes=true")
    assert h.rt.users.get("bob") is not None
    r = client.delete("/api/people/users/bob?yes=true", headers=admin)
    assert r.status_code == 200 and r.json()["deleted"] == "bob", r.text
    assert h.rt.users.get("bob") is None and client.get("/api/me", headers=h.auth("bob")).status_code == 401
    r = client.delete("/api/people/users/alice?yse=true", headers=admin)
    assert r.status_code == 400 and "unknown query parameter 'yse'" in r.json()["error"]
    assert client.delete("/api/people/users/bob?yes=true", headers=admin).status_code == 404
    assert admin_entries(h, target="bob")[0].detail.startswith("deleted bob: ")


def test_the_only_admin_cannot_revoke_demote_or_delete_themselves(env) -> None:
    h, client = env
    admin = h.auth("root")
    for method, path, body in [("POST", "/api/people/users/root/revoke", None),
                               ("PATCH", "/api/people/users/root", {"permissions": ["memory"]}),
                               ("DELETE", "/api/people/users/root?yes=true", None)]:
        r = call(client, method, path, body, admin)
        assert r.status_code == 409 and "you are the only active admin" in r.json()["error"], (path, r.text)
    assert h.rt.users.get("root").can("admin") and not h.rt.users.get("root").revoked
    ok = client.patch("/api/people/users/root", json={"workspaces": ["demo", "sales"]}, headers=admin)
    assert ok.status_code == 200  # other edits of oneself are fine
    client.patch("/api/people/users/alice", json={"permissions": ["admin"]}, headers=admin)
    r = client.patch("/api/people/users/root", json={"permissions": []}, headers=admin)
    assert r.status_code == 200 and r.json()["user"]["permissions"] == []  # alice is an admin now
    assert client.get("/api/people/users", headers=admin).status_code == 403


def test_invitations_are_made_listed_and_revoked(env) -> None:
    h, client = env
    admin = h.auth("root")
    r = client.post("/api/people/invitations", json={"workspaces": ["sales"], "permissions": ["memory"]}, headers=admin)
    assert r.status_code == 201, r.text
    inv, url = r.json()["invitation"], r.json()["url"]
    assert re.fullmatch(r"http://testserver\.local/join\?code=ddi_[A-Za-z0-9_-]+", url), url
    assert inv["state"] == "open" and inv["created_by"] == "root" and inv["name"] is None
    assert inv["expires"] - inv["created"] == pytest.approx(h.rt.settings.auth.invitation_ttl_s, abs=2)
    fixed = client.post("/api/people/invitations", json={"workspaces": ["demo"], "name": "omar"}, headers=admin).json()
    listed = client.get("/api/people/invitations", headers=admin).json()
    assert [i["id"] for i in listed["invitations"]] == [fixed["invitation"]["id"], inv["id"]]
    assert listed["ttl_s"] == h.rt.settings.auth.invitation_ttl_s
    code = url.split("code=", 1)[1]
    assert code not in client.get("/api/people/invitations", headers=admin).text  # shown once
    r = client.delete(f"/api/people/invitations/{inv['id']}", headers=admin)
    assert r.status_code == 200 and r.json()["invitation"]["state"] == "revoked"
    assert client.delete("/api/people/invitations/inv_nope", headers=admin).status_code == 404
    for body, field in [({"workspaces": []}, "workspaces"), ({"workspaces": ["demo"], "permissions": ["x"]}, "permissions"),
                        ({"workspaces": ["demo"], "name": "bob"}, "name")]:
        r = client.post("/api/people/invitations", json=body, headers=admin)
        assert r.status_code == 400 and r.json()["extra"] == {"field": field}, (body, r.text)
    details = [(e.target, e.detail) for e in admin_entries(h)]
    assert details[0] == (inv["id"], "invited a new user: workspaces sales; permissions memory; for 168 h")
    assert details[1][1].startswith("invited omar: ") and details[2] == (inv["id"], f"revoked invitation {inv['id']}")
    assert len(details) == 3


def test_browser_changes_need_the_csrf_token(env) -> None:
    h, client = env
    r = client.post("/api/login", json={"token": h.tokens["root"]})
    csrf = r.json()["csrf"]
    body = {"name": "pia", "workspaces": ["demo"]}
    r = client.post("/api/people/users", json=body)
    assert r.status_code == 403 and "missing CSRF token" in r.json()["error"]
    r = client.post("/api/people/users", json=body, headers={"X-CSRF-Token": "0" * 40})
    assert r.status_code == 403 and "invalid CSRF token" in r.json()["error"]
    assert client.delete("/api/people/users/bob?yes=true").status_code == 403
    assert client.post("/api/people/invitations", json={"workspaces": ["demo"]}).status_code == 403
    assert h.rt.users.get("pia") is None and h.rt.users.get("bob") is not None and h.rt.users.invitations() == []
    assert client.post("/api/people/users", json=body, headers={"X-CSRF-Token": csrf}).status_code == 201
    assert client.get("/api/people/users").status_code == 200  # reads need no token


# -- joining ---------------------------------------------------------------------------------------
def invite(h, **kw) -> str:
    code, _ = h.rt.users.new_invitation(kw.pop("workspaces", ["sales"]), kw.pop("permissions", []),
                                        kw.pop("ttl_s", 600), "root", **kw)
    return code


def open_form(client, code: str) -> str:
    r = client.get("/join", params={"code": code})
    assert r.status_code == 200, r.text
    return re.search(r'name="confirm" value="([0-9a-f]+)"', r.text).group(1)


def test_joining_creates_the_user_and_signs_them_in(env) -> None:
    h, client = env
    code = invite(h, workspaces=["sales", "demo"], permissions=["memory"])
    r = client.get("/join", params={"code": code})
    assert r.status_code == 200 and 'id="join-name"' in r.text and "sales, demo" in r.text
    assert h.rt.users.peek_invitation(code).state(time.time()) == "open"  # opening it used nothing
    confirm = open_form(client, code)
    r = client.post("/join", data={"code": code, "confirm": confirm, "name": "quinn"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    me = client.get("/api/me")
    assert me.status_code == 200 and me.json()["id"] == "quinn" and me.json()["workspaces"] == ["sales", "demo"]
    assert h.rt.users.last_login("quinn") is not None
    [entry] = [e for e in h.rt.audit.entries(AuditFilter(action="sign_in")) if e.user == "quinn"]
    assert entry.detail == "joined with an invitation" and entry.target == h.rt.users.invitations()[0].id
    r = client.get("/join", params={"code": code})
    assert r.status_code == 409 and "signed in as <strong>quinn" in r.text  # never switched
    client.cookies.clear()
    r = client.get("/join", params={"code": code})
    assert r.status_code == 410 and "already been used" in r.text


def test_a_join_form_from_elsewhere_is_refused(env) -> None:
    h, client = env
    code = invite(h)
    r = client.post("/join", data={"code": code, "confirm": "0" * 64, "name": "rex"})
    assert r.status_code == 403 and "not confirmed" in r.text
    confirm = open_form(client, code)
    r = client.post("/join", data={"code": code, "confirm": confirm, "name": "rex"},
                    headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    other = TestClient(client.app)  # another browser: no nonce cookie of this page
    with other:
        assert other.post("/join", data={"code": code, "confirm": confirm, "name": "rex"}).status_code == 403
    assert h.rt.users.get("rex") is None and h.rt.users.peek_invitation(code).used_by is None


def test_names_fixed_taken_or_malformed(env) -> None:
    h, client = env
    code = invite(h)
    confirm = open_form(client, code)
    for name, words in (("bob", "is taken"), ("../x", "invalid user name"), ("", "choose a user name")):
        r = client.post("/join", data={"code": code, "confirm": confirm, "name": name}, follow_redirects=False)
        assert r.status_code == 400 and 'id="join-error"' in r.text and words in r.text, (name, r.text)
    assert h.rt.users.peek_invitation(code).used_by is None and h.rt.users.get("bob").workspaces == ["demo"]
    fixed = invite(h, name="sue")
    page = client.get("/join", params={"code": fixed})
    assert 'id="join-name"' not in page.text and "Join as <strong>sue</strong>" in page.text
    confirm = re.search(r'name="confirm" value="([0-9a-f]+)"', page.text).group(1)
    r = client.post("/join", data={"code": fixed, "confirm": confirm}, follow_redirects=False)
    assert r.status_code == 303 and client.get("/api/me").json()["id"] == "sue"


def test_expired_revoked_and_unknown_invitations_say_so(env) -> None:
    h, client = env
    expired = invite(h, ttl_s=0.01)
    revoked = invite(h)
    h.rt.users.revoke_invitation(h.rt.users.peek_invitation(revoked).id)
    time.sleep(0.05)
    r = client.get("/join", params={"code": expired})
    assert r.status_code == 410 and "has expired" in r.text
    r = client.get("/join", params={"code": revoked})
    assert r.status_code == 410 and "was revoked" in r.text
    r = client.get("/join", params={"code": "ddi_guess"})
    assert r.status_code == 401 and "not valid" in r.text
    failed = reversed(list(h.rt.audit.entries(AuditFilter(action="sign_in_failed"))))
    assert [e.detail for e in failed] == ["invitation: this invitation has expired; ask an admin for a new one",
                                          "invitation: this invitation was revoked by an admin",
                                          "invitation: this invitation link is not valid (mistyped or cut short?)"]


def test_guessing_invitation_codes_is_rate_limited_like_logins(env) -> None:
    h, client = env
    good = invite(h)
    statuses = [client.get("/join", params={"code": f"ddi_guess{i}"}).status_code for i in range(5)]
    assert statuses == [401, 401, 401, 401, 429], statuses  # auth.login_attempts_per_minute = 4
    r = client.get("/join", params={"code": good})
    assert r.status_code == 429 and "too many failed login attempts" in r.json()["error"]
    assert client.post("/join", data={"code": good, "confirm": "x", "name": "tom"}).status_code == 429
