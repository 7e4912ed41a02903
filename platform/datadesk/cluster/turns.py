"""The cluster `TurnDirectory` (store/interfaces/turns.py): the `turns` table plus a session advisory lock
per running turn (migration 0006).

- `claim`: `pg_try_advisory_lock('turn:' || thread)` on a dedicated connection the turn keeps
  (so the lock dies with the process or host running it), then, in one transaction under a
  per-user advisory xact lock, the user's live turns are counted (no overshoot however many
  hosts claim at once) and the thread's row is upserted with `fence = fence + 1` and a
  lease of LEASE_S. A live turn is a `running` row whose session still holds its lock
  (`pg_locks`): a crashed holder frees its thread and its user's slot at once.
- A holder that is connected but hung (its lease past, not renewed) is taken over: its
  session is terminated, which frees the lock, and the new claim's fence fences it out.
- Cancel: `UPDATE turns SET cancel_turn` (matching the turn named, so an older turn's
  request matches no row) + `NOTIFY turn_cancel`; the owner LISTENs, and its lease renewal
  every RENEW_S re-reads the column, so a missed notification only delays the cancel.
- `release`: the row is marked done, then the lock released; the connection is kept for the
  next turn (up to IDLE_CONNECTIONS).
- A turn whose holder is gone (its session dropped: a crash, a host lost; or hung past its
  lease) is finished by whoever takes its thread first: a claim (before its own upsert) or
  the cluster reaper (`take_over`, cluster/takeover.py). With the thread's lock held, the
  row's fence is bumped (its owner marked TAKEOVER, so a claim meanwhile waits instead of a
  409), `on_cut_off(claim)` records the end under that fence, and the row is marked failed.

Writes fenced by a turn (the thread's records) call `fence_holds` in their own transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator

import psycopg

from datadesk.cluster.database import Database, advisory_key
from datadesk.store.interfaces.turns import Claim, TurnConflict, TurnInfo, conflict, too_many

log = logging.getLogger(__name__)

LEASE_S = 10.0  # a turn not renewed for this long may be taken over
RENEW_S = 2.0  # how often the owner renews its turns' leases (and re-reads their cancel requests)
IDLE_CONNECTIONS = 4  # dedicated connections kept for the next turns once theirs ended
TAKEOVER_WAIT_S = 2.0  # how long a claim waits for a terminated holder's lock to go
CANCEL_CHANNEL = "turn_cancel"
TAKEOVER = "takeover:"  # the owner of a row being finished by another host
TAKEOVER_LOCK_TIMEOUT = "3s"  # a hung host's write holding the row (FOR SHARE) delays the bump this long

# a running row whose session still holds the thread's advisory lock (bigint keys: objsubid 1)
LIVE = """t.state = 'running' AND EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = t.backend_pid
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND ((l.classid::bigint << 32) | l.objid::bigint) = t.lock_key)"""
COUNT_LIVE = f"SELECT count(*) AS n FROM turns t WHERE t.user_id = %s AND t.thread_id <> %s AND {LIVE}"
UPSERT = """
INSERT INTO turns AS t (thread_id, turn_id, user_id, owner, backend_pid, lock_key, fence, events, lease_until,
                        state, cancel_turn)
VALUES (%(thread)s, %(turn)s, %(user)s, %(owner)s, pg_backend_pid(), %(key)s, 1, %(events)s,
        now() + make_interval(secs => %(lease)s), 'running', NULL)
ON CONFLICT (thread_id) DO UPDATE SET
    turn_id = EXCLUDED.turn_id, user_id = EXCLUDED.user_id, owner = EXCLUDED.owner,
    backend_pid = EXCLUDED.backend_pid, lock_key = EXCLUDED.lock_key, fence = t.fence + 1,
    events = EXCLUDED.events, lease_until = EXCLUDED.lease_until, state = 'running', cancel_turn = NULL,
    started_at = now(), updated_at = now()
