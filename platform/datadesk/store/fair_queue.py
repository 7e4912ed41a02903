"""A fair waiting line for scarce things (issue 27): query slots, upload slots, offload writers.

At most `per_user` places are held by one user and at most `total` by everyone together.
Whoever cannot have one now waits in line, and the line is served

- **in order within a user** (first come, first served), and
- **round-robin across users**: each time a place frees, the first user in turn who may hold
  one more gets it and goes to the back, so a user with many queued calls does not starve the
  others, and a user at their own limit never holds up the rest (no head-of-line blocking).

Waiting is event-driven: a release hands the place to the next waiter at once (from any
thread: an asyncio waiter is woken with `call_soon_threadsafe`, a thread by its event), with
no polling. An async waiter wakes once a second only to report how many are ahead of it
(`report(n)`, called when the number changed), so a wait shows as progress.

A waiter leaves the line when it is granted, when its wait passes its deadline, or when its
task is cancelled; a place granted in the very moment of a cancel or a deadline is given back
(cancel) or kept (deadline), so no place is ever lost or held twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

REPORT_S = 1.0  # an async waiter looks at its place in line this often (to report it)


class Waiter:
    """One place in a line: waiting, then held, then done. `user` is who it counts against."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.state = "new"  # new -> waiting -> held -> done (or waiting -> done: gave up)
        self._wake: Callable[[], None] | None = None

    @property
    def held(self) -> bool:
        return self.state == "held"

    @property
    def released(self) -> bool:
        return self.state == "done"


