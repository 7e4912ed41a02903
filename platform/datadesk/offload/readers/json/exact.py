"""JSON rows decoded by msgspec into Python values and typed column by column by our rules:
the exact reader of the JSON attempt (`readers/__init__.py`), for what pyarrow's engines do
not read exactly. No value is lost or changed: a column pyarrow cannot type becomes text.
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa

from datadesk.offload.readers.casts import python_column, sql_typed
from datadesk.offload.readers.columns import records_to_batch, unique_names
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.json.locate import JsonRows, decode, no_gc


def batches(found: JsonRows, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of the located rows: a dict of column lists, rows of arrays or of objects
    (`batch_rows` at a time), with the source's SQL types when it named them."""
    if found.kind == "columnar":
        names = unique_names(found.names or [])
        with no_gc():
            arrays = [python_column(c) for c in found.rows]
        yield pa.RecordBatch.from_arrays(arrays, names=names)
        return
    if not found.rows:
        if found.names:
            yield pa.RecordBatch.from_arrays([pa.nulls(0) for _ in found.names], names=unique_names(found.names))
        return
    for start in range(0, len(found.rows), batch_rows):
        chunk = found.rows[start:start + batch_rows]
        if found.kind == "records":
            out = [_records_batch(chunk)]
        else:
            out = _arrays_chunk(chunk, found.names, start, found.default_name, found.strict)
        if found.types is not None:
            out = sql_typed(out, found.types)
        yield from out


def _records_batch(chunk: list[Any]) -> pa.RecordBatch:
    with no_gc():
        return records_to_batch(decode(b"[" + b",".join(bytes(r) for r in chunk) + b"]"))


def _arrays_chunk(chunk: list[Any], names: list[str] | None, start: int, default_name: str,
                  strict: bool) -> list[pa.RecordBatch]:
    with no_gc():  # millions of short-lived lists: the cyclic GC would rescan them again and again
        rows = decode(b"[" + b",".join(bytes(r) for r in chunk) + b"]")
        return [rows_batch(rows, names, start, default_name, strict)]


def rows_batch(rows: list[Any], names: list[str] | None, start: int = 0, default_name: str = "column_",
               strict: bool = False) -> pa.RecordBatch:
    """Positional rows (lists or tuples) -> a typed batch; short rows are padded with nulls."""
    lengths = set(map(len, rows)) if set(map(type, rows)) <= {list, tuple} else None
    if lengths is None:
        bad = next(i for i, r in enumerate(rows) if not isinstance(r, (list, tuple)))
        raise TabularParseError(f"row {start + bad + 1} is not an array of values like the rows before it")
    width = len(names) if names is not None else max(lengths, default=0)
    if max(lengths, default=0) > width:
        bad = next(i for i, r in enumerate(rows) if len(r) > width)
        raise TabularParseError(f"row {start + bad + 1} has {len(rows[bad])} values but there are {width} columns")
    if lengths != {width} and strict:
        bad = next(i for i, r in enumerate(rows) if len(r) != width)
        raise TabularParseError(f"ragged rows: row {start + bad + 1} has {len(rows[bad])} values, not {width}")
    if lengths != {width}:
        rows = [list(r) + [None] * (width - len(r)) for r in rows]
    cols = list(zip(*rows)) if rows else [() for _ in range(width)]
    names = unique_names(names if names is not None else [f"{default_name}{i + 1}" for i in range(width)])
    if not names:
        raise TabularParseError("no columns")
    return pa.RecordBatch.from_arrays([python_column(list(c)) for c in cols], names=names)
