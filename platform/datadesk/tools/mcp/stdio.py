"""A bounded stdio transport for MCP servers, used instead of the SDK's `stdio_client`.

The SDK's reader appends every chunk to one unbounded text buffer and splits it again
(`(buffer + chunk).split("\\n")`): a 500 MB line costs all that memory and quadratic time on the
event loop. Here stdout is read as bytes by `LineSplitter`: linear time, at most `max_bytes` held
for one message. A longer line is skipped while it streams (only a small head and tail are kept)
and the request it answered gets a JSON-RPC error at once (`too_large_error`): `call_tool` fails
naming the limit instead of waiting for its timeout, and the connection stays usable. A partial
line that does not end within `line_timeout_s` (a server trickling an endless line) closes the
connection, which the manager then restarts.

Messages are decoded with msgspec and validated with the SDK's `jsonrpc_message_adapter`
(`validate_python`; what msgspec refuses, such as ints past 64 bits, goes to the SDK's own
`validate_json`, so whatever the SDK accepted is accepted): about 20 times faster than its `validate_json` on large results (28 MB of
rows: 0.12 s instead of 2.6 s), which matters because either holds the GIL, so a worker thread
(used above `THREAD_PARSE_BYTES`) alone would not keep the loop responsive.

Spawning and shutdown are the SDK's own helpers (own session / process group; stdin closed,
grace period, SIGTERM, SIGKILL of the group), so those semantics stay exactly the SDK's.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any, TextIO

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

LIMIT_SETTING = "limits.mcp_result_max_mb"
THREAD_PARSE_BYTES = 1 << 20  # messages at least this big are parsed in a worker thread
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


# -- splitting stdout into lines, bounded ---------------------------------------------------
class Oversized:
    """A line past the limit, skipped as it streams: its size so far and a small head and tail."""

    __slots__ = ("head", "tail", "size", "answered")

    def __init__(self, head: bytes, tail: bytes, size: int) -> None:
        self.head = head
        self.tail = tail
        self.size = size
        self.answered = False  # its request already got the error

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        self.tail = piece[-_KEEP:] if len(piece) >= _KEEP else (self.tail + piece)[-_KEEP:]


class LineSplitter:
    """Newline-delimited messages from byte chunks, in linear time, holding at most `max_bytes`.

    `feed` returns events: ("line", bytes) for a complete line within the limit,
    ("oversized", Oversized) when a line passes the limit (what was held is dropped),
    ("oversized_end", Oversized) when that line ends."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self.big: Oversized | None = None
        self.partial_since: float | None = None  # monotonic time the current partial line began

    @property
    def held(self) -> int:
        """Bytes of the current partial line held now (0 while an oversized line is skipped)."""
        return self._size

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
        if (self._size or self.big is not None) and self.partial_since is None:
            self.partial_since = time.monotonic()
        return out

    def _add(self, piece: bytes, out: list[tuple[str, Any]]) -> None:
        if self.big is not None:
            self.big.add(piece)
            return
        self._parts.append(piece)
        self._size += len(piece)
        if self._size > self.max_bytes:
            self.big = Oversized(_head(self._parts), _tail(self._parts), self._size)
            self._parts, self._size = [], 0
            out.append(("oversized", self.big))

    def _end_line(self, out: list[tuple[str, Any]]) -> None:
        self.partial_since = None
        if self.big is not None:
            out.append(("oversized_end", self.big))
            self.big = None
            return
        line = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts, self._size = [], 0
        if line and not line.isspace():
            out.append(("line", line))


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
    """One server process and the two pipe tasks between it and the session's streams."""

    def __init__(self, process: Any, max_bytes: int, line_timeout_s: float, logger: logging.Logger) -> None:
        self.process = process
        self.max_bytes = max_bytes
        self.line_timeout_s = line_timeout_s
        self.log = logger
        self.pending: set[Any] = set()  # ids of our requests not answered yet
        self.close_reason: str | None = None  # why we ended the connection ourselves
        self.shutting_down = False
        self.to_session, self.read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        self.write_stream, self.from_session = anyio.create_memory_object_stream[SessionMessage](0)
        self.writer_done = anyio.Event()

    async def stdout_reader(self) -> None:
        splitter = LineSplitter(self.max_bytes)
        try:
            try:
                async with self.to_session:  # closed first: the session sees the end at once
                    await self._read(splitter)
            finally:
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
            with anyio.move_on_after(wait) as scope:
                chunk = await stdout.receive()
            if scope.cancelled_caught:
                self._give_up(splitter)
                return
            for kind, item in splitter.feed(chunk):
                try:
                    await self._deliver(kind, item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # the session is gone; only the drain remains

    def _give_up(self, splitter: LineSplitter) -> None:
        size = splitter.big.size if splitter.big is not None else splitter.held
        self.close_reason = (f"the server sent a message that did not end within {self.line_timeout_s:g} s "
                             f"(timeout_s; {size:,} bytes so far)")
        self.log.warning("MCP server: %s; closing the connection", self.close_reason)

    async def _deliver(self, kind: str, item: Any) -> None:
        if kind == "line":
            msg = await self._parse(item)
            if isinstance(msg, SessionMessage) and isinstance(msg.message, (types.JSONRPCResponse,
                                                                            types.JSONRPCError)):
                self.pending.discard(msg.message.id)
            await self.to_session.send(msg)
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
        self.log.warning("MCP server: the response to request %r is %s; skipped", rid,
                         too_large_text(self.max_bytes))
        await self.to_session.send(too_large_error(rid, self.max_bytes, big.size))

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
                        self.pending.discard((message.params or {}).get("requestId"))
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
        await anyio.lowlevel.checkpoint()


@asynccontextmanager
async def bounded_stdio_client(server: StdioServerParameters, errlog: TextIO, *, max_bytes: int,
                               line_timeout_s: float, logger: logging.Logger | None = None,
                               ) -> AsyncGenerator[tuple[Any, Any, BoundedStdio], None]:
    """Spawn the server like the SDK's `stdio_client` and yield (read, write, transport).

    `transport.close_reason` says why the connection ended when we ended it."""
    command = await _get_executable_command(server.command)
    process = await _create_platform_compatible_process(
        command=command, args=server.args, env=get_default_environment() | (server.env or {}),
        errlog=errlog, cwd=server.cwd)
    # No awaits until the task group is entered, or a cancellation would leak the process.
    t = BoundedStdio(process, max_bytes, line_timeout_s, logger or log)
    async with anyio.create_task_group() as tg:
        tg.start_soon(t.stdout_reader)
        tg.start_soon(t.stdin_writer)
        try:
            yield t.read_stream, t.write_stream, t
        finally:
            t.shutting_down = True
            with anyio.CancelScope(shield=True):  # every wait inside is bounded
                await t.shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
