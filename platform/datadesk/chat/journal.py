"""The events of a thread's current turn, kept so that any client can re-attach (DESIGN section 4).

Every event of a turn gets an id `<turn id>:<n>` (n = 1, 2, ...), sent as the SSE `id:`. Text
pieces of the answer (`add_text`) are coalesced: the pieces that arrive within COALESCE_S of the
first one become one `message.delta` event, added when that time is up or at once before any
other event (and at the end), so a client gets a few text events a second, not one per model
chunk, and their texts still add up to the answer exactly. The worker that runs the turn keeps them in memory for its own subscribers (`TurnJournal`) and
appends them to the thread's `events.jsonl` for the other workers (`follow_file`): a header
line naming the turn, then one line per event, except that a run of `message.delta` events is
written as one line holding its pieces (`parts`), flushed at the next other event or after
DELTA_FLUSH_S. The file is replaced when the thread's next turn starts; clear and delete
remove it. The header also names the writer (pid, its start time, host). A turn whose
process died leaves a file without `done`: chat/interrupted.py finishes the turn and ends
the file (`append_to_file`), so re-attached clients get its end.

Where the kept events go for the others is the turn's `EventSink` (store/interfaces/journal.py): by default
`FileSink`, the event file above; `FileEventJournal` is the embedded `EventJournal` around these
functions, and the cluster set's (cluster/journal.py) writes rows instead, with the same ids.

Bounds per turn: KEEP_BYTES of kept events (memory and file alike). Past PROGRESS_TEXT_BYTES
the printed text of `tool.progress` is no longer kept (live subscribers still get it); past
KEEP_BYTES only the events that end something are kept (ENDING). A subscriber that falls
MAX_BEHIND events behind is dropped: its stream ends without `done` and the client
re-attaches with its last event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import msgspec

from datadesk.chat.wakeups import sleep_to_grid
from datadesk.sandbox.ownership import this_worker
from datadesk.store.interfaces.journal import EventSink, JournalEvent, KeptTurn
from datadesk.store.jsonl import last_newline_end
from datadesk.store.files import write_all
from datadesk.store.tempnames import host_hash, temp_prefix

log = logging.getLogger(__name__)

IDLE_S = 15.0  # a stream that had nothing for this long yields None (the SSE layer sends a ping)
KEEP_BYTES = 8 * 1024 * 1024
PROGRESS_TEXT_BYTES = 2 * 1024 * 1024
MAX_BEHIND = 20_000
COALESCE_S = 0.05  # text pieces arriving within this long of the first become one event
DELTA_FLUSH_S = 0.25  # how long text pieces may wait before other workers can read them
FOLLOW_POLL_S = 0.1  # how often another worker looks for new lines
ENDING = frozenset({"tool.finished", "artifact.created", "message.completed", "error", "done"})
TAIL_BYTES = 1024  # a `done` line is far shorter: enough to tell whether a file's turn ended


@dataclass(frozen=True)
class Cursor:
    """Where a client stands: after event `n` of turn `turn` (None: whichever turn is current)."""

    turn: str | None
    n: int

    @classmethod
    def parse(cls, raw: str | None) -> "Cursor | None":
        """`<turn id>:<n>` (an SSE id) or a bare `<n>`; ValueError for anything else."""
        if raw is None or not raw.strip():
            return None
        turn, sep, n = raw.strip().rpartition(":")
        if not n.isdigit() or (sep and not turn):
            raise ValueError(f"not an event id: {raw[:80]!r} (expected '<turn id>:<n>' or '<n>')")
        return cls(turn or None, int(n))


FILE_SINK = object()  # TurnJournal's default sink: the event file at its path


def event_id(turn_id: str, n: int) -> str:
    return f"{turn_id}:{n}"


def fan_out(subscribers: set[asyncio.Queue[Any]], item: Any) -> None:
    """`item` to every subscriber's queue; one MAX_BEHIND items behind is dropped (its stream
    ends with None, without `done`; the client re-attaches with its last event id)."""
    for queue in list(subscribers):
        if queue.qsize() >= MAX_BEHIND:
            subscribers.discard(queue)
            queue.put_nowait(None)
        else:
            queue.put_nowait(item)


class TurnJournal:
    """The kept events of one running turn, in the worker that runs it (see the module doc).
    `sink`: where kept events go for the other workers or hosts (store/interfaces/journal.py); by default
    the event file `path` (None for both: only this worker's subscribers, no re-attach)."""

    def __init__(self, turn_id: str, path: Path | None, sink: EventSink | None | object = FILE_SINK) -> None:
        self.turn_id = turn_id
        self.path = path
        # others can follow it (re-attach): also when its event file could not be made
        self.followable = path is not None or sink not in (None, FILE_SINK)
        self.n = 0
        self.kept: list[JournalEvent] = []
        self.kept_bytes = 0
        self.dropped = 0  # events not kept (over the bound)
        self.done = False
        self._subscribers: set[asyncio.Queue[JournalEvent | None]] = set()
        self._text: list[str] = []  # text pieces not made an event yet (`add_text`)
        self._text_at: asyncio.TimerHandle | None = None
        if sink is FILE_SINK:
            sink = FileSink.create(turn_id, path) if path is not None else None
        self._sink: EventSink | None = sink  # type: ignore[assignment]

    def add_text(self, text: str) -> None:
        """A piece of the answer: one `message.delta` with the pieces of the next COALESCE_S."""
        if not text or self.done:
            return
        self._text.append(text)
        if self._text_at is None:
            try:
                self._text_at = asyncio.get_running_loop().call_later(COALESCE_S, self.flush_text)
            except RuntimeError:  # no event loop (a synchronous caller): no waiting
                self.flush_text()

    def flush_text(self) -> JournalEvent | None:
        """The text pieces waiting (`add_text`) as one `message.delta` event now, if any."""
        if self._text_at is not None:
            self._text_at.cancel()
            self._text_at = None
        if not self._text:
            return None
        text = self._text[0] if len(self._text) == 1 else "".join(self._text)
        self._text = []
        return self._add("message.delta", {"text": text})

    def add(self, type: str, data: dict[str, Any]) -> JournalEvent:
        """Event `type` now (after the text pieces waiting, which become their event first)."""
        self.flush_text()
        return self._add(type, data)

    def _add(self, type: str, data: dict[str, Any]) -> JournalEvent:
        self.n += 1
        ev = JournalEvent(self.n, type, data)
        fan_out(self._subscribers, ev)
        self._keep(ev)
        if type == "done":
            self.close()
        return ev

    def subscribe(self) -> AsyncIterator[JournalEvent | None]:
        """The kept events from the start of the turn, then the live ones, up to `done` (None
        after IDLE_S without any). Its `aclose()` unsubscribes, also before the first event."""
        backlog = list(self.kept)
        queue: asyncio.Queue[JournalEvent | None] = asyncio.Queue()
        if not self.done:
            self._subscribers.add(queue)
        leave = lambda: self._subscribers.discard(queue)  # noqa: E731
        return _Subscription(_drain(backlog, queue, self.done, leave), leave)

    def close(self) -> None:
        self.flush_text()
        self.done = True
        if self._sink is not None:
            self._sink.close()
        for queue in self._subscribers:
            queue.put_nowait(None)
        self._subscribers.clear()

    def _flush(self) -> None:
        """What was kept is readable by the other workers now."""
        if self._sink is not None:
            self._sink.flush()

    def _keep(self, event: JournalEvent) -> None:
        ev, size = kept_form(event, self.kept_bytes)
        if ev is None:
            self.dropped += 1
            return
        self.kept.append(ev)
        self.kept_bytes += size
        if self._sink is not None:
            self._sink.put(ev)


class FileSink:
    """The thread's event file as a turn's `EventSink`: a header line, then one line per
    event, a run of `message.delta` events as one line of `parts` (flushed at the next other
    event or after DELTA_FLUSH_S)."""

    def __init__(self, turn_id: str, path: Path, fd: int) -> None:
        self.turn_id, self.path = turn_id, path
        self._fd: int | None = fd
        self._pending: list[str] = []  # text pieces not written yet
        self._pending_from = 0
        self._flush_at: asyncio.TimerHandle | None = None
        self._lost = False  # a write failed: the file no longer tells the whole turn

    @classmethod
    def create(cls, turn_id: str, path: Path) -> "FileSink | None":
        try:
            # who writes it (host, pid and its start time): a finisher can tell a dead writer
            fd = _replace_file(path, {"turn": turn_id, "pid": os.getpid(), "pid_start": this_worker().pid_start,
                                      "host": host_hash(), "started": time.time()})
        except OSError as exc:  # the thread may be gone: the turn still streams to its clients
            log.warning("no event file for turn %s: %s", turn_id, exc)
            return None
        return cls(turn_id, path, fd)

    def put(self, ev: JournalEvent) -> None:
        if self._fd is None:
            return
        text = ev.data.get("text") if ev.type == "message.delta" and len(ev.data) == 1 else None
        if isinstance(text, str) and (not self._pending or self._pending_from + len(self._pending) == ev.n):
            if not self._pending:
                self._pending_from = ev.n
                self._flush_at = asyncio.get_running_loop().call_later(DELTA_FLUSH_S, self.flush)
            self._pending.append(text)
            return
        self.flush()
        self._write({"n": ev.n, "type": ev.type, "data": ev.data})

    def flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        if self._pending:
            parts, self._pending = self._pending, []
            self._write({"n": self._pending_from, "type": "message.delta", "parts": parts})

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._lost:
            # the file lacks events (a full disk), `done` among them: left in place it would make
            # this turn, which ended here, look cut off by a crash to whoever reads it next
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _write(self, line: dict[str, Any]) -> None:
        if self._fd is None:
            return
        size: int | None = None
        try:
            size = os.fstat(self._fd).st_size
            write_all(self._fd, msgspec.json.encode(line) + b"\n")
        except OSError as exc:  # a full disk: the part written goes, later events stay in memory only
            log.warning("event file of turn %s: %s", self.turn_id, exc)
            if size is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, size)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            self._lost = True


