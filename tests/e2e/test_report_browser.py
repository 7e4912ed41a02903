"""The report page in Chromium (issue 32, item 2): pin a chart, a table, a grid view and a
paragraph from their cards in the chat; the report page shows them in order with the title and
notes, reorders and unpins; its HTML export shows the same items with the charts embedded; a
refresh marks what it changed. Screenshots at 390 px and 1440 px, light and dark, and printed."""

from __future__ import annotations

import os
import shutil

import duckdb
import httpx
import pytest

from datadesk.llm.demo_plans import PLANS
from tests.e2e.conftest import login, open_page, run_server, shot
from tests.e2e.test_web import api, ask, new_chat, until

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    with run_server(tmp_path_factory.mktemp("report"), None) as srv:
        yield srv


def _shrink_warehouse(server) -> None:
    path = server.home / "workspaces" / "demo" / "data" / "warehouse.duckdb"
    copy = path.with_name("warehouse.next.duckdb")
    shutil.copy(path, copy)
    con = duckdb.connect(str(copy))
    con.execute("DELETE FROM readings WHERE building_id = 'B02' AND ts >= '2025-01-01'")
    con.close()
    os.replace(copy, path)


def _items(page) -> list[str]:
    return page.locator("#report-view .report-item h2").all_inner_texts()


def test_pins_show_on_the_report_page_and_in_its_export(demo_server, browser) -> None:
    server = demo_server
    token = server.token()
    with api(server, token) as c:
        tid = c.post("/api/threads", json={"title": "Energy review"}).json()["id"]
        r = c.post(f"/api/threads/{tid}/messages", json={"content": PLANS[0].question}, timeout=180)
        assert r.status_code == 200

    with open_page(browser, accept_downloads=True) as page:
        login(page, server)
        page.goto(f"{server.base}/#t={tid}")
        page.wait_for_selector("#messages img.chart + .report-pin")
        # the pin is an SVG icon, not an emoji
        assert page.locator("#messages img.chart + .report-pin svg.icon").count() >= 1
        page.click("#messages img.chart + .report-pin")
        until(page, "document.querySelector('#toast') && document.querySelector('#toast').textContent.includes('Pinned the chart')")
        card = page.locator("details.tool-card[data-tool='sql_query']").first
        card.locator("summary").click()
        card.locator(".tool-notice .report-pin").click()
        until(page, "document.querySelector('#toast').textContent.includes('Pinned the table')")
        first_para = page.locator("#messages .msg.assistant[data-seq]").last.locator("> p.report-pinnable").first
        para_text = first_para.inner_text().strip()
        first_para.hover()
        first_para.locator(".report-pin").click()
        until(page, "document.querySelector('#toast').textContent.includes('Pinned the paragraph')")
        # the grid's view: sorted by kwh, descending
        card.locator(".tool-notice .open-grid").click()
        page.wait_for_selector("#grid-dialog[open] #grid-table th")
        page.click("#grid-table th button.sort[data-column='kwh']")
        page.click("#grid-table th button.sort[data-column='kwh']")
        until(page, "document.querySelector('#grid-table th[aria-sort=descending]')")
        page.click("#grid-pin")
        until(page, "document.querySelector('#toast').textContent.includes('Pinned the table view')")
        page.keyboard.press("Escape")
        shot(page, "report-pins-in-chat")

        page.click("#open-report")
        page.wait_for_selector("#report-view:not([hidden]) .report-item")
        assert "view=report" in page.url
        assert page.locator("#chat").is_hidden()
        assert len(_items(page)) == 4
        assert page.locator("#report-view .report-item.chart img.report-chart").count() == 1
        assert page.locator("#report-view .report-item.table table").count() == 2
        assert para_text[:40] in page.locator("#report-view .report-item.paragraph").inner_text()
        # a note, a title, a reorder, an unpin
        note = page.locator("#report-view .report-item.chart .report-note-input")
        note.fill("Winter peaks: heating.")
        note.blur()
        until(page, "document.querySelector('#toast').textContent.includes('Note saved')")
        page.click("#report-view .report-rename")
        page.fill("#prompt-input", "Energy through the year")
        page.click("#prompt-ok")
        until(page, "document.querySelector('.report-title').textContent === 'Energy through the year'")
        page.click("#report-view .report-item.paragraph .report-up")
        until(page, "document.querySelectorAll('#report-view .report-item')[1].classList.contains('paragraph')")
        page.locator("#report-view .report-item.table").nth(1).locator(".report-remove").click()
        until(page, "document.querySelectorAll('#report-view .report-item').length === 3")
        kinds = page.eval_on_selector_all("#report-view .report-item", "els => els.map(e => e.className)")
        assert [k.split()[1] for k in kinds] == ["chart", "paragraph", "table"]
        # the page stays the report after a reload (its own route)
        page.reload()
        page.wait_for_selector("#report-view:not([hidden]) .report-item")
        assert page.locator(".report-note-input").first.input_value() == "Winter peaks: heating."

        for width, scheme in ((1440, "light"), (1440, "dark"), (390, "light"), (390, "dark")):
            page.set_viewport_size({"width": width, "height": 900})
            page.emulate_media(color_scheme=scheme)
            shot(page, f"report-page-{width}-{scheme}", full_page=True)
        page.emulate_media(media="print", color_scheme="light")
        page.set_viewport_size({"width": 1000, "height": 900})
        assert page.locator(".topbar").is_hidden() and page.locator(".report-toolbar").is_hidden()
        assert page.locator(".sidebar").is_hidden()
        shot(page, "report-page-print", full_page=True)
        page.emulate_media(media="screen")

        # the export: the same items, self-contained, opened in the browser
        page.goto(f"{server.base}/api/threads/{tid}/report?format=html")
        page.wait_for_selector("section.item")
        assert page.locator("h1").inner_text() == "Energy through the year"
        assert page.locator("section.item").count() == 3
        assert page.locator("section.item img[src^='data:image/png']").count() == 1
        assert "Winter peaks: heating." in page.locator("section.item.chart .note").inner_text()
        assert page.evaluate("() => document.querySelector('section.item img').naturalWidth") > 100
        shot(page, "report-export-html", full_page=True)
        with api(server, token) as c:
            md = c.get(f"/api/threads/{tid}/report?format=md").text
        assert md.startswith("# Energy through the year") and "data:image/png;base64," in md

    # a refresh redraws it: the changes marked
    _shrink_warehouse(server)
    with api(server, token) as c:
        r = c.post(f"/api/threads/{tid}/refresh", timeout=180)
        assert r.status_code == 200 and "refresh.completed" in r.text
    with open_page(browser) as page:
        login(page, server)
        page.goto(f"{server.base}/#t={tid}&view=report")
        page.wait_for_selector("#report-view:not([hidden]) .report-mark")
        marks = page.locator("#report-view .report-mark").all_inner_texts()
        assert any("Updated by refresh at" in m and "rows" in m for m in marks), marks
        assert any("new version of the chart" in m for m in marks), marks
        page.set_viewport_size({"width": 1440, "height": 900})
        shot(page, "report-page-refreshed", full_page=True)
        assert not page.js_errors, page.js_errors
    with httpx.Client(base_url=server.base, timeout=30) as anon:
        assert anon.get(f"/api/threads/{tid}/report").status_code == 401


