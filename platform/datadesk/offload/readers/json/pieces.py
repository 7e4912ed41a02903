"""A JSON array of objects read by pyarrow's JSON reader, piece by piece on two threads.

The array is cut at separators between objects (`},\\n`, `},{`, `}, {`: the form found at
its head) into pieces of about `PIECE_BYTES`; each piece is wrapped as a JSON document
of its own, `{"r": [<piece>]}`, and parsed whole by pyarrow (one piece per thread, no
Python object per row). The pieces are typed and handed on in order as they are done,
so the Parquet writer encodes piece n while pieces n+1 and n+2 are parsed (issue 17:
parsing and writing overlap; memory holds a few pieces, not the result).

Why this never changes a value or reads invalid JSON as rows: every piece is parsed as
JSON, so a missing comma (`[{"a":1}{"a":2}]`) fails it. A cut at a "separator" that was
really inside a string leaves the piece with an unterminated string, which fails too.
When every piece is valid, each cut was a real separator and the pieces' objects are
exactly the array's. The column types are learnt from the first piece and enforced on
every other (`explicit_schema`; fields it did not have are inferred); a piece those types
do not fit is read again with only its timestamp strings enforced (integers that turn into
floats: the sink unifies the two). Whatever pyarrow cannot read exactly (a refused piece,
a number where text was, a new timestamp field, integers past 2^53) stops the stream
before that piece: `Records.broke` is set and the caller reads the rest, from
`Records.rows` on, with the exact row-by-row path; the sink unifies the types. Strings
pyarrow would read as timestamps are read as text and typed by our own casts
(`typed_table_strings`: dates, zones, microseconds).
"""

from __future__ import annotations

import mmap
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.json as pajson

from datadesk.offload.readahead import ordered_map
from datadesk.offload.readers.casts import typed_table_strings
from datadesk.offload.readers.columns import _has_empty_struct, _nesting

PIECE_BYTES = 2 << 20  # text per piece (about 12,000 rows of 8 columns)
FIRST_BYTES = 512 << 10  # the first piece, read before the others start (it teaches the types)
WORKERS = 2  # pieces parsed at once (pyarrow releases the GIL while it parses)
AHEAD = 4  # pieces parsed ahead of the one being handed on
_HEAD = 1 << 16
# separators between two objects, checked in this order; each starts with "},"
_SEPS = (b"},\n", b"},\r\n", b"},{", b"}, {")
_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
_MAX_SAFE = 2 ** 53


class Records:
    """The objects of one JSON array, as typed batches in order (see the module docstring)."""

    def __init__(self, body: Any, spans: Iterator[tuple[int, int]], first: pa.RecordBatch, schema: pa.Schema,
                 order: list[str], forced: set[str], exact: Callable[[pa.Table], bool]) -> None:
        self._body, self._spans, self._first, self._wrapped = body, spans, first, schema
        # only the strings read as text are enforced (a piece whose types differ: the sink unifies)
        self._loose = _wrapped(pa.schema([f for f in schema.field(0).type.value_type if f.name in forced]))
        self._order, self._forced, self._exact = order, forced, exact
        self.schema = first.schema  # of the first batch (later ones may widen a column)
        self.rows = 0  # objects handed on so far
        self.broke = False  # stopped before the end: the rest is read from `rows` on, exactly

    def batches(self) -> Iterator[pa.RecordBatch]:
        first, self._first = self._first, None
        if first is None:
            return
        self.rows += first.num_rows
        yield first
        for _, batch in ordered_map(self._piece, self._spans, WORKERS, AHEAD, name="offload-json"):
            if batch is None:
                self.broke = True
                return
            self.rows += batch.num_rows
            yield batch

    def _piece(self, span: tuple[int, int]) -> pa.RecordBatch | None:
        table = _parse(self._body, span, self._wrapped)
        if table is None:  # perhaps a column's type moved on (integers, then a float): let pyarrow infer
            table = _parse(self._body, span, self._loose)
        return None if table is None else _typed(table, self._order, self._forced, self._exact)