def kept_form(ev: JournalEvent, kept_bytes: int, size: Callable[[JournalEvent], int] | None = None
              ) -> tuple[JournalEvent | None, int]:
    """What is kept of `ev` for the clients that attach later, with `kept_bytes` kept before it
    (see the module doc), and its size (`size`, by default its JSON + 40); None: not kept."""
    measure = size or (lambda e: len(msgspec.json.encode(e.data)) + 40)
    n = measure(ev)
    if ev.type == "tool.progress" and kept_bytes + n > PROGRESS_TEXT_BYTES and \
            (ev.data.get("stdout") or ev.data.get("stderr")):
        ev = JournalEvent(ev.n, ev.type, {k: v for k, v in ev.data.items() if k not in ("stdout", "stderr")})
        n = measure(ev)
    if kept_bytes + n > KEEP_BYTES and ev.type not in ENDING:
        return None, 0
    return ev, n


class _Subscription:
    """A subscriber's events (`_drain`); `aclose()` leaves even before the first one was read."""

    def __init__(self, events: AsyncIterator[JournalEvent | None], leave: Callable[[], None]) -> None:
        self._events, self._leave = events, leave

    def __aiter__(self) -> "_Subscription":
        return self

    def __anext__(self) -> Any:
        return self._events.__anext__()

    async def aclose(self) -> None:
        self._leave()
        await self._events.aclose()  # type: ignore[attr-defined]


