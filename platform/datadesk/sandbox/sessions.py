"""What a kernel session is, apart from the registry that keeps them: the session record, the
report of one execution the python tool gets, the notices of a fresh kernel, the /outputs files
already collected (shared between workers through the kernel's slot), and purging a deleted
user's slots and records.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from datadesk.sandbox.base import ExecutionResult, Kernel, KernelPlacement
from datadesk.sandbox.files import OutputFile
from datadesk.sandbox.kerneltable import KernelTable, SessionKey

SEEN_FILE = "seen_outputs.json"
ORPHAN_NOTICE = "the previous one stopped with the server worker that ran it"


class SeenOutputs(dict):
    """The /outputs files already collected (relpath -> (size, mtime_ns)), kept in the kernel's
    slot so that a worker attaching later does not collect them a second time."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self.path = path
        self._stamp: int | None = None
        self.reload()

    def reload(self) -> None:
        """Take what another worker recorded since (cheap when nothing changed)."""
        if self.path is None:
            return
        try:
            stamp = self.path.stat().st_mtime_ns
            if stamp == self._stamp:
                return
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        super().clear()
        for k, v in (data.items() if isinstance(data, dict) else ()):
            if isinstance(k, str) and isinstance(v, list) and len(v) == 2:
                super().__setitem__(k, (int(v[0]), int(v[1])))
        self._stamp = stamp

    def __setitem__(self, key: str, value: tuple[int, int]) -> None:
        super().__setitem__(key, value)
        if self.path is None:
            return
        tmp = self.path.with_name(f".{SEEN_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self))
            os.replace(tmp, self.path)
            self._stamp = self.path.stat().st_mtime_ns
        except OSError:
            pass  # the slot went away (clear, reclaim): nothing left to remember


@dataclass
class KernelSession:
    """A kernel this worker talks to (started here or attached to), and the thread it serves."""

    kernel: Kernel
    started_at: float
    last_used: float
    key: SessionKey | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    seen_outputs: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def placement(self) -> KernelPlacement:
        return self.kernel.placement


@dataclass
class ExecutionReport:
    """One execution as the python tool sees it: the result, what to tell the model first (a
    fresh kernel), and the new files under /outputs with problems in words. The files were read
    while the execution still held the kernel, so no later execution can mix its files in."""

    result: ExecutionResult
    notices: list[str]
    outputs: list[OutputFile] = field(default_factory=list)
    output_problems: list[str] = field(default_factory=list)


def fresh_kernel_notice(reason: str) -> str:
    """What the model is told first when its thread got a new kernel (`reason`: why the old one went)."""
    return (f"NOTE: a new Python kernel was started ({reason}). Variables, imports and data loaded "
            "earlier are gone: reload what you need from /data.")


def purge_user_slots(home: Path, user: str) -> list[str]:
    """Remove the kernel slots (data links, outputs) serving `user` and their kernel records;
    returns their kernel ids. Used when a user is deleted while a server may still hold their
    kernels (the owning worker lets them go on its next reaper round: the record is gone)."""
    root = Path(home) / "sandbox" / "slots"
    gone: list[str] = []
    for slot in (root.iterdir() if root.is_dir() else ()):
        try:
            owner = json.loads((slot / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if owner.get("user") == user:
            shutil.rmtree(slot, ignore_errors=True)
            gone.append(slot.name)
    table = KernelTable(Path(home))
    for rec in list(table.sessions()):
        if rec.user == user and rec.key is not None:
            table.remove(rec.key)
    return gone
