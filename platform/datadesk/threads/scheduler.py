"""Scheduled refreshes: one loop task in the server runs the refreshes that are due.

- Schedules are the threads' `schedule` documents (threads/schedule.py). The loop keeps an index
  of the threads that have one: built at start, kept by this process's PUT/DELETE, and rebuilt
  every `refresh.schedule_rescan_s` (so a schedule set on another host is seen too).
- Every `refresh.schedule_tick_s` it reads the indexed schedules (in a worker thread: no CPU on
  the event loop) and starts those due, at most one per user and `refresh.scheduled_max` in all
  on this process; more wait for the next tick.
- One host runs a given due time: the runner takes the lock `refresh-schedule-<tid>` (the
  embedded set's lock files, the cluster's PostgreSQL locks), reads the schedule again, and
  runs only when its `handled_until` is still before the due time; it then moves `handled_until`
  to the latest due time that has passed (missed runs while the server was down are one run).
- It runs as the schedule's owner with the owner's permissions at that time: a user who was
  removed, revoked or lost the workspace gets a failed run with the reason; one who lost a
  permission gets a refresh that fails at the step needing it (threads/refresh.py).
- A thread busy with a turn is tried again at the next tick.
The clock is injected (`clock`): tests move time without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import msgspec

from datadesk.chat.turns import TooManyTurns, TurnConflict
from datadesk.domain.users import User
from datadesk.settings import RefreshSettings
from datadesk.store.interfaces.threads import SCHEDULE, ThreadNotFound
from datadesk.store.threads import Thread
from datadesk.threads.refresh import NothingToRefresh, ThreadRefresh, last_report
from datadesk.threads.schedule import RefreshSchedule, ScheduleError, describe, next_due, parse_schedule

log = logging.getLogger(__name__)

CATCH_UP_MAX = 100_000  # due times skipped over in one go (a per-minute cron missed for ~2 months)
# browser tests only: the scheduler's "now" is the number in the file this names (absent: real time)
TEST_CLOCK_ENV = "DATADESK_TEST_CLOCK_FILE"


def scheduler_clock(environ: Mapping[str, str] = os.environ) -> Callable[[], float]:
    """`time.time`, unless the test-only TEST_CLOCK_ENV names a file: then the time written in
    it (real time while it is missing or unreadable). Never set in production."""
    path = environ.get(TEST_CLOCK_ENV)
    if not path:
        return time.time
    log.warning("%s is set: the refresh scheduler reads its time from %s (for tests only)", TEST_CLOCK_ENV, path)

    def now() -> float:
        try:
            return float(Path(path).read_text().strip())
        except (OSError, ValueError):
            return time.time()

    return now


def read_schedule(thread: Any) -> RefreshSchedule | None:
    """The thread's schedule; None when it has none (a removed one is kept as `{}`: the thread
    documents have no delete)."""
    raw = thread.read_doc(SCHEDULE)
    value = msgspec.json.decode(raw) if raw else None
    return msgspec.convert(value, RefreshSchedule) if isinstance(value, dict) and value.get("owner") else None


class RefreshScheduler:
    """The thread schedules (API side) and the loop that runs them."""

    def __init__(self, threads: Any, users: Any, workspaces: Callable[[], list[str]], refresh: ThreadRefresh,
                 locks: Any, settings: RefreshSettings, clock: Callable[[], float] = time.time) -> None:
        self.threads = threads
        self.users = users
        self.workspaces = workspaces
        self.refresh = refresh
        self.locks = locks
        self.settings = settings
        self.clock = clock
        self.index: dict[str, tuple[str, str]] = {}  # thread -> (workspace, owner)
        self.running: dict[str, tuple[str, asyncio.Task[None]]] = {}  # thread -> (owner, task)
        self._scanned_at: float | None = None
        self._loop: asyncio.Task[None] | None = None

    # -- the API side ------------------------------------------------------------------------
    def get(self, thread: Thread) -> dict[str, Any] | None:
        sched = read_schedule(thread)
        return describe(sched, self.clock()) if sched else None

    def put(self, thread: Thread, user: User, body: Any) -> dict[str, Any]:
        """Set the thread's schedule from `body` (ScheduleError naming the field)."""
        now = self.clock()
        sched = parse_schedule(body, user.id, thread.workspace, thread.id, now)
        old = read_schedule(thread)
        if old is not None:  # what the last run did stays shown
            sched = msgspec.structs.replace(sched, last_run=old.last_run, last_status=old.last_status,
                                            last_changes=old.last_changes, last_error=old.last_error)
        if not thread.write_doc(SCHEDULE, msgspec.to_builtins(sched), thread.epoch):
            raise ThreadNotFound(f"thread {thread.id} was cleared or deleted")
        self.index[thread.id] = (thread.workspace, user.id)
        return describe(sched, now)

    def delete(self, thread: Thread) -> bool:
        """Remove the thread's schedule; False when it had none."""
        had = read_schedule(thread) is not None
        if had:
            thread.write_doc(SCHEDULE, {}, thread.epoch)
        self.index.pop(thread.id, None)
        return had

    # -- the loop ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self.settings.schedules and self._loop is None:
            self._loop = asyncio.create_task(self._forever(), name="refresh-scheduler")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop, *(t for _, t in self.running.values())) if t is not None]
        for t in tasks:
            t.cancel()
        # a runtime served by two apps in turn (tests' second client): a task of another loop is
        # cancelled, never awaited from this one
        here = asyncio.get_running_loop()
        await asyncio.gather(*(t for t in tasks if t.get_loop() is here), return_exceptions=True)
        self._loop = None
        self.running.clear()

    async def _forever(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("refresh scheduler tick failed")
            await asyncio.sleep(self.settings.schedule_tick_s)

    def _scan(self) -> dict[str, tuple[str, str]]:
        """Every thread with a schedule, of every user in every workspace."""
        found: dict[str, tuple[str, str]] = {}
        for user in self.users.list():
            for ws in user.workspaces:
                if ws not in self.workspaces():
                    continue
                for thread in self.threads.folders(ws, user.id):
                    try:
                        if read_schedule(thread) is not None:
                            found[thread.id] = (ws, user.id)
                    except Exception:  # one unreadable thread must not hide the others
                        log.exception("schedule of thread %s unreadable", thread.id)
        return found

    def _due(self, now: float) -> list[tuple[Thread, RefreshSchedule, float]]:
        due: list[tuple[Thread, RefreshSchedule, float]] = []
        for tid, (ws, owner) in list(self.index.items()):
            try:
                thread = self.threads.get(tid, owner, [ws])
                sched = read_schedule(thread)
            except (ThreadNotFound, ValueError):
                sched = None
            if sched is None:
                self.index.pop(tid, None)
                continue
            try:
                when = next_due(sched, sched.handled_until or sched.created)
            except ScheduleError:
                continue
            if when <= now:
                due.append((thread, sched, when))
        return due

    async def tick(self) -> list[str]:
        """Start the refreshes due now; returns their thread ids (tests await `self.running`)."""
        now = self.clock()
        if self._scanned_at is None or now - self._scanned_at >= self.settings.schedule_rescan_s:
            self.index.update(await asyncio.to_thread(self._scan))
            self._scanned_at = now
        for tid, (_, task) in list(self.running.items()):
            if task.done():
                del self.running[tid]
        started: list[str] = []
        for thread, sched, when in await asyncio.to_thread(self._due, now):
            owners = {o for o, _ in self.running.values()}
            if len(self.running) >= self.settings.scheduled_max:
                break
            if thread.id in self.running or sched.owner in owners:
                continue
            task = asyncio.create_task(self._run_due(thread, when), name=f"scheduled-refresh-{thread.id}")
            self.running[thread.id] = (sched.owner, task)
            started.append(thread.id)
        return started

    async def _run_due(self, thread: Thread, when: float) -> None:
        lease = await asyncio.to_thread(self.locks.try_acquire, f"refresh-schedule-{thread.id}")
        if lease is None:
            return  # another host (or process) runs it
        try:
            sched = await asyncio.to_thread(read_schedule, thread)
            if sched is None or (sched.handled_until or 0) >= when:
                return  # deleted meanwhile, or already run by another host
            outcome = await self._refresh_as_owner(thread, sched)
            if outcome is None:
                return  # the thread was busy: the next tick tries again
            await asyncio.to_thread(self._record, thread, when, *outcome)
        except Exception:
            log.exception("scheduled refresh of %s failed", thread.id)
        finally:
            await asyncio.to_thread(lease.release)

    async def _refresh_as_owner(self, thread: Thread, sched: RefreshSchedule) -> tuple[str, int, str | None] | None:
        """(status, changes, error) of the run; None when the thread is busy."""
        user = await asyncio.to_thread(self.users.get, sched.owner)
        if user is None or user.revoked or sched.workspace not in user.workspaces:
            return "failed", 0, f"user {sched.owner} no longer has access to workspace {sched.workspace}"
        try:
            turn = await self.refresh.start(thread, user, trigger="schedule")
        except (TurnConflict, TooManyTurns):
            return None
        except NothingToRefresh as exc:
            return "failed", 0, str(exc)
        if turn.task is not None:
            await asyncio.shield(turn.task)
        report = await asyncio.to_thread(last_report, thread) or {}
        return str(report.get("status", "failed")), int(report.get("changes", 0)), report.get("error")

    def _record(self, thread: Thread, when: float, status: str, changes: int, error: str | None) -> None:
        now = self.clock()

        def change(raw: bytes | None) -> Any:
            value = msgspec.json.decode(raw) if raw else None
            if not isinstance(value, dict) or not value.get("owner"):
                return None  # removed while it ran: it stays removed
            sched = msgspec.convert(value, RefreshSchedule)
            handled = when
            for _ in range(CATCH_UP_MAX):  # missed due times are one run, not a burst
                following = next_due(sched, handled)
                if following > now:
                    break
                handled = following
            return msgspec.to_builtins(msgspec.structs.replace(
                sched, handled_until=handled, last_run=now, last_status=status, last_changes=changes,
                last_error=error))

        thread.update_doc(SCHEDULE, change, thread.epoch)
