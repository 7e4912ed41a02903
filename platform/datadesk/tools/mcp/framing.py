"""Cutting an MCP server's stdout into JSON-RPC messages, bounded (used by `stdio.py`).

`LineSplitter` turns byte chunks into newline-delimited messages in linear time, holding at most
`SPOOL_BYTES` of a response in memory (the rest goes to its spool file, `spool.py`) and skipping a
line past `limits.mcp_result_max_mb` as it streams (`Oversized`: its size and a small head and
tail). `scan_head` / `scan_tail` find the id of a message that was not kept, so its request can be
answered with `too_large_error` / `spool_failed_error` at once; `parse_message` decodes one line
(msgspec, then the SDK's validation).
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Callable

import msgspec
import mcp_types as types
from mcp.shared.message import SessionMessage

from datadesk.tools.mcp.spool import SPOOL_FAILED, SpoolFile

LIMIT_SETTING = "limits.mcp_result_max_mb"
HELD_MAX_BYTES = 32 << 20  # a message never spooled (the server's own requests) is held up to this
_KEEP = 4096  # bytes kept of an oversized line's head and tail (to find its id)

log = logging.getLogger(__name__)


def too_large_text(limit_bytes: int) -> str:
    """'more than 32 MB (limits.mcp_result_max_mb)': the words every transport's refusal uses."""
    return f"more than {limit_bytes / 2**20:g} MB ({LIMIT_SETTING})"


def too_large_error(request_id: Any, limit_bytes: int, size: int) -> SessionMessage:
    """The JSON-RPC error that answers a request whose response was too large."""
    err = types.ErrorData(code=types.INTERNAL_ERROR, message=f"the response was {too_large_text(limit_bytes)}",
                          data={"limit": LIMIT_SETTING, "limit_bytes": limit_bytes, "bytes_seen": size})
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=err))


def spool_failed_error(request_id: Any, why: str, size: int) -> SessionMessage:
    """The JSON-RPC error that answers a request whose response the disk had no room for."""
    err = types.ErrorData(code=types.INTERNAL_ERROR, message=f"the response {SPOOL_FAILED}: {why}",
                          data={"bytes_seen": size})
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=err))


# -- splitting stdout into lines, bounded ---------------------------------------------------
class Oversized:
    """A line skipped as it streams (past the limit, or refused by the disk: `why`): its size so
    far and a small head and tail."""

    __slots__ = ("head", "tail", "size", "answered", "why")

    def __init__(self, head: bytes, tail: bytes, size: int, why: str | None = None) -> None:
        self.head = head
        self.tail = tail
        self.size = size
        self.answered = False  # its request already got the error
        self.why = why  # None: too large; else why the disk refused it

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        self.tail = piece[-_KEEP:] if len(piece) >= _KEEP else (self.tail + piece)[-_KEEP:]