def open_records(body: Any, exact: Callable[[pa.Table], bool]) -> Records | None:
    """The array of objects `body` (str, bytes or a buffer) as typed batches in order, its first
    piece read now; None when it cannot be read this way (the caller reads it row by row)."""
    if isinstance(body, str) and not body.isascii():
        body = body.encode("utf-8")  # slices by byte offset below; an ASCII str is sliced as it is
    elif not isinstance(body, (str, bytes, mmap.mmap)):  # a mapped file is sliced as it is, piece by piece
        body = bytes(body)  # an Arrow buffer or a memoryview
    text = isinstance(body, str)
    start, end = body.find("[" if text else b"[") + 1, body.rfind("]" if text else b"]")
    if start <= 0 or end < start or _piece_bytes(body[start:start + 256]).lstrip()[:1] != b"{" \
            or _piece_bytes(body[end + 1:]).strip():
        return None
    head = _piece_bytes(body[start:start + _HEAD])
    sep = next((s for s in _SEPS if s in head), None)
    if sep is None and end - start > _HEAD:
        return None  # one huge object, or a separator of another form: the exact path
    spans = _spans(body, start, end, (sep.decode() if text else sep) if sep is not None else None)
    first_span = next(spans)
    sample = _parse(body, first_span, None)
    if sample is None or sample.num_rows == 0:
        return None
    forced = {f.name for f in sample.schema if pa.types.is_timestamp(f.type)}
    kept = [pa.field(f.name, pa.string()) if f.name in forced else f for f in sample.schema if _enforced(f.type)]
    wrapped = _wrapped(pa.schema(kept))
    first = _parse(body, first_span, wrapped)  # the first piece again, its timestamps as text
    typed = _typed(first, sample.column_names, forced, exact) if first is not None else None
    if typed is None:
        return None
    return Records(body, spans, typed, wrapped, sample.column_names, forced, exact)


def _spans(body: Any, start: int, end: int, sep: Any) -> Iterator[tuple[int, int]]:
    """(from, to) of each piece: about PIECE_BYTES (the first FIRST_BYTES), cut just after a
    separator's `}`."""
    pos, size = start, FIRST_BYTES
    while pos < end:
        stop = end
        if sep is not None and end - pos > size:
            cut = body.find(sep, pos + size, end)
            if cut >= 0:
                stop = cut + 1
        yield pos, stop
        pos, size = (stop + 1 if stop < end else end), PIECE_BYTES  # past the comma


def _parse(body: Any, span: tuple[int, int], wrapped: pa.Schema | None) -> pa.Table | None:
    """The objects of one piece as a table (None when it is not exactly a JSON list of objects)."""
    doc = b'{"r":[' + _piece_bytes(body[span[0]:span[1]]) + b"]}"
    parse = pajson.ParseOptions(explicit_schema=wrapped, unexpected_field_behavior="infer", newlines_in_values=True)
    try:
        table = pajson.read_json(pa.BufferReader(doc), read_options=pajson.ReadOptions(
            block_size=len(doc) + 64, use_threads=False), parse_options=parse)
    except _ERRORS:
        return None
    if table.num_rows != 1 or table.num_columns != 1 or not pa.types.is_list(table.schema.field(0).type):
        return None
    items = table.column(0).chunk(0)
    if items.null_count or not pa.types.is_struct(items.type.value_type):
        return None
    rows = items.flatten()
    if rows.null_count:  # a null in the array, not an object
        return None
    return pa.Table.from_arrays(rows.flatten(), names=[f.name for f in rows.type])


def _wrapped(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field("r", pa.list_(pa.struct(list(schema))))])


def _typed(table: pa.Table, order: list[str], forced: set[str],
           exact: Callable[[pa.Table], bool]) -> pa.RecordBatch | None:
    """One piece in the source's column order with its strings typed; None when it is not
    exact (the stream stops before it)."""
    if {f.name for f in table.schema if pa.types.is_timestamp(f.type)} - forced or not exact(table):
        return None  # a field the first piece lacked, typed by pyarrow at second precision; or inexact
    names = [n for n in order if n in table.column_names]
    names += [n for n in table.column_names if n not in set(names)]
    if names != table.column_names:
        table = table.select(names)
    table = typed_table_strings(table, forced)
    return table.combine_chunks().to_batches()[0] if table.num_rows else None


def _piece_bytes(part: Any) -> bytes:
    return part.encode("utf-8") if isinstance(part, str) else bytes(part)


def _enforced(t: pa.DataType) -> bool:
    """Types worth enforcing on every piece (nested and all-null fields are left to inference)."""
    return not (pa.types.is_null(t) or pa.types.is_nested(t))


def is_exact(table: pa.Table) -> bool:
    """False when pyarrow's result could differ from the JSON (big integers read as doubles,
    `{}` values, nesting Parquet cannot hold, duplicate names)."""
    import pyarrow.compute as pc

    if len(set(table.column_names)) != table.num_columns:
        return False
    for col in table.columns:
        t = col.type
        if _has_empty_struct(t) or _nesting(t) > 32:
            return False
        if pa.types.is_floating(t) and col.length() - col.null_count:
            top = pc.max(pc.abs(col)).as_py()
            if top is not None and top >= _MAX_SAFE:
                return False
    return True
