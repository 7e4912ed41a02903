"""Column types by pyarrow's vectorised casts, over a whole column at a time.

Never a regex per value in Python: a column of strings is offered to pyarrow's
casts in order (integer, float, boolean, date, timestamp, timestamp with zone)
and keeps the first one every value survives; a cast that fails anywhere
leaves the column as text, so no value is ever lost or silently changed.

- `text_column`: cells of a text table (CSV, Markdown, ASCII box): all types.
- `json_strings`: JSON strings: only dates and timestamps (a JSON string
  "00123" is text on purpose; numbers in JSON are already numbers).
- `sql_cast`: a column the source described with a SQL type name
  (`columnTypes: ["DECIMAL(10,2)", "DATE", ...]`), cast to that type.
- `python_column`: decoded Python values (Decimal, date, datetime, UUID ...).
- `stream_typed`: a column keeps the type it had first in a stream, where that is lossless.
- `merge_type`, `unify_types`, `cast_for_union`: one type for a column seen with several
  (the Parquet writer unifies its segments by them; a reader joining pieces of a column too).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from datadesk.offload.readers.columns import infer_array, nan_as_missing, temporal, text_array

_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, ValueError, TypeError)
CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
_NULL_WORDS = pa.array(["", "NULL", "null", "None", "NaT", "<NA>", "N/A", "n/a"])
_BOOL_WORDS = pa.array(["true", "false", "True", "False", "TRUE", "FALSE"])
_TS_US = pa.timestamp("us")
_TS_UTC = pa.timestamp("us", tz="UTC")


def _is_str(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _try(arr: pa.Array, target: pa.DataType) -> pa.Array | None:
    try:
        return arr.cast(target)
    except _ERRORS:
        return None


def _any(mask: pa.Array) -> bool:
    return bool(pc.any(mask).as_py())


def json_strings(arr: pa.Array) -> pa.Array:
    """A string column from JSON: dates / timestamps typed, everything else kept as text."""
    if not _is_str(arr.type) or len(arr) == 0:
        return arr
    typed = temporal(arr)
    return typed if typed is not None else arr


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def text_column(arr: pa.Array) -> pa.Array:
    """Cells of a text table -> int64 / float64 / bool / date32 / timestamp / text.

    Cells are trimmed; empty cells and NULL / None / N/A are nulls. A column with
    a leading zero ("00123", a code) stays text, and so does any column one of whose
    values does not fit a type."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not _is_str(arr.type):
        return arr
    s = pc.utf8_trim_whitespace(arr)
    s = pc.if_else(pc.is_in(s, value_set=_NULL_WORDS), pa.scalar(None, pa.string()), s)
    if s.null_count == len(s):
        return pa.nulls(len(s))
    first = s.drop_null()[0].as_py() if s.null_count else s[0].as_py()
    # the first value says which casts are worth a pass over the column (a failed cast costs one)
    if _number(first) and not _any(pc.match_substring_regex(s, r"^[+-]?0\d")):
        targets = (pa.float64(),) if any(c in first for c in ".eEnN") else (pa.int64(), pa.float64())
        for target in targets:
            out = _try(s, target)
            if out is not None:
                return out
    if first in ("true", "false", "True", "False", "TRUE", "FALSE") and \
            pc.all(pc.is_in(s.drop_null(), value_set=_BOOL_WORDS)).as_py():
        return pc.equal(pc.utf8_lower(s), "true")  # nulls stay null
    typed = temporal(s)
    return typed if typed is not None else s


