"""The cluster `LockService` (store/interfaces/locks.py): PostgreSQL session advisory locks.

Every lease of a process is held on one dedicated connection (`Database.dedicated`), used
under a `threading.Lock`: taking or releasing a lock is one short statement, so one
connection serves them all, and the server drops every lock of the process when that
connection dies (a crash: at once; a host gone without a FIN: within the keepalive time,
about 10 s). A connection found dead makes every lease taken on it `lost`; the next
`try_acquire` opens a new one.

Advisory locks are reentrant per session, flocks are not: the names held are also kept here,
so a second `try_acquire` of a held name gets None in this process as in any other.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg

from datadesk.cluster.database import Database, advisory_key
from datadesk.store.interfaces.locks import LeaseBase, LockTimeout, check_lock_name

log = logging.getLogger(__name__)

POLL_FIRST_S = 0.01  # `acquire` polls (a blocking pg_advisory_lock would hold the shared connection)
POLL_MAX_S = 0.2


class PgLease(LeaseBase):
    """A session advisory lock held on the service's connection number `generation`."""

    def __init__(self, service: "PgLocks", name: str, key: int, generation: int) -> None:
        self.name, self.key, self.generation = name, key, generation
        self._service = service

    @property
    def lost(self) -> bool:
        return not self._released and not self._service._holds(self)

    def check(self) -> bool:
        return not self._released and self._service._ping(self)

    def _release(self) -> None:
        self._service._release(self)


class PgLocks:
    """Named locks as PostgreSQL session advisory locks (see the module doc)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._mu = threading.Lock()
        self._conn: psycopg.Connection | None = None
        self._generation = 0
        self._held: dict[str, PgLease] = {}

    # -- the connection ----------------------------------------------------------------
    def _connection(self) -> psycopg.Connection:
        """The live connection (under `_mu`), a new one if the last one died."""
        if self._conn is not None and not (self._conn.closed or self._conn.broken):
            return self._conn
        self._lose()
        self._conn = self.db.dedicated()
        self._generation += 1
        return self._conn

    def _lose(self) -> None:
        """The connection died (under `_mu`): every lease on it is gone with it."""
        if self._held:
            log.warning("the lock connection to %s was lost: %d lock(s) released (%s)", self.db.where,
                        len(self._held), ", ".join(sorted(self._held))[:200])
        self._held.clear()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except Exception:  # closing a dead connection says nothing new
                pass

    def _execute(self, sql: str, params: tuple[object, ...]) -> object:
        """One statement on the connection (under `_mu`); a dead connection loses every lease."""
        conn = self._connection()
        try:
            row = conn.execute(sql, params).fetchone()
        except psycopg.OperationalError:
            self._lose()
            raise
        return next(iter(row.values())) if row else None

    # -- LockService ---------------------------------------------------------------------
    def try_acquire(self, name: str) -> PgLease | None:
        key = advisory_key(check_lock_name(name))
        with self._mu:
            if name in self._held:
                return None
            try:
                got = self._execute("SELECT pg_try_advisory_lock(%s)", (key,))
            except psycopg.OperationalError:  # the old connection died: once more on a new one
                got = self._execute("SELECT pg_try_advisory_lock(%s)", (key,))
            if not got:
                return None
            lease = PgLease(self, name, key, self._generation)
            self._held[name] = lease
            return lease

    def acquire(self, name: str, timeout_s: float) -> PgLease:
        started = time.monotonic()
        delay = POLL_FIRST_S
        while True:
            lease = self.try_acquire(name)
            if lease is not None:
                return lease
            waited = time.monotonic() - started
            if waited >= timeout_s:
                raise LockTimeout(f"lock {name!r} is still held by someone else after {waited:.1f} s")
            time.sleep(min(delay, max(0.0, timeout_s - waited)))
            delay = min(POLL_MAX_S, delay * 2)

    def close(self) -> None:
        with self._mu:
            self._held.clear()
            if self._conn is not None:  # closing the session releases its locks
                conn, self._conn = self._conn, None
                conn.close()

    # -- leases --------------------------------------------------------------------------
    def _holds(self, lease: PgLease) -> bool:
        conn = self._conn
        return (self._held.get(lease.name) is lease and lease.generation == self._generation
                and conn is not None and not (conn.closed or conn.broken))

    def _ping(self, lease: PgLease) -> bool:
        with self._mu:
            if not self._holds(lease):
                return False
            try:
                self._execute("SELECT 1", ())
            except psycopg.OperationalError:
                return False
            return self._holds(lease)

    def _release(self, lease: PgLease) -> None:
        with self._mu:
            if not self._holds(lease):
                return  # lost with its connection: nothing is held any more
            del self._held[lease.name]
            try:
                self._execute("SELECT pg_advisory_unlock(%s)", (lease.key,))
            except psycopg.OperationalError:
                pass  # the connection died: the server released the lock with it


def build_locks(db: Database) -> PgLocks:
    """The cluster set's `LockService`, for the composition root."""
    return PgLocks(db)
