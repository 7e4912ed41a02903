"""Threads: the `Thread` owner of one thread's folder, and the store that finds a user's threads."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec
from filelock import FileLock

from datadesk.domain.ids import check_id, new_id
from datadesk.domain.records import ThreadMeta
from datadesk.store.interfaces.threads import (MANIFESTS, REFRESH, REPORT, SCHEDULE, SUMMARY,
                                    SUMMARY_REVISIONS, SUMMARY_STATUS, TASK_STATE, RecordLog, ThreadNotFound,
                                    TooManyThreads, check_document, check_line_set)
from datadesk.store.files import read_json, write_atomic, write_json
from datadesk.store.layout import Layout
from datadesk.store.search import indexed_append, indexed_reset
from datadesk.domain.records import Record
from datadesk.store.jsonl import lines_from_end
from datadesk.store.threadlog import FileAndThreadLock, LogClosed, ThreadLog

__all__ = ["LogClosed", "Thread", "ThreadNotFound", "ThreadStore", "TooManyThreads"]

log = logging.getLogger(__name__)

META_FILE = "meta.json"
LOCK_FILE = "thread.lock"
# the file of each per-thread document and line set (store/interfaces/threads.py names them)
DOC_FILES = {SUMMARY: "summary.json", SUMMARY_STATUS: "summary.status.json", TASK_STATE: "task_state.json",
             REFRESH: "refresh.json", SCHEDULE: "schedule.json", REPORT: "report.json",
             SUMMARY_REVISIONS: "summary.revisions.jsonl", MANIFESTS: "context.jsonl"}


class ThreadReads:
    """What a thread (store/interfaces/threads.py `Thread`) derives from its own `meta`, `log`,
    `dir` and `current_epoch`, the same in both sets: the record reads, the folders of what this
    host keeps, the job locks and `cleared_since`. The embedded `Thread` below and the cluster
    `PgThread` (cluster/threads.py) are both one."""

    meta: ThreadMeta | None
    log: RecordLog
    dir: Path

    def current_epoch(self) -> int | None:
        raise NotImplementedError

    @property
    def workspace(self) -> str:
        assert self.meta is not None, "a bare thread folder has no workspace"
        return self.meta.workspace

    @property
    def epoch(self) -> int | None:
        """The epoch this object was opened in (None for a bare folder: writes are unguarded)."""
        return self.meta.epoch if self.meta is not None else None

    # -- what this host keeps of the thread ------------------------------------------
    @property
    def artifacts_dir(self) -> Path:
        return self.dir / "artifacts"

    @property
    def outputs_dir(self) -> Path:
        return self.dir / "outputs"

    @property
    def events_path(self) -> Path:
        """The events of the thread's current turn (chat/journal.py), for re-attaching."""
        return self.dir / "events.jsonl"

    def job_lock(self, name: str) -> FileLock:
        """`<name>.lock` in `dir`: one background job of that kind per thread across this host's
        processes (cluster: another host may run one too; the guarded writes keep the outcome right)."""
        return FileLock(str(self.dir / f"{check_id(name, 'lock')}.lock"))

    def cleared_since(self, epoch: int | None) -> bool:
        """Whether the thread was cleared (or deleted) since work that started in `epoch`."""
        return epoch is not None and self.current_epoch() != epoch

    # -- the records, read (the log's own reads) ------------------------------------
    def tail(self, n: int) -> list[Record]:
        return self.log.tail(n)

    def since(self, first_seq: int, last_seq: int | None = None) -> list[Record]:
        return self.log.since(first_seq, last_seq)

    def newest_first(self) -> Iterator[Record]:
        return self.log.newest_first()

    def find(self, predicate: Callable[[Record], bool], limit: int = 1) -> list[Record]:
        return self.log.find(predicate, limit)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.log)