def local_numbers(arr: pa.Array, decimal: str, thousands: str) -> pa.Array:
    """A text column of numbers written with a decimal comma and/or a thousands separator
    (`1.234,56`, `1 234,56` with U+0020/U+00A0/U+202F, `1,234.5`) -> int64 or float64; as it is
    when any value is not such a number (nothing is changed silently)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not _is_str(arr.type) or len(arr) == 0:
        return arr
    s = pc.utf8_trim_whitespace(arr)
    s = pc.if_else(pc.is_in(s, value_set=_NULL_WORDS), pa.scalar(None, pa.string()), s)
    if s.null_count == len(s):
        return arr
    dec = re.escape(decimal)
    group = "[ \u00a0\u202f]" if thousands == " " else re.escape(thousands) if thousands else None
    grouped = rf"\d{{1,3}}(?:{group}\d{{3}})+" if group else None
    whole = rf"(?:{grouped}|\d+)" if grouped else r"\d+"
    if not pc.all(pc.match_substring_regex(s, rf"^[+-]?{whole}(?:{dec}\d+)?$")).as_py():
        return arr
    if group:
        s = pc.replace_substring_regex(s, group, "")
    has_fraction = _any(pc.match_substring(s, decimal))
    if decimal != ".":
        s = pc.replace_substring(s, decimal, ".")
    out = _try(s, pa.float64() if has_fraction else pa.int64())
    if out is None and not has_fraction:
        out = _try(s, pa.float64())  # past int64
    return out if out is not None else arr


_SQL_SIMPLE = {
    "BOOLEAN": pa.bool_(), "BOOL": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(),
    "INTEGER": pa.int32(), "INT": pa.int32(), "INT4": pa.int32(), "BIGINT": pa.int64(), "INT8": pa.int64(),
    "UTINYINT": pa.uint8(), "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(), "UBIGINT": pa.uint64(),
    "HUGEINT": pa.decimal128(38, 0), "REAL": pa.float32(), "FLOAT": pa.float32(), "FLOAT4": pa.float32(),
    "DOUBLE": pa.float64(), "FLOAT8": pa.float64(), "DOUBLE PRECISION": pa.float64(), "DATE": pa.date32(),
    "TIMESTAMP": _TS_US, "DATETIME": _TS_US, "TIMESTAMP WITH TIME ZONE": _TS_UTC, "TIMESTAMPTZ": _TS_UTC,
    "VARCHAR": pa.string(), "TEXT": pa.string(), "STRING": pa.string(), "UUID": pa.string(),
}
_DECIMAL = re.compile(r"(?:DECIMAL|NUMERIC)\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", re.I)


def sql_type(name: Any) -> pa.DataType | None:
    """The Arrow type for a SQL type name the source gave (None: unknown, keep inferred)."""
    if not isinstance(name, str):
        return None
    text = name.strip().upper()
    m = _DECIMAL.fullmatch(text)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if 0 < precision <= 38 and scale <= precision:
            return pa.decimal128(precision, scale)
        return None
    return _SQL_SIMPLE.get(text)


def sql_cast(arr: pa.Array, type_name: Any) -> pa.Array:
    """Cast a column to the SQL type the source named; unchanged when that is not possible."""
    target = sql_type(type_name)
    if target is None or arr.type == target:
        return arr
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), target)
    if _is_str(arr.type) or pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) \
            or pa.types.is_timestamp(arr.type) or pa.types.is_boolean(arr.type):
        if pa.types.is_floating(arr.type) and pa.types.is_decimal(target):
            # a float -> decimal cast rounds silently; go through the shortest repr text instead
            arr = pa.array([None if v is None else repr(v) for v in arr.to_pylist()], pa.string())
        out = _try(arr, target)
        return out if out is not None else arr
    return arr


_NONE = type(None)


def python_column(values: Sequence[Any]) -> pa.Array:
    """Decoded Python values -> the most faithful Arrow array.

    One C-speed pass (`set(map(type, values))`) decides the path; plain columns go straight
    to `pa.array` with their type, ISO-8601 strings are typed by the casts above, anything
    mixed or unusual takes the exact rules of `columns.infer_array` (never a lost value)."""
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    target = None
    cleaned = nan_as_missing(values, kinds)  # pandas' NaN for a missing text, date ...: a null
    if cleaned is not values:
        values = cleaned
        kinds.discard(float)
    if not kinds:
        return pa.nulls(len(values))
    if kinds == {str}:
        strings = pa.array(values, pa.string())
        typed = temporal(strings)
        return typed if typed is not None else strings
    if kinds == {int}:
        target = pa.int64()
    elif kinds <= {int, float}:
        target = pa.float64()
    elif kinds == {bool}:
        target = pa.bool_()
    elif kinds == {list}:  # tagged values of a Python repr, or nested lists: pyarrow types them
        try:
            return pa.array(values)
        except _ERRORS:
            return infer_array(values)
    if target is not None:
        try:
            return pa.array(values, target)
        except _ERRORS:
            pass
    return infer_array(values)


def typed_table_strings(table: pa.Table, columns: set[str] | None = None) -> pa.Table:
    """`json_strings` on the string columns of a table (all, or those in `columns`)."""
    changed = False
    arrays = []
    for name, col in zip(table.column_names, table.columns):
        if _is_str(col.type) and (columns is None or name in columns):
            typed = json_strings(col.combine_chunks())
            changed = changed or typed.type != col.type
            arrays.append(typed)
        else:
            arrays.append(col)
    return pa.Table.from_arrays(arrays, names=table.column_names) if changed else table


def sql_typed(out: list[pa.RecordBatch], types: list[Any]) -> list[pa.RecordBatch]:
    """Each batch with its columns cast to the SQL types the source named (`sql_cast`), in order."""
    fixed = []
    for b in out:
        arrays = [sql_cast(col, t) if i < len(types) else col for i, (col, t) in
                  enumerate(zip(b.columns, list(types) + [None] * (b.num_columns - len(types))))]
        fixed.append(pa.RecordBatch.from_arrays(arrays, names=b.schema.names))
    return fixed


def stream_typed(batch: pa.RecordBatch, types: dict[str, pa.DataType]) -> pa.RecordBatch:
    """The batch with each column in the type it had first in the stream when the cast is
    lossless (decimal(5, 2) -> decimal(6, 2), null -> T); else as it is (the sink unifies)."""
    arrays, changed = [], False
    for name, col in zip(batch.schema.names, batch.columns):
        want = types.setdefault(name, col.type)
        if pa.types.is_null(want) and not pa.types.is_null(col.type):
            types[name] = want = col.type
        if col.type != want and not _fits(col, want) and pa.types.is_decimal(col.type) \
                and pa.types.is_decimal(want):  # grown: to 18 digits (then 38), not one more each chunk
            digits = max(col.type.precision - col.type.scale, want.precision - want.scale)
            scale = max(col.type.scale, want.scale)
            types[name] = want = pa.decimal128(min(38, max(18 if want.precision < 18 else 38, digits + scale)), scale)
        if col.type != want and _fits(col, want):
            col, changed = col.cast(want), True
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names) if changed else batch


def _fits(col: pa.Array, want: pa.DataType) -> bool:
    t = col.type
    if pa.types.is_null(t):
        return True
    if pa.types.is_decimal(t) and pa.types.is_decimal(want):
        return t.scale <= want.scale and t.precision - t.scale <= want.precision - want.scale
    return False


# ---------------------------------------------------- one type for several

def is_list_type(t: pa.DataType) -> bool:
    """A list or a large list (not a fixed-size one)."""
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def merge_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The narrowest type both `a` and `b` convert to without loss, or None."""
    if a == b:
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        if pa.types.is_signed_integer(a) == pa.types.is_signed_integer(b):
            return a if a.bit_width >= b.bit_width else b
        return pa.int64() if max(a.bit_width, b.bit_width) < 64 else None
    if (pa.types.is_integer(a) or pa.types.is_floating(a)) and (pa.types.is_integer(b) or pa.types.is_floating(b)):
        return pa.float64()
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b) and a.tz == b.tz:
        order = ["s", "ms", "us", "ns"]
        return a if order.index(a.unit) >= order.index(b.unit) else b
    if {a, b} <= {pa.string(), pa.large_string()}:
        return pa.large_string()
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = {a.field(i).name: a.field(i).type for i in range(a.num_fields)}
        for i in range(b.num_fields):
            f = b.field(i)
            merged = merge_type(fields[f.name], f.type) if f.name in fields else f.type
            if merged is None:
                return None
            fields[f.name] = merged
        return pa.struct(list(fields.items()))
    if is_list_type(a) and is_list_type(b) and type(a) is type(b):
        value = merge_type(a.value_type, b.value_type)
        return None if value is None else (pa.list_(value) if pa.types.is_list(a) else pa.large_list(value))
    return None


