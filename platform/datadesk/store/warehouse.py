"""Locked-down, read-only SQL access to a workspace's DuckDB warehouse file.

Every query gets a fresh connection (so callers on different threads never
share one), opened read-only with extension auto-install/auto-load off, and
then locked down before any user SQL runs:

    SET allowed_directories=['<data_dir>/']   only the workspace's data dir
    SET enable_external_access=false          no other files, no network
    SET memory_limit, threads, temp_directory, max_temp_directory_size
                                              bounds (store/sqllimits.py)
    SET lock_configuration=true               the SQL cannot undo the above

Two layers guard the warehouse: the statement check here (only SELECT-like
statements and EXPLAIN of a SELECT get through) and the engine settings above
(which would still stop a file read outside the data dir if the check missed
one). `COPY ... TO` into the data dir is allowed by the engine settings, so the
statement check is what refuses it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import functools
import math
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import duckdb
import msgspec
import pyarrow as pa

from datadesk.store.sqllimits import SQLLimits, TempDirs, limit_message

# Opening the same file twice in one process shares one DuckDB instance (the
# Python client's instance cache), and its settings are instance-wide: once
# locked they cannot be SET again. This lock makes "open, then lock down or
# verify the lockdown" atomic with respect to other threads.
_SETUP_LOCK = threading.Lock()
T = TypeVar("T")
_TEMP = TempDirs()  # spill directory of each instance, removed with its last connection
_CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
# Extra time the async wrapper waits beyond the statement timeout before giving
# up on a worker thread whose query ignored the interrupt.
_ASYNC_GRACE_S = 5.0
_MESSAGE_CHARS = 500
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


class SQLError(Exception):
    """A query the model or user can fix: bad SQL, missing warehouse, engine error."""


class SQLRefused(SQLError):
    """A statement that is not a read (COPY, ATTACH, SET, PRAGMA, CREATE, ...) or several at once."""


class SQLTimeout(SQLError):
    """The statement ran past the timeout and was interrupted."""


class SQLLimit(SQLError):
    """The statement needed more memory or temp space than the limits allow and was stopped."""


class SQLCancelled(SQLError):
    """The call was cancelled (Stop, the turn ended) and the statement was interrupted."""


class ColumnInfo(msgspec.Struct, frozen=True):
    name: str
    type: str
    comment: str | None = None


class TableInfo(msgspec.Struct, frozen=True):
    """One table or view in the warehouse, as `Warehouse.describe()` lists it."""

    name: str
    kind: str  # "table" | "view"
    columns: list[ColumnInfo]
    schema: str = "main"
    comment: str | None = None
    row_estimate: int | None = None


class QueryResult(msgspec.Struct):
    """The rows of one query, JSON-able.

    `row_count` counts rows produced, but only up to max_rows + 1 (enough to
    know the result was cut): when `truncated` is True the real total is larger
    than `len(rows)` and `row_count` is a lower bound.
    """

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    row_count: int
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _timeout_message(timeout_s: float) -> str:
    return f"query exceeded {timeout_s:g} s; narrow it or add a LIMIT"


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def jsonable(value: Any) -> Any:
    """A DuckDB Python value as something msgspec/json can encode without loss of meaning."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        # HUGEINT/UHUGEINT can exceed what JSON encoders accept as a number.
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, float):
        # NaN/Infinity are not JSON; null keeps the column numeric for Arrow.
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        return float(value) if value.is_finite() else None
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return str(value)


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
        raise SQLError(_short(exc)) from None
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


