"""Who owns what when several app workers share one host: worker identity, heartbeats,
liveness of processes, and non-blocking host-wide locks.

- `Worker`: this process as a kernel owner. Its id (`w<pid>-<random>`) goes into the
  on-disk kernel table and into container labels.
- `Heartbeat`: `<home>/sandbox/workers/<id>.json` (host, pid, process start time),
  touched every `heartbeat_s` while the worker runs and removed when it stops.
- `owner_alive`: an owner is alive while its heartbeat is fresh and, on this host,
  its pid still runs the same process (start time compared, so a reused pid does
  not count). The orphan sweep and the kernel table use it: kernels of a live
  owner are never touched; an owner that is gone leaves orphans to be removed.
- `pid_alive`: a process is alive when /proc says so and it is not a zombie; with a
  start time, the pid must still name that very process.
- `try_lock` / `acquire_async`: `filelock` locks (or any `store.interfaces.kernels.KernelLock`)
  taken without blocking the event loop (timeout 0, or polled with a deadline).

`Heartbeat` is the embedded `store.interfaces.kernels.WorkerRegistry`; cluster/kernels.py `PgWorkers`
keeps the same heartbeats as database rows for several hosts (and this file too, for the
backends' orphan sweeps on this host).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

from filelock import FileLock, Timeout

from datadesk.store.interfaces.kernels import KernelLock

from datadesk.store.files import write_json
from datadesk.store.tempnames import pid_alive, proc_start  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

WORKER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


_host_name: str | None = None


def set_host(name: str | None) -> None:
    """Name this machine as its cluster does (`cluster.host_id`); None: the host name."""
    global _host_name, _worker
    _host_name = name or None
    if _worker is not None:  # the same worker id, under the new name
        _worker = Worker(id=_worker.id, pid=_worker.pid, host=hostname(), pid_start=_worker.pid_start)


def hostname() -> str:
    return _host_name or socket.gethostname()


@dataclass(frozen=True)
class Worker:
    """This process as an owner of kernels."""

    id: str
    pid: int
    host: str
    pid_start: int | None


_worker: Worker | None = None


def this_worker() -> Worker:
    """The identity of the current process (made again after a fork)."""
    global _worker
    pid = os.getpid()
    if _worker is None or _worker.pid != pid:
        _worker = Worker(id=f"w{pid}-{os.urandom(3).hex()}", pid=pid, host=hostname(), pid_start=proc_start(pid))
    return _worker


def workers_dir(home: Path) -> Path:
    return Path(home) / "sandbox" / "workers"


class Heartbeat:
    """The heartbeat file of this worker: written at start, touched by a task, removed at stop."""

    def __init__(self, home: Path, interval_s: float, worker: Worker | None = None) -> None:
        self.home = Path(home)
        self.worker = worker or this_worker()
        self.path = workers_dir(home) / f"{self.worker.id}.json"
        self.interval_s = max(0.05, float(interval_s))
        self._task: asyncio.Task[None] | None = None

    def beat(self) -> None:
        if not self.path.exists():
            w = self.worker
            write_json(self.path, {"id": w.id, "pid": w.pid, "host": w.host, "pid_start": w.pid_start,
                                   "started": time.time()}, sync=False)
        else:
            os.utime(self.path)

    def start(self) -> None:
        self.beat()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="worker-heartbeat")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.beat)
            except OSError as exc:  # a full disk must not end the worker; the owner may look stale
                log.warning("heartbeat of worker %s failed: %s", self.worker.id, exc)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def owner_alive(self, owner: str | None, stale_s: float) -> bool:
        return owner == self.worker.id or owner_alive(self.home, owner, stale_s)

    def remove_dead(self, stale_s: float) -> list[str]:
        return remove_dead_heartbeats(self.home, stale_s)


def owner_alive(home: Path, owner: str | None, stale_s: float, now: float | None = None) -> bool:
    """Whether the worker `owner` still runs: its heartbeat is fresh and (on this host) its pid
    is the same live process. Unknown or malformed owners count as gone."""
    if not owner or not WORKER_ID.fullmatch(owner):
        return False
    me = this_worker()
    if owner == me.id:
        return True
    path = workers_dir(home) / f"{owner}.json"
    try:
        mtime = path.stat().st_mtime
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    now = time.time() if now is None else now
    if now - mtime > stale_s:
        return False
    if info.get("host") == me.host:
        return pid_alive(info.get("pid"), info.get("pid_start"))
    return True  # another host: the fresh heartbeat is all we can know


def remove_dead_heartbeats(home: Path, stale_s: float) -> list[str]:
    """Delete heartbeat files of workers that are gone; returns their ids."""
    d = workers_dir(home)
    gone = []
    for p in (d.glob("*.json") if d.is_dir() else ()):
        if not owner_alive(home, p.stem, stale_s):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            gone.append(p.stem)
    return gone


def file_lock(path: Path) -> FileLock:
    """A cross-process lock that any thread of this process may release (asyncio hops threads)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path), thread_local=False)


AnyLock = Union[Path, FileLock, KernelLock]


def _take_now(lock: FileLock | KernelLock) -> bool:
    """Take `lock` if nobody holds it (timeout 0)."""
    if isinstance(lock, FileLock):
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        return True
    return lock.try_acquire()


@contextlib.contextmanager
def try_lock(lock: AnyLock) -> Iterator[bool]:
    """Take `lock` (or the lock file at that path) if nobody holds it (timeout 0); yields
    whether we got it."""
    if isinstance(lock, (str, Path)):
        lock = file_lock(lock)
    if not _take_now(lock):
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


async def acquire_async(lock: FileLock | KernelLock, timeout_s: float, poll_s: float = 0.01) -> bool:
    """Take `lock` without blocking the event loop; False when `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    delay = poll_s / 4
    while True:
        if _take_now(lock):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(poll_s * 5, delay * 2)
