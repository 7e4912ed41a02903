"""The analyst's workbench in a real browser (issue 19, items 1, 2 and 4): the result grid over a
190,560-row artifact (numbers checked against DuckDB), charts and code (download, zoom, one image
per figure, copy, highlighting, collapsible output), and the frictions (autoscroll pill, narrow
drawer, upload messages, rename with Enter, a friendly used-link page, + New chat reuse, dark
theme, keyboard focus order). Screenshots go to tests/e2e/screenshots/."""

from __future__ import annotations

import csv
import io

import duckdb
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import login, open_page, shot
from tests.e2e.test_web import ask, new_chat, until, wait_idle

pytestmark = pytest.mark.browser

N_READINGS = 190_560
CHART_CODE = r'''
import glob
import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_parquet(sorted(glob.glob("/data/*.parquet"))[-1])
daily = df.groupby(df["ts"].dt.date)["kwh"].sum()
fig, ax = plt.subplots(figsize=(7, 3))
daily.plot(ax=ax, title="Daily energy use (kWh)")
fig.savefig("/outputs/daily.png", dpi=80)
plt.show()
for i in range(120):
    print("line", i)
'''
ANSWER_SQL = "SELECT building_id, sum(kwh) AS kwh\nFROM readings\nGROUP BY 1\nORDER BY 2 DESC"


@pytest.fixture
def cpage(browser, server):
    """A page whose clipboard the test may read."""
    grant = lambda ctx: ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base)  # noqa: E731
    with open_page(browser, grant, accept_downloads=True) as pg:
        yield pg


def clipboard(page) -> str:
    return page.evaluate("() => navigator.clipboard.readText()")


def column(page, name: str) -> list[str]:
    """The texts of one grid column on the page shown."""
    return page.evaluate("""(name) => {
        const ths = [...document.querySelectorAll('#grid-table thead th')];
        const i = ths.findIndex(th => th.querySelector('button.sort') && th.querySelector('button.sort').dataset.column === name);
        return [...document.querySelectorAll('#grid-table tbody tr')].map(tr => tr.children[i].textContent);
    }""", name)


def grid_settled(page) -> None:
    until(page, "document.querySelector('#grid-dialog[open]') && !document.querySelector('#grid-dialog').hasAttribute('aria-busy')")


def rename(page, title: str) -> None:
    page.click("#rename-thread")
    page.fill("#prompt-input", title)
    page.press("#prompt-input", "Enter")  # Enter saves (Shift+Enter would add a line)
    until(page, f"document.querySelector('#thread-title').textContent === {title!r}")


