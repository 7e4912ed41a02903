"""The events of a thread's current turn, kept where any worker (embedded) or any host
(cluster) can follow them and re-attach (DESIGN section 4).

The process running a turn numbers its events (`chat.journal.TurnJournal`: ids
`<turn>:<n>`, text pieces coalesced) and serves its own subscribers from memory; every event
it keeps also goes to the turn's `EventSink`, where the others read it:

- embedded (`chat.journal.FileEventJournal`): the thread's `events.jsonl`, polled by
  `follow_file`;
- cluster (`cluster.journal.PgEventJournal`): rows of `turn_events` written in batches,
  read by `n > cursor`; a `NOTIFY` wakes the followers, a 1 s poll covers a missed one.

A thread keeps the events of its latest turn only: `open` drops the previous turn's.
`read`/`append_end` let a finisher end a turn whose process died (chat/interrupted.py), so
clients that re-attach get its end; `drop` goes with clear and delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol, runtime_checkable


@dataclass(frozen=True)
class JournalEvent:
    """One event of a turn: its number in the turn, SSE name and JSON payload."""

    n: int
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class KeptTurn:
    """What a journal holds of a thread's latest turn: its header (turn, pid, pid_start, host,
    started), every event kept (a torn last line skipped) and whether it ends whole."""

    turn_id: str
    header: dict[str, Any]
    events: list[JournalEvent]
    whole: bool

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1].type == "done"

    @property
    def last_n(self) -> int:
        return self.events[-1].n if self.events else 0


@runtime_checkable
class EventSink(Protocol):
    """Where a running turn's kept events go for the other processes, in order."""

    def put(self, event: JournalEvent) -> None:
        ...

    def flush(self) -> None:
        """What was put is readable by the others now (or being written, for the cluster)."""
        ...

    def close(self) -> None:
        """The turn ended: everything put is written."""
        ...


@runtime_checkable
class EventJournal(Protocol):
    """Opens a running turn's sink and reads turns run elsewhere. `at` is the thread's event
    file for the embedded set (the cluster set keys by thread id and ignores it)."""

    def sink(self, thread_id: str, turn_id: str, at: Path | None) -> EventSink | None:
        """A sink for a new turn, replacing the thread's kept events (None: it could not be
        made; the turn still streams to this process's clients)."""
        ...

    def latest(self, thread_id: str, at: Path | None) -> str | None:
        """The turn whose events are kept for the thread, or None."""
        ...

    def follow(self, thread_id: str, turn_id: str, running: Callable[[str], bool], at: Path | None,
               after: int = 0) -> AsyncIterator[JournalEvent | None]:
        """The events of turn `turn_id` after number `after`, following while `running(turn_id)`,
        up to `done` (None after a quiet while: a keep-alive). A turn whose process died
        without `done` ends with an `error` and a `done` of status `error`."""
        ...

    def read(self, thread_id: str, at: Path | None) -> KeptTurn | None:
        ...

    def ended(self, thread_id: str, at: Path | None) -> bool | None:
        """Whether the kept turn ended (None: nothing kept)."""
        ...

    def append_end(self, thread_id: str, kept: KeptTurn, events: list[tuple[str, dict[str, Any]]],
                   first_n: int, at: Path | None) -> list[JournalEvent]:
        """Add `events` (numbered from `first_n`) to a turn nobody writes any more."""
        ...

    def drop(self, thread_id: str, at: Path | None) -> None:
        """Forget the thread's kept events (clear, delete)."""
        ...
