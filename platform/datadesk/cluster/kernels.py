"""The cluster kernel table and worker heartbeats (store/interfaces/kernels.py) in PostgreSQL, shared by
every host: tables `kernels`, `kernel_pool` and `workers` (migrations/0008_kernels.sql).

- `PgKernelTable`: a row per session and per pool kernel, the whole `KernelRecord` in `record`
  (jsonb) and what SQL counts by in columns. `reserve` counts the other rows and writes in one
  transaction under `pg_advisory_xact_lock('kernels:caps')`, so two hosts handing out kernels
  to one user at once never pass `sandbox.max_kernels_per_user` (nor `max_kernels`). The three
  locks are session advisory locks from a `LockService` (cluster/locks.py `PgLocks`): they go
  with the connection that holds them, so a crashed or vanished host frees its threads' kernels.
- `PgWorkers`: a `workers` row per app worker, its `last_seen` set on every beat; a worker is
  alive while that is younger than `stale_s` on the database's clock (host clocks may differ)
  and, for this host's own workers only, while its pid names the same process. It also keeps
  today's heartbeat file, which the backends' orphan sweeps of this host read
  (docker containers, gateway records under the home).

The registry calls these synchronously from its event loop, as it does the embedded files: each
call is one or a few short statements on the pool.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import psycopg

from datadesk.cluster.database import Database, advisory_key
from datadesk.cluster.locks import PgLocks
from datadesk.sandbox.kerneltable import KernelRecord, key_hash
from datadesk.sandbox.ownership import WORKER_ID, Heartbeat, Worker, pid_alive, remove_dead_heartbeats
from datadesk.store.interfaces.kernels import KernelCapReached, KernelCaps, SessionKey
from datadesk.store.interfaces.locks import Lease, LockService

log = logging.getLogger(__name__)

CAPS_LOCK = "kernels:caps"  # transaction-level: one reserve's count and write at a time
CREATE_LOCK = "kernels:create"  # session-level: making room under the caps (may end kernels)
REAPER_LOCK = "kernels:reaper"  # session-level: one reaper round over the rows in the cluster

_decoder = msgspec.json.Decoder(KernelRecord)
_encoder = msgspec.json.Encoder()

_SAVE_SESSION = """
INSERT INTO kernels (key_hash, workspace, user_id, thread_id, kernel_id, owner_worker, record)
VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb)
ON CONFLICT (key_hash) DO UPDATE SET kernel_id = EXCLUDED.kernel_id, owner_worker = EXCLUDED.owner_worker,
    record = EXCLUDED.record, updated = now()"""
_SAVE_POOL = """
INSERT INTO kernel_pool (kernel_id, owner_worker, record) VALUES (%s, %s, %s::jsonb)
ON CONFLICT (kernel_id) DO UPDATE SET owner_worker = EXCLUDED.owner_worker, record = EXCLUDED.record,
    updated = now()"""
# the other kernels than the one being written (a session's own row, a pool kernel's own row)
_COUNT = """
SELECT (SELECT count(*) FROM kernels WHERE kernel_id IS NOT NULL AND key_hash IS DISTINCT FROM %(key)s
            AND user_id = %(user)s) AS mine,
       (SELECT count(*) FROM kernels WHERE kernel_id IS NOT NULL AND key_hash IS DISTINCT FROM %(key)s)
     + (SELECT count(*) FROM kernel_pool WHERE kernel_id IS DISTINCT FROM %(pool)s) AS total"""


class LeaseLock:
    """A `store.interfaces.kernels.KernelLock` over one name of a `LockService`."""

    def __init__(self, locks: LockService, name: str) -> None:
        self.locks, self.name = locks, name
        self._lease: Lease | None = None

    def try_acquire(self) -> bool:
        if self._lease is not None and not self._lease.lost:
            return False
        self._lease = self.locks.try_acquire(self.name)
        return self._lease is not None

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()


def _decode(raw: str) -> KernelRecord | None:
    try:
        return _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring an unreadable kernel row: %s", exc)
        return None


class PgKernelTable:
    """The cluster `store.interfaces.kernels.KernelTable` (see the module doc)."""

    def __init__(self, db: Database, locks: LockService | None = None) -> None:
        self.db = db
        self.locks: LockService = locks if locks is not None else PgLocks(db)

    # -- records -------------------------------------------------------------------------
    def load(self, key: SessionKey) -> KernelRecord | None:
        with self.db.connection() as conn:
            row = conn.execute("SELECT record::text AS record FROM kernels WHERE key_hash = %s",
                               (key_hash(key),)).fetchone()
        rec = _decode(row["record"]) if row else None
        return rec if rec is not None and rec.key == key else None

    def save(self, rec: KernelRecord) -> None:
        with self.db.connection() as conn:
            self._save(conn, rec)

    def _save(self, conn: psycopg.Connection, rec: KernelRecord) -> None:
        key = rec.key
        if key is None:
            raise ValueError("a session record needs workspace, user and thread")
        conn.execute(_SAVE_SESSION, (key_hash(key), key[0], key[1], key[2], rec.kernel_id, rec.owner or None,
                                     _encoder.encode(rec).decode()))

    def remove(self, key: SessionKey) -> None:
        with self.db.connection() as conn:
            conn.execute("DELETE FROM kernels WHERE key_hash = %s", (key_hash(key),))

    def save_pool(self, rec: KernelRecord) -> None:
        with self.db.connection() as conn:
            self._save_pool(conn, rec)

    def _save_pool(self, conn: psycopg.Connection, rec: KernelRecord) -> None:
        if not rec.kernel_id:
            raise ValueError("a pool record needs its kernel id")
        conn.execute(_SAVE_POOL, (rec.kernel_id, rec.owner or None, _encoder.encode(rec).decode()))

    def remove_pool(self, kernel_id: str) -> None:
        with self.db.connection() as conn:
            conn.execute("DELETE FROM kernel_pool WHERE kernel_id = %s", (kernel_id,))

    def reserve(self, rec: KernelRecord, caps: KernelCaps) -> None:
        """Save `rec` if the caps leave room, counted and written in one transaction under the
        caps' transaction lock (KernelCapReached otherwise, nothing written)."""
        key = rec.key
        with self.db.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(CAPS_LOCK),))
            if rec.kernel_id:
                row = conn.execute(_COUNT, {"key": key_hash(key) if key else None, "user": rec.user,
                                            "pool": None if key else rec.kernel_id}).fetchone()
                if key is not None and row["mine"] >= caps.per_user:
                    raise KernelCapReached("user", row["mine"], caps.per_user)
                if row["total"] >= caps.total:
                    raise KernelCapReached("total", row["total"], caps.total)
            if key is None:
                self._save_pool(conn, rec)
            else:
                self._save(conn, rec)

    # -- listing -------------------------------------------------------------------------
    def _records(self, sql: str) -> list[KernelRecord]:
        with self.db.connection() as conn:
            rows = conn.execute(sql).fetchall()
        return [rec for rec in (_decode(r["record"]) for r in rows) if rec is not None]

    def sessions(self) -> list[KernelRecord]:
        recs = self._records("SELECT record::text AS record FROM kernels ORDER BY key_hash")
        return [r for r in recs if r.key is not None]

    def pooled(self) -> list[KernelRecord]:
        recs = self._records("SELECT record::text AS record FROM kernel_pool ORDER BY kernel_id")
        return [r for r in recs if r.kernel_id]

    def kernels(self) -> list[KernelRecord]:
        recs = self._records(
            "SELECT record FROM (SELECT 0 AS part, key_hash AS k, record::text AS record FROM kernels"
            " WHERE kernel_id IS NOT NULL UNION ALL SELECT 1, kernel_id, record::text FROM kernel_pool) AS r"
            " ORDER BY part, k")
        return [r for r in recs if r.kernel_id]

    # -- locks ---------------------------------------------------------------------------
    def key_lock(self, key: SessionKey) -> LeaseLock:
        return LeaseLock(self.locks, f"kernel:{key_hash(key)}")

    def create_lock(self) -> LeaseLock:
        return LeaseLock(self.locks, CREATE_LOCK)

    def reaper_lock(self) -> LeaseLock:
        return LeaseLock(self.locks, REAPER_LOCK)