class QueryControl:
    """Stops one statement: at its deadline (a timer) or when `cancel()` is called, from any
    thread (the task awaiting the query was cancelled). Both use DuckDB's `interrupt()` on the
    statement's connection, under a lock so it never races with the connection closing.

    Created before the connection exists (the caller may cancel that early): `attach` hands
    it the connection and starts the timer, or refuses when the cancel came first.
    """

    def __init__(self, timeout_s: float | None = None) -> None:
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._done = False
        self._timer: threading.Timer | None = None
        self.timeout_s = timeout_s
        self.fired = False  # the deadline interrupted the statement
        self.limits: SQLLimits | None = None  # set by the warehouse: names the limit an error hit
        self.cancelled = False  # cancel() did
        self.reason: str | None = None  # why, when it was not the user (e.g. the app's memory ceiling)

    def attach(self, con: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            if self.cancelled:
                raise SQLCancelled("the query was cancelled")
            self._con = con
        self.restart(self.timeout_s)

    def restart(self, timeout_s: float | None) -> None:
        """Start the deadline again from now with `timeout_s` (None or 0: no deadline)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.timeout_s = timeout_s
        if timeout_s and timeout_s > 0:
            self._timer = threading.Timer(timeout_s, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if not self._done and self._con is not None:
                self.fired = True
                self._con.interrupt()

    def cancel(self, reason: str | None = None) -> None:
        """Interrupt the statement now (safe from any thread, before or after it started);
        `reason` becomes the error's message (a limit the app enforced, not the user's Stop)."""
        with self._lock:
            if self._done:
                return
            self.cancelled = True
            self.reason = self.reason or reason
            if self._con is not None:
                self._con.interrupt()

    def cancelled_error(self) -> SQLError:
        """The error of a cancelled statement: the limit the app enforced (`reason`), else the
        user's Stop or a tool timeout."""
        return SQLLimit(self.reason) if self.reason else SQLCancelled("the query was cancelled")

    def finish(self) -> None:
        with self._lock:
            self._done = True
        if self._timer is not None:
            self._timer.cancel()

    def error(self, exc: BaseException) -> SQLError:
        """What an engine error means: cancelled, timed out, or the engine's own message."""
        if self.cancelled:
            return self.cancelled_error()
        if self.fired:
            return SQLTimeout(_timeout_message(self.timeout_s or 0))
        limited = limit_message(exc, self.limits) if self.limits is not None else None
        if limited is not None:
            return SQLLimit(limited)
        return SQLError(_short(exc))