RETURNING fence"""
# a cut-off turn taken over: its fence bumped (the dead or hung owner is fenced out), owned here
BUMP = """UPDATE turns SET fence = fence + 1, owner = %s, backend_pid = pg_backend_pid(), cancel_turn = NULL,
    lease_until = now() + make_interval(secs => %s), updated_at = now()
WHERE thread_id = %s AND fence = %s AND state = 'running' RETURNING fence"""
# the turns to take over: running, and their holder's session gone or their lease past
STALE = f"SELECT t.thread_id FROM turns t WHERE t.state = 'running' AND (t.lease_until < now() OR NOT ({LIVE})) " \
        "ORDER BY t.lease_until"
RENEW = """UPDATE turns SET lease_until = now() + make_interval(secs => %s), updated_at = now()
WHERE thread_id = %s AND fence = %s AND state = 'running' RETURNING cancel_turn"""


def fence_holds(conn: psycopg.Connection, thread_id: str, fence: int) -> bool:
    """Whether the turn that claimed `thread_id` with `fence` still holds it: for a write that
    turn makes, in the write's own transaction. The row stays share-locked until that
    transaction ends, so a claim that would bump the fence waits for the write's commit."""
    row = conn.execute("SELECT 1 FROM turns WHERE thread_id = %s AND fence = %s AND state = 'running' FOR SHARE",
                       (thread_id, fence)).fetchone()
    return row is not None


@dataclass
class _Hold:
    """A claim's own state: the connection holding the thread's lock."""

    conn: psycopg.Connection
    key: int
    mu: threading.Lock = field(default_factory=threading.Lock)


