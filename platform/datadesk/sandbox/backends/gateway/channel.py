"""The websocket of one gateway kernel: Jupyter messages as JSON with a `channel` field.

`GatewayChannel` is the gateway backend's counterpart of
`messaging.KernelChannel` (ZMQ): connect (kernel_info), run one execute
request with the same `execution.ExecutionCollector` (output caps, images,
trimmed tracebacks) and `execution.PendingExecution` (timeout with interrupt,
death detection); the gateway's own status news (the kernel restarted
because it died) is watched by a reader task.
The websocket client's debug log prints handshake headers (the token): it
gets a logger that never logs at DEBUG.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from datadesk.sandbox.base import (
    HEALTH_EXPRESSIONS, ErrorInfo, ExecutionResult, OnOutput, OnStatus, SandboxError, SandboxUnavailable,
)
from datadesk.sandbox.execution import (
    END,
    FILE_CAP_BYTES,
    HEAD_CHARS,
    INTERRUPT_GRACE_S,
    NEWS,
    QUIET,
    SKIP,
    TAIL_CHARS,
    ExecutionChannel,
    IsAlive,
    OnTimeout,
    Received,
)

log = logging.getLogger(__name__)
_WS_LOG = logging.getLogger(__name__ + ".websocket")
_WS_LOG.setLevel(logging.INFO)  # never DEBUG: websockets would log the Authorization header

MAX_MESSAGE_BYTES = 64 << 20  # one Jupyter message (a big image or print) on the websocket
MAX_QUEUED = 100_000  # messages kept while nobody reads (a kernel printing from a thread)


class GatewayChannel(ExecutionChannel):
    """The websocket of one kernel (bound to the event loop that opened it).

    A reader task queues incoming messages and watches the gateway's own news:
    a `restarting` or `dead` status that we did not ask for means the kernel
    process died (the gateway may have started a new one: its variables are
    gone), recorded in `lost`. `run` is `messaging.KernelChannel.run` over
    the websocket: the same `PendingExecution` wait and `ExecutionCollector`.
    """

    def __init__(self, url: str, headers: dict[str, str], run_dir: Path, is_alive: IsAlive, *,
                 head_chars: int = HEAD_CHARS, tail_chars: int = TAIL_CHARS,
                 file_cap_bytes: int = FILE_CAP_BYTES, interrupt_grace_s: float = INTERRUPT_GRACE_S):
        super().__init__(run_dir, is_alive, head_chars=head_chars, tail_chars=tail_chars,
                         file_cap_bytes=file_cap_bytes, interrupt_grace_s=interrupt_grace_s)
        self.url = url
        self.headers = headers
        self.session = uuid.uuid4().hex
        self.lost = ""  # why the kernel's state is gone ("" while it is fine)
        self.closed_reason = ""  # why the websocket closed ("" while open)
        self.expect_restart = False  # a restart we asked for: its status messages are no news
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[dict | None] = asyncio.Queue()

    @property
    def closed(self) -> bool:
        return self._ws is None or bool(self.closed_reason)

    async def open(self, timeout_s: float, describe: Any) -> None:
        """Open the websocket; `describe(response)` words an HTTP refusal (bad token, no kernel)."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        try:
            self._ws = await connect(self.url, additional_headers=self.headers, max_size=MAX_MESSAGE_BYTES,
                                     open_timeout=timeout_s, ping_interval=20, ping_timeout=60,
                                     compression=None, logger=_WS_LOG)
        except InvalidStatus as exc:
            raise SandboxUnavailable(describe(exc.response)) from None
        except (OSError, asyncio.TimeoutError, WebSocketException) as exc:
            raise SandboxUnavailable(f"cannot open the kernel websocket: {type(exc).__name__}: {exc}") from None
        self.closed_reason = ""
        self._queue = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(), name="gateway-kernel-websocket")

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        ws = self._ws
        reason = "the websocket closed"
        try:
            async for raw in ws:
                if not isinstance(raw, str):
                    continue  # binary frames carry buffers (comms); nothing here uses them
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(msg, dict):
                    continue
                if msg.get("channel") == "iopub" and _msg_type(msg) == "status":
                    state = (msg.get("content") or {}).get("execution_state")
                    if state in ("restarting", "dead") and not self.expect_restart and not self.lost:
                        self.lost = ("the kernel process died and the gateway restarted it" if state == "restarting"
                                     else "the gateway reports the kernel dead")
                    self._queue.put_nowait(msg)
                elif self._queue.qsize() < MAX_QUEUED or msg.get("channel") == "shell":
                    self._queue.put_nowait(msg)
        except ConnectionClosed as exc:
            reason = f"the websocket closed ({exc})"
        except Exception as exc:  # pragma: no cover - transport errors
            reason = f"the websocket failed: {type(exc).__name__}: {exc}"
        finally:
            self.closed_reason = reason
            self._queue.put_nowait(None)

    def _message(self, msg_type: str, content: dict, channel: str = "shell") -> dict:
        return {
            "header": {"msg_id": uuid.uuid4().hex, "username": "datadesk", "session": self.session,
                       "msg_type": msg_type, "version": "5.3",
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel, "buffers": [],
        }

    async def _send(self, msg: dict) -> None:
        from websockets.exceptions import ConnectionClosed

        if self.closed:
            raise SandboxError(f"the kernel connection is closed: {self.closed_reason or 'not open'}")
        try:
            await self._ws.send(json.dumps(msg))
        except ConnectionClosed as exc:
            raise SandboxError(f"the kernel connection closed: {exc}") from None

    def _discard_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if item is None:  # keep the end-of-stream marker
                self._queue.put_nowait(None)
                return

    async def _next(self, timeout_s: float) -> dict | None | bool:
        """The next message; None at end of stream; False when nothing came in time."""
        try:
            return await asyncio.wait_for(self._queue.get(), max(0.0, timeout_s))
        except asyncio.TimeoutError:
            return False

    async def connect(self, ready_timeout_s: float) -> None:
        """Wait until the kernel answers kernel_info (the gateway wires iopub before it lets us in)."""
        deadline = time.monotonic() + ready_timeout_s
        while True:
            request = self._message("kernel_info_request", {})
            await self._send(request)
            ask_again = time.monotonic() + 2.0
            while (left := min(ask_again, deadline) - time.monotonic()) > 0:
                msg = await self._next(left)
                if msg is None:
                    raise SandboxError(f"the kernel connection closed while starting: {self.closed_reason}")
                if msg and msg.get("channel") == "shell" and _parent_id(msg) == request["header"]["msg_id"]:
                    self._discard_queued()
                    return
            if self.lost:
                raise SandboxError(f"the kernel died while starting ({self.lost})")
            if time.monotonic() >= deadline:
                raise SandboxError(f"the kernel did not become ready within {ready_timeout_s:g} s")

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await ws.close()
            except Exception as exc:  # pragma: no cover - best effort
                log.debug("closing the kernel websocket: %s", exc)
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            try:
                await reader
            except (asyncio.CancelledError, Exception):
                pass
        self.closed_reason = self.closed_reason or "closed by the app"

    async def run(self, code: str, timeout_s: float, on_timeout: OnTimeout, *, silent: bool = False,
                  grace_s: float | None = None, on_output: OnOutput | None = None,
                  on_status: OnStatus | None = None) -> ExecutionResult:
        """Execute `code` and collect its output until the kernel goes idle (see KernelChannel.run).

        Statuses: "ok"/"error"; "timeout" after `on_timeout()` (an interrupt),
        with `settled` False when the kernel did not go idle within the grace;
        "died" when the gateway reported the kernel restarted or dead, or it
        is gone. A websocket that drops mid-run gives an error (the code is
        interrupted, the kernel kept).
        """
        self._discard_queued()
        run = self._execution(timeout_s, on_output, on_status, grace_s)
        request = self._message("execute_request", {
            "code": code, "silent": silent, "store_history": not silent, "user_expressions": dict(HEALTH_EXPRESSIONS),
            "allow_stdin": False, "stop_on_error": False})
        msg_id = request["header"]["msg_id"]
        await self._send(request)

        async def receive(timeout_s: float) -> Received:
            msg = await self._next(timeout_s)
            if msg is None:  # the websocket closed under us
                if self.lost or not await self.is_alive():
                    run.died = True
                else:
                    try:
                        await on_timeout()  # nobody can follow that code any more: stop it
                    except Exception as exc:
                        log.warning("interrupting the gateway kernel failed: %s", exc)
                    run.collected.error = ErrorInfo(
                        ename="ConnectionLost",
                        evalue=f"the connection to the kernel was lost during the execution ({self.closed_reason}); "
                               "the code was interrupted and its remaining output is missing", traceback=[])
                    run.settled = True
                return END
            if self.lost:
                run.died = True
                return END
            if msg is False:
                return QUIET
            if _parent_id(msg) != msg_id:
                return SKIP
            if msg.get("channel") == "shell":
                run.got_reply(msg)
            return msg if msg.get("channel") == "iopub" else NEWS

        await run.wait(receive, self.is_alive, on_timeout, "the gateway kernel")
        self.settled = run.settled
        if self.settled and run.reply is None and not run.died:
            end = time.monotonic() + 1.0  # the reply is sent before idle: normally already queued
            while run.reply is None and (left := end - time.monotonic()) > 0:
                msg = await self._next(left)
                if not msg:
                    break
                if msg.get("channel") == "shell" and _parent_id(msg) == msg_id:
                    run.reply = msg
        return run.finish()


def _msg_type(msg: dict) -> str:
    return str(msg.get("msg_type") or (msg.get("header") or {}).get("msg_type") or "")


def _parent_id(msg: dict) -> str:
    parent = msg.get("parent_header") or {}
    return str(parent.get("msg_id", "")) if isinstance(parent, dict) else ""
