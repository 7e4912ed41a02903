"""Threads: `meta.json` + `log.jsonl` per thread, under the owner's workspace folder."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import msgspec

from datadesk.domain.ids import check_id, new_id
from datadesk.domain.records import ThreadMeta
from datadesk.store.files import read_json, write_json
from datadesk.store.layout import Layout
from datadesk.store.threadlog import ThreadLog


class ThreadNotFound(LookupError):
    """No such thread for this user (another user's thread is also 'not found')."""


class ThreadHandle(msgspec.Struct):
    """A located thread: its meta and where it lives."""

    meta: ThreadMeta
    dir: Path

    @property
    def log(self) -> ThreadLog:
        return ThreadLog(self.dir / "log.jsonl")

    @property
    def id(self) -> str:
        return self.meta.id


class ThreadStore:
    """Create, find, list and delete a user's threads across their workspaces."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def create(self, workspace: str, owner: str, title: str = "New chat", project: str | None = None) -> ThreadHandle:
        check_id(workspace, "workspace")
        check_id(owner, "user")
        # 64 random bits: collisions are astronomically unlikely, and checked anyway
        for _ in range(5):
            tid = new_id("t")
            tdir = self.layout.thread_dir(workspace, owner, tid)
            if not tdir.exists():
                break
        else:  # pragma: no cover
            raise RuntimeError("could not allocate a thread id")
        now = time.time()
        meta = ThreadMeta(id=tid, workspace=workspace, owner=owner, title=title[:200] or "New chat",
                          created=now, updated=now, project=project)
        tdir.mkdir(parents=True)
        write_json(tdir / "meta.json", meta)
        return ThreadHandle(meta=meta, dir=tdir)

    def get(self, tid: str, owner: str, workspaces: list[str]) -> ThreadHandle:
        """Find thread `tid` of `owner` in one of `workspaces`, else ThreadNotFound."""
        check_id(tid, "thread")
        for ws in workspaces:
            tdir = self.layout.thread_dir(ws, owner, tid)
            meta_raw = read_json(tdir / "meta.json")
            if meta_raw is not None:
                meta = msgspec.convert(meta_raw, ThreadMeta)
                if meta.owner == owner and meta.id == tid:
                    return ThreadHandle(meta=meta, dir=tdir)
        raise ThreadNotFound(f"thread {tid} not found")

    def list(self, owner: str, workspaces: list[str]) -> list[ThreadMeta]:
        metas: list[ThreadMeta] = []
        for ws in workspaces:
            root = self.layout.threads_dir(ws, owner)
            if not root.is_dir():
                continue
            for tdir in root.iterdir():
                raw = read_json(tdir / "meta.json") if tdir.is_dir() and not tdir.is_symlink() else None
                if raw is not None:
                    metas.append(msgspec.convert(raw, ThreadMeta))
        metas.sort(key=lambda m: m.updated, reverse=True)
        return metas

    def touch(self, handle: ThreadHandle, title: str | None = None) -> ThreadMeta:
        """Update `updated` (and the title) of a thread, atomically."""
        raw = read_json(handle.dir / "meta.json")
        if raw is None:
            raise ThreadNotFound(f"thread {handle.id} not found")
        meta = msgspec.convert(raw, ThreadMeta)
        meta = msgspec.structs.replace(meta, updated=time.time(), title=title or meta.title)
        write_json(handle.dir / "meta.json", meta)
        handle.meta = meta
        return meta

    def clear(self, handle: ThreadHandle) -> dict[str, int]:
        """Clear chat, one operation under the thread lock: bump the epoch (appends of anything
        started before are refused), then delete the log, summary and revisions, manifests,
        artifacts and outputs. Memory is not touched. Returns what was removed."""
        removed = {"records": 0, "artifacts": 0, "bytes": 0}
        log = handle.log
        with log.lock():
            raw = read_json(handle.dir / "meta.json")
            if raw is None:
                raise ThreadNotFound(f"thread {handle.id} not found")
            meta = msgspec.convert(raw, ThreadMeta)
            meta = msgspec.structs.replace(meta, epoch=meta.epoch + 1, updated=time.time())
            write_json(handle.dir / "meta.json", meta)
            handle.meta = meta
            removed["records"] = sum(1 for _ in log)
            for name in ("log.jsonl", "log.torn", "summary.json", "summary.revisions.jsonl", "context.jsonl"):
                path = handle.dir / name
                if path.is_file():
                    removed["bytes"] += path.stat().st_size
                    path.unlink()
            for sub in ("artifacts", "outputs"):
                d = handle.dir / sub
                if d.is_dir() and not d.is_symlink():
                    for p in d.rglob("*"):
                        if p.is_file() and not p.is_symlink():
                            removed["bytes"] += p.stat().st_size
                            if sub == "artifacts" and p.suffix == ".json":
                                removed["artifacts"] += 1
                    shutil.rmtree(d, ignore_errors=True)
        return removed

    def delete(self, handle: ThreadHandle) -> None:
        """Remove a thread: rename it away first so no reader sees half of it."""
        trash = handle.dir.with_name(f".deleted-{handle.id}-{new_id()}")
        handle.dir.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