def new_thread_meta(tid: str, workspace: str, owner: str, title: str, project: str | None, now: float) -> ThreadMeta:
    """The meta of a thread being created (the title cut to 200 characters; an empty one: "New chat")."""
    return ThreadMeta(id=tid, workspace=workspace, owner=owner, title=title[:200] or "New chat",
                      created=now, updated=now, project=project)


def thread_limit_reached(count: int, workspace: str, limit: int) -> TooManyThreads:
    """The error of a create past `limits.max_threads_per_user` (`count` threads there already)."""
    return TooManyThreads(f"thread limit reached: {count} threads in workspace {workspace}, at most {limit} "
                          "per user (limits.max_threads_per_user); delete threads you no longer need")


class Thread(ThreadReads):
    """One thread and its folder: the only owner of its paths, its lock and its epoch.

    Everything stored per thread (DESIGN section 3) is reached through here: the log, the
    meta, the summary files, the context manifests, the artifacts and outputs folders. A
    write that must not survive a clear runs under `guarded(epoch)`: the thread lock, and
    the epoch still the one the work started in (LogClosed otherwise).
    """

    def __init__(self, dir: Path, meta: ThreadMeta | None = None, fsync: str = "turn") -> None:
        """`fsync` (store.fsync): when the log reaches the disk itself, not only the page cache:
        "record" (every append), "turn" (`end_turn`), "never" (the kernel's own write-back)."""
        self.dir = Path(dir)
        self.meta = meta  # as last read or written by this object; None for a bare folder
        self.fsync = fsync
        self._lock = FileAndThreadLock(self.dir / LOCK_FILE)
        self.log = ThreadLog(self.dir / "log.jsonl", lock=self._lock, epoch_of=self.current_epoch,
                             fsync=fsync == "record")

    def __repr__(self) -> str:
        return f"Thread({self.dir.name!r})"

    @classmethod
    def at(cls, dir: Path, fsync: str = "turn") -> "Thread":
        """The thread in folder `dir` (its meta read when there is one)."""
        raw = read_json(Path(dir) / META_FILE)
        return cls(Path(dir), msgspec.convert(raw, ThreadMeta) if raw is not None else None, fsync)

    def end_turn(self) -> None:
        """A turn is over: with store.fsync = "turn", its records reach the disk now."""
        if self.fsync == "turn":
            self.log.sync()

    @property
    def id(self) -> str:
        return self.meta.id if self.meta is not None else self.dir.name

    # -- where things live ---------------------------------------------------
    # the files behind the documents and line sets (read_doc, lines, ...): for this set's own
    # code and its tests; everything else goes through the methods
    @property
    def summary_path(self) -> Path:
        return self.dir / DOC_FILES[SUMMARY]

    @property
    def summary_revisions_path(self) -> Path:
        return self.dir / DOC_FILES[SUMMARY_REVISIONS]

    @property
    def summary_status_path(self) -> Path:
        """How the last summary refresh went (summary.status): ok, or failed with the reason."""
        return self.dir / DOC_FILES[SUMMARY_STATUS]

    @property
    def task_state_path(self) -> Path:
        """The user's goal and standing constraints (context.taskstate), independent of the summary."""
        return self.dir / DOC_FILES[TASK_STATE]

    @property
    def manifests_path(self) -> Path:
        return self.dir / DOC_FILES[MANIFESTS]

    def exists(self) -> bool:
        return self.dir.is_dir()

    # -- the lock and the epoch -------------------------------------------------
    def lock(self) -> FileAndThreadLock:
        """The thread lock (threads and processes): appends, guarded writes and clear hold it."""
        return self._lock

    def current_epoch(self) -> int | None:
        """The epoch on disk now (a clear bumps it), or None without a meta file."""
        try:
            return int(msgspec.json.decode((self.dir / META_FILE).read_bytes()).get("epoch", 0))
        except (FileNotFoundError, msgspec.DecodeError, AttributeError, ValueError, TypeError):
            return None

    @contextlib.contextmanager
    def guarded(self, epoch: int | None) -> Iterator[None]:
        """Hold the thread lock while the thread is still in `epoch` (None: no epoch check);
        LogClosed when it was deleted or cleared since the work started."""
        # checked before taking the lock too: the lock file would recreate the directory
        if not self.exists():
            raise LogClosed(f"thread {self.id} no longer exists")
        with self._lock:
            if self.cleared_since(epoch):
                raise LogClosed(f"thread {self.id} was cleared")
            yield

    def append(self, make: Callable[[int], Record], epoch: int | None = None,
               fence: int | None = None) -> Record:
        """Append `make(next_seq)` to the log, refused (LogClosed) when cleared since `epoch`;
        the search index (store/search.py) takes the record too. `fence` is not checked here:
        the turn's file lock already makes its worker the thread's one writer."""
        record = self.log.append(make, epoch=epoch)
        indexed_append(self, record)
        return record

    # -- documents and line sets (store/interfaces/threads.py) -------------------------------
    def read_doc(self, name: str) -> bytes | None:
        """The bytes of `<name>.json`, or None when there is none."""
        try:
            return (self.dir / DOC_FILES[check_document(name)]).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_doc(self, name: str, value: Any, epoch: int | None) -> bool:
        """Replace `<name>.json` atomically under the guard; False when cleared or gone."""
        path = self.dir / DOC_FILES[check_document(name)]
        try:
            with self.guarded(epoch):
                write_json(path, value)
        except LogClosed:
            return False
        return True

    def update_doc(self, name: str, change: Callable[[bytes | None], Any], epoch: int | None) -> Any:
        """Read, change and replace `<name>.json` under the guard (see store/interfaces/threads.py)."""
        path = self.dir / DOC_FILES[check_document(name)]
        with self.guarded(epoch):
            value = change(self.read_doc(name))
            if value is not None:
                write_json(path, value)
            return value

    def append_line(self, name: str, line: bytes, epoch: int | None, keep: int | None = None) -> bool:
        """Append one line to `<name>.jsonl` under the guard. With `keep`, the file is rewritten
        atomically with its newest `keep` lines (0: removed); without, the line is appended (the
        manifests: the file is their whole history). False when cleared or gone."""
        path = self.dir / DOC_FILES[check_line_set(name)]
        try:
            with self.guarded(epoch):
                if keep is None:
                    with open(path, "ab") as fh:
                        fh.write(line.rstrip(b"\n") + b"\n")
                elif keep <= 0:
                    path.unlink(missing_ok=True)
                else:
                    kept = (list(self.lines(name)) + [line.rstrip(b"\n")])[-keep:]
                    write_atomic(path, b"\n".join(kept) + b"\n")
        except LogClosed:
            return False
        return True

    def lines(self, name: str, newest_first: bool = False) -> Iterator[bytes]:
        """The non-blank lines of `<name>.jsonl`; newest first reads from the end of the file."""
        path = self.dir / DOC_FILES[check_line_set(name)]
        if newest_first:
            return lines_from_end(path)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return iter(())
        return iter([line for line in data.split(b"\n") if line.strip()])

    def append_manifest(self, line: bytes, epoch: int | None) -> bool:
        """Append one manifest line (`context.jsonl`); False when the thread was cleared or is gone."""
        return self.append_line(MANIFESTS, line, epoch)

    def manifest_lines(self) -> Iterator[bytes]:
        """Manifest lines, newest first, read from the end."""
        return self.lines(MANIFESTS, newest_first=True)

    def rewrite_summaries(self, transform: Callable[[Any], Any]) -> int:
        """Rewrite the summary, its revisions and the task state (which takes in summaries'
        constraints) under the thread lock: `transform` maps each decoded JSON document (or the
        text of an unreadable one) to its new value. Memory's hard delete redacts summaries this
        way. Returns how many files changed."""
        with self._lock:
            return (_rewrite_json_file(self.summary_path, transform)
                    + _rewrite_jsonl_file(self.summary_revisions_path, transform)
                    + _rewrite_json_file(self.task_state_path, transform))

    # -- meta --------------------------------------------------------------------
    def reload(self) -> ThreadMeta:
        raw = read_json(self.dir / META_FILE)
        if raw is None:
            raise ThreadNotFound(f"thread {self.id} not found")
        self.meta = msgspec.convert(raw, ThreadMeta)
        return self.meta

    def write_meta(self, meta: ThreadMeta) -> ThreadMeta:
        write_json(self.dir / META_FILE, meta)
        self.meta = meta
        return meta


