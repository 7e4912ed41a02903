"""Sweeping what a crash left in the data directory (the workspaces' folders and the rest).

A write that is cancelled or fails removes its own temp files (ParquetSink, uploads,
`write_atomic`). A crash (the process killed mid-write) cannot, so this sweep removes,
at start and on every round of the periodic sweeper:

- temp entries anywhere under `workspaces/` (threads, artifacts, memory; never a kernel's
  `outputs/` nor a warehouse `data/` folder): every temp name starts with "." and ends with
  ".tmp" (`.<aid>.parquet.<owner>.XXXX.tmp/` of the Parquet sink, `.upload.<owner>.XXXX.tmp`
  of uploads, `.<name>.<owner>.XXXX.tmp` of atomic writes). One whose owner tag names a
  process of this host that no longer runs (store/tempnames.py) goes at once; any other
  only after `max_age_s` without a write (a file being written is modified at every row
  group or chunk, so it is never taken for a leftover);
- orphan data in an artifacts folder: `<aid>.<ext>` without its `<aid>.json` (renamed into
  place, then the process died before the metadata was written), after `ORPHAN_GRACE_S`:
  without metadata nobody can own it, so it is removed, with a log line naming it;
- elsewhere in the home (`users.json`, `sessions.json`, `calibration.json` beside it, turn
  markers in `locks/turns/`, kernel records and heartbeats in `sandbox/`, `run/`): the temp
  entries of an atomic write whose owner no longer runs; nothing by age there (never into
  `tmp/`, a kernel's `outputs/` or `data/`).

Links are removed as links, never followed.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from pathlib import Path

from datadesk.domain.ids import ID_PATTERN
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.store.tempnames import owner_dead

log = logging.getLogger(__name__)

TEMP_MAX_AGE_S = 3600.0  # an hour without a single write: no live writer works like that
ORPHAN_GRACE_S = 30.0  # a writer renames the data file, then writes its metadata a moment later
_NOT_SWEPT = {"outputs", "data"}  # the kernel's files and the warehouse: not the app's temp files
_HOME_NOT_SWEPT = {"workspaces", "tmp"}  # swept on their own; DuckDB's spill folders (tmp/sql)


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


def _stale(entry: os.DirEntry, names: set[str], max_age_s: float, now: float) -> str | None:
    """Why `entry` is a leftover to remove now, or None."""
    if is_temp_name(entry.name):
        if owner_dead(entry.name):
            return "its writer is gone"
        return "untouched for an hour" if now - _newest_mtime(Path(entry.path)) >= max_age_s else None
    if _orphan(entry, names) and now - _newest_mtime(Path(entry.path)) >= min(ORPHAN_GRACE_S, max_age_s):
        return "a data file without metadata"
    return None


def sweep_dir(folder: Path, max_age_s: float = TEMP_MAX_AGE_S, now: float | None = None,
              orphans: bool = False) -> list[Path]:
    """Remove the leftovers of one folder: temp entries, and orphan data files when `orphans`."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    names = {e.name for e in entries} if orphans else set()
    removed: list[Path] = []
    for entry in entries:
        if not is_temp_name(entry.name) and not orphans:
            continue
        path = Path(entry.path)
        try:
            why = _stale(entry, names, max_age_s, now)
            if why is None:
                continue
            _remove(path)
        except FileNotFoundError:
            continue  # its writer finished (or removed it) meanwhile
        except OSError as exc:
            log.warning("could not remove the leftover %s: %s", path, exc)
            continue
        log.info("removed %s (%s)", path, why)
        removed.append(path)
    return removed


def sweep_artifacts_dir(adir: Path, max_age_s: float = TEMP_MAX_AGE_S, now: float | None = None) -> list[Path]:
    """Remove stale temp entries and orphan data files from one artifacts folder."""
    return sweep_dir(adir, max_age_s, now, orphans=True)


def sweep_dead_owners(folder: Path) -> list[Path]:
    """Remove the temp entries of `folder` whose owner tag names a process of this host that no
    longer runs (nothing else: outside the workspaces a name is no proof of a leftover)."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not (is_temp_name(entry.name) and owner_dead(entry.name)):
            continue
        path = Path(entry.path)
        try:
            _remove(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not remove the leftover %s: %s", path, exc)
            continue
        log.info("removed %s (its writer is gone)", path)
        removed.append(path)
    return removed


def sweep_temp_files(store: ArtifactStore, max_age_s: float = TEMP_MAX_AGE_S) -> list[Path]:
    """Sweep every folder under the workspaces of this host, and the dead writers' temp files of
    the rest of the home (users, sessions, calibration, turn markers, kernel records and
    heartbeats); returns what was removed."""
    removed: list[Path] = []
    now = time.time()
    root = store.layout.workspaces_dir
    for folder, dirs, _files in os.walk(root, followlinks=False):
        here = Path(folder)
        removed.extend(sweep_dir(here, max_age_s, now, orphans=here.name == "artifacts"))
        # never into a temp folder (the sink's), a kernel's outputs or a warehouse folder
        dirs[:] = [d for d in dirs if not is_temp_name(d) and d not in _NOT_SWEPT and (here / d).is_dir()]
    home = store.layout.home
    for folder, dirs, _files in os.walk(home, followlinks=False):
        here = Path(folder)
        removed.extend(sweep_dead_owners(here))
        # the workspaces are swept above; SQL spill folders and a kernel's files are not the app's
        dirs[:] = [d for d in dirs if not is_temp_name(d) and d not in _NOT_SWEPT
                   and not (here == home and d in _HOME_NOT_SWEPT) and (here / d).is_dir()]
    if removed:
        log.info("removed %d leftover temp or orphan file(s) from the data directory", len(removed))
    return removed
