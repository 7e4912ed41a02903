"""Python step cards in the browser (issue 31, item 5): a failed step is shown open with its
error, live and after a reload; a file the step left empty is never offered (no "Report ... (0 B)"
link), and the card's result says why."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import login, shot
from tests.e2e.test_web import ask, new_chat, until

pytestmark = pytest.mark.browser

FAILING = """\
open('/outputs/report.md', 'w').close()
open('/outputs/notes.md', 'w').write('# notes')
print('before the failure')
raise ValueError('column kwh_total does not exist')
"""


def check_cards(page) -> None:
    py = page.locator("details.tool-card[data-tool='python']")
    py.wait_for()
    assert py.count() == 1
    until(page, "document.querySelector(\"details.tool-card[data-tool='python']\").open")
    assert py.get_attribute("data-state") == "error"
    result = py.locator(".tool-result.error")
    assert result.is_visible()
    text = result.inner_text()
    assert "ValueError" in text and "kwh_total does not exist" in text
    assert "report.md is empty (0 bytes)" in text
    links = page.locator(".tool-extras .file-link").all_inner_texts()
    assert any("notes.md" in t for t in links), links
    assert not any("report.md" in t for t in links), links
    assert not any("(0 B)" in t for t in links), links


def test_failed_python_card_is_open_and_an_empty_file_is_not_offered(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_fail", "name": "python", "arguments": {"code": FAILING}}])
    llm.add_text("The column does not exist.")
    login(page, server)
    new_chat(page)
    ask(page, "Total energy per building, please.")
    check_cards(page)
    # a successful step's card stays collapsed (the rule is for failures only)
    assert page.locator("details.tool-card[data-tool='sql_query'][open]").count() == 0
    shot(page, "python-failed-card-open")
    page.reload()
    check_cards(page)
    assert page.js_errors == []


SPINNING = """\
import time
print('step 1 of 3 done', flush=True)
print('step 2 of 3 done', flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_stopped_python_card_keeps_what_it_printed(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_spin", "name": "python", "arguments": {"code": SPINNING, "timeout_s": 120}}])
    llm.add_text("not reached")
    login(page, server)
    new_chat(page)
    page.fill("#input", "Run the long job.")
    page.press("#input", "Enter")
    py = page.locator("details.tool-card[data-tool='python']")
    py.wait_for()
    until(page, "(document.querySelector('.tool-card .live-output') || {}).textContent?.includes('step 2 of 3')", 60)
    page.click("#stop")
    page.wait_for_selector("#send:not([hidden])", timeout=60_000)
    until(page, "document.querySelector(\"details.tool-card[data-tool='python']\").dataset.state === 'cancelled'")
    kept = py.locator("pre.stopped-output")
    assert kept.count() == 1 and "step 1 of 3 done\nstep 2 of 3 done" in kept.text_content()
    page.reload()
    py.wait_for()
    until(page, "document.querySelector(\"details.tool-card[data-tool='python']\").dataset.state === 'cancelled'")
    text = py.locator(".tool-result").text_content()
    assert "printed before the stop" in text and "step 2 of 3 done" in text, text
    assert page.js_errors == []
