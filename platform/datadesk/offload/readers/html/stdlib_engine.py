"""An HTML `<table>` -> typed Arrow batches, by the standard library's `html.parser`.

`html.parser` only tokenizes: no script runs, no entity or URL is fetched, nothing is executed.
The text is fed 64 KiB at a time and finished rows are taken out after each piece, so memory
holds one batch of rows (and the text itself), never a tree of the document.

Which table: the first one. Tables after it with the same columns join it (a result paged into
several tables, as some servers print it); tables with other columns are not read, and the
metadata says which they were (a page of summaries, a legend: one artifact is one table).
Nested tables are flattened into the text of the cell that holds them.

- the header: the rows of `<thead>`, else the leading rows made of `<th>` cells only, else the
  first row when the rows below it show it is no data (as for CSV: `_first_row_is_header`),
  else column_1, column_2, ...; `colspan`/`rowspan` of header cells span the names, and two
  header rows give "Sales Q1" under "Sales";
- the rows: `<tbody>` rows (or any `<tr>`), short rows padded with nulls, a row longer than the
  header an error naming it; a body cell's `colspan` puts its value in its first column (nulls
  in the others: nothing is repeated into a sum), a `rowspan` repeats it down (a group label);
- `<tfoot>` (totals), `<caption>` and the text outside the table are the source's prose: a
  count or a cut said there ("showing first 32 rows") marks the result partial.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Iterator

import pyarrow as pa

from datadesk.offload.readers.base import Rest, SourceFacts
from datadesk.offload.readers.casts import text_column
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.errors import TabularParseError

_FEED_CHARS = 64 * 1024
_MAX_PROSE_CHARS = 4_000
_MAX_SPAN = 1_000  # a colspan/rowspan past this is a broken table, not a layout
_HEADER_SAMPLE = 200  # rows looked at to tell whether a table's first row is its header
_SKIP = {"script", "style", "head", "template", "noscript", "svg", "math", "object", "iframe"}
_TABLE_TAG = re.compile(r"<table[\s>/]", re.I)
_ROW_TAG = re.compile(r"<t[rdh][\s>/]", re.I)


@dataclass
class HtmlText:
    """A tool's text holding an HTML table, and the facts its prose and other tables go to."""

    text: str
    facts: SourceFacts


def find_table(text: str, max_lines: int = 20) -> int | None:
    """Where the first `<table>` opens (after at most `max_lines` lines), when rows follow it. Its
    line starts with a tag: a `<table>` inside a CSV cell or a sentence is text, not a table."""
    m = _TABLE_TAG.search(text, 0, 1 << 16)
    if m is None or text.count("\n", 0, m.start()) > max_lines or _ROW_TAG.search(text, m.end()) is None:
        return None
    before = text[text.rfind("\n", 0, m.start()) + 1:m.start()].lstrip()
    return m.start() if not before or before.startswith("<") else None


@dataclass
class _Row:
    table: int
    section: str  # "thead" | "tbody" | "tfoot" | ""
    line: int
    cells: list[tuple[str, int, int, bool]] = field(default_factory=list)  # (text, colspan, rowspan, th)


