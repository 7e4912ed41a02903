"""Named locks held across processes, and on the cluster set across hosts (issue 28).

A `LockService` hands out `Lease`s by name. A lease is held until released, or until its
holder goes away: the embedded set (store/locks.py) uses `filelock` files, which the OS
drops when the process dies; the cluster set (cluster/locks.py) uses PostgreSQL session
advisory locks, which the server drops when the holder's connection dies. A lease whose
connection was lost reports itself `lost`: its holder must stop the work the lock guarded.

Locks are not reentrant: a second `try_acquire` of a held name gets None, also in the
process that holds it (as two `flock`s on one file do).

Exceptions: `LockTimeout` (acquire waited `timeout_s` in vain), `BadLockName` (a name that
is not a safe file name), both `LockError`s.
"""

from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

LOCK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


class LockError(Exception):
    """Base of the lock errors."""


class LockTimeout(LockError, TimeoutError):
    """`acquire` waited its whole timeout and someone else still holds the lock."""


class BadLockName(LockError, ValueError):
    """A lock name that is not 1-200 letters, digits, '.', '_', ':' or '-' (starting with a
    letter or digit): names become file names in the embedded set."""


def check_lock_name(name: str) -> str:
    """`name` if it is a valid lock name, else BadLockName naming it."""
    if not isinstance(name, str) or not LOCK_NAME.fullmatch(name):
        raise BadLockName(f"not a lock name: {str(name)[:80]!r} (1-200 letters, digits, '.', '_', ':' or '-', "
                          "starting with a letter or digit)")
    return name


@runtime_checkable
class Lease(Protocol):
    """A held lock. `release()` is idempotent; a lease is its own context manager."""

    name: str

    @property
    def lost(self) -> bool:
        """Known to be gone without a release (the connection holding it died); no I/O."""
        ...

    def check(self) -> bool:
        """Whether the lock is still held, asking its holder (the database) if need be."""
        ...

    def release(self) -> None:
        ...

    def __enter__(self) -> "Lease":
        ...

    def __exit__(self, *exc: object) -> None:
        ...


@runtime_checkable
class LockService(Protocol):
    """Named locks (see the module doc)."""

    def try_acquire(self, name: str) -> Lease | None:
        """The lock `name` now if nobody holds it, else None (never waits)."""
        ...

    def acquire(self, name: str, timeout_s: float) -> Lease:
        """The lock `name`, waiting up to `timeout_s` for it (LockTimeout)."""
        ...

    def close(self) -> None:
        """Release every lease of this service (at shutdown)."""
        ...


class LeaseBase:
    """What every lease does the same way: the context manager and `release` once."""

    name: str
    _released: bool = False

    def __enter__(self) -> "LeaseBase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._release()

    def _release(self) -> None:  # pragma: no cover - each set's own
        raise NotImplementedError
