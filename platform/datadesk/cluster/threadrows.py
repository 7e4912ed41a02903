"""The rows behind a cluster thread: the hold on its `threads` row, and its records.

A **hold** is one transaction that has taken the thread's row `FOR UPDATE` and checked its
epoch (and, for an append, the turn's fence). Appends, clear and guarded writes all take that
row, so they are serialized across every host, and a write checks the epoch in the very
transaction that makes it. Writes of the same thread inside a hold join it (`Hold.current`):
a read, a check and several writes are one transaction.

`PgRecords` is the record log of one thread (`records` rows, PK (thread_id, seq)): an append
takes the hold, writes seq = last_seq + 1 and moves `threads.last_seq` in the same statement;
reads are keyset queries on the primary key, newest pages first where callers stop early.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import msgspec
import psycopg

from datadesk.cluster.database import Database
from datadesk.domain.records import Record, record_decoder, record_encoder
from datadesk.store.interfaces.threads import LogClosed, TurnFenced
from datadesk.store.threadlog import find_records



class PgThread(Protocol):
    """What the rows need of a cluster thread (cluster/threads.py `PgThread`)."""

    db: Database

    @property
    def id(self) -> str: ...

    @property
    def dir(self) -> Path: ...

log = logging.getLogger(__name__)

FIRST_PAGE = 64  # records read by the first page of a newest-first scan; each next one 4x, up to
MAX_PAGE = 4096
ITER_PAGE = 1000  # records per page of an oldest-first scan


@dataclass
class Hold:
    """A transaction holding one thread's row (see the module doc)."""

    conn: psycopg.Connection
    epoch: int
    last_seq: int
    owner: int = 0  # the OS thread that holds it
    live: bool = True  # False once its transaction ended


def _joinable(held: Hold | None) -> Hold | None:
    """`held` if it can be joined here: still open and held by this OS thread (a task or thread
    started inside a hold inherits the context, never the transaction)."""
    return held if held is not None and held.live and held.owner == threading.get_ident() else None


# the holds of this context (OS thread or task), by (database, thread id): a write inside a
# hold of its thread joins it instead of waiting for the row it already holds
_HOLDS: ContextVar[dict[tuple[int, str], Hold]] = ContextVar("datadesk_thread_holds", default={})

_LOCK_ROW = "SELECT epoch, last_seq FROM threads WHERE id = %s FOR UPDATE"
# the fence as cluster/turns.py `fence_holds` checks it: the turn's row still running under this
# fence, share-locked until the write commits, so a claim that bumps the fence waits for the write
_HOLDS_FENCE = "SELECT 1 FROM turns WHERE thread_id = %s AND fence = %s AND state = 'running' FOR SHARE"
_LOCK_ROW_FENCED = (f"SELECT epoch, last_seq, EXISTS ({_HOLDS_FENCE}) "
                    "AS fenced FROM threads WHERE id = %s FOR UPDATE")
_FENCE = f"SELECT EXISTS ({_HOLDS_FENCE}) AS fenced"


# the turn's row is read FOR SHARE, as fence_holds does: a takeover's fence bump waits for this
# append to commit instead of passing it
_APPEND_KNOWN = (
    "WITH f AS (SELECT 1 FROM turns WHERE %(fence)s::bigint IS NOT NULL AND thread_id = %(tid)s"
    " AND fence = %(fence)s AND state = 'running' FOR SHARE),"
    " t AS (UPDATE threads SET last_seq = %(seq)s WHERE id = %(tid)s AND last_seq = %(prev)s"
    " AND (%(epoch)s::bigint IS NULL OR epoch = %(epoch)s)"
    " AND (%(fence)s::bigint IS NULL OR EXISTS (SELECT 1 FROM f)) RETURNING id)"
    " INSERT INTO records (thread_id, seq, body) SELECT id, %(seq)s, %(body)s FROM t RETURNING seq")


