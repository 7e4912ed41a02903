"""Room on the disk of the data directory, checked before work rather than discovered after.

Below `store.min_free_mb` of free space (for an unprivileged process: what `statvfs` gives
non-root users) a new turn, upload, pasted table or re-query is refused with `DiskLow`
(507 Insufficient Storage), naming the setting; `/api/health` reports the state, and each
change of state is logged once. A write that still fails on a full disk (the space went
between the check and the write) is a `StoreWriteError` (store/files.py): whole or absent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
STATUS_WAIT_S = 0.5  # /api/health waits at most this long for the file system, then gives the last figure
FRESH_S = 1.0  # a figure younger than this is given at once (measured again in the background after half of it)
_STATVFS = ThreadPoolExecutor(1, thread_name_prefix="datadesk-statvfs")  # never behind turn work


class DiskLow(Exception):
    """Too little free space in the home for new work: the message names the setting."""


def free_bytes(path: Path) -> int:
    """Free bytes for this process on the file system of `path` (0 when it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class DiskRoom:
    """The free space of the home against `store.min_free_mb` (0: never refuse)."""

    def __init__(self, home: Path, min_free_mb: int) -> None:
        self.home = Path(home)
        self.min_free_mb = int(min_free_mb)
        self._low: bool | None = None  # last state seen, to log changes once
        self._last: tuple[float, dict[str, Any]] | None = None
        self._measuring: "asyncio.Future[dict[str, Any]] | None" = None
        self._lock = threading.Lock()

    def free_mb(self) -> float:
        return free_bytes(self.home) / 1e6

    def low(self, free_mb: float | None = None) -> bool:
        """Whether the home has less than `store.min_free_mb` free (`free_mb`: as just measured)."""
        free = self.free_mb() if free_mb is None else free_mb
        low = self.min_free_mb > 0 and free < self.min_free_mb
        if low != self._low:
            if low:
                log.warning("the disk of %s has %.0f MB free, below store.min_free_mb = %d: new turns and uploads "
                            "are refused until space is freed", self.home, free, self.min_free_mb)
            elif self._low:
                log.info("the disk of %s has room again (%.0f MB free)", self.home, free)
            self._low = low
        return low

    def check(self, what: str) -> None:
        """Raise DiskLow when `what` (a new turn, an upload, ...) should not start now."""
        free = self.free_mb()
        if self.low(free):
            raise DiskLow(f"{what} was refused: the disk of the data directory has only {free:.0f} MB "
                          f"free, below store.min_free_mb = {self.min_free_mb} MB. Ask an admin to free space; "
                          "nothing already saved is affected")

    def status(self) -> dict[str, Any]:
        """What /api/health reports."""
        free = self.free_mb()
        return {"free_mb": round(free), "min_free_mb": self.min_free_mb, "low": self.low(free)}

    async def recent_status(self) -> dict[str, Any]:
        """`status()` for /api/health, measured in a thread of its own (never queued behind turn
        work in the shared threads); concurrent probes share one measurement, and when the file
        system does not answer within STATUS_WAIT_S the last figure is given (a slow network
        file system never makes the health answer wait long). A figure younger than FRESH_S is
        given at once: a probe of a busy server then waits for one turn of its event loop, not
        three (the hand-off to the thread and back each wait for the loop as well)."""
        last = self._last
        if last is not None and (age := time.monotonic() - last[0]) < FRESH_S:
            if age >= FRESH_S / 2:
                self._start_measuring()  # the next probe finds a new figure; this one does not wait for it
            return last[1]
        self._start_measuring()
        try:
            return await asyncio.wait_for(asyncio.shield(self._measuring), STATUS_WAIT_S if self._last else None)
        except asyncio.TimeoutError:
            assert self._last is not None
            return {**self._last[1], "stale_s": round(time.monotonic() - self._last[0], 1)}

    def _start_measuring(self) -> None:
        if self._measuring is None or self._measuring.done():
            self._measuring = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(_STATVFS, self._measure))

    def _measure(self) -> dict[str, Any]:
        with self._lock:
            status = self.status()
            self._last = (time.monotonic(), status)
            return status
