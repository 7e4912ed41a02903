"""Issue 32's frictions in a real browser: search snippets read as rendered text, grouped by
chat; an upload names an untitled chat; Enter while another tab's turn runs says why; a saved
memory is one "Memory updated" chip that opens the Memory panel; the Context panel leads with
the analyst's view and links to the messages; icons are SVG (the pin was an emoji); each turn
shows its tokens and cost; the demo model off its script says what it can answer. Screenshots
(390 and 1440 px, light and dark) under tests/e2e/screenshots/."""

from __future__ import annotations

import time

import msgspec
import pytest

from datadesk.domain.records import Record
from datadesk.llm.demo_plans import SUGGESTED_QUESTIONS
from datadesk.store.layout import Layout
from datadesk.store.threads import ThreadStore
from tests.e2e.conftest import login, open_page, run_server, shot
from tests.fakes.openai_server import FakeOpenAIServer
from tests.e2e.test_web import ask, new_chat, until, wait_idle

pytestmark = pytest.mark.browser

PRICES = '[llm.prices."fake-model"]\ninput_per_mtok = 2.5\noutput_per_mtok = 10.0\n'


@pytest.fixture(scope="module")
def priced(tmp_path_factory):
    llm = FakeOpenAIServer().start()
    try:
        with run_server(tmp_path_factory.mktemp("frictions"), llm, extra_toml=PRICES) as srv:
            yield srv
    finally:
        llm.stop()


@pytest.fixture
def page(browser, priced):
    with open_page(browser, accept_downloads=True) as pg:
        yield pg


def _written(home, title: str, texts: list[str]) -> None:
    """A thread of the admin written straight into the data dir (search catches up)."""
    thread = ThreadStore(Layout(home)).create("demo", "admin", title)
    ts = time.time() - 3_600
    for i, text in enumerate(texts):
        thread.append(lambda seq, t=text, i=i: Record(seq=seq, role=("user", "assistant", "tool")[i % 3], ts=ts + i,
                                                      name="sql_query" if i % 3 == 2 else None, content=t))
    thread.write_meta(msgspec.structs.replace(thread.reload(), updated=ts + len(texts), created=ts))


def test_search_snippets_are_rendered_and_grouped_by_chat(priced, page) -> None:
    _written(priced.home, "Meter review", ["which meter is worst?", "The worst is **B07** at `1.98`.",
                                           "| meter | kwh |\n|---|---:|\n| B07 | 12 |"])
    _written(priced.home, "Budget week", ["is the meter in the budget?", "Yes, _B07_ is in it.",
                                          '{"meter": "B07", "ratio": 1.98}'])
    login(page, priced)
    page.fill("#thread-search", "B07")
    page.locator(".search-thread").first.wait_for()
    until(page, "document.querySelectorAll('.search-thread').length === 2")
    titles = page.locator(".search-thread > .hit-title").all_inner_texts()
    assert sorted(titles) == ["Budget week", "Meter review"]  # one title per chat
    review = page.locator(".search-thread", has_text="Meter review")
    assert review.locator(".search-hit-link").count() == 2  # its hits under it
    snippets = page.locator(".hit-snippet").all_inner_texts()
    assert all(s not in text for text in snippets for s in ("**", "`", '"', "|", "_B07_")), snippets
    assert any("meter: B07, ratio: 1.98" in t for t in snippets), snippets
    assert page.locator(".hit-snippet mark").first.inner_text() == "B07"
    shot(page, "frictions-search-1440-light") if page.set_viewport_size({"width": 1440, "height": 900}) is None else None
    page.emulate_media(color_scheme="dark")
    shot(page, "frictions-search-1440-dark")
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 390, "height": 844})
    page.click("#toggle-sidebar")
    shot(page, "frictions-search-390-light")
    assert not page.js_errors, page.js_errors


