"""Safe HTML for the web UI: Markdown rendered on the server, then sanitized.

Everything shown as HTML in the browser passes through here: assistant text,
tool previews, reports. Nothing from the model, a tool, an upload or the
kernel is trusted:
- markdown-it-py renders with raw HTML *disabled* (a `<script>` in the text
  becomes visible text, never a tag);
- nh3 then sanitizes the result against an allow-list (no scripts, styles,
  event handlers, forms or frames; links only http/https/mailto, opened with
  `rel="noopener noreferrer"`);
- images stay in the markup, but the page's Content-Security-Policy allows
  images only from the app itself and `data:` URIs, so a Markdown image that
  points at another host is never fetched (it cannot leak data).

HTML reports written by code are sanitized with the same allow-list (plus
headings, figures and inline images) and served from a sandboxed response.
"""

from __future__ import annotations

import base64
import html
import re
from functools import lru_cache
from typing import Callable

import nh3
from markdown_it import MarkdownIt

URL_SCHEMES = {"http", "https", "mailto"}
_TAGS = set(nh3.ALLOWED_TAGS) - {"area", "map"}
_ATTRS: dict[str, set[str]] = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "ol": {"start"},
    "code": {"class"},
}
_TABLE_LINE = re.compile(r"^\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


@lru_cache(maxsize=1)
def _md() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False, "typographer": False})
    return md.enable(["table", "strikethrough"])


def sanitize(fragment: str, *, img_src: Callable[[str], str | None] | None = None) -> str:
    """Sanitize an HTML fragment; `img_src` may rewrite (or drop, returning None) image sources."""

    def attr_filter(tag: str, attr: str, value: str) -> str | None:
        if tag == "code" and attr == "class":
            return value if re.fullmatch(r"language-[A-Za-z0-9_+-]{1,30}", value) else None
        if tag == "img" and attr == "src" and img_src is not None:
            return img_src(value)
        return value

    return nh3.clean(fragment, tags=_TAGS, attributes=_ATTRS, url_schemes=URL_SCHEMES,
                     link_rel="noopener noreferrer", attribute_filter=attr_filter, strip_comments=True)


def markdown_html(text: str, *, img_src: Callable[[str], str | None] | None = None) -> str:
    """Markdown (as a model writes it) to sanitized HTML."""
    if not text:
        return ""
    return sanitize(_md().render(text), img_src=img_src)


def tool_html(content: str) -> str:
    """A tool result for a tool card: a preview with a Markdown table is rendered (the table becomes
    a real table, the notice lines stay lines); anything else is shown verbatim, escaped."""
    lines = content.splitlines()
    has_table = any(_TABLE_LINE.match(a) and _TABLE_RULE.match(b) for a, b in zip(lines, lines[1:]))
    if has_table:
        return markdown_html(content)
    return f"<pre>{html.escape(content)}</pre>"


def data_uri(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


REPORT_CSS = """
body{font:15px/1.55 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2430;max-width:58rem;margin:2rem auto;
padding:0 1.25rem}
h1,h2,h3{line-height:1.25}
table{border-collapse:collapse;margin:1rem 0;font-size:.9em}
th,td{border:1px solid #c9d0da;padding:.3rem .55rem;text-align:left;vertical-align:top}
th{background:#eef2f7}
img{max-width:100%;height:auto}
pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
pre{background:#f4f6f9;padding:.75rem;overflow:auto}
.dd-report-bar{font-size:.8em;color:#5c6778;border-bottom:1px solid #dde3ea;margin-bottom:1.5rem;padding-bottom:.5rem}
@media print{.dd-report-bar{display:none}body{margin:0;max-width:none}}
"""


def report_page(title: str, body_html: str, note: str = "") -> str:
    """A standalone printable page around sanitized report HTML (served with CSP `sandbox`)."""
    bar = f'<div class="dd-report-bar">{html.escape(note)}</div>' if note else ""
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<style>{REPORT_CSS}</style></head><body>{bar}<main>{body_html}</main></body></html>")
