"""Rows from a DB-API cursor as Arrow record batches with one schema for the whole stream.

For drivers that hand out Python rows (MySQL/MariaDB through asyncmy, SQLite through the
standard library): each batch of `fetchmany` rows becomes one RecordBatch, column by column.

- MySQL/MariaDB: the schema comes from the result's column definitions (type code, flags,
  length, scale), so every batch has the same, real types: DECIMAL(p, s) -> decimal128(p, s),
  TINYINT(1)/BOOLEAN -> bool, TIMESTAMP -> timestamp[us, UTC] (the session runs in UTC),
  DATETIME -> timestamp[us], TIME -> duration[us], JSON -> text, binary strings -> binary,
  BIT(1) -> bool and BIT(n) -> uint64 (the driver hands a BIT value out as big-endian bytes).
- SQLite (dynamic types): inferred from the first batch (INTEGER -> int64, REAL -> double,
  TEXT -> text, BLOB -> binary, a column NULL throughout the first batch -> text); a later value
  of another type in the same column raises an error that says to CAST it in the query.
"""

from __future__ import annotations

import decimal
from typing import Any, Iterable, Sequence

import pyarrow as pa

from datadesk.sources.errors import SQLError

# MySQL protocol column types (include/mysql_com.h)
_MY = {1: pa.int8(), 2: pa.int16(), 3: pa.int32(), 9: pa.int32(), 8: pa.int64(), 4: pa.float32(),
       5: pa.float64(), 10: pa.date32(), 11: pa.duration("us"), 12: pa.timestamp("us"),
       7: pa.timestamp("us", tz="UTC"), 13: pa.int16(), 6: pa.null(), 245: pa.string(), 247: pa.string(),
       248: pa.string(), 255: pa.binary()}
_MY_NAMES = {0: "DECIMAL", 1: "TINYINT", 2: "SMALLINT", 3: "INT", 4: "FLOAT", 5: "DOUBLE", 6: "NULL",
             7: "TIMESTAMP", 8: "BIGINT", 9: "MEDIUMINT", 10: "DATE", 11: "TIME", 12: "DATETIME", 13: "YEAR",
             15: "VARCHAR", 16: "BIT", 245: "JSON", 246: "DECIMAL", 247: "ENUM", 248: "SET", 249: "TINYBLOB",
             250: "MEDIUMBLOB", 251: "LONGBLOB", 252: "BLOB", 253: "VARCHAR", 254: "CHAR", 255: "GEOMETRY"}
_UNSIGNED, _BINARY_CHARSET, _BIT = 32, 63, 16
_WIDER_UNSIGNED = {pa.int8(): pa.uint8(), pa.int16(): pa.uint16(), pa.int32(): pa.uint32(), pa.int64(): pa.uint64()}


def mysql_field(name: str, type_code: int, flags: int, length: int, scale: int, charsetnr: int) -> tuple[pa.Field, str]:
    """The Arrow field and the SQL type name of one MySQL/MariaDB result column."""
    sql = _MY_NAMES.get(type_code, f"TYPE{type_code}")
    if type_code in (0, 246):
        precision = max(1, length - (1 if scale > 0 else 0) - (0 if flags & _UNSIGNED else 1))
        typ = pa.decimal128(min(precision, 38), min(scale, 38)) if precision <= 38 else pa.float64()
        sql = f"DECIMAL({precision},{scale})"
    elif type_code == 1 and length == 1:
        typ, sql = pa.bool_(), "BOOLEAN"
    elif type_code == _BIT:  # length: the number of bits, 1 to 64
        typ, sql = (pa.bool_() if length <= 1 else pa.uint64()), f"BIT({max(length, 1)})"
    elif type_code in (15, 249, 250, 251, 252, 253, 254):
        typ = pa.binary() if charsetnr == _BINARY_CHARSET else pa.string()
    else:
        typ = _MY.get(type_code, pa.string())
        if flags & _UNSIGNED and typ in _WIDER_UNSIGNED:
            typ = _WIDER_UNSIGNED[typ]
            sql += " UNSIGNED"
    return pa.field(name, typ), sql


def bit_values(values: Sequence[Any]) -> list[int | None]:
    """MySQL BIT values (big-endian bytes, as asyncmy hands them out) as integers."""
    return [None if v is None else int.from_bytes(v, "big") if isinstance(v, (bytes, bytearray)) else int(v)
            for v in values]


def _bits(values: Sequence[Any]) -> bool:
    # a BIT column's values are bytes; the first non-null one tells (a driver is consistent per column)
    return isinstance(next((v for v in values if v is not None), None), (bytes, bytearray))


def _column(values: Sequence[Any], typ: pa.DataType, name: str) -> pa.Array:
    if (pa.types.is_boolean(typ) or pa.types.is_unsigned_integer(typ)) and _bits(values):
        values = bit_values(values)
    if pa.types.is_boolean(typ):
        return pa.array(values, pa.int8()).cast(pa.bool_())
    if pa.types.is_string(typ):
        try:
            return pa.array(values, typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. a SET/ENUM as bytes, a number in text
            return pa.array([None if v is None else v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                             for v in values], typ)
    if pa.types.is_binary(typ):
        return pa.array([v if v is None or isinstance(v, bytes) else str(v).encode() for v in values], typ)
    if pa.types.is_floating(typ):
        return pa.array([None if v is None else float(v) for v in values], typ) \
            if any(isinstance(v, decimal.Decimal) for v in values[:1]) else pa.array(values, typ)
    try:
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise SQLError(f"column {name!r}: a value does not fit its type {typ} ({str(exc)[:120]}); "
                       "CAST it in the query") from None


def rows_to_batch(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """One batch of `rows` with `schema` (columns by position)."""
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=schema)
    columns = list(zip(*rows))
    arrays = [_column(col, f.type, f.name) for col, f in zip(columns, schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _sqlite_type(values: Iterable[Any]) -> pa.DataType:
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return pa.string()
    if kinds <= {int}:
        return pa.int64()
    if kinds <= {int, float}:
        return pa.float64()
    if kinds <= {bytes}:
        return pa.binary()
    return pa.string()


_SQLITE_NAMES = {pa.int64(): "INTEGER", pa.float64(): "REAL", pa.string(): "TEXT", pa.binary(): "BLOB"}


def sqlite_schema(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> tuple[pa.Schema, list[str]]:
    """The schema of a SQLite result, inferred from its first rows (see the module docstring)."""
    columns = list(zip(*rows)) if rows else [() for _ in names]
    types = [_sqlite_type(col) for col in columns]
    return pa.schema([pa.field(n, t) for n, t in zip(names, types)]), [_SQLITE_NAMES[t] for t in types]


def sqlite_batch(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """Like rows_to_batch, with SQLite's dynamic typing: a value of another kind is an error."""
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=schema)
    arrays = []
    for col, f in zip(zip(*rows), schema):
        try:
            arrays.append(pa.array(col, f.type))  # the common case: every value of the column's kind
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        if pa.types.is_string(f.type):  # a text column with a number in it: the number as text
            col = tuple(v if v is None or isinstance(v, str) else str(v) for v in col)
        try:
            arrays.append(pa.array(col, f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            kind = next(type(v).__name__ for v in col if v is not None and not _fits(v, f.type))
            raise SQLError(f"column {f.name!r} holds {_SQLITE_NAMES.get(f.type, f.type)} values in its first rows "
                           f"and a {kind} value later (SQLite columns are not typed); CAST it in the query, "
                           f"e.g. CAST({f.name} AS TEXT)") from None
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _fits(value: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([value], typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
    return True
