"""Vertical records: a result printed one record per block, one `column: value` line per field,
as database shells print rows too wide for a line (and several MCP servers answer):

    *************************** 1. row ***************************    MySQL / MariaDB `\\G`
         id: 1
       name: ann
    2 rows in set (0.00 sec)

    -[ RECORD 1 ]-+-----                                               psql expanded (`\\x`)
    id   | 1
    name | ann

    Row 1:                                                             ClickHouse `Vertical`
    ──────
    id:   1

    1. row                                                             plain `N. row` blocks
    id: 1
    Result: 2 rows

`find_records(lines)` says where they start (after at most 20 lines of prose) and how they are
written; `record_batches` reads them: record 1 names the columns, every later record must have
the same ones (in any order; a record that lacks one or has another is an error naming the
record). A line of a record that is not `column: value` continues the value above it (a value
with a line break). The records end at the first line that opens none, after a blank line or at
a count or cut line (`notes.is_note`); what follows is the source's trailer, kept as prose.
Cells are typed by `casts.text_column`, as in every text table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from datadesk.offload.readers.base import Rest, SourceFacts
from datadesk.offload.readers.casts import text_column
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.text.notes import is_note

_MAX_PROSE_LINES = 20
_MAX_KEY_CHARS = 128
_STYLES = (  # (name, the line opening a record, the field delimiter)
    ("MySQL vertical records (\\G)", re.compile(r"\s*\*{3,}\s*(\d+)\.\s*row\s*\*{3,}\s*\Z", re.I), ":"),
    ("psql expanded records (\\x)", re.compile(r"\s*-\[\s*RECORD\s+(\d+)\s*\][-+─]*\s*\Z", re.I), "|"),
    ("vertical records (Row N:)", re.compile(r"\s*Row\s+(\d+)\s*:\s*\Z", re.I), ":"),
    ("vertical records (N. row)", re.compile(r"\s*(\d+)\.\s*row\s*:?\s*\Z", re.I), ":"),
)
_RULE = re.compile(r"\s*[─━═=\-]{3,}\s*\Z")  # ClickHouse's rule under "Row 1:"


@dataclass
class VerticalRecords:
    """Vertical records found in a tool's text: all its lines, where the first record opens, how
    they are written, and the facts the trailer after them is added to (as prose)."""

    lines: list[str]
    start: int
    shape: str
    opener: re.Pattern
    delimiter: str
    facts: SourceFacts | None = None


def find_records(lines: list[str]) -> VerticalRecords | None:
    """The first record's opening line (after at most 20 lines of prose) and its style, or None."""
    for k in range(min(_MAX_PROSE_LINES + 1, len(lines))):
        line = lines[k]
        if len(line) > 200 or not line.strip():
            continue
        for shape, opener, delimiter in _STYLES:
            if opener.match(line) and _has_field(lines, k + 1, delimiter):
                return VerticalRecords(lines, k, shape, opener, delimiter)
    return None


def _has_field(lines: list[str], i: int, delimiter: str) -> bool:
    if i < len(lines) and _RULE.match(lines[i]):
        i += 1
    return i < len(lines) and _split(lines[i], delimiter)[0] is not None


def _split(line: str, delimiter: str) -> tuple[str | None, str]:
    """(column, value) of a field line; (None, the rest) when it names no column: a line of
    text, or psql's continuation of a value (an empty column before the `|`)."""
    at = line.find(delimiter)
    if at < 0:
        return None, line
    key, value = line[:at].strip(), line[at + 1:]
    value = value[1:] if value.startswith(" ") else value
    if not key:
        return None, value
    if len(key) > _MAX_KEY_CHARS:
        return None, line
    return key, value


