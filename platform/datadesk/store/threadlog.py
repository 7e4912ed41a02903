"""`log.jsonl`: the append-only truth of one thread.

- One record per line; `seq` strictly increases.
- An append writes one complete line, under a lock that holds across threads
  and processes (`filelock`), so lines never interleave. A short write is
  continued until the whole line is there; a write that fails (a full disk, a
  quota, an I/O error) is truncated away, so the log is as it was, no `seq` is
  used, and the caller gets `StoreWriteError` naming the file and the reason.
- A crash mid-write can leave a torn last line (no trailing newline). Readers
  skip it; the next append moves the fragment to `log.torn` (kept for
  forensics, nothing silently lost) and truncates the log back to its last
  complete line before writing.
- Reading the newest N records seeks from the end of the file, so the cost
  does not grow with the length of the log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import msgspec
from filelock import FileLock

from datadesk.domain.records import Record, record_decoder, record_encoder
from datadesk.store.interfaces.threads import LogClosed
from datadesk.store.files import StoreWriteError, disk_reason, write_all
from datadesk.store.jsonl import last_newline_end, lines_from_end

log = logging.getLogger(__name__)

_local_locks: dict[str, threading.RLock] = {}
_local_locks_guard = threading.Lock()


def _thread_lock(path: Path) -> threading.RLock:
    # filelock is re-entrant per process object; a threading lock keeps threads
    # of this process orderly as well. Re-entrant, so a write of the thread inside
    # `Thread.guarded` (the same Thread object, the same OS thread) joins the hold.
    with _local_locks_guard:
        return _local_locks.setdefault(str(path), threading.RLock())


def find_records(newest_first: Iterator[Record], predicate: Callable[[Record], bool], limit: int) -> list[Record]:
    """The first `limit` (at least one) of `newest_first` matching `predicate`, reading no
    further than that: a log's `find`, on either set (cluster/threadrows.py too)."""
    out: list[Record] = []
    for rec in newest_first:
        if predicate(rec):
            out.append(rec)
            if len(out) >= limit:
                break
    return out


class FileAndThreadLock:
    """A lock held across the threads of this process and across processes (`filelock`);
    re-entrant for the same object in the same thread."""

    def __init__(self, path: Path) -> None:
        self._flock = FileLock(str(path))
        self._tlock = _thread_lock(Path(path))

    def __enter__(self) -> "FileAndThreadLock":
        self._tlock.acquire()
        try:
            self._flock.acquire()
        except BaseException:
            self._tlock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._flock.release()
        finally:
            self._tlock.release()


def _what(record: Record) -> str:
    size = f"{len(record.content):,} characters"
    return {"user": f"user's message, {size}", "assistant": f"assistant's answer, {size}",
            "tool": f"result of {record.name or 'a tool'}, {size}"}.get(record.role, record.role)


