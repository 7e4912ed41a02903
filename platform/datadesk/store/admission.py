"""Admission of heavy work (issue 15): query slots per user and per app process, and the
app's memory ceiling.

DuckDB (and any other SQL source) runs inside the app process. Each query is bounded
on its own (`limits.sql_memory_mb`, threads, temp space, timeout), but N users running
queries at once would still add up. So a query needs a **slot** first:

- at most `limits.sql_queries_per_user` running for one user, and
- at most `limits.sql_queries` running in the app process (all users together).

A slot covers the database work only (issue 27): it is given back when the source's last
batch has been read (or the stream closed, failed or was cancelled), not when the artifact is
written -- writing and accounting run after it, in the offload writer pool
(`offload/writers.py`). A query past either limit waits in a fair line (`store/fair_queue.py`:
in order per user, round-robin across users; parallel calls of one turn thus run one after the
other) and its wait is reported as progress ("waiting for a query slot: 3 ahead"). Only a
wait past `limits.sql_queue_s` is refused, with a message naming the setting.

The **memory guard** watches the app's resident memory (`/proc/self/statm`, no extra
dependency) against `limits.app_memory_mb`: above `admit_fraction` of it no new heavy
work is admitted; above `stop_fraction` a watchdog thread interrupts every running
query (the largest consumer the app has), each failing with a message naming the
ceiling. Sampling is cheap (one small read) and runs only while queries hold slots.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from typing import Callable

from datadesk.store.fair_queue import FairQueue, Waiter
from datadesk.telemetry import QUEUE_REFUSED, observe_wait

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Busy(Exception):
    """No slot (or no memory) for this work now: the message names the limit and what to do."""


def rss_bytes() -> int:
    """This process's resident set size, in bytes (0 when /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class MemoryGuard:
    """The app's RSS against its ceiling (`limits.app_memory_mb`)."""

    def __init__(self, ceiling_mb: int, admit_fraction: float = 0.8, stop_fraction: float = 0.92,
                 sample: Callable[[], int] = rss_bytes) -> None:
        self.ceiling = int(ceiling_mb) * 1024 * 1024
        self.admit_fraction = admit_fraction
        self.stop_fraction = stop_fraction
        self.sample = sample
        self.peak = 0

    def rss(self) -> int:
        value = self.sample()
        self.peak = max(self.peak, value)
        return value

    def _mb(self, value: int) -> str:
        return f"{value / 1024 / 1024:,.0f} MB"

    def check_admit(self, what: str) -> None:
        """Refuse new heavy work while the app is near its memory ceiling."""
        if self.ceiling <= 0:
            return
        used = self.rss()
        if used > self.ceiling * self.admit_fraction:
            raise Busy(f"the server is short of memory ({self._mb(used)} of its {self._mb(self.ceiling)} "
                       f"ceiling, limits.app_memory_mb): the {what} was not started; try again in a minute, "
                       "or narrow it (filter, aggregate, LIMIT)")

    def over_stop(self) -> int | None:
        """The RSS when it is past the stop level (running work must be interrupted), else None."""
        if self.ceiling <= 0:
            return None
        used = self.rss()
        return used if used > self.ceiling * self.stop_fraction else None

    def stop_message(self, used: int) -> str:
        return (f"the query was stopped: the server reached its memory ceiling ({self._mb(used)} of "
                f"{self._mb(self.ceiling)}, limits.app_memory_mb); filter or aggregate in SQL, or add a LIMIT")


