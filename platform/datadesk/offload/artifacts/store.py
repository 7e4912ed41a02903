"""Artifact files and their metadata, per thread (`threads/<tid>/artifacts/`).

Every call names the `Thread` whose artifacts it reads or writes; its folder comes from
the thread, and an epoch-guarded write runs under `thread.guarded(epoch)`.
Data files are written by the caller to a temp name and renamed in; the
metadata `<aid>.json` is written atomically after the data. Nothing here
follows links: artifact files are opened only when they are regular files.
Every metadata write (and a discard, a clear, a delete) also updates the artifact ledger
(`ledger.py`), what the quotas count, after the file: never instead of it, and a ledger
error never fails the write (the periodic sweep corrects the ledger from the files).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Callable, Iterator

import msgspec
from filelock import FileLock

from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.ids import check_id, new_id
from datadesk.offload.artifacts.ledger import LEDGER_FILE, ArtifactLedger, Row, ThreadKey
from datadesk.store.interfaces.artifacts import ArtifactNotFound  # noqa: F401 (its home was here)
from datadesk.store.interfaces.kernelfiles import LocalKernelFiles
from datadesk.store.files import read_json, write_atomic, write_json
from datadesk.store.layout import Layout
from datadesk.store.threadlog import LogClosed
from datadesk.store.threads import Thread

log = logging.getLogger(__name__)


def new_artifact_id() -> str:
    return new_id("a")


def write_artifact_file(folder: Path, data: bytes, ext: str, kind: str, media_type: str,
                        origin: ArtifactOrigin) -> Artifact:
    """`data` written atomically as `<new id>.<ext>` in `folder` (a thread's artifacts folder),
    and the Artifact that describes it, for the caller's store to save. A JSON file is written as
    `<new id>.data.json`: `<id>.json` is the artifact's metadata, which would overwrite it."""
    aid = new_artifact_id()
    path = folder / data_file_name(aid, ext)
    write_atomic(path, data)
    now = time.time()
    return Artifact(id=aid, kind=kind, format="jpeg" if ext == "jpg" else ext, file=path.name,
                    origin=origin, created=now, last_used=now, bytes=len(data),
                    sha256=hashlib.sha256(data).hexdigest(), media_type=media_type)


def data_file_name(aid: str, ext: str) -> str:
    """The name of an artifact's data file: never `<aid>.json`, the name of its metadata."""
    return f"{aid}.data.json" if ext.lower() == "json" else f"{aid}.{ext}"


def is_metadata_name(name: str) -> bool:
    """`<aid>.json` (an artifact's metadata), not a data file such as `<aid>.data.json`."""
    stem, dot, ext = name.partition(".")
    return bool(dot) and ext == "json" and bool(stem)


def regular_file(path: Path) -> bool:
    """True only for a regular file that is not a symlink (never follow links)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


class SweepLock(FileLock):
    """The sweep's lock of one home (`.artifact-sweep.lock`) and when it last ran (the mtime of
    `.artifact-sweep.last` beside it)."""

    @property
    def marker(self) -> Path:
        return Path(self.lock_file).with_name(".artifact-sweep.last")

    def last_swept(self) -> float | None:
        try:
            return self.marker.stat().st_mtime
        except FileNotFoundError:
            return None

    def mark_swept(self) -> None:
        self.marker.touch()


class ArtifactStore:
    """Reads and writes artifact metadata; finds a user's artifact by id (the embedded
    `store.interfaces.artifacts.Artifacts`)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.ledger = ArtifactLedger(layout.home / LEDGER_FILE)  # opened on first use

    # -- the ledger ----------------------------------------------------------------
    def thread_key(self, thread: Thread) -> ThreadKey | None:
        """How the ledger names `thread` (None for a folder outside `workspaces/<ws>/users/<uid>/threads/`,
        which no quota counts: the sweep's walk does not see it either)."""
        root = self.layout.workspaces_dir
        try:
            parts = thread.dir.relative_to(root).parts
        except ValueError:
            try:
                parts = thread.dir.resolve().relative_to(root).parts
            except (ValueError, OSError):
                return None
        if len(parts) != 5 or parts[1] != "users" or parts[3] != "threads":
            return None
        return ThreadKey(parts[0], parts[2], parts[4])

    def _ledger_write(self, thread: Thread, what: str, write: Callable[[ThreadKey], object]) -> None:
        """Update the ledger for `thread`; an error is logged (the next sweep corrects it)."""
        key = self.thread_key(thread)
        if key is None:
            return
        try:
            write(key)
        except (sqlite3.Error, OSError) as exc:
            log.warning("artifact ledger not updated for %s in %s (%s); the next sweep corrects it",
                        what, thread.dir, exc)

    def forget_thread(self, thread: Thread) -> None:
        """The thread was cleared or deleted: what it held no longer counts."""
        self._ledger_write(thread, "a cleared thread", self.ledger.forget_thread)

    def sweep_lock(self) -> SweepLock:
        return SweepLock(str(self.layout.home / ".artifact-sweep.lock"))

    def has_artifact(self, key: ThreadKey, aid: str) -> bool:
        """Whether the metadata file of `aid` is there (a ledger row may outlive it)."""
        return regular_file(self._key_dir(key) / "artifacts" / f"{aid}.json")

    def has_thread(self, key: ThreadKey) -> bool:
        return self._key_dir(key).is_dir()

    def expire_at(self, key: ThreadKey, aid: str) -> Artifact | None:
        """`expire` of the thread the ledger names `key`."""
        return self.expire(Thread(self._key_dir(key)), aid)

    def _key_dir(self, key: ThreadKey) -> Path:
        return self.layout.thread_dir(key.workspace, key.user, key.thread)

    def counted_rows(self) -> Iterator[Row]:
        """What the ledger should hold, read from every metadata file on this host (the sweep)."""
        for ws, user, thread, art in self.walk():
            row = Row.of(ThreadKey(ws, user, thread.dir.name), art)
            if row is not None:
                yield row

    # -- per thread ------------------------------------------------------------
    def lock(self, thread: Thread) -> FileLock:
        """The lock of the thread's artifact metadata (touch and expire read-modify-write under it)."""
        d = thread.artifacts_dir
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / ".lock"))

    def save(self, thread: Thread, art: Artifact, epoch: int | None = None) -> None:
        """Write the metadata. With `epoch`, under `thread.guarded(epoch)`: when the thread was
        cleared since the work started, the data file is removed and LogClosed raised, so nothing
        from before a clear survives it."""
        check_id(art.id, "artifact")
        meta = thread.artifacts_dir / f"{art.id}.json"
        if epoch is None:
            write_json(meta, art)
            self._ledger_write(thread, art.id, lambda key: self.ledger.record(key, art))
            return
        try:
            with thread.guarded(epoch):  # the row too: a clear cannot come between the file and it
                write_json(meta, art)
                self._ledger_write(thread, art.id, lambda key: self.ledger.record(key, art))
        except LogClosed:
            try:
                (thread.artifacts_dir / art.file).unlink()
            except FileNotFoundError:
                pass
            raise

    def save_bytes(self, thread: Thread, data: bytes, ext: str, kind: str, media_type: str,
                   origin: ArtifactOrigin, epoch: int | None = None) -> Artifact:
        """A new artifact holding `data` as `<aid>.<ext>` (charts, files, tool images)."""
        art = write_artifact_file(thread.artifacts_dir, data, ext, kind, media_type, origin)
        self.save(thread, art, epoch)
        return art

    def discard(self, thread: Thread, art: Artifact) -> None:
        """Remove an artifact entirely, data and metadata (one a cancelled call published)."""
        with self.lock(thread):
            for path in (self.data_path(thread, art), thread.artifacts_dir / f"{art.id}.json",
                         *self.original_paths(thread, art)):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            self._ledger_write(thread, art.id, lambda key: self.ledger.forget(key, art.id))

    def load(self, thread: Thread, aid: str) -> Artifact:
        check_id(aid, "artifact")
        path = thread.artifacts_dir / f"{aid}.json"
        if not regular_file(path):
            raise ArtifactNotFound(f"artifact {aid} not found in this thread")
        return msgspec.convert(read_json(path), Artifact)

    def data_path(self, thread: Thread, art: Artifact) -> Path:
        return thread.artifacts_dir / art.file

    @staticmethod
    def original_name(aid: str, ext: str) -> str:
        """The name of an upload's kept original beside its data (`<aid>.original-<ext>`: no data
        suffix, so it is not linked into the sandbox's /data with the artifacts)."""
        return f"{aid}.original-{ext}"

    def original_paths(self, thread: Thread, art: Artifact) -> list[Path]:
        """The kept original of an upload: the one its metadata names, and any of its name
        (one moved in before the metadata that names it was written)."""
        found = {thread.artifacts_dir / art.original} if art.original else set()
        if art.kind == "upload":  # only an upload keeps one (no listing of a large folder for the rest)
            found.update(thread.artifacts_dir.glob(self.original_name(art.id, "*")))
        return [p for p in found if p.parent == thread.artifacts_dir]

    def original_path(self, thread: Thread, art: Artifact) -> Path:
        """Where an upload's kept original is (it may be missing)."""
        return thread.artifacts_dir / (art.original or self.original_name(art.id, "csv"))

    def kept_original(self, thread: Thread, art: Artifact) -> None:
        """The original is in place beside the data: nothing more to do here (it is the file)."""

    def kernel_files(self, thread: Thread) -> Path:
        """The folder a kernel's /data is linked from: the artifacts folder itself."""
        return thread.artifacts_dir

    def kernel_handoff(self, thread: Thread, ttl_s: int = 300) -> LocalKernelFiles:
        """The thread's files as a kernel gets them (store/interfaces/kernelfiles.py): local only."""
        return LocalKernelFiles(thread.artifacts_dir)

    def list(self, thread: Thread) -> list[Artifact]:
        d = thread.artifacts_dir
        if not d.is_dir():
            return []
        out = []
        for p in d.glob("*.json"):
            if is_metadata_name(p.name) and regular_file(p):
                try:
                    out.append(msgspec.convert(read_json(p), Artifact))
                except (msgspec.ValidationError, msgspec.DecodeError):
                    log.warning("unreadable artifact metadata %s", p)
        out.sort(key=lambda a: a.created)
        return out

    def touch(self, thread: Thread, aids: list[str]) -> None:
        """Mark artifacts as used now (LRU eviction keeps recently used data)."""
        now = time.time()
        with self.lock(thread):
            for aid in aids:
                try:
                    art = self.load(thread, aid)
                except (ArtifactNotFound, ValueError):
                    continue
                self.save(thread, msgspec.structs.replace(art, last_used=now))

    def expire(self, thread: Thread, aid: str, status: str = "expired") -> Artifact | None:
        """Delete the data file, keep the metadata as a tombstone. Under the artifacts lock."""
        with self.lock(thread):
            try:
                art = self.load(thread, aid)
            except ArtifactNotFound:
                return None
            if not art.available:
                return art
            for path in (self.data_path(thread, art), *self.original_paths(thread, art)):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            art = msgspec.structs.replace(art, status=status, expired_at=time.time())
            self.save(thread, art)
            return art

    # -- per user ----------------------------------------------------------------
    def find(self, aid: str, owner: str, workspaces: list[str]) -> tuple[Thread, Artifact]:
        """The thread and artifact `aid` of `owner`, searched across their threads."""
        check_id(aid, "artifact")
        for ws in workspaces:
            for thread in self._threads(self.layout.threads_dir(ws, owner)):
                if regular_file(thread.artifacts_dir / f"{aid}.json"):
                    return Thread.at(thread.dir), self.load(thread, aid)
        raise ArtifactNotFound(f"artifact {aid} not found")

    def walk(self) -> Iterator[tuple[str, str, Thread, Artifact]]:
        """Every artifact on this host: (workspace, user, thread, artifact)."""
        for ws, user, thread in self._all_threads():
            for art in self.list(thread):
                yield ws, user, thread, art

    def threads(self) -> Iterator[Thread]:
        """Every thread folder on this host (not deleted ones, not links)."""
        for _, _, thread in self._all_threads():
            yield thread

    def _all_threads(self) -> Iterator[tuple[str, str, Thread]]:
        root = self.layout.workspaces_dir
        if not root.is_dir():
            return
        for wsdir in root.iterdir():
            users = wsdir / "users"
            if not users.is_dir():
                continue
            for udir in users.iterdir():
                for thread in self._threads(udir / "threads"):
                    yield wsdir.name, udir.name, thread

    @staticmethod
    def _threads(root: Path) -> Iterator[Thread]:
        """The thread folders under a user's `threads/` (not deleted ones, not links)."""
        if not root.is_dir():
            return
        for tdir in root.iterdir():
            if not tdir.name.startswith(".") and tdir.is_dir() and not tdir.is_symlink():
                yield Thread(tdir)

