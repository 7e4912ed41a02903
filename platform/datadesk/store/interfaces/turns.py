"""Who runs which turn, across the workers of a host (embedded) or the hosts of a cluster.

A `TurnDirectory` is the shared part of `chat.turns.TurnRegistry`: the registry keeps the
turns of its own process (tasks, journals); the directory says which turn runs on a thread
anywhere, enforces one turn per thread and N per user everywhere, carries cancel requests
to the process that runs the turn, and fences a turn that lost its claim.

- `claim` takes the thread and a slot of the user (TurnConflict: 409, TooManyTurns: 429)
  and returns a `Claim` whose `fence` grows with every claim of the thread: a write that
  names an older fence is refused (the threads store checks it in the write's own
  transaction on the cluster set).
- `announce` makes a claimed turn visible to the others once its journal is open.
- `current` is the turn running on a thread (its holder alive), or None.
- `request_cancel(thread, turn)` asks the holder of that turn to stop it; a request naming
  an older turn matches nothing, so it can never stop a later one.
- `cancel_requests(mine)` is how the holder learns of requests: an async iterator that
  yields each of its claims (`mine()`) asked to stop, or lost (its lease expired and another
  process took the thread), while `mine()` is not empty. It also renews the claims' leases
  where the set has leases.
- `renew`, `release`, `expired` as named; `hold`/`hold_wait`/`forget` serve recovery and
  clear/delete (the thread held with no turn on it).

Exceptions: `TurnConflict`, `TooManyTurns` (both `TurnRefused`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterable, Protocol, runtime_checkable


class TurnRefused(Exception):
    """A turn cannot start now."""


class TurnConflict(TurnRefused):
    """A turn is already running on this thread (HTTP 409)."""


class TooManyTurns(TurnRefused):
    """The user already runs the maximum number of concurrent turns (HTTP 429)."""


def conflict(thread_id: str) -> TurnConflict:
    return TurnConflict(f"a turn is already running on thread {thread_id}; wait for it or cancel it")


def too_many(limit: int, running: int | None = None) -> TooManyTurns:
    n = limit if running is None else running
    return TooManyTurns(f"you already have {n} turns running (limit {limit}); wait for one to finish")


@dataclass
class Claim:
    """A turn's hold on its thread: `fence` is the thread's claim number (see the module doc).
    `handle` is the set's own state (lock files, the connection holding the lock)."""

    thread_id: str
    turn_id: str
    user_id: str
    fence: int
    events: bool = False  # a chat turn, with a journal others can follow
    handle: object = field(default=None, repr=False, compare=False)
    lost: bool = False  # the set found the claim gone (lease expired and taken, connection dead)


@dataclass(frozen=True)
class TurnInfo:
    """The turn running on a thread, as any process sees it."""

    thread_id: str
    turn_id: str
    user_id: str | None
    owner: str  # "<host>:<pid>" of the process running it
    fence: int
    events: bool


@runtime_checkable
class TurnDirectory(Protocol):
    """See the module doc."""

    def claim(self, thread_id: str, user_id: str, turn_id: str, *, limit: int, events: bool = False) -> Claim:
        ...

    def announce(self, claim: Claim) -> None:
        ...

    def current(self, thread_id: str) -> TurnInfo | None:
        ...

    def running_threads(self) -> set[str] | None:
        """The threads that may have a running turn now (None: unknown, ask `current`)."""
        ...

    def request_cancel(self, thread_id: str, turn_id: str) -> bool:
        """True when the request reached a running turn `turn_id` of the thread."""
        ...

    def cancel_requests(self, mine: Callable[[], Iterable[Claim]]) -> AsyncIterator[Claim]:
        ...

    def renew(self, claim: Claim) -> bool:
        """Extend the claim's lease; False when the claim is gone (then `claim.lost` is set)."""
        ...

    def release(self, claim: Claim) -> None:
        ...

    def expired(self) -> list[TurnInfo]:
        """Turns marked running whose holder is gone (a dead process or host): to be finished."""
        ...

    def hold(self, thread_id: str) -> contextlib.AbstractContextManager[bool]:
        """Hold the thread if nobody does, without waiting: yields whether it is held and no
        turn runs there."""
        ...

    def hold_wait(self, thread_id: str, wait_s: float, deleting: bool = False
                  ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the thread, waiting up to `wait_s` (TurnConflict after); `deleting`: the
        thread goes afterwards, and so does what the directory keeps of it."""
        ...

    def forget(self, thread_id: str, turn_id: str) -> None:
        """Drop what a dead holder left of turn `turn_id` (with the thread held)."""
        ...

    def close(self) -> None:
        ...