VEGA_CODE = """\
from IPython.display import display
display({"application/vnd.vegalite.v5+json": {
    "title": "Sales by region",
    "data": {"values": [{"region": "North", "sales": 1250000}, {"region": "South", "sales": 980000}]},
    "mark": "bar",
    "encoding": {"x": {"field": "region", "type": "nominal"}, "y": {"field": "sales", "type": "quantitative"}}}},
    raw=True)
"""


def test_a_pinned_vega_lite_chart_draws_on_the_report_page(server, browser) -> None:
    server.llm.clear()
    server.llm.add_tool_calls([{"id": "call_vl", "name": "python", "arguments": {"code": VEGA_CODE}}])
    server.llm.add_text("Here are the sales by region.")
    with open_page(browser) as page:
        login(page, server)
        new_chat(page)
        ask(page, "Chart sales by region.")
        page.wait_for_selector("#messages figure.vl-chart + .report-pin svg.icon")
        page.click("#messages figure.vl-chart + .report-pin")
        until(page, "document.querySelector('#toast').textContent.includes('Pinned the chart')")
        page.click("#open-report")
        page.wait_for_selector("#report-view:not([hidden]) .report-item.chart figure.vl-chart")
        until(page, "document.querySelector('#report-view .report-item.chart figure.vl-chart.drawn svg')", 30)
        assert page.locator("#report-view .report-item.chart figure.vl-chart svg .mark-rect path").count() == 2
        shot(page, "report-page-vegalite")
        assert not page.js_errors, page.js_errors
