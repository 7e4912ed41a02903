"""Sweeping what a crash left in thread `artifacts/` folders.

A write that is cancelled or fails removes its own temp files (ParquetSink, uploads,
`write_atomic`). A crash (the process killed mid-write) cannot, so this sweep removes,
at start and on every round of the periodic sweeper:

- temp entries: every temp name in an artifacts folder starts with "." and ends with
  ".tmp" (`.<aid>.parquet.XXXX.tmp/` of the Parquet sink, `.upload-XXXX.tmp` and
  `.paste-XXXX.tmp` of uploads and pasted tables, `.<name>.XXXX.tmp` of atomic writes);
- orphan data: `<aid>.<ext>` without its `<aid>.json` (renamed into place, then the
  process died before the metadata was written).

Only entries older than `max_age_s` go, measured by the newest modification time inside
them: a file being written is modified at every row group or chunk, so it is never
taken for a leftover. Links are removed as links, never followed.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from pathlib import Path

from datadesk.domain.ids import ID_PATTERN
from datadesk.offload.store import ArtifactStore

log = logging.getLogger(__name__)

TEMP_MAX_AGE_S = 3600.0  # an hour without a single write: no live writer works like that


def is_temp_name(name: str) -> bool:
    """The naming convention of every temp file or folder written into an artifacts folder."""
    return name.startswith(".") and name.endswith(".tmp") and len(name) > 5


def _newest_mtime(path: Path) -> float:
    """The latest modification time of `path` and, for a real folder, of anything inside it."""
    st = os.lstat(path)
    newest = st.st_mtime
    if stat.S_ISDIR(st.st_mode):
        for root, dirs, files in os.walk(path, followlinks=False):
            for name in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                except FileNotFoundError:
                    pass
    return newest


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _orphan(entry: os.DirEntry, names: set[str]) -> bool:
    """A data file whose metadata does not exist: `<aid>.<ext>` without `<aid>.json`."""
    stem, dot, ext = entry.name.partition(".")
    return (bool(dot) and ext != "json" and not entry.name.startswith(".") and bool(ID_PATTERN.fullmatch(stem))
            and f"{stem}.json" not in names and entry.is_file(follow_symlinks=False))


def sweep_artifacts_dir(adir: Path, max_age_s: float = TEMP_MAX_AGE_S, now: float | None = None) -> list[Path]:
    """Remove stale temp entries and orphan data files from one artifacts folder."""
    if not adir.is_dir() or adir.is_symlink():
        return []
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(adir))
    except OSError:
        return []
    names = {e.name for e in entries}
    removed: list[Path] = []
    for entry in entries:
        if not (is_temp_name(entry.name) or _orphan(entry, names)):
            continue
        path = Path(entry.path)
        try:
            if now - _newest_mtime(path) < max_age_s:
                continue  # possibly being written right now
            _remove(path)
        except FileNotFoundError:
            continue  # its writer finished (or removed it) meanwhile
        except OSError as exc:
            log.warning("could not remove the leftover %s: %s", path, exc)
            continue
        removed.append(path)
    return removed


def sweep_temp_files(store: ArtifactStore, max_age_s: float = TEMP_MAX_AGE_S) -> list[Path]:
    """Sweep every thread's artifacts folder on this host; returns what was removed."""
    removed: list[Path] = []
    now = time.time()
    for thread in store.threads():
        removed.extend(sweep_artifacts_dir(thread.artifacts_dir, max_age_s, now))
    if removed:
        log.info("removed %d leftover temp or orphan file(s) from artifacts folders", len(removed))
    return removed
