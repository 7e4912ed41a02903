"""The embedded set's audit log: one JSON-lines file per UTC day, `<home>/audit/YYYY-MM-DD.jsonl`.

Writing: each entry is one `os.write` of one whole line on a file opened with O_APPEND, so the
worker processes of a host append side by side without a lock and never interleave inside a
line; nothing is buffered in the process, so an entry the caller was told about survives the
process (a crash of the machine, too, with `store.fsync = "record"`).

Reading (the admin view): newest first, the day files from the newest back, each read from
its end block by block; a page's cursor is `<day>:<offset>`, the start of the oldest line
returned, so the next page reads on from there and costs what it returns, not the length of
the log. A filter is first tried on the raw line (`"user":"alice"` as msgspec writes it: a
quote inside a JSON string is always escaped, so the needle cannot match inside the SQL text)
and only the lines that pass are decoded. A torn last line (a crash mid-write) is skipped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import msgspec

from datadesk.audit.event import AuditEvent, AuditFilter, AuditPage, day_of
from datadesk.store.jsonl import last_newline_end

BLOCK = 256 * 1024
MAX_SCAN_BYTES = 64 * 1024 * 1024  # one page reads at most this much; the cursor says where it stopped
# entries of several processes reach the file in about, not exactly, the order of their times
ORDER_SLACK_S = 300.0
_DAY_FILE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.jsonl$")
_CURSOR = re.compile(r"^(\d{4}-\d{2}-\d{2}):(\d{1,15})$")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(AuditEvent).decode


class CursorError(ValueError):
    """A cursor this log did not hand out."""


def parse_cursor(cursor: str) -> tuple[str, int]:
    m = _CURSOR.match(cursor)
    if not m:
        raise CursorError(f"cursor {cursor!r} is not one this audit log gave (expected <day>:<offset>)")
    return m.group(1), int(m.group(2))


class DayFiles:
    """The audit log of one home: append, page newest first, remove whole old days."""

    def __init__(self, folder: Path, fsync: bool = False) -> None:
        self.folder = Path(folder)
        self.fsync = fsync

    def path(self, day: str) -> Path:
        return self.folder / f"{day}.jsonl"

    def append(self, ev: AuditEvent) -> None:
        line = _encode(ev) + b"\n"
        path = self.path(ev.day())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            written = os.write(fd, line)  # one write: O_APPEND places the whole line at the end
            if written != len(line):
                raise OSError(f"short write to {path}: {written} of {len(line)} bytes (disk full?)")
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def days(self) -> list[str]:
        """The days that have a file, newest first."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted((m.group(1) for n in names if (m := _DAY_FILE.match(n))), reverse=True)

    def page(self, flt: AuditFilter, cursor: str | None = None, limit: int = 100) -> AuditPage:
        """Up to `limit` entries matching `flt`, newest first, starting after `cursor`."""
        start_day, start_off = parse_cursor(cursor) if cursor else (None, None)
        hi = day_of(flt.until) if flt.until is not None else None
        lo = day_of(flt.since - ORDER_SLACK_S) if flt.since is not None else None
        needles = [b'"%s":%s' % (k.encode(), _encode(v)) for k, v in flt.exact().items()]
        found: list[AuditEvent] = []
        scanned = 0
        for day in self.days():
            if (start_day is not None and day > start_day) or (hi is not None and day > hi):
                continue
            if lo is not None and day < lo:
                break
            end = start_off if day == start_day else None
            for off, raw, size in self._lines(day, end, needles):
                scanned += size
                if raw is not None and all(n in raw for n in needles):
                    ev = _decode_or_none(raw)
                    if ev is not None and flt.since is not None and ev.ts < flt.since - ORDER_SLACK_S:
                        break  # older than the window: the rest of this day is older still
                    if ev is not None and flt.matches(ev):
                        found.append(ev)
                        if len(found) == limit:
                            return AuditPage(found, f"{day}:{off}")
                if scanned >= MAX_SCAN_BYTES:  # a rare filter: the next page reads on from here
                    return AuditPage(found, f"{day}:{off}")
        return AuditPage(found, None)

    def _lines(self, day: str, end: int | None, needles: list[bytes]) -> Iterator[tuple[int, bytes | None, int]]:
        try:
            fh = open(self.path(day), "rb")
        except FileNotFoundError:
            return
        with fh:
            yield from lines_before(fh, end, BLOCK, needles)

    def remove_before(self, day: str) -> list[str]:
        """Delete the whole day files older than `day` (YYYY-MM-DD); the days removed."""
        gone = []
        for d in self.days():
            if d < day:
                try:
                    os.unlink(self.path(d))
                    gone.append(d)
                except FileNotFoundError:  # another worker's sweep was first
                    pass
        return gone


def _decode_or_none(raw: bytes) -> AuditEvent | None:
    try:
        return _decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # a line this version cannot read is left out of the view, not fatal


def lines_before(fh, end: int | None, block: int = BLOCK,
                 needles: list[bytes] | None = None) -> Iterator[tuple[int, bytes | None, int]]:
    """(offset, line, bytes passed) of the complete lines of the open file `fh` that start before
    `end` (None: the end of the file), newest first. A torn last line is never returned: reading
    starts at the last newline before `end` (which is `end` itself when it is a line's start).
    With `needles`, only the lines that hold the first needle are returned (found by searching
    the block, not by splitting it), and each block ends with (offset of its oldest line, None,
    the bytes passed over): what a filter costs is its matches, not the lines it skips."""
    if end is None:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
    pos = last_newline_end(fh, end, block)  # every byte before it belongs to a whole line
    buf = b""
    while pos > 0:
        start = max(0, pos - block)
        fh.seek(start)
        buf = fh.read(pos - start) + buf
        pos = start
        cut = buf.find(b"\n") + 1 if pos > 0 else 0  # where the block's oldest whole line starts
        if pos > 0 and cut == 0:
            continue  # one line longer than the block: read on to its start
        yield from (_found(buf, pos, cut, needles[0]) if needles else _split(buf, pos, cut))
        buf = buf[:cut - 1] if pos > 0 else b""  # the partial first line goes on with the next block


def _split(buf: bytes, pos: int, cut: int) -> Iterator[tuple[int, bytes | None, int]]:
    """Every line of buf[cut:] (its last one ends the buffer, with or without a newline), newest first."""
    cur_end = pos + len(buf)
    lines = buf[cut:].split(b"\n")
    if lines[-1] == b"":
        lines.pop()
        cur_end -= 1
    for raw in reversed(lines):
        off = cur_end - len(raw)
        cur_end = off - 1
        if raw.strip():
            yield off, raw, len(raw) + 1


def _found(buf: bytes, pos: int, cut: int, needle: bytes) -> Iterator[tuple[int, bytes | None, int]]:
    """The lines of buf[cut:] that hold `needle`, newest first, then the rest of the block passed over."""
    hi = len(buf)
    while (i := buf.rfind(needle, cut, hi)) >= 0:
        s = buf.rfind(b"\n", 0, i) + 1  # >= cut: buf[cut - 1] is a newline (or cut is 0)
        e = buf.find(b"\n", i)
        yield pos + s, buf[s:e if e >= 0 else len(buf)], hi - s
        hi = s
    yield pos + cut, None, hi - cut
