"""One query on any source: its control (deadline, cancel), the stream and rows it gives back,
and the catalogue records a source describes itself with.

The warehouse (`warehouse.py`) and the configured databases (`database.py`) both run a
statement under a `QueryControl` and hand back a `ResultStream`; the SQL tool and the offload
writer read either the same way.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import functools
import math
import threading
import uuid
from concurrent.futures import Executor
from typing import Any, Callable, Iterator, Protocol, TypeVar

import msgspec
import pyarrow as pa

from datadesk.sources.errors import SQLCancelled, SQLError, SQLLimit
from datadesk.store.fair_queue import in_thread

T = TypeVar("T")
# How long a cancelled call waits for its worker thread to give the connection back.
ASYNC_GRACE_S = 5.0


class Interruptible(Protocol):
    """What a control stops: a DuckDB connection or a source's session."""

    def interrupt(self) -> None: ...


class QueryControl:
    """Stops one statement: at its deadline (a timer) or when `cancel()` is called, from any
    thread (the task awaiting the query was cancelled). Both call `interrupt()` on what runs
    the statement (a connection, a session), under a lock so it never races with its closing.

    Created before the connection exists (the caller may cancel that early): `attach` hands
    it the connection and starts the timer, or refuses when the cancel came first.
    """

    def __init__(self, timeout_s: float | None = None) -> None:
        self._lock = threading.Lock()
        self._con: Interruptible | None = None
        self._done = False
        self._timer: threading.Timer | None = None
        self.timeout_s = timeout_s
        self.fired = False  # the deadline interrupted the statement
        self.cancelled = False  # cancel() did
        self.reason: str | None = None  # why, when it was not the user (e.g. the app's memory ceiling)

    def attach(self, con: Interruptible) -> None:
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


class ResultStream(Protocol):
    """Arrow record batches of one query, streamed; close it (or use `with`) when done.
    Not capped by rows: the reader (e.g. the Parquet writer) decides how much to read."""

    schema: pa.Schema
    sql_types: list[str]  # the engine's own type names (BIGINT, TIMESTAMP, ...)

    def __iter__(self) -> Iterator[pa.RecordBatch]: ...

    def extend(self, timeout_s: float) -> None:
        """Restart the deadline: rows are flowing, writing them out may take longer."""

    def interrupt(self) -> None:
        """Stop the query from any thread (a cancelled call)."""

    def close(self) -> None: ...

    def __enter__(self) -> "ResultStream": ...

    def __exit__(self, *exc: object) -> None: ...


class ControlledStream:
    """What every engine's `ResultStream` shares: the resource it reads from (a connection or a
    pooled session), its `QueryControl`, how the engine turns an error into an `SQLError`, and
    how the resource goes back when the stream closes (`_on_close` first: what an engine must
    do to a resource left half read)."""

    def __init__(self, resource: Any, control: QueryControl,
                 translate: Callable[[BaseException, QueryControl], SQLError],
                 release: Callable[[Any], None]) -> None:
        self._resource, self._control = resource, control
        self._translate, self._release = translate, release
        self._closed = False

    def extend(self, timeout_s: float) -> None:
        """Restart the deadline with `timeout_s` (a result that started streaming may take
        longer to write out than a statement may take to produce its first rows)."""
        self._control.restart(timeout_s)

    def interrupt(self) -> None:
        """Stop the query from any thread (a cancelled call)."""
        self._control.cancel()

    def _on_close(self) -> None:
        """Before the resource goes back (nothing by default)."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._control.finish()
            self._on_close()
            self._release(self._resource)

    def __enter__(self) -> "ControlledStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ColumnInfo(msgspec.Struct, frozen=True):
    name: str
    type: str
    comment: str | None = None


class TableInfo(msgspec.Struct, frozen=True):
    """One table or view of a source, as its `describe()` lists it."""

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


def jsonable(value: Any) -> Any:
    """A Python value from an engine as something msgspec/json can encode without loss of meaning."""
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


async def interruptible(control: QueryControl, fn: Callable[..., T], *args: Any,
                        timeout_s: float | None = None, late: Callable[[T], None] | None = None,
                        executor: Executor | None = None) -> T:
    """`fn(*args)` in a worker thread; when the awaiting task is cancelled or `timeout_s`
    passes, `control.cancel()` interrupts the statement and the thread is waited for briefly
    (so its connection is closed before the cancellation goes on). A result that arrived
    anyway is handed to `late` (e.g. to close a stream nobody will read). `executor`: the
    threads to run in (the query slots' own: a query holding a slot never waits for a thread
    behind other work), else the loop's default ones."""
    task = asyncio.ensure_future(in_thread(executor, fn, *args))
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except (asyncio.CancelledError, asyncio.TimeoutError):
        control.cancel()
        await asyncio.wait({task}, timeout=ASYNC_GRACE_S)
        task.add_done_callback(functools.partial(_late_result, late))
        raise


def _late_result(late: Callable[[Any], None] | None, task: asyncio.Future[Any]) -> None:
    if task.cancelled() or task.exception() is not None:
        return  # retrieved: the caller got the cancellation, not this
    if late is not None:
        late(task.result())
