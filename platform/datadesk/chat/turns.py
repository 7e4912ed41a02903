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

The cross-process part is a `TurnDirectory` (store/interfaces/turns.py), the events go to an
`EventJournal` (store/interfaces/journal.py), both chosen at construction: by default the files above
(`FileTurnDirectory`, `chat.journal.FileEventJournal`); the cluster set passes PostgreSQL
ones (cluster/turns.py, cluster/journal.py), with which all of this holds across hosts.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Coroutine, Iterable, Iterator

import msgspec
from filelock import Timeout

from datadesk.chat.journal import Cursor, FileEventJournal, JournalEvent, TurnJournal
from datadesk.domain.events import EventPayload, MessageDelta
from datadesk.domain.ids import check_id, new_id
from datadesk.sandbox.ownership import acquire_async, file_lock, pid_alive, this_worker, try_lock
from datadesk.store.interfaces.journal import EventJournal
from datadesk.store.interfaces.turns import Claim, TooManyTurns, TurnConflict, TurnDirectory, TurnInfo, conflict, too_many
from datadesk.store.files import read_json_object, write_json
from datadesk.store.tempnames import host_hash
from datadesk.telemetry import turn_context

__all__ = ["Attachment", "FileTurnDirectory", "RunningTurn", "TooManyTurns", "TurnConflict", "TurnRegistry"]

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.1  # how often a worker looks for cancel requests of its running turns
CANCEL_WAIT_S = 10.0  # how long a cancel waits for the turn to record its state and end
EXCLUSIVE_WAIT_S = 30.0  # how long clear/delete wait for the thread to be free


@dataclass
class RunningTurn:
    """A turn in flight: its task and the journal of the events it produces."""

    turn_id: str
    thread_id: str
    user_id: str
    task: asyncio.Task[None] | None = None
    background: bool = True  # False: the client that started it cancels it by leaving
    claim: Claim | None = None  # its hold on the thread in the directory (cross-process)
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

    @property
    def fence(self) -> int | None:
        """The thread's claim number of this turn (store/interfaces/turns.py), None without a directory."""
        return self.claim.fence if self.claim is not None else None


@dataclass
class Attachment:
    """A client's view of a turn: every kept event from its start, and how many it has seen."""

    events: AsyncIterator[JournalEvent | None]  # None: nothing for a while (a keep-alive)
    turn_id: str
    seen: int


