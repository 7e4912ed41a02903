"""Single sign-on against a real OpenID provider (node-oidc-provider, tests/oidckit.py): the
whole code flow over real sockets, group grants recomputed at each sign-in, the refusals
(each with a page that says why), logout at the provider, key rotation; and the ID token and
return-address checks called directly with tokens crafted with the provider's own keys."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass
from html import unescape
from typing import Any, Iterator
from urllib.parse import urljoin

import httpx
import pytest
from litestar import Litestar

from datadesk.api.sso.errors import FlowRejected, ProviderRefused, TokenRejected
from datadesk.api.sso.flow import FLOW_COOKIE, Flow, safe_next
from datadesk.api.sso.oidc import OIDCClient
from datadesk.audit import AuditFilter
from datadesk.llm.scripted import ScriptedModel
from datadesk.settings import OIDCSettings
from tests.conftest import Harness, free_port, make_harness, serve_app
from tests.oidckit import CLIENT_ID, CLIENT_SECRET, Browser, OIDCProvider, new_key, oidc_provider, query_of  # noqa: F401

pytestmark = pytest.mark.oidc

GROUPS = {"analysts": {"workspaces": ["demo"]},
          "sales-team": {"workspaces": ["sales"], "can_execute_code": True},
          "admins": {"workspaces": ["demo"], "admin": True, "memory": True}}


@pytest.fixture(scope="module")
def provider(oidc_provider: OIDCProvider) -> OIDCProvider:
    p = oidc_provider
    p.account("dana", groups=["analysts"])
    p.account("erik", groups=["sales-team"])
    p.account("fay", groups=["marketing", "everyone"])
    p.account("gus", groups=["analysts"], preferred_username="gus@example.com")
    p.account("hal", groups=["analysts"])
    p.account("hal-twin", groups=["analysts"], preferred_username="hal")  # another subject, the same name
    p.account("ivy", groups=["analysts", "admins"])
    p.account("bob", groups=["sales-team"])  # make_harness pre-creates bob (demo): never bound to SSO
    p.account("jon", groups=["analysts"])
    p.account("kim", groups=["sales-team"])
    return p


@dataclass
class SSO:
    h: Harness
    app: Litestar
    base: str
    browser: Browser
    provider: OIDCProvider

    @property
    def client(self) -> OIDCClient:
        return self.app.state["oidc_client"]

    def me(self) -> httpx.Response:
        return self.browser.http.get(f"{self.base}/api/me")

    def audit(self, action: str, user: str | None = None) -> list[Any]:
        return list(self.h.rt.audit.entries(AuditFilter(action=action, user=user)))


@contextlib.contextmanager
def sso_app(home, provider: OIDCProvider, **auth: Any) -> Iterator[SSO]:
    oidc = provider.settings(groups=GROUPS, **auth.pop("oidc", {}))
    h = make_harness(home, ScriptedModel(then="ok"), auth={"oidc": oidc, **auth})
    app = h.app()
    with serve_app(app) as base:
        provider.register(base)
        browser = Browser(base, provider)
        try:
            yield SSO(h, app, base, browser, provider)
        finally:
            browser.close()


@pytest.fixture
def sso(home, provider: OIDCProvider) -> Iterator[SSO]:
    with sso_app(home, provider) as s:
        yield s


def page_text(r: httpx.Response) -> str:
    return unescape(re.sub(r"<[^>]+>", " ", r.text))


# -- sign-in and grants --------------------------------------------------------------------
def test_sign_in_end_to_end_creates_the_user_with_its_groups_workspace(sso: SSO) -> None:
    r = sso.browser.sign_in("dana", next_path="/?from=sso")
    assert r.status_code == 303 and r.headers["location"] == "/?from=sso", r.text[:500]
    cookie = r.headers.get_list("set-cookie")
    session = next(c for c in cookie if c.startswith("datadesk_session="))
    assert "HttpOnly" in session and "samesite=strict" in session.lower()
    assert f"Max-Age={sso.h.rt.settings.auth.session_max_age_s}" in session, session
    me = sso.me()
    assert me.status_code == 200, me.text
    assert (me.json()["id"], me.json()["workspaces"], me.json()["permissions"]) == ("dana", ["demo"], [])
    user = sso.h.rt.users.get("dana")
    assert (user.sso_issuer, user.sso_subject) == (sso.provider.issuer, "dana")
    assert not user.tokens, "an SSO user gets no API token"
    [entry] = sso.audit("sign_in", "dana")
    assert entry.detail == "sso" and entry.outcome == "ok" and entry.client == "127.0.0.1"
    # the flow cookie is spent: the same callback again is not a sign-in
    assert not [c for c in sso.browser.http.cookies.jar if c.name == FLOW_COOKIE]


def test_a_user_in_group_a_gets_workspace_a_only(sso: SSO) -> None:
    assert sso.browser.sign_in("erik").status_code == 303
    me = sso.me().json()
    assert (me["workspaces"], me["permissions"]) == (["sales"], ["code_execution"])
    http, csrf = sso.browser.http, sso.browser.csrf()
    ok = http.post(f"{sso.base}/api/threads", json={"workspace": "sales"}, headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 201, ok.text
    other = http.post(f"{sso.base}/api/threads", json={"workspace": "demo"}, headers={"X-CSRF-Token": csrf})
    assert other.status_code == 404, f"erik is not in a group granting demo: {other.status_code} {other.text}"


def test_groups_are_recomputed_at_each_sign_in(sso: SSO) -> None:
    sso.provider.set_groups("jon", ["analysts", "sales-team"])
    assert sso.browser.sign_in("jon").status_code == 303
    assert sso.me().json()["workspaces"] == ["demo", "sales"]
    sso.provider.set_groups("jon", ["analysts"])  # removed from sales-team at the provider
    assert sso.browser.sign_in("jon").status_code == 303
    me = sso.me().json()
    assert (me["workspaces"], me["permissions"]) == (["demo"], []), me
    assert sso.h.rt.users.get("jon").workspaces == ["demo"]


def test_a_pre_created_user_is_bound_and_takes_its_groups_grants(sso: SSO) -> None:
    assert sso.h.rt.users.get("bob").sso_subject is None
    assert sso.browser.sign_in("bob").status_code == 303
    bob = sso.h.rt.users.get("bob")
    assert (bob.workspaces, bob.sso_subject) == (["sales"], "bob")


def test_grants_come_from_userinfo_when_the_id_token_leaves_them_out(home, provider: OIDCProvider) -> None:
    provider.claims_in_id_token = False
    try:
        with sso_app(home, provider) as s:
            assert s.browser.sign_in("kim").status_code == 303
            assert s.me().json()["workspaces"] == ["sales"]
    finally:
        provider.claims_in_id_token = True
        provider.reload()


# -- people who may not come in ----------------------------------------------------------------
def test_a_user_in_no_mapped_group_gets_a_page_that_says_so(sso: SSO) -> None:
    r = sso.browser.sign_in("fay")
    text = page_text(r)
    assert r.status_code == 403, text
    assert "You cannot sign in to DataDesk" in text and "'marketing'" in text and "Ask your DataDesk admin" in text
    assert sso.me().status_code == 401, "no session for someone in no mapped group"
    assert sso.h.rt.users.get("fay") is None
    [entry] = sso.audit("sign_in_failed", "fay")
    assert (entry.outcome, entry.detail) == ("refused", "sso: not in a mapped group")


def test_a_revoked_user_is_refused(sso: SSO) -> None:
    assert sso.browser.sign_in("ivy").status_code == 303
    sso.h.rt.users.revoke("ivy")
    r = sso.browser.sign_in("ivy")
    assert r.status_code == 403 and "revoked" in page_text(r), page_text(r)
    assert sso.me().status_code == 401
    assert sso.h.rt.users.get("ivy").revoked


def test_a_user_name_claim_that_is_no_datadesk_name_is_refused_by_name(sso: SSO) -> None:
    r = sso.browser.sign_in("gus")
    text = page_text(r)
    assert r.status_code == 403 and "'preferred_username'" in text and "gus@example.com" in text, text
    assert "auth.oidc.username_claim" in text


def test_a_name_bound_to_another_provider_account_is_not_taken_over(sso: SSO) -> None:
    assert sso.browser.sign_in("hal").status_code == 303
    other = Browser(sso.base, sso.provider)
    try:
        r = other.sign_in("hal-twin")  # same preferred_username, another subject
        assert r.status_code == 403 and "another single sign-on account" in page_text(r), page_text(r)
    finally:
        other.close()
    assert sso.h.rt.users.get("hal").sso_subject == "hal"


# -- the flow's own checks ----------------------------------------------------------------------
def test_a_wrong_state_is_refused(sso: SSO) -> None:
    url = sso.browser.callback_url("dana")
    forged = re.sub(r"state=[^&]+", "state=forged-state", url)
    r = sso.browser.http.get(forged)
    assert r.status_code == 400 and "wrong state" in page_text(r), page_text(r)
    assert sso.me().status_code == 401


def test_a_callback_without_this_browsers_flow_is_refused(sso: SSO) -> None:
    url = sso.browser.callback_url("dana")
    stranger = httpx.Client(timeout=30)  # another browser: the code and state, not the cookie
    try:
        r = stranger.get(url)
    finally:
        stranger.close()
    assert r.status_code == 400 and "no sign-in in progress" in page_text(r), page_text(r)


def test_a_replayed_callback_is_refused(sso: SSO) -> None:
    url = sso.browser.callback_url("dana")
    flow = sso.browser.http.cookies.get(FLOW_COOKIE, path="/auth/oidc/")
    assert sso.browser.http.get(url).status_code == 303
    sso.browser.http.cookies.set(FLOW_COOKIE, flow, domain="127.0.0.1", path="/auth/oidc/")
    r = sso.browser.http.get(url)  # the same code, state and flow cookie again
    assert r.status_code in (401, 400) and "refused" in page_text(r), page_text(r)


def test_a_missing_pkce_verifier_is_refused(sso: SSO) -> None:
    code = query_of(sso.browser.callback_url("dana"))["code"]
    client = OIDCClient(sso.h.rt.settings.auth.oidc)
    with pytest.raises(FlowRejected, match="no PKCE verifier"):  # DataDesk never sends a code without one
        asyncio.run(client.exchange(code, f"{sso.base}/auth/oidc/callback", verifier=None))
    # and the provider, given the code without the verifier, does not hand out tokens
    r = httpx.post(f"{sso.provider.issuer}/token", auth=(CLIENT_ID, CLIENT_SECRET),
                   data={"grant_type": "authorization_code", "code": code,
                         "redirect_uri": f"{sso.base}/auth/oidc/callback"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant" and "id_token" not in r.json(), r.text


def test_a_wrong_pkce_verifier_is_refused_by_the_provider_with_a_clear_message(sso: SSO) -> None:
    code = query_of(sso.browser.callback_url("dana"))["code"]
    client = OIDCClient(sso.h.rt.settings.auth.oidc)
    with pytest.raises(ProviderRefused) as err:
        asyncio.run(client.exchange(code, f"{sso.base}/auth/oidc/callback", verifier=Flow.new().verifier))
    assert "refused the sign-in code: invalid_grant" in err.value.message and "PKCE" in err.value.message


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "/\\evil.example",
                                    "\\\\evil.example", "/\t/evil.example", "javascript:alert(1)",
                                    "http:/evil.example", "evil.example"])
def test_an_external_return_url_is_refused(sso: SSO, target: str) -> None:
    r = sso.browser.http.get(f"{sso.base}/auth/oidc/login", params={"next": target})
    assert r.status_code == 400 and "is not a page of this app" in page_text(r), (target, page_text(r))
    assert "location" not in r.headers
    with pytest.raises(FlowRejected):
        safe_next(target)


@pytest.mark.parametrize("target", ["/", "/?t=abc", "/static/app.css", "/path:with-colon#frag"])
def test_a_path_of_this_app_is_a_return_url(target: str) -> None:
    assert safe_next(target) == target


# -- ID tokens crafted with the provider's own keys (the provider would never issue these) ----
def _claims(provider: OIDCProvider, expected_nonce: str, **over: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": provider.issuer, "aud": CLIENT_ID, "sub": "dana", "iat": now, "exp": now + 300,
            "nonce": expected_nonce, "preferred_username": "dana", **over}


def _verify(provider: OIDCProvider, token: str, nonce: str, client: OIDCClient | None = None) -> dict[str, Any]:
    client = client or OIDCClient(OIDCSettings(issuer=provider.issuer, client_id=CLIENT_ID))
    return asyncio.run(client.verify(token, nonce))


def test_a_token_signed_with_the_providers_key_passes(provider: OIDCProvider) -> None:
    claims = _verify(provider, provider.sign(_claims(provider, "n-ok")), "n-ok")
    assert claims["sub"] == "dana"


@pytest.mark.parametrize("case, over, words", [
    ("expired", {"exp": int(time.time()) - 600, "iat": int(time.time()) - 900}, "expired"),
    ("wrong audience", {"aud": "another-app"}, "meant for another application"),
    ("wrong issuer", {"iss": "http://127.0.0.1:1"}, "not by the configured provider"),
    ("several audiences, no azp", {"aud": [CLIENT_ID, "another-app"]}, "issued to another party"),
    ("azp of another client", {"azp": "another-app"}, "issued to another party"),
    ("issued in the future", {"iat": int(time.time()) + 3600}, "issued in the future"),
    ("no issue time", {"iat": None}, "no issue time"),
    ("wrong nonce", {"nonce": "someone-elses"}, "wrong nonce"),
])
def test_a_bad_id_token_is_refused_with_a_clear_message(provider: OIDCProvider, case: str,
                                                        over: dict[str, Any], words: str) -> None:
    claims = {k: v for k, v in _claims(provider, "n-" + case, **over).items() if v is not None}
    with pytest.raises(TokenRejected) as err:
        _verify(provider, provider.sign(claims), "n-" + case)
    assert words in err.value.message, (case, err.value.message)


def test_a_forged_id_token_is_refused(provider: OIDCProvider) -> None:
    forged = provider.sign(_claims(provider, "n-forged"), key=new_key(), kid=provider.keys[0]["kid"])
    with pytest.raises(TokenRejected, match="forged or was altered"):
        _verify(provider, forged, "n-forged")
    payload = provider.sign(_claims(provider, "n-altered"))
    head, body, sig = payload.split(".")
    other = provider.sign(_claims(provider, "n-altered", sub="erik")).split(".")[1]
    with pytest.raises(TokenRejected, match="forged or was altered"):
        _verify(provider, f"{head}.{other}.{sig}", "n-altered")


def test_a_token_naming_no_key_is_checked_against_the_providers_keys(provider: OIDCProvider) -> None:
    from joserfc import jwt
    from joserfc.jwk import RSAKey

    def no_kid(key: dict[str, Any], nonce: str) -> str:
        return jwt.encode({"alg": "RS256"}, _claims(provider, nonce), RSAKey.import_key(key))

    assert _verify(provider, no_kid(provider.keys[0], "n-nokid"), "n-nokid")["sub"] == "dana"
    with pytest.raises(TokenRejected, match="forged or was altered"):
        _verify(provider, no_kid(new_key(), "n-nokid-forged"), "n-nokid-forged")


def test_an_unsigned_id_token_is_refused(provider: OIDCProvider) -> None:
    import base64
    import json

    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")  # noqa: E731
    token = f"{enc({'alg': 'none', 'typ': 'JWT'})}.{enc(_claims(provider, 'n-none'))}."
    with pytest.raises(TokenRejected, match="'none'"):
        _verify(provider, token, "n-none")


def test_a_replayed_id_token_is_refused(provider: OIDCProvider) -> None:
    client = OIDCClient(OIDCSettings(issuer=provider.issuer, client_id=CLIENT_ID))
    token = provider.sign(_claims(provider, "n-replay"))
    assert _verify(provider, token, "n-replay", client)["sub"] == "dana"
    with pytest.raises(TokenRejected, match="already used once"):
        _verify(provider, token, "n-replay", client)


def test_a_rotated_key_is_fetched_once_and_unknown_keys_are_rate_limited(sso: SSO) -> None:
    assert sso.browser.sign_in("dana").status_code == 303
    client = sso.client
    assert client.jwks_fetches == 1
    new_kid = sso.provider.rotate_keys()
    client.jwks_refetch_s = 0  # the rotation comes right after the last fetch in this test
    assert sso.browser.sign_in("dana").status_code == 303, "the new key was not picked up"
    assert client.jwks_fetches == 2 and any(k.kid == new_kid for k in client._keys[1])
    client.jwks_refetch_s = 3600  # now a burst of tokens naming invented keys fetches nothing
    for i in range(5):
        token = sso.provider.sign(_claims(sso.provider, f"n-kid-{i}"), key=new_key())
        with pytest.raises(TokenRejected, match="does not publish"):
            asyncio.run(client.verify(token, f"n-kid-{i}"))
    assert client.jwks_fetches == 2


# -- sessions and logout -------------------------------------------------------------------
def test_logout_ends_the_session_and_the_providers(sso: SSO) -> None:
    b = sso.browser
    assert b.sign_in("dana").status_code == 303
    again = b.start()  # the provider's session signs the browser in without its form
    assert again.status_code == 303 and "/auth/oidc/callback" in again.headers["location"], again.text[:300]
    assert b.http.get(urljoin(sso.base, again.headers["location"])).status_code == 303
    r = b.http.post(f"{sso.base}/auth/oidc/logout", headers={"X-CSRF-Token": b.csrf()})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["logged_out"] is True and out["redirect"].startswith(f"{sso.provider.issuer}/session/end?")
    params = query_of(out["redirect"])
    assert params["post_logout_redirect_uri"] == f"{sso.base}/auth/oidc/logged-out"
    assert params["id_token_hint"].count(".") == 2 and params["client_id"] == CLIENT_ID
    assert sso.me().status_code == 401, "DataDesk's session is revoked"
    assert sso.audit("sign_out", "dana")[0].detail == "sso"
    confirm = b.http.get(out["redirect"])
    assert confirm.status_code == 200 and 'id="op.logoutForm"' in confirm.text, confirm.text[:500]
    action = unescape(re.search(r'<form id="op.logoutForm" method="post" action="([^"]+)"', confirm.text).group(1))
    xsrf = re.search(r'name="xsrf" value="([^"]+)"', confirm.text).group(1)
    back = b.follow(b.http.post(urljoin(out["redirect"], action), data={"xsrf": xsrf, "logout": "yes"}))
    assert str(back.url) == f"{sso.base}/auth/oidc/logged-out" and "You are signed out" in back.text
    assert any(line.startswith("GET /session/end?") for line in sso.provider.requests())
    form = b.start()  # the provider's session is over too: its form again
    assert form.status_code == 200 and "op-login" in form.text, form.text[:300]


def test_logout_of_a_code_login_session_does_not_send_the_browser_to_the_provider(sso: SSO) -> None:
    http = sso.browser.http
    assert http.post(f"{sso.base}/api/login", json={"token": sso.h.tokens["alice"]}).status_code == 200
    r = http.post(f"{sso.base}/auth/oidc/logout", headers={"X-CSRF-Token": sso.browser.csrf()})
    assert r.status_code == 200 and r.json() == {"logged_out": True, "redirect": None}, r.text
    assert sso.me().status_code == 401


def test_logout_needs_the_csrf_token(sso: SSO) -> None:
    assert sso.browser.sign_in("dana").status_code == 303
    r = sso.browser.http.post(f"{sso.base}/auth/oidc/logout")
    assert r.status_code == 403 and "CSRF" in r.text
    assert sso.me().status_code == 200


def test_an_sso_session_ends_at_its_max_age(home, provider: OIDCProvider) -> None:
    with sso_app(home, provider, session_max_age_s=1) as s:
        assert s.browser.sign_in("dana").status_code == 303
        assert s.me().status_code == 200
        sid = s.browser.http.cookies.get("datadesk_session")
        time.sleep(2.2)  # the browser drops the cookie (Max-Age=1); the server must refuse it too
        r = httpx.get(f"{s.base}/api/me", headers={"Cookie": f"datadesk_session={sid}"})
        assert r.status_code == 401 and "log in again" in r.text, r.text


def test_the_login_page_offers_sso_and_can_switch_code_login_off(home, provider: OIDCProvider) -> None:
    with sso_app(home, provider, code_login=False, oidc={"button_label": "Sign in with Acme"}) as s:
        opts = httpx.get(f"{s.base}/api/auth/options").json()
        assert opts == {"sso": True, "label": "Sign in with Acme", "login_url": "/auth/oidc/login",
                        "code_login": False}
        r = httpx.post(f"{s.base}/api/login", json={"token": s.h.tokens["alice"]})
        assert r.status_code == 403 and "auth.code_login = false" in r.text, r.text
        link = httpx.get(f"{s.base}/login", params={"code": s.h.rt.users.new_login_code("alice", 600)})
        assert link.status_code == 403 and "turned off" in page_text(link)
        api = httpx.get(f"{s.base}/api/me", headers=s.h.auth("alice"))
        assert api.status_code == 200, "Bearer API tokens keep working"
        assert s.browser.sign_in("dana").status_code == 303


# -- without a reachable provider -------------------------------------------------------------
def test_an_unreachable_provider_gives_a_page_naming_it(home) -> None:
    issuer = f"http://127.0.0.1:{free_port()}"
    h = make_harness(home, ScriptedModel(then="ok"), auth={"oidc": {"issuer": issuer, "client_id": "x"}})
    from litestar.testing import TestClient

    with TestClient(h.app()) as c:
        r = c.get("/auth/oidc/login", follow_redirects=False)
    assert r.status_code == 502, r.text
    assert "cannot be reached" in r.text and issuer in r.text


def test_sso_is_off_without_an_issuer(api) -> None:
    assert api.client.get("/api/auth/options").json()["sso"] is False
    r = api.client.get("/auth/oidc/login", follow_redirects=False)
    assert r.status_code == 404 and "not configured" in r.text
