"""Small file primitives: atomic writes and JSON documents."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from datadesk.store.tempnames import temp_prefix


class StoreWriteError(OSError):
    """A write to the data directory failed (a full disk, a quota, an I/O error): nothing of it
    was kept. The message names the file, the reason and what was not saved."""


def disk_reason(exc: OSError) -> str:
    """'the disk is full (No space left on device)' and the like, for the messages users see."""
    name = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
            errno.EFBIG: "the file size limit was reached", errno.EIO: "the disk reported an I/O error",
            errno.EROFS: "the disk is read-only"}.get(exc.errno or 0, "the write failed")
    return f"{name} ({exc.strerror or exc})"


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def not_saved(exc: BaseException, what: str) -> StoreWriteError | None:
    """`exc` as a StoreWriteError saying `what` was not saved, when it is a disk's failure (a full
    disk, a quota, an I/O error); None for any other error."""
    if isinstance(exc, StoreWriteError):
        return exc
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        return StoreWriteError(exc.errno, f"{disk_reason(exc)}: {what} was not saved; nothing of it was kept")
    return None


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, looping on short writes (a full disk can take part of
    a write and fail the rest); an OSError means not all of it was written."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # never seen from a regular file, but a loop must not spin on it
            raise OSError(errno.EIO, "the write made no progress")
        view = view[written:]


def write_atomic(path: Path, data: bytes, mode: int = 0o644, sync: bool = True) -> None:
    """Write `data` to a temp file beside `path` (created 0600, then `mode`), fsync it, then rename
    over `path`. A reader sees the old file or the new one, never a half-written one.

    `sync=False` skips the fsync: for run-time markers (locks' owners, heartbeats, kernel
    records) that mean nothing after a crash of the host, on paths turns take.

    A disk that fails the write (full, over quota, I/O error) leaves `path` as it was, removes the
    temp file and raises StoreWriteError naming `path` and the reason.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        error = not_saved(exc, str(path))
        if error is not None and error is not exc:
            raise error from None
        raise


def write_json(path: Path, obj: Any, mode: int = 0o644, sync: bool = True) -> None:
    write_atomic(path, msgspec.json.format(msgspec.json.encode(obj), indent=2) + b"\n", mode, sync)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return msgspec.json.decode(path.read_bytes())
    except FileNotFoundError:
        return default


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object written by another process, or None when it is missing, unreadable or not an
    object (a marker is advice: its reader decides what None means)."""
    try:
        data = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    return data if isinstance(data, dict) else None
