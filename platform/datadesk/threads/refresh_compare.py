"""What changed between two versions of a table: rows, schema, sums of the numeric columns.

Used by a refresh (threads/refresh.py): the old version is read before the query is re-run,
the new one after; both are Parquet files of the thread's artifacts. Only the footer (rows,
schema) and one column at a time (sums) are read, so a large result costs little memory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

MAX_SUM_COLUMNS = 50  # numeric columns summed per table (a wide table keeps its first ones)


class TableFacts(msgspec.Struct):
    """Rows, column types and numeric sums of one version of a table."""

    rows: int
    columns: dict[str, str]  # name -> Arrow type
    sums: dict[str, float]


class SumChange(msgspec.Struct):
    column: str
    old: float
    new: float


class TableChange(msgspec.Struct):
    """The difference of two versions (`old` None: the old data had expired, only its rows are known)."""

    rows_old: int | None
    rows_new: int
    columns_added: list[str] = []
    columns_removed: list[str] = []
    types_changed: dict[str, list[str]] = {}  # name -> [old type, new type]
    sums: list[SumChange] = []  # numeric columns present in both versions whose sum changed
    changed: bool = False


def table_facts(path: Path) -> TableFacts:
    """Rows, schema and sums of the numeric columns of the Parquet file at `path`."""
    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow
    columns = {f.name: str(f.type) for f in schema}
    sums: dict[str, float] = {}
    numeric = [f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
               or pa.types.is_decimal(f.type)][:MAX_SUM_COLUMNS]
    for name in numeric:
        total = pc.sum(pf.read(columns=[name]).column(0)).as_py()
        sums[name] = float(total) if total is not None else 0.0
    return TableFacts(rows=pf.metadata.num_rows, columns=columns, sums=sums)


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def compare(old: TableFacts | None, new: TableFacts, rows_old: int | None = None) -> TableChange:
    """What changed from `old` to `new` (`old` None: only `rows_old` is known)."""
    if old is None:
        return TableChange(rows_old=rows_old, rows_new=new.rows, changed=rows_old != new.rows)
    added = [c for c in new.columns if c not in old.columns]
    removed = [c for c in old.columns if c not in new.columns]
    types = {c: [old.columns[c], t] for c, t in new.columns.items() if c in old.columns and old.columns[c] != t}
    sums = [SumChange(c, old.sums[c], v) for c, v in new.sums.items()
            if c in old.sums and not _same(old.sums[c], v)]
    changed = bool(added or removed or types or sums or old.rows != new.rows)
    return TableChange(rows_old=old.rows, rows_new=new.rows, columns_added=added, columns_removed=removed,
                       types_changed=types, sums=sums, changed=changed)


def describe(change: TableChange) -> list[str]:
    """The change in a few words per fact, for the summary card and the log."""
    out: list[str] = []
    if change.rows_old != change.rows_new:
        old = "?" if change.rows_old is None else f"{change.rows_old:,}"
        out.append(f"rows {old} -> {change.rows_new:,}")
    if change.columns_added:
        out.append("columns added: " + ", ".join(change.columns_added))
    if change.columns_removed:
        out.append("columns removed: " + ", ".join(change.columns_removed))
    for name, (a, b) in change.types_changed.items():
        out.append(f"{name}: type {a} -> {b}")
    for s in change.sums:
        out.append(f"sum of {s.column}: {s.old:,.6g} -> {s.new:,.6g}")
    return out


def facts_or_none(path: Path | None) -> TableFacts | None:
    """`table_facts` of a Parquet file, None when there is none (expired, or text)."""
    if path is None or not path.is_file() or path.suffix != ".parquet":
        return None
    return table_facts(path)


def as_json(value: Any) -> Any:
    return msgspec.to_builtins(value)
