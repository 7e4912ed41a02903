"""What a user may do in a workspace this turn: the tools offered, where large results go,
what the requests are made of, and the memory work after the reply.

Decided from the workspace's `workspace.toml`, the user's permissions and the sandbox's
health; the turn loop asks here and never reads configuration itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from datadesk.context.request import MemoryScope, TurnRequest
from datadesk.domain.records import Record
from datadesk.domain.tools import ToolSpec
from datadesk.domain.users import User
from datadesk.memory.extraction import MemoryExtractor
from datadesk.memory.store import MemoryStore
from datadesk.offload.pipeline import OffloadCapability
from datadesk.store.threads import Thread
from datadesk.store.workspaces import Workspaces
from datadesk.tools.registry import ToolRegistry
from datadesk.tools.skills import SkillCatalog

log = logging.getLogger(__name__)

PYTHON_TOOL = "python"


class TurnPolicy:
    """Per user and workspace: permitted tools, offload capability, the turn's request parts,
    and the background memory extraction after a reply."""

    def __init__(self, tools: ToolRegistry, workspaces: Workspaces, skills: SkillCatalog, memory: MemoryStore,
                 extractor: MemoryExtractor, sandbox_health: Callable[[], tuple[bool, str]], model_name: str,
                 spawn: Callable[[Any, str], None], sources: Any = None) -> None:
        self.tools = tools
        self.sources = sources  # sources.registry.WorkspaceSources: listed in the system message
        self.workspaces = workspaces
        self.skills = skills
        self.memory = memory
        self.extractor = extractor
        self.sandbox_health = sandbox_health
        self.model_name = model_name
        self._spawn = spawn

    def permitted_tools(self, user: User, workspace: str) -> list[ToolSpec]:
        """Tools this user may call in this workspace, in registration order."""
        cfg = self.workspaces.config(workspace)
        disabled = set(cfg.disabled_tools)
        if not cfg.memory:  # memory off in this workspace: its tools would only cost tokens
            disabled |= {"remember", "forget"}
        perms = user.permission_set
        return [s for s in self.tools.permitted(perms, workspace) if s.name not in disabled
                and cfg.tool_permissions.get(s.name, None) in (None, *perms)]

    def offload_capability(self, user: User, workspace: str, specs: list[ToolSpec] | None = None) -> OffloadCapability:
        """Large results go to files only when the model can read them: the python tool is in
        this request and the sandbox is healthy. Otherwise the notice says why not."""
        if specs is None:
            specs = self.permitted_tools(user, workspace)
        if any(s.name == PYTHON_TOOL for s in specs):
            healthy, why = self.sandbox_health()
            if healthy:
                return OffloadCapability(True)
            return OffloadCapability(False, f"the python sandbox is down: {why}")
        if self.tools.get(PYTHON_TOOL) is None:
            return OffloadCapability(False, "code execution is not set up on this server")
        if PYTHON_TOOL in self.workspaces.config(workspace).disabled_tools:
            return OffloadCapability(False, "the python tool is disabled in this workspace")
        return OffloadCapability(False, "you do not have the code_execution permission")

    def turn_request(self, user: User, thread: Thread, epoch: int, turn_id: str,
                     specs: list[ToolSpec]) -> TurnRequest:
        """What every request of this turn is made of (context.request builds each one)."""
        ws = thread.workspace
        cfg = self.workspaces.config(ws)
        memory = MemoryScope(workspace=ws, user=user.id, project=thread.meta.project if thread.meta else None,
                             workspace_on=cfg.memory, permissions=user.permission_set)
        return TurnRequest(thread=thread, epoch=epoch, model=self.model_name, turn_id=turn_id,
                           tools=[s.openai_schema() for s in specs], workspace_prompt=cfg.prompt,
                           skills_catalog=self.skills.catalog_text(ws), memory=memory,
                           sources_catalog=self.sources.get(ws).prompt_text() if self.sources is not None else "")

    def after_turn(self, user: User, thread: Thread, records: list[Record]) -> None:
        """Background memory extraction (off by default; a workspace flag), never awaited."""
        ws = thread.workspace
        cfg = self.workspaces.config(ws)
        if not cfg.memory_extraction or not self.memory.allowed(ws, user.id, cfg.memory, user.permissions)[0]:
            return
        self._spawn(self.extractor.extract(ws, user.id, records, thread=thread.id), f"memory-extract:{thread.id}")


def spawner(tasks: set[asyncio.Task[Any]]) -> Callable[[Any, str], None]:
    """Start a background task kept referenced in `tasks` until it ends (cancelled at stop)."""

    def spawn(coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return spawn
