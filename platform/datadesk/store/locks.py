"""The embedded `LockService` (store/interfaces/locks.py): one `filelock` file per name under a folder
(`<home>/locks/` by default). The OS drops a process's locks when it dies, so a lease can
never be lost while its process lives."""

from __future__ import annotations

import time
from pathlib import Path

from filelock import FileLock, Timeout

from datadesk.store.interfaces.locks import LeaseBase, LockTimeout, check_lock_name

POLL_S = 0.01  # how often `acquire` tries again (filelock's own poll, bounded below)


class FileLease(LeaseBase):
    """A held lock file."""

    def __init__(self, name: str, lock: FileLock) -> None:
        self.name = name
        self._lock = lock

    @property
    def lost(self) -> bool:
        return False

    def check(self) -> bool:
        return not self._released and self._lock.is_locked

    def _release(self) -> None:
        self._lock.release()


class FileLocks:
    """Named locks as files `<dir>/<name>.lock` (names checked: they are file names)."""

    def __init__(self, lock_dir: Path) -> None:
        self.lock_dir = Path(lock_dir)
        self._held: set[FileLease] = set()

    def _lock(self, name: str) -> FileLock:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        # thread_local=False: a lease taken in one thread may be released in another (asyncio)
        return FileLock(str(self.lock_dir / f"{check_lock_name(name)}.lock"), thread_local=False)

    def try_acquire(self, name: str) -> FileLease | None:
        lock = self._lock(name)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return None
        return self._keep(FileLease(name, lock))

    def acquire(self, name: str, timeout_s: float) -> FileLease:
        lock = self._lock(name)
        started = time.monotonic()
        try:
            lock.acquire(timeout=max(0.0, timeout_s), poll_interval=POLL_S)
        except Timeout:
            raise LockTimeout(f"lock {name!r} is still held by someone else after "
                              f"{time.monotonic() - started:.1f} s") from None
        return self._keep(FileLease(name, lock))

    def _keep(self, lease: FileLease) -> FileLease:
        self._held = {h for h in self._held if not h._released}
        self._held.add(lease)
        return lease

    def close(self) -> None:
        held, self._held = self._held, set()
        for lease in held:
            lease.release()
