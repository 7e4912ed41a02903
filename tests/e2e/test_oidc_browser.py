"""Single sign-on in a real browser (Playwright + Debian's Chromium) against a real OpenID
provider (tests/oidckit.py): the login page's SSO button, the provider's form, the app with the
workspace of the user's group; logout through the provider and back; the code-login switch."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest

from datadesk.llm.scripted import ScriptedModel
from tests.conftest import make_harness, serve_app
from tests.e2e.conftest import open_page, shot
from tests.oidckit import OIDCProvider, oidc_provider  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.oidc]

GROUPS = {"analysts": {"workspaces": ["demo"]}, "sales-team": {"workspaces": ["sales"], "can_execute_code": True}}


@pytest.fixture(scope="module")
def provider(oidc_provider: OIDCProvider) -> OIDCProvider:
    oidc_provider.account("erik", groups=["sales-team"], password="erik-pw")
    oidc_provider.account("dana", groups=["analysts"], password="dana-pw")
    return oidc_provider


@contextlib.contextmanager
def sso_server(home, provider: OIDCProvider, **auth: Any) -> Iterator[str]:
    oidc = provider.settings(groups=GROUPS, button_label="Sign in with Acme SSO")
    h = make_harness(home, ScriptedModel(then="ok"), auth={"oidc": oidc, **auth})
    with serve_app(h.app()) as base:
        provider.register(base)
        yield base


@pytest.fixture
def page(browser):
    # only this machine's servers: nothing a page refers to elsewhere is fetched
    local_only = lambda ctx: ctx.route("**/*", lambda route: route.continue_()  # noqa: E731
                                       if urlsplit(route.request.url).hostname == "127.0.0.1" else route.abort())
    with open_page(browser, local_only) as pg:
        yield pg


def test_sign_in_with_the_sso_button_lands_in_the_groups_workspace_and_logout_signs_out_at_the_provider(
        home, provider: OIDCProvider, page) -> None:
    with sso_server(home, provider) as base:
        page.goto(base + "/")
        button = page.wait_for_selector("#sso-button")
        assert button.inner_text() == "Sign in with Acme SSO"
        assert page.is_visible("#login-secret"), "code login stays beside the SSO button by default"
        shot(page, "oidc-login-page")
        button.click()
        page.wait_for_selector("#op-login")  # the provider's own sign-in form
        assert page.url.startswith(provider.issuer + "/interaction/")
        page.fill("#op-login", "erik")
        page.fill("#op-password", "erik-pw")
        page.click("#op-submit")
        page.wait_for_selector("#app-view:not([hidden])")
        assert page.url.startswith(base + "/"), page.url
        assert page.inner_text("#user-name") == "erik"
        me = page.evaluate("window.datadesk.me")
        assert (me["workspaces"], me["permissions"]) == (["sales"], ["code_execution"])
        shot(page, "oidc-signed-in")
        page.click("#logout")
        page.wait_for_selector("#op-logout")  # the provider asks to confirm its own logout
        assert page.url.startswith(provider.issuer + "/session/end")
        page.click("#op-logout")
        page.wait_for_url(base + "/auth/oidc/logged-out")
        assert "You are signed out" in page.inner_text("h1")
        page.click("#login-again")
        page.wait_for_selector("#login-view:not([hidden])")
        status = page.evaluate("fetch('/api/me').then(r => r.status)")
        assert status == 401, "DataDesk's session is over"
        page.click("#sso-button")  # and the provider's: its form again, no silent sign-in
        page.wait_for_selector("#op-login")
        assert page.js_errors == []  # type: ignore[attr-defined]


def test_with_code_login_off_the_login_card_offers_only_sso(home, provider: OIDCProvider, page) -> None:
    with sso_server(home, provider, code_login=False) as base:
        page.goto(base + "/")
        page.wait_for_selector("#sso-button")
        page.wait_for_selector("#code-login-off")
        assert not page.is_visible("#login-secret") and not page.is_visible("#login-form button[type=submit]")
        shot(page, "oidc-login-sso-only")
        page.click("#sso-button")
        page.fill("#op-login", "dana")
        page.fill("#op-password", "dana-pw")
        page.click("#op-submit")
        page.wait_for_selector("#app-view:not([hidden])")
        assert page.evaluate("window.datadesk.me.workspaces") == ["demo"]
        assert page.js_errors == []  # type: ignore[attr-defined]
