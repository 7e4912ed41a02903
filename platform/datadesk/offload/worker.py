"""A write that runs in a worker thread (offload, upload, restore) and can be cancelled.

`asyncio.to_thread` alone cannot stop a thread: a cancelled call would be recorded as
cancelled while its thread kept writing and published the artifact later. A `WriteJob`
carries what the thread and the event loop share:

- a cancel flag the writer checks per batch (`check()` raises `WriteCancelled`, the sink
  then removes its temp files);
- `publish()`, under the same lock as `cancel()`: either the metadata is written before
  the cancel (and the cancelling side removes the artifact again) or not at all;
- `report(rows, bytes)`: progress, throttled, handed to the event loop's callback
  (`loop.call_soon_threadsafe`: the turn's event queue is not thread-safe).

`run_job` runs the write and, when the awaiting task is cancelled, sets the flag,
interrupts the source (a DuckDB query), waits a short grace for the thread to stop and
removes whatever it had published, then lets the cancellation go on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import Executor
from typing import Any, Callable, TypeVar

from datadesk.domain.artifacts import Artifact
from datadesk.store.fair_queue import in_thread

log = logging.getLogger(__name__)

T = TypeVar("T")

PROGRESS_INTERVAL_S = 0.5  # at most two progress reports a second per write
STOP_GRACE_S = 10.0  # how long a cancel waits for the writer thread to stop


class WriteCancelled(Exception):
    """The write was cancelled: nothing was published and its temp files are gone."""


class WriteJob:
    """The shared state of one write: cancel flag, progress callback, what it published."""

    def __init__(self, progress: Callable[..., None] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None,
                 interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._progress = progress
        self._loop = loop
        self._interval = interval_s
        self._last = time.monotonic()  # the first report comes after one interval
        self.published: list[Any] = []  # (thread, artifact) pairs written by publish()
        self.reports = 0

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        """Raise WriteCancelled once the job was cancelled (call it per batch)."""
        if self._cancel.is_set():
            raise WriteCancelled("the write was cancelled")

    def cancel(self) -> list[Any]:
        """Stop the job; returns what it had already published (the caller removes it)."""
        with self._lock:
            self._cancel.set()
            return list(self.published)

    def publish(self, thread: Any, art: Artifact, save: Callable[[], None]) -> None:
        """Run `save` (the metadata write) unless cancelled; remembered for a late cancel."""
        with self._lock:
            self.check()
            save()
            self.published.append((thread, art))

    def report(self, rows: int, nbytes: int) -> None:
        """Progress of the write: sent at most once per interval, never raises."""
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        self.reports += 1
        call = functools.partial(self._progress, rows=rows, bytes=nbytes)
        try:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(call)
            else:
                call()
        except Exception:  # a closed loop, a failing callback: progress is advice
            pass


async def run_job(job: WriteJob, fn: Callable[..., T], *args: Any,
                  interrupt: Callable[[], None] | None = None,
                  discard: Callable[[Any, Artifact], None] | None = None,
                  grace_s: float = STOP_GRACE_S, done: Callable[[], None] | None = None,
                  executor: Executor | None = None) -> T:
    """`fn(*args)` in a worker thread; on cancellation of the caller: cancel `job`, call
    `interrupt` (stops a blocked source), wait up to `grace_s` for the thread to stop, and
    `discard` each artifact it published before the cancel arrived. `done()` runs once the
    thread has really ended (e.g. to give back its writer), even when that is after the grace.
    `executor`: the threads to run in (the writer pool's own), else the loop's default ones."""
    task = asyncio.ensure_future(in_thread(executor, fn, *args))
    if done is not None:
        task.add_done_callback(lambda _task: done())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        published = job.cancel()
        if interrupt is not None:
            try:
                interrupt()
            except Exception:
                log.exception("interrupting the source of a cancelled write failed")
        done, _ = await asyncio.wait({task}, timeout=grace_s)
        if not done:
            log.warning("a cancelled write did not stop within %.0f s; it will stop at its next batch", grace_s)
            task.add_done_callback(_ignore_result)
        else:
            _ignore_result(task)
        for thread, art in published:
            if discard is not None:
                try:
                    discard(thread, art)
                except Exception:
                    log.exception("removing artifact %s of a cancelled write failed", art.id)
        raise


def _ignore_result(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a write nobody awaits any more (no 'never retrieved' warning)."""
    if not task.cancelled():
        exc = task.exception()
        if exc is not None and not isinstance(exc, WriteCancelled):
            log.info("a cancelled write ended with %s: %s", type(exc).__name__, exc)