def test_grid_pages_sorts_filters_copies_and_downloads_the_full_result(server, cpage, tmp_path) -> None:
    page = cpage
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_all", "name": "sql_query", "arguments": {"sql": "SELECT * FROM readings"}}])
    llm.add_text("All readings are in the grid.")
    login(page, server)
    new_chat(page)
    rename(page, "Readings 2024")
    assert page.locator("#prompt-dialog[open]").count() == 0
    ask(page, "Load all readings.")
    card = page.locator("details.tool-card[data-tool='sql_query']")
    card.locator("summary").click()
    # the clean preview table, and apart from it (collapsed) what the model was told
    assert card.locator(".preview-table table").count() == 1
    note = card.locator(".model-note")
    assert note.is_hidden() and "NOTICE" in note.text_content()
    card.locator("button.model-note-toggle").click()
    assert note.is_visible()
    assert "NOTICE" not in card.locator(".preview-table").inner_text()
    aid = card.locator(".tool-notice").get_attribute("data-artifact")
    data = page.request.get(f"{server.base}/api/artifacts/{aid}/download").body()
    readings = pq.read_table(io.BytesIO(data))  # noqa: F841 (DuckDB reads it by name)
    assert readings.num_rows == N_READINGS

    card.locator("button.open-grid").click()
    grid_settled(page)
    assert page.inner_text("#grid-count") == "190,560 rows"
    assert page.locator("#grid-table tbody tr").count() == 100
    assert page.inner_text("#grid-pos") == "rows 1–100 of 190,560"
    head = page.locator("#grid-table thead th[data-col]", has=page.locator("button[data-column='kwh']"))
    nulls = duckdb.sql("SELECT count(*) - count(kwh) FROM readings").fetchall()[0][0]
    assert "double" in head.inner_text() and (f"{nulls:,} null" if nulls else "no nulls") in head.inner_text()
    first = duckdb.sql("SELECT building_id FROM readings LIMIT 100").fetchall()
    assert column(page, "building_id") == [r[0] for r in first]
    shot(page, "grid")

    # sort by kWh, descending (two clicks), then page forward: the values match DuckDB
    page.click("#grid-table button[data-column='kwh']")
    grid_settled(page)
    page.click("#grid-table button[data-column='kwh']")
    grid_settled(page)
    assert page.get_attribute("#grid-table thead th[aria-sort='descending'] button", "data-column") == "kwh"
    page.click("#grid-next")
    grid_settled(page)
    assert page.inner_text("#grid-pos") == "rows 101–200 of 190,560"
    want = [r[0] for r in duckdb.sql("SELECT kwh FROM readings ORDER BY kwh DESC NULLS LAST LIMIT 100 OFFSET 100").fetchall()]
    assert [float(x) for x in column(page, "kwh")] == pytest.approx(want)
    page.click("#grid-last")
    grid_settled(page)
    assert page.inner_text("#grid-pos").endswith(f"of {N_READINGS:,}") and page.inner_text("#grid-pos").startswith("rows 190,501")

    # filters: building = B07 and kWh > 40; the count matches DuckDB
    page.select_option("#grid-filter-column", "building_id")
    page.select_option("#grid-filter-op", "=")
    page.fill("#grid-filter-value", "B07")
    page.click("#grid-filter-form button[type=submit]")
    grid_settled(page)
    page.select_option("#grid-filter-column", "kwh")
    page.select_option("#grid-filter-op", ">")
    page.fill("#grid-filter-value", "40")
    page.press("#grid-filter-value", "Enter")
    grid_settled(page)
    n = duckdb.sql("SELECT count(*) FROM readings WHERE building_id = 'B07' AND kwh > 40").fetchall()[0][0]
    assert page.inner_text("#grid-count") == f"{n:,} of 190,560 rows match"
    assert set(column(page, "building_id")) == {"B07"} and min(float(x) for x in column(page, "kwh")) > 40
    top = duckdb.sql("SELECT kwh FROM readings WHERE building_id = 'B07' AND kwh > 40 ORDER BY kwh DESC LIMIT 3").fetchall()
    assert [float(x) for x in column(page, "kwh")[:3]] == pytest.approx([r[0] for r in top])
    # a bad filter value: the server's 400 is shown, the view stays
    page.select_option("#grid-filter-op", "<")
    page.fill("#grid-filter-value", "lots")
    page.click("#grid-filter-form button[type=submit]")
    until(page, "!document.querySelector('#grid-status').hidden")
    assert "filter" in page.inner_text("#grid-status") and page.locator(".grid-chips .chip").count() == 2

    # copy a cell, then a 2x2 selection (tab-separated)
    cells = page.locator("#grid-table tbody td")
    cells.nth(0).click()
    page.click("#grid-copy")
    assert clipboard(page) == "B07"
    ncols = page.locator("#grid-table thead th[data-col]").count()
    cells.nth(ncols + 1).click(modifiers=["Shift"])
    page.keyboard.press("Control+c")
    until(page, "document.querySelectorAll('#grid-table td.sel').length === 4")
    lines = clipboard(page).split("\n")  # with the header row (issue 32), then the cells
    assert len(lines) == 3 and all(len(x.split("\t")) == 2 for x in lines) and lines[1].startswith("B07\t")
    assert lines[0] == "building_id\tts"

    # the keyboard: arrows move the selection, Shift extends it, Ctrl+C copies
    page.focus(".grid-scroll")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Shift+ArrowRight")
    page.keyboard.press("Control+c")
    until(page, "document.querySelectorAll('#grid-table td[aria-selected]').length === 2")
    assert [len(x.split("\t")) for x in clipboard(page).split("\n")] == [2, 2]  # header + the cells
    # download the current view (filtered, sorted) as CSV, named from the thread's title
    with page.expect_download() as dl:
        page.click("#grid-download")
    assert dl.value.suggested_filename == "readings_2024_view.csv"
    path = tmp_path / "view.csv"
    dl.value.save_as(path)
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n and float(rows[0]["kwh"]) == pytest.approx(top[0][0])
    shot(page, "grid-filtered")
    page.click("#grid-close")
    # the artifacts panel opens the same grid, as it was left (filters kept)
    page.click("#open-artifacts")
    page.locator("#panel-body button.open-grid").first.click()
    grid_settled(page)
    assert page.inner_text("#grid-count") == f"{n:,} of 190,560 rows match"
    page.keyboard.press("Escape")
    assert page.js_errors == []


