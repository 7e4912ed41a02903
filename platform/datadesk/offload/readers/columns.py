"""Python values (rows, records, one column) -> Arrow arrays, with per-column type inference.

Shared by the JSON, Excel and repr readers and the Parquet writer so that every source
gets the same rules: ints stay int64, floats float64, bools bool, ISO-8601
strings become date32/timestamp, nested values keep struct/list types, and
a column pyarrow cannot type (int + str, ...) falls back to text instead of
losing rows.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Sequence

import pyarrow as pa

from datadesk.offload.readers.errors import TabularParseError

# Parquet readers refuse schemas deeper than 100 nodes (and a list costs two
# nodes). Deeper values are kept as JSON text so the file stays readable.
_MAX_NESTING = 32

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                 OverflowError, ValueError, TypeError)


def unique_names(names: Sequence[Any]) -> list[str]:
    """Make column names non-empty and unique: `col`, `col_2`, `column_3`.

    An empty/None name at position i (0-based) becomes `column_{i+1}`;
    a repeated name gets the first free `_k` suffix (k >= 2).
    """
    out: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(names):
        name = "" if raw is None else str(raw).strip()
        if not name:
            name = f"column_{i + 1}"
        if name in seen:
            k = 2
            while f"{name}_{k}" in seen:
                k += 1
            name = f"{name}_{k}"
        seen.add(name)
        out.append(name)
    return out


def cell_text(value: Any) -> str | None:
    """Text form of one cell, used whenever a column has to become a string.

    JSON for containers and booleans (so a value from a JSON source reads the
    way it was written), ISO-8601 for dates/times, `str()` otherwise.
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=_json_default)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def _nesting(t: pa.DataType) -> int:
    """Parquet schema depth a type needs (lists cost two levels)."""
    if pa.types.is_struct(t):
        return 1 + max((_nesting(t.field(i).type) for i in range(t.num_fields)), default=0)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return 2 + _nesting(t.value_type)
    if pa.types.is_map(t):
        return 2 + max(_nesting(t.key_type), _nesting(t.item_type))
    return 0


def _has_empty_struct(t: pa.DataType) -> bool:
    """Parquet cannot store a struct without fields (e.g. from `{}` values)."""
    if pa.types.is_struct(t):
        return t.num_fields == 0 or any(_has_empty_struct(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_empty_struct(t.value_type)
    if pa.types.is_map(t):
        return _has_empty_struct(t.key_type) or _has_empty_struct(t.item_type)
    return False


def text_array(values: Sequence[Any]) -> pa.Array:
    """A string column from arbitrary Python values (see `cell_text`)."""
    return pa.array([cell_text(v) for v in values], type=pa.string())


def _first_valid(arr: pa.Array) -> Any:
    valid = arr.drop_null() if arr.null_count else arr
    return valid[0].as_py() if len(valid) else None


def temporal(arr: pa.Array) -> pa.Array | None:
    """date32, timestamp[us] or timestamp[us, UTC] when every string of `arr` is an ISO-8601
    date / datetime (naive, or all with a zone), else None: pyarrow's vectorised casts, never
    a regex per value. The first value decides which cast is worth trying; a column that
    mixes naive and zoned values, or has a 2024-02-30, fails the cast and stays text."""
    first = _first_valid(arr)
    if not isinstance(first, str) or not (10 <= len(first) <= 35) or first[4:5] != "-" or not first[:4].isdigit():
        return None
    zoned = first[-1:] == "Z" or (len(first) > 19 and first[-6:-5] in ("+", "-")) or first[-5:-4] in ("+", "-") \
        or first[-3:-2] in ("+", "-")
    naive, utc = pa.timestamp("us"), pa.timestamp("us", tz="UTC")
    targets = (pa.date32(),) if len(first) == 10 else (utc, naive) if zoned else (naive, utc)
    for target in targets:
        try:
            return arr.cast(target)
        except _ARROW_ERRORS:
            continue
    return None


def _typed_strings(values: Sequence[Any]) -> pa.Array:
    """Strings, or date32 / timestamp when every value is an ISO-8601 date(time)."""
    strings = pa.array(values, type=pa.string())
    typed = temporal(strings)
    return typed if typed is not None else strings


def nan_as_missing(values: Sequence[Any], kinds: set[type]) -> Sequence[Any]:
    """pandas marks a missing text, date or decimal with a float NaN: where the other values of
    a column are not numbers and every float is a NaN, those NaNs are nulls (else as they are)."""
    if float in kinds and kinds - {float, int, type(None)} and all(v != v for v in values if type(v) is float):
        return [None if type(v) is float else v for v in values]
    return values


def infer_array(values: Sequence[Any]) -> pa.Array:
    """One column's values -> the most faithful Arrow array that Parquet can hold.

    Never drops or nulls a value (but pandas' NaN for a missing text, `nan_as_missing`):
    anything pyarrow cannot type becomes text.
    """
    values = nan_as_missing(values, set(map(type, values)))
    non_null = [v for v in values if v is not None]
    if not non_null:
        return pa.nulls(len(values))
    if all(type(v) is str for v in non_null):
        return _typed_strings(values)
    # pyarrow refuses mixes such as int + str or int + bool (bool is an int
    # subclass in Python, but 0/1 would misreport the data): those become text.
    bools = sum(1 for v in non_null if type(v) is bool)
    if 0 < bools < len(non_null):
        return text_array(values)  # pyarrow would turn [1.5, True] into 1.0
    try:
        arr = pa.array(values)
    except _ARROW_ERRORS:
        return text_array(values)
    t = arr.type
    if _has_empty_struct(t) or _nesting(t) > _MAX_NESTING:
        return text_array(values)
    return arr


def rows_to_batch(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """Positional rows -> RecordBatch. Short rows are padded with nulls.

    Column names are made unique/non-empty first; a row longer than the
    header is an error (the caller decides how to name extra cells).
    """
    names = unique_names(columns)
    width = len(names)
    cols: list[list[Any]] = [[] for _ in range(width)]
    for r, row in enumerate(rows):
        n = len(row)
        if n > width:
            raise TabularParseError(f"row {r + 1} has {n} values but there are {width} columns")
        for i in range(n):
            cols[i].append(row[i])
        for i in range(n, width):
            cols[i].append(None)
    arrays = [infer_array(c) for c in cols]
    if not arrays:
        raise TabularParseError("no columns")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def records_to_batch(records: Sequence[dict]) -> pa.RecordBatch:
    """Dicts -> RecordBatch: columns in first-seen key order, missing keys null."""
    order: dict[str, None] = {}
    for rec in records:
        for key in rec:
            if key not in order:
                order[key] = None
    keys = list(order)
    if not keys:
        # Rows of `{}`: the row count is real even without columns; keep it
        # in a placeholder column rather than lose the rows.
        return pa.RecordBatch.from_arrays([pa.nulls(len(records))], names=["column_1"])
    arrays = [infer_array([rec.get(k) for rec in records]) for k in keys]
    return pa.RecordBatch.from_arrays(arrays, names=unique_names(keys))
