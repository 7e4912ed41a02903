"""`RateCounter`: hits per key in a time window, for login limits and request budgets.

A window opens at a key's first hit and lasts `window_s` seconds; every hit inside it adds its
cost; the first hit after it ends opens a new window (Redis' `INCR` + `EXPIRE` on the first).
So a limit of N per window allows at most N in the window a burst opens, and the wait a
refusal names is the time until that window ends (`resets_in`). Counters of the same key with
different window lengths are separate; `reset(key)` clears them all.

Implementations:
- `MemoryCounter` (here): per process, the embedded set; what `LoginFailures` kept in memory.
- `cluster.counters.PgCounters`: one row per (key, window) in PostgreSQL, shared by every host,
  so N hosts together allow what one would, not N times as much.

`shared` says which: a request budget counted in a shared counter pays a database statement
per request, so callers may keep exact per-process shapes (a token bucket) when it is False.

Errors: `ValueError` for an empty key, a window that is not a positive number of seconds, or
a cost below 1.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from typing import Callable, Protocol, runtime_checkable

MAX_WINDOW_S = 366 * 86400.0  # a year: longer is a mistake (a unit of ms?), not a rate limit


def check_hit(key: str, window_s: float, cost: int = 1) -> None:
    """Refuse what no counter can count, with what was wrong."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a rate counter key must be a non-empty string, not {key!r}")
    if (isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not math.isfinite(window_s)
            or not 0 < window_s <= MAX_WINDOW_S):
        raise ValueError(f"a rate counter window must be a positive number of seconds up to "
                         f"{MAX_WINDOW_S:.0f}, not {window_s!r}")
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise ValueError(f"a rate counter hit must cost a whole number >= 1, not {cost!r}")


@runtime_checkable
class RateCounter(Protocol):
    """Hits per key in a window that opens at the key's first hit."""

    shared: bool  # True when other processes and hosts count into the same windows

    def hit(self, key: str, window_s: float, cost: int = 1) -> int:
        """Add `cost` to `key`'s current window (opening one if none is open); returns the count
        in that window after this hit."""
        ...

    def count(self, key: str, window_s: float) -> int:
        """The count in `key`'s open window, 0 when none is open. Changes nothing."""
        ...

    def resets_in(self, key: str, window_s: float) -> float:
        """Seconds until `key`'s open window ends, 0.0 when none is open."""
        ...

    def reset(self, key: str) -> None:
        """Forget `key`'s windows (every window length)."""
        ...


class MemoryCounter:
    """`RateCounter` in this process's memory (thread-safe). Bounded: ended windows are
    dropped as hits come in, so the table holds only windows that are still open."""

    shared = False

    def __init__(self, clock: Callable[[], float] = time.monotonic, sweep_at: int = 10_000) -> None:
        self.clock = clock
        self._windows: OrderedDict[tuple[str, float], tuple[float, int]] = OrderedDict()  # -> (ends, count)
        self._lock = threading.Lock()
        self._sweep_at = self._min_sweep = sweep_at

    def __len__(self) -> int:
        return len(self._windows)

    def hit(self, key: str, window_s: float, cost: int = 1) -> int:
        check_hit(key, window_s, cost)
        slot = (key, float(window_s))
        with self._lock:
            now = self.clock()
            ends, count = self._windows.get(slot, (0.0, 0))
            if ends <= now:  # none open: a new window, at the end (the table stays in opening order)
                self._windows.pop(slot, None)
                ends, count = now + window_s, 0
            self._windows[slot] = (ends, count + cost)
            self._sweep(now)
            return count + cost

    def _open(self, key: str, window_s: float) -> tuple[float, int] | None:
        check_hit(key, window_s)
        with self._lock:
            found = self._windows.get((key, float(window_s)))
            now = self.clock()
        return (found[0] - now, found[1]) if found and found[0] > now else None

    def count(self, key: str, window_s: float) -> int:
        found = self._open(key, window_s)
        return found[1] if found else 0

    def resets_in(self, key: str, window_s: float) -> float:
        found = self._open(key, window_s)
        return found[0] if found else 0.0

    def reset(self, key: str) -> None:
        check_hit(key, 1.0)
        with self._lock:
            for slot in [s for s in self._windows if s[0] == key]:
                del self._windows[slot]

    def _sweep(self, now: float) -> None:
        # oldest-opened first: windows of one length end in that order, so this is O(1) a hit;
        # with several lengths a long one can shelter ended short ones behind it, hence the full
        # sweep once the table has grown past `_sweep_at` (doubling, so it stays amortized O(1))
        while self._windows:
            ends, _ = next(iter(self._windows.values()))
            if ends > now:
                break
            self._windows.popitem(last=False)
        if len(self._windows) > self._sweep_at:
            for slot in [s for s, (ends, _) in self._windows.items() if ends <= now]:
                del self._windows[slot]
            self._sweep_at = max(self._min_sweep, 2 * len(self._windows))
