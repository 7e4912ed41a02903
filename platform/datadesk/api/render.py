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
  points at another host is never fetched (it cannot leak data). A `data:` URI
  is kept only as an image's source, only for a raster type (PNG, JPEG, GIF,
  WebP: never SVG, which can carry script), and only up to `MAX_DATA_IMAGE_CHARS`.

Tables keep their Markdown alignment (`:--`, `:-:`, `--:`) as a `dd-al-*` class on each cell
(the sanitizer drops inline styles), and a column without one whose body cells are all numbers
(`1,234`, `-5.2%`, `$3.4M`, `(12)`) is right-aligned, as a spreadsheet shows it.

Rendering is bounded: a text past `FULL_RENDER_CHARS` is shown as escaped plain
text (`<pre>`), and while an answer streams `LiveMarkdown` renders each finished
block once (cached) and only the open tail again; an open block past
`LIVE_BLOCK_CHARS` is shown as plain text until the answer completes.

Images in model or tool output may point only at `data:` URIs or (when the caller
allows it) this thread's artifact views: a relative or same-site URL such as
`/login?code=...` would make the victim's browser call the app (login CSRF).

HTML reports written by code are sanitized with the same allow-list (plus
headings, figures and inline images) and served from a sandboxed response.

Code (fenced blocks in Markdown, the SQL and Python of tool calls) is highlighted
here with Pygments into `<span class="pyg-…">` tokens: classes only (the page's CSP
allows no inline styles; app.css colours them), and the sanitizer keeps a span's
class only when it is one Pygments token class, so text can never style itself.
"""

from __future__ import annotations

import base64
import html
import json
import re
from functools import lru_cache
from typing import Callable, Iterable
from urllib.parse import unquote, urlsplit

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from datadesk.api.table_html import plain_table_html

URL_SCHEMES = {"http", "https", "mailto"}
_TAGS = set(nh3.ALLOWED_TAGS) - {"area", "map"}
_ATTRS: dict[str, set[str]] = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "td": {"colspan", "rowspan", "align", "class"},
    "th": {"colspan", "rowspan", "align", "scope", "class"},
    "ol": {"start"},
    "code": {"class"},
    "span": {"class"},
}
_TABLE_LINE = re.compile(r"^\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
FULL_RENDER_CHARS = 512 * 1024  # past this a text is shown as escaped plain text, not rendered
LIVE_BLOCK_CHARS = 64 * 1024  # while streaming, an open block past this is shown as plain text
HIGHLIGHT_CHARS = 100_000  # a longer code block stays plain (highlighting is linear but not free)
_TOKEN_CLASS = re.compile(r"pyg-[A-Za-z0-9]{1,4}")
_ALIGN_CLASS = re.compile(r"dd-al-(left|center|right)")
MAX_DATA_IMAGE_CHARS = 12 << 20  # one `data:` image in a page (about 9 MB of image); a larger one is dropped
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*", re.IGNORECASE)
# a number as a table cell shows it: sign, currency, separators, decimals, unit suffix, percent,
# or an accounting negative in parentheses
_NUMBER_CELL = re.compile(r"[(]?[-+−]?[$€£¥]?\s?\d[\d,'\u202f\u00a0 ]*(\.\d+)?\s?(%|[kKMBT]|bn|pp)?[)]?")
_LANGS = {"py": "python", "python3": "python", "ipython": "python", "postgresql": "postgresql", "psql": "postgresql",
          "duckdb": "sql", "sh": "bash", "shell": "bash", "js": "javascript", "yml": "yaml"}


@lru_cache(maxsize=1)
def _formatter() -> HtmlFormatter:
    return HtmlFormatter(nowrap=True, classprefix="pyg-")


def highlight_code(code: str, lang: str | None) -> str:
    """Code as HTML token spans (escaped text inside), or escaped plain text when the language
    is unknown or the code is very long. No wrapper: the caller puts it in <pre><code>."""
    name = _LANGS.get((lang or "").strip().lower(), (lang or "").strip().lower())
    if not name or len(code) > HIGHLIGHT_CHARS:
        return html.escape(code)
    try:
        lexer = get_lexer_by_name(name, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return html.escape(code)
    return highlight(code, lexer, _formatter())


def code_html(code: str, lang: str | None) -> str:
    """A highlighted code block (tool inputs: SQL, Python) as sanitized HTML."""
    safe_lang = re.sub(r"[^A-Za-z0-9_+-]", "", lang or "")[:30]
    cls = f' class="language-{safe_lang}"' if safe_lang else ""
    return sanitize(f"<pre><code{cls}>{highlight_code(code, lang)}</code></pre>")


def _cell_text(tokens: list, i: int) -> str:
    """The text of the table cell whose `*_open` token is at `i` (its inline token follows)."""
    nxt = tokens[i + 1] if i + 1 < len(tokens) else None
    return (nxt.content if nxt is not None and nxt.type == "inline" else "").strip()


def _align_tables(state) -> None:
    """markdown-it core rule: a cell's `style="text-align:…"` (dropped by the sanitizer) becomes a
    `dd-al-…` class; a column with no alignment whose body cells are all numbers is right-aligned."""
    tokens = state.tokens
    i = 0
    while i < len(tokens):
        if tokens[i].type != "table_open":
            i += 1
            continue
        end = next((j for j in range(i, len(tokens)) if tokens[j].type == "table_close"), len(tokens))
        rows: list[list[int]] = []  # per row, the indexes of its th/td open tokens
        body_from = None
        for j in range(i, end):
            t = tokens[j]
            if t.type == "tbody_open":
                body_from = len(rows)
            elif t.type == "tr_open":
                rows.append([])
            elif t.type in ("th_open", "td_open") and rows:
                rows[-1].append(j)
        body = rows[body_from:] if body_from is not None else []
        width = max((len(r) for r in rows), default=0)
        numeric = [bool(body) and all(not (text := _cell_text(tokens, r[c])) or _NUMBER_CELL.fullmatch(text)
                                      for r in body if c < len(r))
                   and any(c < len(r) and _cell_text(tokens, r[c]) for r in body) for c in range(width)]
        for r in rows:
            for c, j in enumerate(r):
                style = str(tokens[j].attrs.pop("style", "") or "")
                side = style.partition("text-align:")[2].strip() or ("right" if numeric[c] else "")
                if side in ("left", "center", "right"):
                    tokens[j].attrs["class"] = f"dd-al-{side}"
        i = end + 1


@lru_cache(maxsize=1)
def _md() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False, "typographer": False,
                                   "highlight": lambda code, lang, _attrs: highlight_code(code, lang)})
    md.enable(["table", "strikethrough"])
    md.core.ruler.push("dd_align_tables", _align_tables)
    return md


def _data_image_ok(tag: str, attr: str, value: str) -> bool:
    """A `data:` URL is allowed only as an image source, of a raster type, within the size cap."""
    return (tag == "img" and attr == "src" and len(value) <= MAX_DATA_IMAGE_CHARS
            and _DATA_IMAGE.fullmatch(value.strip()) is not None)


def sanitize(fragment: str, *, img_src: Callable[[str], str | None] | None = None) -> str:
    """Sanitize an HTML fragment; `img_src` may rewrite (or drop, returning None) image sources."""

    def attr_filter(tag: str, attr: str, value: str) -> str | None:
        if value.lstrip()[:5].lower() == "data:" and not _data_image_ok(tag, attr, value):
            return None  # `data:` passes the scheme check (below) for images only
        if tag in ("td", "th") and attr == "class":
            return value if _ALIGN_CLASS.fullmatch(value) else None
        if tag == "code" and attr == "class":
            return value if re.fullmatch(r"language-[A-Za-z0-9_+-]{1,30}", value) else None
        if tag == "span" and attr == "class":
            return value if _TOKEN_CLASS.fullmatch(value) else None
        if tag == "img" and attr == "src" and img_src is not None:
            return img_src(value)
        return value

    # "data" is a scheme nh3 lets through only so that `attr_filter` can keep raster images
    return nh3.clean(fragment, tags=_TAGS, attributes=_ATTRS, url_schemes=URL_SCHEMES | {"data"},
                     link_rel="noopener noreferrer", attribute_filter=attr_filter, strip_comments=True)


def artifact_view_url(aid: str) -> str:
    return f"/api/artifacts/{aid}/view"


def model_img_src(artifact_ids: Iterable[str] = ()) -> Callable[[str], str | None]:
    """The image rule for model/tool output: `data:` URIs and the view URLs of the given artifacts
    (this thread's) stay; any other relative URL, and an absolute one whose path names an app
    endpoint (`/login`, `/api/...`, on whatever host), is dropped: the browser would call the app
    with the victim's cookie (`img-src 'self'`). Other hosts stay for the CSP to block."""
    allowed = {artifact_view_url(a) for a in artifact_ids}

    def check(src: str) -> str | None:
        s = src.strip()
        if s[:5].lower() == "data:" or s in allowed:
            return s
        parts = urlsplit(s)
        if not parts.scheme and not s.startswith("//"):
            return None  # relative: this app
        path = unquote(parts.path).replace("\\", "/").lower()
        if re.match(r"/+(login|logout|api)\b", path):
            return None
        return s

    return check


def plain_html(text: str) -> str:
    """Text shown verbatim (escaped): the degraded view of a giant answer."""
    return f'<pre class="dd-plain">{html.escape(text)}</pre>' if text else ""


def markdown_html(text: str, *, img_src: Callable[[str], str | None] | None = None,
                  limit: int = FULL_RENDER_CHARS) -> str:
    """Markdown (as a model writes it) to sanitized HTML; past `limit` chars, escaped plain text.
    Images keep only `data:` sources unless `img_src` says otherwise."""
    if not text:
        return ""
    if len(text) > limit:
        return plain_html(text)
    if len(text) > LIVE_BLOCK_CHARS:  # a long text: block by block (bounded work and garbage per call)
        live = LiveMarkdown(img_src=img_src)
        live.feed(text)
        return live.render()
    return sanitize(_md().render(text), img_src=img_src or model_img_src())


class LiveMarkdown:
    """The HTML of an answer while it streams, bounded in cost per update: each finished block
    (text up to a blank line outside a code fence) is rendered once and cached; only the open
    tail is rendered again, and shown as plain text past `LIVE_BLOCK_CHARS`. Not thread-safe:
    one caller feeds and renders (rendering may run in a worker thread between feeds)."""

    def __init__(self, *, img_src: Callable[[str], str | None] | None = None,
                 block_limit: int = LIVE_BLOCK_CHARS) -> None:
        self.img_src = img_src  # may be replaced between renderings (new artifacts)
        self._limit = block_limit
        self._done: list[str] = []  # HTML of the finished blocks
        self._open = ""  # text after the last finished block
        self._scanned = 0  # offset in `_open` of the first line not yet scanned
        self._fence = False  # inside a code fence at `_scanned`
        self._ends: list[int] = []  # offsets in `_open` where a finished block ends

    def feed(self, text: str) -> None:
        self._open += text
        while (nl := self._open.find("\n", self._scanned)) >= 0:
            line = self._open[self._scanned:nl]
            if _FENCE.match(line):
                self._fence = not self._fence
            elif not self._fence and not line.strip():
                self._ends.append(nl + 1)
            self._scanned = nl + 1

    def _block(self, text: str) -> str:
        return markdown_html(text, img_src=self.img_src, limit=self._limit)

    def pending_chars(self) -> int:
        """How much text the next `render` renders: the blocks finished since the last one and
        the open tail."""
        return len(self._open)

    def render(self) -> str:
        """The HTML of everything fed so far."""
        start = 0
        for end in self._ends:
            if self._open[start:end].strip():
                self._done.append(self._block(self._open[start:end]))
            start = end
        if start:
            self._open = self._open[start:]
            self._scanned -= start
        self._ends.clear()
        return "".join(self._done) + self._block(self._open)


OFFLOAD_HEAD = "[Result saved as artifact "


def tool_html(content: str) -> str:
    """A tool result for a tool card: a preview with a Markdown table is rendered (the table becomes
    a real table, the notice lines stay lines); anything else is shown verbatim, escaped. An
    offloaded table shows the user its clean preview, and apart from it (`model-note`, which the UI
    collapses) the text the model received with it (where the data is, its notice)."""
    lines = content.splitlines()
    starts = [i for i, (a, b) in enumerate(zip(lines, lines[1:])) if _TABLE_LINE.match(a) and _TABLE_RULE.match(b)]
    if not starts:
        return f"<pre>{html.escape(content)}</pre>"
    if not content.startswith(OFFLOAD_HEAD):
        return markdown_html(content, limit=LIVE_BLOCK_CHARS)
    first = end = starts[0]
    while end < len(lines) and _TABLE_LINE.match(lines[end]):
        end += 1
    plain = plain_table_html(lines[first:end], _NUMBER_CELL)  # a data preview: no markdown-it needed
    table = (sanitize(plain, img_src=model_img_src()) if plain is not None
             else markdown_html("\n".join(lines[first:end]), limit=LIVE_BLOCK_CHARS))
    told = markdown_html("\n".join([*lines[:first], "*(the preview table above)*", *lines[end:]]),
                         limit=LIVE_BLOCK_CHARS)
    return f'<div class="preview-table">{table}</div><div class="model-note">{told}</div>'


def data_uri(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


REPORT_CSS = """
body{font:15px/1.55 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2430;max-width:58rem;margin:2rem auto;
padding:0 1.25rem}
h1,h2,h3{line-height:1.25}
table{border-collapse:collapse;margin:1rem 0;font-size:.9em}
th,td{border:1px solid #c9d0da;padding:.3rem .55rem;text-align:left;vertical-align:top}
th{background:#eef2f7}
.dd-al-right{text-align:right;font-variant-numeric:tabular-nums}.dd-al-center{text-align:center}
img{max-width:100%;height:auto}
pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
pre{background:#f4f6f9;padding:.75rem;overflow:auto}
.dd-report-bar{font-size:.8em;color:#5c6778;border-bottom:1px solid #dde3ea;margin-bottom:1.5rem;padding-bottom:.5rem}
[class^="pyg-k"],.pyg-ow{color:#7a1fa2;font-weight:600}[class^="pyg-s"]{color:#0b6e2f}[class^="pyg-m"]{color:#a6460b}
[class^="pyg-c"]{color:#6a737d;font-style:italic}.pyg-nb,.pyg-nf{color:#1f5fbf}
@media print{.dd-report-bar{display:none}body{margin:0;max-width:none}}
"""


def report_page(title: str, body_html: str, note: str = "") -> str:
    """A standalone printable page around sanitized report HTML (served with CSP `sandbox`)."""
    bar = f'<div class="dd-report-bar">{html.escape(note)}</div>' if note else ""
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<style>{REPORT_CSS}</style></head><body>{bar}<main>{body_html}</main></body></html>")


_INPUT_KEYS = (("sql", "sql"), ("query", "sql"), ("code", "python"))


def tool_input_html(arguments: str | None) -> str | None:
    """The SQL or Python of a tool call (its `sql`, `query` or `code` argument) highlighted, or
    None when it has none of them (the UI shows the arguments as JSON)."""
    try:
        args = json.loads(arguments or "{}")
    except (ValueError, RecursionError):  # model-written: may be nested too deep to decode
        return None
    if not isinstance(args, dict):
        return None
    for key, lang in _INPUT_KEYS:
        if isinstance(args.get(key), str):
            return code_html(args[key], lang)
    return None