def _replace_file(path: Path, header: dict[str, Any]) -> int:
    """A new event file holding only `header`, put in place of the old one in one rename."""
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path.parent} does not exist")
    tmp = path.with_name(f"{temp_prefix(path.name)}tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        os.write(fd, msgspec.json.encode(header) + b"\n")
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return fd


async def _drain(backlog: list[JournalEvent], queue: asyncio.Queue[JournalEvent | None], done: bool,
                 leave: Callable[[], None]) -> AsyncIterator[JournalEvent | None]:
    try:
        for ev in backlog:
            yield ev
        if done:
            return
        while True:
            try:
                item = queue.get_nowait() if not queue.empty() else await asyncio.wait_for(queue.get(), IDLE_S)
            except asyncio.TimeoutError:
                yield None
                continue
            if item is None:  # the turn ended, or this subscriber fell too far behind
                return
            yield item
            if item.type == "done":
                return
    finally:
        leave()


# -- other workers: the event file -----------------------------------------------------
def file_turn(path: Path) -> str | None:
    """The turn whose events the file holds, or None."""
    try:
        with open(path, "rb") as fh:
            return _header_turn(fh.readline())
    except OSError:
        return None


def _header_turn(line: bytes) -> str | None:
    try:
        return str(msgspec.json.decode(line).get("turn") or "") or None
    except (msgspec.DecodeError, AttributeError):
        return None


def _decode(line: bytes) -> list[JournalEvent]:
    try:
        obj = msgspec.json.decode(line)
        n = int(obj["n"])
        if "parts" in obj:
            return [JournalEvent(n + i, "message.delta", {"text": str(t)}) for i, t in enumerate(obj["parts"])]
        return [JournalEvent(n, str(obj["type"]), dict(obj["data"]))]
    except (msgspec.DecodeError, KeyError, TypeError, ValueError):
        return []


EventFile = KeptTurn  # what a turn's event file holds (store/interfaces/journal.py)


def read_event_file(path: Path) -> KeptTurn | None:
    """The whole event file (at most KEEP_BYTES of events and its header), or None without one."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    lines = raw.split(b"\n")
    try:
        header = msgspec.json.decode(lines[0])
    except msgspec.DecodeError:
        return None
    if not isinstance(header, dict) or not header.get("turn"):
        return None
    # the last piece is b"" after a final newline, else a torn line: skipped either way
    events = [ev for line in lines[1:-1] if line.strip() for ev in _decode(line)]
    return KeptTurn(str(header["turn"]), header, events, raw.endswith(b"\n"))


def file_ended(path: Path) -> bool | None:
    """Whether the file's turn ended (its last line is `done`), reading only its tail; None
    without a file."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - TAIL_BYTES))
            tail = fh.read()
    except OSError:
        return None
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1] if tail.endswith(b"\n") else b""
    return any(ev.type == "done" for ev in _decode(last)) if last else False


