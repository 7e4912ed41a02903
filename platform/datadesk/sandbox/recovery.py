"""One execution on a thread's kernel and what follows it, so that the next call always works:
`KernelRecovery`, which holds the registry that made it and ends a kernel through its `forget`.

- The deadline (`timeout_s`, from when the code is sent) is the backend's: there it interrupts
  the code and, when the kernel is not idle within `execution.INTERRUPT_GRACE_S`, restarts it
  (`PendingExecution`). Here the kernel is then probed: still stuck means it is shut down and the
  next call gets a fresh one.
- A cancelled call (Stop, a deleted or cleared thread, the turn's tool timeout) interrupts the
  code, waits the same grace for the kernel to be idle and otherwise shuts it down. This runs to
  its end even when cancelled again, while the thread's kernel is still held, so the next call
  never queues behind code nobody waits for.
- A kernel that is alive but cannot run the next cell (its stdout closed, its processes filling
  the pid limit: `Kernel.health_problem`) is shut down the same way.

Every replacement is said twice: in this result's note and in the notice of the next call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Protocol, TypeVar

from datadesk.sandbox.base import ExecutionResult, OnOutput, OnStatus
from datadesk.sandbox.execution import INTERRUPT_GRACE_S, tell_status
from datadesk.sandbox.kerneltable import SessionKey
from datadesk.sandbox.sessions import KernelSession, SeenOutputs

log = logging.getLogger(__name__)

T = TypeVar("T")

GONE = ("Its variables, imports and loaded data are gone; the next python call starts a fresh kernel "
        "(reload what you need from /data).")
RESTARTED = ("The code did not stop after an interrupt, so the kernel was restarted: its variables, imports "
             "and loaded data are gone (reload what you need from /data).")
KEPT = "The code was interrupted after the time limit; the kernel and its variables are still there."


async def run_to_end(step: Awaitable[T]) -> T | None:
    """Await `step` to its end even when the caller is cancelled meanwhile (again): the kernel
    must be stopped before it is let go. None when `step` itself was cancelled."""
    task = asyncio.ensure_future(step)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return None if task.cancelled() else task.result()


class RecoveryOwner(Protocol):
    """What recovery uses of the registry that holds it (`registry.KernelRegistry`)."""

    async def forget(self, key: SessionKey, session: KernelSession, notice: str) -> None:
        """End the session's kernel; the next call's fresh kernel is announced with `notice`."""


class KernelRecovery:
    """The registry's execution of one cell and its recovery."""

    def __init__(self, registry: RecoveryOwner) -> None:
        self.registry = registry

    async def run(self, key: SessionKey, session: KernelSession, code: str, timeout: float,
                  on_output: OnOutput | None = None, on_status: OnStatus | None = None) -> ExecutionResult:
        """One execution on the session's kernel (caller holds it, its /data already handed over:
        `Kernel.receive_files`); after a timeout, a death, a cancel or a kernel left unusable, the
        kernel is made usable again or shut down."""
        if isinstance(session.seen_outputs, SeenOutputs):
            session.seen_outputs.reload()
        kernel = session.kernel
        session.last_used = time.time()
        try:
            result = await kernel.execute(kernel.rewrite_paths(code), timeout, on_output=on_output,
                                          on_status=on_status)
        except asyncio.CancelledError:
            await run_to_end(self._after_cancel(key, session, on_status))
            raise
        finally:
            session.last_used = time.time()
        return await self._after(key, session, result, on_status)

    async def _after(self, key: SessionKey, session: KernelSession, result: ExecutionResult,
                     on_status: OnStatus | None) -> ExecutionResult:
        kernel = session.kernel
        if result.status == "timeout" and result.note:
            result.note = RESTARTED  # the backend restarted a kernel that ignored the interrupt
        elif result.status == "timeout":
            result.note = await self._after_timeout(key, session, on_status)
            return result
        elif result.status == "died" or not await kernel.is_alive():
            reason = await kernel.death_reason()
            result.status = "died"
            result.note = f"The Python kernel died ({reason}). {GONE}"
            await self.registry.forget(key, session, f"the previous one stopped: {reason}")
            return result
        problem = await self._unusable(session, result)
        if problem:
            await self._replace(key, session, problem, on_status)
            result.note = (result.note + " " if result.note else "") + \
                f"The kernel was shut down because {problem}. {GONE}"
        return result

    async def _unusable(self, session: KernelSession, result: ExecutionResult) -> str:
        """Why the kernel cannot run the next cell ("" when it can). The checks come with a
        successful result; after a failed one a silent probe brings them."""
        kernel = session.kernel
        if result.status != "ok" or not result.expressions:
            try:
                probed = await kernel.probe(INTERRUPT_GRACE_S)
            except Exception as exc:
                return f"it did not answer a check ({exc})"
            if probed is None or probed.status != "ok":
                return "it did not answer a check after the code ended"
            result = probed
        return await kernel.health_problem(result)

    async def _replace(self, key: SessionKey, session: KernelSession, problem: str,
                       on_status: OnStatus | None) -> None:
        tell_status(on_status, f"shutting the kernel down: {problem}")
        log.info("kernel %s of %s replaced: %s", session.placement.kernel_id, key, problem)
        await self.registry.forget(key, session, f"the previous one was shut down because {problem}")

    async def _after_timeout(self, key: SessionKey, session: KernelSession, on_status: OnStatus | None) -> str:
        """The interrupt was sent and the kernel went idle (the backend says so): if it does not
        answer now, or cannot run more code, shut it down."""
        problem = await self._unusable(session, ExecutionResult(status="timeout"))
        if not problem:
            return KEPT
        await self._replace(key, session, problem, on_status)
        return f"The code was interrupted after the time limit, but the kernel was shut down because {problem}. {GONE}"

    async def _after_cancel(self, key: SessionKey, session: KernelSession, on_status: OnStatus | None) -> None:
        """The call was cancelled mid-execution: interrupt the code; when the kernel is not idle
        and healthy within the grace, shut it down (the next call starts a fresh one, with the notice)."""
        kernel = session.kernel
        tell_status(on_status, "the call was cancelled: interrupting the code")
        problem = "it did not stop when its call was cancelled"
        try:
            await kernel.interrupt()
            probed = await kernel.probe(INTERRUPT_GRACE_S)
            if probed is not None and probed.status == "ok":
                problem = await kernel.health_problem(probed)
                if not problem:
                    return
        except Exception as exc:
            log.warning("stopping kernel %s after a cancel: %s", session.placement.kernel_id, exc)
        await self._replace(key, session, problem, on_status)
