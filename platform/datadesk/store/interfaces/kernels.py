"""The kernel table and the worker registry: what the kernel registry (sandbox/registry.py) and
its reaper (sandbox/reaper.py) use to agree, across workers and hosts, on which kernel serves
which thread, who owns it and whether that owner still runs (issue 28).

- `KernelTable`: session records (one per (workspace, user, thread): its kernel, or why it has
  none now), pool records (pre-started kernels), listing, three locks (`key_lock`: held for a
  whole execution on the thread's kernel; `create_lock`: held while making room under the
  caps; `reaper_lock`: one reaper round over the records at a time) and `reserve`, which saves
  a record that stands for a new kernel only when the caps allow it, atomically.
- `WorkerRegistry`: this worker's heartbeat (`beat`, `start`, `stop`) and the liveness of any
  other (`owner_alive`, `remove_dead`).

Two implementations each. Embedded (the default): `sandbox/kerneltable.py KernelTable` (a JSON
file per record, `filelock` files) and `sandbox/ownership.py Heartbeat` (heartbeat files, pid
checks). Cluster: `cluster/kernels.py PgKernelTable` (rows; session advisory locks; caps counted
in SQL under a transaction-level advisory lock) and `PgWorkers` (a `workers` row per worker,
liveness by the age of its `last_seen` on the database's clock; pid checks only for this host's
own processes).

Locks here are not reentrant: a second `try_acquire` on a held lock gets False, in the process
that holds it too (as two `flock`s on one file do), and a lock goes with its holder (process or
database connection).

Exceptions: `KernelCapReached` (`reserve` refused: which cap, how many, the limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal, Protocol, runtime_checkable

# a kernel's record (sandbox/kerneltable.py `KernelRecord`) and a worker's identity
# (sandbox/ownership.py `Worker`): named here only, as this package depends on nothing above it
KernelRecord = Any
Worker = Any

SessionKey = tuple[str, str, str]  # (workspace, user, thread)


@dataclass(frozen=True)
class KernelCaps:
    """How many kernels may stand in the table: per user (sessions with a kernel) and in total
    (sessions with a kernel plus pool kernels)."""

    per_user: int
    total: int


class KernelCapReached(Exception):
    """`reserve` refused a record: `scope` ("user" or "total") already has `count` kernels of
    `limit`."""

    def __init__(self, scope: Literal["user", "total"], count: int, limit: int) -> None:
        self.scope, self.count, self.limit = scope, count, limit
        whose = "the user" if scope == "user" else "the server"
        super().__init__(f"{whose} already has {count} kernels (limit {limit})")


@runtime_checkable
class KernelLock(Protocol):
    """A lock taken without waiting (callers poll: `ownership.acquire_async`), held until
    `release()` or until its holder dies."""

    def try_acquire(self) -> bool:
        """Take the lock if nobody (this process included) holds it; whether we got it."""
        ...

    def release(self) -> None:
        """Let go of a held lock (nothing when not held)."""
        ...


@runtime_checkable
class KernelTable(Protocol):
    """The records of every kernel of the deployment (see the module doc)."""

    def load(self, key: SessionKey) -> KernelRecord | None:
        """The session record of `key`, or None."""
        ...

    def save(self, rec: KernelRecord) -> None:
        """Replace the session record of `rec.key` (ValueError without a key). Caps are not
        checked: use `reserve` for a record that stands for a new kernel."""
        ...

    def remove(self, key: SessionKey) -> None:
        ...

    def save_pool(self, rec: KernelRecord) -> None:
        """Replace the pool record of `rec.kernel_id`."""
        ...

    def remove_pool(self, kernel_id: str) -> None:
        ...

    def reserve(self, rec: KernelRecord, caps: KernelCaps) -> None:
        """Save `rec` (a session record with a kernel, or a pool record) only if, counting every
        other record, the caps leave room for it; atomic against other `reserve` calls of any
        worker or host. Raises KernelCapReached otherwise (nothing saved)."""
        ...

    def sessions(self) -> Iterable[KernelRecord]:
        """Every session record (with a kernel or not)."""
        ...

    def pooled(self) -> Iterable[KernelRecord]:
        """Every pool record."""
        ...

    def kernels(self) -> list[KernelRecord]:
        """Every record that stands for a kernel: sessions with one, and pool kernels."""
        ...

    def key_lock(self, key: SessionKey) -> KernelLock:
        """The lock held for a whole execution on the thread's kernel: free means idle."""
        ...

    def create_lock(self) -> KernelLock:
        """The lock held while counting kernels against the caps and making room."""
        ...

    def reaper_lock(self) -> KernelLock:
        """The lock of one reaper round over the records (one reaper at a time per table)."""
        ...


@runtime_checkable
class WorkerRegistry(Protocol):
    """This worker's heartbeat, and whether other workers still run."""

    worker: Worker

    def beat(self) -> None:
        """Say now that this worker runs."""
        ...

    def start(self) -> None:
        """Beat now, then every interval in a task of the running event loop."""
        ...

    async def stop(self) -> None:
        """Stop beating and remove this worker's heartbeat."""
        ...

    def owner_alive(self, owner: str | None, stale_s: float) -> bool:
        """Whether worker `owner` still runs: its heartbeat is younger than `stale_s` and, when it
        runs on this host, its pid still names the same live process. Unknown or malformed ids
        count as gone; this worker is always alive."""
        ...

    def remove_dead(self, stale_s: float) -> list[str]:
        """Forget the heartbeats of workers that are gone; their ids."""
        ...
