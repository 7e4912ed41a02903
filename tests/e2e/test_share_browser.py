"""Sharing a chat in a real browser (issue 32, part 3): the owner shares a chat with a table and a
chart from the Share dialog; a colleague of the workspace opens the link read-only (banner, no
composer, the chart and the grid, its profiles and group-bys, through the share) and copies it into their chats; a user of
another workspace gets "not found"; a revoked link stops working. Screenshots at 390 and 1440 px,
light and dark."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import shot
from tests.e2e.test_web import ask, new_chat, until

pytestmark = pytest.mark.browser

SQL = "SELECT * FROM readings WHERE building_id IN ('B01', 'B02')"
CHART = """\
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import pandas as pd
df = pd.read_parquet([p for p in __import__('glob').glob('/data/*.parquet')][0])
df.groupby('building_id')['kwh'].sum().plot.bar()
plt.title('kWh per building')
plt.savefig('/outputs/kwh.png')
print('saved')
"""


def sign_in(browser, server, user: str, scheme: str = "light", width: int = 1440):
    ctx = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.login_url(user))
    page.click("#login-confirm")
    page.wait_for_selector("#app-view:not([hidden])")
    page.js_errors = errors  # type: ignore[attr-defined]
    return ctx, page


@pytest.fixture(scope="module")
def people(server):
    """bob, a colleague in demo; eve, of another workspace only."""
    ws = server.home / "workspaces" / "elsewhere"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "workspace.toml").write_text('name = "Elsewhere"\nprompt = "Another team."\n')
    server.cli("users", "add", "bob", "--workspace", "demo")
    server.cli("users", "add", "eve", "--workspace", "elsewhere")
    return server


def owner_shares(browser, server) -> tuple[object, object, str]:
    """The owner (admin) asks, opens the Share dialog, creates a link; the page and the link."""
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_q", "name": "sql_query", "arguments": {"sql": SQL}}])
    llm.add_tool_calls([{"id": "call_c", "name": "python", "arguments": {"code": CHART}}])
    llm.add_text("B01 used more energy than B02 (**see the chart**).")
    ctx, page = sign_in(browser, server, "admin")
    new_chat(page)
    ask(page, "Energy of B01 and B02, with a chart")
    page.locator("#messages img.chart").first.wait_for()
    with page.expect_response(lambda r: "/report/items" in r.url and r.status < 300):
        page.locator("button.report-pin:has-text('Pin chart')").first.click()  # the report page shares too
    page.click("#share-thread")
    page.wait_for_selector("#share-dialog[open]")
    page.click("#share-create")
    link = page.wait_for_selector("#share-list .share-row:not(.revoked) .share-link").input_value()
    assert link.startswith(server.base + "/#s="), link
    shot(page, "share-dialog-light-1440")
    return ctx, page, link


def test_a_colleague_opens_read_only_and_forks_outsider_404_revoke(browser, people) -> None:
    server = people
    owner_ctx, owner, link = owner_shares(browser, server)
    sid = link.split("#s=")[1]
    try:
        for scheme, width in (("light", 1440), ("dark", 1440), ("light", 390), ("dark", 390)):
            ctx, page = sign_in(browser, server, "bob", scheme, width)
            page.goto(link)
            page.wait_for_selector("#shared-banner")
            banner = page.text_content("#shared-banner")
            assert "Shared by" in banner and "admin" in banner and "read only" in banner, banner
            assert page.locator("#composer").is_hidden() and page.locator("#thread-actions").is_hidden()
            img = page.locator("#messages img.chart").first
            img.wait_for()
            assert f"/api/shares/{sid}/artifacts/" in img.get_attribute("src")
            until(page, "document.querySelector('#messages img.chart').naturalWidth > 0")
            assert "see the chart" in page.text_content("#messages")
            shot(page, f"share-colleague-{scheme}-{width}", full_page=width == 390)
            if (scheme, width) != ("light", 1440):
                assert page.js_errors == [], page.js_errors
                ctx.close()
                continue
            # the report page, through the same share, read only
            page.click("#share-report")
            page.locator("#shared-report .report-item.chart img").first.wait_for()
            until(page, "document.querySelector('#shared-report .report-item.chart img').naturalWidth > 0")
            assert page.locator("#shared-report .report-item-tools").count() == 0
            shot(page, "share-colleague-report-light-1440")
            page.click("#share-report")
            # the grid reads the table through the share
            page.locator("details.tool-card[data-tool='sql_query'] > summary").first.click()
            page.locator("#messages .open-grid").first.click()
            page.wait_for_selector("dialog[open] table td")
            shot(page, "share-colleague-grid-light-1440")
            # its column profile and group-by read through the share too; nothing that writes is offered
            assert page.locator("#grid-chart").is_hidden() and page.locator("#grid-ask").is_hidden()
            with page.expect_response(lambda r: f"/api/shares/{sid}/artifacts/" in r.url and "/profile" in r.url
                                      and r.status == 200):
                page.click("#grid-table button.profile-btn[data-column='kwh']")
            until(page, "document.querySelector('#grid-profile[data-column=\"kwh\"]') && "
                        "!document.querySelector('#grid-profile').hidden")
            assert page.locator("#grid-profile .profile-hist rect.bar").count() > 0
            page.select_option("#grid-group-by", "building_id")
            with page.expect_response(lambda r: f"/api/shares/{sid}/artifacts/" in r.url and "/groups" in r.url
                                      and r.status == 200):
                page.click("#grid-group-form button[type=submit]")
            until(page, "document.querySelector('#grid-count').textContent.includes('groups')")
            assert page.inner_text("#grid-count").startswith("2 groups"), page.inner_text("#grid-count")
            shot(page, "share-colleague-grid-groups-light-1440")
            page.keyboard.press("Escape")
            # Copy into my chats: a thread of bob's own, with the chart, and the composer back
            page.click("#share-fork")
            page.wait_for_selector("#app-view:not([hidden])")
            until(page, "location.hash.startsWith('#t=') && !document.querySelector('#shared-banner')")
            until(page, "document.querySelector('#thread-title').textContent.endsWith('(copy)')")
            page.locator("#messages img.chart").first.wait_for()
            src = page.locator("#messages img.chart").first.get_attribute("src")
            assert src.startswith("/api/artifacts/") and "/shares/" not in src
            until(page, "document.querySelector('#messages img.chart').naturalWidth > 0")
            assert page.locator("#composer").is_visible()
            shot(page, "share-colleague-forked-light-1440")
            assert page.js_errors == [], page.js_errors
            ctx.close()

        # eve, of another workspace: not found, as for a link that never existed
        ctx, page = sign_in(browser, server, "eve")
        page.goto(link)
        page.wait_for_selector(".shared-missing")
        assert page.text_content("#thread-title") == "Shared chat not found"
        assert page.locator("#shared-banner").count() == 0
        r = ctx.request.get(f"{server.base}/api/shares/{sid}")
        assert r.status == 404
        shot(page, "share-outsider-404-light-1440")
        ctx.close()

        # the owner revokes: the link stops working for bob too
        owner.click("#share-list .share-row:not(.revoked) .share-revoke")
        owner.wait_for_selector("#share-list .share-row.revoked")
        shot(owner, "share-revoked-dialog-light-1440")
        ctx, page = sign_in(browser, server, "bob")
        page.goto(link)
        page.wait_for_selector(".shared-missing")
        assert ctx.request.get(f"{server.base}/api/shares/{sid}").status == 404
        shot(page, "share-revoked-404-light-1440")
        ctx.close()
        assert owner.js_errors == [], owner.js_errors
    finally:
        owner_ctx.close()