class ThreadLog:
    """Append-only JSON-lines log of `Record`s."""

    def __init__(self, path: Path, lock: FileAndThreadLock | None = None,
                 epoch_of: Callable[[], int | None] | None = None, fsync: bool = False) -> None:
        """`lock` and `epoch_of` come from the owning `Thread` (its lock, its epoch on disk); a log
        opened on its own gets a lock file beside it and cannot guard appends by epoch. With
        `fsync`, an append returns only once its line is on the disk (store.fsync = "record")."""
        self.path = Path(path)
        self._lock = lock or FileAndThreadLock(Path(str(self.path) + ".lock"))
        self._epoch_of = epoch_of
        self.fsync = fsync

    def sync(self) -> None:
        """Flush the log to the disk (store.fsync = "turn" calls it at the end of each turn)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            log.error("could not fsync %s: %s", self.path, exc)
        finally:
            os.close(fd)

    # -- writing -----------------------------------------------------------
    def lock(self) -> FileAndThreadLock:
        """The lock every append holds (the owning thread's lock)."""
        return self._lock

    def append(self, make: Callable[[int], Record], epoch: int | None = None) -> Record:
        """Append the record `make(next_seq)` and return it.

        The seq is assigned under the lock, so concurrent writers each get a
        distinct, increasing seq and a whole line of their own. With `epoch`,
        the append is refused (LogClosed) when the thread was cleared since:
        nothing from before a clear lands after it.
        """
        # checked before taking the lock too: the lock file would recreate the directory
        if not self.path.parent.is_dir():
            raise LogClosed(f"thread {self.path.parent.name} no longer exists")
        with self._lock:
            if epoch is not None and self._epoch_of is None:
                raise ValueError("an epoch-guarded append needs the owning Thread (ThreadLog opened alone)")
            if epoch is not None and self._epoch_of() != epoch:
                raise LogClosed(f"thread {self.path.parent.name} was cleared")
            last = self._repair_and_last()
            record = make(last.seq + 1 if last else 1)
            if last is not None and record.seq <= last.seq:
                raise ValueError(f"seq {record.seq} does not follow {last.seq}")
            self._write_line(record_encoder.encode(record) + b"\n", record)
            return record

    def _write_line(self, line: bytes, record: Record) -> None:
        """Append `line` whole, or leave the log exactly as it was and raise StoreWriteError."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._not_saved(exc, record) from None
        try:
            size = os.fstat(fd).st_size  # under the lock: nobody else appends meanwhile
            try:
                write_all(fd, line)
                if self.fsync:
                    os.fsync(fd)
            except OSError as exc:
                try:
                    os.ftruncate(fd, size)  # the part that reached the disk goes: no torn line is left
                except OSError:
                    log.error("could not truncate %s back to %d bytes after a failed append", self.path, size)
                raise self._not_saved(exc, record) from None
        finally:
            os.close(fd)

    def _not_saved(self, exc: OSError, record: Record) -> StoreWriteError:
        error = StoreWriteError(exc.errno or 0, f"{disk_reason(exc)}: record {record.seq} (the {_what(record)}) of thread "
                                f"{self.path.parent.name} was not saved to {self.path}")
        log.error("%s", error)
        return error

    def _repair_and_last(self) -> Record | None:
        """Truncate a torn tail (saving it to `log.torn`) and return the last record."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if size == 0:
            return None
        with open(self.path, "rb+") as fh:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                end = last_newline_end(fh, size)
                fh.seek(end)
                fragment = fh.read()
                torn = self.path.with_name(self.path.stem + ".torn")
                with open(torn, "ab") as out:
                    out.write(b"%d " % int(time.time()) + fragment.replace(b"\n", b" ") + b"\n")
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
                log.warning("repaired torn last line of %s (%d bytes moved to %s)", self.path, len(fragment), torn.name)
        for rec in self.tail(1):
            return rec
        return None

    # -- reading -----------------------------------------------------------
    def tail(self, n: int) -> list[Record]:
        """The newest `n` valid records, oldest first, reading from the end only."""
        found: list[Record] = []
        if n > 0:
            for raw in lines_from_end(self.path):
                rec = self._decode(raw)
                if rec is not None:
                    found.append(rec)
                    if len(found) >= n:
                        break
        return list(reversed(found))

    def newest_first(self) -> Iterator[Record]:
        """Every valid record, newest first, read from the end (stop early to pay less)."""
        for raw in lines_from_end(self.path):
            rec = self._decode(raw)
            if rec is not None:
                yield rec

    def __iter__(self) -> Iterator[Record]:
        """All valid records, oldest first (streams the file; skips a torn tail)."""
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return
        with fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break  # torn last line
                rec = self._decode(raw)
                if rec is not None:
                    yield rec

    def since(self, first_seq: int, last_seq: int | None = None) -> list[Record]:
        """Records with first_seq <= seq (<= last_seq), read from the tail: the cost is the
        distance from the end, not the length of the log."""
        want = 64
        while True:
            records = self.tail(want)
            if len(records) < want or (records and records[0].seq <= first_seq):
                break
            want *= 4
        return [r for r in records if r.seq >= first_seq and (last_seq is None or r.seq <= last_seq)]

    def find(self, predicate: Callable[[Record], bool], limit: int = 1) -> list[Record]:
        """Newest-first search, read from the end (for paging an old tool result back, etc.)."""
        return find_records(self.newest_first(), predicate, limit)

    def _decode(self, raw: bytes) -> Record | None:
        raw = raw.strip()
        if not raw:
            return None
        try:
            return record_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("skipping an unreadable line in %s", self.path)
            return None

