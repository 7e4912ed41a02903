"""Reaching a thread's kernel that another worker started: attach to it, adopt it, or say why
the thread gets a fresh one.

- Owner alive, same backend: attach (a second client; the owner still stops it).
- Owner gone: a kernel any host reaches (`SandboxBackend.shared_across_hosts`: gateway kernels
  live on the gateway, not on the app host) is adopted, so an analyst's variables outlive the
  app host that started the kernel; any other is an orphan and is ended.
- Another backend, or a docker or local kernel of another host: this worker cannot reach it,
  so the thread is told its previous kernel is gone (the host that has it lets it go once the
  table no longer names it).

`reach_kernel` works on the registry (registry.py) through `AttachOwner`, as the reaper and
the recovery do, so this module needs no import of registry.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from datadesk.sandbox.kerneltable import KernelRecord, SessionKey
from datadesk.sandbox.sessions import ORPHAN_NOTICE, SEEN_FILE, KernelSession, SeenOutputs

if TYPE_CHECKING:
    from datadesk.sandbox.base import SandboxBackend
    from datadesk.sandbox.ownership import Worker
    from datadesk.settings import SandboxSettings
    from datadesk.store.interfaces.kernels import WorkerRegistry

log = logging.getLogger(__name__)


class AttachOwner(Protocol):
    """What `reach_kernel` uses of the registry."""

    settings: SandboxSettings
    worker: Worker
    workers: WorkerRegistry
    backend: SandboxBackend
    sessions: dict[SessionKey, KernelSession]

    async def end_record(self, rec: KernelRecord) -> None: ...
    def _save_gone(self, rec: KernelRecord | None, reason: str, key: SessionKey | None = None) -> None: ...


def outlives_owner(backend: SandboxBackend, rec: KernelRecord) -> bool:
    """Whether the kernel of `rec` lives on without its worker (any host reaches it: adopt it,
    never end it as an orphan)."""
    return backend.shared_across_hosts and rec.backend == backend.name


async def reach_kernel(reg: AttachOwner, key: SessionKey, rec: KernelRecord) -> KernelSession | None:
    """The session of the thread's kernel that another worker started (attached or adopted);
    None, with the reason saved for the fresh kernel's notice, when it cannot be used."""
    shared = outlives_owner(reg.backend, rec)
    owner_alive = reg.workers.owner_alive(rec.owner, reg.settings.owner_stale_s)
    if not owner_alive and not shared:
        log.info("kernel %s of %s is an orphan (worker %s is gone): ending it", rec.kernel_id, key, rec.owner)
        await reg.end_record(rec)
        reg._save_gone(rec, ORPHAN_NOTICE)
        return None
    if rec.backend and rec.backend != reg.backend.name:
        await reg.end_record(rec)
        reg._save_gone(rec, "the previous one ran in another server worker, which this one cannot reach")
        return None
    if rec.host and rec.host != reg.worker.host and not shared:
        reg._save_gone(rec, f"the previous one ran on another server ({rec.host}), which this one cannot reach")
        return None
    try:
        kernel = await reg.backend.attach(rec.placement, rec.locator)
    except Exception as exc:
        log.warning("cannot reach kernel %s of worker %s: %s", rec.kernel_id, rec.owner, exc)
        await reg.end_record(rec)
        reg._save_gone(rec, f"the previous one could not be reached from this server worker: {exc}")
        return None
    kernel.started_at = rec.started_at
    if not owner_alive:
        kernel.adopt()  # ours from now on: the record names this worker from the next touch
    log.info("worker %s %s kernel %s of worker %s", reg.worker.id,
             "attached to" if owner_alive else "adopted", rec.kernel_id, rec.owner)
    slot = Path(rec.data_dir).parent
    session = KernelSession(kernel=kernel, started_at=rec.started_at, last_used=rec.last_used, key=key,
                            seen_outputs=SeenOutputs(slot / SEEN_FILE))
    reg.sessions[key] = session
    return session
