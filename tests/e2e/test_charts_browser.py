"""Charts in the browser (issue 32, part 1): a Vega-Lite chart from the kernel is drawn by the
vendored vega-embed under the app's CSP (no violation, no eval), shows a value on hover and
downloads as SVG, in light and dark; a matplotlib figure shows its dark-theme variant in dark
mode; the artifacts panel shows chart thumbnails with their titles. Screenshots at 390 and
1440 px, light and dark."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import login, open_page, shot
from tests.e2e.test_web import ask, new_chat, until

pytestmark = pytest.mark.browser

CODE = """\
from IPython.display import display
import matplotlib.pyplot as plt
display({"application/vnd.vegalite.v5+json": {
    "title": "Sales by region",
    "data": {"values": [{"region": "North", "sales": 1250000}, {"region": "South", "sales": 980000},
                        {"region": "East", "sales": 1730000}]},
    "mark": "bar",
    "encoding": {"x": {"field": "region", "type": "nominal"},
                 "y": {"field": "sales", "type": "quantitative"},
                 "color": {"field": "region", "type": "nominal"}}}}, raw=True)
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [1_000_000, 2_000_000, 1_500_000], label="kWh")
ax.legend()
ax.set_title("Energy per day")
plt.show()
"""

WATCH_CSP = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI + ' ' + (e.sourceFile || '')));
"""


def _prepare(ctx) -> None:
    ctx.add_init_script(WATCH_CSP)


def _chart_turn(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_chart", "name": "python", "arguments": {"code": CODE}}])
    llm.add_text("Here are the sales by region and the energy per day.")
    login(page, server)
    new_chat(page)
    ask(page, "Chart sales by region.")


def _check_chart(page, server, scheme: str) -> None:
    chart = page.locator("figure.vl-chart")
    chart.wait_for()
    until(page, "document.querySelector('figure.vl-chart.drawn svg.marks')", 30)
    assert page.locator("figure.vl-chart").get_attribute("data-theme") == scheme
    chart.scroll_into_view_if_needed()
    # hover the tallest bar (East, 1,730,000): vega-tooltip shows its value
    bars = page.locator("figure.vl-chart svg .mark-rect path")
    assert bars.count() == 3, bars.count()
    bars.nth(0).hover()
    tip = page.locator("#vg-tooltip-element.visible")
    tip.wait_for()
    text = tip.inner_text()
    assert "sales" in text and ("1,730,000" in text or "1,250,000" in text or "980,000" in text), text
    if scheme == "dark":
        assert "dark-theme" in (tip.get_attribute("class") or "")
    shot(page, f"chart-vegalite-hover-{scheme}-1440")
    if scheme == "light":
        _zoom_and_legend(page)
    # the actions menu: Download SVG gives an SVG file of the chart
    page.locator("figure.vl-chart .vega-embed summary").click()
    with page.expect_download() as dl:
        page.locator("figure.vl-chart .vega-actions a", has_text="SVG").click()
    path = dl.value.path()
    svg = open(path, encoding="utf-8").read()
    assert svg.lstrip().startswith("<svg") and "Sales by region" in svg, svg[:200]
    assert dl.value.suggested_filename == "sales-by-region.svg", dl.value.suggested_filename
    page.keyboard.press("Escape")
    # the matplotlib figure: the dark variant in dark mode (the browser picks the <source>)
    img = page.locator("picture.chart-picture img.chart")
    img.wait_for()
    until(page, "document.querySelector('picture.chart-picture img.chart').complete && "
                "document.querySelector('picture.chart-picture img.chart').naturalWidth > 0")
    current = img.evaluate("(el) => el.currentSrc")
    dark_src = page.locator("picture.chart-picture source").get_attribute("srcset")
    assert (current.endswith(dark_src) if scheme == "dark" else not current.endswith(dark_src)), (current, dark_src)
    assert img.get_attribute("alt") in ("Energy per day", "chart " + img.get_attribute("data-artifact"))


def _zoom_and_legend(page) -> None:
    """The wheel zooms the value axis; a click on a legend entry dims the other series."""
    labels = ("[...document.querySelectorAll('figure.vl-chart .role-axis-label text')]"
              ".map((t) => t.textContent).sort().join('|')")
    before = page.evaluate(f"() => {labels}")
    bar = page.locator("figure.vl-chart svg .mark-rect path").nth(1).bounding_box()
    at = (bar["x"] + bar["width"] / 2, bar["y"] + bar["height"] / 2)
    page.mouse.move(*at)
    page.mouse.wheel(0, -400)
    until(page, f"({labels}) !== {before!r}", 10)
    page.mouse.dblclick(*at)  # back to the full view
    until(page, f"({labels}) === {before!r}", 10)
    page.locator("figure.vl-chart .role-legend-label text", has_text="North").click()
    dimmed = ("[...document.querySelectorAll('figure.vl-chart .mark-rect path')]"
              ".filter((p) => p.getAttribute('opacity') === '0.15').length")
    until(page, f"{dimmed} === 2", 10)
    page.locator("figure.vl-chart .role-legend-label text", has_text="North").dblclick()


def _check_panel(page, scheme: str) -> None:
    page.click("#open-artifacts")
    thumbs = page.locator(".artifact img.chart-thumb")
    until(page, "document.querySelectorAll('.artifact img.chart-thumb').length === 2")
    names = page.locator(".artifact-name").all_inner_texts()
    assert any("Sales by region" in n for n in names) and any("Energy per day" in n for n in names), names
    until(page, "[...document.querySelectorAll('.artifact img.chart-thumb')]"
                ".every((i) => i.complete && i.naturalWidth > 0)", 30)
    assert thumbs.count() == 2
    shot(page, f"chart-artifacts-panel-{scheme}-1440")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_vega_lite_chart_hover_svg_download_and_thumbnails(server, browser, scheme) -> None:
    with open_page(browser, prepare=_prepare, accept_downloads=True, color_scheme=scheme) as page:
        page.set_viewport_size({"width": 1440, "height": 900})
        console = []
        page.on("console", lambda m: console.append(m.text))
        _chart_turn(server, page)
        _check_chart(page, server, scheme)
        _check_panel(page, scheme)
        page.set_viewport_size({"width": 390, "height": 844})
        page.keyboard.press("Escape")
        page.locator("figure.vl-chart").scroll_into_view_if_needed()
        shot(page, f"chart-vegalite-{scheme}-390")
        violations = page.evaluate("window.__csp")
        assert violations == [], violations
        assert not [m for m in console if "Content Security Policy" in m or "unsafe-eval" in m], console
        assert page.js_errors == []


def test_a_theme_switch_redraws_the_chart(server, browser) -> None:
    with open_page(browser, prepare=_prepare, color_scheme="light") as page:
        _chart_turn(server, page)
        until(page, "document.querySelector('figure.vl-chart.drawn')", 30)
        assert page.locator("figure.vl-chart").get_attribute("data-theme") == "light"
        page.emulate_media(color_scheme="dark")
        until(page, "document.querySelector('figure.vl-chart').dataset.theme === 'dark'", 15)
        assert page.evaluate("window.__csp") == []
