"""Artifacts: their metadata, their data files and what the quotas count (SCALE.md 5.2, 5.4).

Two implementations of `Artifacts`: `offload/artifacts/store.py ArtifactStore` (the embedded
set: `<aid>.json` beside the data in the thread folder, the SQLite ledger for the quotas) and
`cluster/objects/artifacts.py PgArtifactStore` (rows of the `artifacts` table, data in the object store,
totals by SQL). Both hand callers a local `Path` for an artifact's data (`data_path`: the file
itself, or the host's read-through cache of its object) and take new data as a file written
into `thread.artifacts_dir` (a per-host scratch folder in the cluster set) before `save`.

The quota (`offload/artifacts/quota.py`) runs on either through `QuotaLedger` (totals, the
least recently used, claims inside one serialized transaction) and `SweepLock` (one sweep at a
time: a file lock per home, or an advisory lock per cluster). Value types shared by both live
here: `ThreadKey`, `Row`, `Totals`, `Victim`, `Drift`, `scope_of`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Iterable, Iterator, NamedTuple, Protocol, runtime_checkable

from datadesk.domain.artifacts import Artifact, ArtifactOrigin


class ArtifactNotFound(LookupError):
    """No such artifact for this user (another user's artifact is also 'not found')."""


class SweepBusy(Exception):
    """Another worker or host is running the artifact sweep right now."""


class ThreadKey(NamedTuple):
    """A thread as the ledger names it: workspace, user (its folder's name) and thread id."""

    workspace: str
    user: str
    thread: str

    @property
    def path(self) -> str:
        return f"{self.workspace}/{self.user}/{self.thread}"

    @classmethod
    def parse(cls, path: str) -> "ThreadKey":
        ws, user, tid = path.split("/")
        return cls(ws, user, tid)


class Row(NamedTuple):
    """What one artifact counts: (thread, aid, user, live, stored, deliverable, last_used, created)."""

    thread: str
    aid: str
    user: str
    live: int
    stored: int
    deliverable: int
    last_used: float
    created: float

    @property
    def counts(self) -> bool:
        """False for a dead row (the artifact expired, was discarded, or its thread cleared)."""
        return bool(self.live or self.deliverable)

    @classmethod
    def of(cls, key: ThreadKey, art: Artifact) -> "Row | None":
        """The row of `art`, or None when it counts against no quota (a tombstone)."""
        if not art.available:
            return None
        live = int(art.is_cache)
        deliv = art.bytes if art.kind == "deliverable" else 0
        return cls(key.path, art.id, key.user, live, art.stored_bytes, deliv, art.last_used, art.created)


class Totals(NamedTuple):
    count: int = 0  # live cache artifacts
    bytes: int = 0  # their stored bytes (data and kept originals)
    deliverable: int = 0  # bytes of kept deliverables


class Victim(NamedTuple):
    """A claimed artifact (its row is gone): the quota expires its files next."""

    thread: str
    aid: str
    user: str
    stored: int


@dataclass
class Drift:
    """What a reconcile found different from the files."""

    missing: int = 0  # a file without its row (a crash between the two, or a file restored by hand)
    stale: int = 0  # a row without its file (deleted outside the app, a user removed)
    changed: int = 0  # a row that says something else than its file
    totals: int = 0  # totals that did not sum their rows
    examples: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.missing + self.stale + self.changed


def scope_of(key: ThreadKey | None = None, user: str | None = None) -> str:
    """The totals key of a thread, a user, or (neither) the host (the cluster set: all hosts)."""
    if key is not None:
        return f"t:{key.path}"
    return f"u:{user}" if user is not None else "*"


class QuotaView(Protocol):
    """The ledger inside one serialized write transaction."""

    def totals(self, scope: str) -> Totals: ...

    def over(self, kind: str, max_count: int, max_bytes: int) -> list[str]: ...

    def oldest_use(self) -> float | None: ...

    def biggest_user(self, other_than: str | None) -> str | None: ...

    def lru(self, scope: str, protect: set[str], limit: int = 64,
            used_before: float | None = None) -> list[Victim]: ...

    def drop_thread(self, thread: str) -> int: ...

    def claim(self, victim: Victim) -> bool: ...


class QuotaLedger(Protocol):
    """What the quotas count; `errors` are the exceptions it raises when it fails (the quota
    then logs and leaves the limits to the next sweep, never failing a write)."""

    errors: tuple[type[BaseException], ...]
    opens: int

    def transaction(self) -> ContextManager[QuotaView]: ...

    def read(self, scopes: Iterable[str]) -> tuple[dict[str, Totals], float | None]: ...

    def built(self) -> bool: ...

    def reconcile(self, rows: Iterable[Row], started_ns: int) -> Drift: ...


class SweepLock(Protocol):
    """One artifact sweep at a time (per home, or per cluster) and when the last one ran."""

    def acquire(self, timeout: float = -1) -> ContextManager[Any]:
        """Held while the context runs; filelock.Timeout or SweepBusy when not got in time."""
        ...

    def last_swept(self) -> float | None: ...

    def mark_swept(self) -> None: ...


@runtime_checkable
class Artifacts(Protocol):
    """Artifact metadata and data per thread (`thread`: the `Thread` it belongs to)."""

    ledger: QuotaLedger

    def save(self, thread: Any, art: Artifact, epoch: int | None = None) -> None:
        """Publish `art` (its data file already in `thread.artifacts_dir`); with `epoch`, refused
        (LogClosed, the data removed) when the thread was cleared since."""
        ...

    def save_bytes(self, thread: Any, data: bytes, ext: str, kind: str, media_type: str,
                   origin: ArtifactOrigin, epoch: int | None = None) -> Artifact: ...

    def discard(self, thread: Any, art: Artifact) -> None: ...

    def load(self, thread: Any, aid: str) -> Artifact: ...

    def data_path(self, thread: Any, art: Artifact) -> Path: ...

    def original_paths(self, thread: Any, art: Artifact) -> list[Path]: ...

    def original_path(self, thread: Any, art: Artifact) -> Path:
        """A local file holding an upload's kept original (it may not exist)."""
        ...

    def kept_original(self, thread: Any, art: Artifact) -> None:
        """The original `art.original` was just moved into `thread.artifacts_dir`: keep it."""
        ...

    def kernel_files(self, thread: Any) -> Path:
        """A local folder holding the data files of the thread's available artifacts (what a
        kernel on this host links into its /data)."""
        ...

    def kernel_handoff(self, thread: Any, ttl_s: int = 300) -> Any:
        """The thread's files as any kernel gets them (`store.interfaces.kernelfiles.KernelFiles`):
        the local folder, or presigned URLs valid for `ttl_s` seconds where there is a store."""
        ...

    def list(self, thread: Any) -> list[Artifact]: ...

    def touch(self, thread: Any, aids: list[str]) -> None: ...

    def expire(self, thread: Any, aid: str, status: str = "expired") -> Artifact | None: ...

    def expire_at(self, key: ThreadKey, aid: str) -> Artifact | None: ...

    def find(self, aid: str, owner: str, workspaces: list[str]) -> tuple[Any, Artifact]: ...

    def walk(self) -> Iterator[tuple[str, str, Any, Artifact]]: ...

    def forget_thread(self, thread: Any) -> None: ...

    def counted_rows(self) -> Iterator[Row]: ...

    def has_artifact(self, key: ThreadKey, aid: str) -> bool: ...

    def has_thread(self, key: ThreadKey) -> bool: ...

    def sweep_lock(self) -> SweepLock: ...