def current_hold(thread: "PgThread") -> Hold | None:
    return _joinable(_HOLDS.get().get((id(thread.db), thread.id)))


@contextlib.contextmanager
def hold(thread: "PgThread", epoch: int | None, fence: int | None = None) -> Iterator[Hold]:
    """Hold `thread`'s row while it is in `epoch` (None: any) and, with `fence`, while the turn
    with that fence holds it; LogClosed / TurnFenced otherwise. Nested holds join the outer."""
    key = (id(thread.db), thread.id)
    holds = _HOLDS.get()
    outer = _joinable(holds.get(key))
    if outer is not None:
        _check_epoch(thread, outer.epoch, epoch)
        if fence is not None and not outer.conn.execute(_FENCE, (thread.id, fence)).fetchone()["fenced"]:
            raise _fenced(thread, fence)
        yield outer
        return
    with thread.db.connection() as conn:
        if fence is None:
            row = conn.execute(_LOCK_ROW, (thread.id,)).fetchone()
        else:
            row = conn.execute(_LOCK_ROW_FENCED, (thread.id, fence, thread.id)).fetchone()
        if row is None:
            raise LogClosed(f"thread {thread.id} no longer exists")
        _check_epoch(thread, row["epoch"], epoch)
        if fence is not None and not row["fenced"]:
            raise _fenced(thread, fence)
        held = Hold(conn, row["epoch"], row["last_seq"], owner=threading.get_ident())
        token = _HOLDS.set({**holds, key: held})
        try:
            yield held
        finally:
            held.live = False
            _HOLDS.reset(token)


def _check_epoch(thread: "PgThread", stored: int, epoch: int | None) -> None:
    if epoch is not None and stored != epoch:
        raise LogClosed(f"thread {thread.id} was cleared")


def _fenced(thread: "PgThread", fence: int) -> TurnFenced:
    return TurnFenced(f"thread {thread.id}: the turn with fence {fence} no longer holds it (taken over by "
                      "another server); its write was refused")


@contextlib.contextmanager
def reading(thread: "PgThread") -> Iterator[psycopg.Connection]:
    """The connection to read `thread` on: its hold's when one is active (it sees the hold's
    own writes), else a pooled one."""
    held = current_hold(thread)
    if held is not None:
        yield held.conn
        return
    with thread.db.autocommit() as conn:  # reads: no BEGIN/COMMIT round trips
        yield conn


def decode_record(thread_id: str, body: bytes) -> Record | None:
    try:
        return record_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        log.warning("skipping an unreadable record of thread %s", thread_id)
        return None


