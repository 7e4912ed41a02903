"""`PgMemoryDocs`: memory documents and their audit in PostgreSQL (`store.interfaces.memory.MemoryDocs`).

Tables (migration 0005_memory_search.sql):

- `memory_docs(workspace, user_id, doc jsonb, updated_at)`, PK (workspace, user_id): the
  `MemoryDoc` of one user in one workspace, as `memory.json` holds it in the embedded set;
- `memory_audit(id identity, workspace, user_id, ts, event, fact, status, kind, source,
  reason)`: the audit, never a fact's text.

`update` runs in one transaction: the row is inserted when missing (`ON CONFLICT DO
NOTHING`, so two hosts making a user's first fact at once both end up on the one row),
locked with `SELECT ... FOR UPDATE`, changed by the caller, written back, and the audit
events inserted. Writers of one user queue on the row lock (other users are not blocked),
so no host loses another's change, and an audit event commits exactly with its change.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import msgspec
import psycopg

from datadesk.cluster.database import Database, DatabaseError
from datadesk.domain.memory import MemoryDoc
from datadesk.store.interfaces.memory import AuditEvent, MemoryStoreError

_AUDIT_COLUMNS = ("ts", "event", "fact", "status", "kind", "source", "reason")


class PgMemoryDocs:
    """The cluster set's `MemoryDocs`: a row per (workspace, user) and an audit table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def read(self, workspace: str, user_id: str) -> MemoryDoc:
        with self._unreachable(), self.db.connection() as conn:
            row = conn.execute("SELECT doc::text AS doc FROM memory_docs WHERE workspace = %s AND user_id = %s",
                               (workspace, user_id)).fetchone()
        return _decode(row, workspace, user_id)

    @contextlib.contextmanager
    def update(self, workspace: str, user_id: str) -> Iterator[tuple[MemoryDoc, list[AuditEvent]]]:
        """The user's document under its row lock; stored with its audit events on a normal exit
        (the transaction rolls back on an exception, the inserted empty row included)."""
        with self._unreachable(), self.db.connection() as conn:
            conn.execute("INSERT INTO memory_docs (workspace, user_id, doc) VALUES (%s, %s, '{}')"
                         " ON CONFLICT DO NOTHING", (workspace, user_id))
            row = conn.execute("SELECT doc::text AS doc FROM memory_docs WHERE workspace = %s AND user_id = %s"
                               " FOR UPDATE", (workspace, user_id)).fetchone()
            doc = _decode(row, workspace, user_id)
            events: list[AuditEvent] = []
            yield doc, events
            conn.execute("UPDATE memory_docs SET doc = %s::jsonb, updated_at = now()"
                         " WHERE workspace = %s AND user_id = %s",
                         (msgspec.json.encode(doc).decode("utf-8"), workspace, user_id))
            if events:
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO memory_audit (workspace, user_id, ts, event, fact, status, kind, source, reason)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        [(workspace, user_id, *(getattr(e, c) for c in _AUDIT_COLUMNS)) for e in events])

    def audit(self, workspace: str, user_id: str) -> list[AuditEvent]:
        with self._unreachable(), self.db.connection() as conn:
            rows = conn.execute("SELECT ts, event, fact, status, kind, source, reason FROM memory_audit"
                                " WHERE workspace = %s AND user_id = %s ORDER BY id",
                                (workspace, user_id)).fetchall()
        return [AuditEvent(**{k: v for k, v in r.items() if v is not None}) for r in rows]

    @contextlib.contextmanager
    def _unreachable(self) -> Iterator[None]:
        """A lost or refused connection as `DatabaseError` naming the database (callers above the
        protocol do not know psycopg); every other exception passes unchanged."""
        try:
            yield
        except psycopg.OperationalError as exc:
            raise DatabaseError(f"memory could not reach the cluster database {self.db.where}: {exc}") from exc


def _decode(row: dict | None, workspace: str, user_id: str) -> MemoryDoc:
    if row is None:
        return MemoryDoc()
    try:
        return msgspec.json.decode(row["doc"], type=MemoryDoc)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MemoryStoreError(f"memory of user {user_id!r} in workspace {workspace!r} (table memory_docs) "
                               f"is unreadable: {exc}") from exc


def build_memory_docs(db: Database) -> PgMemoryDocs:
    """The cluster set's memory storage; pass it to `MemoryStore(layout, settings, docs=...)`."""
    return PgMemoryDocs(db)
