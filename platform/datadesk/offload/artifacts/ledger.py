"""The artifact ledger: what the cache quotas count, kept as it changes (`artifact-ledger.sqlite`).

One SQLite file under the home (WAL, safe across the worker processes of `datadesk serve
--workers N`) holds one row per artifact that counts against a quota: a cache artifact whose
data is kept (`live`: ready or partial; its stored bytes, last use and creation time for the
LRU choice) or a deliverable whose data is kept (its bytes, for the deliverable quota).
Triggers keep `totals` (count, stored bytes and deliverable bytes per thread `t:<ws>/<user>/<tid>`,
per user `u:<user>` and for the host `*`) equal to the sum of the rows in the same transaction,
so reading a total is one indexed lookup whatever the number of artifacts.

It is a derived cache of the artifacts' metadata files, never the truth:

- `ArtifactStore.save`, `discard` and the thread clear/delete hooks update it after the file
  (a row per write, one small transaction); an error here is logged and never fails the write;
- `reconcile` (the periodic sweep) compares it with the files and corrects what differs (a
  crash between a file and its row, files changed outside the app), one log line per round;
  a row written after the sweep began is newer than what the sweep read and is left alone;
- an eviction claims its victims by deleting their rows in the transaction that read the
  totals (two workers never evict for the same overflow twice), then expires the files;
- a damaged or missing file is rebuilt from the metadata files (`built` is unset until then).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

from datadesk.domain.artifacts import Artifact
from datadesk.store.interfaces.artifacts import Drift, Row, ThreadKey, Totals, Victim, scope_of  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

LEDGER_FILE = "artifact-ledger.sqlite"
BUSY_TIMEOUT_S = 5.0  # a write waits at most this long for another writer, then goes on without its row
BATCH = 64  # victims read per query while an overflow is trimmed

_TOTALS = ("INSERT INTO totals VALUES ({scope}, {count}, {bytes}, {deliv}) ON CONFLICT(scope) DO UPDATE SET "
           "count=count+excluded.count, bytes=bytes+excluded.bytes, deliverable=deliverable+excluded.deliverable;")


def _each_scope(row: str, count: str, size: str, deliv: str) -> str:
    return "".join(_TOTALS.format(scope=scope, count=count, bytes=size, deliv=deliv)
                   for scope in (f"'t:'||{row}.thread", f"'u:'||{row}.user", "'*'"))


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS artifacts(
  thread TEXT NOT NULL, aid TEXT NOT NULL, user TEXT NOT NULL,
  live INTEGER NOT NULL, stored INTEGER NOT NULL, deliverable INTEGER NOT NULL,
  last_used REAL NOT NULL, created REAL NOT NULL, saved_ns INTEGER NOT NULL,
  PRIMARY KEY(thread, aid)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS live_by_thread ON artifacts(thread, last_used, created) WHERE live=1;
CREATE INDEX IF NOT EXISTS live_by_user ON artifacts(user, last_used, created) WHERE live=1;
CREATE INDEX IF NOT EXISTS live_by_age ON artifacts(last_used, created) WHERE live=1;
CREATE TABLE IF NOT EXISTS totals(
  scope TEXT PRIMARY KEY, count INTEGER NOT NULL, bytes INTEGER NOT NULL, deliverable INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS row_added AFTER INSERT ON artifacts BEGIN
  {_each_scope("new", "new.live", "new.live*new.stored", "new.deliverable")}
END;
CREATE TRIGGER IF NOT EXISTS row_removed AFTER DELETE ON artifacts BEGIN
  {_each_scope("old", "-old.live", "-old.live*old.stored", "-old.deliverable")}
END;
CREATE TRIGGER IF NOT EXISTS row_changed AFTER UPDATE ON artifacts
  WHEN old.live<>new.live OR old.stored<>new.stored OR old.deliverable<>new.deliverable BEGIN
  {_each_scope("new", "new.live*1-old.live", "new.live*new.stored-old.live*old.stored",
               "new.deliverable-old.deliverable")}
END;
"""
_UPSERT = ("INSERT INTO artifacts VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(thread, aid) DO UPDATE SET "
           "live=excluded.live, stored=excluded.stored, deliverable=excluded.deliverable, "
           "last_used=excluded.last_used, created=excluded.created, saved_ns=excluded.saved_ns")
# a row that counts nothing any more, kept (with when) until the next sweep: a sweep that read the
# files before it was written must not bring the artifact back
_DEAD = ("INSERT INTO artifacts VALUES (?,?,?,0,0,0,0,0,?) ON CONFLICT(thread, aid) DO UPDATE SET "
         "live=0, stored=0, deliverable=0, saved_ns=excluded.saved_ns")


