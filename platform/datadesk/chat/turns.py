"""Running turns: one at a time per thread, a few at a time per user, cancellable, across
every app worker of the host.

A turn runs as its own asyncio task, detached from any HTTP connection: its
events go to its `TurnJournal` (chat/journal.py: ids, kept for the thread's
current turn, in memory and in the thread's `events.jsonl`), which every SSE
stream of the turn reads, from any worker (`attach`). A client that leaves
stops nothing; cancelling (the cancel endpoint, clear, delete, or a client
disconnect of a turn started with `background: false`) cancels the task; the
turn records what completed and marks the stopped step as cancelled, so the
log stays one the next turn can continue from.

Across processes (`datadesk serve --workers N`), with `lock_dir` set:

- `t-<thread>.lock`: held for the whole turn, taken with timeout 0: a second
  turn on the thread, in any worker, is refused (TurnConflict, HTTP 409).
- `u-<hash of user>-<i>.lock`, i < max_per_user: a turn holds one free slot; none
  free in any worker means TooManyTurns (HTTP 429).
- `t-<thread>.turn`: who runs the turn (turn id, pid, whether it has an event
  file), written while it runs, so another worker can tell that it runs, follow
  its events and cancel it.
- `t-<thread>.cancel`: a cancel request naming the turn id. The worker running
  that turn polls for it and cancels the task; a request for an older turn is
  ignored, so it can never stop a later one.
- `exclusive(thread)`: clear and delete cancel the running turn wherever it
  runs, then hold the thread lock while they work, so no turn starts meanwhile.

Locks held by a process are released by the OS when it dies; a marker left by
a dead process is recognised by its pid. The turn such a process cut off is
finished by chat/recovery.py, holding the thread with `idle` (or, before the
thread's next turn, through the `before_turn` hook).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import msgspec
from filelock import FileLock, Timeout

from datadesk.chat.journal import Cursor, JournalEvent, TurnJournal, file_turn, follow_file
from datadesk.domain.events import EventPayload, MessageDelta
from datadesk.domain.ids import check_id, new_id
from datadesk.sandbox.ownership import acquire_async, file_lock, pid_alive, proc_start, try_lock
from datadesk.store.files import read_json_object, write_json

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.1  # how often a worker looks for cancel requests of its running turns
CANCEL_WAIT_S = 10.0  # how long a cancel waits for the turn to record its state and end
EXCLUSIVE_WAIT_S = 30.0  # how long clear/delete wait for the thread to be free


class TurnConflict(Exception):
    """A turn is already running on this thread (HTTP 409)."""


class TooManyTurns(Exception):
    """The user already runs the maximum number of concurrent turns (HTTP 429)."""


@dataclass
class RunningTurn:
    """A turn in flight: its task and the journal of the events it produces."""

    turn_id: str
    thread_id: str
    user_id: str
    task: asyncio.Task[None] | None = None
    background: bool = True  # False: the client that started it cancels it by leaving
    locks: list[FileLock] = field(default_factory=list)  # thread lock, user slot (cross-process)
    journal: TurnJournal | None = None
    loop: asyncio.AbstractEventLoop | None = None
    _loop_thread: int = 0

    def __post_init__(self) -> None:
        if self.journal is None:
            self.journal = TurnJournal(self.turn_id, None)
        with contextlib.suppress(RuntimeError):
            self.loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()

    def emit(self, payload: EventPayload) -> None:
        """Add an event (from the event loop, or from a worker thread of a tool). Text pieces of
        the answer are coalesced into fewer `message.delta` events (TurnJournal.add_text)."""
        journal = self.journal
        assert journal is not None
        if type(payload) is MessageDelta:
            add, args = journal.add_text, (payload.text,)
        else:
            add, args = journal.add, (payload.type, msgspec.to_builtins(payload))
        if self.loop is None or threading.get_ident() == self._loop_thread:
            add(*args)
        else:
            self.loop.call_soon_threadsafe(add, *args)

    @property
    def finished(self) -> bool:
        return self.task is not None and self.task.done()


@dataclass
class Attachment:
    """A client's view of a turn: every kept event from its start, and how many it has seen."""

    events: AsyncIterator[JournalEvent | None]  # None: nothing for a while (a keep-alive)
    turn_id: str
    seen: int


