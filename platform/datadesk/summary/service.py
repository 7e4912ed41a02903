"""When to refresh a thread summary, and the refresh jobs themselves.

- `due()`: after a reply, when >= `refresh_after_records` records were trimmed
  out of the window and are not covered yet, or the request passed the
  "compact" water level (with at least one such record).
- `schedule()`: runs `refresh()` in the background after the reply (the reply
  never waits); tasks are kept referenced until done; `drain()` awaits them.
- `refresh()`: one job at a time per thread: an in-process `asyncio.Lock` per
  thread directory, plus the lock `summary:<thread>` of the runtime's
  `LockService` (store/interfaces/locks.py; without one, the thread's `summary.lock`
  filelock), taken without waiting, so a job of another process, or on the
  cluster set of another host, makes this one skip. It reads the previous summary and only
  the records in (covers_through_seq, upto_seq] from the tail of the log,
  asks the summarizer, and writes through the guarded store (epoch and
  coverage checked under the thread lock). It never raises (CancelledError
  apart): a failure keeps the previous summary, is logged, and is recorded with
  its reason in `summary.status.json` (`summary.status`; a success records ok).
- `refresh(..., synchronous=True)`: used before a model call when uncovered
  records would otherwise leave the window ("no gap"): it waits for another
  process's job instead of skipping, and returns the stored summary when that
  already covers `upto_seq`.

Back-off: after `summary.backoff_after` failed refreshes in a row (each already
`summary.max_attempts` summarizer calls; 0: never pause), no refresh is tried until the log has
grown by a window that doubles with each further failure (`refresh_after_records` * 2^(failures-1)
records, at most `summary.backoff_max_records`).
The failure count and the next seq to try at are kept in `summary.status` (so a restart does not
reset it), and the status reason says "summaries paused after N failures, next try after record
#S". A success resets it; so does a change of the summarizer's model or summary settings (the
status keeps their fingerprint).

A job whose lease was lost while it ran (the lock's database connection died, so another host
may be summarizing the thread now) writes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import weakref
from typing import Any, Literal

import msgspec
from filelock import Timeout

from datadesk.domain.branches import abandoned_since, active_records
from datadesk.settings import SummarySettings
from datadesk.store.interfaces.locks import LockService
from datadesk.store.threads import Thread
from datadesk.summary.model import ThreadSummary
from datadesk.summary.status import SummaryStatusStore
from datadesk.summary.store import SummaryStore
from datadesk.summary.summarizer import SummaryError, Summarizer

log = logging.getLogger(__name__)

LOCK_NAME = "summary"  # `summary:<thread>` in the LockService (or the thread's `summary.lock`)
POLL_S = 0.05  # synchronous refresh: how often to retry another process's lock


class _FileJobLock:
    """The thread's own `summary.lock` (no LockService given) as a lease-like object."""

    lost = False

    def __init__(self, flock: Any) -> None:
        self._flock = flock

    def release(self) -> None:
        self._flock.release()


