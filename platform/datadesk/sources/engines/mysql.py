"""MySQL and MariaDB through asyncmy (a Cython MySQL protocol driver with wheels on PyPI).

Rows stream unbuffered (`SSCursor`) and become Arrow batches with the result's own column
types (engines/rowbatches.py). Nothing of the session's past is trusted: before every query the
session is set again (utf8mb4, UTC, `max_statement_time` (MariaDB, seconds) or
`max_execution_time` (MySQL, ms), read-only), the query runs in its own
`START TRANSACTION READ ONLY`, and afterwards it is rolled back and the connection reset with
`COM_RESET_CONNECTION` (session and user variables, GET_LOCK locks, temp tables, prepared
statements: gone; a session whose reset fails is closed). Stop and the client deadline send
`KILL QUERY <id>` from a second connection.

asyncmy is asynchronous; each session runs its own small event loop, used only by the
thread that calls it (the SQL tool's or the offload writer's worker thread).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any, Iterator

import pyarrow as pa

from datadesk.sources.config import ParsedSource, resolve_env
from datadesk.sources.engines.rowbatches import mysql_field, rows_to_batch
from datadesk.sources.session import SourceDown

_CONNECT_TIMEOUT_S = 5
TIMEOUT_CODES = {1969, 3024}  # MariaDB max_statement_time, MySQL max_execution_time
KILLED = 1317  # query execution was interrupted (KILL QUERY)
COM_RESET_CONNECTION = 0x1F  # MySQL 5.7.3+, MariaDB 10.2.4+
_RECEIVE_BUFFER = 1 << 20


def _connect_args(src: ParsedSource) -> dict[str, Any]:
    cfg = src.config
    args: dict[str, Any] = {"host": src.host, "port": src.port or 3306, "user": src.user, "db": src.database,
                            "connect_timeout": _CONNECT_TIMEOUT_S, "autocommit": True, "charset": "utf8mb4"}
    if cfg.password:
        args["password"] = resolve_env(cfg.password, f"sources.{src.name}.password")
    for key, value in cfg.options.items():
        args[key] = resolve_env(value, f"sources.{src.name}.options.{key}")
    return args


class MySQLSession:
    """One MySQL/MariaDB connection with its own event loop; each `execute` is a READ ONLY transaction."""

    def __init__(self, src: ParsedSource, timeout_s: float) -> None:
        import asyncmy

        self.broken = False
        self._src = src
        self._args = _connect_args(src)
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._running = False
        try:
            self._con = self._run(asyncmy.connect(**self._args))
            _bound_receive_buffer(self._con)
            version = self._scalar("SELECT VERSION()")
            self.mariadb = "mariadb" in str(version).lower()
            limit = (f"max_statement_time = {timeout_s:g}" if self.mariadb
                     else f"max_execution_time = {int(timeout_s * 1000)}")
            # session-level read-only too: MySQL DDL commits the open transaction implicitly and
            # would run outside START TRANSACTION READ ONLY, but not in a read-only session
            read_only = "tx_read_only" if self.mariadb else "transaction_read_only"
            self._setup = f"SET NAMES utf8mb4, time_zone = '+00:00', {limit}, SESSION {read_only} = 1"
            self._run(self._exec(self._setup))
            self.thread_id = int(self._scalar("SELECT CONNECTION_ID()"))
        except Exception as exc:
            self._loop.close()
            raise SourceDown(f"cannot connect to source {src.name!r} (mysql at {src.host}:{src.port or 3306}): "
                             f"{clean_message(exc)}") from None

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    async def _exec(self, sql: str) -> None:
        async with self._con.cursor() as cur:
            await cur.execute(sql)

    def _scalar(self, sql: str) -> Any:
        async def go() -> Any:
            async with self._con.cursor() as cur:
                await cur.execute(sql)
                row = await cur.fetchone()
                return row[0] if row else None
        return self._run(go())

    def execute(self, sql: str, batch_size: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
        from asyncmy.cursors import SSCursor

        self._run(self._exec(self._setup))  # as at connect: never trusted from an earlier query
        self._run(self._exec("START TRANSACTION READ ONLY"))
        with self._lock:
            self._running = True
        cur = self._con.cursor(SSCursor)
        self._run(cur.execute(sql))
        pairs = [mysql_field(f.name, f.type_code, f.flags, f.length, f.scale, f.charsetnr)
                 for f in (cur._result.fields if cur._result is not None else [])]
        schema = pa.schema([p[0] for p in pairs])
        return schema, self._batches(cur, schema, batch_size), [p[1] for p in pairs]

    def _batches(self, cur: Any, schema: pa.Schema, batch_size: int) -> Iterator[pa.RecordBatch]:
        try:
            while True:
                rows = self._run(cur.fetchmany(batch_size))
                if not rows:
                    break
                yield rows_to_batch(rows, schema)
        finally:
            with self._lock:
                self._running = False

    def interrupt(self) -> None:
        """KILL QUERY from a second connection (the one running is busy streaming)."""
        with self._lock:
            if not self._running:
                return
        threading.Thread(target=self._kill, daemon=True).start()

    def _kill(self) -> None:
        import asyncmy

        async def go() -> None:
            con = await asyncmy.connect(**self._args)
            try:
                async with con.cursor() as cur:
                    await cur.execute(f"KILL QUERY {self.thread_id}")
            finally:
                con.close()
        try:
            asyncio.run(go())
        except Exception:
            self.broken = True

    def end(self) -> None:
        """Roll back, then COM_RESET_CONNECTION: what the query did to the session is undone."""
        if self.broken:
            raise RuntimeError("broken session")
        self._run(self._exec("ROLLBACK"))
        self._run(self._reset())  # the next execute sets the session again before its transaction

    async def _reset(self) -> None:
        await self._con._execute_command(COM_RESET_CONNECTION, b"")
        await self._con._read_ok_packet()

    def close(self) -> None:
        try:
            self._con.close()
        finally:
            self._loop.close()


def _bound_receive_buffer(con: Any) -> None:
    """Cap the socket's receive buffer: asyncmy parses every complete row it has received into
    Python objects, and with the kernel's auto-tuned buffer (several MB per read on a fast link)
    a streamed result's backlog grew with the result. 1 MiB per read keeps it bounded."""
    sock = con._transport.get_extra_info("socket") if getattr(con, "_transport", None) is not None else None
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
        except OSError:
            pass


