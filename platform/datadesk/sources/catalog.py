"""A source's catalogue (tables, views, columns with types and comments), cached with a TTL,
and the nearest names for a table the query named but the source does not have."""

from __future__ import annotations

import difflib
import threading
import time
from typing import Callable, Iterable

from datadesk.sources.query import ColumnInfo, TableInfo

CatalogRow = tuple  # (schema, table, kind, table comment, row estimate, column, type, column comment)


def tables_from_rows(rows: Iterable[CatalogRow]) -> list[TableInfo]:
    """Group catalogue rows (one per column, in order) into TableInfo records."""
    order: list[tuple[str, str]] = []
    meta: dict[tuple[str, str], tuple] = {}
    cols: dict[tuple[str, str], list[ColumnInfo]] = {}
    for schema, table, kind, comment, estimate, column, typ, col_comment in rows:
        key = (str(schema or ""), str(table))
        if key not in meta:
            order.append(key)
            est = int(estimate) if estimate is not None and int(estimate) >= 0 else None
            meta[key] = (str(kind), comment or None, est)
            cols[key] = []
        cols[key].append(ColumnInfo(str(column), str(typ), col_comment or None))
    return [TableInfo(name=t, kind=meta[(s, t)][0], schema=s, comment=meta[(s, t)][1],
                      row_estimate=meta[(s, t)][2], columns=cols[(s, t)]) for s, t in order]


class CatalogCache:
    """The described catalogue of one source, reused for `ttl_s` seconds (0: never cached)."""

    def __init__(self, load: Callable[[], list[TableInfo]], ttl_s: float) -> None:
        self._load = load
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: tuple[float, list[TableInfo]] | None = None

    def get(self) -> list[TableInfo]:
        with self._lock:
            if self._value is not None and time.monotonic() - self._value[0] < self.ttl_s:
                return self._value[1]
        tables = self._load()
        with self._lock:
            self._value = (time.monotonic(), tables)
        return tables

    def cached(self) -> list[TableInfo] | None:
        with self._lock:
            return self._value[1] if self._value is not None else None

    def clear(self) -> None:
        with self._lock:
            self._value = None


def nearest_tables(missing: str, tables: list[TableInfo], n: int = 3) -> list[str]:
    """The catalogue names closest to `missing` (qualified as schema.table where that helps)."""
    names = {t.name: (f"{t.schema}.{t.name}" if t.schema else t.name) for t in tables}
    lowered = {k.lower(): v for k, v in names.items()}
    close = difflib.get_close_matches(missing.lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[c] for c in close]


def render_tables(tables: list[TableInfo], table: str | None = None, max_chars: int = 7_000) -> str:
    """The catalogue as compact text for the model: one line per table, columns with types."""
    chosen = tables
    if table:
        want = table.lower()
        chosen = [t for t in tables if t.name.lower() == want or f"{t.schema}.{t.name}".lower() == want]
        if not chosen:
            near = nearest_tables(table.split(".")[-1], tables)
            hint = f"; nearest: {', '.join(near)}" if near else ""
            raise LookupError(f"no table {table!r} in this source{hint}")
    lines = []
    for t in chosen:
        head = f"{t.schema}.{t.name}" if t.schema else t.name
        extra = [t.kind] + ([f"~{t.row_estimate} rows"] if t.row_estimate is not None else [])
        line = f"{head} ({', '.join(extra)})" + (f" -- {t.comment}" if t.comment else "")
        cols = ", ".join(f"{c.name} {c.type}" + (f" /* {c.comment} */" if c.comment else "") for c in t.columns)
        lines.append(f"{line}: {cols}")
    text = "\n".join(lines)
    if len(text) > max_chars:
        kept, size = [], 0
        for ln in lines:
            if size + len(ln) > max_chars:
                break
            kept.append(ln)
            size += len(ln) + 1
        text = "\n".join(kept) + (f"\n... {len(lines) - len(kept)} more tables; ask for one by name "
                                  "(table=...) to see its columns")
    return text or "(no tables visible to this source's login)"
