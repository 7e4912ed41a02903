"""MCP answers too large to hold in memory, spooled to disk as they arrive (issue 26).

A response line from a stdio server that passes `SPOOL_BYTES` is no longer held: the transport
(`stdio.py`) writes it to a `SpoolFile`, a temp file in the calling thread's artifacts folder
(the folder the offload writes that thread's artifacts into; the name is a temp name, so it is
never linked into the sandbox and a crash's leftover is swept), bounded by
`limits.mcp_result_max_mb` and by the free space the disk must keep (`store.min_free_mb`).

When the line ends, `SpooledAnswer.open` memory-maps the file and locates the JSON-RPC response
in it with msgspec, its large values as `msgspec.Raw` (views of the mapped file, never copied):
the id, `result.content[]` (small items decoded, large texts kept as their escaped bytes),
`structuredContent` and `isError`. The SDK's session gets a small substitute result in its place
(`substitute`: `isError` set, so the SDK checks no output schema against it, and the answer's
token in `_meta`); the manager claims the answer by that token and reads it from disk
(`text_file` unescapes a large text into a second temp file in pieces of `_PIECE` bytes;
`structured_file` copies the raw JSON of a large `structuredContent`), so the offload writes the
artifact from the files (`offload.readers.parse_buffer` over a memory map). `release` removes
every file of the answer; a cancelled call, a closed connection or an answer nobody claimed
releases it too.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import tempfile
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator

import msgspec

from datadesk.store.diskspace import free_bytes
from datadesk.store.tempnames import temp_prefix

log = logging.getLogger(__name__)

SPOOL_BYTES = 8 << 20  # a response line longer than this goes to disk instead of memory
SPOOL_META = "datadesk/spooled"  # the key of the substitute result's `_meta` holding the answer's token
SPOOL_FAILED = "could not be spooled to disk"  # in the JSON-RPC error of an answer the disk refused
_CHECK_EVERY = 16 << 20  # the free space is checked every this many bytes written
_SMALL_ITEM = 1 << 20  # content items up to this size are decoded whole (images, links, short texts)
_PIECE = 4 << 20  # escaped bytes unescaped at a time
_COPY = 8 << 20
_DROP_EVERY = 32 << 20  # bytes read through a map between two drops of its pages from this process

# The folder the current call's answer is spooled into (the caller's thread's artifacts folder):
# set by the manager around `call_tool`, read by the transport when the request is sent.
SPOOL_DIR: ContextVar[Path | None] = ContextVar("datadesk_mcp_spool_dir", default=None)


class SpoolFull(OSError):
    """The disk has too little room for the rest of an answer."""


class SpoolFile:
    """One response line being written to a temp file as it streams in."""

    def __init__(self, folder: Path, rid: Any, min_free_bytes: int = 0) -> None:
        self.min_free_bytes = min_free_bytes
        self.folder = Path(folder)
        self._check()
        fd, name = tempfile.mkstemp(prefix=temp_prefix("mcp-spool"), suffix=".tmp", dir=self.folder)
        self.path = Path(name)
        self._fh = os.fdopen(fd, "wb", buffering=1 << 20)
        self.rid = rid  # the request it answers, when its head said so
        self.size = 0
        self._checked = 0

    def _check(self) -> None:
        if self.min_free_bytes <= 0:
            return
        free = free_bytes(self.folder)
        if free < self.min_free_bytes:
            raise SpoolFull(errno.ENOSPC, f"the disk has only {free / 1e6:.0f} MB free, below store.min_free_mb "
                                          f"({self.min_free_bytes / 1e6:.0f} MB)")

    def write(self, data: bytes) -> None:
        self._fh.write(data)
        self.size += len(data)
        if self.size - self._checked >= _CHECK_EVERY:
            self._checked = self.size
            self._check()

    def finish(self) -> None:
        self._fh.close()

    def discard(self) -> None:
        try:
            self._fh.close()
        except OSError:
            pass
        self.path.unlink(missing_ok=True)


# -- the response, located in the mapped file ------------------------------------------------------
_NONE = msgspec.Raw()


class _Message(msgspec.Struct):
    jsonrpc: str = ""
    id: int | str | None = None
    method: str | None = None
    result: msgspec.Raw = _NONE
    error: msgspec.Raw = _NONE


class _Result(msgspec.Struct):
    content: list[msgspec.Raw] = []
    structuredContent: msgspec.Raw = _NONE  # noqa: N815 - the protocol's name
    isError: bool = False  # noqa: N815
    meta: msgspec.Raw = msgspec.field(default=_NONE, name="_meta")


class _TextItem(msgspec.Struct):
    type: str = ""
    text: msgspec.Raw = _NONE


_STR = msgspec.json.Decoder(str)


class SpooledAnswer:
    """A response spooled to disk, located but not loaded (see the module docstring).

    `items`: the content in order, each `("item", dict)` (decoded) or `("text", Raw)` (a large
    text, escaped, a view of the file); `structured`: the decoded `structuredContent` when small,
    `structured_raw` its raw JSON when large; `rid`, `is_error`, `size` (bytes of the line)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.files: list[Path] = [path]
        self.rid: Any = None
        self.method: str | None = None
        self.error: Any = None
        self.is_error = False
        self.items: list[tuple[str, Any]] = []
        self.structured: Any = None
        self.structured_raw: msgspec.Raw | None = None
        self.delivered_at = 0.0
        self._maps: list[tuple[Any, mmap.mmap]] = []

    @classmethod
    def open(cls, path: Path, size: int) -> "SpooledAnswer":
        """Locate the response in the spooled file (ValueError: not a JSON-RPC message)."""
        answer = cls(path, size)
        try:
            answer._locate()
        except BaseException:
            answer.release()
            raise
        return answer

    def _map(self, path: Path) -> mmap.mmap | None:
        fh = open(path, "rb")
        try:
            if os.fstat(fh.fileno()).st_size == 0:
                fh.close()
                return None
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            fh.close()
            raise
        self._maps.append((fh, mm))
        return mm

    def _locate(self) -> None:
        mm = self._map(self.path)
        if mm is None:
            raise ValueError("the spooled message is empty")
        try:
            msg = msgspec.json.decode(mm, type=_Message)
        except msgspec.DecodeError as exc:
            raise ValueError(f"not a valid JSON-RPC message: {exc}") from None
        if msg.jsonrpc != "2.0":
            raise ValueError("not a JSON-RPC 2.0 message")
        self.rid, self.method = msg.id, msg.method
        if len(msg.error):
            self.error = msgspec.json.decode(msg.error)
            return
        if self.method is not None or not len(msg.result):
            return
        try:
            result = msgspec.json.decode(msg.result, type=_Result)
        except msgspec.DecodeError as exc:
            raise ValueError(f"the result is not a tool result: {exc}") from None
        self.is_error = result.isError
        for raw in result.content:
            if len(raw) <= _SMALL_ITEM:
                self.items.append(("item", msgspec.json.decode(raw)))
                continue
            item = msgspec.json.decode(raw, type=_TextItem)
            if item.type == "text" and len(item.text) >= 2 and bytes(memoryview(item.text)[:1]) == b'"':
                self.items.append(("text", item.text))
            else:  # a large image or resource: decoded as it is (within the limit)
                self.items.append(("item", msgspec.json.decode(raw)))
        if len(result.structuredContent):
            if len(result.structuredContent) <= _SMALL_ITEM:
                self.structured = msgspec.json.decode(result.structuredContent)
            else:
                self.structured_raw = result.structuredContent
        drop_pages(mm)  # the raw file's pages are not needed again until read: out of this process's RSS

    def substitute(self, token: str) -> dict[str, Any]:
        """The small result the SDK's session gets instead (isError: no output schema is checked)."""
        self.delivered_at = time.monotonic()
        return {"content": [{"type": "text", "text": f"(an answer of {self.size:,} bytes, spooled to disk)"}],
                "isError": True, "_meta": {SPOOL_META: token}}

    # -- reading it from disk (the manager, in a worker thread) ----------------------------------
    def _temp(self, name: str) -> tuple[int, Path]:
        fd, path = tempfile.mkstemp(prefix=temp_prefix(name), suffix=".tmp", dir=self.path.parent)
        self.files.append(Path(path))
        return fd, Path(path)

    def text_file(self, raw: msgspec.Raw) -> tuple[Path, int]:
        """A large text's value unescaped into a temp file, piece by piece: (path, bytes)."""
        view = memoryview(raw)[1:-1]  # the string without its quotes
        fd, path = self._temp("mcp-text")
        written = 0
        raw_map = self._maps[0][1] if self._maps else None
        with os.fdopen(fd, "wb") as out:
            pos, end, dropped = 0, len(view), 0
            while pos < end:
                stop, data = _unescape_piece(view, pos, min(end, pos + _PIECE), end)
                out.write(data)
                written += len(data)
                pos = stop
                if raw_map is not None and pos - dropped >= _DROP_EVERY:
                    dropped = pos
                    drop_pages(raw_map)
        if raw_map is not None:
            drop_pages(raw_map)
        return path, written

    def structured_file(self) -> Path:
        """The raw JSON of a large structuredContent, copied into a temp file."""
        assert self.structured_raw is not None
        view = memoryview(self.structured_raw)
        fd, path = self._temp("mcp-json")
        with os.fdopen(fd, "wb") as out:
            for pos in range(0, len(view), _COPY):
                out.write(view[pos:pos + _COPY])
        return path

    def mapped(self, path: Path) -> mmap.mmap | None:
        """`path` (one of this answer's files) memory-mapped; unmapped on release (None: empty)."""
        return self._map(path)

    def release(self) -> None:
        """Remove every file of the answer (safe to call twice, from any thread)."""
        self.items, self.structured_raw = [], None  # the views of the maps go first
        maps, self._maps = self._maps, []
        for fh, mm in maps:
            try:
                mm.close()
            except BufferError:  # a reader still holds a view: unmapped when it is collected
                pass
            fh.close()
        files, self.files = self.files, []
        for path in files:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not remove the spooled MCP answer %s: %s", path, exc)


