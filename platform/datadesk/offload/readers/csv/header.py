"""Whether the first record of a CSV/TSV text is its header (a tool's text says nothing of it)."""

from __future__ import annotations

import csv
import io

import pyarrow as pa

from datadesk.offload.readers.casts import text_column


def csv_has_header(sample: str, delimiter: str) -> bool:
    """False when the first record is data: some column is typed (numbers, dates, booleans)
    in the records below it and the first record's cell fits that type too."""
    records = [r for r in csv.reader(io.StringIO(sample), delimiter=delimiter) if r][:200]
    if len(records) < 2:
        return True
    width = len(records[0])
    body = [r for r in records[1:] if len(r) == width]
    if not body:
        return True
    for i in range(width):
        col = text_column(pa.array([r[i] for r in body], pa.string()))
        if pa.types.is_string(col.type) or pa.types.is_null(col.type):
            continue
        first = text_column(pa.array([records[0][i]], pa.string()))
        if first.type == col.type or (pa.types.is_integer(first.type) and pa.types.is_floating(col.type)):
            return False
        return True
    return True
