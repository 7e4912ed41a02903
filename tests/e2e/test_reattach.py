"""Detached turns in a real browser: a long python cell survives a reload and a closed tab, its
output shows in the card as it is printed, two tabs see one turn, and Stop from either tab ends
every card clearly (the local sandbox of the e2e server runs the cells)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import login, shot
from tests.e2e.test_web import new_chat, until, wait_idle

pytestmark = pytest.mark.browser


def long_cell(ticks: int, every_s: float = 1.0) -> str:
    return (f"import time\nfor i in range({ticks}):\n    print(f'tick {{i}}', flush=True)\n"
            f"    time.sleep({every_s})\nprint('all done')\n")


CARD = "details.tool-card[data-tool='python']"


def live_text(page) -> str:
    return page.evaluate(f"() => (document.querySelector(\"{CARD} .live-output\") || {{}}).textContent || ''")


def tid_of(page) -> str:
    return page.evaluate("() => new URLSearchParams(location.hash.slice(1)).get('t')")


def test_a_long_cell_survives_a_reload_and_its_output_continues_in_the_card(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_long", "name": "python", "arguments": {"code": long_cell(16)}}])
    llm.add_text("The long job printed **16 ticks**.")
    login(page, server)
    new_chat(page)
    page.fill("#input", "Run the long job")
    page.press("#input", "Enter")
    until(page, f"document.querySelector(\"{CARD}.running\")")
    until(page, f"(document.querySelector(\"{CARD} .live-output\") || {{}}).textContent?.includes('tick 2')", 30)
    assert "running" in page.inner_text(f"{CARD} .tool-status")
    page.reload()
    # re-attached: the card runs on (spinner, Stop), its output so far replayed and continuing
    page.wait_for_selector(f"{CARD}.running")
    page.wait_for_selector("#stop:not([hidden])")
    until(page, f"(document.querySelector(\"{CARD} .live-output\") || {{}}).textContent?.includes('tick 9')", 30)
    text = live_text(page)
    assert "tick 0" in text and "tick 1" in text
    assert " s" in page.inner_text(f"{CARD} .tool-status")  # elapsed seconds
    shot(page, "reattached-running-card")
    wait_idle(page)
    assert "16 ticks" in page.inner_text(".msg.assistant")
    card = page.locator(CARD)
    assert card.count() == 1 and card.get_attribute("data-state") == "done"
    assert "running" not in (card.get_attribute("class") or "")
    assert page.locator(".msg.user").count() == 1 and page.locator(".msg.assistant").count() == 1
    assert not page.js_errors


def test_close_the_tab_and_find_the_answer_later(server, browser) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_bg", "name": "python", "arguments": {"code": long_cell(5)}}])
    llm.add_text("Finished while you were away.")
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    page = ctx.new_page()
    login(page, server)
    new_chat(page)
    tid = tid_of(page)
    page.fill("#input", "Run it while I am away")
    page.press("#input", "Enter")
    until(page, f"document.querySelector(\"{CARD}.running\")")
    ctx.close()  # the tab is gone; the turn runs on
    token = server.token()
    with httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        deadline = time.time() + 60
        while c.get(f"/api/threads/{tid}").json()["thread"]["running"]:
            assert time.time() < deadline
            time.sleep(0.3)
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        page = ctx.new_page()
        login(page, server)
        page.goto(f"{server.base}/#t={tid}")
        page.wait_for_selector(".msg.assistant")
        assert "Finished while you were away" in page.inner_text(".msg.assistant")
        assert page.locator(CARD).get_attribute("data-state") == "done"
        assert "all done" in page.locator(f"{CARD} .tool-result").text_content()
    finally:
        ctx.close()


def test_two_tabs_see_one_turn_and_stop_from_the_other_tab_ends_the_card(server, browser) -> None:
    llm = server.llm
    llm.clear()
    llm.add_text(" ".join(f"word{i}" for i in range(30)), chunks=30, delay_s=0.1)
    llm.add_tool_calls([{"id": "call_stop", "name": "python", "arguments": {"code": long_cell(60, 0.5)}}])
    llm.add_text("not reached")
    a_ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    b_ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        a, b = a_ctx.new_page(), b_ctx.new_page()
        login(a, server)
        new_chat(a)
        tid = tid_of(a)
        login(b, server)
        b.goto(f"{server.base}/#t={tid}")
        until(b, f"location.hash === '#t={tid}' && document.querySelector('#messages .empty')")
        a.fill("#input", "Write something")
        a.press("#input", "Enter")
        # tab B, idle on the same thread, notices the turn and follows it
        until(b, "document.querySelector('.msg.assistant')?.textContent.includes('word5')", 20)
        wait_idle(a)
        until(b, "document.querySelector('.msg.assistant')?.textContent.includes('word29') && "
                 "!document.querySelector('#send').hidden", 20)
        # a long cell started in A, stopped from B: both cards end as cancelled
        a.fill("#input", "Run the long job")
        a.press("#input", "Enter")
        until(a, f"document.querySelector(\"{CARD}.running\")")
        until(b, f"document.querySelector(\"{CARD}.running\") && !document.querySelector('#stop').hidden", 20)
        b.click("#stop")
        for pg in (a, b):
            wait_idle(pg)
            until(pg, f"document.querySelector(\"{CARD}\")?.dataset.state === 'cancelled'", 20)
            assert pg.locator(f"{CARD}.running").count() == 0
            assert "cancelled" in pg.inner_text(f"{CARD} .tool-status")
        shot(b, "stopped-from-another-tab")
        a.reload()
        a.wait_for_selector(CARD)
        assert a.locator(CARD).get_attribute("data-state") == "cancelled"
        assert a.locator(f"{CARD}.running").count() == 0
    finally:
        a_ctx.close()
        b_ctx.close()


def test_a_cell_past_its_deadline_ends_as_timed_out_live_and_after_a_reload(server, page) -> None:
    llm = server.llm
    llm.clear()
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
    llm.add_tool_calls([{"id": "call_slow", "name": "python", "arguments": {"code": code, "timeout_s": 2}}])
    llm.add_text("The cell ran out of time.")
    login(page, server)
    new_chat(page)
    page.fill("#input", "Run the slow cell")
    page.press("#input", "Enter")
    until(page, f"document.querySelector(\"{CARD}.running\")")
    wait_idle(page)
    card = page.locator(CARD)
    assert card.get_attribute("data-state") == "timed-out"
    assert "timed out" in card.locator(".tool-status").inner_text()
    page.reload()
    page.wait_for_selector(CARD)
    assert page.locator(CARD).get_attribute("data-state") == "timed-out"
    assert page.locator(f"{CARD}.running").count() == 0
