"""Tables drawn as text: Markdown, ASCII boxes (MySQL/prettytable, psql, Unicode box
drawing), fixed-width columns under a dashed rule, CSV/TSV with or without a header,
and any of these (or JSON) embedded in prose: a preamble, the table, a trailer.

`find_table(text)` says where the table is (`TextTable`: its kind, the lines before
and after it). Cells are cut by pyarrow string kernels over the whole column of
lines (`split_pattern`, `utf8_slice_codeunits`), then typed by `shapes_types`.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from datadesk.offload.readers.columns import TabularParseError, unique_names
from datadesk.offload.readers.casts import text_column

_MD_RULE = re.compile(r"\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*\Z")
_BOX_RULE = re.compile(r"\s*[+|├┌└╞╒╘╔╚╠╟┼┬┴─═╤╧╪┤┐┘╡╕╛╗╝╣╢\-=]+\s*\Z")
_PSQL_RULE = re.compile(r"\s*-+(\+-+)+\s*\Z")
_FIXED_RULE = re.compile(r"\s*-{2,}(\s+-{2,})+\s*\Z")
_PIPES = ("|", "│", "║", "┃")
_MAX_PROSE_LINES = 20
_BATCH_LINES = 65_536


@dataclass
class TextTable:
    """A table found in text: `kind`, its lines [start, end), and the prose around it."""

    kind: str  # markdown | box | psql | fixed | csv | tsv | json
    start: int
    end: int
    before: list[str]
    after: list[str]
    shape: str


def _is_box_rule(line: str) -> bool:
    s = line.strip()
    return len(s) >= 3 and s[0] in "+├┌└╞╒╘╔╚╠╟" and bool(_BOX_RULE.match(s))


def _pipe_line(line: str) -> bool:
    s = line.lstrip()
    return bool(s) and s[0] in _PIPES


def find_table(lines: list[str]) -> TextTable | None:
    """The first table in `lines` (after at most 20 lines of prose), or None."""
    n = len(lines)
    for k in range(min(_MAX_PROSE_LINES + 1, n)):
        line, nxt = lines[k], lines[k + 1] if k + 1 < n else ""
        kind = None
        if "|" in line and "-" in nxt and _MD_RULE.match(nxt) and "+" not in nxt:
            kind, shape = "markdown", "Markdown table"
        elif _is_box_rule(line) and _pipe_line(nxt):
            kind, shape = "box", "ASCII box table"
        elif "|" in line and _PSQL_RULE.match(nxt):
            kind, shape = "psql", "psql-style table"
        elif line.strip() and _FIXED_RULE.match(nxt):
            kind, shape = "fixed", "fixed-width table"
        elif line.lstrip()[:1] in ("[", "{"):
            kind, shape = "json", "JSON"
        if kind is not None:
            end = _block_end(lines, k, kind)
            if _prose_lines(lines[end:]) > _MAX_PROSE_LINES:
                return None  # a document with a table in it, not a table: it stays text
            return TextTable(kind, k, end, lines[:k], lines[end:], shape)
        delimited = _delimited_at(lines, k)
        if delimited is not None and (k == 0 or _header_like(lines[k], delimited[0])):
            kind, end = delimited
            return TextTable(kind, k, end, lines[:k], lines[end:], f"{kind.upper()} text")
    return None


def _prose_lines(lines: list[str]) -> int:
    count = 0
    for line in lines:
        if line.strip():
            count += 1
            if count > _MAX_PROSE_LINES:
                break
    return count


def _block_end(lines: list[str], k: int, kind: str) -> int:
    n = len(lines)
    if kind == "json":  # the last line that closes a JSON value, within the last 20 lines
        for end in range(n, max(k, n - _MAX_PROSE_LINES - 1), -1):
            if lines[end - 1].rstrip()[-1:] in ("]", "}"):
                return end
        return n
    if kind == "box":
        end = k + 2
        while end < n and (_pipe_line(lines[end]) or _is_box_rule(lines[end])):
            end += 1
        return end
    if kind == "markdown":  # outer pipes are optional in Markdown
        end = k + 2
        while end < n and "|" in lines[end]:
            end += 1
        return end
    end = k + 2
    while end < n and lines[end].strip() and not lines[end].lstrip().startswith("("):
        end += 1
    return end


def _delimited_at(lines: list[str], k: int) -> tuple[str, int] | None:
    """("csv"|"tsv", end) when lines from k on are delimited records (same field count)."""
    sample = lines[k:k + 6]
    if len(sample) < 2:
        return None
    for delim, kind in (("\t", "tsv"), (",", "csv")):
        counts = [_fields(s, delim) for s in sample]
        width = counts[0]
        if width >= 2 and all(c == width for c in counts[1:]):
            end = len(lines)
            tail = max(k + 2, end - _MAX_PROSE_LINES)
            while end > tail and (_fields(lines[end - 1], delim) != width or _is_note(lines[end - 1])):
                end -= 1
            return kind, end
    return None


def _header_like(line: str, kind: str) -> bool:
    """After prose, a delimited block must start with a header-like record (short names,
    no sentences), so that prose with a comma per line is not taken for a table."""
    try:
        cells = next(csv.reader([line], delimiter="\t" if kind == "tsv" else ","))
    except (csv.Error, StopIteration):
        return False
    return all(0 < len(c.strip()) <= 64 and ". " not in c for c in cells)


def _is_note(line: str) -> bool:
    """A trailer such as "(2 rows, more available)" or "Total: 3 rows", not a record."""
    s = line.strip()
    return (s.startswith("(") and s.endswith(")")) or s.endswith(":") or s.endswith(".")


def _fields(line: str, delim: str) -> int:
    if not line.strip():
        return 0
    try:
        return len(next(csv.reader([line], delimiter=delim)))
    except (csv.Error, StopIteration):
        return 0


# ------------------------------------------------------------------ cell cutting

def text_batches(lines: list[str], table: TextTable, batch_rows: int = _BATCH_LINES) -> Iterator[pa.RecordBatch]:
    """Typed batches of a Markdown / box / psql / fixed-width table."""
    block = lines[table.start:table.end]
    if table.kind == "fixed":
        header, rule, body = block[0], block[1], block[2:]
        spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
        names = [header[a:b if i + 1 < len(spans) else None].strip() for i, (a, b) in enumerate(spans)]
        cut = _fixed_cutter(spans)
    else:
        if table.kind == "box":
            rows = [ln for ln in block if _pipe_line(ln)]
        else:  # Markdown and psql: the header, its rule, the rows
            rows = block[:1] + block[2:]
        if not rows:
            raise TabularParseError(f"the {table.shape} has no header row")
        names = [c.strip() for c in _split_pipes(pa.array([rows[0]], pa.string()))[0].as_py()]
        body = rows[1:]
        cut = _split_pipes
    names = unique_names(names)
    emitted = False
    for i in range(0, len(body), batch_rows):
        part = pa.array(body[i:i + batch_rows], pa.string())
        cells = cut(part)
        yield _typed(cells, names, table, table.start + 2 + i)
        emitted = True
    if not emitted:
        yield pa.RecordBatch.from_arrays([pa.nulls(0) for _ in names], names=names)


def _split_pipes(arr: pa.Array) -> pa.Array:
    s = arr
    for ch in _PIPES[1:]:
        s = pc.replace_substring(s, ch, "|")
    s = pc.replace_substring(s, "\\|", "\x00")  # Markdown's escaped pipe stays in its cell
    return pc.split_pattern(_strip_one(pc.utf8_trim_whitespace(s)), "|")


def _strip_one(s: pa.Array) -> pa.Array:
    """Remove one leading and one trailing pipe (the table's outer border)."""
    starts = pc.starts_with(s, "|")
    s = pc.if_else(starts, pc.utf8_slice_codeunits(s, 1), s)
    ends = pc.ends_with(s, "|")
    return pc.if_else(ends, pc.utf8_slice_codeunits(s, 0, -1), s)


def _fixed_cutter(spans: list[tuple[int, int]]):
    def cut(arr: pa.Array) -> list[pa.Array]:
        cols = []
        for i, (a, b) in enumerate(spans):
            stop = spans[i + 1][0] if i + 1 < len(spans) else 1 << 30
            cols.append(pc.utf8_slice_codeunits(arr, a, stop))
        return cols
    return cut


def _typed(cells, names: list[str], table: TextTable, first_line: int) -> pa.RecordBatch:
    if isinstance(cells, list):  # fixed-width: already one array per column
        cols = cells
    else:
        widths = pc.list_value_length(cells)
        bad = pc.not_equal(widths, len(names))
        if pc.any(bad).as_py():
            at = pc.index(bad, True).as_py()
            got = widths[at].as_py()
            raise TabularParseError(f"{table.shape}: line {first_line + at + 1} has {got} cells but the header "
                                    f"has {len(names)}")
        cols = [pc.list_element(cells, i) for i in range(len(names))]
    arrays = [text_column(pc.replace_substring(c, "\x00", "|")) for c in cols]
    return pa.RecordBatch.from_arrays(arrays, names=names)


# ---------------------------------------------------------------- CSV header

def csv_has_header(sample: str, delimiter: str) -> bool:
    """False when the first record is data: some column is typed (numbers, dates, booleans)
    in the records below it and the first record's cell fits that type too."""
    records = [r for r in csv.reader(io.StringIO(sample), delimiter=delimiter) if r][:200]
    if len(records) < 2:
        return True
    width = len(records[0])
    body = [r for r in records[1:] if len(r) == width]
    if not body:
        return True
    for i in range(width):
        col = text_column(pa.array([r[i] for r in body], pa.string()))
        if pa.types.is_string(col.type) or pa.types.is_null(col.type):
            continue
        first = text_column(pa.array([records[0][i]], pa.string()))
        if first.type == col.type or (pa.types.is_integer(first.type) and pa.types.is_floating(col.type)):
            return False
        return True
    return True
