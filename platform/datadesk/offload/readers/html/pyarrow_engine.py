"""A plain HTML table cut into cells by one regular expression over a batch of rows at a time
(`re.findall` in C, then a column is every n-th cell) and cleaned by pyarrow's string kernels:
no Python per cell.

Plain: the text holds one `<table>` whose markup is only lower-case `thead`/`tbody`/`tfoot`/
`tr`/`th`/`td` tags, no `colspan`/`rowspan`, one header row (in `<thead>`, or a first row of
`<th>` cells) and every body row closing exactly as many cells: what generated HTML looks like
(pandas' `to_html`, tabulate, a server's template). Anything else answers None, and the
tokenizer (`stdlib_engine`) reads it, with its spans, nested tables and errors naming the row.
Both give the same table: cells with their white space collapsed and entities decoded, typed
by `casts.text_column`; the text outside the table and `<tfoot>` rows are the source's prose.
"""

from __future__ import annotations

import html
import re
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from datadesk.offload.readers.base import Rest
from datadesk.offload.readers.casts import text_column
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.html.stdlib_engine import HtmlText, prose_of

_PLAIN_TAGS = ("<td", "<th", "<tr", "<tbody", "<tfoot", "</t")  # ("<th" counts "<thead" too)
_SECTION = {name: re.compile(rf"<{name}\b[^>]*>(.*?)</{name}>", re.S) for name in ("thead", "tfoot")}
_TR = re.compile(r"<tr\b[^>]*>")
_CELL = re.compile(r"<t[dh][^>]*>([^<]*)</t[dh]>")  # (a plain cell holds no `<`)


def _text(cell: str) -> str:
    return html.unescape(" ".join(cell.split())) if "&" in cell else " ".join(cell.split())


def plain_batches(source: HtmlText, batch_rows: int, rest: Rest | None = None) -> Iterator[pa.RecordBatch] | None:
    """The first reader of the HTML attempt: batches of a plain table, or None (not plain)."""
    text = source.text
    start = text.find("<table")
    begin = text.find(">", start) + 1
    end = text.find("</table>", begin)
    if start < 0 or not begin or end < 0 or text.find("<table", end) >= 0:
        return None  # not one lower-case table
    region = text[begin:end]
    if "colspan" in region or "rowspan" in region or region.count("<") != sum(map(region.count, _PLAIN_TAGS)):
        return None  # spans; a `<` that opens no lower-case table tag: other markup, a comment, `<` in text
    head, foot = _SECTION["thead"].search(region), _SECTION["tfoot"].search(region)
    body = region
    for section in sorted((s for s in (head, foot) if s is not None), key=lambda m: -m.start()):
        body = body[:section.start()] + body[section.end():]
    rows = _TR.split(body)[1:]
    header = _TR.split(head.group(1))[1:] if head is not None else []
    if not header and rows and "<td" not in rows[0]:
        header = [rows.pop(0)]
    if len(header) != 1:
        return None  # no header row, or several (names spanned over two rows): the tokenizer's
    names = [_text(c) for c in _CELL.findall(header[0])]
    width = len(names)
    if not width or any(r.count("</td>") + r.count("</th>") != width or r.count("<td") + r.count("<th") != width
                        or "<td" not in r for r in rows):
        return None  # a ragged row (padded or refused, naming it), a header repeated down the table
    footer = [" | ".join(t for t in map(_text, _CELL.findall(r)) if t) for r in _TR.split(foot.group(1))[1:]] \
        if foot is not None else []
    return _batches(source, rows, unique_names(names), batch_rows, footer,
                    text[:start] + "\n" + text[end + len("</table>"):])


def _batches(source: HtmlText, rows: list[str], names: list[str], batch_rows: int, footer: list[str],
             outside: str) -> Iterator[pa.RecordBatch]:
    width = len(names)
    for i in range(0, len(rows), batch_rows):
        cells = _CELL.findall("".join(rows[i:i + batch_rows]))  # one pass in C; every row is `width` cells
        yield pa.RecordBatch.from_arrays([text_column(_clean(pa.array(cells[j::width], pa.string())))
                                          for j in range(width)], names=names)
    if not rows:
        yield pa.RecordBatch.from_arrays([pa.nulls(0) for _ in names], names=names)
    source.facts.prose.extend(footer)
    source.facts.prose.extend(prose_of(outside))


def _clean(col: pa.Array) -> pa.Array:
    """White space collapsed, entities decoded: only where a cell has them."""
    if pc.any(pc.match_substring_regex(col, r"\s\s|[\t\n\r\f]")).as_py():
        col = pc.utf8_trim_whitespace(pc.replace_substring_regex(col, r"\s+", " "))
    if pc.any(pc.match_substring(col, "&")).as_py():
        col = pa.array([html.unescape(v) if v is not None and "&" in v else v for v in col.to_pylist()], pa.string())
    return col
