"""Kernel sessions: one warm kernel per (workspace, user, thread), a small pool,
caps per user and in total, and the reaper (idle and lifetime limits).

Culling lives here, not in the backends. A session's kernel runs one
execution at a time (a lock per session). After a reclaim or a crash the next
execution starts a fresh kernel and says so, so the model never assumes old
variables still exist.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from datadesk.sandbox.base import (
    ExecutionResult, KernelBackend, KernelLimitReached, KernelPlacement, SandboxUnavailable,
)
from datadesk.sandbox.files import sync_data_links
from datadesk.settings import SandboxSettings

log = logging.getLogger(__name__)

SessionKey = tuple[str, str, str]  # (workspace, user, thread)
BackendFactory = Callable[[KernelPlacement], KernelBackend]


@dataclass
class KernelSession:
    backend: KernelBackend
    started_at: float
    last_used: float
    key: SessionKey | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    seen_outputs: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def placement(self) -> KernelPlacement:
        return self.backend.placement


@dataclass
class Execution:
    """An execution as the python tool sees it: the result plus what to tell the model."""

    result: ExecutionResult
    session: KernelSession
    notices: list[str]


def fresh_kernel_notice(reason: str) -> str:
    return (f"NOTE: a new Python kernel was started ({reason}). Variables, imports and data loaded "
            "earlier are gone: reload what you need from /data.")


class KernelRegistry:
    """Owns every kernel of this process."""

    def __init__(self, settings: SandboxSettings, home: Path, factory: BackendFactory,
                 artifacts_dir_for: Callable[[SessionKey], Path],
                 health_check: Callable[[], tuple[bool, str]] | None = None,
                 on_start: Callable[[], object] | None = None) -> None:
        self.settings = settings
        self.home = Path(home)
        self.factory = factory
        self.artifacts_dir_for = artifacts_dir_for
        self._health_check = health_check or (lambda: (True, ""))
        self._on_start = on_start  # e.g. remove orphan containers of an earlier run
        self.sessions: dict[SessionKey, KernelSession] = {}
        self.pool: list[KernelSession] = []
        self._notices: dict[SessionKey, str] = {}
        self._had_kernel: set[SessionKey] = set()
        self._starting = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._create_lock = asyncio.Lock()
        self._health: tuple[bool, str] = (True, "")
        self.slots_root = self.home / "sandbox" / "slots"
        self.run_root = self._run_root()

    def _run_root(self) -> Path:
        """A directory whose socket paths stay under the unix-socket limit (~107 bytes)."""
        root = Path(self.settings.run_dir) if self.settings.run_dir else self.home / "run"
        if len(str(root.resolve())) + len("/k0123456789/k-5") > 100:
            digest = hashlib.sha256(str(self.home.resolve()).encode()).hexdigest()[:10]
            root = Path("/tmp") / f"dd-{digest}"
            log.info("kernel socket dir %s (the data dir path is too long for unix sockets)", root)
        return root

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        if self._on_start is not None:
            await asyncio.to_thread(self._on_start)
        await asyncio.to_thread(self.refresh_health)
        self._tasks.append(asyncio.create_task(self._reaper(), name="kernel-reaper"))
        self._fill_pool()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for session in [*self.sessions.values(), *self.pool]:
            await self._dispose(session)
        self.sessions.clear()
        self.pool.clear()

    def refresh_health(self) -> tuple[bool, str]:
        try:
            self._health = self._health_check()
        except Exception as exc:  # a health probe must never raise into a turn
            self._health = (False, str(exc))
        return self._health

    def health(self) -> tuple[bool, str]:
        return self._health

    # -- kernels -------------------------------------------------------------------
    def _placement(self) -> KernelPlacement:
        kid = "k" + os.urandom(5).hex()
        slot = self.slots_root / kid
        return KernelPlacement(kernel_id=kid, data_dir=slot / "data", outputs_dir=slot / "outputs",
                               run_dir=self.run_root / kid)

    async def _launch(self) -> KernelSession:
        placement = self._placement()
        for d in (placement.data_dir, placement.outputs_dir, placement.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        backend = self.factory(placement)
        try:
            await backend.start()
        except BaseException:
            await self._dispose_backend(backend)
            raise
        now = time.time()
        backend.started_at = now
        return KernelSession(backend=backend, started_at=now, last_used=now)

    def _fill_pool(self) -> None:
        want = self.settings.pool_size - len(self.pool) - self._starting
        total = len(self.sessions) + len(self.pool) + self._starting
        want = min(want, self.settings.max_kernels - total)
        if want <= 0 or not self._health[0]:
            return
        for _ in range(want):
            self._starting += 1
            self._tasks.append(asyncio.create_task(self._pool_one(), name="kernel-pool-fill"))
        self._tasks = [t for t in self._tasks if not t.done()]

    async def _pool_one(self) -> None:
        session = None
        try:
            session = await self._launch()
            # the first cell of a fresh interpreter is slow: run it now, not on the user's time
            await session.backend.execute("None", self.settings.start_timeout_s)
            self.pool.append(session)
        except BaseException as exc:
            if session is not None and session not in self.pool:
                await self._dispose(session)  # cancelled mid warm-up (shutdown): never leak it
            if not isinstance(exc, Exception):
                raise
            log.warning("could not pre-start a pool kernel: %s", exc)
        finally:
            self._starting -= 1

    async def _take(self, key: SessionKey) -> KernelSession:
        """A kernel for `key`: from the pool when one is ready, else a new one."""
        await self._make_room(key)
        session = self.pool.pop(0) if self.pool else None
        if session is None or not await session.backend.is_alive():
            if session is not None:
                await self._dispose(session)
            session = await self._launch()
        session.key = key
        session.last_used = time.time()
        # who this slot serves, on disk: a user deletion from the CLI can find and purge it
        owner = session.placement.data_dir.parent / "owner.json"
        owner.write_text(json.dumps({"workspace": key[0], "user": key[1], "thread": key[2]}))
        self.sessions[key] = session
        self._fill_pool()  # a used kernel never returns to the pool; start a replacement
        return session

    async def _make_room(self, key: SessionKey) -> None:
        user = key[1]
        mine = [s for k, s in self.sessions.items() if k[1] == user]
        if len(mine) >= self.settings.max_kernels_per_user:
            idle = sorted((s for s in mine if not s.lock.locked()), key=lambda s: s.last_used)
            if not idle:
                raise KernelLimitReached(
                    f"you already have {len(mine)} Python kernels busy (limit "
                    f"{self.settings.max_kernels_per_user}); wait for one to finish")
            await self.reclaim(idle[0].key, "your kernel limit was reached and it was the least recently used")
        total = len(self.sessions) + len(self.pool)
        if total >= self.settings.max_kernels:
            if self.pool:
                await self._dispose(self.pool.pop())
                return
            idle = sorted((s for s in self.sessions.values() if not s.lock.locked()), key=lambda s: s.last_used)
            if not idle:
                raise KernelLimitReached(
                    f"the server runs its maximum of {self.settings.max_kernels} Python kernels and all are "
                    "busy; try again in a moment")
            await self.reclaim(idle[0].key, "the server's kernel limit was reached")

    async def reclaim(self, key: SessionKey | None, reason: str) -> None:
        """Shut a thread's kernel down; its next execution gets a fresh one and is told why."""
        session = self.sessions.pop(key, None) if key else None
        if session is None:
            return
        self._notices[key] = f"the previous one was reclaimed: {reason}"
        log.info("reclaiming kernel %s of %s: %s", session.placement.kernel_id, key, reason)
        await self._dispose(session)

    async def shutdown_thread(self, key: SessionKey) -> None:
        """The thread was cleared or deleted: stop its kernel, forget its notices."""
        session = self.sessions.pop(key, None)
        self._notices.pop(key, None)
        self._had_kernel.discard(key)
        if session is not None:
            await self._dispose(session)

    async def _dispose(self, session: KernelSession) -> None:
        await self._dispose_backend(session.backend)

    async def _dispose_backend(self, backend: KernelBackend) -> None:
        try:
            await backend.shutdown()
        except Exception:
            log.exception("kernel %s did not shut down cleanly", backend.placement.kernel_id)
        slot = backend.placement.data_dir.parent
        shutil.rmtree(slot, ignore_errors=True)
        shutil.rmtree(backend.placement.run_dir, ignore_errors=True)

    # -- execution -----------------------------------------------------------------
    async def session_for(self, key: SessionKey) -> tuple[KernelSession, list[str]]:
        """The warm kernel of `key`, started (or restarted after a crash) when needed."""
        ok, why = self._health
        if not ok:
            raise SandboxUnavailable(f"the Python sandbox is unavailable: {why}")
        notices: list[str] = []
        async with self._create_lock:
            session = self.sessions.get(key)
            if session is not None and not await session.backend.is_alive():
                reason = await session.backend.death_reason()
                self.sessions.pop(key, None)
                await self._dispose(session)
                self._notices[key] = f"the previous one stopped: {reason}"
                session = None
            if session is None:
                session = await self._take(key)
                if key in self._notices:
                    notices.append(fresh_kernel_notice(self._notices.pop(key)))
                elif key in self._had_kernel:
                    notices.append(fresh_kernel_notice("the previous one is gone"))
                self._had_kernel.add(key)
        return session, notices

    async def execute(self, key: SessionKey, code: str, timeout_s: float | None = None) -> Execution:
        timeout = self.settings.exec_timeout_s if timeout_s is None else timeout_s
        session, notices = await self.session_for(key)
        async with session.lock:
            sync_data_links(self.artifacts_dir_for(key), session.placement.data_dir)
            session.last_used = time.time()
            code = session.backend.rewrite_paths(code)
            try:
                result = await session.backend.execute(code, timeout)
            finally:
                session.last_used = time.time()
            if result.status == "timeout" and result.note:
                pass  # the backend already restarted a kernel that ignored the interrupt
            elif result.status == "timeout":
                result.note = await self._after_timeout(key, session)
            elif result.status == "died" or not await session.backend.is_alive():
                reason = await session.backend.death_reason()
                result.status = "died"
                result.note = (f"The Python kernel died ({reason}). Its variables are gone; the next "
                               "python call starts a fresh kernel.")
                self.sessions.pop(key, None)
                self._notices[key] = f"the previous one stopped: {reason}"
                await self._dispose(session)
            else:
                await session.backend.collect_outputs()
        return Execution(result=result, session=session, notices=notices)

    async def _after_timeout(self, key: SessionKey, session: KernelSession) -> str:
        """The interrupt was sent. If the kernel is not responsive again, restart it."""
        if await session.backend.is_alive():
            probe = await session.backend.execute("None", 5)
            if probe.status == "ok":
                await session.backend.collect_outputs()
                return ("The code was interrupted after the time limit; the kernel and its variables "
                        "are still there.")
        self.sessions.pop(key, None)
        self._notices[key] = "the previous one did not stop after an interrupt and was restarted"
        await self._dispose(session)
        return ("The code did not stop after an interrupt, so the kernel was shut down; the next python "
                "call starts a fresh kernel without the earlier variables.")

    # -- reaper ----------------------------------------------------------------------
    async def reap_once(self, now: float | None = None) -> list[tuple[SessionKey, str]]:
        now = time.time() if now is None else now
        s = self.settings
        reclaimed: list[tuple[SessionKey, str]] = []
        for key, session in list(self.sessions.items()):
            if session.lock.locked():
                continue  # never pull a kernel from under a running execution
            if now - session.last_used > s.idle_timeout_s:
                reason = f"idle for more than {s.idle_timeout_s / 60:g} min"
            elif now - session.started_at > s.max_lifetime_s:
                reason = f"it reached the {s.max_lifetime_s / 3600:g} h lifetime"
            else:
                continue
            await self.reclaim(key, reason)
            reclaimed.append((key, reason))
        for session in list(self.pool):
            if now - session.started_at > s.max_lifetime_s or not await session.backend.is_alive():
                self.pool.remove(session)
                await self._dispose(session)
        self._fill_pool()
        return reclaimed

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await asyncio.to_thread(self.refresh_health)
                await self.reap_once()
            except Exception:
                log.exception("kernel reaper pass failed")


def purge_user_slots(home: Path, user: str) -> list[str]:
    """Remove the kernel slots (data links, outputs) serving `user`; returns their kernel ids.
    Used when a user is deleted while a server may still hold their kernels."""
    root = Path(home) / "sandbox" / "slots"
    gone: list[str] = []
    for slot in (root.iterdir() if root.is_dir() else ()):
        try:
            owner = json.loads((slot / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if owner.get("user") == user:
            shutil.rmtree(slot, ignore_errors=True)
            gone.append(slot.name)
    return gone
