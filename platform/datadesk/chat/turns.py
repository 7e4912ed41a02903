"""Running turns: one at a time per thread, a few at a time per user, cancellable.

A turn runs as its own asyncio task and puts events on a queue; the HTTP
layer drains the queue into an SSE stream. Cancelling (the cancel endpoint,
or a client disconnect unless the turn finishes in the background) cancels
the task; the turn records what completed and marks the stopped step as
cancelled, so the log stays one the next turn can continue from.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from datadesk.domain.events import TurnEvent
from datadesk.domain.ids import new_id

log = logging.getLogger(__name__)


class TurnConflict(Exception):
    """A turn is already running on this thread (HTTP 409)."""


class TooManyTurns(Exception):
    """The user already runs the maximum number of concurrent turns (HTTP 429)."""


@dataclass
class RunningTurn:
    """A turn in flight: its task and the queue of events it produces."""

    turn_id: str
    thread_id: str
    user_id: str
    queue: asyncio.Queue[TurnEvent] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    background: bool = False

    def emit(self, type_: str, **data: object) -> None:
        self.queue.put_nowait(TurnEvent(type=type_, data=dict(data)))

    @property
    def finished(self) -> bool:
        return self.task is not None and self.task.done()


class TurnRegistry:
    """Who is running what: enforces one turn per thread and N per user."""

    def __init__(self, max_per_user: int) -> None:
        self.max_per_user = max_per_user
        self._by_thread: dict[str, RunningTurn] = {}

    def reserve(self, thread_id: str, user_id: str) -> RunningTurn:
        if thread_id in self._by_thread:
            raise TurnConflict(f"a turn is already running on thread {thread_id}; wait for it or cancel it")
        mine = sum(1 for t in self._by_thread.values() if t.user_id == user_id)
        if mine >= self.max_per_user:
            raise TooManyTurns(
                f"you already have {mine} turns running (limit {self.max_per_user}); wait for one to finish"
            )
        turn = RunningTurn(turn_id=new_id("turn"), thread_id=thread_id, user_id=user_id)
        self._by_thread[thread_id] = turn
        return turn

    def release(self, turn: RunningTurn) -> None:
        if self._by_thread.get(turn.thread_id) is turn:
            del self._by_thread[turn.thread_id]

    def get(self, thread_id: str) -> RunningTurn | None:
        return self._by_thread.get(thread_id)

    async def cancel(self, thread_id: str) -> bool:
        """Cancel the running turn of a thread; waits until it has recorded its state."""
        turn = self._by_thread.get(thread_id)
        if turn is None or turn.task is None or turn.task.done():
            return False
        turn.task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(turn.task), timeout=10)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            pass
        return True

    async def cancel_all(self) -> None:
        for tid in list(self._by_thread):
            await self.cancel(tid)
