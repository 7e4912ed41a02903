"""The admin audit view in a real browser against the real server: the admin's own sign-in is in
the table, the filters narrow it, paging moves through older entries, and the CSV button
downloads the same filtered entries."""

from __future__ import annotations

import csv
import io

import pytest

from datadesk.audit import embedded_trail

from tests.e2e.conftest import login, shot
from tests.e2e.test_web import until

pytestmark = pytest.mark.browser


def test_an_admin_reads_filters_pages_and_downloads_the_audit_trail(server, page) -> None:
    login(page, server)
    page.click("#open-audit")
    page.wait_for_selector("#audit-table tbody tr")
    first = page.locator("#audit-table tbody tr").first.locator("td")
    texts = first.all_inner_texts()
    assert "sign_in" in texts and "admin" in texts and "login link" in texts[6], texts
    # many more entries: failed sign-ins of made-up accounts, appended to the server's log as
    # another worker of the host would (the server's login limiter would stop a browser sooner)
    trail = embedded_trail(server.home, 0)
    for i in range(120):
        trail.record("sign_in_failed", user=f"ghost{i}", outcome="refused", detail="invalid, used or expired code")
    page.fill("#audit-workspace", "nowhere")
    page.click("#audit-filters button[type=submit]")
    until(page, "document.querySelector('#audit-status').textContent.startsWith('No entry matches')")
    page.fill("#audit-workspace", "")
    page.select_option("#audit-action", "sign_in_failed")
    page.select_option("#audit-size", "100")
    page.click("#audit-filters button[type=submit]")
    until(page, "document.querySelectorAll('#audit-table tbody tr').length === 100")
    rows = page.locator("#audit-table tbody tr")
    assert rows.first.locator("td").nth(1).inner_text() == "sign_in_failed"
    assert "page 1" in page.inner_text("#audit-pos")
    shot(page, "audit-view")
    page.click("#audit-older")
    until(page, "document.querySelector('#audit-pos').textContent.startsWith('page 2')")
    assert page.locator("#audit-table tbody tr").count() == 20 and page.is_disabled("#audit-older")
    page.click("#audit-newer")
    until(page, "document.querySelector('#audit-pos').textContent.startsWith('page 1')")
    with page.expect_download() as dl:
        page.click("#audit-csv")
    text = open(dl.value.path(), encoding="utf-8").read()
    entries = list(csv.DictReader(io.StringIO(text)))
    assert len(entries) == 120 and {e["action"] for e in entries} == {"sign_in_failed"}, entries[:2]
    assert not page.js_errors, page.js_errors
