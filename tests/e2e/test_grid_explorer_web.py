"""The grid as an explorer in a real browser (issue 32, item 5), over the 190,560-row demo
artifact: the question as the grid's title, a column profile (numbers checked against DuckDB,
a click on a bar filters to its range), a between-filter and a date range, copy with a header
row, group-by, "Ask about this view" and "Chart this view" (a python step the model sees).
Screenshots under tests/e2e/screenshots/ (grid-profile*, grid-between*), 1440 and 390 px,
light and dark."""

from __future__ import annotations

import io

import duckdb
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import login, open_page, shot
from tests.e2e.test_web import ask, new_chat, until, wait_idle
from tests.e2e.test_workbench_grid import N_READINGS, clipboard, column, grid_settled

pytestmark = pytest.mark.browser
QUESTION = "Load every meter reading of 2024."


@pytest.fixture
def wide(browser, server):
    grant = lambda ctx: ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base)  # noqa: E731
    with open_page(browser, grant, accept_downloads=True) as pg:
        pg.set_viewport_size({"width": 1440, "height": 900})
        yield pg


def _load(page, server):
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_explore", "name": "sql_query", "arguments": {"sql": "SELECT * FROM readings"}}])
    llm.add_text("All readings are in the grid.")
    login(page, server)
    new_chat(page)
    ask(page, QUESTION)
    card = page.locator("details.tool-card[data-tool='sql_query']").last
    card.locator("summary").click()
    aid = card.locator(".tool-notice").get_attribute("data-artifact")
    data = page.request.get(f"{server.base}/api/artifacts/{aid}/download").body()
    card.locator("button.open-grid").click()
    grid_settled(page)
    return aid, pq.read_table(io.BytesIO(data))


def _profile(page, name: str) -> None:
    page.click(f"#grid-table button.profile-btn[data-column='{name}']")
    until(page, f"document.querySelector('#grid-profile[data-column=\"{name}\"]') && "
                "!document.querySelector('#grid-profile').hidden")


