"""Artifact files and their metadata, per thread (`threads/<tid>/artifacts/`).

Data files are written by the caller to a temp name and renamed in; the
metadata `<aid>.json` is written atomically after the data. Nothing here
follows links: artifact files are opened only when they are regular files.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from pathlib import Path
from typing import Iterator

import msgspec
from filelock import FileLock

from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.ids import check_id, new_id
from datadesk.store.files import read_json, write_atomic, write_json
from datadesk.store.layout import Layout
from datadesk.store.threadlog import LogClosed, ThreadLog, current_epoch

log = logging.getLogger(__name__)


class ArtifactNotFound(LookupError):
    """No such artifact for this user (another user's artifact is also 'not found')."""


def artifacts_dir(thread_dir: Path) -> Path:
    return thread_dir / "artifacts"


def new_artifact_id() -> str:
    return new_id("a")


def regular_file(path: Path) -> bool:
    """True only for a regular file that is not a symlink (never follow links)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


class ArtifactStore:
    """Reads and writes artifact metadata; finds a user's artifact by id."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    # -- per thread ------------------------------------------------------------
    def lock(self, thread_dir: Path) -> FileLock:
        d = artifacts_dir(thread_dir)
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / ".lock"))

    def save(self, thread_dir: Path, art: Artifact, epoch: int | None = None) -> None:
        """Write the metadata. With `epoch`, under the thread lock: when the thread was cleared
        since the work started, the data file is removed and LogClosed raised, so nothing
        from before a clear survives it."""
        check_id(art.id, "artifact")
        if epoch is None:
            write_json(artifacts_dir(thread_dir) / f"{art.id}.json", art)
            return
        with ThreadLog(thread_dir / "log.jsonl").lock():
            if current_epoch(thread_dir) != epoch:
                try:
                    (artifacts_dir(thread_dir) / art.file).unlink()
                except FileNotFoundError:
                    pass
                raise LogClosed(f"thread {thread_dir.name} was cleared")
            write_json(artifacts_dir(thread_dir) / f"{art.id}.json", art)

    def save_bytes(self, thread_dir: Path, data: bytes, ext: str, kind: str, media_type: str,
                   origin: ArtifactOrigin, epoch: int | None = None) -> Artifact:
        """A new artifact holding `data` as `<aid>.<ext>` (charts, files, tool images)."""
        aid = new_artifact_id()
        path = artifacts_dir(thread_dir) / f"{aid}.{ext}"
        write_atomic(path, data)
        now = time.time()
        art = Artifact(id=aid, kind=kind, format="jpeg" if ext == "jpg" else ext, file=path.name,
                       origin=origin, created=now, last_used=now, bytes=len(data),
                       sha256=hashlib.sha256(data).hexdigest(), media_type=media_type)
        self.save(thread_dir, art, epoch)
        return art

    def load(self, thread_dir: Path, aid: str) -> Artifact:
        check_id(aid, "artifact")
        path = artifacts_dir(thread_dir) / f"{aid}.json"
        if not regular_file(path):
            raise ArtifactNotFound(f"artifact {aid} not found in this thread")
        return msgspec.convert(read_json(path), Artifact)

    def data_path(self, thread_dir: Path, art: Artifact) -> Path:
        return artifacts_dir(thread_dir) / art.file

    def list(self, thread_dir: Path) -> list[Artifact]:
        d = artifacts_dir(thread_dir)
        if not d.is_dir():
            return []
        out = []
        for p in d.glob("*.json"):
            if regular_file(p):
                try:
                    out.append(msgspec.convert(read_json(p), Artifact))
                except (msgspec.ValidationError, msgspec.DecodeError):
                    log.warning("unreadable artifact metadata %s", p)
        out.sort(key=lambda a: a.created)
        return out

    def touch(self, thread_dir: Path, aids: list[str]) -> None:
        """Mark artifacts as used now (LRU eviction keeps recently used data)."""
        now = time.time()
        with self.lock(thread_dir):
            for aid in aids:
                try:
                    art = self.load(thread_dir, aid)
                except (ArtifactNotFound, ValueError):
                    continue
                self.save(thread_dir, msgspec.structs.replace(art, last_used=now))

    def expire(self, thread_dir: Path, aid: str, status: str = "expired") -> Artifact | None:
        """Delete the data file, keep the metadata as a tombstone. Under the thread's lock."""
        with self.lock(thread_dir):
            try:
                art = self.load(thread_dir, aid)
            except ArtifactNotFound:
                return None
            if not art.available:
                return art
            try:
                self.data_path(thread_dir, art).unlink()
            except FileNotFoundError:
                pass
            art = msgspec.structs.replace(art, status=status, expired_at=time.time())
            self.save(thread_dir, art)
            return art

    # -- per user ----------------------------------------------------------------
    def find(self, aid: str, owner: str, workspaces: list[str]) -> tuple[Path, Artifact]:
        """The thread dir and artifact `aid` of `owner`, searched across their threads."""
        check_id(aid, "artifact")
        for ws in workspaces:
            root = self.layout.threads_dir(ws, owner)
            if not root.is_dir():
                continue
            for tdir in root.iterdir():
                if tdir.name.startswith(".") or not tdir.is_dir() or tdir.is_symlink():
                    continue
                if regular_file(artifacts_dir(tdir) / f"{aid}.json"):
                    return tdir, self.load(tdir, aid)
        raise ArtifactNotFound(f"artifact {aid} not found")

    def walk(self) -> Iterator[tuple[str, str, Path, Artifact]]:
        """Every artifact on this host: (workspace, user, thread_dir, artifact)."""
        root = self.layout.workspaces_dir
        if not root.is_dir():
            return
        for wsdir in root.iterdir():
            users = wsdir / "users"
            if not users.is_dir():
                continue
            for udir in users.iterdir():
                threads = udir / "threads"
                if not threads.is_dir():
                    continue
                for tdir in threads.iterdir():
                    if tdir.name.startswith(".") or not tdir.is_dir():
                        continue
                    for art in self.list(tdir):
                        yield wsdir.name, udir.name, tdir, art
