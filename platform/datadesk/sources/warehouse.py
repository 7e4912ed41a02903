"""The workspace's DuckDB warehouse as a source: locked-down, read-only SQL over its file.

It implements the `Source` interface of `registry.py` as the configured databases do
(`check`, `record_batches(sql, user)`, `describe`, `probe`, `status`), under the reserved
name `warehouse`, and differs from them where DuckDB runs inside the app process:

- no sessions; a query gets a connection of its own (callers on different threads never
  share one), the same for every user. Opening and locking one down costs more than a small
  query, so up to IDLE_MAX finished ones are kept warm for IDLE_S and handed to the next
  query -- only one that ended cleanly (not cancelled, not timed out, its result read to
  the end), and only while the warehouse file is the one it was opened on (a file replaced
  by an admin is seen by the next query). An idle server closes them after IDLE_S, so a job
  that writes the file in place (it needs the file to itself) waits seconds at most;
- the connection is opened read-only with extension auto-install/auto-load off, then
  locked down before any user SQL runs:

    SET allowed_directories=['<data_dir>/']   only the workspace's data dir
    SET enable_external_access=false          no other files, no network
    SET memory_limit, threads, temp_directory, max_temp_directory_size
                                              bounds (sources/sqllimits.py)
    SET lock_configuration=true               the SQL cannot undo the above

Two layers guard the warehouse: the statement check here (DuckDB's own parser: only
SELECT-like statements and EXPLAIN of a SELECT get through) and the engine settings above
(which would still stop a file read outside the data dir if the check missed one).
`COPY ... TO` into the data dir is allowed by the engine settings, so the statement check
is what refuses it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import pyarrow as pa

from datadesk.sources.config import WAREHOUSE
from datadesk.sources.errors import (
    SQLCancelled, SQLError, SQLLimit, SQLRefused, SQLTimeout, short_message, timeout_message,
)
from datadesk.sources.query import ASYNC_GRACE_S as _ASYNC_GRACE_S  # beyond the statement timeout (a test shortens it)
from datadesk.sources.query import ColumnInfo, ControlledStream, QueryControl, QueryResult, TableInfo, interruptible, jsonable
from datadesk.sources.sqllimits import SQLLimits, TempDirs, limit_message

# Opening the same file twice in one process shares one DuckDB instance (the
# Python client's instance cache), and its settings are instance-wide: once
# locked they cannot be SET again. This lock makes "open, then lock down or
# verify the lockdown" atomic with respect to other threads.
_SETUP_LOCK = threading.Lock()
_TEMP = TempDirs()  # spill directory of each instance, removed with its last connection
_CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
IDLE_MAX = 4  # finished connections kept warm per warehouse
# ... for at most this long: while one is open, another process cannot open the file to write it
# in place (a load job retries), so an idle server lets go of it within seconds
IDLE_S = 5.0
ALLOWED = "SELECT (also WITH ... SELECT, FROM ..., VALUES), DESCRIBE, SHOW, SUMMARIZE, EXPLAIN <select>"

# Schema queries for describe(): user tables and views of the warehouse file.
_OBJECTS_SQL = """
SELECT schema_name, table_name, 'table', comment, estimated_size FROM duckdb_tables()
 WHERE NOT internal AND NOT temporary AND database_name = current_database()
UNION ALL
SELECT schema_name, view_name, 'view', comment, NULL FROM duckdb_views()
 WHERE NOT internal AND NOT temporary AND database_name = current_database()