def drop_pages(mm: mmap.mmap) -> None:
    """Unmap the pages of `mm` from this process (they stay in the page cache and come back when
    read again): a file read through once does not count as this process's memory."""
    try:
        mm.madvise(mmap.MADV_DONTNEED)
    except (ValueError, OSError):  # closed meanwhile, or not allowed here
        pass


def dropping(batches: Iterator[Any], mm: mmap.mmap, every: int = 16) -> Iterator[Any]:
    """`batches` read from `mm`, its pages dropped from this process every `every` batches."""
    for n, batch in enumerate(batches, 1):
        if n % every == 0:
            drop_pages(mm)
        yield batch


def _unescape_piece(view: memoryview, pos: int, stop: int, end: int) -> tuple[int, bytes]:
    """The UTF-8 bytes of the escaped string piece `view[pos:stop]`, cut back (at most 12 bytes)
    where `stop` falls inside an escape, a surrogate pair or a UTF-8 sequence: (where it ended, bytes)."""
    for cut in range(stop, max(pos, stop - 12) - 1, -1):
        if cut <= pos:
            break
        try:
            text = _STR.decode(b'"' + view[pos:cut] + b'"')
            return cut, text.encode("utf-8")
        except (msgspec.DecodeError, UnicodeEncodeError):
            if cut == end:
                break
    try:
        text = _STR.decode(b'"' + view[pos:stop] + b'"')
    except msgspec.DecodeError as exc:
        raise ValueError(f"the text of the spooled answer is not a valid JSON string near byte {pos:,}: {exc}") \
            from None
    return stop, text.encode("utf-8", "replace")  # a lone surrogate the JSON held: replaced
