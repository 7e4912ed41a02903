"""Server-side Markdown rendering: the only HTML the web UI inserts comes from here."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from datadesk.api.render import markdown_html, report_page, sanitize, tool_html

ATTACKS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "<a href=\"javascript:alert(1)\">x</a>",
    "<iframe src=\"https://evil.example\"></iframe>",
    "<svg onload=alert(1)>",
    "<style>body{display:none}</style>",
    "<form action=https://evil.example><input name=a></form>",
    "![x](x\" onerror=\"alert(1))",
    "<details open ontoggle=alert(1)>",
]


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.found.append((tag, attrs))


def active_content(html: str) -> list[str]:
    """Elements or attributes that could run code or load a frame (what an XSS needs)."""
    parser = _Elements()
    parser.feed(html)
    bad = []
    for tag, attrs in parser.found:
        if tag in ("script", "iframe", "object", "embed", "svg", "style", "form", "input", "math"):
            bad.append(tag)
        for name, value in attrs:
            v = (value or "").strip().lower()
            if name.startswith("on") or name in ("style", "srcdoc"):
                bad.append(f"{tag}[{name}]")
            if name in ("href", "src") and not v.startswith(("http:", "https:", "mailto:", "#", "/")) and ":" in v:
                bad.append(f"{tag}[{name}={v[:20]}]")
    return bad


@pytest.mark.parametrize("text", ATTACKS)
def test_markdown_never_yields_active_content(text: str) -> None:
    out = markdown_html(text)
    assert active_content(out) == [], out
    # raw HTML from the model is shown as text
    if text.startswith("<"):
        assert "&lt;" in out


@pytest.mark.parametrize("text", ATTACKS)
def test_sanitize_strips_active_content_from_html_reports(text: str) -> None:
    assert active_content(sanitize(text)) == []


def test_markdown_renders_what_analysts_write() -> None:
    out = markdown_html("## Totals\n\n**190,560** rows\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```sql\nSELECT 1\n```\n"
                        "[docs](https://example.com)")
    assert "<h2>Totals</h2>" in out and "<strong>190,560</strong>" in out
    assert '<td class="dd-al-right">1</td>' in out and '<code class="language-sql">' in out
    assert 'href="https://example.com"' in out and 'rel="noopener noreferrer"' in out


def test_images_stay_for_the_csp_to_block_or_are_rewritten() -> None:
    assert 'src="http://other.example/x.png"' in markdown_html("![a](http://other.example/x.png)")
    out = markdown_html("![a](chart.png) ![b](http://other/x.png)",
                        img_src=lambda s: "data:image/png;base64,AAAA" if s == "chart.png" else None)
    assert 'src="data:image/png;base64,AAAA"' in out and "other/x.png" not in out


def test_tool_html_renders_preview_tables_and_escapes_the_rest() -> None:
    preview = ("[Result saved as artifact a1: the full data is NOT in this message.]\nrows: 3\n"
               "| x | note |\n|---|---|\n| 1 | <b>hi</b> |\nNOTICE: this is a preview")
    out = tool_html(preview)
    assert "<table>" in out and "&lt;b&gt;hi&lt;/b&gt;" in out and "<br" in out
    assert tool_html("<script>x</script>\nplain") == "<pre>&lt;script&gt;x&lt;/script&gt;\nplain</pre>"


def test_sanitize_keeps_report_structure_and_drops_script() -> None:
    out = sanitize('<h1 onclick="x()">R</h1><script>evil()</script><table><tr><td colspan="2">v</td></tr></table>')
    assert out == '<h1>R</h1><table><tbody><tr><td colspan="2">v</td></tr></tbody></table>'
    page = report_page("<r>", out, note="n")
    assert "<title>&lt;r&gt;</title>" in page and "@media print" in page


def test_table_alignment_is_kept_as_a_class_the_sanitizer_allows() -> None:
    out = markdown_html("| name | kwh | note |\n|:--|--:|:-:|\n| B07 | 1,234 | ok |")
    assert '<th class="dd-al-left">name</th>' in out and '<td class="dd-al-right">1,234</td>' in out
    assert '<td class="dd-al-center">ok</td>' in out and "style=" not in out


@pytest.mark.parametrize("cell", ["1,234", "-5.2%", "$3.4M", "(12)", "0.5", "1 234", "+7 pp", "€12bn"])
def test_a_column_of_numbers_is_right_aligned_without_a_colon(cell: str) -> None:
    out = markdown_html(f"| a | v |\n|---|---|\n| x | {cell} |\n| y | |\n| z | 3 |")
    assert f'<td class="dd-al-right">{cell}</td>' in out and "<td>x</td>" in out, out


@pytest.mark.parametrize("cell", ["B07", "2024-01-13", "12 kWh", "n/a", "1.2.3"])
def test_a_column_with_any_text_stays_left(cell: str) -> None:
    out = markdown_html(f"| v |\n|---|\n| 1 |\n| {cell} |")
    assert "<td>1</td>" in out and "dd-al-right" not in out, out


def test_a_class_a_report_writes_on_a_cell_is_dropped_unless_it_is_an_alignment() -> None:
    out = sanitize('<table><tr><td class="dd-al-right">1</td><td class="x hidden">2</td></tr></table>')
    assert '<td class="dd-al-right">1</td>' in out and "<td>2</td>" in out


PNG_URI = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def test_a_data_image_shows_in_markdown_and_in_an_html_report() -> None:
    assert f'src="{PNG_URI}"' in markdown_html(f"![chart]({PNG_URI})")
    assert f'src="{PNG_URI}"' in sanitize(f'<figure><img src="{PNG_URI}" alt="c"></figure>')


@pytest.mark.parametrize("html_in", [
    '<img src="data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=">',  # SVG can carry script
    '<img src="data:text/html;base64,PHNjcmlwdD4=">',
    '<a href="data:image/png;base64,iVBORw0KGgo=">x</a>',  # data: only as an image source
])
def test_a_data_url_that_is_no_raster_image_source_is_dropped(html_in: str) -> None:
    assert "data:" not in sanitize(html_in)


def test_a_data_image_past_the_cap_is_dropped(monkeypatch) -> None:
    from datadesk.api import render
    monkeypatch.setattr(render, "MAX_DATA_IMAGE_CHARS", len(PNG_URI) - 1)
    assert "data:" not in sanitize(f'<img src="{PNG_URI}">')
