"""The cluster `EventJournal` (store/interfaces/journal.py): the `turn_events` table (migration 0006).

Each thread keeps the rows of its latest turn: `sink` deletes the previous turn's and writes
the new turn's header (n = 0) before the turn is announced. The events of a running turn are
gathered for BATCH_S and handed to one writer thread per process, which inserts everything
queued in one transaction with `synchronous_commit = off` (a database crash may lose the
last fraction of a second of events, never the records, which commit normally) and
`pg_notify('turn_events', thread_id)`. One writer keeps each turn's batches in commit order,
so a follower reading `n > cursor` never skips a row that commits later. A batch of a turn
that no longer holds its thread's `turns` row (another turn claimed it, or a takeover marked
it failed: cluster/turns.py) is dropped, so a host that comes back after losing the thread
writes no events into it.

Followers read `n > cursor`; they wait for a notification (one LISTEN connection per
process and event loop, shared by its followers) or FALLBACK_POLL_S, whichever comes first:
a missed notification delays, and loses nothing. Followers in the process running the turn
read its memory instead (chat.turns.TurnRegistry.attach).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import msgspec
import psycopg

from datadesk.chat.interrupted import HOST_NOTICE
from datadesk.chat.journal import IDLE_S
from datadesk.domain.records import HOST_LOST
from datadesk.cluster.database import Database
from datadesk.store.interfaces.journal import JournalEvent, KeptTurn

log = logging.getLogger(__name__)

BATCH_S = 0.1  # events of a turn gathered into one insert (text is coalesced per 50 ms before)
FALLBACK_POLL_S = 1.0  # a follower reads again this often without a notification
READ_ROWS = 2000  # rows per read of a follower
CLOSE_WAIT_S = 5.0  # how long a turn's end waits for its last rows to commit
WRITE_TRIES = 3
CHANNEL = "turn_events"
INSERT = ("INSERT INTO turn_events (thread_id, turn_id, n, type, data) VALUES (%s, %s, %s, %s, %s::jsonb) "
          "ON CONFLICT DO NOTHING")

# a batch in one statement (so one transaction, no BEGIN/COMMIT round trips): commit without
# waiting for the WAL flush, insert every row, notify each thread once (delivered at commit)
WRITE_BATCH = """
WITH cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS v),
ins AS (
    INSERT INTO turn_events (thread_id, turn_id, n, type, data)
    SELECT r.thread_id, r.turn_id, r.n, r.type, r.data::jsonb
    FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[], %s::text[]) AS r(thread_id, turn_id, n, type, data),
         cfg
    WHERE NOT EXISTS (SELECT 1 FROM turns t WHERE t.thread_id = r.thread_id
                      AND (t.turn_id <> r.turn_id OR t.state = 'failed'))
    ON CONFLICT DO NOTHING
    RETURNING thread_id)
SELECT pg_notify(%s, t.thread_id) FROM (SELECT DISTINCT thread_id FROM ins) t"""

_encode = msgspec.json.Encoder().encode


@dataclass
class _Batch:
    thread_id: str
    rows: list[tuple[str, str, int, str, str]]
    written: threading.Event | None = None  # set once committed (a turn's last batch)


class _Writer:
    """The process's one writer thread (see the module doc)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._mu = threading.Lock()
        self._conn: psycopg.Connection | None = None  # the writer thread's own (autocommit)

    def put(self, batch: _Batch) -> None:
        with self._mu:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="turn-events-writer", daemon=True)
                self._thread.start()
        self._queue.put(batch)

    def stop(self) -> None:
        with self._mu:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=CLOSE_WAIT_S)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batches = [first]
            with contextlib.suppress(queue.Empty):
                while len(batches) < 256:
                    nxt = self._queue.get_nowait()
                    if nxt is None:
                        self._queue.put(None)  # stop after this write
                        break
                    batches.append(nxt)
            self._write(batches)
            for b in batches:
                if b.written is not None:
                    b.written.set()

    def _write(self, batches: list[_Batch]) -> None:
        rows = [r for b in batches for r in b.rows]
        if not rows:
            return
        columns = [list(c) for c in zip(*rows)]
        for attempt in range(1, WRITE_TRIES + 1):
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = self.db.dedicated()
                self._conn.execute(WRITE_BATCH, [*columns, CHANNEL])  # one statement, its own transaction
                return
            except Exception as exc:  # followers miss these events; the turn itself goes on
                if attempt == WRITE_TRIES:
                    log.warning("%d turn event(s) not written to %s: %s", len(rows), self.db.where, exc)
                    return
                time.sleep(0.1 * attempt)


