"""MCP result bombs (issue 15): helpers for tests and for bench/bombs.py.

- `mcp_bomb_config(home)`: adds the fake MCP server (tests/fakes/mcp_server.py) to the demo
  workspace's workspace.toml as `[mcp.bomb]`, and returns the tool call that makes it answer
  with a 300 MB result, past the default `limits.mcp_result_max_mb` (256): `("bomb__big_text", {"mb": 300})`. A scripted model that returns
  `tool_step(*call)` for user A's message runs the bomb through the real app.
- `PeakRSS`: this process's peak resident memory over a block (VmHWM, reset through
  /proc/self/clear_refs, plus sampling of VmRSS where that reset is not allowed).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FAKE_MCP = [sys.executable, str(ROOT / "tests" / "fakes" / "mcp_server.py")]


def mcp_bomb_config(home: Path, ws: str = "demo", mb: float = 300, name: str = "bomb",
                    timeout_s: float = 60) -> tuple[str, dict[str, Any]]:
    """Declare the fake MCP server in `<home>/workspaces/<ws>/workspace.toml` (created by
    `ensure_demo_workspace` first); return (exposed tool name, arguments) of the bomb call."""
    path = Path(home) / "workspaces" / ws / "workspace.toml"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    command = ", ".join(f'"{a}"' for a in FAKE_MCP)
    if f"[mcp.{name}]" not in text:
        text += f"\n[mcp.{name}]\ncommand = [{command}]\ntimeout_s = {timeout_s:g}\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return f"{name}__big_text", {"mb": mb}


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class PeakRSS:
    """`with PeakRSS() as p: ...` then `p.growth_mb`: peak RSS above the RSS at entry."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.start_kb = self.peak_kb = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm = False

    def __enter__(self) -> "PeakRSS":
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets VmHWM to the current RSS
            self._hwm = True
        except OSError:
            self._hwm = False
        self.start_kb = self.peak_kb = _status_kb("VmRSS")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_kb = max(self.peak_kb, _status_kb("VmRSS"))

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._hwm:
            self.peak_kb = max(self.peak_kb, _status_kb("VmHWM"))

    @property
    def growth_mb(self) -> float:
        return (self.peak_kb - self.start_kb) / 1024
