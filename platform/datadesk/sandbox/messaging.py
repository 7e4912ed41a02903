"""Talking to a kernel over the Jupyter protocol with ZMQ `ipc` sockets (no TCP).

Shared by the local and Docker backends: the backend launches the kernel
process (a local subprocess, a container) against the connection file written
here, then drives it through a `KernelChannel`.

- `write_connection_file`: `run_dir/connection.json` with `transport: "ipc"`.
  For ipc the "ports" are only suffixes: the kernel binds unix sockets named
  `<ip>-<port>`, so `ip` is a path prefix. The kernel and the host may see the
  same directory under different paths (a bind mount), hence two infos.
- `KernelChannel`: connect, run one execute request (output caps, timeout with
  interrupt, death detection), interrupt, close. The result building and the
  wait it shares with the gateway's websocket channel are in `execution.py`.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from queue import Empty
from typing import Any

from datadesk.sandbox.kernel_setup import kernel_args
from datadesk.sandbox.base import HEALTH_EXPRESSIONS, ExecutionResult, OnOutput, OnStatus, SandboxError
from datadesk.sandbox.execution import (
    FILE_CAP_BYTES,
    HEAD_CHARS,
    INTERRUPT_GRACE_S,
    QUIET,
    SKIP,
    TAIL_CHARS,
    ExecutionChannel,
    IsAlive,
    OnTimeout,
    Received,
)
from datadesk.store.files import write_json

log = logging.getLogger(__name__)

CONNECTION_FILE = "connection.json"
SOCKET_PREFIX = "k"
PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
# sun_path is 108 bytes including the NUL; keep a margin.
MAX_SOCKET_PATH_BYTES = 100

# Extra ipykernel command-line options every backend passes: plain, uncolored
# tracebacks (IPython's default "Context" mode is verbose and very slow on deep
# stacks: a RecursionError takes seconds to format), and the chart house style
# (kernel_setup.py: applied when the code first imports matplotlib or altair).
IPYKERNEL_ARGS = ("--InteractiveShell.xmode=Plain", "--InteractiveShell.colors=NoColor", *kernel_args())


# --------------------------------------------------------------------------- files


def socket_prefix(run_dir: Path) -> str:
    return str(run_dir / SOCKET_PREFIX)


def socket_paths(run_dir: Path) -> list[Path]:
    """The unix socket files a kernel bound under `run_dir`."""
    return [Path(f"{socket_prefix(run_dir)}-{port}") for port in PORTS.values()]


def write_connection_file(run_dir: Path, ip_in_kernel: str) -> tuple[dict, dict]:
    """Write `run_dir/connection.json` for an ipc kernel; return (kernel info, host info).

    The kernel binds `<ip_in_kernel>-<port>`; the host connects to
    `<run_dir>/k-<port>`, which must be the same files (same directory, or a
    bind mount of it). A fresh random key is made on every call.
    """
    host_ip = socket_prefix(run_dir)
    longest = f"{host_ip}-{max(PORTS.values())}"
    if len(longest.encode()) > MAX_SOCKET_PATH_BYTES or len(
        f"{ip_in_kernel}-{max(PORTS.values())}".encode()
    ) > MAX_SOCKET_PATH_BYTES:
        raise SandboxError(
            f"kernel run directory path is too long for unix sockets: {longest!r} is "
            f"{len(longest.encode())} bytes (limit {MAX_SOCKET_PATH_BYTES}); "
            "configure a shorter runtime directory"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in socket_paths(run_dir):
        try:
            stale.unlink()
        except FileNotFoundError:
            pass
    key = secrets.token_hex(32)
    kernel_info: dict[str, Any] = {
        **PORTS,
        "transport": "ipc",
        "ip": ip_in_kernel,
        "key": key,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }
    write_json(run_dir / CONNECTION_FILE, kernel_info, mode=0o600, sync=False)  # holds the HMAC key
    host_info = {**kernel_info, "ip": host_ip}
    return kernel_info, host_info



# --------------------------------------------------------------------------- channel


class KernelChannel(ExecutionChannel):
    """One client connection to one kernel (bound to the event loop it was used on).

    After `run` returns, `settled` says whether the kernel finished the request
    (went idle). A "timeout" result with `settled == False` means the interrupt
    did not take: the backend should restart the kernel.
    """

    def __init__(
        self,
        host_info: dict,
        run_dir: Path,
        is_alive: IsAlive,
        *,
        head_chars: int = HEAD_CHARS,
        tail_chars: int = TAIL_CHARS,
        file_cap_bytes: int = FILE_CAP_BYTES,
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
    ):
        from jupyter_client.asynchronous import AsyncKernelClient

        super().__init__(run_dir, is_alive, head_chars=head_chars, tail_chars=tail_chars,
                         file_cap_bytes=file_cap_bytes, interrupt_grace_s=interrupt_grace_s)
        self.kernel_info: dict = {}
        self._client = AsyncKernelClient()
        self._client.load_connection_info(host_info)
        self._started = False
        self._closed = False

    # -- lifecycle

    async def connect(self, ready_timeout_s: float) -> None:
        """Open the sockets and wait until the kernel answers kernel_info on shell
        and publishes on iopub (so no output of the first execute is lost)."""
        client = self._client
        if not self._started:
            client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=True)
            self._started = True
        deadline = time.monotonic() + ready_timeout_s
        while True:
            client.kernel_info()
            got_reply = False
            try:
                msg = await client.get_shell_msg(timeout=min(1.0, max(0.05, deadline - time.monotonic())))
                got_reply = msg.get("msg_type") == "kernel_info_reply"
            except Empty:
                pass
            if got_reply:
                self.kernel_info = msg.get("content", {})
                try:
                    await client.get_iopub_msg(timeout=0.5)
                except Empty:
                    pass  # iopub subscription not live yet: ask again
                else:
                    break
            if not await self.is_alive():
                raise SandboxError("the kernel process exited while starting")
            if time.monotonic() > deadline:
                raise SandboxError(f"the kernel did not become ready within {ready_timeout_s:g} s")
        await self._drain()

    async def _drain(self) -> None:
        """Discard whatever is already queued on shell and iopub."""
        for get in (self._client.get_iopub_msg, self._client.get_shell_msg):
            while True:
                try:
                    await get(timeout=0)
                except Empty:
                    break

    async def interrupt(self) -> None:
        """Send `interrupt_request` on the control channel (interrupt_mode "message")."""
        if self._closed:
            return
        client = self._client
        msg = client.session.msg("interrupt_request", content={})
        client.control_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        deadline = time.monotonic() + 1.0
        while (left := deadline - time.monotonic()) > 0:
            try:
                reply = await client.get_control_msg(timeout=left)
            except Empty:
                break
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                break

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._started:
                self._client.stop_channels()
            elif self._client._created_context and not self._client.context.closed:
                self._client.context.destroy(linger=0)
        except Exception as e:  # pragma: no cover - best effort
            log.debug("closing kernel channel: %s", e)

    # -- execution

    async def run(self, code: str, timeout_s: float, on_timeout: OnTimeout, *, silent: bool = False,
                  grace_s: float | None = None, on_output: OnOutput | None = None,
                  on_status: OnStatus | None = None) -> ExecutionResult:
        """Execute `code`; collect its output until the kernel goes idle.

        On timeout `on_timeout()` is awaited (it should interrupt the kernel),
        then up to `grace_s` (default `interrupt_grace_s`) more for idle; status
        "timeout". When the kernel goes silent and `is_alive()` says the process
        is gone: "died". The reply carries the health checks (`HEALTH_EXPRESSIONS`).
        """
        if self._closed:
            raise SandboxError("the kernel connection is closed")
        client = self._client
        run = self._execution(timeout_s, on_output, on_status, grace_s)
        msg_id = client.execute(
            code, silent=silent, store_history=not silent, user_expressions=dict(HEALTH_EXPRESSIONS),
            allow_stdin=False, stop_on_error=False
        )

        async def poll_shell() -> None:
            while run.reply is None:
                try:
                    msg = await client.get_shell_msg(timeout=0)
                except Empty:
                    return
                if msg.get("parent_header", {}).get("msg_id") == msg_id:
                    run.got_reply(msg)

        async def receive(timeout_s: float) -> Received:
            try:
                msg = await client.get_iopub_msg(timeout=timeout_s)
            except Empty:
                await poll_shell()
                return QUIET
            return msg if msg.get("parent_header", {}).get("msg_id") == msg_id else SKIP

        await run.wait(receive, self.is_alive, on_timeout)
        self.settled = run.settled
        if self.settled:
            # The reply is sent before idle; it is normally already queued.
            if run.reply is None:
                try:
                    end = time.monotonic() + 1.0
                    while run.reply is None and (left := end - time.monotonic()) > 0:
                        msg = await client.get_shell_msg(timeout=left)
                        if msg.get("parent_header", {}).get("msg_id") == msg_id:
                            run.reply = msg
                except Empty:
                    pass
        else:
            await poll_shell()

        return run.finish()