class PgRecords:
    """The records of one cluster thread (see the module doc)."""

    def __init__(self, thread: "PgThread", last_seq: int | None = None) -> None:
        self.thread = thread
        # the thread's last seq as this object last saw it: an append first tries one statement
        # that writes seq = known + 1 only if nobody appended or cleared since (else the hold)
        self.known_seq = last_seq

    @property
    def path(self) -> Path:
        """A name for this log that is unique per thread on this host (caches key on it)."""
        return self.thread.dir / "records"

    def sync(self) -> None:
        """Nothing to do: a committed append is durable."""

    # -- writing ---------------------------------------------------------------------
    def append(self, make: Callable[[int], Record], epoch: int | None = None,
               fence: int | None = None) -> Record:
        """Append `make(last_seq + 1)` in one transaction that checks the epoch and the fence:
        one statement when this object knows the last seq and nothing moved since, else the hold."""
        tid = self.thread.id
        if self.known_seq is not None and current_hold(self.thread) is None:
            record = self._append_known(make, epoch, fence)
            if record is not None:
                return record
        with hold(self.thread, epoch, fence) as held:
            record = make(held.last_seq + 1)
            if record.seq <= held.last_seq:
                raise ValueError(f"seq {record.seq} does not follow {held.last_seq}")
            held.conn.execute("WITH added AS (INSERT INTO records (thread_id, seq, body) VALUES (%s, %s, %s)) "
                              "UPDATE threads SET last_seq = %s WHERE id = %s",
                              (tid, record.seq, record_encoder.encode(record), record.seq, tid))
            held.last_seq = record.seq
        self.known_seq = record.seq
        return record

    def _append_known(self, make: Callable[[int], Record], epoch: int | None, fence: int | None) -> Record | None:
        """The one-statement append: the thread's row moves from the known seq to the next one
        (so the row lock, the epoch and the fence are checked in the statement that inserts),
        or nothing is written and None sends the caller to the hold, which says why."""
        prev = self.known_seq  # read once: other OS threads may append through this object too
        if prev is None:
            return None
        record = make(prev + 1)
        if record.seq != prev + 1:
            return None
        with self.thread.db.autocommit() as conn:
            row = conn.execute(_APPEND_KNOWN, {"tid": self.thread.id, "seq": record.seq, "prev": prev,
                                               "epoch": epoch, "fence": fence,
                                               "body": record_encoder.encode(record)}).fetchone()
        if row is None:
            self.known_seq = None
            return None
        self.known_seq = record.seq
        return record

    # -- reading ---------------------------------------------------------------------
    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[Record]:
        with reading(self.thread) as conn:
            rows = conn.execute(sql, params).fetchall()
        tid = self.thread.id
        return [r for r in (decode_record(tid, row["body"]) for row in rows) if r is not None]

    def tail(self, n: int) -> list[Record]:
        """The newest `n` records, oldest first: one query down the primary key."""
        if n <= 0:
            return []
        found = self._rows("SELECT body FROM records WHERE thread_id = %s ORDER BY seq DESC LIMIT %s",
                           (self.thread.id, n))
        return list(reversed(found))

    def since(self, first_seq: int, last_seq: int | None = None) -> list[Record]:
        if last_seq is None:
            return self._rows("SELECT body FROM records WHERE thread_id = %s AND seq >= %s ORDER BY seq",
                              (self.thread.id, first_seq))
        return self._rows("SELECT body FROM records WHERE thread_id = %s AND seq BETWEEN %s AND %s ORDER BY seq",
                          (self.thread.id, first_seq, last_seq))

    def newest_first(self) -> Iterator[Record]:
        """Every record, newest first, a page at a time (no connection held between pages)."""
        below, page = None, FIRST_PAGE
        while True:
            if below is None:
                rows = self._paged("SELECT seq, body FROM records WHERE thread_id = %s ORDER BY seq DESC LIMIT %s",
                                   (self.thread.id, page))
            else:
                rows = self._paged("SELECT seq, body FROM records WHERE thread_id = %s AND seq < %s "
                                   "ORDER BY seq DESC LIMIT %s", (self.thread.id, below, page))
            yield from (r for r in (decode_record(self.thread.id, body) for _, body in rows) if r is not None)
            if len(rows) < page:
                return
            below, page = rows[-1][0], min(MAX_PAGE, page * 4)

    def __iter__(self) -> Iterator[Record]:
        """Every record, oldest first, a page at a time."""
        after = 0
        while True:
            rows = self._paged("SELECT seq, body FROM records WHERE thread_id = %s AND seq > %s "
                               "ORDER BY seq LIMIT %s", (self.thread.id, after, ITER_PAGE))
            yield from (r for r in (decode_record(self.thread.id, body) for _, body in rows) if r is not None)
            if len(rows) < ITER_PAGE:
                return
            after = rows[-1][0]

    def _paged(self, sql: str, params: tuple[Any, ...]) -> list[tuple[int, bytes]]:
        with reading(self.thread) as conn:
            return [(row["seq"], row["body"]) for row in conn.execute(sql, params).fetchall()]

    def find(self, predicate: Callable[[Record], bool], limit: int = 1) -> list[Record]:
        return find_records(self.newest_first(), predicate, limit)