class BatchStream:
    """Arrow record batches of one query, streamed; close it (or use `with`) when done.

    Not capped by max_rows: the consumer (e.g. a Parquet writer) decides how
    much to read. The statement timeout covers the whole stream.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, reader: pa.RecordBatchReader,
                 control: QueryControl, release: Callable[[duckdb.DuckDBPyConnection], None] | None = None) -> None:
        self._con, self._reader, self._control = con, reader, control
        self._release = release or (lambda c: c.close())
        self.schema: pa.Schema = reader.schema
        self.sql_types: list[str] = []  # DuckDB's own type names (BIGINT, TIMESTAMP, ...)
        self._closed = False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._reader
        except (duckdb.Error, pa.ArrowException, OSError) as exc:  # an interrupt surfaces as OSError too
            raise self._control.error(exc) from None
        finally:
            self.close()

    def extend(self, timeout_s: float) -> None:
        """Restart the deadline with `timeout_s` (a result that started streaming may take
        longer to write out than a statement may take to produce its first rows)."""
        self._control.restart(timeout_s)

    def interrupt(self) -> None:
        """Stop the query from any thread (a cancelled call): the reader raises SQLCancelled."""
        self._control.cancel()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._control.finish()
            self._release(self._con)

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Warehouse:
    """Read-only, locked-down SQL over one workspace's DuckDB file.

    `data_dir` is the only directory the SQL may read files from (it holds the
    database file). Safe to share across threads and tasks: each call opens
    its own connection.
    """

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

    def _release(self, con: duckdb.DuckDBPyConnection) -> None:
        """Close a connection from `_connect`; the last one of an instance removes its spill dir."""
        key = f"con:{id(con)}" if self.views else str(self.db_path)
        con.close()
        _TEMP.closed(key)

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self.views:
            return self._connect_views()
        if not self.db_path.is_file():
            raise SQLError(f"warehouse not found: this workspace has no {self.db_path.name}")
        allowed = str(self.data_dir).rstrip("/") + "/"
        with _SETUP_LOCK:
            try:
                con = duckdb.connect(str(self.db_path), read_only=True, config=dict(_CONNECT_CONFIG))
            except duckdb.Error as exc:
                raise SQLError(f"cannot open the warehouse: {_short(exc)}") from None
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
                    raise SQLError(f"cannot lock down the warehouse connection: {_short(exc)}") from None
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
            raise SQLError(f"cannot open the warehouse views: {_short(exc)}") from None
        return con

    def _attach(self, control: QueryControl | None, timeout_s: float) -> tuple[duckdb.DuckDBPyConnection,
                                                                                 QueryControl]:
        """A locked-down connection under `control` (a new one with `timeout_s` when None)."""
        control = control or QueryControl(timeout_s)
        control.limits = self.limits
        con = self._connect()
        try:
            control.attach(con)
        except BaseException:
            self._release(con)
            raise
        return con, control

    def query_sync(self, sql: str, control: QueryControl | None = None) -> QueryResult:
        """Run one read statement; at most max_rows rows come back (see QueryResult).
        `control` lets another thread cancel it (its timeout is then the deadline)."""
        check_statement(sql)
        if control is not None and control.timeout_s is None:
            control.timeout_s = self.timeout_s
        con, control = self._attach(control, self.timeout_s)
        try:
            con.execute(sql)
            description = con.description or []
            fetched = con.fetchmany(self.max_rows + 1)
            if control.cancelled:
                raise SQLCancelled("the query was cancelled")
        except duckdb.Error as exc:
            raise control.error(exc) from None
        finally:
            control.finish()
            self._release(con)
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
            raise SQLTimeout(_timeout_message(self.timeout_s)) from None

    def record_batches(self, sql: str, batch_size: int = 65_536,
                       timeout_s: float | None = None, control: QueryControl | None = None) -> BatchStream:
        """Stream the result of one read statement as Arrow record batches.

        Validation, connection and binding happen now (errors raise here);
        execution happens as the stream is read. `control` (its own timeout, else
        `timeout_s`, else the warehouse's) lets another thread cancel it.
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
            self._release(con)
            if not isinstance(exc, duckdb.Error):
                raise
            raise control.error(exc) from None
        stream = BatchStream(con, reader, control, self._release)
        stream.sql_types = sql_types
        return stream

    def describe(self) -> list[TableInfo]:
        """Tables and views of the warehouse with their columns, types and comments."""
        con = self._connect()
        try:
            objects = con.execute(_OBJECTS_SQL).fetchall()
            columns = con.execute(_COLUMNS_SQL).fetchall()
        except duckdb.Error as exc:
            raise SQLError(_short(exc)) from None
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


async def interruptible(control: QueryControl, fn: Callable[..., T], *args: Any,
                        timeout_s: float | None = None, late: Callable[[T], None] | None = None) -> T:
    """`fn(*args)` in a worker thread; when the awaiting task is cancelled or `timeout_s`
    passes, `control.cancel()` interrupts the statement and the thread is waited for briefly
    (so its connection is closed before the cancellation goes on). A result that arrived
    anyway is handed to `late` (e.g. to close a stream nobody will read)."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except (asyncio.CancelledError, asyncio.TimeoutError):
        control.cancel()
        await asyncio.wait({task}, timeout=_ASYNC_GRACE_S)
        task.add_done_callback(functools.partial(_late_result, late))
        raise


def _late_result(late: Callable[[Any], None] | None, task: asyncio.Future[Any]) -> None:
    if task.cancelled() or task.exception() is not None:
        return  # retrieved: the caller got the cancellation, not this
    if late is not None:
        late(task.result())