def unify_types(types: list[pa.DataType]) -> pa.DataType:
    """One type for a column seen with several types; string as the last resort."""
    result = types[0]
    for t in types[1:]:
        merged = merge_type(result, t)
        if merged is None:
            try:
                merged = pa.unify_schemas([pa.schema([("x", result)]), pa.schema([("x", t)])],
                                          promote_options="permissive").field("x").type
            except CAST_ERRORS:
                return pa.string()
        result = merged
    for t in types:  # every source type must actually cast to the result
        if t != result and not pa.types.is_null(t):
            try:
                pa.array([], type=t).cast(result)
            except CAST_ERRORS:
                return pa.string()
    return result


def cast_for_union(col: pa.Array, target: pa.DataType) -> pa.Array:
    """Convert one column to the unified type (raises Arrow errors when it can't)."""
    if col.type == target:
        return col
    if pa.types.is_null(col.type):
        return pa.nulls(len(col), target)
    if pa.types.is_string(target) and not pa.types.is_large_string(col.type):
        # Same text form as the JSON fallback (ISO dates, JSON for nested).
        return text_array(col.to_pylist())
    if pa.types.is_integer(col.type) and pa.types.is_floating(target):
        return col.cast(target, safe=False)  # accepted precision loss past 2**53
    return col.cast(target, safe=True)
