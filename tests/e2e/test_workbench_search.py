"""Finding and keeping work, in a real browser against the real server: search finds a word of an
old thread and opens it at the match (loading earlier records), the chat list groups by date, the
printed HTML export paginates (Chromium's print to PDF), and the demo's suggested questions run
the real flow with no LLM (a chart and a report)."""

from __future__ import annotations

import re
import time

import httpx
import msgspec
import pytest

from datadesk.domain.records import Record
from datadesk.store.layout import Layout
from datadesk.store.threads import ThreadStore
from tests.e2e.conftest import login, run_server, shot
from tests.e2e.test_web import new_chat, until, wait_idle

pytestmark = pytest.mark.browser

DAY = 86_400


def _thread(home, title: str, texts: list[str], days_ago: float = 0.0):
    """A thread of the admin written straight into the data dir (the index catches up at search)."""
    store = ThreadStore(Layout(home))
    thread = store.create("demo", "admin", title)
    ts = time.time() - days_ago * DAY
    for i, text in enumerate(texts):
        thread.append(lambda seq, t=text, i=i: Record(seq=seq, role="user" if i % 2 == 0 else "assistant",
                                                      ts=ts + i, content=t))
    thread.write_meta(msgspec.structs.replace(thread.reload(), updated=ts + len(texts), created=ts))
    return thread


def _pages(pdf: bytes) -> int:
    return len(re.findall(rb"/Type\s*/Page(?![s\w])", pdf))


def test_search_finds_an_old_thread_and_opens_it_at_the_match(server, page) -> None:
    texts = [f"routine reading number {i} for the weekly report" for i in range(700)]
    texts[49] = "the Zeppelinstrasse meter jumped overnight, worth a closer look"
    old = _thread(server.home, "Meter review (March)", texts, days_ago=30)
    _thread(server.home, "Budget week", ["nothing about meters here"] * 4, days_ago=3)
    login(page, server)
    # the chat list: groups by date, newest first
    groups = [g.title() for g in page.locator("#thread-list .thread-group").all_text_contents()]
    assert "Older" in groups and "Last 7 Days" in groups, groups
    assert groups.index("Last 7 Days") < groups.index("Older")
    page.fill("#thread-search", "zeppelinstr")
    hit = page.locator(".search-hit-link").first
    hit.wait_for()
    assert page.locator("#thread-list").is_hidden()
    assert page.locator(".search-thread .hit-title").first.inner_text() == "Meter review (March)"
    assert hit.locator("mark").inner_text().lower().startswith("zeppelinstr")
    shot(page, "search-results")
    hit.click()
    # the match (seq 50) is older than the newest 500 shown: earlier pages are loaded up to it
    until(page, f"location.hash === '#t={old.id}' && document.querySelector('#messages .search-hit')")
    target = page.locator("#messages .search-hit").first
    assert "Zeppelinstrasse" in target.inner_text() and target.get_attribute("data-seq") == "50"
    box, view = target.bounding_box(), page.locator("#messages").bounding_box()
    assert box["y"] >= view["y"] - 1 and box["y"] + box["height"] <= view["y"] + view["height"] + 1
    assert page.locator("#messages .load-earlier, #messages .thread-start").count() == 1
    shot(page, "search-opened-at-match")
    # Escape leaves the search: the chat list is back
    page.fill("#thread-search", "")
    page.press("#thread-search", "Escape")
    assert page.locator("#thread-list").is_visible()
    # a bad query says what is wrong
    page.fill("#thread-search", '"unclosed')
    page.press("#thread-search", "Enter")
    page.locator(".search-error").wait_for()
    assert "unbalanced" in page.inner_text(".search-error")
    assert not page.js_errors, page.js_errors