class PgWorkers(Heartbeat):
    """The cluster `store.interfaces.kernels.WorkerRegistry` (see the module doc)."""

    def __init__(self, db: Database, home: Path, interval_s: float, worker: Worker | None = None) -> None:
        super().__init__(home, interval_s, worker)
        self.db = db

    def beat(self) -> None:
        super().beat()  # the host-local file, for the backends' orphan sweeps on this host
        w = self.worker
        try:
            with self.db.connection() as conn:
                conn.execute("INSERT INTO workers (id, host, pid, pid_start) VALUES (%s, %s, %s, %s)"
                             " ON CONFLICT (id) DO UPDATE SET last_seen = now()", (w.id, w.host, w.pid, w.pid_start))
        except psycopg.Error as exc:  # the database away must not end the worker; it may look stale
            log.warning("heartbeat of worker %s in %s failed: %s", w.id, self.db.where, exc)

    async def stop(self) -> None:
        await super().stop()
        try:
            with self.db.connection() as conn:
                conn.execute("DELETE FROM workers WHERE id = %s", (self.worker.id,))
        except psycopg.Error as exc:
            log.warning("could not remove worker %s from %s: %s", self.worker.id, self.db.where, exc)

    def owner_alive(self, owner: str | None, stale_s: float) -> bool:
        if not owner or not WORKER_ID.fullmatch(owner):
            return False
        if owner == self.worker.id:
            return True
        with self.db.connection() as conn:
            row = conn.execute("SELECT host, pid, pid_start, extract(epoch FROM now() - last_seen)::float8 AS age"
                               " FROM workers WHERE id = %s", (owner,)).fetchone()
        return row is not None and self._alive(row, stale_s)

    def _alive(self, row: dict[str, Any], stale_s: float) -> bool:
        if row["age"] > stale_s:
            return False
        if row["host"] == self.worker.host:  # a pid means something on this host only
            return pid_alive(row["pid"], row["pid_start"])
        return True

    def remove_dead(self, stale_s: float) -> list[str]:
        """Delete the rows of workers that are gone (stale anywhere, or a dead pid on this host)
        and this host's dead heartbeat files; their ids."""
        with self.db.connection() as conn:
            rows = conn.execute("SELECT id, host, pid, pid_start, extract(epoch FROM now() - last_seen)::float8 AS age"
                                " FROM workers WHERE id <> %s AND (host = %s OR last_seen < now() - make_interval("
                                "secs => %s))", (self.worker.id, self.worker.host, stale_s)).fetchall()
            gone = [r["id"] for r in rows if not self._alive(r, stale_s)]
            if gone:
                conn.execute("DELETE FROM workers WHERE id = ANY(%s)", (gone,))
        files = remove_dead_heartbeats(self.home, stale_s)
        return sorted(set(gone) | set(files))


def build_kernels(db: Database, settings: Any, layout: Any,
                  locks: LockService | None = None) -> tuple[PgKernelTable, PgWorkers]:
    """The cluster kernel table and heartbeats, for `KernelRegistry(..., table=, workers=)`.
    `locks`: the process's `PgLocks` when the composition root shares one (else a new one)."""
    return PgKernelTable(db, locks), PgWorkers(db, layout.home, settings.sandbox.heartbeat_s)
