"""The small protocol every sandbox backend implements, and what an execution returns.

Two halves, as jupyter_client's provisioners and kernel managers:

- `SandboxBackend`: one per app worker, handed to the `KernelRegistry`. It
  makes kernels (`kernel`), reaches a kernel another worker started
  (`attach`), says whether it can run kernels now (`health`) and removes
  what crashed workers left behind (`remove_orphans`).
- `Kernel`: one kernel. `start` (launch), `execute`, `interrupt`, `probe`
  (idle and answering?), `restart`, `shutdown`, `is_alive`,
  `health_problem` (alive but unusable: stdout closed, no process left to
  fork), `receive_files` (the thread's artifacts into /data before a cell) and
  `read_outputs` (new files under /outputs).

An execution has one deadline (`timeout_s` from when the code is sent): there
the kernel is interrupted, and if it is not idle within a short grace it is
restarted (`execution.PendingExecution`). Output reaches `on_output(stream,
text)` as it is printed and what the sandbox does about the execution reaches
`on_status(message)`; both are plain callbacks that must not block.

The backends in `backends/` (`local/process.py`, `docker/container.py`,
`gateway/remote.py`) each implement both halves; building results from Jupyter
messages is shared (`execution.py`). Pooling and caps live one level up, in
`registry.py`; culling in `reaper.py`.

This package imports nothing above domain, settings and store.

Exceptions:
- `SandboxError`: base; its message is fit for the model and the user.
- `SandboxUnavailable`: the backend cannot start kernels (no engine, no image).
- `KernelLimitReached`: a per-user or global kernel cap, nothing reclaimable.
- `KernelDied`: the kernel process is gone (crash, OOM, killed from outside).
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal

from datadesk.sandbox.files import OutputFile, read_new_outputs, sync_data_links
from datadesk.store.interfaces.kernelfiles import KernelFiles

ExecStatus = Literal["ok", "error", "timeout", "died"]
OnOutput = Callable[[str, str], None]  # (stream: "stdout" | "stderr", text) as the code prints it
OnStatus = Callable[[str], None]  # what the sandbox is doing about the execution, in words


class SandboxError(Exception):
    pass


class SandboxUnavailable(SandboxError):
    pass


class KernelLimitReached(SandboxError):
    pass


class KernelDied(SandboxError):
    pass


@dataclass
class ErrorInfo:
    ename: str
    evalue: str
    traceback: list[str]


@dataclass
class ImageExtras:
    """What the kernel's house style (kernel_style.py) sends beside a figure's PNG."""

    title: str | None = None
    dark: bytes | None = None  # the same figure drawn for the dark theme


@dataclass
class ChartOutput:
    """A Vega-Lite chart the kernel displayed: its MIME type and the spec as sent (unchecked:
    tools/charts.py validates and caps it)."""

    mime: str
    spec: Any


@dataclass
class ExecutionResult:
    """What one `execute` produced. Text fields are capped (head + tail);
    `stdout_file` holds the full stream output when it was cut."""

    status: ExecStatus
    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the last expression
    error: ErrorInfo | None = None
    images: list[bytes] = field(default_factory=list)  # PNG bytes, in display order
    # per image: its title and dark-theme PNG when the kernel's house style sent them
    image_extras: list[ImageExtras] = field(default_factory=list)
    charts: list[ChartOutput] = field(default_factory=list)  # Vega-Lite specs, in display order
    output_truncated: bool = False
    output_chars: int = 0  # total characters of stdout + stderr
    stdout_file: Path | None = None  # full output when truncated (host path)
    duration_ms: float = 0.0
    note: str = ""  # e.g. "the kernel was restarted after the timeout"
    expressions: dict[str, Any] = field(default_factory=dict)  # user_expressions of the reply (health checks)


@dataclass(frozen=True)
class KernelPlacement:
    """Where a kernel's files live on the host.

    - `data_dir`: the thread's data, seen by code as `/data` (read-only).
    - `outputs_dir`: where files the code writes under `/outputs` end up.
    - `run_dir`: private per-kernel directory (connection file, ipc sockets).
    """

    kernel_id: str
    data_dir: Path
    outputs_dir: Path
    run_dir: Path


@dataclass(frozen=True)
class KernelLocator:
    """What the kernel table keeps so that another worker finds a running kernel again:
    the local kernel's pid (its process group) and that pid's start time, or the container."""

    pid: int | None = None
    pid_start: int | None = None  # so a reused pid is never taken for the kernel
    container: str | None = None
    remote: str | None = None  # gateway: the gateway's id of the kernel (any host reaches it)


class Kernel(abc.ABC):
    """One kernel: launch, run code, stop, read what it wrote. Not thread-safe; the registry
    serializes calls (one execution per kernel, outputs read before the next one starts)."""

    placement: KernelPlacement
    started_at: float
    _attached = False  # set by a backend's `attach`: a client of a kernel another worker started

    @abc.abstractmethod
    async def start(self) -> None:
        """Launch the kernel and wait until it answers (raises SandboxError)."""

    @abc.abstractmethod
    async def execute(self, code: str, timeout_s: float, *, on_output: OnOutput | None = None,
                      on_status: OnStatus | None = None) -> ExecutionResult:
        """Run `code`; at `timeout_s` interrupt it, restart the kernel when it is not idle within
        the grace, and return status "timeout" (`note` says when it was restarted)."""

    @abc.abstractmethod
    async def interrupt(self) -> None: ...

    async def probe(self, timeout_s: float) -> ExecutionResult | None:
        """A silent cell that waits at most `timeout_s` and never interrupts: status "ok" when the
        kernel is idle and answers (after an interrupt: it stopped), with the health checks in
        `expressions`; None when the kernel is not running."""
        return None

    async def health_problem(self, result: ExecutionResult) -> str:
        """Why the live kernel cannot run the next cell, in words (its stdout or stderr was
        closed, its processes fill the pid limit); "" when it can. `result` is the last one."""
        return io_problem(result)

    @abc.abstractmethod
    async def restart(self) -> None:
        """A fresh interpreter in the same placement (variables are gone)."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop the kernel and remove what it used (container, sockets). Idempotent."""

    @abc.abstractmethod
    async def is_alive(self) -> bool: ...

    async def death_reason(self) -> str:
        """Why the kernel is gone, in words (e.g. 'killed: out of memory')."""
        return "the kernel process exited"

    def outputs_root(self) -> str | None:
        """A host path where this kernel's /outputs can be read (untrusted content), or None."""
        return str(self.placement.outputs_dir)

    async def receive_files(self, files: KernelFiles) -> list[str]:
        """Before a cell: /data made to hold exactly the thread's available artifacts (here: links
        to this host's folder `files.local_dir()`); problems in words, for the model."""
        await asyncio.to_thread(lambda: sync_data_links(files.local_dir(), self.placement.data_dir))
        return []

    async def read_outputs(self, seen: dict[str, tuple[int, int]], max_bytes: int,
                           files: KernelFiles | None = None) -> tuple[list[OutputFile], list[str]] | None:
        """New or changed regular files under /outputs and problems in words (`files.read_new_outputs`
        rules: untrusted, within `max_bytes`; `seen` is updated); None when they cannot be collected.
        `files`: the thread's hand-over (a kernel without a volume the app reads sends them through it)."""
        root = self.outputs_root()
        if root is None:
            return None
        return read_new_outputs(root, seen, max_bytes)

    def locator(self) -> KernelLocator:
        """How another worker finds this kernel (kept in its kernel record)."""
        return KernelLocator()

    @property
    def attached(self) -> bool:
        """A client of another worker's kernel (`attach`): the registry lets it go instead of stopping it."""
        return self._attached

    async def detach(self) -> None:
        """Close this client's connection; the kernel keeps running."""

    def adopt(self) -> None:
        """This client becomes the kernel's owner (its worker is gone; the kernel lives on)."""
        self._attached = False

    async def _connect_or_detach(self, connecting: Awaitable[None]) -> None:
        """Await an attached client's connection; on any failure (cancellation too) detach, then re-raise."""
        try:
            await connecting
        except BaseException:
            await self.detach()
            raise

    def rewrite_paths(self, code: str) -> str:
        """Map `/data` and `/outputs` in code to what this backend mounts (identity by default)."""
        return code