def test_printed_html_export_has_a_page_per_few_turns(server, page) -> None:
    turns = []
    for i in range(30):
        turns += [f"Question {i}: how did building B{i % 20 + 1:02d} do in week {i}?",
                  f"## Week {i}\n\nBuilding B{i % 20 + 1:02d} used **{1000 + i * 37:,} kWh**.\n\n"
                  "| day | kWh |\n|---|---|\n" + "".join(f"| d{d} | {100 + d * i} |\n" for d in range(7))]
    thread = _thread(server.home, "Thirty weeks", turns)
    login(page, server)
    # the Export menu of the open chat downloads each format under the chat's title
    page.click(f"#thread-list .thread-link[data-thread='{thread.id}']")
    until(page, f"location.hash === '#t={thread.id}'")
    page.click("#export-menu > summary")
    shot(page, "export-menu")
    for fmt, ext in (("md", "md"), ("ipynb", "ipynb"), ("zip", "zip")):
        if page.locator("#export-menu").get_attribute("open") is None:
            page.click("#export-menu > summary")
        with page.expect_download() as dl:
            page.click(f"#export-{fmt}")
        assert dl.value.suggested_filename == f"Thirty_weeks.{ext}", dl.value.suggested_filename
    r = page.request.get(f"{server.base}/api/threads/{thread.id}/export?format=html")
    assert r.ok and "sandbox" in r.headers["content-security-policy"]
    page.goto(f"{server.base}/api/threads/{thread.id}/export?format=html")
    page.wait_for_selector("section.turn")
    assert page.locator("section.turn").count() == 30
    shot(page, "export-html", full_page=False)
    pdf = page.pdf(format="A4", print_background=True)
    pages = _pages(pdf)
    # all 30 turns on paper, a few per page: not one clipped page, not a page per turn
    assert 5 <= pages <= 20, pages
    # the chat itself prints the page it shows, at most (the export is what paginates)
    assert b"Week 29" in pdf or pages > 1


def test_demo_suggested_questions_run_with_no_llm(tmp_path, browser) -> None:
    with run_server(tmp_path, llm=None) as demo:
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(demo.login_url("admin"))
            page.click("#login-confirm")
            page.wait_for_selector("#app-view:not([hidden])")
            page.set_default_timeout(60_000)
            assert "suggested questions run" in page.inner_text("#banner-demo")
            suggestions = page.locator(".demo-suggestions .suggestion")
            suggestions.first.wait_for()
            assert suggestions.count() == 4
            shot(page, "demo-suggestions")
            first = suggestions.nth(0).inner_text()
            suggestions.nth(0).click()
            until(page, "document.querySelectorAll('.msg.user').length === 1", 30)
            wait_idle(page)
            assert page.inner_text(".msg.user") == first
            until(page, "[...document.querySelectorAll('img.chart')].some(i => i.complete && i.naturalWidth > 0)", 60)
            report = page.locator(".file-link.report a.open-report, .file-link a").filter(has_text=".md").first
            assert report.count() == 1, page.inner_text("#messages")
            sql = page.locator("details.tool-card[data-tool='sql_query'] .tool-status").inner_text()
            assert "7,940 rows" in sql, sql
            answer = page.locator(".msg.assistant").last.inner_text()
            assert "kWh" in answer and re.search(r"\d{1,3}(,\d{3})+", answer), answer
            shot(page, "demo-analysis", full_page=False)
            # a second question in the same chat: the demo label is not repeated
            page.fill("#input", "Is anything unusual in the night-time consumption?")
            page.press("#input", "Enter")
            until(page, "document.querySelectorAll('.msg.user').length === 2", 30)
            wait_idle(page)
            assert "B07" in page.locator(".msg.assistant").last.inner_text()
            labels = page.locator(".msg.assistant", has_text="Demo model — no LLM is configured").count()
            assert labels == 1, labels
            # memory is on in the demo workspace: its panel shows no error
            page.click("#open-memory")
            page.wait_for_selector("#panel:not([hidden])")
            page.wait_for_timeout(500)
            assert page.locator("#panel-body .error").count() == 0, page.inner_text("#panel-body")
            shot(page, "demo-memory-panel")
            # the API says the same without a browser: the suggestions of the demo model
            token = demo.token("admin")
            me = httpx.get(f"{demo.base}/api/me", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
            assert len(me["model"]["suggestions"]) == 4 and me["model"]["suggestions"][0] == first
            assert not errors, errors
        finally:
            ctx.close()