def record_batches(source: VerticalRecords, batch_rows: int, rest: Rest | None = None) -> Iterator[pa.RecordBatch]:
    """Typed batches of the records, `batch_rows` records each; the trailer goes to the facts.

    Records laid out as record 1 is (the same fields in the same order, one line each, the same
    lines between them: what a shell prints) are cut a batch at a time by list slicing and
    pyarrow (`_Layout`); from the first record that is not, they are read line by line."""
    i, emitted = source.start, False
    layout = _Layout.of(source)
    if layout is not None:
        for batch, i in layout.batches(source, batch_rows):
            emitted = True
            yield batch
    yield from _line_by_line(source, i, batch_rows, layout.names if layout else None, emitted)


def _record(source: VerticalRecords, i: int,
            names: list[str] | None) -> tuple[str | None, int, list[str], list[str], int, bool]:
    """The record whose opening line is `i`: (its number, `i`, keys, values, the line after it,
    whether every field was one line); None for the number when line `i` opens none."""
    lines, n = source.lines, len(source.lines)
    m = source.opener.match(lines[i])
    if m is None:
        return None, i, [], [], i, False
    number, opened = m.group(1), i
    i += 1
    if i < n and _RULE.match(lines[i]):
        i += 1
    keys: list[str] = []
    values: list[str] = []
    plain = True
    while i < n:
        line = lines[i]
        if not line.strip() or source.opener.match(line):
            break
        key, value = _split(line, source.delimiter)
        # "2 rows in set (0.00 sec)", "Result: 2 rows", after record 1 any words of a cut
        if not (names and key in names) and is_note(line, loose=names is not None):
            break
        if key:
            keys.append(key)
            values.append(value)
        elif values:  # a value with a line break (psql marks it with "+" and an empty column)
            above = values[-1].rstrip()
            if source.delimiter == "|":
                above = above.removesuffix("+").rstrip()
            values[-1] = above + "\n" + value.strip()
            plain = False
        else:
            raise TabularParseError(f"{source.shape}: record {number} (line {opened + 1}) does not start "
                                    f"with a `column{source.delimiter} value` line: {line.strip()[:80]!r}")
        i += 1
    return number, opened, keys, values, i, plain


def _line_by_line(source: VerticalRecords, i: int, batch_rows: int, names: list[str] | None,
                  emitted: bool) -> Iterator[pa.RecordBatch]:
    lines, n = source.lines, len(source.lines)
    while i < n and not lines[i].strip():
        i += 1
    index = {k: j for j, k in enumerate(names)} if names and len(set(names)) == len(names) else {}
    cols: list[list[str | None]] = [[] for _ in names] if names else []
    rows = 0
    while i < n:
        number, opened, keys, values, i, _ = _record(source, i, names)
        if number is None:
            break
        if names is None:
            names = keys
            if not names:
                raise TabularParseError(f"{source.shape}: record {number} (line {opened + 1}) has no fields")
            index = {k: j for j, k in enumerate(names)} if len(set(names)) == len(names) else {}
            cols = [[] for _ in names]
        _place(source, number, opened, keys, values, names, index, cols)
        rows += 1
        if rows % batch_rows == 0:
            yield _batch(cols, names)
            emitted = True
            cols = [[] for _ in names]
        while i < n and not lines[i].strip():  # blank lines between records
            i += 1
    if names is None:
        raise TabularParseError("no vertical records found")
    if cols[0] or not emitted:
        yield _batch(cols, names)
    if source.facts is not None:  # what the source wrote after the records: its count, its cut
        source.facts.prose.extend(ln.strip() for ln in lines[i:] if ln.strip())