# Health checks the kernel evaluates after every successful cell (user expressions of the same
# request: no extra round trip; after a failed one a silent probe carries them). Kernel-reported,
# so they only ever make the registry replace that kernel.
IO_CHECK, PIDS_CHECK = "io", "pids"
HEALTH_EXPRESSIONS = {
    # a cell that closed its own stdout or stderr leaves a kernel whose every print fails
    IO_CHECK: ("any(s is None or getattr(s, 'closed', False) is True "
               "for s in (__import__('sys').stdout, __import__('sys').stderr))"),
    # processes used / allowed in the kernel's cgroup (a container's own, v2 or v1); '' elsewhere
    PIDS_CHECK: ("next((open(d + 'pids.current').read().split()[0] + '/' + open(d + 'pids.max').read().split()[0] "
                 "for d in ('/sys/fs/cgroup/', '/sys/fs/cgroup/pids/') "
                 "if __import__('os').path.exists(d + 'pids.max')), '')"),
}


def _expression(result: ExecutionResult, name: str) -> str | None:
    """The text/plain answer of a health check; None when it was not evaluated or failed."""
    got = result.expressions.get(name)
    if not isinstance(got, dict) or got.get("status") != "ok":
        return None
    text = (got.get("data") or {}).get("text/plain")
    return text.strip("'\"") if isinstance(text, str) else None


