"""Periodic work that wakes the process together instead of each on its own clock.

A server waiting for nothing still wakes up for its timers: the event loop's lag monitor
(api/looplag.py) twenty times a second, every follower of a turn that another worker runs
(chat/journal.py's `follow_file`) ten times a second. Each wake-up of an idle process costs far
more than the work it does (the scheduler, cold caches: about half a millisecond of CPU on a
small VM, bench/streaming.py), so timers that each pick their own moment multiply it.
`sleep_to_grid(period)` sleeps until the next multiple of `period` on the loop's clock: timers
on the same grid (periods that divide each other) fall due together, and the loop runs them in
one wake-up.
"""

from __future__ import annotations

import asyncio


def next_grid_point(now: float, period: float) -> float:
    """The first multiple of `period` after `now` (at least a quarter period away, so a timer
    that fires a hair early does not run twice for one point)."""
    point = (now // period + 1) * period
    return point + period if point - now < period / 4 else point


async def sleep_to_grid(period: float) -> float:
    """Sleep until the next grid point of `period` (see the module doc); returns that point on the
    loop's clock, so a caller can tell how late it woke."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    point = next_grid_point(now, period)
    await asyncio.sleep(point - now)
    return point