class _Tokens(HTMLParser):
    """Rows of the outermost tables, and the text around them, as the tokenizer meets them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: deque[_Row] = deque()
        self.prose: list[str] = []
        self._prose_chars = 0
        self.tables = 0
        self._depth = 0  # <table> nesting
        self._skip = 0
        self._section = ""
        self._row: _Row | None = None
        self._cell: list[str] | None = None
        self._span = (1, 1, False)
        self._caption: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self._skip += 1
            return
        if self._skip:
            return
        if tag == "table":
            self._depth += 1
            if self._depth == 1:
                self.tables += 1
                self._section = ""
            return
        if self._depth != 1:
            if tag == "br" and self._cell is not None:
                self._cell.append(" ")
            return
        if tag in ("thead", "tbody", "tfoot"):
            self._end_row()
            self._section = tag
        elif tag == "tr":
            self._end_row()
            self._row = _Row(self.tables, self._section, self.getpos()[0])
        elif tag in ("td", "th"):
            self._end_cell()
            if self._row is None:  # a cell outside any <tr>: its own row
                self._row = _Row(self.tables, self._section, self.getpos()[0])
            a = dict(attrs)
            self._cell = []
            self._span = (_span(a.get("colspan")), _span(a.get("rowspan")), tag == "th")
        elif tag == "caption":
            self._caption = []
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br" and self._cell is not None and not self._skip:
            self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self._skip = max(0, self._skip - 1)
            return
        if self._skip:
            return
        if tag == "table":
            if self._depth == 1:
                self._end_row()
                self._section = ""
            self._depth = max(0, self._depth - 1)
        elif self._depth != 1:
            return
        elif tag in ("td", "th"):
            self._end_cell()
        elif tag == "tr":
            self._end_row()
        elif tag in ("thead", "tbody", "tfoot"):
            self._end_row()
            self._section = ""
        elif tag == "caption" and self._caption is not None:
            self._add_prose(" ".join("".join(self._caption).split()))
            self._caption = None

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._cell is not None:
            self._cell.append(data)
        elif self._caption is not None:
            self._caption.append(data)
        elif self._depth == 0:
            for line in data.splitlines():
                self._add_prose(" ".join(line.split()))

    def _add_prose(self, text: str) -> None:
        if text and self._prose_chars < _MAX_PROSE_CHARS:
            self.prose.append(text[:_MAX_PROSE_CHARS - self._prose_chars])
            self._prose_chars += len(text)

    def _end_cell(self) -> None:
        if self._cell is not None and self._row is not None:
            colspan, rowspan, th = self._span
            self._row.cells.append((" ".join("".join(self._cell).split()), colspan, rowspan, th))
        self._cell = None

    def _end_row(self) -> None:
        self._end_cell()
        if self._row is not None and self._row.cells:
            self.rows.append(self._row)
        self._row = None

    def finish(self) -> None:
        self.close()
        self._end_row()


def prose_of(text: str) -> list[str]:
    """The text of an HTML text that holds no table, as the tokenizer reads it (no script)."""
    tokens = _Tokens()
    tokens.feed(text)
    tokens.finish()
    return tokens.prose


def _span(value: str | None) -> int:
    if value is None:
        return 1
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        return 1
    return min(max(n, 1), _MAX_SPAN)


def _header_names(rows: list[_Row]) -> list[str]:
    """The column names of header rows, spans expanded ("Sales" over "Q1", "Q2": "Sales Q1")."""
    grid: dict[tuple[int, int], str] = {}
    width = 0
    for r, row in enumerate(rows):
        c = 0
        for text, colspan, rowspan, _ in row.cells:
            while (r, c) in grid:
                c += 1
            for dr in range(min(rowspan, len(rows) - r)):
                for dc in range(colspan):
                    grid[(r + dr, c + dc)] = text
            c += colspan
            width = max(width, c)
    names = []
    for c in range(width):
        parts = [grid.get((r, c), "") for r in range(len(rows))]
        names.append(" ".join(dict.fromkeys(p for p in parts if p)))
    return names


def _first_row_is_header(rows: list[list[str | None]]) -> bool:
    """True unless the first row is data: a column typed below (numbers, dates) where the
    first row's cell has that type too (the rule `csv.header.csv_has_header` uses for CSV)."""
    if len(rows) < 2:
        return True
    width = len(rows[0])
    body = [r for r in rows[1:] if len(r) == width]
    for i in range(width):
        below = text_column(pa.array([r[i] for r in body], pa.string()))
        if pa.types.is_string(below.type) or pa.types.is_null(below.type):
            continue
        first = text_column(pa.array([rows[0][i]], pa.string()))
        return not (first.type == below.type or (pa.types.is_integer(first.type) and pa.types.is_floating(below.type)))
    return True


class _Body:
    """Body rows of one table placed on its columns: spans expanded, widths checked (`width`
    None: not known yet, rows are placed as they come)."""

    def __init__(self, width: int | None) -> None:
        self.width = width
        self.number = 0
        self._down: dict[int, tuple[int, str]] = {}  # column -> (rows still spanned, value)

    def place(self, row: _Row) -> list[str | None]:
        self.number += 1
        out: list[str | None] = []
        cells = iter(row.cells)
        c = 0
        pending = next(cells, None)
        while pending is not None or any(k >= c for k in self._down):
            if c in self._down:
                left, value = self._down[c]
                out.append(value)
                if left <= 1:
                    del self._down[c]
                else:
                    self._down[c] = (left - 1, value)
                c += 1
                continue
            if pending is None:
                out.append(None)
                c += 1
                continue
            text, colspan, rowspan, _ = pending
            if rowspan > 1:
                self._down[c] = (rowspan - 1, text)
            out.append(text)
            out.extend([None] * (colspan - 1))
            c += colspan
            pending = next(cells, None)
        return out if self.width is None else self.fit(out, row)

    def fit(self, out: list[str | None], row: _Row) -> list[str | None]:
        while len(out) > self.width and out[-1] in (None, ""):
            out.pop()  # empty cells past the header: nothing lost
        if len(out) > self.width:
            raise TabularParseError(f"HTML table {row.table}: row {self.number} (line {row.line}) has "
                                    f"{len(out)} cells but the header has {self.width} columns")
        return out + [None] * (self.width - len(out))


