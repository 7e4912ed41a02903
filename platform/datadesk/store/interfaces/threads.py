"""Threads, their records and their per-thread documents (issue 28; SCALE.md section 5.2).

A `ThreadStore` creates, finds, lists, clears and deletes a user's threads. A `Thread` owns
everything stored for one thread:

- its **records** (`append`, `tail`, `since`, `newest_first`, `find`, iteration): seqs are
  contiguous per epoch and never duplicated, also with several writers (processes or hosts);
- its **meta** (`ThreadMeta`: title, `updated`, project, epoch);
- its **documents**, JSON values by name (`read_doc`, `write_doc`, `update_doc`): the summary,
  the summary status, the task state;
- its **line sets**, append-only JSON lines by name with a bound (`append_line`, `lines`):
  the summary revisions, the context manifests.

**Epochs.** A clear bumps the epoch. Every write takes the epoch the work started in and is
refused when the thread was cleared (or deleted) since: `append` raises `LogClosed`, the
document and line writes return False. `guarded(epoch)` holds the thread (its lock, or its
row) while still in `epoch`; writes of the same thread inside it join it, so a read, a check
and several writes are one step that a clear cannot come between.

**Fences.** An append may carry the running turn's fence (`TurnFenced` when that turn no
longer holds the thread: another host took it over). The embedded set has one writer per
thread through its file locks and ignores the fence; the cluster set checks it in the
append's own transaction.

Exceptions: `LogClosed` (cleared or deleted; `TurnFenced` is one), `ThreadNotFound`,
`TooManyThreads`, `UnknownDocument` (a document or line-set name that is not one of the names
below).

Implementations: `store/threads.py` (embedded: a folder per thread, today's files) and
`cluster/threads.py` (PostgreSQL rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Protocol, runtime_checkable

from datadesk.domain.records import Record, ThreadMeta

# documents: one JSON value each (summary.json, summary.status.json, task_state.json)
SUMMARY = "summary"
SUMMARY_STATUS = "summary.status"
TASK_STATE = "task_state"
REFRESH = "refresh"  # the last refresh of the thread and its comparison (threads/refresh.py)
SCHEDULE = "schedule"  # when the thread refreshes itself (threads/schedule.py)
REPORT = "report"  # the report page: its title and pinned items (threads/report/pins.py)
DOCUMENTS = frozenset({SUMMARY, SUMMARY_STATUS, TASK_STATE, REFRESH, SCHEDULE, REPORT})

# line sets: append-only JSON lines (summary.revisions.jsonl, context.jsonl)
SUMMARY_REVISIONS = "summary.revisions"
MANIFESTS = "context"
LINE_SETS = frozenset({SUMMARY_REVISIONS, MANIFESTS})


class LogClosed(Exception):
    """The thread was deleted or cleared while something tried to write to it."""


class TurnFenced(LogClosed):
    """The turn that tried to write no longer holds the thread (its fence is gone: another
    host took the thread over after this one's lease ran out)."""


class TooManyThreads(Exception):
    """The user holds `limits.max_threads_per_user` threads in this workspace already (API: 429)."""


class ThreadNotFound(LookupError):
    """No such thread for this user (another user's thread is also 'not found')."""


class UnknownDocument(ValueError):
    """A per-thread document or line-set name that is not one of `DOCUMENTS` / `LINE_SETS`."""


def check_document(name: str) -> str:
    """`name` when it names a per-thread document, else UnknownDocument."""
    if name not in DOCUMENTS:
        raise UnknownDocument(f"no thread document {name!r} (known: {', '.join(sorted(DOCUMENTS))})")
    return name


def check_line_set(name: str) -> str:
    """`name` when it names a per-thread line set, else UnknownDocument."""
    if name not in LINE_SETS:
        raise UnknownDocument(f"no thread line set {name!r} (known: {', '.join(sorted(LINE_SETS))})")
    return name


@runtime_checkable
class RecordLog(Protocol):
    """The records of a thread, read without loading the whole log."""

    def tail(self, n: int) -> list[Record]:
        """The newest `n` records, oldest first."""
        ...

    def since(self, first_seq: int, last_seq: int | None = None) -> list[Record]:
        """Records with first_seq <= seq (<= last_seq), oldest first."""
        ...

    def newest_first(self) -> Iterator[Record]:
        """Every record, newest first (stop early to pay less)."""
        ...

    def find(self, predicate: Callable[[Record], bool], limit: int = 1) -> list[Record]:
        """Up to `limit` records matching `predicate`, newest first."""
        ...

    def __iter__(self) -> Iterator[Record]:
        """Every record, oldest first (streamed)."""
        ...


@runtime_checkable
class Thread(RecordLog, Protocol):
    """One thread: the only owner of its records, meta, documents and epoch (module doc)."""

    meta: ThreadMeta | None  # as last read or written by this object

    @property
    def id(self) -> str: ...

    @property
    def workspace(self) -> str: ...

    @property
    def epoch(self) -> int | None:
        """The epoch this object was opened in (None: a bare embedded folder, unguarded)."""
        ...

    @property
    def log(self) -> RecordLog:
        """The records (the same reads as the thread's own `tail`, `since`, ...)."""
        ...

    @property
    def dir(self) -> Path:
        """A folder for what this host keeps of the thread (artifacts and outputs being made,
        the embedded event journal). Embedded: the thread's real folder. Cluster: a per-host
        scratch folder; nothing durable may live only there."""
        ...

    @property
    def artifacts_dir(self) -> Path: ...

    @property
    def outputs_dir(self) -> Path: ...

    @property
    def events_path(self) -> Path: ...

    def exists(self) -> bool: ...

    # -- records ------------------------------------------------------------------
    def append(self, make: Callable[[int], Record], epoch: int | None = None,
               fence: int | None = None) -> Record:
        """Append `make(next_seq)`; LogClosed when cleared since `epoch`, TurnFenced when the
        turn holding `fence` no longer holds the thread (cluster)."""
        ...

    def end_turn(self) -> None:
        """A turn is over: its records are made durable now where the set defers that."""
        ...

    # -- epoch --------------------------------------------------------------------
    def current_epoch(self) -> int | None:
        """The stored epoch now (None when the thread is gone)."""
        ...

    def cleared_since(self, epoch: int | None) -> bool: ...

    def guarded(self, epoch: int | None) -> ContextManager[None]:
        """Hold the thread while it is still in `epoch` (LogClosed otherwise); this thread's
        writes inside join the hold."""
        ...

    def job_lock(self, name: str) -> Any:
        """A `filelock.FileLock`-like lock for one background job of a kind per thread (cluster:
        per host only, until the lock service replaces it)."""
        ...

    # -- meta ---------------------------------------------------------------------
    def reload(self) -> ThreadMeta:
        """The stored meta (ThreadNotFound when the thread is gone)."""
        ...

    def write_meta(self, meta: ThreadMeta) -> ThreadMeta: ...

    # -- documents and line sets --------------------------------------------------
    def read_doc(self, name: str) -> bytes | None:
        """The JSON of document `name`, or None when there is none (callers decode it)."""
        ...

    def write_doc(self, name: str, value: Any, epoch: int | None) -> bool:
        """Replace document `name` with `value` (msgspec-encodable); False when cleared since
        `epoch` or gone."""
        ...

    def update_doc(self, name: str, change: Callable[[bytes | None], Any], epoch: int | None) -> Any:
        """Read-modify-write of document `name` while holding the thread: `change(current JSON or
        None)` returns the new value (None: leave it). Returns that value; LogClosed when cleared
        since `epoch`; an exception from `change` writes nothing."""
        ...

    def append_line(self, name: str, line: bytes, epoch: int | None, keep: int | None = None) -> bool:
        """Append one JSON line to line set `name`, keeping only its newest `keep` lines (None:
        the set's own retention); False when cleared since `epoch` or gone."""
        ...

    def lines(self, name: str, newest_first: bool = False) -> Iterator[bytes]:
        """The lines of line set `name`, oldest first (or newest first, read lazily)."""
        ...

    def rewrite_summaries(self, transform: Callable[[Any], Any]) -> int:
        """Rewrite the summary, its revisions and the task state while holding the thread:
        `transform` maps each decoded JSON value (or the text of an unreadable one) to its new
        value (memory's hard delete redacts this way). Returns how many documents changed."""
        ...


@runtime_checkable
class RecordIndexer(Protocol):
    """What a thread store tells the search index (store/interfaces/search.py defines the full one): a
    record committed, a thread cleared (`drop=False`) or deleted (`drop=True`)."""

    def indexed_append(self, thread: Any, record: Record) -> None: ...

    def indexed_reset(self, thread: Any, drop: bool) -> None: ...


@runtime_checkable
class ThreadStore(Protocol):
    """A user's threads across their workspaces."""

    max_threads_per_user: int

    def create(self, workspace: str, owner: str, title: str = "New chat", project: str | None = None) -> Thread:
        """A new thread; TooManyThreads past `max_threads_per_user` in that workspace."""
        ...

    def get(self, tid: str, owner: str, workspaces: list[str]) -> Thread:
        """Thread `tid` of `owner` in one of `workspaces`, else ThreadNotFound."""
        ...

    def empty_chat(self, workspace: str, owner: str) -> Thread | None:
        """The owner's most recent untitled, unlabelled thread without records, if any."""
        ...

    def folders(self, workspace: str, owner: str) -> Iterator[Thread]:
        """Every thread of `owner` in `workspace`."""
        ...

    def list(self, owner: str, workspaces: list[str]) -> list[ThreadMeta]:
        """The metas of the owner's threads in `workspaces`, most recently updated first."""
        ...

    def touch(self, thread: Thread, title: str | None = None) -> ThreadMeta:
        """Set `updated` to now (and the title)."""
        ...

    def clear(self, thread: Thread) -> dict[str, int]:
        """Bump the epoch and delete the records, documents and line sets as one step; returns
        counts of what was removed (`records`, `artifacts`, `bytes`)."""
        ...

    def delete(self, thread: Thread) -> None:
        """Remove the thread and everything stored for it."""
        ...