@dataclass
class _Layout:
    """How record 1 is laid out, when records 1 and 2 are alike: `stride` lines from one record's
    opening line to the next one's, its field lines at `offsets`, each starting `prefixes`
    (the column, its padding and the delimiter, exactly as written), blank lines at `gaps`."""

    names: list[str]
    stride: int
    offsets: list[int]
    prefixes: list[str]
    gaps: list[int]

    @classmethod
    def of(cls, source: VerticalRecords) -> "_Layout | None":
        lines = source.lines
        number, opened, keys, _, after, plain = _record(source, source.start, None)
        if number is None or not keys or not plain or len(set(keys)) != len(keys):
            return None
        first = opened + 1 + (1 if opened + 1 < len(lines) and _RULE.match(lines[opened + 1]) else 0)
        nxt = after
        while nxt < len(lines) and not lines[nxt].strip():
            nxt += 1
        if nxt >= len(lines) or not source.opener.match(lines[nxt]):
            return None  # one record: nothing to gain
        offsets = list(range(first - opened, first - opened + len(keys)))
        prefixes = [lines[opened + o][:lines[opened + o].find(source.delimiter) + 1] for o in offsets]
        return cls(keys, nxt - opened, offsets, prefixes, list(range(after - opened, nxt - opened)))

    def batches(self, source: VerticalRecords, batch_rows: int) -> Iterator[tuple[pa.RecordBatch, int]]:
        """(batch, the line after it) for the records laid out like record 1, from the first one."""
        lines, n, s = source.lines, len(source.lines), self.stride
        i = source.start
        fields_end = self.offsets[-1] + 1
        while True:
            count = 0  # records from i opening where they should, with all their field lines there
            while count < batch_rows and i + count * s + fields_end <= n and source.opener.match(lines[i + count * s]):
                count += 1
            if count and not self._ends_well(lines, i + (count - 1) * s + fields_end, source):
                count -= 1  # the last one may go on (a value over two lines): line by line
            if count == 0:
                return
            block = lines[i:i + count * s]
            full = count == batch_rows  # more may follow: the last record's blank lines must be there too
            if any(ln.strip() for g in self.gaps for ln in block[g::s][:count if full else count - 1]):
                return
            arrays = []
            for offset, prefix in zip(self.offsets, self.prefixes):
                col = pa.array(block[offset::s][:count], pa.string())
                if not pc.all(pc.starts_with(col, prefix)).as_py():
                    return  # another order, a line more or less: line by line from here
                arrays.append(text_column(pc.utf8_slice_codeunits(col, len(prefix))))
            after = i + count * s if full else i + (count - 1) * s + fields_end
            yield pa.RecordBatch.from_arrays(arrays, names=unique_names(self.names)), after
            if not full:
                return
            i = after

    def _ends_well(self, lines: list[str], at: int, source: VerticalRecords) -> bool:
        """The line after a record's fields ends it: the end, a blank line, the next record, a note."""
        return at >= len(lines) or not lines[at].strip() or bool(source.opener.match(lines[at])) \
            or is_note(lines[at], loose=True)


def _place(source: VerticalRecords, number: str, opened: int, keys: list[str], values: list[str],
           names: list[str], index: dict[str, int], cols: list[list[str | None]]) -> None:
    """One record's values into the columns, checked against record 1's columns."""
    if keys == names:
        for col, value in zip(cols, values):
            col.append(value)
        return
    where = f"{source.shape}: record {number} (line {opened + 1})"
    if not index:
        raise TabularParseError(f"{where} has the columns {_list(keys)}, but record 1 has {_list(names)}")
    seen: dict[str, str] = {}
    for key, value in zip(keys, values):
        if key not in index:
            raise TabularParseError(f"{where} has a column {key!r} that record 1 does not have "
                                    f"(record 1 has {_list(names)})")
        if key in seen:
            raise TabularParseError(f"{where} has the column {key!r} twice")
        seen[key] = value
    missing = [k for k in names if k not in seen]
    if missing:
        raise TabularParseError(f"{where} lacks the column{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(repr(k) for k in missing[:5])} that record 1 has")
    for key, j in index.items():
        cols[j].append(seen[key])


def _list(keys: list[str]) -> str:
    shown = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
    return f"{len(keys)} ({shown})"


def _batch(cols: list[list[str | None]], names: list[str]) -> pa.RecordBatch:
    arrays = [text_column(pa.array(c, pa.string())) for c in cols]
    return pa.RecordBatch.from_arrays(arrays, names=unique_names(names))
