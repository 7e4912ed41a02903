"""`AuditTable`: the cluster set's audit log, rows of `audit_events` (migration 0010_audit.sql),
written by every host and read by the admin view of any.

An entry is one INSERT in autocommit (a few hundred microseconds on a near database): nothing is
queued in the process, so an entry the caller was told about is in the database. A page is
`WHERE <filters> AND id < <cursor> ORDER BY id DESC LIMIT n`: each exact filter has an index that
ends in id, so a page costs what it returns. Retention deletes old rows in batches, so the
sweep never holds a long lock. An INSERT waits at most APPEND_WAIT_S for a pooled connection.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from datadesk.audit.event import AuditEvent, AuditFilter, AuditPage
from datadesk.cluster.database import Database

INSERT = """INSERT INTO audit_events (ts, action, outcome, user_name, workspace, thread, source, sql, rows, bytes,
duration_ms, target, detail, client, host) VALUES (to_timestamp(%(ts)s), %(action)s, %(outcome)s, %(user)s,
%(workspace)s, %(thread)s, %(source)s, %(sql)s, %(rows)s, %(bytes)s, %(duration_ms)s, %(target)s, %(detail)s,
%(client)s, %(host)s)"""
SELECT = """SELECT id, extract(epoch FROM ts)::float8 AS ts, action, outcome, user_name, workspace, thread, source,
sql, rows, bytes, duration_ms, target, detail, client, host FROM audit_events"""
DELETE_BATCH = """DELETE FROM audit_events WHERE id IN (SELECT id FROM audit_events WHERE ts < %s LIMIT %s)"""
BATCH = 10_000
APPEND_WAIT_S = 2.0
_COLUMN = {"user": "user_name", "source": "source", "action": "action", "outcome": "outcome",
           "workspace": "workspace"}
_CURSOR = re.compile(r"^\d{1,19}$")


class AuditTable:
    """The audit log in PostgreSQL, shared by every host of the cluster."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def append(self, ev: AuditEvent) -> None:
        params: dict[str, Any] = {f: getattr(ev, f) for f in (
            "ts", "action", "outcome", "user", "workspace", "thread", "source", "sql", "rows", "bytes",
            "duration_ms", "target", "detail", "client", "host")}
        # a short wait for a pooled connection: the caller may be on the event loop, and an entry
        # the database cannot take now goes to the spill files rather than hold the loop
        with self.db.pool.connection(timeout=APPEND_WAIT_S) as conn:
            conn.autocommit = True
            try:
                conn.execute(INSERT, params)
            finally:
                if not conn.closed:
                    conn.autocommit = False  # the pool's other users expect a transaction

    def page(self, flt: AuditFilter, cursor: str | None = None, limit: int = 100) -> AuditPage:
        where, params = [], []
        for key, value in flt.exact().items():
            where.append(f"{_COLUMN[key]} = %s")
            params.append(value)
        if flt.since is not None:
            where.append("ts >= to_timestamp(%s)")
            params.append(flt.since)
        if flt.until is not None:
            where.append("ts < to_timestamp(%s)")
            params.append(flt.until)
        if cursor is not None:
            if not _CURSOR.match(cursor):
                raise ValueError(f"cursor {cursor!r} is not one this audit log gave (expected a row id)")
            where.append("id < %s")
            params.append(int(cursor))
        sql = SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT %s"
        params.append(limit + 1)
        with self.db.autocommit() as conn:
            rows = conn.execute(sql, params).fetchall()
        entries = [_event(r) for r in rows[:limit]]
        more = len(rows) > limit
        return AuditPage(entries, str(entries[-1].id) if more else None)

    def remove_before(self, day: str) -> int:
        """Delete the rows older than the start of `day` (UTC, YYYY-MM-DD); how many went."""
        cutoff = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
        removed = 0
        while True:
            with self.db.autocommit() as conn:
                n = conn.execute(DELETE_BATCH, (cutoff, BATCH)).rowcount
            removed += n
            if n < BATCH:
                return removed


def _event(row: dict[str, Any]) -> AuditEvent:
    return AuditEvent(id=row["id"], ts=row["ts"], action=row["action"], outcome=row["outcome"],
                      user=row["user_name"], workspace=row["workspace"], thread=row["thread"], source=row["source"],
                      sql=row["sql"], rows=row["rows"], bytes=row["bytes"], duration_ms=row["duration_ms"],
                      target=row["target"], detail=row["detail"], client=row["client"], host=row["host"])


def build_audit(db: Database, retention_days: int, host: str, spill: Path) -> Any:
    """The cluster's `AuditTrail` on `audit_events`; an entry the database cannot take goes to the
    day files under `spill` (this host's `<home>/audit-spill/`)."""
    from datadesk.audit.dayfiles import DayFiles
    from datadesk.audit.trail import AuditTrail

    return AuditTrail(AuditTable(db), retention_days, host=host, fallback=DayFiles(spill))