class FileTurnDirectory:
    """The embedded `TurnDirectory`: the lock and marker files of the module doc in `lock_dir`.
    Liveness is the holder's pid (one host), so there are no leases to renew; the fence is the
    claim's time in ns, which grows from one claim of a thread to the next on the host."""

    def __init__(self, lock_dir: Path) -> None:
        self.lock_dir = Path(lock_dir)

    def _path(self, thread_id: str, suffix: str) -> Path:
        return self.lock_dir / f"t-{check_id(thread_id, 'thread')}.{suffix}"

    def _slot(self, user_id: str, i: int) -> Path:
        # named by a hash: a deleted user's name stays nowhere on disk
        digest = hashlib.sha256(check_id(user_id, "user").encode()).hexdigest()[:20]
        return self.lock_dir / f"u-{digest}-{i}.lock"

    def _marker(self, thread_id: str) -> dict[str, Any] | None:
        """The marker of the thread's running turn in a live process of this host, or None."""
        data = read_json_object(self._path(thread_id, "turn"))
        if data is None or not pid_alive(data.get("pid"), data.get("pid_start")):
            return None
        return data

    def claim(self, thread_id: str, user_id: str, turn_id: str, *, limit: int, events: bool = False) -> Claim:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        tlock = file_lock(self._path(thread_id, "lock"))
        try:
            tlock.acquire(timeout=0)
        except Timeout:
            raise conflict(thread_id) from None
        slot = None
        for i in range(max(1, limit)):
            candidate = file_lock(self._slot(user_id, i))
            try:
                candidate.acquire(timeout=0)
            except Timeout:
                continue
            slot = candidate
            break
        if slot is None:
            tlock.release()
            raise too_many(limit)
        return Claim(thread_id, turn_id, user_id, time.time_ns(), events, handle=[tlock, slot])

    def announce(self, claim: Claim) -> None:
        # after the journal: a turn that runs has its event file
        write_json(self._path(claim.thread_id, "turn"), {
            "turn_id": claim.turn_id, "pid": os.getpid(), "pid_start": this_worker().pid_start,
            "started": time.time(), "events": claim.events, "fence": claim.fence}, sync=False)

    def current(self, thread_id: str) -> TurnInfo | None:
        m = self._marker(thread_id)
        if m is None:
            return None
        return TurnInfo(thread_id, str(m["turn_id"]), None, f"{host_hash()}:{m.get('pid')}",
                        int(m.get("fence") or 0), bool(m.get("events")))

    def running_threads(self) -> set[str] | None:
        try:
            names = os.listdir(self.lock_dir)
        except OSError:
            return None  # then each status reads its own marker
        return {n[2:-5] for n in names if n.startswith("t-") and n.endswith(".turn")}

    def request_cancel(self, thread_id: str, turn_id: str) -> bool:
        marker = self._marker(thread_id)
        if marker is None or marker.get("turn_id") != turn_id:
            return False
        write_json(self._path(thread_id, "cancel"), {"turn_id": turn_id, "requested": time.time()}, sync=False)
        return True

    async def cancel_requests(self, mine: Callable[[], Iterable[Claim]]) -> AsyncIterator[Claim]:
        while list(mine()):
            await asyncio.sleep(CANCEL_POLL_S)
            for claim in list(mine()):
                path = self._path(claim.thread_id, "cancel")
                if not path.exists():
                    continue
                data = read_json_object(path)
                if data is not None and data.get("turn_id") == claim.turn_id:
                    yield claim

    def renew(self, claim: Claim) -> bool:
        return not claim.lost  # no lease: the lock lives as long as the process

    def release(self, claim: Claim) -> None:
        self.forget(claim.thread_id, claim.turn_id)
        locks, claim.handle = claim.handle or [], None
        for lock in reversed(locks):
            lock.release()

    def expired(self) -> list[TurnInfo]:
        out = []
        for tid in sorted(self.running_threads() or ()):
            data = read_json_object(self._path(tid, "turn"))
            if data is not None and not pid_alive(data.get("pid"), data.get("pid_start")):
                out.append(TurnInfo(tid, str(data.get("turn_id")), None, f"{host_hash()}:{data.get('pid')}",
                                    int(data.get("fence") or 0), bool(data.get("events"))))
        return out

    @contextlib.contextmanager
    def hold(self, thread_id: str) -> Iterator[bool]:
        with try_lock(self._path(thread_id, "lock")) as got:
            yield got and self._marker(thread_id) is None

    @contextlib.asynccontextmanager
    async def hold_wait(self, thread_id: str, wait_s: float, deleting: bool = False) -> AsyncIterator[None]:
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

    def forget(self, thread_id: str, turn_id: str) -> None:
        for suffix in ("turn", "cancel"):
            path = self._path(thread_id, suffix)
            data = read_json_object(path)
            if data is not None and data.get("turn_id") == turn_id:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def close(self) -> None:
        pass


