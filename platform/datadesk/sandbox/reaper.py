"""Culling: the registry's reaper loop. Each round ends this worker's spare kernels
that are too old or dead and lets go of connections the kernel table no longer
backs; then, in the one worker of the host that takes `sandbox/reaper.lock`
(timeout 0), it reclaims idle and too-old kernels of every worker, ends orphans
(their worker is gone) and removes dead heartbeats.

`KernelReaper` is a mixin of `KernelRegistry` (registry.py): it works on the
registry's pool, sessions, table, locks and backend (`remove_orphans`), and
ends kernels through its `_reclaim_if_idle`, `_end_record`, `_let_go` and
`_dispose`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from datadesk.sandbox.kerneltable import KernelTable, SessionKey
from datadesk.sandbox.ownership import owner_alive, pid_alive, remove_dead_heartbeats, try_lock
from datadesk.sandbox.sessions import ORPHAN_NOTICE, KernelSession

if TYPE_CHECKING:
    from datadesk.sandbox.base import SandboxBackend
    from datadesk.sandbox.ownership import Worker
    from datadesk.settings import SandboxSettings

log = logging.getLogger(__name__)

REAPER_LOCK = "reaper.lock"


class KernelReaper:
    """The reaper half of KernelRegistry (idle and lifetime limits, orphans, dead heartbeats)."""

    # set by KernelRegistry.__init__
    settings: SandboxSettings
    home: Path
    worker: Worker
    table: KernelTable
    sessions: dict[SessionKey, KernelSession]
    pool: list[KernelSession]
    _key_locks: dict[SessionKey, asyncio.Lock]
    backend: SandboxBackend

    async def reap_once(self, now: float | None = None) -> list[tuple[SessionKey, str]]:
        """One round: this worker's pool and connections, then (in one worker of the host per
        round) idle and old kernels, orphans and dead heartbeats."""
        now = time.time() if now is None else now
        for session in list(self.pool):
            if now - session.started_at > self.settings.max_lifetime_s or not await session.kernel.is_alive():
                self.pool.remove(session)
                self.table.remove_pool(session.placement.kernel_id)
                await self._dispose(session)
        await self._prune_sessions()
        reclaimed: list[tuple[SessionKey, str]] = []
        with try_lock(self.home / "sandbox" / REAPER_LOCK) as got:
            if got:
                reclaimed = await self._reap_host(now)
        self._fill_pool()
        return reclaimed

    async def _prune_sessions(self) -> None:
        """Let go of connections to kernels the table no longer gives this thread."""
        for key, session in list(self.sessions.items()):
            if self._same_kernel(self.table.load(key), session):
                continue
            with try_lock(self.table.key_lock(key)) as got:
                if got and self.sessions.get(key) is session and not session.lock.locked():
                    del self.sessions[key]
                    await self._let_go(session)
        for key in [k for k, lk in self._key_locks.items() if not lk.locked() and k not in self.sessions]:
            del self._key_locks[key]

    async def _reap_host(self, now: float) -> list[tuple[SessionKey, str]]:
        s = self.settings
        reclaimed: list[tuple[SessionKey, str]] = []
        for rec in list(self.table.sessions()):
            key = rec.key
            if not rec.kernel_id or key is None:
                continue
            if not owner_alive(self.home, rec.owner, s.owner_stale_s):
                reason, notice = "its worker is gone", ORPHAN_NOTICE
            elif rec.pid and rec.host == self.worker.host and not pid_alive(rec.pid, rec.pid_start):
                reason, notice = "it had stopped", "the previous one stopped"
            elif now - rec.last_used > s.idle_timeout_s:
                reason = f"idle for more than {s.idle_timeout_s / 60:g} min"
                notice = f"the previous one was reclaimed: {reason}"
            elif now - rec.started_at > s.max_lifetime_s:
                reason = f"it reached the {s.max_lifetime_s / 3600:g} h lifetime"
                notice = f"the previous one was reclaimed: {reason}"
            else:
                continue
            if await self._reclaim_if_idle(key, notice, rec.kernel_id):
                reclaimed.append((key, reason))
        for rec in list(self.table.pooled()):
            if rec.owner != self.worker.id and not owner_alive(self.home, rec.owner, s.owner_stale_s):
                self.table.remove_pool(rec.kernel_id or "")
                await self._end_record(rec)
        await asyncio.to_thread(self.backend.remove_orphans)  # e.g. containers whose owner is gone
        await asyncio.to_thread(remove_dead_heartbeats, self.home, s.owner_stale_s)
        return reclaimed

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await asyncio.to_thread(self.refresh_health)
                await self.reap_once()
            except Exception:
                log.exception("kernel reaper pass failed")