class PgTurnDirectory:
    """See the module doc. `owner`: how this process is named in the table ("<host>:<pid>")."""

    def __init__(self, db: Database, owner: str | None = None) -> None:
        self.db = db
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._mu = threading.Lock()
        self._free: list[psycopg.Connection] = []
        self._listener: tuple[asyncio.AbstractEventLoop, psycopg.AsyncConnection] | None = None
        # records the end of a turn cut off by a dead or hung host, under the takeover's claim
        # (cluster/takeover.py HostLostTurns.finish); None: the row is only marked failed
        self.on_cut_off: Callable[[Claim], Any] | None = None

    # -- dedicated connections -------------------------------------------------------------
    def _take(self) -> psycopg.Connection:
        with self._mu:
            while self._free:
                conn = self._free.pop()
                if not (conn.closed or conn.broken):
                    return conn
        return self.db.dedicated()

    def _put_back(self, conn: psycopg.Connection) -> None:
        with self._mu:
            if len(self._free) < IDLE_CONNECTIONS and not (conn.closed or conn.broken):
                self._free.append(conn)
                return
        conn.close()

    # -- claim -------------------------------------------------------------------------------
    def claim(self, thread_id: str, user_id: str, turn_id: str, *, limit: int, events: bool = False) -> Claim:
        key = advisory_key(f"turn:{thread_id}")
        conn = self._take()
        try:
            if not self._lock(conn, thread_id, key):
                self._put_back(conn)
                raise conflict(thread_id)
            try:
                self._finish_previous(conn, thread_id, key)
                fence = self._insert(conn, thread_id, user_id, turn_id, key, limit, events)
            except BaseException as exc:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                if isinstance(exc, TurnConflict):  # the lock was ours: the connection is kept
                    self._put_back(conn)
                raise
        except TurnConflict:
            raise
        except psycopg.OperationalError:
            conn.close()  # a dead connection holds nothing
            raise
        except BaseException:
            self._put_back(conn)
            raise
        return Claim(thread_id, turn_id, user_id, fence, events, handle=_Hold(conn, key))

    def _lock(self, conn: psycopg.Connection, thread_id: str, key: int) -> bool:
        """The thread's advisory lock on `conn`, taking over a hung holder whose lease is past."""
        if conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()["ok"]:
            return True
        row = conn.execute(
            "SELECT CASE WHEN t.owner LIKE %s THEN true ELSE pg_terminate_backend(t.backend_pid) END AS ended, "
            f"t.owner, t.turn_id FROM turns t WHERE t.thread_id = %s AND (t.lease_until < now() OR t.owner LIKE %s) "
            f"AND {LIVE}", (TAKEOVER + "%", thread_id, TAKEOVER + "%")).fetchone()
        if row is None or not row["ended"]:
            return False
        if not row["owner"].startswith(TAKEOVER):  # else another host is finishing it: wait for it
            log.warning("turn %s of thread %s (%s) stopped renewing its lease: taken over", row["turn_id"],
                        thread_id, row["owner"])
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while time.monotonic() < deadline:
            if conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()["ok"]:
                return True
            time.sleep(0.02)
        return False

    def _insert(self, conn: psycopg.Connection, thread_id: str, user_id: str, turn_id: str, key: int,
                limit: int, events: bool) -> int:
        with conn.transaction():
            # the count and the insert under one lock per user: concurrent claims never overshoot
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(f"turn-user:{user_id}"),))
            running = conn.execute(COUNT_LIVE, (user_id, thread_id)).fetchone()["n"]
            if running >= max(1, limit):
                raise too_many(limit)
            row = conn.execute(UPSERT, {"thread": thread_id, "turn": turn_id, "user": user_id, "owner": self.owner,
                                        "key": key, "events": events, "lease": LEASE_S}).fetchone()
        return int(row["fence"])

    # -- taking over a cut-off turn ----------------------------------------------------------------
    def stale(self) -> list[str]:
        """The threads whose running turn lost its holder (session gone) or its lease: to take over."""
        with self.db.connection() as conn:
            return [r["thread_id"] for r in conn.execute(STALE).fetchall()]

    def take_over(self, thread_id: str) -> bool:
        """Finish the thread's turn if its holder is gone or its lease is past (a hung holder's
        session is terminated); False when the thread is busy (a live turn, a clear) or was
        finished by someone else meanwhile."""
        key = advisory_key(f"turn:{thread_id}")
        conn = self._take()
        try:
            if not self._lock(conn, thread_id, key):
                return False
            try:
                return self._finish_previous(conn, thread_id, key)
            except TurnConflict:
                return False
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        except psycopg.OperationalError:
            conn.close()
            raise
        finally:
            if not conn.closed:
                self._put_back(conn)

    def _finish_previous(self, conn: psycopg.Connection, thread_id: str, key: int) -> bool:
        """With the thread's lock held on `conn`: a row still `running` is a turn whose holder
        is gone; fence it out, let `on_cut_off` record its end, mark it failed."""
        prev = conn.execute("SELECT turn_id, user_id, owner, fence, events FROM turns "
                            "WHERE thread_id = %s AND state = 'running'", (thread_id,)).fetchone()
        if prev is None:
            return False
        try:
            with conn.transaction():  # waits for a write of the old owner that holds the row to commit
                conn.execute(f"SET LOCAL lock_timeout = '{TAKEOVER_LOCK_TIMEOUT}'")
                row = conn.execute(BUMP, (TAKEOVER + self.owner, LEASE_S, thread_id, prev["fence"])).fetchone()
        except psycopg.errors.LockNotAvailable:  # a write of the gone owner still holds its row
            log.warning("turn %s of thread %s: a write of its server (%s) still holds the turn's row; "
                        "taken over later", prev["turn_id"], thread_id, prev["owner"])
            raise conflict(thread_id) from None
        if row is None:
            return False
        claim = Claim(thread_id, prev["turn_id"], prev["user_id"], int(row["fence"]), bool(prev["events"]),
                      handle=_Hold(conn, key))
        log.warning("turn %s of thread %s: its server (%s) is gone; finishing it with fence %d",
                    prev["turn_id"], thread_id, prev["owner"], claim.fence)
        try:
            if self.on_cut_off is not None:
                self.on_cut_off(claim)
        except Exception:  # the thread still takes its next turn; the records before are kept
            log.exception("could not record the end of turn %s of thread %s", prev["turn_id"], thread_id)
        finally:
            conn.execute("UPDATE turns SET state = 'failed', owner = %s, updated_at = now() "
                         "WHERE thread_id = %s AND fence = %s", (self.owner, thread_id, claim.fence))
        return True

    def announce(self, claim: Claim) -> None:
        pass  # the row is written by the claim; followers wait for the journal's rows

    # -- what others see --------------------------------------------------------------------------
    def current(self, thread_id: str) -> TurnInfo | None:
        with self.db.connection() as conn:
            row = conn.execute(f"SELECT * FROM turns t WHERE t.thread_id = %s AND {LIVE}", (thread_id,)).fetchone()
        return _info(row) if row else None

    def running_threads(self) -> set[str] | None:
        with self.db.connection() as conn:
            rows = conn.execute("SELECT thread_id FROM turns WHERE state = 'running'").fetchall()
        return {r["thread_id"] for r in rows}

    def expired(self) -> list[TurnInfo]:
        """Rows left `running` by a holder whose session is gone (its lock freed)."""
        with self.db.connection() as conn:
            rows = conn.execute(f"SELECT * FROM turns t WHERE t.state = 'running' AND NOT ({LIVE}) "
                                "ORDER BY t.thread_id").fetchall()
        return [_info(r) for r in rows]

    # -- cancel -----------------------------------------------------------------------------------
    def request_cancel(self, thread_id: str, turn_id: str) -> bool:
        with self.db.connection() as conn:
            row = conn.execute("UPDATE turns SET cancel_turn = %s, updated_at = now() WHERE thread_id = %s "
                               "AND turn_id = %s AND state = 'running' RETURNING fence",
                               (turn_id, thread_id, turn_id)).fetchone()
            if row is not None:  # delivered at commit
                conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, f"{thread_id}:{turn_id}"))
        return row is not None

    async def cancel_requests(self, mine: Callable[[], Iterable[Claim]]) -> AsyncIterator[Claim]:
        renewed = time.monotonic()
        while True:
            if not list(mine()):
                return  # no await after this check: a new turn starts a new watcher
            wait = max(0.0, RENEW_S - (time.monotonic() - renewed))
            asked = await self._notified(wait)
            for claim in list(mine()):
                if f"{claim.thread_id}:{claim.turn_id}" in asked:
                    yield claim
            if time.monotonic() - renewed < RENEW_S:
                continue
            renewed = time.monotonic()
            for claim in list(mine()):
                if await asyncio.to_thread(self._renew, claim) != "ok":
                    yield claim

    async def _notified(self, wait_s: float) -> set[str]:
        """The cancel notifications of the next `wait_s` (returns at the first); empty when
        nothing came or the listener is down (the renewal reads the requests then)."""
        conn = await self._listen()
        if conn is None:
            await asyncio.sleep(wait_s)
            return set()
        got: set[str] = set()
        try:
            async for note in conn.notifies(timeout=wait_s, stop_after=1):
                got.add(note.payload)
        except psycopg.Error as exc:
            log.warning("the turn-cancel listener on %s failed: %s", self.db.where, exc)
            self._listener = None
            with contextlib.suppress(Exception):
                await conn.close()
        return got

    async def _listen(self) -> psycopg.AsyncConnection | None:
        loop = asyncio.get_running_loop()
        if self._listener is not None:
            held_loop, conn = self._listener
            if held_loop is loop and not (conn.closed or conn.broken):
                return conn
            self._listener = None
        try:
            conn = await self.db.async_dedicated()
            await conn.execute(f"LISTEN {CANCEL_CHANNEL}")
        except Exception as exc:  # the renewal still reads the requests
            log.warning("no turn-cancel listener on %s: %s", self.db.where, exc)
            return None
        self._listener = (loop, conn)
        return conn

    # -- lease ----------------------------------------------------------------------------------
    def renew(self, claim: Claim) -> bool:
        return self._renew(claim) != "lost"

    def _renew(self, claim: Claim) -> str:
        """"ok", "cancel" (a request names the turn) or "lost" (fenced out, or its connection died)."""
        hold = claim.handle
        if claim.lost or not isinstance(hold, _Hold):
            return "lost"
        with hold.mu:
            try:
                row = hold.conn.execute(RENEW, (LEASE_S, claim.thread_id, claim.fence)).fetchone()
            except psycopg.Error as exc:
                log.warning("turn %s lost its connection to %s: %s", claim.turn_id, self.db.where, exc)
                row = None
        if row is None:
            claim.lost = True
            return "lost"
        return "cancel" if row["cancel_turn"] == claim.turn_id else "ok"

    def release(self, claim: Claim) -> None:
        hold, claim.handle = claim.handle, None
        if not isinstance(hold, _Hold):
            return
        with hold.mu:
            try:
                hold.conn.execute("UPDATE turns SET state = 'done', cancel_turn = NULL, updated_at = now() "
                                  "WHERE thread_id = %s AND fence = %s", (claim.thread_id, claim.fence))
                hold.conn.execute("SELECT pg_advisory_unlock(%s)", (hold.key,))
            except psycopg.Error as exc:  # its connection died: the lock went with it
                log.warning("turn %s: could not mark it done on %s: %s", claim.turn_id, self.db.where, exc)
                hold.conn.close()
                return
        self._put_back(hold.conn)

    # -- holding an idle thread -----------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self, thread_id: str) -> Iterator[bool]:
        conn = self._take()
        key = advisory_key(f"turn:{thread_id}")
        try:
            got = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()["ok"]
            try:
                yield bool(got)
            finally:
                if got:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        finally:
            self._put_back(conn)

    @contextlib.asynccontextmanager
    async def hold_wait(self, thread_id: str, wait_s: float, deleting: bool = False) -> AsyncIterator[None]:
        conn = self._take()
        key = advisory_key(f"turn:{thread_id}")
        try:
            deadline = time.monotonic() + wait_s
            while not conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()["ok"]:
                if time.monotonic() >= deadline:
                    raise TurnConflict(f"a turn is still running on thread {thread_id}; try again in a moment")
                await asyncio.sleep(0.02)
            try:
                yield
                if deleting:
                    conn.execute("DELETE FROM turns WHERE thread_id = %s", (thread_id,))
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        finally:
            self._put_back(conn)

    def forget(self, thread_id: str, turn_id: str) -> None:
        with self.db.connection() as conn:
            conn.execute("UPDATE turns SET state = 'failed', cancel_turn = NULL, updated_at = now() "
                         "WHERE thread_id = %s AND turn_id = %s AND state = 'running'", (thread_id, turn_id))

    def close(self) -> None:
        with self._mu:
            free, self._free = self._free, []
        for conn in free:
            conn.close()
        listener, self._listener = self._listener, None
        if listener is not None:  # no loop needed: libpq closes the socket
            with contextlib.suppress(Exception):
                listener[1].pgconn.finish()


def _info(row: dict[str, Any]) -> TurnInfo:
    return TurnInfo(row["thread_id"], row["turn_id"], row["user_id"], row["owner"], int(row["fence"]),
                    bool(row["events"]))


def build_turns(db: Database, settings: Any, layout: Any, before_turn: Callable[[Any], None] | None = None) -> Any:
    """The cluster set's `TurnRegistry` (chat/turns.py): turns in `turns`, events in
    `turn_events`. `settings.chat.max_turns_per_user` caps each user across every host;
    `layout` is unused (nothing of a turn is kept in the home)."""
    from datadesk.chat.turns import TurnRegistry
    from datadesk.cluster.journal import PgEventJournal

    return TurnRegistry(settings.chat.max_turns_per_user, before_turn=before_turn,
                        directory=PgTurnDirectory(db), journal=PgEventJournal(db))