ORDER BY 1, 2"""
_COLUMNS_SQL = """
SELECT schema_name, table_name, column_name, data_type, comment FROM duckdb_columns()
 WHERE NOT internal AND database_name = current_database()
 ORDER BY schema_name, table_name, column_index"""


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _explained_statement(query: str) -> str | None:
    """The statement after `EXPLAIN [ANALYZE | (options)]`, or None if it can't be found.

    Uses DuckDB's own tokenizer so comments (including nested ones) are skipped
    exactly as the parser skips them. This matters because EXPLAIN ANALYZE runs
    the inner statement: `EXPLAIN ANALYZE COPY ... TO` writes a file.
    """
    tokens = [(pos, kind) for pos, kind in duckdb.tokenize(query) if kind != duckdb.token_type.comment]

    def text(i: int) -> str:
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(query)
        return query[tokens[i][0] : end].strip().lower()

    if not tokens or text(0) != "explain":
        return None
    i = 1
    if i < len(tokens) and text(i) in ("analyze", "analyse"):
        i += 1
    elif i < len(tokens) and text(i).startswith("("):
        depth = 0
        while i < len(tokens):
            tok = text(i)
            depth += tok.count("(") - tok.count(")") if tokens[i][1] == duckdb.token_type.operator else 0
            i += 1
            if depth <= 0:
                break
    return query[tokens[i][0] :] if i < len(tokens) else None


def check_statement(sql: object) -> str:
    """Validate `sql` as exactly one read statement; return its kind ("SELECT"/"EXPLAIN")."""
    if not isinstance(sql, str) or not sql.strip():
        raise SQLError(f"empty SQL: send one read-only statement; allowed: {ALLOWED}")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SQLError(short_message(exc)) from None
    if not statements:
        raise SQLError(f"empty SQL (only comments or semicolons): send one statement; allowed: {ALLOWED}")
    if len(statements) > 1:
        raise SQLRefused(
            f"one statement at a time: got {len(statements)} statements; send each as its own call"
        )
    kind = statements[0].type.name
    if kind == "SELECT":  # also WITH, DESCRIBE, SHOW, SUMMARIZE, FROM-first, VALUES
        return kind
    if kind == "EXPLAIN":
        inner = _explained_statement(statements[0].query)
        try:
            inner_ok = inner is not None and [s.type.name for s in duckdb.extract_statements(inner)] == ["SELECT"]
        except duckdb.Error:
            inner_ok = False
        if not inner_ok:
            raise SQLRefused(f"EXPLAIN is allowed only for a single SELECT statement; allowed: {ALLOWED}")
        return kind
    shown = {"LOAD": "INSTALL/LOAD", "VARIABLE_SET": "SET"}.get(kind, kind.replace("_", " "))
    hint = ""
    if kind == "MULTI":
        shown = "multi-part (e.g. PIVOT without an IN list)"
        hint = " For PIVOT, list the values: PIVOT t ON col IN ('a', 'b') USING ...;"
    raise SQLRefused(
        f"{shown} statements are not allowed: the warehouse is read-only.{hint} Allowed: {ALLOWED}"
    )


class BatchStream(ControlledStream):
    """Arrow record batches of one warehouse query, streamed (a `query.ResultStream`); close it
    (or use `with`) when done: the connection goes back.

    Not capped by max_rows: the consumer (e.g. a Parquet writer) decides how
    much to read. The statement timeout covers the whole stream.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, reader: pa.RecordBatchReader, control: QueryControl,
                 translate: Callable[[BaseException, QueryControl], SQLError],
                 release: Callable[[duckdb.DuckDBPyConnection, bool], None]) -> None:
        super().__init__(con, control, translate, self._give_back)
        self._owner_release = release
        self._read_to_end = False
        self._reader = reader
        self.schema: pa.Schema = reader.schema
        self.sql_types: list[str] = []  # DuckDB's own type names (BIGINT, TIMESTAMP, ...)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._reader
            self._read_to_end = True
        except (duckdb.Error, pa.ArrowException, OSError) as exc:  # an interrupt surfaces as OSError too
            raise self._translate(exc, self._control) from None
        finally:
            self.close()

    def _give_back(self, con: duckdb.DuckDBPyConnection) -> None:
        """The connection goes back warm only after a result read to the end, neither cancelled
        nor timed out (`Warehouse._release`)."""
        clean = self._read_to_end and not (self._control.fired or self._control.cancelled)
        self._owner_release(con, clean)