def _rows(tokens: _Tokens, text: str) -> Iterator[_Row]:
    """The rows of `text` as the tokenizer finishes them, fed 64 KiB at a time."""
    for pos in range(0, len(text), _FEED_CHARS):
        tokens.feed(text[pos:pos + _FEED_CHARS])
        while tokens.rows:
            yield tokens.rows.popleft()
    tokens.finish()
    yield from tokens.rows


class _Table:
    """The table being read: its columns, the rows waiting for them, the batch being filled."""

    def __init__(self, batch_rows: int) -> None:
        self.batch_rows = batch_rows
        self.names: list[str] | None = None
        self.cols: list[list[str | None]] = []
        self.sample: list[tuple[_Row, list[str | None]]] = []  # table 1 without a header row, so far
        self.body: _Body | None = None
        self.emitted = 0

    def open(self, names: list[str]) -> None:
        self.names = names
        self.cols = [[] for _ in names]
        self.body = _Body(len(names))

    def decide(self) -> Iterator[pa.RecordBatch]:
        """Table 1 had no header row: is its first row one (`_first_row_is_header`)?"""
        placed = [values for _, values in self.sample]
        width = max(len(v) for v in placed)
        padded = [v + [None] * (width - len(v)) for v in placed]
        header = _first_row_is_header(padded)
        body = self.body  # the spans carried so far
        self.open([c or "" for c in padded[0]] if header else [f"column_{i + 1}" for i in range(width)])
        body.width, self.body = width, body
        for row, values in self.sample[1 if header else 0:]:
            yield from self.add(body.fit(values, row))
        self.sample = []

    def add(self, values: list[str | None]) -> Iterator[pa.RecordBatch]:
        for col, v in zip(self.cols, values):
            col.append(v)
        if len(self.cols[0]) >= self.batch_rows:
            yield self.batch()

    def batch(self) -> pa.RecordBatch:
        arrays = [text_column(pa.array(c, pa.string())) for c in self.cols]
        self.cols = [[] for _ in self.cols]
        self.emitted += 1
        return pa.RecordBatch.from_arrays(arrays, names=unique_names(self.names))


def table_batches(source: HtmlText, batch_rows: int, rest: Rest | None = None) -> Iterator[pa.RecordBatch]:
    """The reader of the HTML attempt: typed batches of the first table (and those after it
    with the same columns); the prose, the footers and the other tables go to `source.facts`."""
    tokens = _Tokens()
    facts = source.facts
    out = _Table(batch_rows)
    current, state = 0, ""
    header: list[_Row] = []
    joined: list[int] = []  # the tables read: 1, and those after it with the same columns
    others: dict[int, list[_Row]] = {}
    for row in _rows(tokens, source.text):
        if row.section == "tfoot":  # totals, "showing 32 of 1,000": the source's words, not rows
            facts.prose.append(" | ".join(t for t, *_ in row.cells if t))
            continue
        if row.table != current:
            if state == "sample":
                yield from out.decide()
            current, state, header = row.table, "header", []
        if state == "header":
            if row.section == "thead" or all(th for *_, th in row.cells):
                header.append(row)
                continue
            if not joined:  # the first table read
                state = "body" if header else "sample"
                if header:
                    out.open(_header_names(header))
                else:
                    out.body = _Body(None)
                joined.append(current)
            elif header and _header_names(header) == out.names:
                state = "body"  # the same columns: it goes on where the first one ended
                out.body = _Body(len(out.names))
                joined.append(current)
            else:
                state = "other"
                others[current] = header
        if state == "other":
            others[current].append(row)
        elif state == "sample":
            out.sample.append((row, out.body.place(row)))
            if len(out.sample) >= _HEADER_SAMPLE:
                state = "body"
                yield from out.decide()
        else:
            if all(th for *_, th in row.cells) and [t for t, *_ in row.cells] == out.names:
                continue  # the header repeated down the table
            yield from out.add(out.body.place(row))
    if state == "sample":
        yield from out.decide()
    if out.names is None:
        if not header:
            raise TabularParseError("the HTML table has no rows" if tokens.tables else "no HTML table found")
        out.open(_header_names(header))  # a header and no rows: an empty table with its columns
    if out.cols[0] or not out.emitted:
        yield out.batch()
    facts.prose.extend(tokens.prose)
    if len(joined) > 1:
        facts.shape = f"HTML tables {', '.join(map(str, joined))} (the same columns, read as one)"
    if others:
        facts.envelope["other HTML tables (not read)"] = "; ".join(
            f"table {t}: {len(rows)} rows, the first: {' | '.join(c[0] for c in rows[0].cells[:8])[:120]!r}"
            for t, rows in list(others.items())[:10])