class SummaryService:
    """Refreshes thread summaries (see the module docstring)."""

    def __init__(self, store: SummaryStore, summarizer: Summarizer, settings: SummarySettings | None = None,
                 status: SummaryStatusStore | None = None, locks: LockService | None = None) -> None:
        self.store = store
        # one job per thread across processes (embedded: files under <home>/locks/) and hosts
        # (cluster: advisory locks); None: the thread's own summary.lock (one host only)
        self.locks = locks
        self.status = status or SummaryStatusStore()  # how the last refresh went (ok / failed, why)
        self.summarizer = summarizer
        self.settings = settings or SummarySettings()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._tasks: set[asyncio.Task] = set()

    # -- when ----------------------------------------------------------------
    def _covers(self, thread: Thread) -> int:
        epoch = thread.current_epoch()
        summary = self.store.load_current(thread, epoch) if epoch is not None else None
        return summary.covers_through_seq if summary is not None else 0

    def due(self, thread: Thread, trimmed_through_seq: int, water: str) -> bool:
        """True when a refresh should follow this reply.

        `trimmed_through_seq`: the last seq before the window (records up to it
        left the window); `water`: the request's level ("ok" | "warn" | "compact").
        Seqs are contiguous within an epoch, so the count is a difference.
        """
        if not self.settings.enabled or trimmed_through_seq <= 0:
            return False
        pending = trimmed_through_seq - self._covers(thread)
        if pending <= 0:
            return False
        return pending >= self.settings.refresh_after_records or water == "compact"

    # -- jobs ----------------------------------------------------------------
    def schedule(self, thread: Thread, upto_seq: int, epoch: int, focus: str | None = None) -> asyncio.Task:
        """Run `refresh` in the background; the task is kept until it finishes."""
        task = asyncio.get_running_loop().create_task(
            self.refresh(thread, upto_seq, epoch, focus), name=f"summary:{thread.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait until every scheduled job has finished (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def refresh(self, thread: Thread, upto_seq: int, epoch: int, focus: str | None = None,
                      synchronous: bool = False) -> ThreadSummary | None:
        """Summarize through `upto_seq`; the summary written (or, synchronous, the one covering), else None."""
        try:
            if not self.settings.enabled or not thread.exists():
                return None
            status = self.status.load(thread, epoch)
            if status is not None and status.backing_off(upto_seq, self.fingerprint()):
                log.info("summary refresh of %s skipped: backing off until #%d", thread.id, status.next_try_seq)
                return None
            key = str(thread.dir.resolve())
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = asyncio.Lock()
            async with lock:
                lease = await self._acquire(thread, synchronous)
                if lease is None:
                    log.info("summary refresh of %s skipped: another process is summarizing it", thread.id)
                    return None
                try:
                    return await self._run(thread, upto_seq, epoch, focus, synchronous, lease)
                finally:
                    if self.locks is not None:
                        await asyncio.to_thread(lease.release)  # a statement on the cluster set
                    else:
                        lease.release()  # a thread-local filelock: released where it was taken
        except asyncio.CancelledError:
            raise
        except SummaryError as exc:
            log.warning("summary of %s not refreshed (previous kept): %s", thread.id, exc)
            self._record(thread, epoch, "failed", upto_seq, str(exc))
        except Exception as exc:  # noqa: BLE001 - a background job must never take anything down
            log.exception("summary refresh of %s failed (previous kept)", thread.id)
            self._record(thread, epoch, "failed", upto_seq, f"internal error ({type(exc).__name__})")
        return None

    def fingerprint(self) -> str:
        """The summarizer's model and settings, short: a change resets the back-off."""
        raw = b"|".join([str(getattr(self.summarizer.model, "name", "")).encode(),
                         str(self.summarizer.output).encode(), msgspec.json.encode(self.settings)])
        return hashlib.sha256(raw).hexdigest()[:16]

    def backoff(self, thread: Thread, epoch: int, upto_seq: int) -> tuple[int, int]:
        """(failures in a row including this one, the seq before which no refresh is tried, or 0)."""
        fp = self.fingerprint()
        status = self.status.load(thread, epoch)
        failures = status.failures + 1 if status is not None and status.state == "failed" \
            and status.fingerprint == fp else 1
        after, longest = self.settings.backoff_after, self.settings.backoff_max_records
        if after == 0 or failures < after:
            return failures, 0
        window = min(longest, max(1, self.settings.refresh_after_records) * 2 ** (failures - 1))
        return failures, upto_seq + window

    def _record(self, thread: Thread, epoch: int, state: Literal["ok", "failed"], upto_seq: int,
                reason: str = "") -> None:
        try:
            if thread.exists():
                failures, next_try = self.backoff(thread, epoch, upto_seq) if state == "failed" else (0, 0)
                self.status.record(thread, epoch, state, upto_seq, reason, failures=failures,
                                   next_try_seq=next_try, fingerprint=self.fingerprint())
        except Exception:  # noqa: BLE001 - the status is advice; the refresh's outcome stands
            log.exception("could not record the summary status of %s", thread.id)

    async def _acquire(self, thread: Thread, synchronous: bool) -> Any:
        """The thread's summary lock, or None when another job holds it (synchronous: waited
        for up to summary.timeout_s first)."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            lease = await self._try_lock(thread)
            if lease is not None:
                return lease
            if not synchronous or time.monotonic() >= deadline:
                return None
            await asyncio.sleep(POLL_S)

    async def _try_lock(self, thread: Thread) -> Any:
        if self.locks is not None:  # a statement on the cluster set: off the event loop
            return await asyncio.to_thread(self.locks.try_acquire, f"{LOCK_NAME}:{thread.id}")
        flock = thread.job_lock(LOCK_NAME)
        try:
            flock.acquire(timeout=0)
        except Timeout:
            return None
        return _FileJobLock(flock)

    async def _run(self, thread: Thread, upto_seq: int, epoch: int, focus: str | None,
                   synchronous: bool, lease: Any = None) -> ThreadSummary | None:
        if thread.cleared_since(epoch):
            log.info("summary refresh of %s skipped: the thread was cleared", thread.id)
            return None
        previous = self.store.load_current(thread, epoch)
        covers = previous.covers_through_seq if previous is not None else 0
        if upto_seq <= covers:
            return previous if synchronous else None  # an earlier job already covers it
        records = thread.log.since(covers + 1, upto_seq)
        if previous is not None and abandoned_since(records, covers):
            previous, records = None, thread.log.since(1, upto_seq)  # a branch rewound past it: re-derive
        records = active_records(records)  # an earlier branch's records are never summarised
        if not records:
            return None
        summary = await self.summarizer.summarize(previous, records, epoch, focus)
        if lease is not None and lease.lost:  # another host may hold the lock (and summarize) now
            log.warning("summary of %s not written: its lock %s:%s was lost while it ran", thread.id, LOCK_NAME,
                        thread.id)
            return None
        if self.store.write(thread, summary, epoch):
            log.info("summary of %s now covers #%d", thread.id, summary.covers_through_seq)
            self._record(thread, epoch, "ok", upto_seq)
            return summary
        if synchronous:  # dropped: maybe because another job already covers as far
            stored = self.store.load_current(thread, epoch)
            if stored is not None and stored.covers_through_seq >= upto_seq:
                return stored
        return None
