"""Refresh an analysis in Chromium (issue 31, item 4, its Done-when lines): after the warehouse
changed, Refresh shows the changes (rows old -> new, the new report version); a scheduled refresh,
on a faked clock (the test-only DATADESK_TEST_CLOCK_FILE of threads/scheduler.py), runs by itself
and shows its badge in the thread list."""

from __future__ import annotations

import os
import shutil
import time
from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from datadesk.llm.demo_plans import PLANS
from tests.e2e.conftest import login, run_server, shot
from tests.e2e.test_web import api, until

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def clocked(tmp_path_factory):
    """`datadesk serve` with the demo model, the scheduler ticking every 0.2 s on a clock file."""
    tmp = tmp_path_factory.mktemp("refresh")
    clock = tmp / "clock.txt"
    with run_server(tmp, None, extra_env={"DATADESK_TEST_CLOCK_FILE": str(clock)},
                    extra_toml="[refresh]\nschedule_tick_s = 0.2\n") as srv:
        srv.clock = clock
        yield srv


def _shrink_warehouse(server, building: str) -> None:
    """The warehouse changes underneath, as an admin replacing the file does (the server sees
    a replaced file at its next query)."""
    path = server.home / "workspaces" / "demo" / "data" / "warehouse.duckdb"
    copy = path.with_name("warehouse.next.duckdb")
    shutil.copy(path, copy)
    con = duckdb.connect(str(copy))
    con.execute("DELETE FROM readings WHERE building_id = ? AND ts >= '2025-01-01'", [building])
    con.close()
    os.replace(copy, path)


def test_refresh_shows_the_changes_and_a_scheduled_one_its_badge(clocked, browser) -> None:
    from tests.e2e.conftest import open_page

    server = clocked
    token = server.token()
    with api(server, token) as c:
        tid = c.post("/api/threads", json={"title": "Energy review"}).json()["id"]
        r = c.post(f"/api/threads/{tid}/messages", json={"content": PLANS[0].question}, timeout=120)
        assert r.status_code == 200
        arts = c.get(f"/api/threads/{tid}/artifacts").json()
    rows = next(a["rows"] for a in arts if a.get("format") == "parquet")
    _shrink_warehouse(server, "B02")

    with open_page(browser) as page:
        login(page, server)
        page.goto(f"{server.base}/#t={tid}")
        page.wait_for_selector("#messages .file-link.report .refresh-report")  # on the report, too
        page.click("#refresh-thread")
        page.wait_for_selector("#messages .refresh-card.ok", timeout=120_000)
        card = page.locator("#messages .refresh-card.ok").inner_text()
        assert f"rows {rows:,} → {rows - 31:,}" in card and "1 change" in card and "sum of kwh" in card
        assert page.locator("#messages .refresh-card a.new-version").count() == 1
        until(page, "document.querySelector('#thread-list .badge.refreshed')"
                    " && document.querySelector('#thread-list .badge.refreshed').textContent.includes('1 change')")
        shot(page, "refresh-card")

        # schedule it at 07:30 UTC, then move the scheduler's clock past the next 07:30
        page.click("#schedule-thread")
        page.fill("#schedule-value", "07:30")
        page.fill("#schedule-tz", "UTC")
        page.click("#schedule-save")
        page.wait_for_selector("#schedule-dialog", state="detached")
        with api(server, token) as c:
            sched = c.get(f"/api/threads/{tid}/schedule").json()
        assert sched["at"] == "07:30" and sched["tz"] == "UTC"
        _shrink_warehouse(server, "B03")
        due = datetime.fromisoformat(sched["next_run"]).astimezone(timezone.utc)
        server.clock.write_text(str((due + timedelta(minutes=1)).timestamp()))
        deadline = time.time() + 120
        while True:
            with api(server, token) as c:
                report = c.get(f"/api/threads/{tid}/refresh").json()
            if report.get("trigger") == "schedule" and report.get("status") != "running":
                break
            assert time.time() < deadline, report
            time.sleep(0.3)
        assert report["status"] == "ok" and report["changes"] == 1
        page.reload()
        page.wait_for_selector("#messages .refresh-card.ok")
        assert "scheduled" in page.locator("#messages .refresh-card.ok").inner_text()
        assert f"rows {rows - 31:,} → {rows - 62:,}" in page.locator("#messages .refresh-card.ok").inner_text()
        until(page, "document.querySelector('#thread-list .badge.refreshed')")
        badge = page.locator("#thread-list .badge.refreshed").first
        assert "refreshed" in badge.inner_text() and "1 change" in badge.inner_text()
        assert badge.get_attribute("title") == "Last refresh (schedule)"
        shot(page, "refresh-scheduled-badge")
        assert page.js_errors == []
