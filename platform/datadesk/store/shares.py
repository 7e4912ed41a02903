"""`FileShares`: the embedded set's shares (`store.interfaces.shares.Shares`).

One JSON file per share, `workspaces/<ws>/shares/<sid>.json`, written atomically (a temp file
renamed over it). A share lives under its workspace's folder, so a reader looks only in the
folders of the workspaces they are a member of: a share of another workspace is never even
read. A revoke is a read-modify-write under `shares/.lock` (a file lock, so two workers of
the host never lose each other's change).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from filelock import FileLock

from datadesk.domain.ids import check_id
from datadesk.domain.shares import Share
from datadesk.store.files import write_json
from datadesk.store.interfaces.shares import ShareStoreError
from datadesk.store.layout import Layout

LOCK_TIMEOUT_S = 10


class FileShares:
    """Shares as files under each workspace's folder (module doc)."""

    def __init__(self, layout: Layout, fsync: bool = True) -> None:
        self.layout = layout
        self.fsync = fsync

    def _dir(self, ws: str) -> Path:
        return self.layout.workspace_dir(check_id(ws, "workspace")) / "shares"

    def _path(self, ws: str, sid: str) -> Path:
        return self._dir(ws) / f"{check_id(sid, 'share')}.json"

    def _lock(self, ws: str) -> FileLock:
        folder = self._dir(ws)
        folder.mkdir(parents=True, exist_ok=True)
        return FileLock(str(folder / ".lock"), timeout=LOCK_TIMEOUT_S)

    def add(self, share: Share) -> None:
        path = self._path(share.workspace, share.id)
        with self._lock(share.workspace):
            if path.exists():
                raise ShareStoreError(f"share {share.id} exists already")
            write_json(path, share, sync=self.fsync)

    def get(self, sid: str, workspaces: list[str]) -> Share | None:
        check_id(sid, "share")
        for ws in workspaces:
            found = _read(self._path(ws, sid))
            if found is not None and found.workspace == ws:
                return found
        return None

    def of_owner(self, owner: str, workspaces: list[str], thread: str | None = None) -> list[Share]:
        found: list[Share] = []
        for ws in workspaces:
            folder = self._dir(ws)
            if not folder.is_dir():
                continue
            with os.scandir(folder) as entries:
                names = [e.name for e in entries if e.name.endswith(".json") and not e.name.startswith(".")]
            for name in names:
                share = _read(folder / name)
                if share is not None and share.owner == owner and (thread is None or share.thread == thread):
                    found.append(share)
        return sorted(found, key=lambda s: s.created, reverse=True)

    def revoke(self, sid: str, owner: str, at: float) -> Share | None:
        check_id(sid, "share")
        for ws in self._workspaces_holding(sid):
            with self._lock(ws):
                share = _read(self._path(ws, sid))
                if share is None or share.owner != owner:
                    continue
                if share.revoked is None:
                    share = msgspec.structs.replace(share, revoked=at)
                    write_json(self._path(ws, sid), share, sync=self.fsync)
                return share
        return None

    def _workspaces_holding(self, sid: str) -> list[str]:
        root = self.layout.workspaces_dir
        if not root.is_dir():
            return []
        return [p.name for p in root.iterdir() if (p / "shares" / f"{sid}.json").is_file()]


def _read(path: Path) -> Share | None:
    """The share stored at `path`; None when there is none; ShareStoreError when it is unreadable."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=Share)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ShareStoreError(f"share file {path} is unreadable: {exc}") from exc
