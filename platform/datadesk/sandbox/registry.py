"""The kernel registry: one warm kernel per (workspace, user, thread), a small pool,
caps per user and in total, shared by every app worker of the host. The session
and execution records are in sessions.py. Two collaborators hold the registry and
work through it: `KernelReaper` (reaper.py: culling by idle and lifetime limits,
orphans) and `KernelRecovery` (recovery.py: one execution and what follows a
timeout, a death or a cancel).

Culling lives at this level, not in the backends. After a reclaim or a crash the
next execution starts a fresh kernel and says so, so the model never assumes old
variables still exist.

Several workers (processes, `datadesk serve --workers N`) share the on-disk
kernel table (kerneltable.py):

- A kernel belongs to the worker that started it (`owner` in its record, the
  owner label on its container). An execution holds the thread's lock file for
  its whole length, so one thread's kernel runs one execution at a time across
  workers, and "the lock is free" means "the kernel is idle".
- A worker that needs a thread's kernel and finds a live one of another worker
  attaches to it (`SandboxBackend.attach`: a second client on the kernel's
  ipc sockets), uses it and updates `last_used`. The record is checked on every
  execution, so a connection to a kernel that was since reclaimed or replaced
  is let go, never used.
- A kernel whose owner is gone (heartbeat stale, or its pid dead on this host:
  ownership.owner_alive) is an orphan: it is ended, and the next execution
  starts a fresh kernel with the notice. A kernel any host reaches (gateway)
  is adopted instead: its variables outlive the app host (attach.py).
  A docker or local kernel of another host cannot be reached: the thread gets
  a fresh one with the notice.
- Per-user and global caps count the records of every worker, under the
  table's create lock; the least recently used idle kernel of any worker is
  reclaimed to make room.
- Every worker runs the reaper loop for its own pool and connections; the
  host-wide part (idle and lifetime limits by the records' timestamps,
  orphans, the backend's orphan sweep, dead heartbeats) runs in one worker per
  round: the one that takes `sandbox/reaper.lock` with timeout 0.

The table and the heartbeats are `state.kernels` protocols: by default the
files of this data directory; with the cluster set (cluster/kernels.py) rows
shared by every host, so the caps and the orphan rule hold across hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import AsyncIterator, Callable

import msgspec

from datadesk.sandbox.attach import reach_kernel
from datadesk.sandbox.base import (
    Kernel, KernelLimitReached, KernelPlacement, OnOutput, OnStatus, SandboxBackend, SandboxError, SandboxUnavailable,
)
from datadesk.sandbox.execution import INTERRUPT_GRACE_S
from datadesk.sandbox.kerneltable import KernelRecord, KernelTable, SessionKey
from datadesk.sandbox.ownership import Heartbeat, acquire_async, this_worker, try_lock
from datadesk.sandbox.reaper import KernelReaper
from datadesk.sandbox.recovery import KernelRecovery
from datadesk.sandbox.sessions import (
    ORPHAN_NOTICE, SEEN_FILE, ExecutionReport, KernelSession, SeenOutputs, fresh_kernel_notice,
)
from datadesk.settings import SandboxSettings
from datadesk.store.interfaces.kernels import KernelCapReached, KernelCaps, WorkerRegistry
from datadesk.store.interfaces.kernels import KernelTable as KernelTableProtocol
from datadesk.store.interfaces.kernelfiles import KernelFiles, LocalKernelFiles

log = logging.getLogger(__name__)


class KernelRegistry:
    """The kernels this worker started or reaches, over the host's kernel table; `backend`
    makes, reaches and cleans up the kernels themselves."""

    def __init__(self, settings: SandboxSettings, home: Path, backend: SandboxBackend,
                 table: KernelTableProtocol | None = None, workers: WorkerRegistry | None = None) -> None:
        self.settings = settings
        self.home = Path(home)
        self.backend = backend
        self.table: KernelTableProtocol = table if table is not None else KernelTable(self.home)
        self.worker = workers.worker if workers is not None else this_worker()
        self.workers: WorkerRegistry = workers if workers is not None else \
            Heartbeat(self.home, settings.heartbeat_s, self.worker)
        self.sessions: dict[SessionKey, KernelSession] = {}  # kernels this worker talks to
        self.pool: list[KernelSession] = []  # this worker's pre-started kernels
        self._key_locks: dict[SessionKey, asyncio.Lock] = {}
        self._starting = 0
        # told "ok" or "failed" after each kernel start (the composition root counts it)
        self.on_start: Callable[[str], None] = lambda outcome: None
        self._tasks: list[asyncio.Task[None]] = []
        self._health: tuple[bool, str] = (True, "")
        self.slots_root = self.home / "sandbox" / "slots"
        self.run_root = self._run_root()
        self.reaper = KernelReaper(self)
        self.recovery = KernelRecovery(self)

    def _run_root(self) -> Path:
        """A directory whose socket paths stay under the unix-socket limit (~107 bytes)."""
        import hashlib

        root = Path(self.settings.run_dir) if self.settings.run_dir else self.home / "run"
        if len(str(root.resolve())) + len("/k0123456789/k-5") > 100:
            if self.settings.shared_dir:  # /tmp is not seen by the engine: never fall back there
                raise ValueError(f"the kernel socket dir {root} is too long for unix sockets (limit ~100 "
                                 "characters with the kernel's file names): set sandbox.run_dir to a short "
                                 "directory inside sandbox.shared_dir")
            digest = hashlib.sha256(str(self.home.resolve()).encode()).hexdigest()[:10]
            root = Path("/tmp") / f"dd-{digest}"
            log.info("kernel socket dir %s (the data dir path is too long for unix sockets)", root)
        return root

    @property
    def caps(self) -> KernelCaps:
        return KernelCaps(per_user=self.settings.max_kernels_per_user, total=self.settings.max_kernels)

    @property
    def _busy_wait_s(self) -> float:
        """How long an execution waits for the thread's kernel to be free."""
        return self.settings.exec_timeout_s + self.settings.start_timeout_s + 30

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        self.workers.start()  # before any container carries this worker's id
        await self.reaper.reap_host(time.time())  # orphans of an earlier run (or a crashed worker) go now
        await asyncio.to_thread(self.refresh_health)
        self._tasks.append(asyncio.create_task(self.reaper.run(), name="kernel-reaper"))
        self._fill_pool()

    async def stop(self) -> None:
        """End this worker's kernels (their records say so) and let go of attached ones. Kernels
        that outlive their worker (gateway kernels of a cluster) are only let go: a rollout or a
        scale-down does not cost an analyst's variables, another host adopts the kernel."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for key, session in list(self.sessions.items()):
            if session.kernel.attached or self.backend.kernels_outlive_workers:
                await self._detach(session)
                continue
            rec = self.table.load(key)
            await self.dispose(session)
            if self.same_kernel(rec, session):
                self._save_gone(rec, ORPHAN_NOTICE)
        for session in self.pool:
            await self.dispose(session)
            self.table.remove_pool(session.placement.kernel_id)
        self.sessions.clear()
        self.pool.clear()
        await self.workers.stop()

    async def reap_once(self, now: float | None = None) -> list[tuple[SessionKey, str]]:
        """One reaper round (reaper.py), then the pool refilled; the (thread, reason) of each
        kernel reclaimed."""
        reclaimed = await self.reaper.reap_once(time.time() if now is None else now)
        self._fill_pool()
        return reclaimed

    def refresh_health(self) -> tuple[bool, str]:
        """Ask the backend now (engine, image, gateway); kept for `health` until the next round."""
        try:
            self._health = self.backend.health()
        except Exception as exc:  # a health probe must never raise into a turn
            self._health = (False, str(exc))
        return self._health

    def health(self) -> tuple[bool, str]:
        """Whether kernels can be started, and if not why (as of the last check)."""
        return self._health

    # -- records -------------------------------------------------------------------
    def _record(self, key: SessionKey, placement: KernelPlacement, kernel: Kernel | None,
                started_at: float, last_used: float) -> KernelRecord:
        return KernelRecord(
            workspace=key[0], user=key[1], thread=key[2], kernel_id=placement.kernel_id,
            backend=self.backend.name, owner=self.worker.id, host=self.worker.host,
            data_dir=str(placement.data_dir), outputs_dir=str(placement.outputs_dir), run_dir=str(placement.run_dir),
            started_at=started_at, last_used=last_used, had_kernel=True, **_located(kernel))

    def _pool_record(self, placement: KernelPlacement, kernel: Kernel | None = None) -> KernelRecord:
        now = time.time()
        return KernelRecord(
            kernel_id=placement.kernel_id, backend=self.backend.name, owner=self.worker.id, host=self.worker.host,
            data_dir=str(placement.data_dir), outputs_dir=str(placement.outputs_dir), run_dir=str(placement.run_dir),
            started_at=now, last_used=now, **_located(kernel))

    def _save_gone(self, rec: KernelRecord | None, reason: str, key: SessionKey | None = None) -> None:
        """The thread has no kernel now; the next one is started with `reason` in its notice."""
        key = key or (rec.key if rec is not None else None)
        if key is None:
            return
        self.table.save(KernelRecord(workspace=key[0], user=key[1], thread=key[2], backend=self.backend.name,
                                     notice=reason, had_kernel=True))

    def same_kernel(self, rec: KernelRecord | None, session: KernelSession) -> bool:
        """Whether the record still names this session's kernel (same id, same process/container:
        a kernel another worker restarted keeps its id but not its pid or container)."""
        if rec is None or rec.kernel_id != session.placement.kernel_id:
            return False
        found = session.kernel.locator()
        return ((found.pid is None or rec.pid == found.pid)
                and (found.container is None or rec.container == found.container)
                and (found.remote is None or rec.remote == found.remote))

    def _touch(self, key: SessionKey, session: KernelSession) -> None:
        rec = self.table.load(key)
        if rec is None or rec.kernel_id != session.placement.kernel_id:
            return
        changes: dict[str, object] = {"last_used": session.last_used}
        if not session.kernel.attached:  # ours (or restarted by us after a hung interrupt)
            changes.update(owner=self.worker.id, host=self.worker.host, **_located(session.kernel))
        self.table.save(msgspec.structs.replace(rec, **changes))

    def has_kernel(self, key: SessionKey) -> bool:
        """Whether the thread has a kernel now (in any worker)."""
        rec = self.table.load(key)
        return rec is not None and bool(rec.kernel_id)

    # -- locks -----------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _hold(self, key: SessionKey, wait_s: float) -> AsyncIterator[None]:
        """The thread's kernel, exclusively: an in-process lock, then the key's lock file."""
        local = self._key_locks.setdefault(key, asyncio.Lock())
        try:
            await asyncio.wait_for(local.acquire(), wait_s)
        except asyncio.TimeoutError:
            raise SandboxError("the Python kernel of this thread is busy with another request; try again") from None
        try:
            flock = self.table.key_lock(key)
            if not await acquire_async(flock, wait_s):
                raise SandboxError("the Python kernel of this thread is busy in another server worker; try again")
            try:
                yield
            finally:
                flock.release()
        finally:
            local.release()

    def forget_idle_locks(self) -> None:
        """Drop the in-process locks of threads that have no session here and no waiter."""
        for key in [k for k, lk in self._key_locks.items() if not lk.locked() and k not in self.sessions]:
            del self._key_locks[key]

    # -- kernels -------------------------------------------------------------------
    def _placement(self) -> KernelPlacement:
        kid = "k" + os.urandom(5).hex()
        slot = self.slots_root / kid
        return KernelPlacement(kernel_id=kid, data_dir=slot / "data", outputs_dir=slot / "outputs",
                               run_dir=self.run_root / kid)

    async def _launch(self, placement: KernelPlacement | None = None) -> KernelSession:
        placement = placement or self._placement()
        for d in (placement.data_dir, placement.outputs_dir, placement.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        kernel = self.backend.kernel(placement)
        try:
            await kernel.start()
        except BaseException:
            self.on_start("failed")
            await self._dispose_kernel(kernel)
            raise
        self.on_start("ok")
        now = time.time()
        kernel.started_at = now
        return KernelSession(kernel=kernel, started_at=now, last_used=now)

    def _fill_pool(self) -> None:
        want = self.settings.pool_size - len(self.pool) - self._starting
        if want <= 0 or not self._health[0]:
            return
        for _ in range(want):
            self._starting += 1
            self._tasks.append(asyncio.create_task(self._pool_one(), name="kernel-pool-fill"))
        self._tasks = [t for t in self._tasks if not t.done()]

    async def _pool_one(self) -> None:
        session = None
        placement = None
        try:
            lock = self.table.create_lock()
            if not await acquire_async(lock, self.settings.start_timeout_s):
                return
            try:
                placement = self._placement()
                self.table.reserve(self._pool_record(placement), self.caps)  # counted from now on
            except KernelCapReached:
                return  # the server is at its cap: no spare kernel
            finally:
                lock.release()
            session = await self._launch(placement)
            # the first cell of a fresh interpreter is slow: run it now, not on the user's time
            await session.kernel.execute("None", self.settings.start_timeout_s)
            self.table.save_pool(self._pool_record(placement, session.kernel))
            self.pool.append(session)
        except BaseException as exc:
            if session is not None and session not in self.pool:
                await self.dispose(session)  # cancelled mid warm-up (shutdown): never leak it
            if placement is not None and (session is None or session not in self.pool):
                self.table.remove_pool(placement.kernel_id)
            if not isinstance(exc, Exception):
                raise
            log.warning("could not pre-start a pool kernel: %s", exc)
        finally:
            self._starting -= 1

    async def _take(self, key: SessionKey) -> KernelSession:
        """A kernel for `key` (whose lock the caller holds): from the pool when one is ready, else
        a new one. Room is made and the record reserved under the table's create lock. The
        backend's hand-out rules are asked first (the local backend's single-coder rule): when
        they refuse, the pool's kernels, started while they allowed it, are ended too."""
        problem = await asyncio.to_thread(self.backend.handout_problem)  # reads users.json
        if problem:
            await self._drop_pool()
            raise SandboxUnavailable(problem)
        previous = self.table.load(key)
        lock = self.table.create_lock()
        if not await acquire_async(lock, self.settings.start_timeout_s):
            raise SandboxError("timed out waiting for other kernels to start; try again")
        session: KernelSession | None = None
        placement: KernelPlacement | None = None
        try:
            await self._make_room(key)
            while self.pool and session is None:
                candidate = self.pool.pop(0)
                self.table.remove_pool(candidate.placement.kernel_id)
                if await candidate.kernel.is_alive():
                    session = candidate
                else:
                    await self.dispose(candidate)
            now = time.time()
            if session is not None:
                self._reserve(self._record(key, session.placement, session.kernel, session.started_at, now), session)
            else:
                placement = self._placement()
                self._reserve(self._record(key, placement, None, now, now))  # reserved
        finally:
            lock.release()
        if session is None:
            assert placement is not None
            try:
                session = await self._launch(placement)
            except BaseException:
                if previous is not None:
                    self.table.save(previous)  # its notice is still to be given
                else:
                    self.table.remove(key)
                raise
        session.key = key
        session.last_used = time.time()
        slot = session.placement.data_dir.parent
        # who this slot serves, on disk: a user deletion from the CLI can find and purge it
        (slot / "owner.json").write_text(json.dumps({"workspace": key[0], "user": key[1], "thread": key[2]}))
        session.seen_outputs = SeenOutputs(slot / SEEN_FILE)
        self.sessions[key] = session
        self.table.save(self._record(key, session.placement, session.kernel, session.started_at, session.last_used))
        self._fill_pool()  # a used kernel never returns to the pool; start a replacement
        return session

    def _reserve(self, rec: KernelRecord, pooled: KernelSession | None = None) -> None:
        """Save the record of a kernel being handed out, if the caps still allow it (another host
        may have made room for itself at the same time): else the pool kernel goes back."""
        try:
            self.table.reserve(rec, self.caps)
        except KernelCapReached as exc:
            if pooled is not None:
                self.pool.insert(0, pooled)
                self.table.save_pool(self._pool_record(pooled.placement, pooled.kernel))
            mine = f"you already have {exc.count} Python kernels busy" if exc.scope == "user" else \
                f"the server runs {exc.count} Python kernels"
            raise KernelLimitReached(f"{mine} (limit {exc.limit}); wait for one to finish") from None

    async def _drop_pool(self) -> None:
        """End this worker's pre-started kernels (none of them may be handed out any more)."""
        while self.pool:
            session = self.pool.pop()
            self.table.remove_pool(session.placement.kernel_id)
            await self.dispose(session)

    async def _make_room(self, key: SessionKey) -> None:
        """Under the create lock: reclaim what the per-user and global caps need (every worker's
        kernels count), or raise KernelLimitReached when nothing is idle."""
        s = self.settings
        records = self.table.kernels()
        mine = [r for r in records if r.key is not None and r.user == key[1]]
        if len(mine) >= s.max_kernels_per_user:
            if not await self._reclaim_lru(mine, "your kernel limit was reached and it was the least recently used"):
                raise KernelLimitReached(
                    f"you already have {len(mine)} Python kernels busy (limit "
                    f"{s.max_kernels_per_user}); wait for one to finish")
            records = self.table.kernels()
        if len(records) < s.max_kernels:
            return
        if self.pool:
            victim = self.pool.pop()
            self.table.remove_pool(victim.placement.kernel_id)
            await self.dispose(victim)
            return
        for rec in (r for r in records if r.key is None):  # another worker's spare kernel
            self.table.remove_pool(rec.kernel_id or "")
            await self.end_record(rec)
            return
        if not await self._reclaim_lru([r for r in records if r.key is not None],
                                       "the server's kernel limit was reached"):
            raise KernelLimitReached(
                f"the server runs its maximum of {s.max_kernels} Python kernels and all are "
                "busy; try again in a moment")

    async def _reclaim_lru(self, candidates: list[KernelRecord], reason: str) -> bool:
        """Reclaim the first idle one: orphans first, then the least recently used."""
        stale = self.settings.owner_stale_s
        order = sorted(candidates, key=lambda r: (self.workers.owner_alive(r.owner, stale), r.last_used))
        for rec in order:
            if rec.key is not None and await self.reclaim_if_idle(rec.key, f"the previous one was reclaimed: {reason}"):
                return True
        return False

    async def reclaim_if_idle(self, key: SessionKey, notice: str, kernel_id: str | None = None) -> bool:
        """End the thread's kernel unless an execution holds it (its lock, timeout 0). True when
        it is gone (also when it was already)."""
        local = self._key_locks.get(key)
        if local is not None and local.locked():
            return False
        with try_lock(self.table.key_lock(key)) as got:
            if not got:
                return False
            rec = self.table.load(key)
            if rec is None or not rec.kernel_id or (kernel_id is not None and rec.kernel_id != kernel_id):
                return True
            log.info("reclaiming kernel %s of %s: %s", rec.kernel_id, key, notice)
            await self._end_kernel(key, rec)
            self._save_gone(rec, notice)
            return True

    async def shutdown_thread(self, key: SessionKey) -> None:
        """The thread was cleared or deleted: stop its kernel (whichever worker runs it), forget
        its notices."""
        async with self._hold(key, self._busy_wait_s):
            await self._end_kernel(key, self.table.load(key))
            self.table.remove(key)

    async def _end_kernel(self, key: SessionKey, rec: KernelRecord | None) -> None:
        """End the thread's kernel (caller holds its key lock): through this worker's session when
        the record names it, else through the record (after letting a stale session go)."""
        session = self.sessions.pop(key, None)
        if session is not None and self.same_kernel(rec, session):
            await self.dispose(session)
            return
        if session is not None:
            await self.let_go(session)
        if rec is not None and rec.kernel_id:
            await self.end_record(rec)

    async def end_record(self, rec: KernelRecord) -> None:
        """Stop a kernel known only by its record (another worker's, or an orphan)."""
        try:
            kernel = await self.backend.attach(rec.placement, rec.locator, connect=False)
            await kernel.shutdown()
        except Exception as exc:
            log.warning("could not stop kernel %s: %s", rec.kernel_id, exc)
        # its slot and socket dir, only where this data directory keeps them
        for d in (Path(rec.data_dir).parent if rec.data_dir else None, Path(rec.run_dir) if rec.run_dir else None):
            if d is not None and (d.is_relative_to(self.slots_root) or d.is_relative_to(self.run_root)):
                shutil.rmtree(d, ignore_errors=True)

    async def let_go(self, session: KernelSession) -> None:
        """Drop a connection the table no longer backs: close it; end the kernel only when it is
        ours and still runs (nobody else did)."""
        kernel = session.kernel
        if not kernel.attached and await kernel.is_alive():
            await self.dispose(session)
            return
        await self._detach(session)

    async def _detach(self, session: KernelSession) -> None:
        try:
            await session.kernel.detach()
        except Exception as exc:
            log.debug("closing a connection to kernel %s: %s", session.placement.kernel_id, exc)

    async def forget(self, key: SessionKey, session: KernelSession, notice: str) -> None:
        """The session's kernel died or was restarted away: end it and note why."""
        if self.sessions.get(key) is session:
            del self.sessions[key]
        rec = self.table.load(key)
        if rec is not None and rec.kernel_id and not self.same_kernel(rec, session):
            await self.let_go(session)  # the table already names another kernel
            return
        await self.dispose(session)
        self._save_gone(rec, notice, key)

    async def dispose(self, session: KernelSession) -> None:
        """Shut the session's kernel down and remove its slot and socket directory."""
        await self._dispose_kernel(session.kernel)

    async def _dispose_kernel(self, kernel: Kernel) -> None:
        try:
            await kernel.shutdown()
        except Exception:
            log.exception("kernel %s did not shut down cleanly", kernel.placement.kernel_id)
        slot = kernel.placement.data_dir.parent
        shutil.rmtree(slot, ignore_errors=True)
        shutil.rmtree(kernel.placement.run_dir, ignore_errors=True)

    # -- execution -----------------------------------------------------------------
    async def _warm_session(self, key: SessionKey) -> tuple[KernelSession, list[str]]:
        """The warm kernel of `key` (whose lock the caller holds), started (or restarted after a
        crash) when needed, and the notices of a fresh one."""
        ok, why = self._health
        if not ok:
            raise SandboxUnavailable(f"the Python sandbox is unavailable: {why}")
        rec = self.table.load(key)
        session = self.sessions.get(key)
        if session is not None and not self.same_kernel(rec, session):
            # reclaimed, replaced or cleared meanwhile (maybe by another worker): never use it
            del self.sessions[key]
            await self.let_go(session)
            session = None
        if session is None and rec is not None and rec.kernel_id:
            session = await reach_kernel(self, key, rec)
        if session is not None and not await session.kernel.is_alive():
            reason = await session.kernel.death_reason()
            await self.forget(key, session, f"the previous one stopped: {reason}")
            session = None
        notices: list[str] = []
        if session is None:
            rec = self.table.load(key)
            session = await self._take(key)
            if rec is not None and rec.notice:
                notices.append(fresh_kernel_notice(rec.notice))
            elif rec is not None and rec.had_kernel:
                notices.append(fresh_kernel_notice("the previous one is gone"))
        return session, notices

    async def execute(self, key: SessionKey, code: str, timeout_s: float | None = None, *,
                      artifacts_dir: Path | None = None, files: KernelFiles | None = None,
                      on_output: OnOutput | None = None, on_status: OnStatus | None = None) -> ExecutionReport:
        """Run `code` in the thread's warm kernel (one execution per thread at a time, across
        workers). `files`: the thread's files, handed to the kernel's /data first and the way
        /outputs come back (`Kernel.receive_files`); else `artifacts_dir`, the thread's artifacts
        folder linked into /data (None: /data is left as it is). `timeout_s` is the execution's one deadline (recovery.py): there,
        or when this call is cancelled, the code is interrupted and the kernel restarted if need
        be. `on_output(stream, text)` gets the output as printed, `on_status(message)` what the
        sandbox does about it. The new files under /outputs are read before the kernel is let go."""
        timeout = self.settings.exec_timeout_s if timeout_s is None else timeout_s
        async with self._hold(key, self._busy_wait_s):
            session, notices = await self._warm_session(key)
            async with session.lock:
                if files is None and artifacts_dir is not None:
                    files = LocalKernelFiles(artifacts_dir)
                if files is not None:
                    notices += await session.kernel.receive_files(files)
                result = await self.recovery.run(key, session, code, timeout, on_output, on_status)
                report = ExecutionReport(result=result, notices=notices)
                if self.sessions.get(key) is session:
                    await self._read_outputs(session, report, files)
                    self._touch(key, session)
        return report

    @property
    def call_limit_s(self) -> float:
        """The longest one `execute` takes after the kernel is free: a kernel start, the deadline,
        the interrupt grace and a restart (what a caller's own time limit must leave room for)."""
        return self.settings.exec_timeout_s + 2 * self.settings.start_timeout_s + INTERRUPT_GRACE_S + 15

    async def _read_outputs(self, session: KernelSession, report: ExecutionReport,
                            files: KernelFiles | None = None) -> None:
        """The new or changed files under the kernel's /outputs, into `report` (within the quota)."""
        got = await session.kernel.read_outputs(session.seen_outputs, self.settings.outputs_mb << 20, files)
        if got is None:
            report.output_problems.append("(files under /outputs cannot be collected from this sandbox)")
            return
        report.outputs, report.output_problems = got


def _located(kernel: Kernel | None) -> dict[str, object]:
    """The record fields that let another worker find `kernel` (none before it exists)."""
    if kernel is None:
        return {}
    found = kernel.locator()
    return {"pid": found.pid, "pid_start": found.pid_start, "container": found.container, "remote": found.remote}
