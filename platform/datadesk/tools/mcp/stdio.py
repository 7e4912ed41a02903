"""A bounded stdio transport for MCP servers, used instead of the SDK's `stdio_client`.

The SDK's reader appends every chunk to one unbounded text buffer and splits it again
(`(buffer + chunk).split("\\n")`): a 500 MB line costs all that memory and quadratic time on the
event loop. Here stdout is read as bytes by `LineSplitter`: linear time, at most `SPOOL_BYTES`
(8 MB) of one message held in memory. A longer response is spooled to a temp file as it streams
(`spool.py`: in the calling thread's artifacts folder, which the manager names through
`SPOOL_DIR` around its call) and, once complete, located in the file and handed to the session as
a small substitute result the manager claims (`claim`). A line past `max_bytes`
(`limits.mcp_result_max_mb`) is skipped while it streams (only a small head and tail are kept,
its spool file removed) and the request it answered gets a JSON-RPC error at once
(`too_large_error`): `call_tool` fails naming the limit instead of waiting for its timeout, and
the connection stays usable; so does an answer the disk has no room for (`spool_failed_error`).
A message the server sends of its own (a request, a notification) is never spooled: held up to
`HELD_MAX_BYTES`. A cancelled call's spool file is removed at once. A partial line that does not
end within `line_timeout_s` (a server trickling an endless line) closes the connection, which the
manager then restarts.

Messages are decoded with msgspec and validated with the SDK's `jsonrpc_message_adapter`
(`validate_python`; what msgspec refuses, such as ints past 64 bits, goes to the SDK's own
`validate_json`, so whatever the SDK accepted is accepted): about 20 times faster than its `validate_json` on large results (28 MB of
rows: 0.12 s instead of 2.6 s), which matters because either holds the GIL, so a worker thread
(used above `THREAD_PARSE_BYTES`) alone would not keep the loop responsive.

Spawning and shutdown are the SDK's own helpers (own session / process group; stdin closed,
grace period, SIGTERM, SIGKILL of the group), so those semantics stay exactly the SDK's.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable, TextIO

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec
import mcp_types as types
from mcp.client.stdio import (  # the SDK's spawn and shutdown, reused on purpose (see above)
    StdioServerParameters, _aclose_all, _create_platform_compatible_process, _drain_stdout,
    _get_executable_command, _stop_server_process, _WRITER_FLUSH_TIMEOUT, get_default_environment,
)
from mcp.shared.message import SessionMessage

from datadesk.tools.mcp.spool import SPOOL_BYTES, SPOOL_DIR, SPOOL_FAILED, SpooledAnswer, SpoolFile

LIMIT_SETTING = "limits.mcp_result_max_mb"
THREAD_PARSE_BYTES = 1 << 20  # messages at least this big are parsed in a worker thread
HELD_MAX_BYTES = 32 << 20  # a message never spooled (the server's own requests) is held up to this
_KEEP = 4096  # bytes kept of an oversized line's head and tail (to find its id)
_UNCLAIMED_S = 600.0  # a spooled answer nobody claimed within this is removed

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


# -- the transport ------------------------------------------------------------------------------
class BoundedStdio:
    """One server process and the two pipe tasks between it and the session's streams.

    `spool_dir`: where an answer is spooled when its request named no folder (`SPOOL_DIR`);
    `min_free_bytes`: the free space a spool leaves on its disk (`store.min_free_mb`)."""

    def __init__(self, process: Any, max_bytes: int, line_timeout_s: float, logger: logging.Logger,
                 spool_dir: Path | None = None, min_free_bytes: int = 0, spool_bytes: int = SPOOL_BYTES) -> None:
        self.process = process
        self.max_bytes = max_bytes
        self.line_timeout_s = line_timeout_s
        self.log = logger
        self.spool_dir = spool_dir
        self.min_free_bytes = min_free_bytes
        self.pending: set[Any] = set()  # ids of our requests not answered yet
        self.targets: dict[Any, Path] = {}  # request id -> the folder its answer is spooled into
        self.answers: dict[str, SpooledAnswer] = {}  # token -> a spooled answer not claimed yet
        self.delivered: dict[Any, str] = {}  # request id -> the token of its spooled answer
        self.splitter = LineSplitter(max_bytes, spool_bytes, self._open_spool)
        self.close_reason: str | None = None  # why we ended the connection ourselves
        self.exit_code: int | None = None  # the server's exit status, once it closed its output and exited
        self.shutting_down = False
        self.to_session, self.read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        self.write_stream, self.from_session = anyio.create_memory_object_stream[SessionMessage](0)
        self.writer_done = anyio.Event()

    # -- spooled answers ------------------------------------------------------------------------
    def _open_spool(self, head: bytes) -> SpoolFile | None:
        first, rid = scan_head(head)
        if first == "method":
            return None  # the server's own request or notification: nobody's answer
        folders = [self.targets[r] for r in self.pending if r in self.targets]
        folder = self.targets.get(rid) if rid is not None else (folders[0] if len(set(folders)) == 1 else None)
        for candidate in (folder, self.spool_dir):
            if candidate is None:
                continue
            try:
                candidate.mkdir(exist_ok=True)  # never its parents: a thread deleted meanwhile stays deleted
            except FileNotFoundError:
                continue
            return SpoolFile(candidate, rid, self.min_free_bytes)
        raise OSError(errno.ENOENT, "no folder to spool it into (the calling thread's folder is gone)")

    def claim(self, token: str) -> SpooledAnswer | None:
        """The spooled answer a substitute result names (None: gone, e.g. the call was cancelled)."""
        answer = self.answers.pop(token, None)
        if answer is not None:
            self.delivered.pop(answer.rid, None)
        return answer

    def _forget(self, rid: Any) -> None:
        """The request `rid` is over on our side (cancelled): drop whatever of its answer is kept."""
        self.pending.discard(rid)
        self.targets.pop(rid, None)
        if self.splitter.abort(rid):
            self.log.info("MCP server: the answer to the cancelled request %r was being spooled; removed", rid)
        token = self.delivered.pop(rid, None)
        answer = self.answers.pop(token, None) if token is not None else None
        if answer is not None:
            answer.release()

    def _expire(self) -> None:
        now = time.monotonic()
        for token, answer in list(self.answers.items()):
            if now - answer.delivered_at > _UNCLAIMED_S:
                self.log.warning("MCP server: a spooled answer of %d bytes was never claimed; removed", answer.size)
                self.claim(token)
                answer.release()

    def release_all(self) -> None:
        self.splitter.discard()
        for token in list(self.answers):
            answer = self.claim(token)
            if answer is not None:
                answer.release()

    async def stdout_reader(self) -> None:
        splitter = self.splitter
        try:
            try:
                async with self.to_session:  # closed first: the session sees the end at once
                    await self._read(splitter)
            finally:
                splitter.discard()
                await _drain_stdout(self.process)  # until shutdown closes the pipe
        except (anyio.ClosedResourceError, anyio.EndOfStream):
            pass  # our own shutdown closed stdout under the read, or the server closed it
        except (anyio.BrokenResourceError, ConnectionError):
            if not self.shutting_down:
                self.log.exception("Reading from the MCP server's stdout failed mid-session")

    async def _read(self, splitter: LineSplitter) -> None:
        stdout = self.process.stdout
        while True:
            wait = math.inf
            if splitter.partial_since is not None:
                wait = max(0.0, splitter.partial_since + self.line_timeout_s - time.monotonic())
            try:
                with anyio.move_on_after(wait) as scope:
                    chunk = await stdout.receive()
            except anyio.EndOfStream:
                await self._note_exit()
                raise
            if scope.cancelled_caught:
                self._give_up(splitter)
                return
            for kind, item in splitter.feed(chunk):
                try:
                    await self._deliver(kind, item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # the session is gone; only the drain remains

    async def _note_exit(self) -> None:
        """The server closed its output: its exit status, when it follows within a second."""
        with anyio.move_on_after(1.0):
            await self.process.wait()
        self.exit_code = self.process.returncode

    def _give_up(self, splitter: LineSplitter) -> None:
        size = splitter.partial_size
        splitter.discard()
        self.close_reason = (f"the server sent a message that did not end within {self.line_timeout_s:g} s "
                             f"(timeout_s; {size:,} bytes so far)")
        self.log.warning("MCP server: %s; closing the connection", self.close_reason)

    async def _deliver(self, kind: str, item: Any) -> None:
        if kind == "line":
            msg = await self._parse(item)
            if isinstance(msg, SessionMessage) and isinstance(msg.message, (types.JSONRPCResponse,
                                                                            types.JSONRPCError)):
                self.pending.discard(msg.message.id)
                self.targets.pop(msg.message.id, None)
            await self.to_session.send(msg)
            return
        if kind == "spooled":
            await self._deliver_spooled(item)
            return
        big: Oversized = item
        first, rid = scan_head(big.head)
        if first == "method":  # a request or notification of the server's own: skipped, nobody waits
            if kind == "oversized":
                self.log.warning("MCP server: skipped a message of %s from the server", too_large_text(self.max_bytes))
            return
        if kind == "oversized_end" and rid is None:
            rid = scan_tail(big.tail)
            if rid is None and len(self.pending) == 1:
                rid = next(iter(self.pending))
        if big.answered or rid is None:
            if kind == "oversized_end" and not big.answered:
                self.log.warning("MCP server: skipped a response of %d bytes; no pending request matched it",
                                 big.size)
            return
        if rid not in self.pending:
            return
        big.answered = True
        self.pending.discard(rid)
        self.targets.pop(rid, None)
        if big.why is not None:
            self.log.warning("MCP server: the response to request %r %s: %s; skipped", rid, SPOOL_FAILED, big.why)
            await self.to_session.send(spool_failed_error(rid, big.why, big.size))
            return
        self.log.warning("MCP server: the response to request %r is %s; skipped", rid,
                         too_large_text(self.max_bytes))
        await self.to_session.send(too_large_error(rid, self.max_bytes, big.size))

    async def _deliver_spooled(self, spool: SpoolFile) -> None:
        """A complete response on disk: located in a worker thread, handed on as a substitute."""
        self._expire()
        try:
            answer = await anyio.to_thread.run_sync(SpooledAnswer.open, spool.path, spool.size)
        except (ValueError, OSError) as exc:
            spool.discard()
            self.log.warning("MCP server: a spooled message of %d bytes is not valid JSON-RPC: %s", spool.size, exc)
            rid = spool.rid
            if rid is not None and rid in self.pending:
                self.pending.discard(rid)
                self.targets.pop(rid, None)
                err = types.ErrorData(code=types.INTERNAL_ERROR,
                                      message=f"the response ({spool.size:,} bytes) is not valid JSON-RPC: {exc}")
                await self.to_session.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=rid, error=err)))
            return
        rid = answer.rid
        if answer.method is not None or rid not in self.pending:
            self.log.warning("MCP server: skipped a spooled message of %d bytes (%s)", answer.size,
                             "the server's own request" if answer.method else "no pending request matched it")
            answer.release()
            return
        self.pending.discard(rid)
        self.targets.pop(rid, None)
        if answer.error is not None:
            answer.release()
            try:
                err = types.ErrorData.model_validate(answer.error)
            except ValueError:
                err = types.ErrorData(code=types.INTERNAL_ERROR, message="the server answered with an invalid error")
            await self.to_session.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=rid, error=err)))
            return
        token = secrets.token_hex(12)
        self.answers[token] = answer
        self.delivered[rid] = token
        self.log.info("MCP server: the response to request %r (%d bytes) was spooled to disk", rid, answer.size)
        await self.to_session.send(SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=rid,
                                                                        result=answer.substitute(token))))

    async def _parse(self, data: bytes) -> SessionMessage | Exception:
        if len(data) < THREAD_PARSE_BYTES:
            return parse_message(data)
        return await anyio.to_thread.run_sync(parse_message, data)

    async def stdin_writer(self) -> None:
        stdin = self.process.stdin
        try:
            async with self.from_session:
                async for session_message in self.from_session:
                    message = session_message.message
                    if isinstance(message, types.JSONRPCRequest):
                        self.pending.add(message.id)
                    elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                        self._forget((message.params or {}).get("requestId"))
                    text = message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send((text + "\n").encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still be alive: end the read side so no request hangs forever.
            await self.to_session.aclose()
        finally:
            self.writer_done.set()

    async def shutdown(self) -> None:
        """The SDK's order: stop traffic, flush briefly, stop the server, release the streams."""
        self.read_stream.close()
        self.write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT) as flush_scope:
            await self.writer_done.wait()
        if flush_scope.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await _stop_server_process(self.process)
        await _aclose_all(self.read_stream, self.write_stream, self.to_session, self.from_session)
        self.release_all()
        await anyio.lowlevel.checkpoint()


