"""A JSON array of flat arrays (`[[1,"a",true],[2,"b",false]]`, the rows of `{columns, rows}`)
read by pyarrow's multithreaded CSV reader: no Python object per row (an engine of the JSON
attempt, `readers/__init__.py`).

Between the outer brackets the rows are `[...]` joined by `],[`; rewritten as newlines,
each row is a CSV line whose strings are quoted the way CSV quotes them. This is only
exact under conditions checked on the whole text, else None (the caller decodes the rows):
- no backslash (a JSON escape means something else in CSV);
- exactly one `[` per row plus the outer one, and one `],[` between each two rows (so no
  nested arrays, no brackets inside strings: every `],[` is a row boundary);
- the column types of a sample of decoded rows are plain (text, integer, number,
  boolean) and enforced on every row, so a later value of another kind fails the read;
- no text value starts with a quote, a space, `{` or `[` (a space before a quoted string,
  or an object, which CSV would have read as characters).
Text columns that are ISO dates / timestamps are then typed as JSON strings are.
"""

from __future__ import annotations

import io
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from datadesk.offload.readers.base import Rest
from datadesk.offload.readers.casts import json_strings, sql_typed
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.json.locate import JsonRows, decode, no_gc

_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
_BLOCK = 1 << 20
_BAD_START = r'^[" \[{]'


def array_batches(found: JsonRows, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch] | None:
    """The located rows of flat arrays as batches, or None: not arrays, or not exact this way."""
    if found.kind != "arrays":
        return None
    table = arrays_table(found)
    if table is None:
        return None
    out = table.to_batches(max_chunksize=batch_rows)
    return iter(sql_typed(out, found.types) if found.types is not None else out)


def arrays_table(found: JsonRows) -> pa.Table | None:
    """The located rows of flat arrays read whole by `read_rows`, or None: not exact this way."""
    if found.raw is None or not found.rows:
        return None
    with no_gc():
        sample = decode(b"[" + b",".join(bytes(r) for r in found.rows[:200]) + b"]")
    if not all(isinstance(r, list) for r in sample):
        return None
    width = len(found.names) if found.names is not None else len(sample[0])
    if width == 0 or any(len(r) != width for r in sample):
        return None  # ragged rows: the exact path pads them (or refuses them when strict)
    kinds = column_kinds(sample, width)
    if kinds is None:
        return None
    names = unique_names(found.names if found.names is not None else [f"{found.default_name}{i + 1}" for i in range(width)])
    return read_rows(found.raw, len(found.rows) + found.skipped, bool(found.skipped), kinds, names)


def column_kinds(sample: Sequence[Any], width: int) -> list[pa.DataType] | None:
    """The Arrow type of each column of the decoded sample rows (None: not plain enough)."""
    kinds: list[pa.DataType] = []
    for i in range(width):
        seen = {type(r[i]) for r in sample if i < len(r) and r[i] is not None}
        if seen == {str}:
            kinds.append(pa.string())
        elif seen == {int}:
            kinds.append(pa.int64())
        elif seen and seen <= {int, float}:
            kinds.append(pa.float64())
        elif seen == {bool}:
            kinds.append(pa.bool_())
        else:
            return None  # all null in the sample, mixed or nested: decoded row by row
    return kinds


def read_rows(body: Any, items: int, skip_first: bool, kinds: list[pa.DataType],
              names: list[str]) -> pa.Table | None:
    """The `items` rows of the array `body` (str, bytes or msgspec.Raw), the first one left
    out when `skip_first` (a header row), as a table with `names` and `kinds`; None when not
    exact this way."""
    if isinstance(body, str):
        body = body.encode("utf-8") if not body.isascii() else body
    elif not isinstance(body, bytes):
        body = bytes(body)
    text = isinstance(body, str)
    sep, nl, slash, bra = (("],[", "\n", "\\", "[") if text else (b"],[", b"\n", b"\\", b"["))
    if items < 1 or body.find(slash) >= 0 or body.count(bra) != items + 1 or body.count(sep) != items - 1:
        return None
    start = body.find(bra, body.find(bra) + 1) + 1  # the first row's own bracket
    end = body.rfind(sep[:1], 0, body.rfind(sep[:1]))  # the last row's closing bracket
    if start <= 0 or end < start:
        return None
    if skip_first:
        first = body.find(sep, start)
        if first < 0:
            return None
        start = first + len(sep)
    data = pa.PythonFile(TextBlocks(body, start, end, sep, nl), mode="r")  # rewritten as pyarrow reads
    convert = pacsv.ConvertOptions(column_types=dict(zip(names, kinds)), null_values=["null"],
                                   true_values=["true"], false_values=["false"], strings_can_be_null=True,
                                   quoted_strings_can_be_null=False)
    try:
        table = pacsv.read_csv(data, read_options=pacsv.ReadOptions(
            column_names=names, block_size=_BLOCK, use_threads=True), convert_options=convert,
            parse_options=pacsv.ParseOptions(double_quote=False, escape_char=False, newlines_in_values=False))
    except _ERRORS:
        return None
    if table.num_rows != items - (1 if skip_first else 0):
        return None
    arrays = []
    for col, kind in zip(table.columns, kinds):
        if pa.types.is_string(kind):
            col = col.combine_chunks()
            if len(col) and pc.any(pc.match_substring_regex(col, _BAD_START)).as_py():
                return None
            col = json_strings(col)
        arrays.append(col)
    return pa.Table.from_arrays(arrays, names=names)


class TextBlocks(io.RawIOBase):
    """`body[start:end]` as a readable stream of UTF-8 bytes, each separator rewritten as it is
    read: pyarrow parses one block while the next is prepared (no copy of the whole text)."""

    def __init__(self, body: Any, start: int, end: int, sep: Any, new: Any) -> None:
        super().__init__()
        self.body, self.pos, self.end, self.sep, self.new = body, start, end, sep, new
        self.carry = body[:0]
        self.keep = len(sep) - 1

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        if self.pos >= self.end and not self.carry:
            return b""
        stop = self.end if n is None or n < 0 else min(self.end, self.pos + max(n - len(self.carry), self.keep + 1))
        part = (self.carry + self.body[self.pos:stop]).replace(self.sep, self.new)
        self.pos = stop
        if stop < self.end and self.keep:  # a separator may straddle the cut: its start waits
            part, self.carry = part[:-self.keep], part[-self.keep:]
        else:
            self.carry = self.body[:0]
        return part.encode("utf-8") if isinstance(part, str) else part
