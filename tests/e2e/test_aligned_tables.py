"""Tables as readers see them (issue 32, item 4), in Chromium: a right-aligned Markdown column
renders right-aligned in an answer, in a report the code wrote and in the HTML export; a column
of numbers is right-aligned without a colon; a `data:` image in an HTML report shows (it was a
blank gap); the export for readers leaves out the tool plumbing. Light and dark, 390 and 1440 px."""

from __future__ import annotations

import base64
import io

import pytest

from tests.e2e.conftest import login, shot
from tests.e2e.test_web import ask, new_chat, until

pytestmark = pytest.mark.browser

ANSWER = ("Energy per building:\n\n| building | kWh | note |\n|:--|--:|:-:|\n| B01 | 1,234,567 | ok |\n"
          "| B07 | 89 | high |\n\nAnd the share:\n\n| building | share |\n|---|---|\n| B01 | 93.2% |\n| B07 | 6.8% |\n")


def _png() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 20), (31, 78, 121)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


REPORT_CODE = f"""\
open('/outputs/report.md', 'w').write('''# Report

| building | kWh |
|:--|--:|
| B01 | 1,234,567 |
| B07 | 89 |
''')
open('/outputs/page.html', 'w').write('<h1>Page</h1><p><img id="inline" alt="bar" src="data:image/png;base64,{_png()}"></p>')
print('written')
"""

ALIGN_OF = "(sel) => [...document.querySelectorAll(sel)].map(e => getComputedStyle(e).textAlign)"


def _aligns(page, selector: str) -> list[str]:
    return page.evaluate(ALIGN_OF, selector)


def test_right_aligned_columns_in_an_answer_a_report_and_the_export(server, browser, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_rep", "name": "python", "arguments": {"code": REPORT_CODE}}])
    llm.add_text(ANSWER)
    login(page, server)
    new_chat(page)
    ask(page, "Write the energy report")
    answer = page.locator(".msg.assistant.markdown").last
    answer.locator("table").first.wait_for()
    second = answer.locator("table").nth(1)
    cells = answer.locator("table").first.locator("tbody tr").first.locator("td")
    assert [cells.nth(i).evaluate("(e) => getComputedStyle(e).textAlign") for i in range(3)] == \
        ["left", "right", "center"]
    share = second.locator("tbody td").nth(1).evaluate("(e) => getComputedStyle(e).textAlign")
    assert share == "right"  # a column of numbers, no colon
    assert second.locator("tbody td").nth(0).evaluate("(e) => getComputedStyle(e).textAlign") in ("left", "start")
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for width in (390, 1440):
            page.set_viewport_size({"width": width, "height": 860})
            answer.scroll_into_view_if_needed()
            shot(page, f"aligned-table-answer-{scheme}-{width}")
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1280, "height": 860})
    tid = page.evaluate("() => new URLSearchParams(location.hash.slice(1)).get('t')")

    # the report the code wrote, opened from its card
    with page.context.expect_page() as opened:
        page.locator("a.open-report", has_text="report.md").click()
    report = opened.value
    report.wait_for_load_state()
    assert _aligns(report, "tbody td") == ["left", "right", "left", "right"]
    shot(report, "aligned-table-report")
    report.close()
    # an HTML report with a data: image: the image is there and decoded, not a blank gap
    with page.context.expect_page() as opened:
        page.locator("a.open-report", has_text="page.html").click()
    html_report = opened.value
    html_report.wait_for_load_state()
    img = html_report.locator("img")
    assert img.count() == 1 and (img.get_attribute("src") or "").startswith("data:image/png;base64,")
    assert img.evaluate("(i) => i.complete && i.naturalWidth") == 40
    shot(html_report, "report-data-image")
    html_report.close()

    # the printable export, and the one for readers
    export = page.context.new_page()
    export.goto(f"{server.base}/api/threads/{tid}/export?format=html")
    assert "right" in _aligns(export, "td")
    shot(export, "aligned-table-export", full_page=True)
    export.goto(f"{server.base}/api/threads/{tid}/export?format=html&audience=readers")
    text = export.locator("body").inner_text()
    assert "Write the energy report" in text and "Energy per building" in text
    assert "NOTICE" not in text and "/outputs/" not in text and "open(" not in text
    assert _aligns(export, "td")[:3] == ["left", "right", "center"]
    shot(export, "export-for-readers", full_page=True)
    export.close()
    until(page, "document.querySelector('#export-readers-html')")
    page.click("#export-menu summary")  # the links point at the thread on the menu's toggle event, a task later
    until(page, "document.querySelector('#export-readers-html').getAttribute('href') !== '#'")
    href = page.get_attribute("#export-readers-html", "href")
    assert href.endswith(f"/api/threads/{tid}/export?format=html&audience=readers"), href
    assert page.js_errors == []