def test_profile_filters_copy_group_ask_and_chart(server, wide) -> None:
    page = wide
    aid, readings = _load(page, server)  # noqa: F841 (DuckDB reads `readings` by name)
    assert page.inner_text("#grid-title") == QUESTION  # the question, not the artifact id

    # the profile of kwh over all 190,560 rows
    _profile(page, "kwh")
    assert page.locator("#grid-profile .profile-hist rect.bar").count() == 20
    lo, hi, distinct = duckdb.sql("SELECT min(kwh), max(kwh), count(DISTINCT kwh) FROM readings").fetchall()[0]
    stats = page.inner_text("#grid-profile .profile-stats")
    assert "190,560" in stats and f"{distinct:,}" in stats and f"{lo:g}" in stats.replace(",", "")
    shot(page, "grid-profile")

    # a between filter on kwh: the count matches DuckDB
    page.select_option("#grid-filter-column", "kwh")
    page.select_option("#grid-filter-op", "between")
    assert page.locator("#grid-filter-value2").is_visible()
    page.fill("#grid-filter-value", "50")
    page.fill("#grid-filter-value2", "100")
    page.click("#grid-filter-form button[type=submit]")
    grid_settled(page)
    n = duckdb.sql("SELECT count(*) FROM readings WHERE kwh BETWEEN 50 AND 100").fetchall()[0][0]
    assert page.inner_text("#grid-count") == f"{n:,} of {N_READINGS:,} rows match"
    assert all(50 <= float(x) <= 100 for x in column(page, "kwh"))
    assert "kwh between 50 and 100" in page.inner_text("#grid-chips")
    shot(page, "grid-between")

    # a date range on ts (January: a date-only upper bound takes in its whole day)
    page.select_option("#grid-filter-column", "ts")
    page.select_option("#grid-filter-op", "between")
    page.fill("#grid-filter-value", "2024-01-01")
    page.fill("#grid-filter-value2", "2024-01-31")
    page.click("#grid-filter-form button[type=submit]")
    grid_settled(page)
    n2 = duckdb.sql("SELECT count(*) FROM readings WHERE kwh BETWEEN 50 AND 100 AND ts >= DATE '2024-01-01' "
                    "AND ts < DATE '2024-02-01'").fetchall()[0][0]
    assert page.inner_text("#grid-count") == f"{n2:,} of {N_READINGS:,} rows match"
    # a bad value: the 400 names the filter, the view stays
    page.select_option("#grid-filter-column", "occupancy")
    page.select_option("#grid-filter-op", ">=")
    page.fill("#grid-filter-value", "many")
    page.click("#grid-filter-form button[type=submit]")
    until(page, "!document.querySelector('#grid-status').hidden")
    assert "filter 3 (occupancy >=): 'many' is not a whole number" in page.inner_text("#grid-status")
    assert page.locator(".grid-chips .chip").count() == 2

    # copy a 2x2 selection with its header row
    cells = page.locator("#grid-table tbody td")
    ncols = page.locator("#grid-table thead th[data-col]").count()
    cells.nth(0).click()
    cells.nth(ncols + 1).click(modifiers=["Shift"])
    page.click("#grid-copy")
    lines = clipboard(page).split("\n")
    assert lines[0] == "building_id\tts" and len(lines) == 3 and all(len(x.split("\t")) == 2 for x in lines)
    page.uncheck("#grid-copy-header")
    page.click("#grid-copy")
    assert len(clipboard(page).split("\n")) == 2

    # group by building with sum of kwh: as many groups as DuckDB finds
    page.select_option("#grid-group-by", "building_id")
    page.select_option("#grid-group-sum", "kwh")
    page.click("#grid-group-form button[type=submit]")
    until(page, "document.querySelector('#grid-count').textContent.includes('groups')")
    groups = duckdb.sql("SELECT count(DISTINCT building_id) FROM readings WHERE kwh BETWEEN 50 AND 100 "
                        "AND ts >= DATE '2024-01-01' AND ts < DATE '2024-02-01'").fetchall()[0][0]
    assert page.inner_text("#grid-count") == f"{groups:,} groups of {n2:,} rows"
    assert page.locator("#grid-table tbody tr").count() == groups
    assert page.inner_text("#grid-table thead").count("sum(kwh)") == 1
    shot(page, "grid-group-by")

    # ask about this view: the composer carries the artifact, the filters and the group-by
    page.click("#grid-ask")
    until(page, "!document.querySelector('#grid-dialog').open")
    text = page.input_value("#input")
    assert aid in text and "kwh between 50 and 100" in text and "grouped by building_id" in text
    assert '"group_by":["building_id"]' in text and QUESTION in text
    page.fill("#input", "")

    # chart this view: a python step drawn in the chat, marked as the user's
    page.click("#open-artifacts")
    page.locator(f"#panel-body button.open-grid[data-artifact='{aid}']").first.click()
    grid_settled(page)
    page.click("#grid-chart")
    until(page, "!document.querySelector('#grid-dialog').open")
    wait_idle(page)
    until(page, "document.querySelector(\".tool-card.user-step[data-tool='python']\")", timeout_s=120)
    step = page.locator(".tool-wrap:has(details.tool-card.user-step[data-tool='python'])").last
    until(page, "document.querySelector(\".tool-wrap:has(details.user-step[data-tool='python']) img.chart\")",
          timeout_s=120)
    assert step.locator("img.chart").count() >= 1
    assert page.js_errors == []


@pytest.mark.parametrize("width,scheme", [(390, "light"), (1440, "dark"), (390, "dark")])
def test_profile_and_filter_screenshots(server, browser, width, scheme) -> None:
    with open_page(browser, color_scheme=scheme) as page:
        _load(page, server)  # at 1280 px (the sidebar's + New chat), then the width shot
        page.set_viewport_size({"width": width, "height": 844 if width == 390 else 900})
        _profile(page, "building_id")
        assert page.locator("#grid-profile .profile-top li").count() == 10
        page.locator("#grid-profile .profile-top button").first.click()  # a top value filters to it
        grid_settled(page)
        assert page.locator(".grid-chips .chip").count() == 1
        assert len(set(column(page, "building_id"))) == 1
        shot(page, f"grid-profile-{width}-{scheme}")
        _profile(page, "ts")
        page.locator("#grid-profile .profile-hist rect.bar").first.click()  # a bar filters to its range
        grid_settled(page)
        assert "ts between" in page.inner_text("#grid-chips")
        shot(page, f"grid-between-{width}-{scheme}")
        assert page.js_errors == []