def test_chart_once_download_zoom_copy_highlight_and_collapse(server, cpage) -> None:
    page = cpage
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_q", "name": "sql_query", "arguments": {"sql": "SELECT * FROM readings"}}])
    llm.add_tool_calls([{"id": "call_py", "name": "python", "arguments": {"code": CHART_CODE}}])
    llm.add_text(f"Totals per building:\n\n```sql\n{ANSWER_SQL}\n```\n\nSee the chart.")
    login(page, server)
    new_chat(page)
    ask(page, "Chart the daily use.")
    # save-then-show: one image for the one figure
    page.locator(".tool-extras img.chart").first.wait_for()
    until(page, "[...document.querySelectorAll('img.chart')].every(i => i.complete && i.naturalWidth > 0)")
    assert page.locator(".tool-wrap:has(details[data-tool='python']) img.chart").count() == 1
    # the viewer: zoom and download the PNG
    page.locator("img.chart").first.click()
    page.wait_for_selector("#lightbox[open]")
    page.click("#lightbox-zoom-in")
    page.click("#lightbox-zoom-in")
    assert "zoomed" in page.get_attribute("#lightbox-img", "class") and page.inner_text("#lightbox-zoom-level") == "200%"
    shot(page, "chart-zoom")
    with page.expect_download() as dl:
        page.click("#lightbox-download")
    assert dl.value.suggested_filename == "daily.png"
    with open(dl.value.path(), "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    page.click("#lightbox-fit")
    page.keyboard.press("Escape")

    # the answer's SQL block: highlighted on the server, copied with its button
    answer = page.locator(".msg.assistant").last
    assert answer.locator("pre code span.pyg-k").count() >= 3
    answer.locator(".code-wrap .copy-btn").click()
    assert clipboard(page) == ANSWER_SQL
    # the tool input (python) has a copy button too, and is highlighted
    py = page.locator("details.tool-card[data-tool='python']")
    py.locator("summary").click()
    assert py.locator("pre.code span.pyg-kn").count() >= 1
    py.locator(".tool-section").first.locator(".copy-btn").click()
    assert clipboard(page).strip() == CHART_CODE.strip()
    py.locator(".tool-section").first.scroll_into_view_if_needed()
    shot(page, "code-copy-highlight")
    # 120 printed lines: collapsed, "Show all" opens them
    out = py.locator(".tool-result")
    until(page, "document.querySelector(\"details[data-tool='python'] .tool-result.collapsed\")")
    py.locator("button.expand").click()
    assert "collapsed" not in out.get_attribute("class") and "line 119" in out.inner_text()
    assert page.js_errors == []


def test_autoscroll_pill_uploads_new_chat_reuse_and_focus_order(server, page, tmp_path) -> None:
    llm = server.llm
    llm.clear()
    llm.add_text("\n\n".join(f"Paragraph {i} of a long answer." for i in range(80)))
    llm.add_text(" ".join(f"word{i}" for i in range(30)), chunks=30, delay_s=0.15)
    login(page, server)
    new_chat(page)
    ask(page, "Write a lot.")
    msgs = page.locator("#messages")
    until(page, "Math.abs(document.querySelector('#messages').scrollHeight - document.querySelector('#messages').scrollTop"
                " - document.querySelector('#messages').clientHeight) < 50")
    page.fill("#input", "And more, slowly.")
    page.press("#input", "Enter")
    until(page, "document.querySelectorAll('.msg.assistant').length === 2")
    msgs.evaluate("el => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    until(page, "!document.querySelector('#new-messages').hidden")  # new text came while reading back
    assert msgs.evaluate("el => el.scrollTop") < 50  # ...and the view stayed where the reader is
    shot(page, "new-messages-pill")
    wait_idle(page)
    page.click("#new-messages")
    assert msgs.evaluate("el => el.scrollHeight - el.scrollTop - el.clientHeight") < 50
    assert page.locator("#new-messages").is_hidden()

    # "+ New chat" twice: the empty chat is reused, none is left behind
    new_chat(page)
    before = page.evaluate("() => location.hash")
    count = page.evaluate("async () => (await (await fetch('/api/threads')).json()).length")
    page.click("#new-thread")
    page.wait_for_timeout(300)
    assert page.evaluate("() => location.hash") == before
    assert page.evaluate("async () => (await (await fetch('/api/threads')).json()).length") == count

    # upload messages stay until dismissed; a malformed CSV warns
    broken = tmp_path / "broken.csv"
    broken.write_text('a,b,c\n1,2,"3\n' + "4,5,6\n" * 200)
    page.set_input_files("#file-input", str(broken))
    until(page, "document.querySelector('#upload-text').textContent.includes('uploaded')")
    assert "Warning" in page.inner_text("#upload-text") and "only 1 row" in page.inner_text("#upload-text")
    page.wait_for_timeout(4500)  # the old 4 s timer would have hidden it by now
    assert page.locator("#upload-status").is_visible()
    shot(page, "upload-warning")
    page.click("#upload-dismiss")
    assert page.locator("#upload-status").is_hidden()

    # keyboard: Tab walks the page in order, and everything it reaches has a name
    page.click(".brand")  # the focus navigation starts at the top of the page
    names, ids = [], []
    for _ in range(120):
        if ids and ids[-1] == "send":
            break
        page.keyboard.press("Tab")
        info = page.evaluate("""() => { const el = document.activeElement; if (!el || el === document.body) return null;
            const lab = el.labels && el.labels.length ? el.labels[0].textContent : '';
            return [el.id || el.tagName, (el.getAttribute('aria-label') || lab || el.textContent || el.title
                    || el.getAttribute('placeholder') || '').trim()]; }""")
        if info is None:
            continue
        ids.append(info[0])
        names.append(info[1])
    assert all(names), list(zip(ids, names))
    for a, b in [("open-artifacts", "new-thread"), ("new-thread", "rename-thread"), ("rename-thread", "input"),
                 ("upload-btn", "input"), ("input", "send")]:
        assert a in ids and b in ids and ids.index(a) < ids.index(b), list(zip(ids, names))
    assert page.js_errors == []


def test_narrow_drawer_dark_theme_and_used_login_link(server, browser) -> None:
    url = server.login_url()
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    try:
        page = ctx.new_page()
        page.goto(url)
        page.click("#login-confirm")
        page.wait_for_selector("#app-view:not([hidden])")
        # dark theme from the system setting
        bg = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        assert sum(int(x) for x in bg[bg.index("(") + 1:bg.index(")")].split(",")[:3]) < 150, bg
        # compact header: the messages get most of the 844 px
        height = page.evaluate("document.querySelector('#messages').getBoundingClientRect().height")
        assert height > 560, height
        shot(page, "narrow-dark")
        page.click("#toggle-sidebar")
        until(page, "document.body.classList.contains('sidebar-open')")
        page.wait_for_timeout(250)
        assert page.evaluate("document.querySelector('#sidebar').getBoundingClientRect().left") >= 0
        shot(page, "narrow-drawer-open")
        page.click("#close-sidebar")
        until(page, "!document.body.classList.contains('sidebar-open')")
        page.wait_for_timeout(250)
        assert page.evaluate("document.querySelector('#sidebar').getBoundingClientRect().right") <= 0
        assert page.evaluate("document.activeElement.id") == "toggle-sidebar"
        page.click("#toggle-sidebar")
        page.keyboard.press("Escape")
        until(page, "!document.body.classList.contains('sidebar-open')")
        shot(page, "narrow-drawer-closed")
    finally:
        ctx.close()
    # the same link again, in a fresh browser: a page that says why, with a way to log in
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        page = ctx.new_page()
        resp = page.goto(url)
        assert resp.status == 401
        assert page.inner_text("h1") == "This login link does not work"
        assert "already used" in page.inner_text("main")
        shot(page, "login-link-used")
        page.click("#login-again")
        page.wait_for_selector("#login-view:not([hidden])")
        assert page.locator("#login-secret").is_visible()
    finally:
        ctx.close()