class TurnRegistry:
    """Who is running what: enforces one turn per thread and N per user (see the module docstring).
    The turns of this process are kept here; the others are known through `directory`."""

    def __init__(self, max_per_user: int, lock_dir: Path | None = None,
                 before_turn: Callable[[Path], None] | None = None, *,
                 directory: TurnDirectory | None = None, journal: EventJournal | None = None) -> None:
        """`before_turn(events_at)`: called with the thread held, before a chat turn replaces the
        thread's event file (chat/recovery.py: a previous turn cut off by a crash is finished first).
        `directory`: the cross-process part (default: the files in `lock_dir`; neither: this
        process only); `journal`: where the events go (default: the thread's event file)."""
        self.max_per_user = max_per_user
        self.lock_dir = Path(lock_dir) if lock_dir is not None else None
        self.before_turn = before_turn
        self.directory: TurnDirectory | None = directory if directory is not None else (
            FileTurnDirectory(self.lock_dir) if self.lock_dir is not None else None)
        self.journal: EventJournal = journal if journal is not None else FileEventJournal()
        self._by_thread: dict[str, RunningTurn] = {}
        self._watcher: asyncio.Task[None] | None = None

    # -- reserve / release ---------------------------------------------------
    def reserve(self, thread_id: str, user_id: str, events_at: Path | None = None) -> RunningTurn:
        """Take the thread and a slot of the user (TurnConflict, TooManyTurns). `events_at`: the
        thread's event file, for a chat turn (re-attach); replaced only once the turn has the thread."""
        if thread_id in self._by_thread:
            raise conflict(thread_id)
        mine = sum(1 for t in self._by_thread.values() if t.user_id == user_id)
        if mine >= self.max_per_user:
            raise too_many(self.max_per_user, mine)
        turn = RunningTurn(turn_id=new_id("turn"), thread_id=thread_id, user_id=user_id)
        if self.directory is None:
            if events_at is not None:
                self._open_journal(turn, events_at)
        else:
            claim = self.directory.claim(thread_id, user_id, turn.turn_id, limit=self.max_per_user,
                                         events=events_at is not None)
            try:
                if events_at is not None:
                    self._open_journal(turn, events_at)
                self.directory.announce(claim)
            except BaseException:
                self.directory.release(claim)
                raise
            turn.claim = claim
        self._by_thread[thread_id] = turn
        if self.directory is not None and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.get_running_loop().create_task(self._watch_cancels(), name="turn-cancel-watch")
        return turn

    def _open_journal(self, turn: RunningTurn, events_at: Path) -> None:
        self._before_turn(events_at)
        sink = self.journal.sink(turn.thread_id, turn.turn_id, events_at)
        # the turn stays followable even without a sink (as with an event file it could not make)
        turn.journal = TurnJournal(turn.turn_id, events_at, sink)

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
        claim, turn.claim = turn.claim, None
        if claim is None:
            return
        if turn.journal is not None and not turn.journal.done:
            turn.journal.close()  # before the claim goes: a follower that sees it gone reads the end
        assert self.directory is not None
        self.directory.release(claim)

    def launch(self, turn: RunningTurn, work: Coroutine[Any, Any, None], kind: str) -> RunningTurn:
        """Run `work` as the reserved `turn`'s task (a turn, a user step, a refresh): every log
        line names the turn (api/logs.py), and the thread is released when it ends."""
        async def runner() -> None:
            with turn_context(turn.turn_id, turn.thread_id):
                try:
                    await work
                finally:
                    self.release(turn)

        turn.task = asyncio.create_task(runner(), name=f"{kind}-{turn.turn_id}")
        return turn

    def get(self, thread_id: str) -> RunningTurn | None:
        return self._by_thread.get(thread_id)

    def running(self, thread_id: str) -> bool:
        """Whether a turn runs on the thread in this worker or another one (or another host)."""
        if thread_id in self._by_thread:
            return True
        return self.directory is not None and self.directory.current(thread_id) is not None

    def current_turn(self, thread_id: str) -> str | None:
        """The id of the chat turn (one with events) running on the thread anywhere, or None."""
        return self.status(thread_id)[1]

    def status(self, thread_id: str, markers: set[str] | None = None) -> tuple[bool, str | None]:
        """`(running(), current_turn())` with one look at the directory. `markers`: the threads
        that may run a turn (`marker_names`), so a thread not among them costs no read."""
        turn = self._by_thread.get(thread_id)
        if turn is not None:
            return True, turn.turn_id if turn.journal is not None and turn.journal.followable else None
        if self.directory is None or (markers is not None and thread_id not in markers):
            return False, None
        info = self.directory.current(thread_id)
        if info is None:
            return False, None
        return True, info.turn_id if info.events else None

    def marker_names(self) -> set[str] | None:
        """The threads that may run a turn now, in one look (for many `status` calls)."""
        return self.directory.running_threads() if self.directory is not None else None

    def attach(self, thread_id: str, events_at: Path, cursor: Cursor | None) -> Attachment | None:
        """The events of the thread's current turn, from its start; None when there is nothing to
        attach to: no turn runs and the cursor names no turn whose events are still kept."""
        def attachment(events: AsyncIterator[JournalEvent | None], tid: str) -> Attachment:
            seen = cursor.n if cursor is not None and cursor.turn in (None, tid) else 0
            return Attachment(events, tid, seen)

        turn = self._by_thread.get(thread_id)
        if turn is not None and turn.journal is not None and turn.journal.followable:
            return attachment(turn.journal.subscribe(), turn.turn_id)
        kept = self.journal.latest(thread_id, events_at)
        if kept is None:
            return None
        running = self.current_turn(thread_id) == kept
        if not running and (cursor is None or cursor.turn != kept):
            return None
        alive = lambda tid: self.current_turn(thread_id) == tid  # noqa: E731
        return attachment(self.journal.follow(thread_id, kept, alive, events_at), kept)

    @contextlib.contextmanager
    def idle(self, thread_id: str) -> Iterator[bool]:
        """Hold the thread if no turn runs on it anywhere, without waiting: yields False when one
        runs (or another worker holds the thread). For finishing a turn whose process died
        (chat/recovery.py): while held, no turn starts on the thread."""
        if thread_id in self._by_thread:
            yield False
            return
        if self.directory is None:
            yield True
            return
        with self.directory.hold(thread_id) as got:
            yield got

    def forget(self, thread_id: str, turn_id: str) -> None:
        """Remove what a dead process left of its turn `turn_id` (with the thread held)."""
        if self.directory is not None:
            self.directory.forget(thread_id, turn_id)

    # -- cancel ----------------------------------------------------------------
    async def cancel(self, thread_id: str) -> bool:
        """Cancel the running turn of a thread (in this worker or another, or another host);
        waits until it has recorded its state."""
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
        if self.directory is None:
            return False
        info = self.directory.current(thread_id)
        if info is None:
            return False
        self.directory.request_cancel(thread_id, info.turn_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            now = self.directory.current(thread_id)
            if now is None or now.turn_id != info.turn_id:
                break
            await asyncio.sleep(0.02)
        return True

    async def _watch_cancels(self) -> None:
        """Cancel local turns for which another process left a cancel request (or whose claim
        was lost: another one took the thread over)."""
        assert self.directory is not None
        async for claim in self.directory.cancel_requests(lambda: [t.claim for t in self._by_thread.values()
                                                                   if t.claim is not None]):
            turn = self._by_thread.get(claim.thread_id)
            if turn is None or turn.claim is not claim or turn.task is None or turn.task.done():
                continue
            if claim.lost:
                log.warning("turn %s lost its hold on thread %s: stopped", claim.turn_id, claim.thread_id)
            else:
                log.info("turn %s cancelled from another worker", claim.turn_id)
            turn.task.cancel()

    @contextlib.asynccontextmanager
    async def exclusive(self, thread_id: str, wait_s: float = EXCLUSIVE_WAIT_S,
                        deleting: bool = False) -> AsyncIterator[None]:
        """For clear and delete: cancel the thread's running turn wherever it runs, then hold the
        thread so that no turn starts until the block ends (TurnConflict if it stays busy).
        `deleting`: the thread is gone afterwards, so what the directory keeps of it goes too."""
        await self.cancel(thread_id)
        if self.directory is None:
            yield
            return
        async with self.directory.hold_wait(thread_id, wait_s, deleting):
            yield

    def close(self) -> None:
        """Let go of what the directory and the journal hold (connections, the writer thread),
        after `cancel_all`, at shutdown."""
        for part in (self.directory, self.journal):
            close = getattr(part, "close", None)
            if close is not None:
                close()

    async def cancel_all(self) -> None:
        for tid in list(self._by_thread):
            await self.cancel(tid)
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
