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
from datadesk.offload.requery import RequeryService
from datadesk.offload.store import ArtifactStore
from datadesk.sandbox.registry import KernelRegistry
from datadesk.context.builder import ContextBuilder
from datadesk.context.calibration import Calibration
from datadesk.offload.store import ArtifactNotFound
from datadesk.sandbox.files import read_regular
from datadesk.tools.artifacts import register_artifact_tools
from datadesk.memory.extraction import MemoryExtractor
from datadesk.memory.store import MemoryStore
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


def build_kernel_registry(settings: Settings, layout: Layout) -> KernelRegistry:
    """The kernel registry for the configured backend (`local`, `docker` or `gateway`)."""
    sb = settings.sandbox

    def artifacts_for(key: tuple[str, str, str]):
        ws, user, tid = key
        return layout.thread_dir(ws, user, tid) / "artifacts"

    if sb.backend == "local":
        from datadesk.sandbox.local import LocalKernel

        # RLIMIT_AS counts reserved address space: an idle kernel with pandas and pyarrow
        # already reserves ~1.1 GB, so the local limit is memory_mb on top of that.
        memory = (sb.memory_mb + 1536) << 20
        factory = lambda placement: LocalKernel(placement, memory_bytes=memory,  # noqa: E731
                                                ready_timeout_s=sb.start_timeout_s)

        async def attach_local(rec, connect: bool):  # another worker's kernel (same host)
            return await LocalKernel.attach(rec.placement, rec.pid, rec.pid_start, connect=connect,
                                            memory_bytes=memory, ready_timeout_s=sb.start_timeout_s)

        return KernelRegistry(sb, layout.home, factory, artifacts_for, attach=attach_local, backend_name="local")
    if sb.backend == "docker":
        from datadesk.sandbox.docker import DockerKernel, DockerSandbox

        docker = DockerSandbox(sb, layout.home)

        async def attach_docker(rec, connect: bool):  # another worker's container
            return await DockerKernel.attach(rec.placement, docker, rec.container, rec.started_at, connect)

        return KernelRegistry(sb, layout.home, docker.kernel, artifacts_for, health_check=docker.health,
                              attach=attach_docker, sweep_orphans=docker.remove_orphans, backend_name="docker")
    if sb.backend == "gateway":
        from datadesk.sandbox.gateway import GatewayKernel, GatewaySandbox

        gateway = GatewaySandbox(sb, layout.home)  # checks the gateway_* settings (SettingsError)

        async def attach_gateway(rec, connect: bool):  # another worker's kernel on the gateway
            return await GatewayKernel.attach(rec.placement, gateway, connect, rec.started_at)

        return KernelRegistry(sb, layout.home, gateway.kernel, artifacts_for, health_check=gateway.health,
                              attach=attach_gateway, sweep_orphans=gateway.remove_orphans, backend_name="gateway")
    raise ValueError(f"sandbox.backend must be local, docker, gateway or none, not {sb.backend!r}")

log = logging.getLogger(__name__)


class Runtime:
    """Everything the API and the turn loop share. Tests build one with their own model.

    A plain class (not a dataclass) so web frameworks treat it as an opaque dependency.
    """

    def __init__(self, settings: Settings, model: ChatModel, summary_model: ChatModel | None = None) -> None:
        self.settings = settings
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
                                         user_exists=self._user_active)
        self._background: set[asyncio.Task[Any]] = set()
        self.mcp = MCPManager(self.tools, save_image=self._save_tool_image)
        self.calibration = Calibration(self.layout.home / "calibration.json", settings.context.calibration_margin)
        self.context = ContextBuilder(settings.context, count_tokens, self.calibration,
                                      self._artifact_status, self._image_bytes)
        self.kernels: KernelRegistry | None = None
        self.sandbox_health: Callable[[], tuple[bool, str]] = lambda: (False, "the sandbox is not running")
        if settings.sandbox.backend != "none":
            self.kernels = build_kernel_registry(settings, self.layout)
            self.sandbox_health = self.kernels.health
            register_python_tool(self.tools, PythonTool(settings, self.kernels, self.artifacts, self.quota,
                                                        self.requery, self._auto_requery))
        self.lifecycle = ThreadLifecycle(self.threads, self.turns, self.kernels)  # clear chat, delete thread

    async def start(self) -> None:
        """Start background work (kernel pool, reaper, MCP servers); called by the app at startup."""
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

    def _save_tool_image(self, ctx: ToolContext, data: bytes, mime: str) -> str:
        """An image a tool returned (MCP): kept as an artifact, sent to vision models as an image."""
        from datadesk.domain.artifacts import ArtifactOrigin

        ext = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}.get(mime, "png")
        origin = ArtifactOrigin(source="tool", user=ctx.user, thread=ctx.thread, workspace=ctx.workspace,
                                call_id=ctx.call_id)
        return self.artifacts.save_bytes(ctx.thread_dir, data, ext, "result", mime, origin, ctx.epoch).id

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

    def _user_active(self, uid: str) -> bool:
        user = self.users.get(uid)
        return user is not None and not user.revoked

    def memory_preamble(self, user: User, handle: Any) -> tuple[str, list[str]] | None:
        """The memory block for this user's thread, with the injected fact ids (None when off/empty)."""
        ws = handle.meta.workspace
        cfg, _ = self.workspace(ws)
        if not self.memory.allowed(ws, user.id, cfg.memory, user.permissions)[0]:
            return None
        project = getattr(handle.meta, "project", None)
        facts = self.memory.active(ws, user.id, project)
        if not facts:
            return None
        return self.memory.block(ws, user.id, project), [f.id for f in facts]

    def after_turn(self, user: User, handle: Any, records: list[Any]) -> None:
        """Background memory extraction (off by default; a workspace flag), never awaited."""
        ws = handle.meta.workspace
        cfg, _ = self.workspace(ws)
        if not cfg.memory_extraction or not self.memory.allowed(ws, user.id, cfg.memory, user.permissions)[0]:
            return
        task = asyncio.create_task(self.extractor.extract(ws, user.id, records, thread=handle.id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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

    def _artifact_status(self, thread_dir: Path, aid: str) -> str | None:
        try:
            return self.artifacts.load(thread_dir, aid).status
        except (ArtifactNotFound, ValueError):
            return None

    def _image_bytes(self, thread_dir: Path, aid: str) -> bytes | None:
        try:
            art = self.artifacts.load(thread_dir, aid)
            if not art.available or art.format not in ("png", "jpeg", "gif", "webp"):
                return None
            return read_regular(self.artifacts.data_path(thread_dir, art), 20 << 20)
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