class LineSplitter:
    """Newline-delimited messages from byte chunks, in linear time, holding at most `max_bytes`
    (with spooling: at most `spool_bytes` of a response, the rest in its spool file).

    `feed` returns events: ("line", bytes) for a complete line held in memory,
    ("spooled", SpoolFile) for a complete line written to its spool file,
    ("oversized", Oversized) when a line passes the limit or the disk refuses it (what was held
    or spooled is dropped), ("oversized_end", Oversized) when that line ends.

    `open_spool(head)` opens the spool file of a line that passes `spool_bytes` (None: a message
    that is not a response, held in memory up to `held_max`; OSError: the disk refused it)."""

    def __init__(self, max_bytes: int, spool_bytes: int | None = None,
                 open_spool: Callable[[bytes], SpoolFile | None] | None = None,
                 held_max: int = HELD_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        spooling = open_spool is not None and spool_bytes is not None and spool_bytes < max_bytes
        self.spool_bytes = spool_bytes if spooling else None
        self.open_spool = open_spool
        self.held_max = min(max_bytes, max(held_max, spool_bytes or 0)) if spooling else max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self.big: Oversized | None = None
        self.spool: SpoolFile | None = None
        self._spool_head = b""
        self._spool_tail = b""
        self._tried = False  # this line asked open_spool already
        self.partial_since: float | None = None  # monotonic time the current partial line began

    @property
    def held(self) -> int:
        """Bytes of the current partial line held in memory now (0 while skipped or spooled)."""
        return self._size

    @property
    def partial_size(self) -> int:
        """Bytes of the current partial line so far, wherever they are."""
        if self.big is not None:
            return self.big.size
        return self.spool.size if self.spool is not None else self._size

    def feed(self, chunk: bytes) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            piece = chunk[pos:] if nl < 0 else chunk[pos:nl]
            if piece:
                self._add(piece, out)
            if nl < 0:
                break
            self._end_line(out)
            pos = nl + 1
        if (self._size or self.big is not None or self.spool is not None) and self.partial_since is None:
            self.partial_since = time.monotonic()
        return out

    def _add(self, piece: bytes, out: list[tuple[str, Any]]) -> None:
        if self.big is not None:
            self.big.add(piece)
            return
        if self.spool is not None:
            self._spool_tail = piece[-_KEEP:] if len(piece) >= _KEEP else (self._spool_tail + piece)[-_KEEP:]
            try:
                self.spool.write(piece)
            except OSError as exc:
                self._skip_spool(out, _disk_reason(exc))
                return
            if self.spool.size > self.max_bytes:
                self._skip_spool(out)
            return
        self._parts.append(piece)
        self._size += len(piece)
        if self.spool_bytes is not None and self._size > self.spool_bytes and not self._tried:
            self._tried = True
            self._start_spool(out)
            if self.spool is not None and self.spool.size > self.max_bytes:
                self._skip_spool(out)
            if self.spool is not None or self.big is not None:
                return
        if self._size > self.held_max:
            self.big = Oversized(_head(self._parts), _tail(self._parts), self._size)
            self._parts, self._size = [], 0
            out.append(("oversized", self.big))

    def _start_spool(self, out: list[tuple[str, Any]]) -> None:
        head = _head(self._parts)
        try:
            spool = self.open_spool(head) if self.open_spool is not None else None
            if spool is None:
                return
            try:
                for part in self._parts:
                    spool.write(part)
            except OSError:
                spool.discard()
                raise
        except OSError as exc:
            self.big = Oversized(head, _tail(self._parts), self._size, why=_disk_reason(exc))
            self._parts, self._size = [], 0
            out.append(("oversized", self.big))
            return
        self.spool, self._spool_head, self._spool_tail = spool, head, _tail(self._parts)
        self._parts, self._size = [], 0

    def _skip_spool(self, out: list[tuple[str, Any]], why: str | None = None, answered: bool = False) -> None:
        """The line being spooled is skipped from here on (too large, the disk, or cancelled)."""
        spool, self.spool = self.spool, None
        if spool is None:
            return
        spool.discard()
        self.big = Oversized(self._spool_head, self._spool_tail, spool.size, why=why)
        self.big.answered = answered
        if not answered:
            out.append(("oversized", self.big))

    def abort(self, rid: Any) -> bool:
        """The request `rid` was cancelled: its answer being spooled is dropped (file removed)."""
        if self.spool is not None and self.spool.rid is not None and self.spool.rid == rid:
            self._skip_spool([], answered=True)
            return True
        return False

    def discard(self) -> None:
        """The connection ends: a line being spooled goes."""
        if self.spool is not None:
            self.spool.discard()
            self.spool = None

    def _end_line(self, out: list[tuple[str, Any]]) -> None:
        self.partial_since = None
        self._tried = False
        if self.big is not None:
            out.append(("oversized_end", self.big))
            self.big = None
            return
        if self.spool is not None:
            spool = self.spool
            try:
                spool.finish()
            except OSError as exc:
                self._skip_spool(out, _disk_reason(exc))
                out.append(("oversized_end", self.big))
                self.big = None
                return
            self.spool = None
            out.append(("spooled", spool))
            return
        line = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts, self._size = [], 0
        if line and not line.isspace():
            out.append(("line", line))


def _disk_reason(exc: OSError) -> str:
    return str(exc.args[1]) if len(exc.args) >= 2 and exc.args[1] else (exc.strerror or str(exc))


def _head(parts: list[bytes]) -> bytes:
    got: list[bytes] = []
    n = 0
    for p in parts:
        got.append(p[:_KEEP - n])
        n += len(got[-1])
        if n >= _KEEP:
            break
    return b"".join(got)


def _tail(parts: list[bytes]) -> bytes:
    got: list[bytes] = []
    n = 0
    for p in reversed(parts):
        got.append(p[-(_KEEP - n):])
        n += len(got[-1])
        if n >= _KEEP:
            break
    return b"".join(reversed(got))


# -- finding the id of a message we did not keep ------------------------------------------------
_KEY = re.compile(rb'\s*"([A-Za-z_]{1,32})"\s*:\s*')
_SCALAR = re.compile(rb'("(?:[^"\\]|\\.){0,256}"|-?\d{1,20}|true|false|null)\s*([,}])')
_TAIL_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,20}|"(?:[^"\\]|\\.){0,256}")\s*'
                      rb'(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')


def scan_head(head: bytes) -> tuple[str | None, Any]:
    """(first top-level key, id if among the leading scalar keys) of a message's first bytes.

    Python servers (pydantic) write `{"jsonrpc":"2.0","id":7,"result":...`; a first key
    `method` means a request or notification from the server, not a response."""
    m = re.match(rb"\s*\{", head)
    if m is None:
        return None, None
    pos, first, rid = m.end(), None, None
    while (k := _KEY.match(head, pos)) is not None:
        key = k.group(1).decode()
        first = first or key
        v = _SCALAR.match(head, k.end())
        if v is None:
            break
        if key == "id":
            rid = _id(v.group(1))
        if v.group(2) == b"}":
            break
        pos = v.end()
    return first, rid


def scan_tail(tail: bytes) -> Any:
    """The id of a message that ends with it (TypeScript servers: `...,"jsonrpc":"2.0","id":7}`)."""
    m = _TAIL_ID.search(tail)
    return _id(m.group(1)) if m else None


def _id(raw: bytes) -> Any:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def parse_message(data: bytes) -> SessionMessage | Exception:
    """One line to a SessionMessage; a bad line is returned as the exception (the SDK's contract)."""
    adapter = types.jsonrpc_message_adapter
    try:
        try:
            decoded = msgspec.json.decode(data)
        except msgspec.DecodeError:  # what msgspec refuses (ints past 64 bits, 1e400...): the SDK's parser decides
            message = adapter.validate_json(data, by_name=False)
        else:
            message = adapter.validate_python(decoded, by_name=False)
    except ValueError as exc:  # msgspec.DecodeError and pydantic's ValidationError both are
        log.warning("an MCP server sent a message that is not valid JSON-RPC (%d bytes): %s",
                    len(data), str(exc)[:300])
        return exc
    return SessionMessage(message)
