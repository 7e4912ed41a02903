"""How a batch fits the Parquet file being written, and how a type is shown.

`fit_batch` converts a batch to the open segment's schema when that is lossless (a missing
column is nulls, int -> float, null -> T, ...), `merge_schemas` widens a segment's schema to
take a batch that does not fit; both by the type rules of `readers/casts.py` (`merge_type`).
What no lossless cast can join, the writer unifies on close (`unify_types`, `cast_for_union`).
`display_type` is the short form of a type the model and the UI are shown.
"""

from __future__ import annotations

import pyarrow as pa

from datadesk.offload.readers.casts import CAST_ERRORS, is_list_type, merge_type


def merge_schemas(a: pa.Schema, b: pa.Schema) -> pa.Schema | None:
    """Union of columns (a's order, then b's new ones) with merged types, or None."""
    types = {f.name: f.type for f in a}
    for f in b:
        merged = merge_type(types[f.name], f.type) if f.name in types else f.type
        if merged is None:
            return None
        types[f.name] = merged
    return pa.schema(list(types.items()))


def fit_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch | None:
    """`batch` converted to `schema` losslessly (missing columns -> null), or None."""
    if batch.schema.equals(schema):
        return batch
    index = {name: i for i, name in enumerate(batch.schema.names)}
    if any(name not in schema.names for name in index):
        return None
    arrays = []
    for field in schema:
        i = index.get(field.name)
        if i is None:
            arrays.append(pa.nulls(batch.num_rows, field.type))
            continue
        col = batch.column(i)
        if col.type != field.type:
            # Only widening casts: string -> int would "parse" text columns.
            if merge_type(field.type, col.type) != field.type:
                return None
            try:
                col = col.cast(field.type, safe=True)  # int -> float checks precision
            except CAST_ERRORS:
                return None
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ----------------------------------------------------------------- display

def _short(t: pa.DataType) -> str:
    s = str(t)
    return s.replace("[day]", "").replace("[ms]", "") if pa.types.is_date(t) else s


def _render(t: pa.DataType, depth: int, max_len: int) -> str:
    if pa.types.is_struct(t):
        if depth <= 0:
            return "struct<…>"
        parts: list[str] = []
        n = t.num_fields
        for i in range(n):
            f = t.field(i)
            part = f"{f.name}: {_render(f.type, depth - 1, max_len)}"
            rest = n - i - 1
            tail = f", …+{rest}" if rest else ""
            if parts and len("struct<" + ", ".join(parts + [part]) + tail + ">") > max_len:
                return "struct<" + ", ".join(parts) + f", …+{n - i}>"
            parts.append(part)
        return "struct<" + ", ".join(parts) + ">"
    if is_list_type(t) or pa.types.is_fixed_size_list(t):
        name = "large_list" if pa.types.is_large_list(t) else "list"
        return f"{name}<{_render(t.value_type, depth - 1, max_len) if depth > 0 else '…'}>"
    if pa.types.is_dictionary(t):
        return f"dictionary<{_render(t.value_type, depth, max_len)}>"
    if pa.types.is_map(t):
        if depth <= 0:
            return "map<…>"
        return f"map<{_render(t.key_type, depth - 1, max_len)}, {_render(t.item_type, depth - 1, max_len)}>"
    return _short(t)


def display_type(t: pa.DataType, max_len: int = 60) -> str:
    """A short rendering of a type: `struct<a: int64, b: list<…>, …+12>`.

    Nested levels collapse to `…` (deepest first) until the text fits
    `max_len`; a struct shows as many fields as fit and counts the rest.
    """
    best = ""
    for depth in range(6, -1, -1):
        best = _render(t, depth, max_len)
        if len(best) <= max_len:
            return best
    return best[: max_len - 1] + "…"
