"""The on-disk kernel table: which kernel serves which thread, owned by which worker.

One small JSON file per (workspace, user, thread) session and one per pooled
kernel, under `<home>/sandbox/kernels/`, each replaced atomically (temp file +
rename) and changed only under its own lock file:

- `s-<hash>.json` / `s-<hash>.lock`: the session of a key. `kernel_id` is None
  when the thread has no kernel now; `notice` then says why the previous one
  went (shown to the model with the next fresh kernel) and `had_kernel` that
  there was one. The key's lock is held for the whole of an execution, so
  "can I take the lock with timeout 0" means "the kernel is idle".
- `p-<kernel id>.json`: a pre-started pool kernel of one worker.
- `.create.lock`: held while counting kernels against the caps and making room
  for a new one, so two workers never both pass a cap; `.reserve.lock`: held for
  the count and the write of one `reserve` (store/interfaces/kernels.py).
- `.reaper.lock`: one reaper round over the records at a time.

Every worker reads the same table, so per-user and global caps, the reaper and
the orphan sweep see all kernels of the host, not one worker's. This is the
embedded `store.interfaces.kernels.KernelTable`; cluster/kernels.py keeps the same records
in PostgreSQL for several hosts.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from pathlib import Path
from typing import Iterator

import msgspec
from filelock import Timeout

from datadesk.sandbox.base import KernelLocator, KernelPlacement
from datadesk.sandbox.ownership import file_lock
from datadesk.store.interfaces.kernels import KernelCapReached, KernelCaps, SessionKey
from datadesk.store.files import write_atomic

log = logging.getLogger(__name__)

__all__ = ["FileKernelLock", "KernelRecord", "KernelTable", "SessionKey", "key_hash"]

RESERVE_WAIT_S = 30.0  # a reserve holds its lock for a count and one write: a long wait means a hung worker


class KernelRecord(msgspec.Struct, omit_defaults=True):
    """One row of the kernel table (see the module docstring)."""

    workspace: str | None = None
    user: str | None = None
    thread: str | None = None
    kernel_id: str | None = None
    backend: str = ""
    owner: str = ""  # worker id (ownership.Worker.id)
    host: str = ""
    data_dir: str = ""
    outputs_dir: str = ""
    run_dir: str = ""
    container: str | None = None  # docker: the container id
    remote: str | None = None  # gateway: the gateway's kernel id (reached from any host)
    pid: int | None = None  # local: the kernel's pid (= its process group)
    pid_start: int | None = None  # local: the pid's start time, so a reused pid is not taken for it
    started_at: float = 0.0
    last_used: float = 0.0
    notice: str | None = None
    had_kernel: bool = False

    @property
    def key(self) -> SessionKey | None:
        if self.workspace and self.user and self.thread:
            return (self.workspace, self.user, self.thread)
        return None

    @property
    def placement(self) -> KernelPlacement:
        return KernelPlacement(kernel_id=self.kernel_id or "", data_dir=Path(self.data_dir),
                               outputs_dir=Path(self.outputs_dir), run_dir=Path(self.run_dir))

    @property
    def locator(self) -> KernelLocator:
        return KernelLocator(pid=self.pid, pid_start=self.pid_start, container=self.container, remote=self.remote)


_decoder = msgspec.json.Decoder(KernelRecord)
_encoder = msgspec.json.Encoder()


def key_hash(key: SessionKey) -> str:
    return hashlib.sha256("\0".join(key).encode()).hexdigest()[:32]


class FileKernelLock:
    """A `store.interfaces.kernels.KernelLock` on a lock file: never waits, not reentrant."""

    def __init__(self, path: Path) -> None:
        self.lock = file_lock(path)
        self.path = Path(path)

    def try_acquire(self) -> bool:
        if self.lock.is_locked:
            return False
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            return False
        return True

    def release(self) -> None:
        if self.lock.is_locked:
            self.lock.release()


class KernelTable:
    """Reads and writes the records of one data directory (the embedded `store.interfaces.kernels.KernelTable`)."""

    def __init__(self, home: Path) -> None:
        self.dir = Path(home) / "sandbox" / "kernels"

    # -- paths and locks -------------------------------------------------------
    def session_path(self, key: SessionKey) -> Path:
        return self.dir / f"s-{key_hash(key)}.json"

    def pool_path(self, kernel_id: str) -> Path:
        return self.dir / f"p-{kernel_id}.json"

    def key_lock(self, key: SessionKey) -> FileKernelLock:
        return FileKernelLock(self.dir / f"s-{key_hash(key)}.lock")

    def create_lock(self) -> FileKernelLock:
        return FileKernelLock(self.dir / ".create.lock")

    def reaper_lock(self) -> FileKernelLock:
        return FileKernelLock(self.dir / ".reaper.lock")

    # -- records ----------------------------------------------------------------
    def _read(self, path: Path) -> KernelRecord | None:
        try:
            return _decoder.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring an unreadable kernel record %s: %s", path.name, exc)
            return None

    def _write(self, path: Path, rec: KernelRecord) -> None:
        write_atomic(path, _encoder.encode(rec), sync=False)

    def load(self, key: SessionKey) -> KernelRecord | None:
        rec = self._read(self.session_path(key))
        return rec if rec is not None and rec.key == key else None

    def save(self, rec: KernelRecord) -> None:
        key = rec.key
        if key is None:
            raise ValueError("a session record needs workspace, user and thread")
        self._write(self.session_path(key), rec)

    def remove(self, key: SessionKey) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.session_path(key).unlink()

    def save_pool(self, rec: KernelRecord) -> None:
        self._write(self.pool_path(rec.kernel_id or ""), rec)

    def remove_pool(self, kernel_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pool_path(kernel_id).unlink()

    def reserve(self, rec: KernelRecord, caps: KernelCaps) -> None:
        """Save `rec` if the caps leave room for it, counting every other record, under
        `.reserve.lock` (KernelCapReached otherwise)."""
        lock = file_lock(self.dir / ".reserve.lock")
        with lock.acquire(timeout=RESERVE_WAIT_S):
            check_caps(rec, self.kernels(), caps)
            if rec.key is None:
                self.save_pool(rec)
            else:
                self.save(rec)

    def sessions(self) -> Iterator[KernelRecord]:
        for path in sorted(self.dir.glob("s-*.json")) if self.dir.is_dir() else ():
            rec = self._read(path)
            if rec is not None and rec.key is not None:
                yield rec

    def pooled(self) -> Iterator[KernelRecord]:
        for path in sorted(self.dir.glob("p-*.json")) if self.dir.is_dir() else ():
            rec = self._read(path)
            if rec is not None and rec.kernel_id:
                yield rec

    def kernels(self) -> list[KernelRecord]:
        """Every record that stands for a kernel (sessions with one, and pool kernels)."""
        return [r for r in self.sessions() if r.kernel_id] + list(self.pooled())


def check_caps(rec: KernelRecord, records: list[KernelRecord], caps: KernelCaps) -> None:
    """KernelCapReached when `rec` (replacing its own record, if any) would pass a cap."""
    if rec.key is not None:
        others = [r for r in records if r.key != rec.key]
        mine = sum(1 for r in others if r.key is not None and r.user == rec.user)
        if rec.kernel_id and mine >= caps.per_user:
            raise KernelCapReached("user", mine, caps.per_user)
    else:
        others = [r for r in records if r.key is not None or r.kernel_id != rec.kernel_id]
    if rec.kernel_id and len(others) >= caps.total:
        raise KernelCapReached("total", len(others), caps.total)