class FairQueue:
    """Places per user and in total, handed out fairly (see the module doc); thread-safe.
    `on_grant(waiter)` runs under the lock each time a place is handed out."""

    def __init__(self, per_user: int, total: int, on_grant: Callable[[Waiter], None] | None = None) -> None:
        self.per_user = max(1, int(per_user))
        self.total = max(1, int(total))
        self.lock = threading.Lock()
        self.holding: list[Waiter] = []
        self._held_by: collections.Counter[str] = collections.Counter()
        self._lines: dict[str, collections.deque[Waiter]] = {}
        self._turns: collections.deque[str] = collections.deque()  # users with waiters, next served first
        self._on_grant = on_grant
        self._threads: ThreadPoolExecutor | None = None

    def threads(self, name: str) -> ThreadPoolExecutor:
        """Threads for the holders' work, made on first use: one per place, and two for work that
        ends after its place was given back (a cancel's grace). A holder never waits for a
        thread behind other work."""
        with self.lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.total + 2, thread_name_prefix=f"datadesk-{name}")
            return self._threads

    # -- under the lock ---------------------------------------------------------------------
    def _grant(self) -> None:
        """Hand free places to waiters: the first user in turn below their own limit."""
        while len(self.holding) < self.total and self._turns:
            user = next((u for u in self._turns if self._held_by[u] < self.per_user), None)
            if user is None:
                return  # every waiting user is at their own limit
            line = self._lines[user]
            waiter = line.popleft()
            self._turns.remove(user)
            if line:
                self._turns.append(user)  # served: to the back of the round
            else:
                del self._lines[user]
            self._hold(waiter)

    def _hold(self, waiter: Waiter) -> None:
        waiter.state = "held"
        self.holding.append(waiter)
        self._held_by[waiter.user] += 1
        if self._on_grant is not None:
            self._on_grant(waiter)
        if waiter._wake is not None:
            waiter._wake()

    def _leave_line(self, waiter: Waiter) -> None:
        line = self._lines.get(waiter.user)
        if line is not None and waiter in line:
            line.remove(waiter)
            if not line:
                del self._lines[waiter.user]
                self._turns.remove(waiter.user)

    # -- entering and leaving -----------------------------------------------------------------
    def offer(self, waiter: Waiter, wait: bool = True) -> bool:
        """Put `waiter` at the end of its user's line and serve the line; True when it holds a
        place now. With `wait=False` a waiter not served at once leaves the line again."""
        with self.lock:
            if waiter.state != "new":
                raise ValueError(f"a waiter is offered once (it is {waiter.state})")
            waiter.state = "waiting"
            line = self._lines.get(waiter.user)
            if line is None:
                line = self._lines[waiter.user] = collections.deque()
                self._turns.append(waiter.user)
            line.append(waiter)
            self._grant()
            if waiter.state != "held" and not wait:
                self._leave_line(waiter)
                waiter.state = "done"
            return waiter.state == "held"

    def release(self, waiter: Waiter) -> bool:
        """Give the place back (or leave the line); idempotent and safe from any thread. True
        when it had held a place."""
        with self.lock:
            if waiter.state == "held":
                waiter.state = "done"
                self.holding.remove(waiter)
                self._held_by[waiter.user] -= 1
                if self._held_by[waiter.user] <= 0:
                    del self._held_by[waiter.user]
                self._grant()
                return True
            if waiter.state == "waiting":
                self._leave_line(waiter)
            waiter.state = "done"
            return False

    def _give_up(self, waiter: Waiter) -> bool:
        """The wait passed its deadline: leave the line; True when it was granted meanwhile."""
        with self.lock:
            if waiter.state == "held":
                return True
            self._leave_line(waiter)
            waiter.state = "done"
            return False

    # -- state ------------------------------------------------------------------------------
    def held(self, user: str | None = None) -> int:
        with self.lock:
            return len(self.holding) if user is None else self._held_by[user]

    def waiting(self, user: str | None = None) -> int:
        with self.lock:
            if user is not None:
                return len(self._lines.get(user, ()))
            return sum(len(line) for line in self._lines.values())

    def ahead(self, waiter: Waiter) -> int:
        """About how many waiters will be served before `waiter`: the earlier ones of its user,
        and of every other user as many as the rounds before its own (one more for a user
        whose turn comes first). 0 when it is not waiting."""
        with self.lock:
            line = self._lines.get(waiter.user)
            if waiter.state != "waiting" or line is None:
                return 0
            rounds = line.index(waiter)
            before = True
            n = rounds
            for user in self._turns:
                if user == waiter.user:
                    before = False
                    continue
                n += min(len(self._lines[user]), rounds + (1 if before else 0))
            return n

    # -- waiting ----------------------------------------------------------------------------
    async def wait(self, waiter: Waiter, timeout_s: float | None,
                   report: Callable[[int], None] | None = None) -> bool:
        """Wait (on the event loop, no polling) until `waiter`, already offered, holds a place:
        True; False when `timeout_s` passed first (it left the line). Cancelling the caller
        takes it out of the line, or gives back a place granted in that moment."""
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(_settle, woken)
            except RuntimeError:  # the loop is gone: nobody waits any more
                pass

        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        with self.lock:
            waiter._wake = wake
            if waiter.state == "held":
                return True
        last: int | None = None
        try:
            while waiter.state != "held":
                if waiter.state == "done":
                    return False  # released while it waited (by its owner): nothing to wait for
                n = self.ahead(waiter)
                if report is not None and n != last and waiter.state == "waiting":
                    last = n
                    report(n)
                left = REPORT_S if deadline is None else min(REPORT_S, deadline - time.monotonic())
                if left <= 0:
                    return self._give_up(waiter)
                await asyncio.wait([woken], timeout=left)
            return True
        except BaseException:  # cancelled (or a failing report): no place kept, none lost
            self.release(waiter)
            raise

    def wait_blocking(self, waiter: Waiter, timeout_s: float | None) -> bool:
        """`wait` for a worker thread (no reports)."""
        event = threading.Event()
        with self.lock:
            waiter._wake = event.set
            if waiter.state == "held":
                return True
        try:
            if event.wait(timeout_s):
                return True
            return self._give_up(waiter)
        except BaseException:
            self.release(waiter)
            raise


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def in_thread(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """`asyncio.to_thread(fn, *args)` in `executor` (a line's own threads, `FairQueue.threads`),
    or in the loop's default threads when None; the caller's context variables go along."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, call)