class TurnRegistry:
    """Who is running what: enforces one turn per thread and N per user (see the module docstring)."""

    def __init__(self, max_per_user: int, lock_dir: Path | None = None,
                 before_turn: Callable[[Path], None] | None = None) -> None:
        """`before_turn(events_at)`: called with the thread held, before a chat turn replaces the
        thread's event file (chat/recovery.py: a previous turn cut off by a crash is finished first)."""
        self.max_per_user = max_per_user
        self.lock_dir = Path(lock_dir) if lock_dir is not None else None
        self.before_turn = before_turn
        self._by_thread: dict[str, RunningTurn] = {}
        self._watcher: asyncio.Task[None] | None = None

    # -- files ---------------------------------------------------------------
    def _path(self, thread_id: str, suffix: str) -> Path:
        assert self.lock_dir is not None
        return self.lock_dir / f"t-{check_id(thread_id, 'thread')}.{suffix}"

    def _slot(self, user_id: str, i: int) -> Path:
        assert self.lock_dir is not None
        # named by a hash: a deleted user's name stays nowhere on disk
        digest = hashlib.sha256(check_id(user_id, "user").encode()).hexdigest()[:20]
        return self.lock_dir / f"u-{digest}-{i}.lock"

    def _marker(self, thread_id: str) -> dict[str, Any] | None:
        """The running turn of the thread in any worker of this host, or None."""
        data = read_json_object(self._path(thread_id, "turn"))
        if data is None or not pid_alive(data.get("pid"), data.get("pid_start")):
            return None
        return data

    # -- reserve / release ---------------------------------------------------
    def reserve(self, thread_id: str, user_id: str, events_at: Path | None = None) -> RunningTurn:
        """Take the thread and a slot of the user (TurnConflict, TooManyTurns). `events_at`: the
        thread's event file, for a chat turn (re-attach); replaced only once the turn has the thread."""
        if thread_id in self._by_thread:
            raise TurnConflict(f"a turn is already running on thread {thread_id}; wait for it or cancel it")
        mine = sum(1 for t in self._by_thread.values() if t.user_id == user_id)
        if mine >= self.max_per_user:
            raise TooManyTurns(
                f"you already have {mine} turns running (limit {self.max_per_user}); wait for one to finish"
            )
        turn = RunningTurn(turn_id=new_id("turn"), thread_id=thread_id, user_id=user_id)
        if self.lock_dir is not None:
            self._lock_across_workers(turn, events_at)
        elif events_at is not None:
            self._before_turn(events_at)
            turn.journal = TurnJournal(turn.turn_id, events_at)
        self._by_thread[thread_id] = turn
        if self.lock_dir is not None and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.get_running_loop().create_task(self._watch_cancels(), name="turn-cancel-watch")
        return turn

    def _lock_across_workers(self, turn: RunningTurn, events_at: Path | None) -> None:
        self.lock_dir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        tlock = file_lock(self._path(turn.thread_id, "lock"))
        try:
            tlock.acquire(timeout=0)
        except Timeout:
            raise TurnConflict(f"a turn is already running on thread {turn.thread_id}; wait for it or "
                               "cancel it") from None
        slot = None
        for i in range(max(1, self.max_per_user)):
            candidate = file_lock(self._slot(turn.user_id, i))
            try:
                candidate.acquire(timeout=0)
            except Timeout:
                continue
            slot = candidate
            break
        if slot is None:
            tlock.release()
            raise TooManyTurns(f"you already have {self.max_per_user} turns running (limit {self.max_per_user}); "
                               "wait for one to finish")
        turn.locks = [tlock, slot]
        if events_at is not None:  # before the marker: a turn that runs has its event file
            self._before_turn(events_at)
            turn.journal = TurnJournal(turn.turn_id, events_at)
        write_json(self._path(turn.thread_id, "turn"), {
            "turn_id": turn.turn_id, "pid": os.getpid(), "pid_start": proc_start(os.getpid()),
            "started": time.time(), "events": events_at is not None}, sync=False)

    def _before_turn(self, events_at: Path) -> None:
        if self.before_turn is None:
            return
        try:
            self.before_turn(events_at)
        except Exception:  # the new turn still runs: the old one keeps what it had recorded
            log.exception("could not finish the previous turn of %s", events_at.parent.name)

    def release(self, turn: RunningTurn) -> None:
        if self._by_thread.get(turn.thread_id) is turn:
            del self._by_thread[turn.thread_id]
        if not turn.locks:
            return
        for suffix in ("turn", "cancel"):
            path = self._path(turn.thread_id, suffix)
            data = read_json_object(path)
            if data is not None and data.get("turn_id") == turn.turn_id:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        locks, turn.locks = turn.locks, []
        for lock in reversed(locks):
            lock.release()
        if turn.journal is not None and not turn.journal.done:
            turn.journal.close()

    def get(self, thread_id: str) -> RunningTurn | None:
        return self._by_thread.get(thread_id)

    def running(self, thread_id: str) -> bool:
        """Whether a turn runs on the thread in this worker or another one of the host."""
        if thread_id in self._by_thread:
            return True
        return self.lock_dir is not None and self._marker(thread_id) is not None

    def current_turn(self, thread_id: str) -> str | None:
        """The id of the chat turn (one with events) running on the thread in any worker, or None."""
        turn = self._by_thread.get(thread_id)
        if turn is not None:
            return turn.turn_id if turn.journal is not None and turn.journal.path is not None else None
        marker = self._marker(thread_id) if self.lock_dir is not None else None
        return str(marker["turn_id"]) if marker is not None and marker.get("events") else None

    def status(self, thread_id: str, markers: set[str] | None = None) -> tuple[bool, str | None]:
        """`(running(), current_turn())` with one read of the marker file. `markers`: the names
        in the marker directory (`marker_names`), so a thread without one costs no read."""
        turn = self._by_thread.get(thread_id)
        if turn is not None:
            return True, turn.turn_id if turn.journal is not None and turn.journal.path is not None else None
        if self.lock_dir is None or (markers is not None and f"t-{thread_id}.turn" not in markers):
            return False, None
        marker = self._marker(thread_id)
        if marker is None:
            return False, None
        return True, str(marker["turn_id"]) if marker.get("events") else None

    def marker_names(self) -> set[str] | None:
        """The file names in the marker directory now (one listing for many `status` calls)."""
        if self.lock_dir is None:
            return None
        try:
            return set(os.listdir(self.lock_dir))
        except OSError:
            return None  # then each status reads its own marker

    def attach(self, thread_id: str, events_at: Path, cursor: Cursor | None) -> Attachment | None:
        """The events of the thread's current turn, from its start; None when there is nothing to
        attach to: no turn runs and the cursor names no turn whose events are still kept."""
        def attachment(events: AsyncIterator[JournalEvent | None], tid: str) -> Attachment:
            seen = cursor.n if cursor is not None and cursor.turn in (None, tid) else 0
            return Attachment(events, tid, seen)

        turn = self._by_thread.get(thread_id)
        if turn is not None and turn.journal is not None and turn.journal.path is not None:
            return attachment(turn.journal.subscribe(), turn.turn_id)
        in_file = file_turn(events_at)
        if in_file is None:
            return None
        running = self.current_turn(thread_id) == in_file
        if not running and (cursor is None or cursor.turn != in_file):
            return None
        alive = lambda tid: self.current_turn(thread_id) == tid  # noqa: E731
        return attachment(follow_file(events_at, in_file, alive), in_file)

    @contextlib.contextmanager
    def idle(self, thread_id: str) -> Iterator[bool]:
        """Hold the thread if no turn runs on it in any worker of the host, without waiting:
        yields False when one runs (or another worker holds the thread). For finishing a turn
        whose process died (chat/recovery.py): while held, no turn starts on the thread."""
        if thread_id in self._by_thread:
            yield False
            return
        if self.lock_dir is None:
            yield True
            return
        with try_lock(self._path(thread_id, "lock")) as got:
            yield got and self._marker(thread_id) is None

    def forget(self, thread_id: str, turn_id: str) -> None:
        """Remove the markers a dead process left for its turn `turn_id` (with the thread held)."""
        if self.lock_dir is None:
            return
        for suffix in ("turn", "cancel"):
            path = self._path(thread_id, suffix)
            data = read_json_object(path)
            if data is not None and data.get("turn_id") == turn_id:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    # -- cancel ----------------------------------------------------------------
    async def cancel(self, thread_id: str) -> bool:
        """Cancel the running turn of a thread (in this worker or another); waits until it has
        recorded its state."""
        turn = self._by_thread.get(thread_id)
        if turn is not None:
            if turn.task is None or turn.task.done():
                return False
            turn.task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(turn.task), timeout=CANCEL_WAIT_S)
            except (asyncio.CancelledError, asyncio.TimeoutError):
                pass
            return True
        if self.lock_dir is None:
            return False
        marker = self._marker(thread_id)
        if marker is None:
            return False
        turn_id = marker.get("turn_id")
        write_json(self._path(thread_id, "cancel"), {"turn_id": turn_id, "requested": time.time()}, sync=False)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            now = self._marker(thread_id)
            if now is None or now.get("turn_id") != turn_id:
                break
            await asyncio.sleep(0.02)
        return True

    async def _watch_cancels(self) -> None:
        """Cancel local turns for which another worker left a cancel request."""
        while self._by_thread:
            await asyncio.sleep(CANCEL_POLL_S)
            for turn in list(self._by_thread.values()):
                if turn.task is None or turn.task.done() or not turn.locks:
                    continue
                path = self._path(turn.thread_id, "cancel")
                if not path.exists():
                    continue
                data = read_json_object(path)
                if data is not None and data.get("turn_id") == turn.turn_id:
                    log.info("turn %s cancelled from another worker", turn.turn_id)
                    turn.task.cancel()

    @contextlib.asynccontextmanager
    async def exclusive(self, thread_id: str, wait_s: float = EXCLUSIVE_WAIT_S,
                        deleting: bool = False) -> AsyncIterator[None]:
        """For clear and delete: cancel the thread's running turn wherever it runs, then hold the
        thread so that no turn starts until the block ends (TurnConflict if it stays busy).
        `deleting`: the thread is gone afterwards, so its lock file goes too."""
        await self.cancel(thread_id)
        if self.lock_dir is None:
            yield
            return
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        tlock = file_lock(self._path(thread_id, "lock"))
        if not await acquire_async(tlock, wait_s, poll_s=0.02):
            raise TurnConflict(f"a turn is still running on thread {thread_id}; try again in a moment")
        try:
            yield
            if deleting:
                for suffix in ("lock", "turn", "cancel"):
                    with contextlib.suppress(FileNotFoundError):
                        self._path(thread_id, suffix).unlink()
        finally:
            tlock.release()

    async def cancel_all(self) -> None:
        for tid in list(self._by_thread):
            await self.cancel(tid)
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
