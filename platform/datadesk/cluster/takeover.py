"""A dead host costs its running turns, never the thread (issue 29 item 1): the cluster's
equivalent of chat/recovery.py.

A turn's host can die three ways: the process crashes (the database drops its session and
its advisory lock at once), the host vanishes without a FIN (keepalives and
`tcp_user_timeout` drop the session within about 10 s), or it hangs (its session stays, its
lease of cluster/turns.py LEASE_S runs out). Whoever touches the thread first finishes the
turn: a claim of its next turn (`PgTurnDirectory.claim`), or the cluster reaper here, which
runs on one host at a time and looks every REAP_S. Both go through
`PgTurnDirectory._finish_previous`: the thread's lock held, the fence bumped (the lost host
is fenced out of every write), then `HostLostTurns.finish` records the end with the same
rule as a turn cut off by a crash on one host (chat/interrupted.py), kind HOST_LOST:

- tool calls without a result get an interrupted tool record, the answer so far is recorded
  with HOST_NOTICE ("this turn stopped with the server that ran it; what was recorded before
  is kept"); the records committed before stay as they are;
- the turn's events end with `error` (kind HOST_LOST) and `done`, so every client following
  it on any host ends (the UI offers Retry, which sends the question again as a new turn);
- the turn's row is marked failed, so a host that comes back writes neither records (its
  fence is gone) nor events (cluster/journal.py drops them) into the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import psycopg

from datadesk.chat.interrupted import HOST_NOTICE, HOST_TOOL_NOTICE, Finished, finish_interrupted
from datadesk.cluster.database import Database, advisory_key
from datadesk.cluster.journal import PgEventJournal
from datadesk.cluster.turns import PgTurnDirectory
from datadesk.domain.records import HOST_LOST
from datadesk.store.interfaces.threads import LogClosed, ThreadNotFound, TurnFenced
from datadesk.store.interfaces.turns import Claim

log = logging.getLogger(__name__)

REAP_S = 2.0  # how often the reaper looks for turns whose host is gone
REAPER_LOCK = "datadesk:turn-reaper"  # one reaper per cluster: the host holding this session lock
REAPER_HUNG_S = 10.0  # a reaper whose session ran no statement for this long is hung: replaced
# the session holding the reaper's lock, and how long since it last ran a statement (the reaper
# runs one every round): a hung host keeps its session (its kernel still answers keepalives)
REAPER_HOLDER = """SELECT a.pid, extract(epoch FROM now() - a.query_start) AS quiet_s
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND ((l.classid::bigint << 32) | l.objid::bigint) = %s"""


class HostLostTurns:
    """Records the end of a turn its host left (`PgTurnDirectory.on_cut_off`); see the module doc."""

    def __init__(self, db: Database, threads: Any, journal: PgEventJournal) -> None:
        self.db = db
        self.threads = threads  # cluster/threads.py PgThreadStore
        self.journal = journal
        self.finished: list[Finished] = []  # the last few, for tests and logs
        self._keep = 50

    def finish(self, claim: Claim) -> Finished | None:
        """Finish turn `claim.turn_id` under the takeover's `claim.fence`; None when there is
        nothing to record (a turn without events, a thread deleted meanwhile)."""
        kept = self.journal.read(claim.thread_id, None)
        if kept is None or kept.turn_id != claim.turn_id or kept.ended:
            return None  # an upload or re-query turn (no journal), or its journal already ended
        thread = self._thread(claim.thread_id)
        if thread is None:
            return None

        def write_end(k: Any, events: list[tuple[str, dict[str, Any]]], first: int) -> Any:
            return self.journal.append_end(claim.thread_id, k, events, first, None)

        try:
            done = finish_interrupted(thread, kept, HOST_NOTICE, HOST_TOOL_NOTICE, kind=HOST_LOST,
                                      fence=claim.fence, write_end=write_end)
        except (LogClosed, TurnFenced) as exc:  # cleared, deleted, or taken by yet another host
            log.warning("turn %s of thread %s not finished: %s", claim.turn_id, claim.thread_id, exc)
            return None
        self.finished = [*self.finished[-self._keep + 1:], done]
        return done

    def _thread(self, thread_id: str) -> Any:
        with self.db.connection() as conn:
            row = conn.execute("SELECT owner, workspace FROM threads WHERE id = %s", (thread_id,)).fetchone()
        if row is None:
            return None
        try:
            return self.threads.get(thread_id, row["owner"], [row["workspace"]])
        except ThreadNotFound:
            return None


class TurnReaper:
    """The cluster's one reaper: the host holding REAPER_LOCK (on a dedicated connection, so it
    passes to another host when this one dies) takes over every stale turn each round. A reaper
    that hangs keeps its session: the others see it quiet for REAPER_HUNG_S and end its session."""

    def __init__(self, db: Database, directory: PgTurnDirectory, finisher: HostLostTurns | None = None,
                 every_s: float = REAP_S) -> None:
        self.db = db
        self.directory = directory
        self.finisher = finisher
        self.every_s = every_s
        self._conn: psycopg.Connection | None = None

    def _leader(self) -> bool:
        """Whether this process is the reaper (taking the lock when nobody holds it)."""
        conn = self._conn
        if conn is not None and not (conn.closed or conn.broken):
            try:  # the session lock is held as long as the session lives: is it alive?
                conn.execute("SELECT 1")
                return True
            except psycopg.Error:
                self._drop()
        self._conn = None
        conn = self.db.dedicated()
        key = advisory_key(REAPER_LOCK)
        try:
            got = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()["ok"]
            if not got:
                got = self._replace_hung(conn, key)
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    @staticmethod
    def _replace_hung(conn: psycopg.Connection, key: int) -> bool:
        """End the session of a reaper quiet for REAPER_HUNG_S and take its lock."""
        holder = conn.execute(REAPER_HOLDER, (key,)).fetchone()
        if holder is None or holder["quiet_s"] is None or float(holder["quiet_s"]) < REAPER_HUNG_S:
            return False
        conn.execute("SELECT pg_terminate_backend(%s)", (holder["pid"],))
        log.warning("turn reaper: the reaper's session %s was quiet for %.0f s (its host hung): replaced",
                    holder["pid"], float(holder["quiet_s"]))
        for _ in range(50):
            if conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()["ok"]:
                return True
            time.sleep(0.02)
        return False

    def reap(self) -> list[str]:
        """One round: the threads whose turn was taken over and finished (empty on other hosts)."""
        if not self._leader():
            return []
        done = []
        for thread_id in self.directory.stale():
            if self.directory.take_over(thread_id):
                done.append(thread_id)
        if done:
            log.warning("turn reaper: finished %d turn(s) whose server is gone: %s", len(done), ", ".join(done))
        return done

    async def run_forever(self) -> None:
        """`reap` every `every_s` (the runtime's background task), never ending on an error."""
        try:
            while True:
                try:
                    await asyncio.to_thread(self.reap)
                except Exception as exc:  # the database down: the next round tries again
                    log.warning("turn reaper round failed: %s", exc)
                    self._drop()
                await asyncio.sleep(self.every_s)
        finally:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        self._drop()


def build_takeover(db: Database, turns: Any, threads: Any) -> TurnReaper:
    """Wire the finisher into the cluster `TurnRegistry` `turns` (cluster/turns.py build_turns):
    a claim that finds its thread's turn cut off finishes it first; returns the reaper to run
    in the runtime's background tasks (`TurnReaper.run_forever`)."""
    directory, journal = turns.directory, turns.journal
    finisher = HostLostTurns(db, threads, journal)
    directory.on_cut_off = finisher.finish
    return TurnReaper(db, directory, finisher)
