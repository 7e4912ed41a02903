"""How late this worker's event loop runs: the figure that says whether the server answers while busy.

A task sleeps `INTERVAL_S` again and again; how much later than asked it wakes is the loop's lag
(a request arriving then would have waited as long). Each sample goes into a fixed histogram of
counts since start (`BUCKETS_MS`, cumulative over the process's life, so a reader takes two
reports and subtracts them for any window) and a maximum per ten-second slot (the worst of the
last minute). `/api/health` carries the report (`loop`): the worker's pid, the bucket bounds,
the counts, the p99 and the maximum of the last minute. Twenty wake-ups a second cost well under
a millisecond of CPU per second.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from datadesk.chat.wakeups import sleep_to_grid

log = logging.getLogger(__name__)

INTERVAL_S = 0.05
BUCKETS_MS = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 75, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 60_000)
SLOT_S = 10.0
SLOTS = 6  # the last minute
STALL_S = 0.25  # a loop that has not ticked for this long is logged, with where it is
STALL_LOG_EVERY_S = 60.0  # ... at most this often


class LoopLag:
    """Samples the running loop's lag; `report()` is what `/api/health` shows."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.counts = [0] * (len(BUCKETS_MS) + 1)  # the last: past the largest bound
        self.samples = 0
        self._recent: deque[list[float]] = deque(maxlen=SLOTS)  # [slot start, max ms, *counts]
        self._task: asyncio.Task[None] | None = None
        self._tick = time.monotonic()
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()
        self.stalls = 0  # times the loop did not tick for STALL_S

    def record(self, lag_ms: float, now: float | None = None) -> None:
        i = bisect.bisect_left(BUCKETS_MS, lag_ms)
        self.counts[i] += 1
        self.samples += 1
        now = time.monotonic() if now is None else now
        if not self._recent or now - self._recent[-1][0] >= SLOT_S:
            self._recent.append([now, 0.0] + [0] * len(self.counts))
        slot = self._recent[-1]
        slot[1] = max(slot[1], lag_ms)
        slot[2 + i] += 1

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:  # on the shared grid: pollers that wake anyway wake with it (chat/wakeups.py)
            due = await sleep_to_grid(self.interval_s)
            self._tick = time.monotonic()
            self.record(max(0.0, (loop.time() - due) * 1000))

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="datadesk-loop-lag")
            self._tick = time.monotonic()
            self._stop.clear()
            self._watch = threading.Thread(target=self._watch_stalls, args=(threading.get_ident(),),
                                           name="datadesk-loop-stalls", daemon=True)
            self._watch.start()

    def _watch_stalls(self, loop_thread: int) -> None:
        """Log where the loop's thread is when it has not ticked for STALL_S (once per stall, at
        most every STALL_LOG_EVERY_S): what an operator needs to find the code that held it."""
        logged_at, in_stall = 0.0, False
        while not self._stop.wait(STALL_S / 2):
            late = time.monotonic() - self._tick
            if late < STALL_S:
                in_stall = False
                continue
            if in_stall:
                continue
            in_stall = True
            self.stalls += 1
            if time.monotonic() - logged_at < STALL_LOG_EVERY_S:
                continue
            logged_at = time.monotonic()
            log.warning("the event loop has not run for %.0f ms; its thread is at:\n%s", late * 1000,
                        where_is(sys._current_frames().get(loop_thread)))

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def report(self) -> dict[str, Any]:
        now = time.monotonic()
        recent = [s for s in self._recent if now - s[0] < SLOT_S * SLOTS]
        counts = [sum(int(s[2 + i]) for s in recent) for i in range(len(self.counts))]
        return {"pid": os.getpid(), "interval_ms": self.interval_s * 1000,
                "lag_buckets_ms": [*BUCKETS_MS, None], "lag_counts": list(self.counts),
                "lag_ms_p99_recent": quantile(counts, 0.99),
                "lag_max_ms_recent": round(max((s[1] for s in recent), default=0.0), 1), "stalls": self.stalls}


def quantile(counts: list[int], q: float) -> float | None:
    """The bucket bound at quantile `q` of a histogram (None without samples; the last bucket
    reports the largest bound)."""
    total = sum(counts)
    if total == 0:
        return None
    need, seen = q * total, 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= need:
            return float(BUCKETS_MS[min(i, len(BUCKETS_MS) - 1)])
    return float(BUCKETS_MS[-1])


def where_is(frame: Any) -> str:
    """A thread's stack, shortened: DataDesk's own frames, and the innermost three of any code."""
    if frame is None:
        return "(unknown)"
    stack = traceback.extract_stack(frame)
    keep = [f for i, f in enumerate(stack) if "datadesk" in f.filename or i >= len(stack) - 3]
    return "".join(traceback.format_list(keep))
