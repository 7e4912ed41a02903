"""The composition root: every service built once from Settings, each handed only what it uses."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable

from datadesk.audit import embedded_trail
from datadesk.chat.loop import TurnServices
from datadesk.chat.policy import TurnPolicy, spawner
from datadesk.chat.recovery import CutOffTurns
from datadesk.chat.turns import TurnRegistry
from datadesk.context.builder import ContextBuilder
from datadesk.context.calibration import Calibration
from datadesk.context.profiles import summary_output
from datadesk.context.request import RequestAssembler
from datadesk.context.taskstate import TaskStateStore
from datadesk.llm import configured_model
from datadesk.llm.base import ChatModel
from datadesk.llm.tokens import count_tokens
from datadesk.memory.extraction import MemoryExtractor
from datadesk.memory.store import MemoryStore, memory_access
from datadesk.offload.pipeline import OffloadPipeline
from datadesk.offload.artifacts.quota import ArtifactQuota
from datadesk.offload.artifacts.store import ArtifactNotFound, ArtifactStore
from datadesk.offload.writers import WriterPool
from datadesk.store.diskspace import DiskRoom
from datadesk.sandbox.backends import build_kernel_registry
from datadesk.sandbox.files import read_regular
from datadesk.sandbox.registry import KernelRegistry
from datadesk.settings import Settings, SettingsError
from datadesk.telemetry import KERNEL_STARTS
from datadesk.store.admission import MemoryGuard, QuerySlots
from datadesk.store.layout import Layout
from datadesk.store.locks import FileLocks
from datadesk.store.interfaces.blobs import BlobError
from datadesk.store.search import ThreadSearch
from datadesk.store.shares import FileShares
from datadesk.store.threads import Thread, ThreadStore
from datadesk.store.users import UserStore
from datadesk.store.workspaces import WorkspaceConfig, Workspaces
from datadesk.summary.service import SummaryService
from datadesk.summary.store import SummaryStore
from datadesk.summary.summarizer import Summarizer
from datadesk.threads.attachments import Attachments
from datadesk.threads.lifecycle import ThreadLifecycle
from datadesk.sharing.service import Sharing
from datadesk.threads.refresh import ThreadRefresh
from datadesk.threads.scheduler import RefreshScheduler, scheduler_clock
from datadesk.threads.requery import UserRequery
from datadesk.tools.artifacts import register_artifact_tools
from datadesk.tools.history import register_compact_tool, register_history_tools
from datadesk.tools.mcp.manager import MCPManager
from datadesk.tools.mcp.config import workspace_servers
from datadesk.tools.mcp.reload import WorkspaceMCP
from datadesk.tools.memory import memory_gate, register_memory_tools
from datadesk.tools.python import PythonTool, register_python_tool
from datadesk.tools.registry import ToolContext, ToolRegistry
from datadesk.tools.requery import RequeryService
from datadesk.tools.skills import SkillCatalog, register_skill_tool
from datadesk.tools.sql import register_sql_tool
from datadesk.tools.sources import register_source_tools
from datadesk.sources.registry import SourceSet, WorkspaceSources
from datadesk.sources.sqllimits import SQLLimits
from datadesk.tools.taskstate import register_task_state_tools

log = logging.getLogger(__name__)

MIGRATED_FILE = "migrated.json"  # written by `datadesk migrate` into a file home it copied


def open_cluster(settings: Settings, layout: Layout) -> Any:
    """The cluster set when `cluster.database_url` is set (imported only then: the embedded set
    needs neither psycopg nor obstore), else None. A file home that `datadesk migrate` copied to
    a cluster is refused: two servers writing one truth in two places would split it."""
    if settings.clustered:
        from datadesk.cluster.runtime import ClusterSet

        return ClusterSet(settings, layout)
    marker = layout.home / MIGRATED_FILE
    if marker.is_file():
        raise SettingsError(f"{layout.home} was migrated to a cluster database ({marker}): start DataDesk with "
                            "cluster.database_url (DATADESK_CLUSTER_DATABASE_URL) and storage.url pointing at it; "
                            "this file home is no longer the truth")
    return None


def open_users(settings: Settings) -> tuple[Any, Callable[[], None]]:
    """The user store of these settings' set, and how to close it (the CLI's `users` commands)."""
    layout = Layout(settings.home)
    cluster = open_cluster(settings, layout)
    if cluster is None:
        return UserStore(layout), lambda: None
    return cluster.users(), cluster.close


def check_mcp_tables(path: Path, cfg: WorkspaceConfig) -> None:
    """A workspace.toml's `[mcp.*]` tables as the MCP manager takes them, else WorkspaceConfigError."""
    workspace_servers(path, cfg.mcp)