class LedgerView:
    """The ledger inside one write transaction (`ArtifactLedger.transaction`): totals as they are
    now, the least recently used live artifacts of a scope, and claiming victims."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def totals(self, scope: str) -> Totals:
        row = self.conn.execute("SELECT count, bytes, deliverable FROM totals WHERE scope=?", (scope,)).fetchone()
        return Totals(*row) if row else Totals()

    def over(self, kind: str, max_count: int, max_bytes: int) -> list[str]:
        """The scopes of `kind` ("t" threads, "u" users) past either limit."""
        rows = self.conn.execute("SELECT scope FROM totals WHERE scope >= ? AND scope < ? AND (count > ? OR bytes > ?)",
                                 (f"{kind}:", f"{kind};", max_count, max_bytes))
        return [r[0] for r in rows]

    def oldest_use(self) -> float | None:
        """The last use of the least recently used live cache artifact (an index lookup)."""
        return self.conn.execute("SELECT min(last_used) FROM artifacts WHERE live=1").fetchone()[0]

    def biggest_user(self, other_than: str | None) -> str | None:
        """The user holding the most stored bytes (then the most artifacts), not `other_than`."""
        row = self.conn.execute("SELECT scope FROM totals WHERE scope >= 'u:' AND scope < 'u;' AND scope <> ? "
                                "AND count > 0 ORDER BY bytes DESC, count DESC LIMIT 1",
                                (f"u:{other_than}",)).fetchone()
        return row[0][2:] if row else None

    def lru(self, scope: str, protect: set[str], limit: int = BATCH,
            used_before: float | None = None) -> list[Victim]:
        """The least recently used live cache artifacts of `scope` (`*`: all), not in `protect`,
        optionally only those last used before `used_before`."""
        where, args = ["live=1"], []
        if scope.startswith("t:"):
            where.append("thread=?")
            args.append(scope[2:])
        elif scope.startswith("u:"):
            where.append("user=?")
            args.append(scope[2:])
        if used_before is not None:
            where.append("last_used < ?")
            args.append(used_before)
        if protect:
            where.append(f"aid NOT IN ({','.join('?' * len(protect))})")
            args.extend(sorted(protect))
        sql = (f"SELECT thread, aid, user, stored FROM artifacts WHERE {' AND '.join(where)} "
               "ORDER BY last_used, created LIMIT ?")
        return [Victim(*r) for r in self.conn.execute(sql, (*args, limit))]

    def drop_thread(self, thread: str) -> int:
        """Every row of `thread` (its `ws/user/tid`) counts nothing any more."""
        return self.conn.execute("UPDATE artifacts SET live=0, stored=0, deliverable=0, saved_ns=? "
                                 "WHERE thread=? AND (live=1 OR deliverable>0)", (time.time_ns(), thread)).rowcount

    def claim(self, victim: Victim) -> bool:
        """Take `victim` (its row counts nothing from now on, its totals drop); False when another
        worker took it first."""
        cur = self.conn.execute("UPDATE artifacts SET live=0, stored=0, deliverable=0, saved_ns=? "
                                "WHERE thread=? AND aid=? AND live=1", (time.time_ns(), victim.thread, victim.aid))
        return cur.rowcount == 1


class ArtifactLedger:
    """The ledger file of one home; one connection per process, used by one thread at a time."""

    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)  # what a failing ledger raises (quota.py)

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self.opens = 0  # connections opened so far (a reopen may have found a new, empty file)
        self.busy_timeout_s = BUSY_TIMEOUT_S

    # -- the connection ----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        """The open connection (a forked worker opens its own; a damaged file is rebuilt)."""
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._open()
        except sqlite3.DatabaseError as exc:
            log.warning("artifact ledger %s is unreadable (%s): rebuilding it from the metadata files", self.path, exc)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            conn = self._open()
        self._conn, self._pid = conn, os.getpid()
        self.opens += 1
        return conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # a cache of the files: the last commits may go at power loss
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[LedgerView]:
        """One write transaction (BEGIN IMMEDIATE: other writers wait, readers do not)."""
        with self._lock:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield LedgerView(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def read(self, scopes: Iterable[str]) -> tuple[dict[str, Totals], float | None]:
        """The totals of `scopes` and the oldest last use of a live artifact, in one read."""
        scopes = list(scopes)
        with self._lock:
            conn = self._connect()
            rows = conn.execute(f"SELECT scope, count, bytes, deliverable FROM totals WHERE scope IN "
                                f"({','.join('?' * len(scopes))})", scopes).fetchall()
            oldest = LedgerView(conn).oldest_use()
        found = {r[0]: Totals(*r[1:]) for r in rows}
        return {s: found.get(s, Totals()) for s in scopes}, oldest

    # -- writes of the store ---------------------------------------------------------
    def record(self, key: ThreadKey, art: Artifact) -> None:
        """After `art`'s metadata was written: its row as the file now says (a dead row for a
        tombstone)."""
        row = Row.of(key, art)
        with self.transaction() as view:
            if row is None:
                view.conn.execute(_DEAD, (key.path, art.id, key.user, time.time_ns()))
            else:
                view.conn.execute(_UPSERT, (*row, time.time_ns()))

    def forget(self, key: ThreadKey, aid: str) -> None:
        """The artifact was removed (data and metadata): it counts nothing any more."""
        with self.transaction() as view:
            view.conn.execute(_DEAD, (key.path, aid, key.user, time.time_ns()))

    def forget_thread(self, key: ThreadKey) -> int:
        """A thread was cleared or deleted: what it held counts nothing any more. Returns how many
        artifacts that was."""
        with self.transaction() as view:
            return view.drop_thread(key.path)

    # -- the sweep --------------------------------------------------------------------
    def built(self) -> bool:
        """Whether a reconcile has filled the ledger from the files (a new file has not)."""
        with self._lock:
            row = self._connect().execute("SELECT value FROM meta WHERE key='built'").fetchone()
        return row is not None

    def reconcile(self, rows: Iterable[Row], started_ns: int) -> Drift:
        """Make the ledger say what the files say (`rows`: every counted artifact, read after
        `started_ns`), leaving alone any row written since then; totals are checked against
        their rows too. Returns what differed."""
        want = {(r.thread, r.aid): r for r in rows}
        with self._lock:
            have = {(r[0], r[1]): (Row(*r[:8]), r[8]) for r in self._connect().execute(
                "SELECT thread, aid, user, live, stored, deliverable, last_used, created, saved_ns FROM artifacts")}
        drift = Drift()
        fixes: list[Row] = []
        for k, row in want.items():
            old, saved = have.get(k, (None, 0))
            if saved >= started_ns or old == row:
                continue  # as the files say, or written since the sweep read them (newer than its view)
            fixes.append(row)
            if old is None or not old.counts:
                drift.missing += 1
            else:
                drift.changed += 1
            if len(drift.examples) < 3:
                drift.examples.append(f"{row.thread}/{row.aid}")
        gone = [k for k, (old, saved) in have.items() if k not in want and saved < started_ns]
        stale = [k for k in gone if have[k][0].counts]
        drift.stale = len(stale)
        drift.examples.extend(f"{t}/{a}" for t, a in stale[:max(0, 3 - len(drift.examples))])
        with self.transaction() as view:
            conn = view.conn
            conn.executemany(_UPSERT + " WHERE saved_ns < ?", [(*r, started_ns, started_ns) for r in fixes])
            # stale rows, and dead ones the sweep's view has caught up with
            conn.executemany("DELETE FROM artifacts WHERE thread=? AND aid=? AND saved_ns < ?",
                             [(t, a, started_ns) for t, a in gone])
            drift.totals = self._check_totals(conn)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('built', ?)", (str(time.time()),))
        return drift

    @staticmethod
    def _check_totals(conn: sqlite3.Connection) -> int:
        """Rewrite the totals from the rows when they differ (the triggers keep them equal; a file
        edited by hand does not). Returns how many totals were wrong."""
        sums = "SUM(live), SUM(live*stored), SUM(deliverable)"
        real: dict[str, tuple[int, int, int]] = {}
        for sql in (f"SELECT 't:'||thread, {sums} FROM artifacts GROUP BY thread",
                    f"SELECT 'u:'||user, {sums} FROM artifacts GROUP BY user",
                    f"SELECT '*', {sums} FROM artifacts"):
            for scope, *vals in conn.execute(sql):
                if scope is not None:
                    real[scope] = tuple(int(v or 0) for v in vals)  # type: ignore[assignment]
        kept = {r[0]: tuple(r[1:]) for r in conn.execute("SELECT scope, count, bytes, deliverable FROM totals")}
        zero = (0, 0, 0)
        wrong = [s for s in set(real) | set(kept) if real.get(s, zero) != kept.get(s, zero)]
        empty = [s for s, v in kept.items() if v == zero and s != "*" and real.get(s, zero) == zero]
        if wrong:
            conn.executemany("INSERT OR REPLACE INTO totals VALUES (?,?,?,?)", [(s, *real.get(s, zero)) for s in wrong])
        conn.executemany("DELETE FROM totals WHERE scope=?", [(s,) for s in empty])  # threads and users now empty
        return len(wrong)
