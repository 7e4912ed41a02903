"""SQLite files inside the workspace, through the standard library's `sqlite3`.

Opened as a `file:...?mode=ro` URI (the engine refuses every write) with `PRAGMA query_only`,
no extension loading, and only after checking that the path stays inside the workspace with
no symbolic link on the way. Rows become Arrow batches (engines/rowbatches.py). `sqlite3`
rather than ADBC's SQLite driver because its `interrupt()` stops a running statement from
another thread (ADBC's SQLite driver has no cancel), which Stop and the deadline need.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import pyarrow as pa

from datadesk.sources.config import ParsedSource, SourceConfigError
from datadesk.sources.engines.rowbatches import sqlite_batch, sqlite_schema
from datadesk.sources.session import SourceDown


def resolve_file(src: ParsedSource, workspace_dir: Path) -> Path:
    """The SQLite file of `src`: inside the workspace, a regular file, no link on the way."""
    root = Path(workspace_dir).resolve()
    path = root / src.path
    current = root
    for part in Path(src.path).parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            raise SourceDown(f"source {src.name!r}: the SQLite file {src.path} does not exist in the workspace") \
                from None
        if stat.S_ISLNK(mode):
            raise SourceConfigError(f"sources.{src.name}.url: {src.path} goes through a symbolic link; "
                                    "link-free paths inside the workspace only")
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise SourceConfigError(f"sources.{src.name}.url: {src.path} is not a regular file")
    return path


class SQLiteSession:
    """One read-only SQLite connection; `interrupt` is safe from any thread."""

    def __init__(self, src: ParsedSource, workspace_dir: Path, timeout_s: float) -> None:
        self.broken = False
        path = resolve_file(src, workspace_dir)
        try:
            self._con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False,
                                        timeout=timeout_s, isolation_level=None)
            self._con.execute("PRAGMA query_only = ON")
            self._con.execute("PRAGMA trusted_schema = OFF")
        except sqlite3.Error as exc:
            raise SourceDown(f"cannot open source {src.name!r} (sqlite {src.path}): {exc}") from None
        self._lock = threading.Lock()
        self._cur: sqlite3.Cursor | None = None

    def execute(self, sql: str, batch_size: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
        self._con.execute("BEGIN")  # one read transaction: a consistent snapshot for the whole stream
        cur = self._con.execute(sql)
        with self._lock:
            self._cur = cur
        names = [d[0] for d in cur.description or []]
        first = cur.fetchmany(batch_size)
        schema, types = sqlite_schema(names, first)
        return schema, self._batches(cur, first, schema, batch_size), types

    def _batches(self, cur: sqlite3.Cursor, first: list, schema: pa.Schema, size: int) -> Iterator[pa.RecordBatch]:
        rows = first
        while rows:
            yield sqlite_batch(rows, schema)
            rows = cur.fetchmany(size)

    def interrupt(self) -> None:
        self._con.interrupt()

    def end(self) -> None:
        with self._lock:
            cur, self._cur = self._cur, None
        if cur is not None:
            cur.close()
        if self._con.in_transaction:
            self._con.execute("ROLLBACK")

    def close(self) -> None:
        self._con.close()


def catalog_rows(session: SQLiteSession) -> list[tuple]:
    """(schema, table, kind, comment, rows, column, type, comment) like the other catalogues."""
    con = session._con
    out = []
    objects = con.execute("SELECT name, type FROM sqlite_schema WHERE type IN ('table', 'view') "
                          "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()
    for name, kind in objects:
        for _cid, col, typ, *_ in con.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall():
            out.append(("main", name, kind, None, None, col, typ or "ANY", None))
    return out
