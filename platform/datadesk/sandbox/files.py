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
- When `/outputs` cannot be walked from here (the app itself runs in a
  container and cannot see the kernel's mount namespace), the same rules
  apply to a listing and a tar stream made inside the kernel container
  (`plan_outputs`, `read_outputs_tar`): names validated, only regular-file
  members that were asked for, sizes within the same quota, nothing written
  to disk.
"""

from __future__ import annotations

import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

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
                    problems.append(_not_regular(rel))
                continue
            stamp = (st.st_size, st.st_mtime_ns)
            if not _to_fetch(rel, stamp, budget, seen, problems):
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
                problems.append(_grew(rel))
                continue
            if not data:  # emptied between the stat and the read
                problems.append(_empty(rel))
                seen[rel] = stamp
                continue
            budget -= len(data)
            seen[rel] = stamp
            found.append(OutputFile(rel, len(data), st.st_mtime_ns, data))

    try:
        walk(top, "", 0)
    finally:
        os.close(top)
    return found, problems


def _to_fetch(rel: str, stamp: tuple[int, int], budget: int, seen: dict[str, tuple[int, int]],
              problems: list[str]) -> bool:
    """Whether a regular file of /outputs is to be read: not when unchanged since it was last seen
    (`stamp` = size, mtime_ns), nor when larger than what is left of the quota (reported once)."""
    if seen.get(rel) == stamp:
        return False
    if stamp[0] == 0:  # an empty file is never offered as a deliverable (reported once)
        problems.append(_empty(rel))
        seen[rel] = stamp
        return False
    if stamp[0] > budget:
        problems.append(_over_quota(rel, stamp[0]))
        seen[rel] = stamp
        return False
    return True


def _not_regular(rel: str) -> str:
    return f"/outputs/{rel} is not a regular file (link, pipe or device): ignored"


def _empty(rel: str) -> str:
    return f"/outputs/{rel} is empty (0 bytes): not saved, not offered as a file; write its content first"


def _over_quota(rel: str, size: int) -> str:
    return f"/outputs/{rel} ({size:,} bytes) exceeds the outputs quota: not saved"


def _grew(rel: str) -> str:
    return f"/outputs/{rel} grew past the outputs quota while being read: not saved"


# -- /outputs read from inside the kernel container --------------------------------------

# `find /outputs -mindepth 1 -maxdepth N -printf LISTING_FORMAT` (GNU find): type, size,
# mtime (seconds with a fraction), path relative to /outputs; NUL-terminated, so any name
# (newlines included) survives; a name is last, so it may hold spaces.
LISTING_FORMAT = "%y %s %T@ %P\\0"
TAR_SLACK_BYTES = 64 << 10  # tar headers and padding allowed on top of the files' bytes


@dataclass(frozen=True)
class PlannedOutput:
    """A new or changed regular file under /outputs, to be fetched."""

    relpath: str
    size: int
    mtime_ns: int


def valid_relpath(rel: str, max_depth: int = 8) -> bool:
    """A plain relative path: no empty, `.` or `..` part, no NUL, at most `max_depth` + 1 parts."""
    parts = rel.split("/")
    return (bool(rel) and "\0" not in rel and len(parts) <= max_depth + 1
            and all(p not in ("", ".", "..") for p in parts))


def _mtime_ns(text: str) -> int:
    whole, _, frac = text.partition(".")
    if not whole.isdigit() or (frac and not frac.isdigit()):
        raise ValueError(text)
    return int(whole) * 1_000_000_000 + int((frac[:9] or "0").ljust(9, "0"))


def plan_outputs(listing: bytes, seen: dict[str, tuple[int, int]], max_bytes: int, max_files: int = 200,
                 max_depth: int = 8) -> tuple[list[PlannedOutput], list[str]]:
    """What to fetch from a `LISTING_FORMAT` listing of /outputs (untrusted), and problems in words.

    Same rules and order as `read_new_outputs`: unchanged files (by `seen`) are skipped,
    links/pipes/sockets reported, a file larger than what is left of `max_bytes` is
    reported and marked seen; at most `max_files` files. Malformed entries are dropped.
    """
    entries: list[tuple[list[str], str, str, int, int]] = []
    problems: list[str] = []
    for raw in listing.split(b"\0"):
        kind, size, mtime, name = (raw.split(b" ", 3) + [b"", b"", b""])[:4]
        if not raw or not name:
            continue
        try:
            rel = name.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"/outputs/{name.decode('utf-8', 'replace')} has a name that is not UTF-8: ignored")
            continue
        if not valid_relpath(rel, max_depth) or not size.isdigit():
            continue
        try:
            stamp_ns = _mtime_ns(mtime.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            continue
        entries.append((rel.split("/"), rel, kind.decode("ascii", "replace"), int(size), stamp_ns))
    entries.sort(key=lambda e: e[0])  # the order of the directory walk: by name, depth first
    wanted: list[PlannedOutput] = []
    budget = max_bytes
    for _, rel, kind, size, mtime_ns in entries:
        if kind in ("l", "p", "s"):
            problems.append(_not_regular(rel))
            continue
        if kind != "f" or len(wanted) >= max_files:
            continue
        if not _to_fetch(rel, (size, mtime_ns), budget, seen, problems):
            continue
        budget -= size
        wanted.append(PlannedOutput(rel, size, mtime_ns))
    return wanted, problems


class _CappedStream:
    """A read-only file over byte chunks that fails once more than `limit` bytes come."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buf = bytearray()
        self._left = limit
        self.cut = False

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            if len(chunk) > self._left:
                self.cut = True
                raise OSError("the outputs archive is larger than the quota allows")
            self._left -= len(chunk)
            self._buf += chunk
        n = len(self._buf) if n < 0 else min(n, len(self._buf))
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


def read_outputs_tar(chunks: Iterable[bytes], wanted: list[PlannedOutput], seen: dict[str, tuple[int, int]],
                     max_bytes: int) -> tuple[list[OutputFile], list[str]]:
    """Read the `wanted` files out of a tar stream (untrusted) of /outputs, in memory.

    Only regular-file members whose name is one that was asked for are taken
    (links, devices, directories, sparse or repeated members are skipped), each
    within what is left of `max_bytes`; the stream as a whole may not exceed the
    files' bytes plus header slack. Nothing is written to disk. `seen` is updated
    with the listing's stamps of the files read.
    """
    planned = {w.relpath: w for w in wanted}
    found: list[OutputFile] = []
    problems: list[str] = []
    budget = max_bytes
    stream = _CappedStream(chunks, sum(w.size for w in wanted) + TAR_SLACK_BYTES * (1 + len(wanted)))
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]
            for member in archive:
                rel = member.name[2:] if member.name.startswith("./") else member.name
                plan = planned.pop(rel, None)
                if plan is None:
                    continue  # not asked for, or a second member of the same name
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    if member.issym() or member.islnk() or member.isfifo() or member.isdev():
                        problems.append(_not_regular(rel))
                    continue
                if member.size > budget:
                    problems.append(_grew(rel))
                    continue
                fileobj = archive.extractfile(member)
                data = fileobj.read(member.size) if fileobj is not None else b""
                if len(data) != member.size:
                    break  # the stream ended inside the file
                if not data:
                    problems.append(_empty(rel))
                    seen[rel] = (plan.size, plan.mtime_ns)
                    continue
                budget -= len(data)
                seen[rel] = (plan.size, plan.mtime_ns)
                found.append(OutputFile(rel, len(data), plan.mtime_ns, data))
    except (tarfile.TarError, OSError, EOFError) as exc:
        problems.append("files under /outputs grew past the outputs quota while being read: some were not saved"
                        if stream.cut else f"files under /outputs could not be read: {exc}")
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
