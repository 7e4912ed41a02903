"""A bounded stdio transport for MCP servers, used instead of the SDK's `stdio_client`.

The SDK's reader appends every chunk to one unbounded text buffer and splits it again
(`(buffer + chunk).split("\\n")`): a 500 MB line costs all that memory and quadratic time on the
event loop. Here stdout is read as bytes by `LineSplitter` (`framing.py`): linear time, at most `SPOOL_BYTES`
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
import logging
import math
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
from mcp.client.stdio import (  # the SDK's spawn and shutdown, reused on purpose (see above)
    StdioServerParameters, _aclose_all, _create_platform_compatible_process, _drain_stdout,
    _get_executable_command, _stop_server_process, _WRITER_FLUSH_TIMEOUT, get_default_environment,
)
from mcp.shared.message import SessionMessage

from datadesk.tools.mcp.framing import (
    LineSplitter, Oversized, parse_message, scan_head, scan_tail, spool_failed_error,
    too_large_error, too_large_text,
)
from datadesk.tools.mcp.spool import SPOOL_BYTES, SPOOL_DIR, SPOOL_FAILED, SpooledAnswer, SpoolFile

THREAD_PARSE_BYTES = 1 << 20  # messages at least this big are parsed in a worker thread
_UNCLAIMED_S = 600.0  # a spooled answer nobody claimed within this is removed

log = logging.getLogger(__name__)


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

    def _settled(self, rid: Any) -> None:
        """The request `rid` needs no answer routed any more: not pending, no spool folder."""
        self.pending.discard(rid)
        self.targets.pop(rid, None)

    def _forget(self, rid: Any) -> None:
        """The request `rid` is over on our side (cancelled): drop whatever of its answer is kept."""
        self._settled(rid)
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
                self._settled(msg.message.id)
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
        self._settled(rid)
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
                self._settled(rid)
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
        self._settled(rid)
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
