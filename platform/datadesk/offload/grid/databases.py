"""Locked-down DuckDB databases for the grid, one per table file version, kept warm.

Creating an in-memory DuckDB costs 30-250 ms on a busy two-CPU host (the catalog, the buffer
manager, the thread pool), five to ten times the query a grid page runs on the 190,560-row
demo table. So the grid keeps the database of a file it has just read, locked down exactly as
before: the one file is its only readable path (`allowed_paths`, external access off), with
the `limits.sql_*` memory, threads and spill bounds, and `lock_configuration` set, so nothing
run on it can change those. Each request takes its own cursor (a connection of that database,
cheap) and closes it; the deadline interrupts that cursor only.

A database is keyed by the file's path, mtime and size (a re-run query that rewrote the file
gets a fresh one); the next request after one has been idle IDLE_S closes it, and at most
SIZE are kept (the least recently used goes first); one still in use is closed only when its
last cursor is returned. Its spill directory goes with it. `close()` ends them all.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import duckdb

from datadesk.sources.sqllimits import SQLLimits

SIZE = 8
IDLE_S = 60.0


def locked_database(limits: SQLLimits, path: Path) -> tuple[duckdb.DuckDBPyConnection, Path]:
    """A new in-memory DuckDB that may read `path` only, within `limits`, its settings locked;
    and its spill directory (the caller removes it when the database is closed)."""
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    temp = limits.new_temp_dir()
    try:
        literal = "'" + str(path).replace("'", "''") + "'"
        for stmt in ["SET enable_progress_bar=false", *limits.statements(temp),
                     f"SET allowed_paths=[{literal}]", "SET enable_external_access=false",
                     "SET lock_configuration=true"]:
            con.execute(stmt)
    except BaseException:
        con.close()
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return con, temp


@dataclass
class _Entry:
    db: duckdb.DuckDBPyConnection
    temp: Path
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    retired: bool = False  # evicted while in use: closed when its last cursor comes back

    def close(self) -> None:
        with contextlib.suppress(duckdb.Error):
            self.db.close()
        shutil.rmtree(self.temp, ignore_errors=True)


class GridDatabases:
    """The warm databases of the grid (see the module docstring)."""

    def __init__(self, limits: SQLLimits, size: int = SIZE, idle_s: float = IDLE_S) -> None:
        self.limits = limits
        self.size = max(1, int(size))
        self.idle_s = float(idle_s)
        self._dbs: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def _take(self, path: Path) -> _Entry:
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
        with self._lock:
            entry = self._dbs.get(key)
            if entry is not None:
                entry.users += 1
                self._dbs.move_to_end(key)
                return entry
        db, temp = locked_database(self.limits, path)  # slow: outside the lock
        fresh = _Entry(db, temp, users=1)
        with self._lock:
            entry = self._dbs.get(key)
            if entry is None:
                self._dbs[key] = entry = fresh
                fresh = None  # type: ignore[assignment]
            else:
                entry.users += 1
            retire = self._trim()
        if fresh is not None:  # another request made one meanwhile
            fresh.close()
        for old in retire:
            old.close()
        return entry

    def _trim(self) -> list[_Entry]:
        """Entries to close now (idle too long, or past `size`, and unused); under the lock."""
        now = time.monotonic()
        out: list[_Entry] = []
        for key, entry in list(self._dbs.items()):
            if len(self._dbs) <= self.size and now - entry.last_used < self.idle_s:
                break  # oldest first: the rest are newer
            del self._dbs[key]
            if entry.users:
                entry.retired = True
            else:
                out.append(entry)
        return out

    def _give_back(self, entry: _Entry) -> None:
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()
            close = [entry] if entry.retired and not entry.users else []
            close += self._trim()
        for old in close:
            old.close()

    @contextlib.contextmanager
    def cursor(self, path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection of the warm database of `path` (made on first use), closed after."""
        entry = self._take(path)
        try:
            cur = entry.db.cursor()
            try:
                yield cur
            finally:
                cur.close()
        finally:
            self._give_back(entry)

    def close(self) -> None:
        """Close every database that is not in use (the rest when their last cursor returns)."""
        with self._lock:
            entries = list(self._dbs.values())
            self._dbs.clear()
            idle = [e for e in entries if not e.users]
            for e in entries:
                e.retired = bool(e.users)
        for e in idle:
            e.close()
