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
    assert "<td>1</td>" in out and '<code class="language-sql">' in out
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