def append_to_file(kept: KeptTurn, path: Path, events: list[tuple[str, dict[str, Any]]],
                   first_n: int) -> list[JournalEvent]:
    """Add `events` to the event file of a turn nobody writes any more (numbered from `first_n`),
    so that every client re-attaching to it gets its end. A torn last line (a write the crash
    cut short: no reader could use it) is cut away first, so every line of the file parses."""
    out = [JournalEvent(first_n + i, type_, data) for i, (type_, data) in enumerate(events)]
    lines = b"".join(msgspec.json.encode({"n": ev.n, "type": ev.type, "data": ev.data}) + b"\n" for ev in out)
    with open(path, "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if not kept.whole:
            fh.truncate(last_newline_end(fh, size))
        fh.seek(0, os.SEEK_END)
        fh.write(lines)
    return out


async def follow_file(path: Path, turn_id: str,
                      running: Callable[[str], bool]) -> AsyncIterator[JournalEvent | None]:
    """The events of turn `turn_id` from its file, from the start, following it while the turn
    runs (in another worker), up to `done` (None after IDLE_S without any). A turn whose worker
    died without `done` ends with an `error` and a `done` of status `error`."""
    try:
        fh = open(path, "rb")
    except OSError:
        return
    with fh:
        if _header_turn(fh.readline()) != turn_id:
            return
        buf = b""
        last = 0
        quiet_since = time.monotonic()
        while True:
            chunk = fh.read()
            if not chunk and not running(turn_id):
                chunk = fh.read()  # written just before the turn ended
                if not chunk:
                    yield JournalEvent(last + 1, "error", {"kind": "internal",
                                                           "message": "the worker running this turn stopped"})
                    yield JournalEvent(last + 2, "done", {"turn_id": turn_id, "status": "error"})
                    return
            if not chunk:
                if time.monotonic() - quiet_since >= IDLE_S:
                    quiet_since = time.monotonic()
                    yield None
                await sleep_to_grid(FOLLOW_POLL_S)  # with the loop monitor's wake-ups (chat/wakeups.py)
                continue
            quiet_since = time.monotonic()
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                for ev in _decode(line):
                    last = ev.n
                    yield ev
                    if ev.type == "done":
                        return


class FileEventJournal:
    """The embedded `EventJournal` (store/interfaces/journal.py): each thread's `events.jsonl` (`at`)."""

    def sink(self, thread_id: str, turn_id: str, at: Path | None) -> EventSink | None:
        return FileSink.create(turn_id, at) if at is not None else None

    def latest(self, thread_id: str, at: Path | None) -> str | None:
        return file_turn(at) if at is not None else None

    def follow(self, thread_id: str, turn_id: str, running: Callable[[str], bool], at: Path | None,
               after: int = 0) -> AsyncIterator[JournalEvent | None]:
        if at is None:
            raise ValueError(f"no event file given for thread {thread_id}")
        events = follow_file(at, turn_id, running)
        return events if not after else _after(events, after)

    def read(self, thread_id: str, at: Path | None) -> KeptTurn | None:
        return read_event_file(at) if at is not None else None

    def ended(self, thread_id: str, at: Path | None) -> bool | None:
        return file_ended(at) if at is not None else None

    def append_end(self, thread_id: str, kept: KeptTurn, events: list[tuple[str, dict[str, Any]]],
                   first_n: int, at: Path | None) -> list[JournalEvent]:
        if at is None:
            raise ValueError(f"no event file given for thread {thread_id}")
        return append_to_file(kept, at, events, first_n)

    def drop(self, thread_id: str, at: Path | None) -> None:
        if at is not None:
            with contextlib.suppress(FileNotFoundError):
                at.unlink()


async def _after(events: AsyncIterator[JournalEvent | None], after: int) -> AsyncIterator[JournalEvent | None]:
    """`events` without those numbered `after` or less (keep-alives pass)."""
    try:
        async for ev in events:
            if ev is None or ev.n > after:
                yield ev
    finally:
        await events.aclose()  # type: ignore[attr-defined]