def io_problem(result: ExecutionResult) -> str:
    """Why the kernel cannot run the next cell, from the health checks of `result` ("" when it
    can, or when they were not evaluated)."""
    if _expression(result, IO_CHECK) == "True":  # a check that failed (names shadowed by the code) says nothing
        return "the code closed the kernel's stdout or stderr, so nothing it prints could be shown"
    used, _, limit = (_expression(result, PIDS_CHECK) or "").partition("/")
    if used.isdigit() and limit.isdigit() and int(limit) - int(used) <= max(4, int(limit) // 16):
        return (f"the code's processes fill the kernel's limit of {limit} (processes it started keep "
                "running), so it cannot start any more")
    return ""


class SandboxBackend(abc.ABC):
    """One kind of kernel (`name`: local, docker, gateway) for one app worker; the registry's
    only way to make, reach and clean up kernels."""

    name: str = ""  # kept in each kernel record: a kernel of another backend is never attached to
    # its kernels can be reached from any host of a cluster (gateway); a docker or local kernel
    # only from the host that started it
    shared_across_hosts: bool = False
    # a stopping worker leaves its kernels running for another to adopt (cluster gateway kernels)
    kernels_outlive_workers: bool = False

    @abc.abstractmethod
    def kernel(self, placement: KernelPlacement) -> Kernel:
        """A kernel for `placement`, not started yet (the registry calls its `start`)."""

    @abc.abstractmethod
    async def attach(self, placement: KernelPlacement, locator: KernelLocator, connect: bool = True) -> Kernel:
        """A client of a kernel another worker started. With `connect=False` it can only be
        stopped (orphan cleanup); raises SandboxError when it cannot be reached."""

    def health(self) -> tuple[bool, str]:
        """Whether kernels can be started now, and if not why (in words)."""
        return True, ""

    def handout_problem(self) -> str | None:
        """Why no kernel may be handed to a user now, in words (None: it may). Asked at every
        hand-out, so a kernel pre-started in the pool before the rule changed is never given."""
        return None

    def remove_orphans(self) -> int:
        """Remove kernels whose owner worker is gone that the kernel table cannot name (containers,
        gateway kernels of an earlier run); returns how many went."""
        return 0