class Slot(Waiter):
    """One admitted piece of work; `release()` is idempotent and safe from any thread.
    `on_pressure(message)` is called (from the watchdog thread) when the app must shed memory."""

    def __init__(self, owner: "QuerySlots", user: str, what: str) -> None:
        super().__init__(user)
        self._owner = owner
        self.what = what
        self.on_pressure: Callable[[str], None] | None = None
        self._shed = False

    def release(self) -> None:
        self._owner._line.release(self)

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class QuerySlots:
    """Per-user and global slots for queries, handed out in a fair line (`store/fair_queue.py`),
    with the memory guard's watchdog."""

    def __init__(self, per_user: int, total: int, wait_s: float, guard: MemoryGuard | None = None,
                 watch_interval_s: float = 0.2,
                 names: tuple[str, str, str] = ("sql_queries_per_user", "sql_queries", "sql_queue_s"),
                 kind: str = "query") -> None:
        self.names = names  # the settings (under `limits.`) the refusals name
        self.kind = kind  # what a waiter is told it waits for: "waiting for a <kind> slot"
        self._article = "an" if kind[:1] in "aeiou" else "a"
        self.wait_s = max(0.0, float(wait_s))
        self.guard = guard
        self.watch_interval_s = watch_interval_s
        self._line = FairQueue(per_user, total, on_grant=self._granted)
        self._lock = self._line.lock
        self._watchdog: threading.Thread | None = None
        self.stopped_for_memory = 0  # queries the watchdog interrupted (for the health report)

    @property
    def executor(self) -> ThreadPoolExecutor:
        """Threads of the slots' own: work that holds a slot never waits behind other work."""
        return self._line.threads(self.kind)

    @property
    def per_user(self) -> int:
        return self._line.per_user

    @property
    def total(self) -> int:
        return self._line.total

    @property
    def _running(self) -> list[Slot]:
        return self._line.holding  # type: ignore[return-value]

    # -- admission -------------------------------------------------------------------------
    def _refuse_user(self, user: str, what: str) -> Busy:
        return Busy(f"you already have {self.per_user} {what}(s) running (limits.{self.names[0]} = "
                    f"{self.per_user}) and it did not finish within {self.wait_s:g} s (limits.{self.names[2]}): "
                    "wait for it to finish, or stop it, before starting another")

    def _refuse_all(self, what: str) -> Busy:
        return Busy(f"the server is running its maximum of {self.total} {what}(s) for all users "
                    f"(limits.{self.names[1]}) and none finished within {self.wait_s:g} s "
                    f"(limits.{self.names[2]}): try again shortly")

    def _refusal(self, user: str, what: str) -> Busy:
        """The refusal after a wait: the user's own limit when it is what held them up."""
        return self._refuse_user(user, what) if self._line.held(user) >= self.per_user else self._refuse_all(what)

    def _new(self, user: str, what: str) -> Slot:
        if self.guard is not None:
            self.guard.check_admit(what)  # Busy near the memory ceiling: not even queued
        return Slot(self, user, what)

    def _granted(self, waiter: Waiter) -> None:
        self._ensure_watchdog()  # under the line's lock

    def try_acquire(self, user: str, what: str = "SQL query") -> Slot | None:
        """A slot now, or None when the user's own or the app's limit is reached (or others wait
        in line before it); raises Busy near the memory ceiling."""
        slot = self._new(user, what)
        return slot if self._line.offer(slot, wait=False) else None

    async def acquire(self, user: str, what: str = "SQL query",
                      progress: Callable[..., None] | None = None) -> Slot:
        """A slot, waiting in line up to `wait_s` while the user's own (e.g. a parallel call of the
        same turn, until its rows are read) or the app's slots are all taken; then Busy naming
        the setting. While it waits, `progress(message="waiting for a query slot: N ahead")` is
        called (at once, then when N changes); cancelling the caller leaves the line."""
        slot = self._new(user, what)
        if self._line.offer(slot):
            return slot

        def report(ahead: int) -> None:
            if progress is not None:
                try:
                    progress(message=f"waiting for {self._article} {self.kind} slot: {ahead} ahead")
                except Exception:  # progress is advice
                    pass

        started = time.monotonic()
        waited = await self._line.wait(slot, self.wait_s, report)
        self._waited(started, waited)
        if waited:
            return self._still_admitted(slot)
        raise self._refusal(user, what)

    def acquire_blocking(self, user: str, what: str = "SQL query") -> Slot:
        """`acquire` for worker threads."""
        slot = self._new(user, what)
        if self._line.offer(slot):
            return slot
        started = time.monotonic()
        waited = self._line.wait_blocking(slot, self.wait_s)
        self._waited(started, waited)
        if waited:
            return self._still_admitted(slot)
        raise self._refusal(user, what)

    def _waited(self, started: float, granted: bool) -> None:
        """/metrics (telemetry.py): the wait in line, and whether it ended in a refusal."""
        observe_wait(self.kind, started)  # "query" or "upload"
        if not granted:
            QUEUE_REFUSED.labels(self.kind).inc()

    def _still_admitted(self, slot: Slot) -> Slot:
        """After a wait in line: the memory may have risen meanwhile (Busy, the slot goes back)."""
        if self.guard is not None:
            try:
                self.guard.check_admit(slot.what)
            except Busy:
                slot.release()
                raise
        return slot

    # -- state -----------------------------------------------------------------------------
    def running(self, user: str | None = None) -> int:
        return self._line.held(user)

    def waiting(self, user: str | None = None) -> int:
        """Calls waiting in line for a slot (of `user`, or of everyone)."""
        return self._line.waiting(user)

    # -- the watchdog ----------------------------------------------------------------------
    def _ensure_watchdog(self) -> None:
        """Start the sampling thread while slots are held (called under the lock)."""
        if self.guard is None or self.guard.ceiling <= 0:
            return
        if self._watchdog is None or not self._watchdog.is_alive():
            self._watchdog = threading.Thread(target=self._watch, name="datadesk-memory-guard", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        assert self.guard is not None
        while True:
            with self._lock:
                if not self._running:
                    self._watchdog = None
                    return
            used = self.guard.over_stop()
            if used is not None:
                self.shed(self.guard.stop_message(used))
            time.sleep(self.watch_interval_s)

    def shed(self, message: str) -> int:
        """Interrupt every running query (memory pressure); returns how many were told."""
        with self._lock:
            victims = [s for s in self._running if s.on_pressure is not None and not s._shed]
            for slot in victims:
                slot._shed = True
        for slot in victims:
            try:
                slot.on_pressure(message)  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - a failed interrupt must not stop the others
                pass
        self.stopped_for_memory += len(victims)
        return len(victims)