class PgSink:
    """A running turn's `EventSink`: rows gathered for BATCH_S, then to the writer."""

    def __init__(self, journal: "PgEventJournal", thread_id: str, turn_id: str) -> None:
        self.journal, self.thread_id, self.turn_id = journal, thread_id, turn_id
        self._rows: list[tuple[str, str, int, str, str]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def put(self, event: JournalEvent) -> None:
        if self._closed:
            return
        self._rows.append((self.thread_id, self.turn_id, event.n, event.type, _encode(event.data).decode()))
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(BATCH_S, self.flush)
            except RuntimeError:  # no event loop (a synchronous caller): at once
                self.flush()

    def flush(self, written: threading.Event | None = None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._rows or written is not None:
            rows, self._rows = self._rows, []
            self.journal.writer.put(_Batch(self.thread_id, rows, written))

    def close(self) -> None:
        """Everything put is committed before this returns (bounded): a follower that then sees
        the turn end reads its last rows."""
        if self._closed:
            return
        self._closed = True
        written = threading.Event()
        self.flush(written)
        if not written.wait(CLOSE_WAIT_S):
            log.warning("the last events of turn %s were not written within %.0f s", self.turn_id, CLOSE_WAIT_S)


@dataclass
class _Wakeups:
    """The followers of this process waiting on one event loop, by thread, and the LISTEN
    connection that wakes them."""

    loop: asyncio.AbstractEventLoop
    waiters: dict[str, set[asyncio.Event]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


class PgEventJournal:
    """See the module doc."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.writer = _Writer(db)
        self._wakeups: _Wakeups | None = None

    # -- the running turn -------------------------------------------------------------------
    def sink(self, thread_id: str, turn_id: str, at: Path | None) -> PgSink | None:
        header = {"turn": turn_id, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        try:
            with self.db.connection() as conn:
                conn.execute("DELETE FROM turn_events WHERE thread_id = %s", (thread_id,))
                conn.execute(INSERT, (thread_id, turn_id, 0, "header", _encode(header).decode()))
        except psycopg.Error as exc:  # the turn still streams to this process's clients
            log.warning("no event journal for turn %s in %s: %s", turn_id, self.db.where, exc)
            return None
        return PgSink(self, thread_id, turn_id)

    # -- reading -----------------------------------------------------------------------------------
    def latest(self, thread_id: str, at: Path | None) -> str | None:
        with self.db.connection() as conn:
            row = conn.execute("SELECT turn_id FROM turn_events WHERE thread_id = %s AND n = 0 LIMIT 1",
                               (thread_id,)).fetchone()
        return row["turn_id"] if row else None

    def _rows(self, thread_id: str, turn_id: str, after: int, limit: int = READ_ROWS) -> list[JournalEvent]:
        with self.db.connection() as conn:
            rows = conn.execute("SELECT n, type, data FROM turn_events WHERE thread_id = %s AND turn_id = %s "
                                "AND n > %s ORDER BY n LIMIT %s", (thread_id, turn_id, after, limit)).fetchall()
        return [JournalEvent(r["n"], r["type"], r["data"]) for r in rows]

    def read(self, thread_id: str, at: Path | None) -> KeptTurn | None:
        with self.db.connection() as conn:
            rows = conn.execute("SELECT turn_id, n, type, data FROM turn_events WHERE thread_id = %s ORDER BY n",
                                (thread_id,)).fetchall()
        if not rows or rows[0]["n"] != 0:
            return None
        head = rows[0]
        events = [JournalEvent(r["n"], r["type"], r["data"]) for r in rows[1:] if r["turn_id"] == head["turn_id"]]
        return KeptTurn(head["turn_id"], dict(head["data"]), events, True)

    def ended(self, thread_id: str, at: Path | None) -> bool | None:
        with self.db.connection() as conn:
            row = conn.execute("SELECT bool_or(type = 'done') AS done, count(*) AS n FROM turn_events "
                               "WHERE thread_id = %s", (thread_id,)).fetchone()
        return None if not row or not row["n"] else bool(row["done"])

    def unfinished(self) -> list[str]:
        """The threads whose kept turn has no `done` (for finishing turns cut off by a dead host)."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT h.thread_id FROM turn_events h WHERE h.n = 0 AND NOT EXISTS (SELECT 1 FROM turn_events d "
                "WHERE d.thread_id = h.thread_id AND d.turn_id = h.turn_id AND d.type = 'done') "
                "ORDER BY h.thread_id").fetchall()
        return [r["thread_id"] for r in rows]

    def append_end(self, thread_id: str, kept: KeptTurn, events: list[tuple[str, dict[str, Any]]],
                   first_n: int, at: Path | None) -> list[JournalEvent]:
        out = [JournalEvent(first_n + i, t, d) for i, (t, d) in enumerate(events)]
        with self.db.connection() as conn:
            with conn.cursor() as cur:
                cur.executemany(INSERT, [(thread_id, kept.turn_id, ev.n, ev.type, _encode(ev.data).decode())
                                         for ev in out])
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, thread_id))
        return out

    def drop(self, thread_id: str, at: Path | None) -> None:
        with self.db.connection() as conn:
            conn.execute("DELETE FROM turn_events WHERE thread_id = %s", (thread_id,))

    # -- following --------------------------------------------------------------------------------
    async def follow(self, thread_id: str, turn_id: str, running: Callable[[str], bool], at: Path | None,
                     after: int = 0) -> AsyncIterator[JournalEvent | None]:
        wake = asyncio.Event()
        self._wait_on(thread_id, wake)
        cursor, quiet_since = after, time.monotonic()
        try:
            while True:
                wake.clear()
                events = await asyncio.to_thread(self._rows, thread_id, turn_id, cursor)
                for ev in events:
                    cursor = ev.n
                    yield ev
                    if ev.type == "done":
                        return
                if events:
                    quiet_since = time.monotonic()
                    if len(events) >= READ_ROWS:
                        continue
                elif not running(turn_id):
                    events = await asyncio.to_thread(self._rows, thread_id, turn_id, cursor)
                    if events:  # written just before the turn ended
                        continue
                    # its host died, or was taken over; the end a finisher writes may come later
                    yield JournalEvent(cursor + 1, "error", {"kind": HOST_LOST, "message": HOST_NOTICE})
                    yield JournalEvent(cursor + 2, "done", {"turn_id": turn_id, "status": "error"})
                    return
                elif time.monotonic() - quiet_since >= IDLE_S:
                    quiet_since = time.monotonic()
                    yield None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), FALLBACK_POLL_S)
        finally:
            self._stop_waiting(thread_id, wake)

    def _wait_on(self, thread_id: str, wake: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        w = self._wakeups
        if w is None or w.loop is not loop or loop.is_closed():
            w = self._wakeups = _Wakeups(loop)
        w.waiters.setdefault(thread_id, set()).add(wake)
        if w.task is None or w.task.done():
            w.task = loop.create_task(self._listen(w), name="turn-events-listen")

    def _stop_waiting(self, thread_id: str, wake: asyncio.Event) -> None:
        w = self._wakeups
        if w is None:
            return
        waiting = w.waiters.get(thread_id)
        if waiting is not None:
            waiting.discard(wake)
            if not waiting:
                del w.waiters[thread_id]
        if not w.waiters and w.task is not None:
            w.task.cancel()  # nobody follows: the connection goes
            w.task = None

    async def _listen(self, w: _Wakeups) -> None:
        """Wake the followers of a thread at each notification; a broken connection is opened
        again (the followers poll meanwhile)."""
        while w.waiters:
            conn = None
            try:
                conn = await self.db.async_dedicated()
                await conn.execute(f"LISTEN {CHANNEL}")
                for waiting in list(w.waiters.values()):  # what was written before LISTEN
                    for wake in waiting:
                        wake.set()
                async for note in conn.notifies():
                    for wake in list(w.waiters.get(note.payload, ())):
                        wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("the turn-events listener on %s failed: %s", self.db.where, exc)
                await asyncio.sleep(FALLBACK_POLL_S)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()

    def close(self) -> None:
        self.writer.stop()
        w, self._wakeups = self._wakeups, None
        if w is not None and w.task is not None and not w.loop.is_closed():
            w.loop.call_soon_threadsafe(w.task.cancel)
