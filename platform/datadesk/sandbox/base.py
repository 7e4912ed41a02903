"""The small interface every kernel backend implements, and what an execution returns.

Lifecycle and messaging of one kernel: `start`, `execute`, `interrupt`,
`restart`, `shutdown`, `is_alive`. Backends (`local.py`, `docker.py`,
`gateway.py`) differ in how the kernel process is launched and confined;
building results from Jupyter messages is shared (`execution.py`). Pooling and
caps live one level up, in `registry.py`; culling in `reaper.py`.

This package imports nothing from chat/, context/ or tools/.

Exceptions:
- `SandboxError`: base; its message is fit for the model and the user.
- `SandboxUnavailable`: the backend cannot start kernels (no engine, no image).
- `KernelLimitReached`: a per-user or global kernel cap, nothing reclaimable.
- `KernelDied`: the kernel process is gone (crash, OOM, killed from outside).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Literal

from datadesk.sandbox.files import OutputFile, read_new_outputs

ExecStatus = Literal["ok", "error", "timeout", "died"]


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
class ExecutionResult:
    """What one `execute` produced. Text fields are capped (head + tail);
    `stdout_file` holds the full stream output when it was cut."""

    status: ExecStatus
    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the last expression
    error: ErrorInfo | None = None
    images: list[bytes] = field(default_factory=list)  # PNG bytes, in display order
    output_truncated: bool = False
    output_chars: int = 0  # total characters of stdout + stderr
    stdout_file: Path | None = None  # full output when truncated (host path)
    duration_ms: float = 0.0
    note: str = ""  # e.g. "the kernel was restarted after the timeout"


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


class KernelBackend(abc.ABC):
    """One kernel: launch, talk, stop. Not thread-safe; the registry serializes calls."""

    placement: KernelPlacement
    started_at: float
    _attached = False  # set by a backend's `attach`: a client of a kernel another worker started

    @abc.abstractmethod
    async def start(self) -> None:
        """Launch the kernel and wait until it answers (raises SandboxError)."""

    @abc.abstractmethod
    async def execute(self, code: str, timeout_s: float) -> ExecutionResult:
        """Run `code`; on timeout interrupt it and return status "timeout"."""

    @abc.abstractmethod
    async def interrupt(self) -> None: ...

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

    async def collect_outputs(self) -> None:
        """Hook run after each execution (nothing to do for most backends)."""
        return None

    def outputs_root(self) -> str | None:
        """A host path where this kernel's /outputs can be read (untrusted content), or None."""
        return str(self.placement.outputs_dir)

    async def read_outputs(self, seen: dict[str, tuple[int, int]],
                           max_bytes: int) -> tuple[list[OutputFile], list[str]] | None:
        """New or changed regular files under /outputs and problems in words (`files.read_new_outputs`
        rules: untrusted, within `max_bytes`; `seen` is updated); None when they cannot be collected."""
        root = self.outputs_root()
        if root is None:
            return None
        return read_new_outputs(root, seen, max_bytes)

    @property
    def attached(self) -> bool:
        """A client of another worker's kernel (`attach`): the registry lets it go instead of stopping it."""
        return self._attached

    async def detach(self) -> None:
        """Close this client's connection; the kernel keeps running."""

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