def error_code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def clean_message(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return f"{args[1]} (error {args[0]})"
    return str(exc) or type(exc).__name__


def is_timeout(exc: BaseException) -> bool:
    return error_code(exc) in TIMEOUT_CODES


def is_connection_error(exc: BaseException) -> bool:
    code = error_code(exc)
    return (code is not None and 2000 <= code < 3000) or code in (1927, 1053) or isinstance(
        exc, (ConnectionError, asyncio.IncompleteReadError, EOFError))


def catalog_sql(database: str, schemas: list[str]) -> str:
    wanted = schemas or [database]
    names = ", ".join("'" + s.replace("\\", "\\\\").replace("'", "''") + "'" for s in wanted)
    return f"""
SELECT c.TABLE_SCHEMA, c.TABLE_NAME, IF(t.TABLE_TYPE = 'VIEW', 'view', 'table'), NULLIF(t.TABLE_COMMENT, ''),
       t.TABLE_ROWS, c.COLUMN_NAME, c.COLUMN_TYPE, NULLIF(c.COLUMN_COMMENT, '')
FROM information_schema.COLUMNS c JOIN information_schema.TABLES t
  ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME
WHERE c.TABLE_SCHEMA IN ({names})
ORDER BY c.TABLE_SCHEMA, c.TABLE_NAME, c.ORDINAL_POSITION"""
