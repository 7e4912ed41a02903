"""The embedded `BlobStore`: the files of today's thread folders, by key.

`ws/<ws>/u/<uid>/t/<tid>/a/<name>` is `workspaces/<ws>/users/<uid>/threads/<tid>/artifacts/<name>`
under the home (`o/` is the thread's `outputs/`), so the embedded artifact store and this one
name the same files. Nothing is cached (the file is the object) and there are no URLs
(`presign` raises PresignUnsupported): the embedded set serves every file through the app.
A write-once put links a complete temp file into place (`os.link` fails on an existing name),
so a reader never sees half an object and two writers of one key cannot both win.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from datadesk.store.interfaces.blobs import (AREAS, BlobExists, BlobNotFound, Method, PresignUnsupported, check_prefix,
                                  parse_key)
from datadesk.store.layout import Layout
from datadesk.store.tempnames import temp_prefix


class LocalBlobs:
    """Blobs as files under the home's workspaces (the embedded set)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.where = f"the data directory {layout.home}"

    def path(self, key: str) -> Path:
        """Where `key` lives (validated: a key never names a file outside its thread's folder)."""
        k = parse_key(key)
        return self.layout.thread_dir(k.workspace, k.user, k.thread) / AREAS[k.area] / k.name

    def put(self, key: str, src: Path | bytes, if_absent: bool = True) -> int:
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=temp_prefix(final.name), suffix=".tmp", dir=final.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            if isinstance(src, (bytes, bytearray, memoryview)):
                tmp.write_bytes(src)
            else:
                shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o644)  # readable by the sandbox user, like every artifact
            size = tmp.stat().st_size
            if if_absent:
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    raise BlobExists(f"{key} already exists in {self.where}") from None
            else:
                os.replace(tmp, final)
            return size
        finally:
            tmp.unlink(missing_ok=True)

    def _regular(self, key: str) -> Path:
        path = self.path(key)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                return path
        except FileNotFoundError:
            pass
        raise BlobNotFound(f"{key} not found in {self.where}")

    def get(self, key: str) -> bytes:
        return self._regular(key).read_bytes()

    def local_path(self, key: str) -> Path:
        return self._regular(key)

    def open_range(self, key: str, start: int, length: int) -> bytes:
        with open(self._regular(key), "rb") as fh:
            fh.seek(start)
            return fh.read(max(0, length))

    def size(self, key: str) -> int:
        return self._regular(key).stat().st_size

    def exists(self, key: str) -> bool:
        try:
            self._regular(key)
            return True
        except BlobNotFound:
            return False

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        keys = list(self.list(prefix))
        for key in keys:
            self.delete(key)
        return len(keys)

    def list(self, prefix: str) -> Iterator[str]:
        """The keys under `prefix`: the regular files of the thread folders' `artifacts/` and
        `outputs/` (never temp files, metadata beside them is not a blob: `.json` is)."""
        check_prefix(prefix)
        root = self.layout.workspaces_dir
        for ws_dir in _dirs(root):
            for udir in _dirs(ws_dir / "users"):
                for tdir in _dirs(udir / "threads"):
                    base = f"ws/{ws_dir.name}/u/{udir.name}/t/{tdir.name}/"
                    if not (base.startswith(prefix) or prefix.startswith(base)):
                        continue
                    for area, folder in AREAS.items():
                        yield from (k for k in _files(tdir / folder, f"{base}{area}/") if k.startswith(prefix))

    def presign(self, key: str, method: Method = "GET", ttl_s: int = 300,
                content_length: int | None = None) -> str:
        raise PresignUnsupported(f"{self.where} hands out no URLs: its files are served by the app")


def _dirs(root: Path) -> Iterator[Path]:
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if not e.name.startswith(".") and e.is_dir(follow_symlinks=False):
            yield Path(e.path)


def _files(folder: Path, base: str) -> Iterator[str]:
    for dirpath, dirs, files in os.walk(folder, followlinks=False):
        rel = os.path.relpath(dirpath, folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or os.path.islink(os.path.join(dirpath, name)):
                continue
            yield base + (name if rel == "." else f"{rel}/{name}")
