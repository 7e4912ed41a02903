"""The composition of services a turn needs, built once from Settings."""

from __future__ import annotations

import logging
import threading
from typing import Any

from datadesk.chat.turns import TurnRegistry
from datadesk.llm.base import ChatModel
from datadesk.settings import Settings
from datadesk.store.layout import Layout
from datadesk.store.threads import ThreadStore
from datadesk.store.users import UserStore
from datadesk.store.warehouse import Warehouse
from datadesk.store.workspaces import WorkspaceConfig, load_workspace, warehouse_path
from datadesk.tools.registry import ToolContext, ToolRegistry
from datadesk.tools.sql import register_sql_tool

log = logging.getLogger(__name__)


class Runtime:
    """Everything the API and the turn loop share. Tests build one with their own model.

    A plain class (not a dataclass) so web frameworks treat it as an opaque dependency.
    """

    def __init__(self, settings: Settings, model: ChatModel) -> None:
        self.settings = settings
        self.model = model
        self.layout = Layout(settings.home)
        self.users = UserStore(self.layout)
        self.threads = ThreadStore(self.layout)
        self.turns = TurnRegistry(settings.chat.max_turns_per_user)
        self.tools = ToolRegistry()
        register_sql_tool(self.tools, self.warehouse_for, settings.sql)
        self._workspaces: dict[str, tuple[WorkspaceConfig, Warehouse]] = {}
        self._ws_lock = threading.Lock()

    def workspace(self, ws: str) -> tuple[WorkspaceConfig, Warehouse]:
        """The config and warehouse of a workspace (read once, then cached)."""
        with self._ws_lock:
            hit = self._workspaces.get(ws)
            if hit is None:
                cfg = load_workspace(self.layout, ws)
                wh = Warehouse(
                    warehouse_path(self.layout, ws, cfg),
                    self.layout.workspace_data_dir(ws),
                    timeout_s=self.settings.sql.timeout_s,
                    max_rows=self.settings.sql.max_rows,
                )
                hit = self._workspaces[ws] = (cfg, wh)
            return hit

    def warehouse_for(self, ctx: ToolContext) -> Warehouse:
        return self.workspace(ctx.workspace)[1]

    def model_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"name": self.model.name, "demo": self.model.is_demo}
        if self.model.is_demo:
            info["label"] = "demo model, no LLM configured"
        return info