class Warehouse:
    """The workspace's warehouse: read-only, locked-down SQL over its DuckDB file, a `Source`.

    `data_dir` is the only directory the SQL may read files from (it holds the
    database file). Safe to share across threads and tasks: each call opens
    its own connection.
    """

    name = WAREHOUSE
    kind = dialect = "duckdb"
    description = "this workspace's warehouse (the default)"

    def __init__(self, db_path: Path, data_dir: Path, timeout_s: float, max_rows: int = 100_000,
                 views: dict[str, str] | None = None, limits: SQLLimits | None = None) -> None:
        """`views`: name -> absolute file or glob (Parquet/CSV) inside `data_dir`, exposed as views
        (then the DuckDB file, if any, is attached read-only and its tables shown as views too)."""
        self.views = dict(views or {})
        self.db_path = Path(db_path).absolute()
        self.data_dir = Path(data_dir).absolute()
        self.timeout_s = float(timeout_s)
        self.max_rows = int(max_rows)
        self.limits = limits or SQLLimits()
        self.last_error: str | None = None  # why the last connection could not be opened
        self.last_ok: float | None = None
        self._idle: list[tuple[duckdb.DuckDBPyConnection, float]] = []  # warm connections, newest last
        self._opened_on: dict[int, tuple[int, int, int] | None] = {}  # id(con) -> the file it was opened on
        self._idle_lock = threading.Lock()
        self._closer: threading.Timer | None = None  # closes the warm ones once they are idle for IDLE_S
        self.opened = 0  # connections opened (not reused), for tests and benchmarks
        self._closed = False  # after close(), a connection given back is closed, not kept warm

    def _file_signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.db_path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _release(self, con: duckdb.DuckDBPyConnection, reusable: bool = True) -> None:
        """Give back a connection from `_connect`: kept warm when it ended cleanly, there is room
        and the file is unchanged, else closed (the last one of an instance removes its spill dir).
        Kept ones are closed by the timer once idle for IDLE_S."""
        now = time.monotonic()
        with self._idle_lock:
            keep = (reusable and not self._closed and len(self._idle) < IDLE_MAX
                    and self._opened_on.get(id(con)) == self._file_signature())
            if keep:
                self._idle.append((con, now))
                if self._closer is None:
                    self._arm_closer(IDLE_S)
        if not keep:
            self._close(con)

    def _arm_closer(self, wait_s: float) -> None:
        """(under the idle lock) The timer that closes idle connections, in `wait_s`."""
        self._closer = threading.Timer(wait_s, self._close_idle)
        self._closer.daemon = True
        self._closer.start()

    def _close_idle(self) -> None:
        """The timer: close what has been idle for IDLE_S; again later while some are kept."""
        now = time.monotonic()
        with self._idle_lock:
            expired = [c for c, at in self._idle if now - at >= IDLE_S]
            self._idle = [(c, at) for c, at in self._idle if now - at < IDLE_S]
            self._closer = None
            if self._idle:
                self._arm_closer(max(0.05, IDLE_S - (now - min(at for _, at in self._idle))))
        for con in expired:
            self._close(con)

    def _close(self, con: duckdb.DuckDBPyConnection) -> None:
        key = f"con:{id(con)}" if self.views else str(self.db_path)
        with self._idle_lock:
            self._opened_on.pop(id(con), None)
        con.close()
        _TEMP.closed(key)

    def _warm(self) -> duckdb.DuckDBPyConnection | None:
        """A kept connection still opened on today's file, if any (stale ones are closed)."""
        sig, now, stale, found = self._file_signature(), time.monotonic(), [], None
        with self._idle_lock:
            while self._idle and found is None:
                con, at = self._idle.pop()
                if now - at < IDLE_S and (sig is not None or self.views) and self._opened_on.get(id(con)) == sig:
                    found = con
                else:
                    stale.append(con)
        for con in stale:
            self._close(con)
        return found

    def _connect(self) -> duckdb.DuckDBPyConnection:
        """A locked-down connection (a warm one when kept); its state (ok, or down with the
        reason) is recorded."""
        con = self._warm()
        if con is not None:
            self.last_ok, self.last_error = time.time(), None
            return con
        sig = self._file_signature()  # before opening: a file replaced meanwhile is not kept
        try:
            con = self._connect_views() if self.views else self._connect_file()
        except SQLError as exc:
            self.last_error = str(exc)
            raise
        with self._idle_lock:
            self._opened_on[id(con)] = sig
        self.opened += 1
        self.last_ok, self.last_error = time.time(), None
        return con

    def _connect_file(self) -> duckdb.DuckDBPyConnection:
        if not self.db_path.is_file():
            raise SQLError(f"warehouse not found: this workspace has no {self.db_path.name}")
        allowed = str(self.data_dir).rstrip("/") + "/"
        with _SETUP_LOCK:
            try:
                con = duckdb.connect(str(self.db_path), read_only=True, config=dict(_CONNECT_CONFIG))
            except duckdb.Error as exc:
                raise SQLError(f"cannot open the warehouse: {short_message(exc)}") from None
            try:
                locked = con.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]
                if locked:
                    # A connection elsewhere in this process already locked the
                    # shared instance; make sure it is locked down our way.
                    dirs, external = con.execute(
                        "SELECT current_setting('allowed_directories'), current_setting('enable_external_access')"
                    ).fetchall()[0]  # fetchall: DuckDB 2 refuses new work while a result is unfinished
                    if external or allowed not in (dirs or []):
                        raise SQLError("the warehouse is open in this process with other access settings")
                    _TEMP.opened(str(self.db_path))
                else:
                    # Order matters: allowed_directories can't change once
                    # external access is off, and nothing can once locked.
                    # no progress bar on stdout: it would end up in the server log
                    con.execute("SET enable_progress_bar=false")
                    temp = self.limits.new_temp_dir()
                    for stmt in [*self.limits.statements(temp), f"SET allowed_directories=[{_sql_literal(allowed)}]",
                                 "SET enable_external_access=false", "SET lock_configuration=true"]:
                        con.execute(stmt)
                    _TEMP.fresh(str(self.db_path), temp)
            except BaseException as exc:
                con.close()
                if isinstance(exc, duckdb.Error):
                    raise SQLError(f"cannot lock down the warehouse connection: {short_message(exc)}") from None
                raise
        return con

    def _connect_views(self) -> duckdb.DuckDBPyConnection:
        """An in-memory database whose views read the workspace's files (and its DuckDB file,
        attached read-only), locked down the same way before any user SQL runs."""
        allowed = str(self.data_dir).rstrip("/") + "/"
        con = duckdb.connect(":memory:", config=dict(_CONNECT_CONFIG))
        try:
            con.execute("SET enable_progress_bar=false")
            if self.db_path.is_file():
                con.execute(f"ATTACH {_sql_literal(str(self.db_path))} AS wh (READ_ONLY)")
                for (table,) in con.execute(
                        "SELECT table_name FROM duckdb_tables() WHERE database_name = 'wh' "
                        "UNION SELECT view_name FROM duckdb_views() WHERE database_name = 'wh' "
                        "AND NOT internal").fetchall():
                    con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM wh."{table}"')
            for name, target in self.views.items():
                reader = "read_parquet" if target.lower().endswith(".parquet") else "read_csv_auto"
                con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM {reader}({_sql_literal(target)})')
            temp = self.limits.new_temp_dir()
            for stmt in [*self.limits.statements(temp), f"SET allowed_directories=[{_sql_literal(allowed)}]",
                         "SET enable_external_access=false", "SET lock_configuration=true"]:
                con.execute(stmt)
            _TEMP.fresh(f"con:{id(con)}", temp)
        except duckdb.Error as exc:
            con.close()
            raise SQLError(f"cannot open the warehouse views: {short_message(exc)}") from None
        return con

    def _attach(self, control: QueryControl | None, timeout_s: float) -> tuple[duckdb.DuckDBPyConnection,
                                                                                 QueryControl]:
        """A locked-down connection under `control` (a new one with `timeout_s` when None)."""
        control = control or QueryControl(timeout_s)
        con = self._connect()
        try:
            control.attach(con)
        except BaseException:
            self._release(con, reusable=False)
            raise
        return con, control

    def query_sync(self, sql: str, control: QueryControl | None = None) -> QueryResult:
        """Run one read statement; at most max_rows rows come back (see QueryResult).
        `control` lets another thread cancel it (its timeout is then the deadline)."""
        check_statement(sql)
        if control is not None and control.timeout_s is None:
            control.timeout_s = self.timeout_s
        con, control = self._attach(control, self.timeout_s)
        clean = False
        try:
            con.execute(sql)
            description = con.description or []
            fetched = con.fetchmany(self.max_rows + 1)
            if control.cancelled:
                raise SQLCancelled("the query was cancelled")
            clean = len(fetched) <= self.max_rows  # read to the end, nothing pending
        except duckdb.Error as exc:
            raise self.translate(exc, control) from None
        finally:
            control.finish()
            self._release(con, reusable=clean and not (control.fired or control.cancelled))
        truncated = len(fetched) > self.max_rows
        return QueryResult(
            columns=[d[0] for d in description],
            types=[str(d[1]) for d in description],
            rows=[[jsonable(v) for v in row] for row in fetched[: self.max_rows]],
            row_count=len(fetched),
            truncated=truncated,
        )

    async def query(self, sql: str) -> QueryResult:
        """`query_sync` in a worker thread, so the event loop keeps serving. Cancelling the
        awaiting task interrupts the statement (the thread is free again within moments)."""
        check_statement(sql)  # fail fast on the loop: no thread for refused SQL
        control = QueryControl(self.timeout_s)
        try:
            # The deadline inside query_sync interrupts DuckDB; wait_for is a
            # backstop in case the engine is slow to notice the interrupt.
            return await interruptible(control, self.query_sync, sql, control,
                                       timeout_s=self.timeout_s + _ASYNC_GRACE_S)
        except asyncio.TimeoutError:
            raise SQLTimeout(timeout_message(self.timeout_s)) from None

    def check(self, sql: str) -> str:
        """One read statement (DuckDB's parser); its kind, "SELECT" or "EXPLAIN"."""
        return check_statement(sql)

    def record_batches(self, sql: str, user: str = "", control: QueryControl | None = None,
                       batch_size: int = 65_536, timeout_s: float | None = None) -> BatchStream:
        """Stream the result of one read statement as Arrow record batches.

        Validation, connection and binding happen now (errors raise here);
        execution happens as the stream is read. `control` (its own timeout, else
        `timeout_s`, else the warehouse's) lets another thread cancel it. `user` is
        not used: every call gets its own connection, the same for everyone.
        """
        check_statement(sql)
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if control is not None and control.timeout_s is None:
            control.timeout_s = timeout
        con, control = self._attach(control, timeout)
        try:
            rel = con.sql(sql)
            if rel is None:  # cannot happen for checked statements; be explicit anyway
                raise SQLError("statement returned no result set")
            sql_types = [str(t) for t in rel.types]  # before reading: the reader owns the connection
            make_reader = getattr(rel, "to_arrow_reader", None) or rel.fetch_record_batch
            reader = make_reader(batch_size)
        except BaseException as exc:
            control.finish()
            self._release(con, reusable=False)
            if not isinstance(exc, duckdb.Error):
                raise
            raise self.translate(exc, control) from None
        stream = BatchStream(con, reader, control, self.translate, self._release)
        stream.sql_types = sql_types
        return stream

    def translate(self, exc: BaseException, control: QueryControl) -> SQLError:
        """What an engine error means: cancelled, timed out, past a limit, or DuckDB's own message."""
        if isinstance(exc, SQLError):
            return exc
        if control.cancelled:
            return control.cancelled_error()
        if control.fired:
            return SQLTimeout(timeout_message(control.timeout_s or 0))
        limited = limit_message(exc, self.limits)
        if limited is not None:
            return SQLLimit(limited)
        return SQLError(short_message(exc))

    def describe(self) -> list[TableInfo]:
        """Tables and views of the warehouse with their columns, types and comments."""
        con = self._connect()
        try:
            objects = con.execute(_OBJECTS_SQL).fetchall()
            columns = con.execute(_COLUMNS_SQL).fetchall()
        except duckdb.Error as exc:
            raise SQLError(short_message(exc)) from None
        finally:
            self._release(con)
        by_table: dict[tuple[str, str], list[ColumnInfo]] = {}
        for schema, table, name, typ, comment in columns:
            by_table.setdefault((schema, table), []).append(ColumnInfo(name, typ, comment or None))
        return [
            TableInfo(
                name=table, kind=kind, schema=schema, comment=comment or None,
                row_estimate=size, columns=by_table.get((schema, table), []),
            )
            for schema, table, kind, comment, size in objects
        ]

    def probe(self) -> None:
        """Open a locked-down connection once; the state records the outcome. Never raises."""
        try:
            self._release(self._connect())
        except SQLError:
            pass

    def status(self) -> dict[str, Any]:
        """The same keys as a configured source's status (`database.DatabaseSource.status`)."""
        state = "down" if self.last_error else "ok" if self.last_ok is not None else "unknown"
        return {"name": self.name, "kind": self.kind, "dialect": self.dialect, "description": self.description,
                "url": self.db_path.name, "schemas": [], "state": state, "reason": self.last_error,
                "notes": [], "open_connections": 0}

    def close(self) -> None:
        """Close the warm connections (a running query keeps its own until it ends, then it is
        closed: a warehouse replaced by a reloaded config keeps none warm)."""
        with self._idle_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for con, _ in idle:
            self._close(con)
