"""The offload writer pool (issue 27): how many large results are written at once.

Writing a large result (reading the rest of its stream, encoding Parquet, publishing the
metadata, the quota pass) is CPU work that no longer holds a query slot once the source is
read. It is bounded on its own: at most `limits.offload_writers_per_user` writes of one
user and `limits.offload_writers` in the app process (default: one per CPU core the process
may use) run at once. Writes past it wait in the fair line of `store/fair_queue.py` (in order
per user, round-robin across users), reported as progress ("waiting for a writer: 2 ahead");
a write is never refused for want of a writer, and a cancelled one leaves the line.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from datadesk.store.fair_queue import FairQueue, Waiter

PER_USER = 2  # writes of one user at once, by default


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class Writer(Waiter):
    """One write's place in the pool; `release()` is idempotent and safe from any thread."""

    def __init__(self, pool: "WriterPool", user: str) -> None:
        super().__init__(user)
        self._pool = pool

    def release(self) -> None:
        self._pool._line.release(self)


class WriterPool:
    """Writes per user and in the app process, served fairly; waiting is progress, never refusal."""

    def __init__(self, per_user: int = PER_USER, total: int = 0) -> None:
        self._line = FairQueue(per_user, total if total > 0 else cpu_cores())

    @property
    def executor(self) -> ThreadPoolExecutor:
        """Threads of the pool's own: a write that has its writer never waits behind other work."""
        return self._line.threads("writer")

    @property
    def per_user(self) -> int:
        return self._line.per_user

    @property
    def total(self) -> int:
        return self._line.total

    async def acquire(self, user: str, progress: Callable[..., None] | None = None) -> Writer:
        """A writer for `user`'s write, waiting in line as long as it takes; while it waits
        `progress(message="waiting for a writer: N ahead")` (at once, then when N changes).
        Cancelling the caller leaves the line (no writer is taken)."""
        writer = Writer(self, user)
        if self._line.offer(writer):
            return writer

        def report(ahead: int) -> None:
            if progress is not None:
                try:
                    progress(message=f"waiting for a writer: {ahead} ahead")
                except Exception:  # progress is advice
                    pass

        await self._line.wait(writer, None, report)
        return writer

    def running(self, user: str | None = None) -> int:
        return self._line.held(user)

    def waiting(self, user: str | None = None) -> int:
        return self._line.waiting(user)
