"""Files crossing the sandbox boundary: data links in, outputs out. Nothing here follows links.

- `/data` of a kernel is its own slot directory holding hard links to the
  thread's artifact files. A pooled kernel is started before its thread is
  known; linking (not bind-mounting) lets the slot be filled after start,
  needs no mount privileges, and shows a kernel only its own thread's files.
  The links are re-synced before every execution (new, restored and evicted
  artifacts).
- `/outputs` is untrusted: only regular files are taken, walking with
  directory fds and O_NOFOLLOW at every level (nothing is ever followed, even
  if swapped in mid-walk), never FIFOs, devices or symlinks, within a quota.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

# data files of artifacts (their `<aid>.json` metadata stays outside the sandbox)
DATA_SUFFIXES = (".parquet", ".txt", ".csv", ".png", ".jpg", ".gif", ".webp")


def sync_data_links(source: Path, slot: Path) -> None:
    """Make `slot` hold hard links to the data files of `source` (an artifacts dir), exactly."""
    slot.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, os.stat_result] = {}
    if source.is_dir():
        for entry in os.scandir(source):
            if entry.name.startswith(".") or not entry.name.endswith(DATA_SUFFIXES):
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                wanted[entry.name] = st
    for entry in os.scandir(slot):
        st = entry.stat(follow_symlinks=False)
        keep = wanted.get(entry.name)
        if keep is None or (st.st_ino, st.st_dev) != (keep.st_ino, keep.st_dev):
            os.unlink(entry.path)
    for name, st in wanted.items():
        target = slot / name
        if not os.path.lexists(target):
            os.link(source / name, target, follow_symlinks=False)


@dataclass(frozen=True)
class OutputFile:
    relpath: str
    size: int
    mtime_ns: int
    data: bytes


def read_new_outputs(root: str, seen: dict[str, tuple[int, int]], max_bytes: int,
                     max_files: int = 200, max_depth: int = 8) -> tuple[list[OutputFile], list[str]]:
    """New or changed regular files under `root`, read safely; and problems, in words.

    The walk holds a directory fd at every level and opens each entry relative
    to it with O_NOFOLLOW, so a symlink planted anywhere (even swapped in
    while we walk) is never followed, and FIFOs, sockets and devices are never
    opened. `seen` maps relpath -> (size, mtime_ns) and is updated.
    """
    found: list[OutputFile] = []
    problems: list[str] = []
    budget = max_bytes
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return found, problems

    def walk(dfd: int, prefix: str, depth: int) -> None:
        nonlocal budget
        for entry in sorted(os.scandir(dfd), key=lambda e: e.name):
            if len(found) >= max_files:
                return
            rel = f"{prefix}{entry.name}"
            try:
                st = os.stat(entry.name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth >= max_depth:
                    continue
                try:
                    sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    walk(sub, rel + "/", depth + 1)
                finally:
                    os.close(sub)
                continue
            if not stat.S_ISREG(st.st_mode):
                if stat.S_ISLNK(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                    problems.append(f"/outputs/{rel} is not a regular file (link, pipe or device): ignored")
                continue
            stamp = (st.st_size, st.st_mtime_ns)
            if seen.get(rel) == stamp:
                continue
            if st.st_size > budget:
                problems.append(f"/outputs/{rel} ({st.st_size:,} bytes) exceeds the outputs quota: not saved")
                seen[rel] = stamp
                continue
            try:
                fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError:
                continue
            try:
                fst = os.fstat(fd)
                if not stat.S_ISREG(fst.st_mode):
                    continue
                data = _read_at_most(fd, min(fst.st_size, budget) + 1)
            finally:
                os.close(fd)
            if len(data) > budget:
                problems.append(f"/outputs/{rel} grew past the outputs quota while being read: not saved")
                continue
            budget -= len(data)
            seen[rel] = stamp
            found.append(OutputFile(rel, len(data), st.st_mtime_ns, data))

    try:
        walk(top, "", 0)
    finally:
        os.close(top)
    return found, problems


def _read_at_most(fd: int, n: int) -> bytes:
    """Up to `n` bytes from `fd` (one byte past a limit tells that the file grew past it)."""
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_regular(path: Path, limit: int) -> bytes:
    """Read a regular file without following a link at its last component; at most `limit` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path.name} is larger than {limit} bytes")
        data = _read_at_most(fd, limit + 1)
        if len(data) > limit:
            raise OSError(f"{path.name} grew past {limit} bytes")
        return data
    finally:
        os.close(fd)