def _rewrite_json_file(path: Path, transform: Callable[[Any], Any]) -> int:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        log.warning("%s is not JSON: rewriting it as text", path)
        text = raw.decode("utf-8", "replace")
        new = transform(text)
        if new == text:
            return 0
        write_atomic(path, new.encode("utf-8"))
        return 1
    new_doc = transform(doc)
    if new_doc == doc:
        return 0
    write_json(path, new_doc)
    return 1


def _rewrite_jsonl_file(path: Path, transform: Callable[[Any], Any]) -> int:
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return 0
    out: list[bytes] = []
    for line in lines:
        if not line.strip():
            out.append(line)
            continue
        try:
            obj = msgspec.json.decode(line)
            new = transform(obj)
            out.append(line if new == obj else msgspec.json.encode(new))
        except msgspec.DecodeError:  # a torn line: rewritten as text
            out.append(transform(line.decode("utf-8", "replace")).encode("utf-8"))
    if out == lines:
        return 0
    write_atomic(path, b"\n".join(out))
    return 1


class ThreadStore:
    """Create, find, list and delete a user's threads across their workspaces."""

    def __init__(self, layout: Layout, max_threads_per_user: int = 0, fsync: str = "turn") -> None:
        self.layout = layout
        self.max_threads_per_user = max_threads_per_user  # per workspace; 0: no limit
        self.fsync = fsync  # store.fsync, handed to every Thread this store opens
        self._create_lock = threading.Lock()

    def create(self, workspace: str, owner: str, title: str = "New chat", project: str | None = None) -> Thread:
        check_id(workspace, "workspace")
        check_id(owner, "user")
        with self._create_lock:  # count and create as one step (within this process)
            self._check_count(workspace, owner)
            return self._create(workspace, owner, title, project)

    def _check_count(self, workspace: str, owner: str) -> None:
        limit = self.max_threads_per_user
        root = self.layout.threads_dir(workspace, owner)
        if limit <= 0 or not root.is_dir():
            return
        with os.scandir(root) as entries:
            count = sum(1 for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
        if count >= limit:
            raise thread_limit_reached(count, workspace, limit)

    def _create(self, workspace: str, owner: str, title: str, project: str | None) -> Thread:
        # 64 random bits: collisions are astronomically unlikely, and checked anyway
        for _ in range(5):
            tid = new_id("t")
            tdir = self.layout.thread_dir(workspace, owner, tid)
            if not tdir.exists():
                break
        else:  # pragma: no cover
            raise RuntimeError("could not allocate a thread id")
        now = time.time()
        meta = new_thread_meta(tid, workspace, owner, title, project, now)
        tdir.mkdir(parents=True)
        thread = Thread(tdir, fsync=self.fsync)
        thread.write_meta(meta)
        return thread

    def get(self, tid: str, owner: str, workspaces: list[str]) -> Thread:
        """Find thread `tid` of `owner` in one of `workspaces`, else ThreadNotFound."""
        check_id(tid, "thread")
        for ws in workspaces:
            thread = Thread.at(self.layout.thread_dir(ws, owner, tid), self.fsync)
            meta = thread.meta
            if meta is not None and meta.owner == owner and meta.id == tid:
                return thread
        raise ThreadNotFound(f"thread {tid} not found")

    def empty_chat(self, workspace: str, owner: str) -> Thread | None:
        """The owner's most recent untitled chat with nothing in it (no record, no upload), to be
        reused by "+ New chat" instead of leaving another empty one behind."""
        found: list[tuple[float, Thread]] = []
        for folder in self.folders(workspace, owner):
            thread = Thread.at(folder.dir, self.fsync)
            meta = thread.meta
            if meta is None or meta.title != "New chat" or meta.project is not None:
                continue
            log = thread.dir / "log.jsonl"
            if not log.exists() or log.stat().st_size == 0:
                found.append((meta.updated, thread))
        return max(found, key=lambda f: f[0])[1] if found else None

    def folders(self, workspace: str, owner: str) -> Iterator[Thread]:
        """Every thread folder of `owner` in `workspace` (links and deleted ones skipped)."""
        root = self.layout.threads_dir(workspace, owner)
        if not root.is_dir():
            return
        for tdir in sorted(root.iterdir()):
            if tdir.name.startswith(".") or tdir.is_symlink() or not tdir.is_dir():
                continue
            check_id(tdir.name, "thread")
            yield Thread(tdir, fsync=self.fsync)

    def list(self, owner: str, workspaces: list[str]) -> list[ThreadMeta]:
        metas: list[ThreadMeta] = []
        for ws in workspaces:
            try:  # scandir: the entry's type comes with the listing (no stat per thread, no symlinks)
                with os.scandir(self.layout.threads_dir(ws, owner)) as entries:
                    dirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
            except (FileNotFoundError, NotADirectoryError):
                continue
            for tdir in dirs:
                try:
                    with open(os.path.join(tdir, META_FILE), "rb") as fh:
                        data = fh.read()
                except FileNotFoundError:
                    continue  # being created or deleted
                metas.append(msgspec.json.decode(data, type=ThreadMeta))
        metas.sort(key=lambda m: m.updated, reverse=True)
        return metas

    def touch(self, thread: Thread, title: str | None = None) -> ThreadMeta:
        """Update `updated` (and the title) of a thread, atomically."""
        meta = thread.reload()
        return thread.write_meta(msgspec.structs.replace(meta, updated=time.time(), title=title or meta.title))

    def clear(self, thread: Thread) -> dict[str, int]:
        """Clear chat, one operation under the thread lock: bump the epoch (appends of anything
        started before are refused), then delete the log, summary and revisions, manifests,
        artifacts and outputs. Memory is not touched. Returns what was removed."""
        removed = {"records": 0, "artifacts": 0, "bytes": 0}
        with thread.lock():
            meta = thread.reload()
            thread.write_meta(msgspec.structs.replace(meta, epoch=meta.epoch + 1, updated=time.time()))
            removed["records"] = sum(1 for _ in thread.log)
            for path in (thread.log.path, thread.log.path.with_name("log.torn"), thread.summary_path,
                         thread.summary_revisions_path, thread.manifests_path, thread.events_path,
                         thread.summary_status_path, thread.task_state_path,
                         thread.dir / DOC_FILES[REFRESH], thread.dir / DOC_FILES[SCHEDULE],
                         thread.dir / DOC_FILES[REPORT]):
                if path.is_file():
                    removed["bytes"] += path.stat().st_size
                    path.unlink()
            for d in (thread.artifacts_dir, thread.outputs_dir):
                if d.is_dir() and not d.is_symlink():
                    for p in d.rglob("*"):
                        if p.is_file() and not p.is_symlink():
                            removed["bytes"] += p.stat().st_size
                            if d == thread.artifacts_dir and p.suffix == ".json":
                                removed["artifacts"] += 1
                    shutil.rmtree(d, ignore_errors=True)
        indexed_reset(thread, drop=False)
        return removed

    def delete(self, thread: Thread) -> None:
        """Remove a thread: rename it away first so no reader sees half of it."""
        trash = thread.dir.with_name(f".deleted-{thread.id}-{new_id()}")
        thread.dir.rename(trash)
        indexed_reset(thread, drop=True)
        shutil.rmtree(trash, ignore_errors=True)
