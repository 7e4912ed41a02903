"""Tables drawn in text (Markdown, ASCII boxes, psql, fixed-width) cut into cells by pyarrow's
string kernels over the whole column of lines (`split_pattern`, `utf8_slice_codeunits`): no
Python per cell. Cells are then typed by `casts.text_column`. Where the table is: `locate`.
"""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from datadesk.offload.readers.base import Rest
from datadesk.offload.readers.casts import text_column
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.text.locate import PIPES, TextTable, pipe_line

_BATCH_LINES = 65_536


class DrawnTable(NamedTuple):
    """A drawn table found in a tool's text: all its lines, and where the table is in them."""

    lines: list[str]
    table: TextTable


def drawn_batches(source: DrawnTable, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch]:
    """The reader of the drawn-table attempt: `text_batches` of the table found."""
    return text_batches(source.lines, source.table, batch_rows)


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
            rows = [ln for ln in block if pipe_line(ln)]
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
    for ch in PIPES[1:]:
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
