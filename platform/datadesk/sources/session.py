"""Sessions of a source: the driver interface, the pool, and the stream of one query.

A `Session` is one open database connection, read-only by the database's own rules (each
driver module says how). The `SessionPool` of a source keeps them per user, so two users
never share a session (nor its state), with a cap per user and one for the source. A
`SourceStream` is one query's Arrow batches, a `query.ResultStream` as the warehouse's
`BatchStream` is (schema, sql_types, iteration, extend, interrupt, close), so the SQL tool and
the offload writer treat both alike; closing it ends the transaction and gives the session back.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator, Protocol

import pyarrow as pa

from datadesk.sources.errors import SQLError
from datadesk.sources.normalize import Normalizer
from datadesk.sources.query import ControlledStream, QueryControl


class SourceBusy(SQLError):
    """No session of the source is free for this user now (the message names the limit)."""


class SourceDown(SQLError):
    """The source cannot be reached or refused the login (the message says why, never a secret)."""


class Session(Protocol):
    """One connection to a source, read-only in the database session itself."""

    broken: bool  # the connection failed: close it, never reuse it

    def execute(self, sql: str, batch_size: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
        """Start `sql` in a fresh read-only transaction: its schema, batches and SQL type names."""

    def interrupt(self) -> None:
        """Cancel the running statement (from any thread)."""

    def end(self) -> None:
        """End the transaction (rolled back: nothing a query did outlives it) so the session can be reused."""

    def close(self) -> None:
        """Close the connection (idempotent)."""


Translate = Callable[[BaseException, QueryControl], SQLError]


class SourceStream(ControlledStream):
    """Arrow record batches of one source query (normalised types); close it when done: the
    session goes back to its pool (broken, when the stream stopped early)."""

    def __init__(self, session: Session, schema: pa.Schema, batches: Iterator[pa.RecordBatch], sql_types: list[str],
                 control: QueryControl, translate: Translate, release: Callable[[Session], None]) -> None:
        super().__init__(session, control, translate, release)
        self._session, self._batches = session, batches
        self._normalize = Normalizer(schema)
        self.schema: pa.Schema = self._normalize.schema
        self.sql_types = sql_types
        self._exhausted = False  # read to its end: the session may be reused

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            for batch in self._batches:
                if self._control.cancelled:
                    raise self._control.cancelled_error()
                yield self._normalize(batch)
            if self._control.cancelled or self._control.fired:
                raise self._translate(RuntimeError("interrupted"), self._control)
            self._exhausted = True
        except SQLError:
            self._session.broken = self._session.broken or self._control.cancelled or self._control.fired
            raise
        except Exception as exc:  # driver errors, a dropped connection, a conversion that failed
            self._session.broken = True
            raise self._translate(exc, self._control) from None
        finally:
            self.close()

    def _on_close(self) -> None:
        if not self._exhausted:  # stopped early: the statement may still be sending; never reuse
            self._session.broken = True
            self._session.interrupt()


class SessionPool:
    """Open sessions of one source, kept per user: at most `max_total` open, at most `max_per_user`
    for one user. An idle session is reused only by the user who had it, and closed after `idle_s`."""

    def __init__(self, source: str, open_session: Callable[[], Session], max_total: int, max_per_user: int,
                 idle_s: float = 300.0, wait_s: float = 10.0) -> None:
        self.source = source
        self._open = open_session
        self.max_total, self.max_per_user = max_total, max_per_user
        self.idle_s, self.wait_s = idle_s, wait_s
        self._cond = threading.Condition()
        self._idle: dict[str, list[tuple[float, Session]]] = {}
        self._count: dict[str, int] = {}  # open sessions per user (idle + in use)
        self._closed = False  # after close_all, sessions given back are closed, not kept

    @property
    def open_count(self) -> int:
        with self._cond:
            return sum(self._count.values())

    def _drop_locked(self, user: str, session: Session) -> None:
        self._count[user] -= 1
        self._cond.notify_all()
        threading.Thread(target=_quiet_close, args=(session,), daemon=True).start()

    def _expire_locked(self, now: float) -> None:
        for user, idle in self._idle.items():
            while idle and now - idle[0][0] > self.idle_s:
                self._drop_locked(user, idle.pop(0)[1])

    def _evict_other_locked(self, user: str) -> bool:
        for other, idle in self._idle.items():
            if other != user and idle:
                self._drop_locked(other, idle.pop(0)[1])
                return True
        return False

    def acquire(self, user: str) -> Session:
        """A session for `user`: their idle one, else a new one; SourceBusy past a limit."""
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while True:
                self._expire_locked(time.monotonic())
                idle = self._idle.get(user)
                if idle:
                    return idle.pop()[1]
                mine = self._count.get(user, 0)
                if mine >= self.max_per_user:
                    raise SourceBusy(f"you already have {mine} queries running on source {self.source!r} "
                                     f"(max_connections_per_user = {self.max_per_user}); wait for them to finish")
                if sum(self._count.values()) < self.max_total or self._evict_other_locked(user):
                    self._count[user] = mine + 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SourceBusy(f"all {self.max_total} connections of source {self.source!r} are busy "
                                     "(max_connections); try again in a moment")
                self._cond.wait(left)
        try:
            return self._open()
        except BaseException:
            with self._cond:
                self._count[user] -= 1
                self._cond.notify_all()
            raise

    def release(self, user: str, session: Session) -> None:
        """Give `session` back: reused by `user` when its transaction ended cleanly, else closed."""
        reusable = not session.broken
        if reusable:
            try:
                session.end()
            except Exception:
                reusable = False
        with self._cond:
            if reusable and not self._closed:
                self._idle.setdefault(user, []).append((time.monotonic(), session))
                self._cond.notify_all()
            else:
                self._drop_locked(user, session)

    def close_idle(self) -> None:
        """Close every idle session (of every user); sessions in use are closed when given back only
        if broken, so callers mark them."""
        with self._cond:
            for user, idle in self._idle.items():
                while idle:
                    self._drop_locked(user, idle.pop()[1])

    def close_all(self) -> None:
        with self._cond:
            self._closed = True
            for user, idle in self._idle.items():
                while idle:
                    self._drop_locked(user, idle.pop()[1])


def _quiet_close(session: Session) -> None:
    try:
        session.close()
    except Exception:
        pass
