"""Driver Arrow types made into types Parquet and pandas read as what they are.

- PostgreSQL `numeric(p, s)` (ADBC: an opaque string extension): decimal128(p, s) when
  p <= 38, else float64; an unconstrained `numeric` becomes float64 (documented: ~15
  significant digits). `NaN`/`Infinity` become null in a decimal, stay in a double.
- json/jsonb -> text (the JSON string), uuid -> text (canonical 8-4-4-4-12 form);
- interval (month_day_nano, which Parquet cannot store) -> duration[us], a month
  counted as 30 days (as PostgreSQL's own `justify_days`);
- any other opaque extension -> its storage (text or bytes); lists are normalised item-wise;
- timestamps with time zone, dates, booleans, integers and decimals stay as they are;
  driver field metadata is dropped.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Convert = Callable[[pa.Array], pa.Array]
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_US_PER_DAY = 86_400_000_000


def _numeric_type(field: pa.Field) -> pa.DataType:
    meta = field.metadata or {}
    try:
        typmod = int(meta.get(b"POSTGRESQL:typmod", b"-1"))
    except ValueError:
        typmod = -1
    if typmod >= 4:
        precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
        if 0 < precision <= 38 and scale <= precision:
            return pa.decimal128(precision, scale)
    return pa.float64()


def _to_decimal(target: pa.DataType) -> Convert:
    def convert(arr: pa.Array) -> pa.Array:
        text = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
        special = pc.is_in(pc.utf8_lower(text), pa.array(["nan", "infinity", "-infinity", "inf", "-inf"]))
        text = pc.if_else(special, pa.scalar(None, pa.string()), text)
        return pc.cast(text, target)
    return convert


def _to_double(arr: pa.Array) -> pa.Array:
    text = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
    return pc.cast(pc.replace_substring(text, "Infinity", "inf"), pa.float64())


def _storage(arr: pa.Array) -> pa.Array:
    return arr.storage if isinstance(arr, pa.ExtensionArray) else arr


def uuid_text(arr: pa.Array) -> pa.Array:
    """16-byte UUIDs as canonical lowercase text, vectorised (no Python per value)."""
    raw = _storage(arr)
    n = len(raw)
    if n == 0:
        return pa.array([], pa.string())
    buf = raw.buffers()[1]
    data = np.frombuffer(buf, dtype=np.uint8, count=(raw.offset + n) * 16)[raw.offset * 16:].reshape(n, 16)
    chars = np.empty((n, 32), dtype=np.uint8)
    chars[:, 0::2] = _HEX[data >> 4]
    chars[:, 1::2] = _HEX[data & 15]
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    for dst, src in ((slice(0, 8), slice(0, 8)), (slice(9, 13), slice(8, 12)), (slice(14, 18), slice(12, 16)),
                     (slice(19, 23), slice(16, 20)), (slice(24, 36), slice(20, 32))):
        out[:, dst] = chars[:, src]
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 36).tobytes())
    text = pa.StringArray.from_buffers(n, offsets, pa.py_buffer(out.tobytes()))
    if raw.null_count:
        text = pc.if_else(raw.is_valid(), text, pa.scalar(None, pa.string()))
    return text


def interval_duration(arr: pa.Array) -> pa.Array:
    """month_day_nano intervals as microseconds, a month counted as 30 days."""
    n = len(arr)
    if n == 0:
        return pa.array([], pa.duration("us"))
    rec = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanos", "<i8")])
    vals = np.frombuffer(arr.buffers()[1], dtype=rec, count=arr.offset + n)[arr.offset:]
    us = (vals["months"].astype(np.int64) * 30 + vals["days"]) * _US_PER_DAY + vals["nanos"] // 1000
    mask = np.asarray(arr.is_null()) if arr.null_count else None
    return pa.array(us, pa.duration("us"), mask=mask)


def _plan(field: pa.Field) -> tuple[pa.DataType, Convert | None]:
    """The target type of `field` and how to convert a column to it (None: as it is)."""
    t = field.type
    if isinstance(t, pa.BaseExtensionType):
        name = getattr(t, "extension_name", "")
        if name == "arrow.opaque" and getattr(t, "type_name", "") == "numeric":
            target = _numeric_type(field)
            return target, (_to_decimal(target) if pa.types.is_decimal(target) else _to_double)
        if name == "arrow.uuid":
            return pa.string(), uuid_text
        return t.storage_type, _storage  # arrow.json and other opaque types: their text/bytes
    if t == pa.month_day_nano_interval():
        return pa.duration("us"), interval_duration
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item_type, item_conv = _plan(t.value_field)
        item = pa.field(t.value_field.name, item_type, t.value_field.nullable)  # without driver metadata
        list_type = pa.list_(item) if pa.types.is_list(t) else pa.large_list(item)
        if item_conv is None:
            return list_type, (None if list_type == t and not t.value_field.metadata else
                               lambda arr: arr.cast(list_type))

        def convert_list(arr: pa.Array) -> pa.Array:
            cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
            return cls.from_arrays(arr.offsets, item_conv(arr.values), type=list_type,
                                   mask=arr.is_null() if arr.null_count else None)
        return list_type, convert_list
    return t, None


class Normalizer:
    """Converts each batch of one stream to the normalised schema (computed from the first schema)."""

    def __init__(self, schema: pa.Schema) -> None:
        plans = [_plan(f) for f in schema]
        self.schema = pa.schema([pa.field(f.name, typ, f.nullable) for f, (typ, _) in zip(schema, plans)])
        self._converts = [conv for _, conv in plans]
        self.identity = all(c is None for c in self._converts) and not any(f.metadata for f in schema)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.identity:
            return batch
        cols = [col if conv is None else conv(col) for col, conv in zip(batch.columns, self._converts)]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)
