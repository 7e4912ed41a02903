"""Clear chat and delete thread: each one operation over the thread, its running turn and its
kernel (DESIGN section 8: "Clear chat = one operation"). Memory is never touched here."""

from __future__ import annotations

import asyncio
from typing import Any

from datadesk.chat.turns import TurnRegistry
from datadesk.domain.users import User
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.sandbox.registry import KernelRegistry
from datadesk.store.threads import Thread, ThreadStore


class ThreadLifecycle:
    """Ends a thread's content: `clear` keeps the thread (a new epoch), `delete` removes it.

    Either way the running turn is cancelled wherever it runs, no turn starts until the
    operation is done (TurnConflict when the thread stays busy), and its kernel is shut down.
    """

    def __init__(self, threads: ThreadStore, turns: TurnRegistry, kernels: KernelRegistry | None,
                 artifacts: ArtifactStore | None = None) -> None:
        self.threads = threads
        self.turns = turns
        self.kernels = kernels  # None without a sandbox: no kernel to end
        self.artifacts = artifacts  # its ledger forgets what the thread held (None: the next sweep does)

    async def clear(self, thread: Thread, user: User) -> dict[str, Any]:
        """Cancel the running turn, bump the epoch, delete the log, summary, manifests, artifacts
        and outputs, shut the kernel down. Returns what was removed (`kernel`: whether one ran)."""
        async with self.turns.exclusive(thread.id):
            removed = self.threads.clear(thread)
            await self._forget_artifacts(thread)
            kernel = False
            if self.kernels is not None:
                key = (thread.workspace, user.id, thread.id)
                kernel = self.kernels.has_kernel(key)
                await self.kernels.shutdown_thread(key)
        return {**removed, "kernel": kernel}

    async def delete(self, thread: Thread, user: User) -> None:
        """Cancel the running turn, shut the kernel down and remove the thread's folder."""
        async with self.turns.exclusive(thread.id, deleting=True):
            if self.kernels is not None:  # its kernel goes with it
                await self.kernels.shutdown_thread((thread.workspace, user.id, thread.id))
            self.threads.delete(thread)
            await self._forget_artifacts(thread)

    async def _forget_artifacts(self, thread: Thread) -> None:
        """The thread's artifacts no longer count against the quotas (its rows of the ledger)."""
        if self.artifacts is not None:
            await asyncio.to_thread(self.artifacts.forget_thread, thread)
