"""Culling: the registry's reaper loop. Each round ends this worker's spare kernels
that are too old or dead and lets go of connections the kernel table no longer
backs; then, in the one worker of the host that takes `sandbox/reaper.lock`
(timeout 0), it sweeps what the backend left on this host (`remove_orphans`)
and, if it also takes the table's reaper lock (timeout 0: with the cluster set
one worker of the whole cluster per round), reclaims idle and too-old kernels
of every worker, ends orphans (their worker is gone) and removes dead
heartbeats.

`KernelReaper` holds the `KernelRegistry` that made it (registry.py), as
jupyter_client's `KernelRestarter` holds its kernel manager: it works on the
registry's pool, sessions, table and backend (`remove_orphans`), and ends
kernels through the registry's `reclaim_if_idle`, `end_record`, `let_go` and
`dispose` (`ReaperOwner` lists what it uses, so this module needs no import of
registry.py). Refilling the pool after a round is the registry's own step.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from datadesk.sandbox.attach import outlives_owner
from datadesk.sandbox.kerneltable import KernelRecord, SessionKey
from datadesk.sandbox.ownership import pid_alive, try_lock
from datadesk.sandbox.sessions import ORPHAN_NOTICE, KernelSession
from datadesk.store.interfaces.kernels import KernelTable, WorkerRegistry

if TYPE_CHECKING:
    from datadesk.sandbox.base import SandboxBackend
    from datadesk.sandbox.ownership import Worker
    from datadesk.settings import SandboxSettings

log = logging.getLogger(__name__)

REAPER_LOCK = "reaper.lock"


class ReaperOwner(Protocol):
    """What the reaper uses of the registry that holds it (`registry.KernelRegistry`)."""

    settings: SandboxSettings
    home: Path
    worker: Worker
    workers: WorkerRegistry
    table: KernelTable
    sessions: dict[SessionKey, KernelSession]
    pool: list[KernelSession]
    backend: SandboxBackend

    def refresh_health(self) -> tuple[bool, str]: ...
    async def reap_once(self, now: float | None = None) -> list[tuple[SessionKey, str]]: ...
    def same_kernel(self, rec: KernelRecord | None, session: KernelSession) -> bool: ...
    async def dispose(self, session: KernelSession) -> None: ...
    async def let_go(self, session: KernelSession) -> None: ...
    async def reclaim_if_idle(self, key: SessionKey, notice: str, kernel_id: str | None = None) -> bool: ...
    async def end_record(self, rec: KernelRecord) -> None: ...
    def forget_idle_locks(self) -> None: ...


class KernelReaper:
    """The registry's culling: idle and lifetime limits, orphans, dead heartbeats."""

    def __init__(self, registry: ReaperOwner) -> None:
        self.registry = registry
        self.lock_path = registry.home / "sandbox" / REAPER_LOCK

    async def reap_once(self, now: float) -> list[tuple[SessionKey, str]]:
        """One round: this worker's pool and connections, then (in one worker of the host per
        round) idle and old kernels, orphans and dead heartbeats."""
        reg = self.registry
        for session in list(reg.pool):
            if now - session.started_at > reg.settings.max_lifetime_s or not await session.kernel.is_alive():
                reg.pool.remove(session)
                reg.table.remove_pool(session.placement.kernel_id)
                await reg.dispose(session)
        await self._prune_sessions()
        return await self.reap_host(now)

    async def reap_host(self, now: float) -> list[tuple[SessionKey, str]]:
        """The host-wide part, in the one worker that takes `sandbox/reaper.lock` (timeout 0), and
        the records' part where the table's reaper lock is free too; [] in the others."""
        with try_lock(self.lock_path) as got:
            if not got:
                return []
            with try_lock(self.registry.table.reaper_lock()) as rows:
                reclaimed = await self._reap_records(now) if rows else []
            await asyncio.to_thread(self.registry.backend.remove_orphans)  # e.g. containers whose owner is gone
            return reclaimed

    async def _prune_sessions(self) -> None:
        """Let go of connections to kernels the table no longer gives this thread."""
        reg = self.registry
        for key, session in list(reg.sessions.items()):
            if reg.same_kernel(reg.table.load(key), session):
                continue
            with try_lock(reg.table.key_lock(key)) as got:
                if got and reg.sessions.get(key) is session and not session.lock.locked():
                    del reg.sessions[key]
                    await reg.let_go(session)
        reg.forget_idle_locks()

    async def _reap_records(self, now: float) -> list[tuple[SessionKey, str]]:
        reg, s = self.registry, self.registry.settings
        reclaimed: list[tuple[SessionKey, str]] = []
        for rec in list(reg.table.sessions()):
            key = rec.key
            if not rec.kernel_id or key is None:
                continue
            if not outlives_owner(reg.backend, rec) and not reg.workers.owner_alive(rec.owner, s.owner_stale_s):
                # (a kernel any host reaches outlives its worker: the next execution adopts it)
                reason, notice = "its worker is gone", ORPHAN_NOTICE
            elif rec.pid and rec.host == reg.worker.host and not pid_alive(rec.pid, rec.pid_start):
                reason, notice = "it had stopped", "the previous one stopped"
            elif now - rec.last_used > s.idle_timeout_s:
                reason = f"idle for more than {s.idle_timeout_s / 60:g} min"
                notice = f"the previous one was reclaimed: {reason}"
            elif now - rec.started_at > s.max_lifetime_s:
                reason = f"it reached the {s.max_lifetime_s / 3600:g} h lifetime"
                notice = f"the previous one was reclaimed: {reason}"
            else:
                continue
            if await reg.reclaim_if_idle(key, notice, rec.kernel_id):
                reclaimed.append((key, reason))
        for rec in list(reg.table.pooled()):
            if rec.owner != reg.worker.id and not reg.workers.owner_alive(rec.owner, s.owner_stale_s):
                reg.table.remove_pool(rec.kernel_id or "")
                await reg.end_record(rec)
        await asyncio.to_thread(reg.workers.remove_dead, s.owner_stale_s)
        return reclaimed

    async def run(self) -> None:
        """The loop: every `sandbox.reap_interval_s`, refresh the health and reap one round."""
        reg = self.registry
        while True:
            await asyncio.sleep(reg.settings.reap_interval_s)
            try:
                await asyncio.to_thread(reg.refresh_health)
                await reg.reap_once()
            except Exception:
                log.exception("kernel reaper pass failed")
