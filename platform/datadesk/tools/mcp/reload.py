"""The MCP servers of every workspace kept in step with its `workspace.toml` while the app runs.

`WorkspaceMCP.start` connects each workspace's `[mcp.*]` servers at start-up; then `watch`
looks at the workspaces every `WATCH_INTERVAL_S` seconds through `Workspaces.config` (which
re-reads a file only when it changed, at most once a second) and, when a workspace's `[mcp.*]`
tables differ from those its servers run with, hands the new ones to
`MCPManager.update_workspace`: a changed server is restarted, a removed one stopped, a new one
started, the others untouched. A workspace whose file became invalid keeps its last good config
(`Workspaces.error` says why), so its servers keep running. A workspace folder that is gone has
its servers stopped. Each host of a cluster watches its own files.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from datadesk.store.workspaces import WorkspaceConfigError
from datadesk.tools.mcp.config import workspace_servers
from datadesk.tools.mcp.manager import MCPManager

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 2.0  # how often the workspaces' [mcp.*] are compared with the running servers


class WorkspaceMCP:
    """Starts and reloads the MCP servers of the workspaces of `workspaces`
    (store.workspaces.Workspaces: names(), config(ws), layout)."""

    def __init__(self, manager: MCPManager, workspaces: Any, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.manager = manager
        self.workspaces = workspaces
        self.interval_s = interval_s
        self._applied: dict[str, dict[str, Any]] = {}  # ws -> the [mcp.*] tables its servers run with
        self._failed: dict[str, str] = {}  # ws -> why its last reload failed (logged once)

    async def start(self) -> None:
        """Connect the servers of every workspace (each one's first attempt over)."""
        for ws in await asyncio.to_thread(self.workspaces.names):
            await self.sync(ws)

    async def sync(self, ws: str) -> list[str]:
        """Bring `ws`'s servers to its config as it is now; the names (re)started."""
        cfg = await asyncio.to_thread(self.workspaces.config, ws)
        tables = dict(cfg.mcp)
        if self._applied.get(ws, {}) == tables:
            return []
        layout = self.workspaces.layout
        servers = workspace_servers(layout.workspace_config(ws), tables)  # already checked by Workspaces
        started = await self.manager.update_workspace(ws, servers, layout.workspace_dir(ws))
        stopped = sorted(set(self._applied.get(ws, {})) - set(tables))
        if ws in self._applied:
            log.info("workspace %s: MCP servers reloaded; started or restarted: %s; stopped: %s", ws,
                     ", ".join(started) or "none", ", ".join(stopped) or "none")
        self._applied[ws] = tables
        return started

    async def watch(self) -> None:
        """Forever: every `interval_s`, each workspace's servers brought to its config."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sync_all()

    async def sync_all(self) -> None:
        """One round of `watch` (a workspace that cannot be read is logged by Workspaces)."""
        names = await asyncio.to_thread(self.workspaces.names)
        for ws in names:
            try:
                await self.sync(ws)
                self._failed.pop(ws, None)
            except WorkspaceConfigError:
                continue  # a file never good: Workspaces logged it, once
            except Exception as exc:  # noqa: BLE001 - one workspace must not stop the others' reload
                if self._failed.get(ws) != str(exc):
                    log.exception("workspace %s: its MCP servers could not be reloaded", ws)
                self._failed[ws] = str(exc)
        for ws in sorted(set(self._applied) - set(names)):
            log.info("workspace %s is gone: its MCP servers are stopped", ws)
            await self.manager.stop_workspace(ws)
            del self._applied[ws]
