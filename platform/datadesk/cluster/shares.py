"""`PgShares`: the cluster set's shares (`store.interfaces.shares.Shares`), rows of the `shares`
table (migration 0011_shares.sql).

Every read filters on the reader's workspaces in SQL (`workspace = ANY(...)`), so a share of a
workspace the reader is not a member of is never returned. A revoke is one `UPDATE` that keeps
the first revocation time (`COALESCE`), so two hosts revoking at once agree on it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import psycopg

from datadesk.cluster.database import Database, DatabaseError
from datadesk.domain.ids import check_id
from datadesk.domain.shares import Share
from datadesk.store.interfaces.shares import ShareStoreError

_COLUMNS = "id, workspace, owner, thread, kind, title, created, revoked"


class PgShares:
    """Shares as rows (module doc)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, share: Share) -> None:
        with self._unreachable(), self.db.connection() as conn:
            try:
                conn.execute(f"INSERT INTO shares ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                             (share.id, share.workspace, share.owner, share.thread, share.kind, share.title,
                              share.created, share.revoked))
            except psycopg.errors.UniqueViolation as exc:
                raise ShareStoreError(f"share {share.id} exists already") from exc

    def get(self, sid: str, workspaces: list[str]) -> Share | None:
        check_id(sid, "share")
        with self._unreachable(), self.db.connection() as conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM shares WHERE id = %s AND workspace = ANY(%s)",
                               (sid, list(workspaces))).fetchone()
        return _share(row)

    def of_owner(self, owner: str, workspaces: list[str], thread: str | None = None) -> list[Share]:
        sql = f"SELECT {_COLUMNS} FROM shares WHERE owner = %s AND workspace = ANY(%s)"
        args: list = [owner, list(workspaces)]
        if thread is not None:
            sql += " AND thread = %s"
            args.append(thread)
        with self._unreachable(), self.db.connection() as conn:
            rows = conn.execute(sql + " ORDER BY created DESC, id", args).fetchall()
        return [s for s in map(_share, rows) if s is not None]

    def revoke(self, sid: str, owner: str, at: float) -> Share | None:
        check_id(sid, "share")
        with self._unreachable(), self.db.connection() as conn:
            row = conn.execute(f"UPDATE shares SET revoked = COALESCE(revoked, %s) WHERE id = %s AND owner = %s"
                               f" RETURNING {_COLUMNS}", (at, sid, owner)).fetchone()
        return _share(row)

    @contextlib.contextmanager
    def _unreachable(self) -> Iterator[None]:
        """A lost or refused connection as `DatabaseError` naming the database."""
        try:
            yield
        except psycopg.OperationalError as exc:
            raise DatabaseError(f"shares could not reach the cluster database {self.db.where}: {exc}") from exc


def _share(row: dict | None) -> Share | None:
    if row is None:
        return None
    return Share(**{k: v for k, v in row.items() if v is not None})


def build_shares(db: Database) -> PgShares:
    """The cluster set's share storage."""
    return PgShares(db)