class _TargetedSend:
    """The session's write stream: notes, for each request sent, the folder the caller named in
    `SPOOL_DIR` (read here because `send` runs in the caller's task, with its context)."""

    def __init__(self, inner: Any, transport: BoundedStdio) -> None:
        self._inner = inner
        self._t = transport

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            folder = SPOOL_DIR.get()
            if folder is not None:
                self._t.targets[message.id] = folder
        await self._inner.send(item)

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "_TargetedSend":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


@asynccontextmanager
async def bounded_stdio_client(server: StdioServerParameters, errlog: TextIO, *, max_bytes: int,
                               line_timeout_s: float, logger: logging.Logger | None = None,
                               spool_dir: Path | None = None, min_free_bytes: int = 0,
                               ) -> AsyncGenerator[tuple[Any, Any, BoundedStdio], None]:
    """Spawn the server like the SDK's `stdio_client` and yield (read, write, transport).

    `transport.close_reason` says why the connection ended when we ended it; `transport.claim`
    hands over a spooled answer."""
    command = await _get_executable_command(server.command)
    process = await _create_platform_compatible_process(
        command=command, args=server.args, env=get_default_environment() | (server.env or {}),
        errlog=errlog, cwd=server.cwd)
    # No awaits until the task group is entered, or a cancellation would leak the process.
    t = BoundedStdio(process, max_bytes, line_timeout_s, logger or log, spool_dir, min_free_bytes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(t.stdout_reader)
        tg.start_soon(t.stdin_writer)
        try:
            yield t.read_stream, _TargetedSend(t.write_stream, t), t
        finally:
            t.shutting_down = True
            with anyio.CancelScope(shield=True):  # every wait inside is bounded
                await t.shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