def test_upload_title_memory_chip_usage_context_and_icons(priced, page, tmp_path) -> None:
    llm = priced.llm
    llm.clear()
    llm.add_tool_calls([
        {"id": "call_rem", "name": "remember",
         "arguments": {"text": "Report energy in MWh", "kind": "preference", "user_asked": True}},
        {"id": "call_note", "name": "note_constraint",
         "arguments": {"text": "exclude holidays", "user_words": "exclude holidays"}},
    ], prompt_tokens=1_200, completion_tokens=40)
    llm.add_text("Noted: MWh, holidays excluded.", prompt_tokens=1_400, completion_tokens=60)
    login(page, priced)
    new_chat(page)
    csv = tmp_path / "meters 2024.csv"
    csv.write_text("meter,kwh\nB07,12\nB08,9\n")
    page.set_input_files("#file-input", str(csv))
    until(page, "document.querySelector('#thread-title').textContent === 'meters 2024.csv'")
    until(page, "[...document.querySelectorAll('#thread-list .thread-title')].some((e) => e.textContent === 'meters 2024.csv')")
    ask(page, "Please remember: report energy in MWh, and exclude holidays.")
    # one chip for the two calls, no plumbing cards
    chip = page.locator(".memory-chip")
    until(page, "document.querySelector('.memory-chip-text') && "
                "document.querySelector('.memory-chip-text').textContent === 'Memory updated'")
    assert chip.count() == 1
    assert not page.locator(".tool-card[data-tool='remember']").is_visible()
    assert not page.locator(".tool-card[data-tool='note_constraint']").is_visible()
    shown = page.inner_text("#messages")
    assert "remember done" not in shown and "note_constraint" not in shown, shown
    # tokens and cost per turn, and the chat's total
    until(page, "document.querySelector('.turn-usage')")
    line = page.locator(".turn-usage").last.inner_text()
    assert line == "2,600 tokens in · 100 out · $0.0075", line  # 2,600 × 2.5 + 100 × 10 per million
    assert page.inner_text("#thread-usage") == line
    # SVG icons, no emoji: the pin (on a question drawn from the log) and the page's buttons
    page.reload()
    page.wait_for_selector(".msg.user .pin-msg svg.icon")
    until(page, "document.querySelector('.turn-usage')")  # the figures come back with the log
    assert page.locator(".turn-usage").last.inner_text() == line and page.locator(".memory-chip").count() == 1
    assert page.locator("#upload-btn svg.icon, #panel-close svg.icon").count() == 2
    assert "📌" not in page.inner_text("#messages")
    shot(page, "frictions-chat-1440-light") if page.set_viewport_size({"width": 1440, "height": 900}) is None else None
    page.emulate_media(color_scheme="dark")
    shot(page, "frictions-chat-1440-dark")
    page.emulate_media(color_scheme="light")
    # the chip opens the Memory panel, with the fact
    chip.click()
    page.wait_for_selector("#panel[data-panel='memory'] .fact")
    assert "Report energy in MWh" in page.inner_text("#panel-body")
    # the Context panel leads with the analyst's view, the token tables below
    page.click("#open-context")
    page.wait_for_selector("#ctx-analyst #ctx-task-state li")
    order = page.evaluate("""() => ['#ctx-task-state', '#ctx-memory', '#ctx-data', '#ctx-regions']
        .map((s) => document.querySelector(s).getBoundingClientRect().top)""")
    assert order == sorted(order), order
    assert "exclude holidays" in page.inner_text("#ctx-task-state")
    assert "Report energy in MWh" in page.inner_text("#ctx-memory")
    assert "upload" in page.inner_text("#ctx-data")
    shot(page, "frictions-context-1440-light")
    page.locator("#ctx-task-state a.ctx-goto").first.click()  # to the message it was said in
    until(page, "document.querySelector('#messages .msg.user.search-hit')")
    page.emulate_media(color_scheme="dark")
    shot(page, "frictions-context-1440-dark")
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "frictions-context-390-light")
    page.click("#panel-close")
    assert page.locator(".memory-chip").is_visible() and page.locator(".turn-usage").last.is_visible()
    shot(page, "frictions-chat-390-light")
    assert not page.js_errors, page.js_errors


def test_enter_in_a_second_tab_while_a_turn_runs_says_why(priced, browser) -> None:
    llm = priced.llm
    llm.clear()
    llm.add_text("A slow answer " * 40, chunks=40, delay_s=0.25)
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        first, second = ctx.new_page(), ctx.new_page()
        for pg in (first, second):
            pg.set_default_timeout(30_000)
        login(first, priced)
        new_chat(first)
        tid = first.evaluate("() => location.hash.slice(3)")
        first.fill("#input", "a long question")
        first.press("#input", "Enter")
        first.wait_for_selector("#stop:not([hidden])")
        second.goto(f"{priced.base}/#t={tid}")
        second.wait_for_selector("#stop:not([hidden])")  # it follows the turn of the first tab
        second.fill("#input", "and another one")
        second.press("#input", "Enter")
        note = second.locator("#composer-note")
        note.wait_for()
        assert "another tab" in note.inner_text() and "Stop it or wait" in note.inner_text()
        assert second.input_value("#input") == "and another one"  # the text stays
        shot(second, "frictions-second-tab-1280")
        wait_idle(second)
        assert note.is_hidden()  # the reason goes with the turn
        wait_idle(first)
    finally:
        ctx.close()


def test_the_demo_off_its_script_says_what_it_can_answer(tmp_path, browser) -> None:
    with run_server(tmp_path, None) as demo, open_page(browser) as page:
        login(page, demo)
        new_chat(page)
        ask(page, "What should we do about the budget next quarter?")
        answer = page.locator(".msg.assistant").last.inner_text()
        for q in SUGGESTED_QUESTIONS:
            assert q in answer
        assert "DATADESK_LLM_BASE_URL" in answer
        assert page.locator(".tool-card").count() == 0  # no unrelated canned table
        shot(page, "frictions-demo-off-script")
        assert not page.js_errors, page.js_errors