class Runtime:
    """The composition root: builds every service once from Settings and hands each what it
    uses. The HTTP app (api/app.py) and the command line (cli.py) only ever build this.
    Tests build one with their own model.

    A plain class (not a dataclass) so web frameworks treat it as an opaque dependency.
    """

    def __init__(self, settings: Settings, model: ChatModel | None = None,
                 summary_model: ChatModel | None = None) -> None:
        self.settings = settings
        self.model: ChatModel = model or configured_model(settings)  # the configured LLM, else the demo
        self._owns_model = model is None  # closed at stop (its HTTP client); a caller's model is the caller's
        self.summary_model = summary_model or self.model  # the same LLM unless told otherwise
        self.layout = Layout(settings.home)
        # the state set, chosen once: the files of this home (embedded) or PostgreSQL + an object
        # store shared by every host (cluster, docs/several-hosts.md)
        self.cluster = open_cluster(settings, self.layout)
        self.counters = self.cluster.counters() if self.cluster else None  # None: each process's memory
        # the audit trail (`rt.audit.record`): who queried which source, downloads, sign-ins, admin changes
        self.audit = (self.cluster.audit() if self.cluster else
                      embedded_trail(self.layout.home, settings.audit.retention_days, settings.store.fsync == "record"))
        self.users = self.cluster.users() if self.cluster else UserStore(self.layout)
        self.disk = DiskRoom(self.layout.home, settings.store.min_free_mb)  # checked before new work
        self.threads = (self.cluster.threads() if self.cluster else
                        ThreadStore(self.layout, settings.limits.max_threads_per_user, settings.store.fsync))
        # each workspace.toml, re-read when edited (a bad edit keeps the last good one), [mcp.*] checked too
        self.workspaces = Workspaces(self.layout, check=check_mcp_tables)
        # full-text search over a user's threads: FTS5 per user in the home, or PostgreSQL's
        self.search = self.cluster.search() if self.cluster else ThreadSearch(self.layout, Thread.at)
        # the warehouse and the [sources.*] of each workspace: first rows within sql.timeout_s; for a
        # database the whole statement within offload.stream_timeout_s (set in its session)
        self.sources = WorkspaceSources(self.workspaces, settings.sql.timeout_s, settings.offload.stream_timeout_s,
                                        SQLLimits.from_settings(settings.limits, self.layout.home))
        # one turn per thread, N per user, cancel: across every worker of the host (file locks)
        self.turns = (self.cluster.turns() if self.cluster else
                      TurnRegistry(settings.chat.max_turns_per_user, lock_dir=self.layout.home / "locks" / "turns"))
        # turns a dead process cut off: finished at start and before the thread's next turn
        self.cut_off = CutOffTurns(self.layout, self.turns, settings.store.fsync)
        self.turns.before_turn = self.cut_off.before_turn
        self._background: set[asyncio.Task[Any]] = set()
        self._spawn = spawner(self._background)
        self.tools = ToolRegistry()
        self._build_data(settings)
        self._build_continuity(settings)
        self.kernels: KernelRegistry | None = None
        self.sandbox_health: Callable[[], tuple[bool, str]] = lambda: (False, "the sandbox is not running")
        if settings.sandbox.backend != "none":
            table, workers = self.cluster.kernels() if self.cluster else (None, None)
            self.kernels = build_kernel_registry(settings, self.layout, table, workers)
            self.kernels.on_start = lambda outcome: KERNEL_STARTS.labels(outcome).inc()
            self.sandbox_health = self.kernels.health
            register_python_tool(self.tools, PythonTool(settings, self.kernels, self.artifacts, self.quota,
                                                        self.requery, self.auto_requery))
        self.policy = TurnPolicy(self.tools, self.workspaces, self.skills, self.memory, self.extractor,
                                 lambda: self.sandbox_health(), self.model.name, self._spawn, sources=self.sources)
        self.turn_services = TurnServices(
            model=self.model, requests=self.requests, tools=self.tools, offload=self.offload,
            summaries=self.summaries, threads=self.threads, policy=self.policy, settings=settings.chat,
            calibrate=bool(getattr(self.model, "reports_real_usage", True)), disk=self.disk)
        # what the analyst does outside a turn (api/ only parses and shapes): uploads, pastes, re-query
        self.attachments = Attachments(self.offload, self.quota, self.turns, settings.offload,
                                       settings.context.max_message_tokens, self.policy.offload_capability,
                                       self.query_slots.guard, self._upload_slots(settings), self.disk)
        self.user_requery = UserRequery(self.requery, self.turns, self.disk)
        # issue 31: refresh an analysis (re-run its queries and the python that used them)
        self.refresh = ThreadRefresh(self.requery, self.tools, self.artifacts, self.turns, self.kernels,
                                     settings.chat.tool_timeout_s, self.disk)
        # one host runs a due schedule: the cluster's locks, or lock files
        locks = self.cluster.locks() if self.cluster else FileLocks(self.layout.home / "locks")
        self.scheduler = RefreshScheduler(self.threads, self.users, self.workspaces.names, self.refresh, locks,
                                          settings.refresh, clock=scheduler_clock())
        self.lifecycle = ThreadLifecycle(self.threads, self.turns, self.kernels,  # clear chat, delete thread
                                        self.artifacts)
        # issue 32: threads shared read-only inside their workspace, and "Copy into my chats"
        self.shares = self.cluster.shares() if self.cluster else FileShares(self.layout, settings.store.fsync != "never")
        self.sharing = Sharing(self.shares, self.threads, self.artifacts, self.audit, self.users)

    def _build_data(self, settings: Settings) -> None:
        """Artifacts and the data tools: SQL, re-query, history, skills, MCP."""
        self.artifacts = (self.cluster.artifacts(self._open_thread) if self.cluster else ArtifactStore(self.layout))
        self.quota = ArtifactQuota(settings.offload, self.artifacts)
        limits = settings.limits
        self.writers = WriterPool(limits.offload_writers_per_user, limits.offload_writers)  # 0: one per core
        self.offload = OffloadPipeline(settings.offload, self.artifacts, count_tokens,
                                       on_created=self.quota.after_create, writers=self.writers)
        self.requery = RequeryService(self.offload, self.tools, self.artifacts)
        self.query_slots = QuerySlots(limits.sql_queries_per_user, limits.sql_queries, limits.sql_queue_s,
                                      MemoryGuard(limits.app_memory_mb))
        register_sql_tool(self.tools, self.sources_for, settings.sql, settings.offload.threshold_chars,
                          settings.offload.stream_timeout_s, self.query_slots, audit=self.audit)
        register_source_tools(self.tools, self.sources_for)
        register_artifact_tools(self.tools, self.requery)
        register_history_tools(self.tools)
        self.skills = SkillCatalog(self.layout)
        register_skill_tool(self.tools, self.skills)
        self.mcp = MCPManager(self.tools, save_image=self._save_tool_image,
                              result_max_bytes=limits.mcp_result_max_mb * 1024**2,
                              min_free_bytes=settings.store.min_free_mb * 10**6,  # a spooled answer leaves it free
                              audit=self.audit)
        self.workspace_mcp = WorkspaceMCP(self.mcp, self.workspaces)  # started, then kept in step with the files

    def _upload_slots(self, settings: Settings) -> QuerySlots:
        limits = settings.limits
        return QuerySlots(limits.uploads_per_user, limits.uploads, limits.uploads_queue_s,
                          names=("uploads_per_user", "uploads", "uploads_queue_s"), kind="upload")

    def _build_continuity(self, settings: Settings) -> None:
        """What keeps long threads coherent: summaries, memory, and the request assembly."""
        self.summaries = SummaryService(SummaryStore(settings.summary.revisions_kept),
                                        Summarizer(self.summary_model, settings.summary, count_tokens,
                                                   summary_output(self.summary_model, settings)),
                                        settings.summary,  # one job per thread, in every process and host
                                        locks=(self.cluster.locks() if self.cluster else
                                               FileLocks(self.layout.home / "locks")))
        register_compact_tool(self.tools, self.summaries)
        self.memory = MemoryStore(self.layout, settings.memory, docs=self.cluster.memory_docs() if self.cluster else None,
                                  threads=self.threads)
        register_memory_tools(self.tools, self.memory,
                              memory_gate(self.memory, lambda ws: self.workspaces.config(ws).memory))
        self.extractor = MemoryExtractor(self.memory, self.summary_model, settings.memory,
                                         user_exists=self._user_active, memory_on=self._extraction_on)
        self.calibration = Calibration(self.layout.home / "calibration.json", settings.context.calibration_margin)
        self.context = ContextBuilder(settings.context, count_tokens, self.calibration,
                                      self._artifact_status, self._image_bytes)
        self.task_state = TaskStateStore()  # the user's goal and constraints per thread (context/taskstate.py)
        register_task_state_tools(self.tools, self.task_state)
        self.requests = RequestAssembler(self.context, self.summaries, settings.summary, self.memory,
                                         self.calibration, self.task_state)

    async def start(self) -> None:
        """Start background work (artifact sweeper, kernel pool, reaper, MCP servers); called by the
        app at startup."""
        await asyncio.to_thread(self.cut_off.finish_all)  # before serving: no thread shows a half turn
        if self.cluster is not None:  # turns whose host died or hung, finished by one host of the cluster
            self._spawn(self.cluster.reap_turns(), "turn-reaper")
        self._spawn(self._sweep_forever(), "artifact-sweeper")
        if self.kernels is not None:
            await self.kernels.start()
        self.validate_workspaces()
        await self.workspace_mcp.start()
        self._spawn(self.workspace_mcp.watch(), "mcp-reload")  # an edited [mcp.*] without a restart
        # each [sources.*] tried once in the background: one that is down shows with its reason
        self._spawn(asyncio.to_thread(self.sources.probe, self.workspaces.names()), "sources-probe")
        await self.scheduler.start()  # scheduled refreshes (threads/scheduler.py)

    def _open_thread(self, key: Any) -> Thread:
        """The thread an artifact row names (cluster artifacts' `find` and `walk`)."""
        return self.threads.get(key.thread, key.user, [key.workspace])

    async def stop(self) -> None:
        await self.scheduler.stop()
        await self.turns.cancel_all()
        self.sources.close()
        await self.summaries.drain()
        for task in list(self._background):
            task.cancel()
        await self.mcp.stop()
        if self.kernels is not None:
            await self.kernels.stop()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.close)
        close = getattr(self.model, "aclose", None) if self._owns_model else None
        if close is not None:
            await close()

    async def _sweep_forever(self) -> None:
        """The cache sweeper: TTL and quotas, enforced while the app runs; at start (and every
        round) what a crash left in artifacts folders (stale temp files, orphan data) goes too,
        and an artifact ledger never filled (a data directory from before it) is built."""
        every = self.settings.offload.sweep_interval_s
        try:
            await asyncio.to_thread(self.quota.start)
        except Exception:
            log.exception("start-up sweep of temp files failed")
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
        return self.mcp.status(ws)

    def validate_workspaces(self) -> list[str]:
        """Read every workspace's config now, so a bad file fails at start (file, key, problem)."""
        names = self.workspaces.names()
        for ws in names:
            self.workspaces.config(ws)  # its [mcp.*] tables too (check_mcp_tables)
        return names

    def auto_requery(self, ws: str) -> bool:
        """Whether expired artifacts are restored without asking, in workspace `ws`."""
        flag = self.workspaces.config(ws).auto_requery
        return self.settings.offload.auto_requery if flag is None else flag

    def _extraction_on(self, ws: str, uid: str) -> bool:
        """The workspace's memory flags and the user's permission, as they are now."""
        cfg = self.workspaces.config(ws)
        user = self.users.get(uid)
        return bool(user and cfg.memory_extraction and memory_access(cfg.memory, user.permissions, ws)[0])

    def _user_active(self, uid: str) -> bool:
        user = self.users.get(uid)
        return user is not None and not user.revoked

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
        except (ArtifactNotFound, ValueError, OSError, BlobError):  # the store down: the image is left out
            return None

    def sources_for(self, ctx: ToolContext) -> SourceSet:
        """The caller's workspace's sources: its warehouse and its configured databases."""
        return self.sources.get(ctx.workspace)

    def model_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"name": self.model.name, "demo": self.model.is_demo}
        if self.model.is_demo:
            info["label"] = "demo model, no LLM configured"
            info["suggestions"] = list(getattr(self.model, "suggestions", []))  # llm/demo.py
        return info
