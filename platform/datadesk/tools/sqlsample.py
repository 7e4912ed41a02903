"""A sample of one catalogue table for the data panel (`POST /api/workspace/catalog/sample`),
run like a `sql_query` call, through its own path (`tools.sql.first_rows`): the source's
read-only check, a query slot of the caller (per-user and global limits), the source's read-only
session and one audit entry (thread `data-panel`). The statement is built from the catalogue's
own names (`sources.datacatalog.sample_sql`), never from the request's text."""

from __future__ import annotations

import sys
from typing import Any

from datadesk.audit.queries import QueryEntry
from datadesk.sources.config import WAREHOUSE
from datadesk.sources.datacatalog import PANEL_THREAD, SAMPLE_ROWS, sample_sql
from datadesk.sources.errors import SQLError
from datadesk.sources.query import QueryControl, interruptible
from datadesk.sources.registry import Source
from datadesk.store.admission import QuerySlots
from datadesk.tools.sql import first_rows


async def sample(src: Source, table: dict[str, Any], user: str, ws: str, slots: QuerySlots | None,
                 audit: Any, stream_timeout_s: float = 600.0) -> dict[str, Any]:
    """Up to SAMPLE_ROWS rows of `table` through the `sql_query` path: check, slot, read-only
    session, audit. SQLError/Busy raise with the reason (the audit entry written either way)."""
    sql = sample_sql(table, src.dialect)
    entry = QueryEntry(audit, user, ws, PANEL_THREAD, src.name or WAREHOUSE, sql)
    try:
        try:
            src.check(sql)
        except SQLError as exc:
            entry.failed(exc, before_run=True)
            raise
        slot = await slots.acquire(user) if slots is not None else None
        control = QueryControl()
        if slot is not None:
            slot.on_pressure = control.cancel
        try:
            result = await interruptible(control, first_rows, src, user, sql, sys.maxsize, stream_timeout_s,
                                         control, None, entry,
                                         executor=slots.executor if slots is not None else None)
        finally:
            if slot is not None:
                slot.release()
    except BaseException as exc:  # refused, busy, failed, cancelled: written once, whatever it was
        entry.failed(exc)
        raise
    data = result.data or {"columns": [], "types": [], "rows": [], "row_count": 0}
    rows = data.get("rows", [])[:SAMPLE_ROWS]
    return {"source": src.name, "table": table["name"], "schema": table.get("schema"), "sql": sql,
            "columns": data.get("columns", []), "types": data.get("types", []), "rows": rows,
            "row_count": len(rows)}

