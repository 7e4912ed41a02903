"""The composition of services a turn needs, built once from Settings."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import threading
from pathlib import Path
from typing import Any, Callable

from datadesk.chat.attachments import Attachments
from datadesk.chat.lifecycle import ThreadLifecycle
from datadesk.chat.requery import UserRequery
from datadesk.chat.turns import TurnRegistry
from datadesk.llm import configured_model
from datadesk.llm.base import ChatModel
from datadesk.settings import Settings
from datadesk.store.layout import Layout
from datadesk.store.threads import ThreadStore
from datadesk.store.users import UserStore
from datadesk.store.warehouse import Warehouse
from datadesk.store.workspaces import WorkspaceConfig, load_workspace, warehouse_path
from datadesk.domain.users import User
from datadesk.llm.tokens import count_tokens
from datadesk.offload.pipeline import OffloadCapability, OffloadPipeline
from datadesk.offload.quota import ArtifactQuota
from datadesk.tools.requery import RequeryService
from datadesk.offload.store import ArtifactStore
from datadesk.sandbox.backends import build_kernel_registry
from datadesk.sandbox.registry import KernelRegistry
from datadesk.context.builder import ContextBuilder
from datadesk.context.calibration import Calibration
from datadesk.context.request import MemoryScope, RequestAssembler, TurnRequest
from datadesk.store.threads import Thread
from datadesk.offload.store import ArtifactNotFound
from datadesk.sandbox.files import read_regular
from datadesk.tools.artifacts import register_artifact_tools
from datadesk.memory.extraction import MemoryExtractor
from datadesk.memory.store import MemoryStore, memory_access
from datadesk.summary.service import SummaryService
from datadesk.tools.mcp import MCPManager
from datadesk.tools.memory import memory_gate, register_memory_tools
from datadesk.summary.store import SummaryStore
from datadesk.summary.summarizer import Summarizer
from datadesk.tools.history import register_compact_tool, register_history_tools
from datadesk.tools.skills import SkillCatalog, register_skill_tool
from datadesk.tools.python import PythonTool, register_python_tool
from datadesk.tools.registry import ToolContext, ToolRegistry, ToolSpec
from datadesk.tools.sql import register_sql_tool

PYTHON_TOOL = "python"


def validate_mcp_config(path: Path, cfg: WorkspaceConfig) -> dict[str, Any]:
    """The `[mcp.<server>]` tables as MCPServerConfig, or WorkspaceConfigError naming file and key."""
    from datadesk.store.workspaces import WorkspaceConfigError
    from datadesk.tools.mcp import MCPServerConfig

    servers = {}
    for name, raw in cfg.mcp.items():
        try:
            server = msgspec.convert(raw, MCPServerConfig)
            server.validate(name)
        except (msgspec.ValidationError, ValueError) as exc:
            raise WorkspaceConfigError(f"{path}: key 'mcp.{name}': {exc}") from None
        servers[name] = server
    return servers


log = logging.getLogger(__name__)


class Runtime:
    """The composition root: builds every service once from Settings and hands each what it
    uses. The HTTP app (api/app.py) and the command line (cli.py) only ever build this.
    Tests build one with their own model.

    A plain class (not a dataclass) so web frameworks treat it as an opaque dependency.
    """

    def __init__(self, settings: Settings, model: ChatModel | None = None,
                 summary_model: ChatModel | None = None) -> None:
        self.settings = settings
        model = model or configured_model(settings)  # the configured LLM, else the labelled demo
        self.model = model
        self.summary_model = summary_model or model  # the same LLM unless told otherwise
        self.layout = Layout(settings.home)
        self.users = UserStore(self.layout)
        self.threads = ThreadStore(self.layout)
        # one turn per thread, N per user, cancel: across every worker of the host (file locks)
        self.turns = TurnRegistry(settings.chat.max_turns_per_user, lock_dir=self.layout.home / "locks" / "turns")
        self.tools = ToolRegistry()
        self._workspaces: dict[str, tuple[WorkspaceConfig, Warehouse]] = {}
        self._ws_lock = threading.Lock()
        self.artifacts = ArtifactStore(self.layout)
        self.quota = ArtifactQuota(settings.offload, self.artifacts)
        self.offload = OffloadPipeline(settings.offload, self.artifacts, count_tokens,
                                       on_created=self.quota.after_create)
        self.requery = RequeryService(self.offload, self.tools, self.artifacts)
        # what the analyst does outside a turn (api/ only parses and shapes): uploads, pastes, re-query
        self.attachments = Attachments(
            self.offload, self.quota, self.turns, settings.offload, settings.context.max_message_tokens,
            lambda user, ws: self.offload_capability(user, ws, self.permitted_tools(user, ws)))
        self.user_requery = UserRequery(self.requery, self.turns)
        register_sql_tool(self.tools, self.warehouse_for, settings.sql, settings.offload.threshold_chars,
                          settings.offload.stream_timeout_s)
        register_artifact_tools(self.tools, self.requery)
        register_history_tools(self.tools)
        self.skills = SkillCatalog(self.layout)
        register_skill_tool(self.tools, self.skills)
        self.summaries = SummaryService(SummaryStore(settings.summary.revisions_kept),
                                        Summarizer(self.summary_model, settings.summary, count_tokens), settings.summary)
        register_compact_tool(self.tools, self.summaries)
        self.memory = MemoryStore(self.layout, settings.memory)
        register_memory_tools(self.tools, self.memory,
                              memory_gate(self.memory, lambda ws: self.workspace(ws)[0].memory))
        self.extractor = MemoryExtractor(self.memory, self.summary_model, settings.memory,
                                         user_exists=self._user_active, memory_on=self._extraction_on)
        self._background: set[asyncio.Task[Any]] = set()
        self.mcp = MCPManager(self.tools, save_image=self._save_tool_image)
        self.calibration = Calibration(self.layout.home / "calibration.json", settings.context.calibration_margin)
        self.context = ContextBuilder(settings.context, count_tokens, self.calibration,
                                      self._artifact_status, self._image_bytes)
        self.requests = RequestAssembler(self.context, self.summaries, settings.summary, self.memory,
                                         self.calibration)
        self.kernels: KernelRegistry | None = None
        self.sandbox_health: Callable[[], tuple[bool, str]] = lambda: (False, "the sandbox is not running")
        if settings.sandbox.backend != "none":
            self.kernels = build_kernel_registry(settings, self.layout)
            self.sandbox_health = self.kernels.health
            register_python_tool(self.tools, PythonTool(settings, self.kernels, self.artifacts, self.quota,
                                                        self.requery, self._auto_requery))
        self.lifecycle = ThreadLifecycle(self.threads, self.turns, self.kernels)  # clear chat, delete thread

    async def start(self) -> None:
        """Start background work (artifact sweeper, kernel pool, reaper, MCP servers); called by the
        app at startup."""
        self._spawn(self._sweep_forever(), "artifact-sweeper")
        if self.kernels is not None:
            await self.kernels.start()
        for ws in self.validate_workspaces():
            cfg, _ = self.workspace(ws)
            if cfg.mcp:
                servers = validate_mcp_config(self.layout.workspace_config(ws), cfg)
                await self.mcp.start_workspace(ws, servers, self.layout.workspace_dir(ws))

    async def stop(self) -> None:
        await self.turns.cancel_all()
        await self.summaries.drain()
        for task in list(self._background):
            task.cancel()
        await self.mcp.stop()
        if self.kernels is not None:
            await self.kernels.stop()

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _sweep_forever(self) -> None:
        """The cache sweeper: TTL and quotas, enforced while the app runs."""
        every = self.settings.offload.sweep_interval_s
        while True:
            await asyncio.sleep(every)
            try:
                await asyncio.to_thread(self.quota.sweep_round, every)
            except Exception:
                log.exception("artifact sweep failed")

    def _save_tool_image(self, ctx: ToolContext, data: bytes, mime: str) -> str:
        """An image a tool returned (MCP): kept as an artifact, sent to vision models as an image."""
        ext = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}.get(mime, "png")
        return self.artifacts.save_bytes(ctx.thread, data, ext, "result", mime, ctx.origin("tool"), ctx.epoch).id

    def mcp_status(self, ws: str) -> list[dict[str, Any]]:
        """MCP servers of a workspace with state, tools and masked config ([] without MCP)."""
        return self.mcp.status(ws) if getattr(self, "mcp", None) is not None else []

    def validate_workspaces(self) -> list[str]:
        """Read every workspace's config now, so a bad file fails at start (file, key, problem)."""
        root = self.layout.workspaces_dir
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if root.is_dir() else []
        for ws in names:
            cfg, _ = self.workspace(ws)
            validate_mcp_config(self.layout.workspace_config(ws), cfg)
        return names

    def _auto_requery(self, ws: str) -> bool:
        flag = self.workspace(ws)[0].auto_requery
        return self.settings.offload.auto_requery if flag is None else flag

    def _extraction_on(self, ws: str, uid: str) -> bool:
        """The workspace's memory flags and the user's permission, as they are now."""
        cfg, _ = self.workspace(ws)
        user = self.users.get(uid)
        return bool(user and cfg.memory_extraction and memory_access(cfg.memory, user.permissions, ws)[0])

    def _user_active(self, uid: str) -> bool:
        user = self.users.get(uid)
        return user is not None and not user.revoked

    def turn_request(self, user: User, thread: Thread, epoch: int, turn_id: str,
                     specs: list[ToolSpec]) -> TurnRequest:
        """What every request of this turn is made of (context.request builds each one)."""
        ws = thread.meta.workspace
        cfg, _ = self.workspace(ws)
        memory = MemoryScope(workspace=ws, user=user.id, project=thread.meta.project, workspace_on=cfg.memory,
                             permissions=user.permission_set)
        return TurnRequest(thread=thread, epoch=epoch, model=self.model.name, turn_id=turn_id,
                           tools=[s.openai_schema() for s in specs], workspace_prompt=cfg.prompt,
                           skills_catalog=self.skills.catalog_text(ws), memory=memory)

    @property
    def model_reports_usage(self) -> bool:
        """Whether the model's reported usage is real (the scripted model only estimates it)."""
        return bool(getattr(self.model, "reports_real_usage", True))

    def after_turn(self, user: User, handle: Any, records: list[Any]) -> None:
        """Background memory extraction (off by default; a workspace flag), never awaited."""
        ws = handle.meta.workspace
        cfg, _ = self.workspace(ws)
        if not cfg.memory_extraction or not self.memory.allowed(ws, user.id, cfg.memory, user.permissions)[0]:
            return
        self._spawn(self.extractor.extract(ws, user.id, records, thread=handle.id), f"memory-extract:{handle.id}")

    def workspace(self, ws: str) -> tuple[WorkspaceConfig, Warehouse]:
        """The config and warehouse of a workspace (read once, then cached)."""
        with self._ws_lock:
            hit = self._workspaces.get(ws)
            if hit is None:
                cfg = load_workspace(self.layout, ws)
                wdir = self.layout.workspace_dir(ws)
                wh = Warehouse(
                    warehouse_path(self.layout, ws, cfg),
                    self.layout.workspace_data_dir(ws),
                    views={k: str(wdir / v) for k, v in cfg.views.items()},
                    timeout_s=self.settings.sql.timeout_s,
                )
                hit = self._workspaces[ws] = (cfg, wh)
            return hit

    def _artifact_status(self, thread: Thread, aid: str) -> str | None:
        try:
            return self.artifacts.load(thread, aid).status
        except (ArtifactNotFound, ValueError):
            return None

    def _image_bytes(self, thread: Thread, aid: str) -> bytes | None:
        try:
            art = self.artifacts.load(thread, aid)
            if not art.available or art.format not in ("png", "jpeg", "gif", "webp"):
                return None
            return read_regular(self.artifacts.data_path(thread, art), 20 << 20)
        except (ArtifactNotFound, ValueError, OSError):
            return None

    def permitted_tools(self, user: User, workspace: str) -> list[ToolSpec]:
        """Tools this user may call in this workspace, in registration order."""
        cfg, _ = self.workspace(workspace)
        disabled = set(cfg.disabled_tools)
        if not cfg.memory:  # memory off in this workspace: its tools would only cost tokens
            disabled |= {"remember", "forget"}
        perms = user.permission_set
        return [s for s in self.tools.permitted(perms, workspace) if s.name not in disabled
                and cfg.tool_permissions.get(s.name, None) in (None, *perms)]

    def offload_capability(self, user: User, workspace: str, specs: list[ToolSpec]) -> OffloadCapability:
        """Large results go to files only when the model can read them: the python tool is in
        this request and the sandbox is healthy. Otherwise the notice says why not."""
        if any(s.name == PYTHON_TOOL for s in specs):
            healthy, why = self.sandbox_health()
            if healthy:
                return OffloadCapability(True)
            return OffloadCapability(False, f"the python sandbox is down: {why}")
        if self.tools.get(PYTHON_TOOL) is None:
            return OffloadCapability(False, "code execution is not set up on this server")
        cfg, _ = self.workspace(workspace)
        if PYTHON_TOOL in cfg.disabled_tools:
            return OffloadCapability(False, "the python tool is disabled in this workspace")
        return OffloadCapability(False, "you do not have the code_execution permission")

    def warehouse_for(self, ctx: ToolContext) -> Warehouse:
        return self.workspace(ctx.workspace)[1]

    def model_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"name": self.model.name, "demo": self.model.is_demo}
        if self.model.is_demo:
            info["label"] = "demo model, no LLM configured"
        return info
