"""People in a real browser (Playwright + Debian's Chromium) against the real server: an admin
invites a user from the People view, the user joins with the link in a browser of their own,
the admin revokes them, and the user's next request is refused. No console errors on the way."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import login, shot

pytestmark = pytest.mark.browser


def watched_page(browser):
    """A page in a new browser context (its own cookies) and the list its console errors,
    uncaught exceptions and failed responses go to."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []

    def console(msg) -> None:
        where = msg.location.get("url", "")
        # the CLI login link's confirm page (session.py) names no icon: Chromium's own /favicon.ico
        # request there is not this view's (see the report of issue 30)
        if msg.type == "error" and not (where.endswith("/favicon.ico") and "/login?" in page.url):
            errors.append(f"console: {msg.text} ({where} on {page.url})")

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("response", lambda r: errors.append(f"response {r.status}: {r.url}") if r.status >= 400 else None)
    return ctx, page, errors


def open_people(page) -> None:
    page.click("#open-people")
    page.wait_for_selector("#people-dialog[open] #people-body[data-ready='1']")


def test_an_admin_invites_a_user_who_joins_and_is_then_revoked(browser, server) -> None:
    admin_ctx, admin, admin_errors = watched_page(browser)
    user_ctx, user, user_errors = watched_page(browser)
    try:
        admin_ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base)
        login(admin, server)
        open_people(admin)
        assert admin.locator("#people-users tr[data-user='admin'] .badge").first.text_content() == "you"
        admin.check("#people-invite-form input[data-workspace='demo']")
        admin.check("#people-invite-form input[data-permission='memory']")
        admin.click("#people-invite")
        link = admin.wait_for_selector("#people-secret").input_value()
        assert link.startswith(server.base + "/join?code=ddi_"), link
        admin.click("#people-copy")
        assert admin.evaluate("() => navigator.clipboard.readText()") == link
        row = admin.wait_for_selector("#people-invitations tr[data-state='open']")
        assert "demo" in row.text_content() and "anyone" in row.text_content()
        shot(admin, "people-invited")

        user.goto(link)  # the user's own browser: the join page asks for a name
        assert "demo" in user.text_content("main")
        user.fill("#join-name", "newbie")
        user.click("#join-submit")
        user.wait_for_selector("#app-view:not([hidden])")
        assert user.text_content("#user-name") == "newbie"
        me = user_ctx.request.get(server.base + "/api/me")
        assert me.status == 200 and me.json()["workspaces"] == ["demo"] and me.json()["permissions"] == ["memory"]
        assert user.locator("#open-people").count() == 0 or user.locator("#open-people").is_hidden()
        assert user_errors == [], user_errors

        admin.click("#people-close")  # the admin sees the new user and the used invitation
        open_people(admin)
        admin.wait_for_selector("#people-users tr[data-user='newbie']")
        assert "used by newbie" in admin.text_content("#people-invitations")
        admin.click("#people-users tr[data-user='newbie'] .people-revoke")
        admin.click("#confirm-ok")
        admin.wait_for_selector("#people-users tr[data-user='newbie'].revoked")
        assert admin.text_content("#people-users tr[data-user='newbie'] .people-status") == "revoked"
        shot(admin, "people-revoked")

        refused = user_ctx.request.get(server.base + "/api/me")
        assert refused.status == 401, refused.text()
        assert "session expired or revoked" in refused.json()["error"]
        user.reload()  # the user's app now shows the login page
        user.wait_for_selector("#login-view:not([hidden])")
        assert admin_errors == [], admin_errors
        again = browser.new_context()
        try:  # the link was used: it says so
            page = again.new_page()
            page.goto(link)
            assert "already been used" in page.text_content("main")
        finally:
            again.close()
    finally:
        admin_ctx.close()
        user_ctx.close()


def test_an_admin_adds_edits_and_deletes_a_user_in_the_browser(browser, server) -> None:
    ctx, admin, errors = watched_page(browser)
    try:
        login(admin, server)
        open_people(admin)
        admin.click(".people-add > summary")
        admin.fill("#people-add-name", "sam")
        admin.check("#people-add-form input[data-workspace='demo']")
        admin.click("#people-add-form button[type='submit']")
        token = admin.wait_for_selector("#people-secret").input_value()
        assert token.startswith("ddt_sam.")
        api = ctx.request  # shares the admin's cookies: the token goes in its own header
        bearer = {"Authorization": f"Bearer {token}"}
        assert api.get(server.base + "/api/me", headers=bearer).json()["workspaces"] == ["demo"]

        admin.click("#people-users tr[data-user='sam'] .people-edit")
        admin.fill("#people-edit-other-ws", "sales")
        admin.check("#people-edit-form input[data-permission='memory']")
        admin.click("#people-edit-form button[type='submit']")
        admin.wait_for_selector("#people-users tr[data-user='sam'] >> text=demo, sales")
        assert api.get(server.base + "/api/me", headers=bearer).json()["permissions"] == ["memory"]
        assert admin.locator("#people-secret").count() == 0  # the token was shown once only

        admin.click("#people-users tr[data-user='sam'] summary")
        admin.click("#people-users tr[data-user='sam'] .people-revoke-token")
        admin.wait_for_selector("#people-users tr[data-user='sam'] >> text=0 active of 1")
        assert api.get(server.base + "/api/me", headers=bearer).status == 401

        admin.click("#people-users tr[data-user='sam'] .people-delete")
        admin.click("#confirm-ok")
        admin.wait_for_selector("#people-users tr[data-user='sam']", state="detached")
        admin.click("#people-users tr[data-user='admin'] .people-revoke")  # the only admin: refused, said why
        admin.click("#confirm-ok")
        admin.wait_for_selector("#toast:not([hidden]) >> text=you are the only active admin")
        errors[:] = [e for e in errors if "409" not in e]  # that refusal's own response
        assert errors == [], errors
    finally:
        ctx.close()
