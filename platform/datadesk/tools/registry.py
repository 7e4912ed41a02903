"""The tool registry: specs, permissions, and a uniform way to run a call.

Built-in tools (`sql_query`, later python/memory/skills) and MCP tools all
register here, so the turn loop never special-cases one of them.

Errors: a tool signals a problem the model can act on by raising `ToolError`
(bad arguments, bad SQL, a refused statement). Any other exception is turned
into a generic tool error by `ToolRegistry.run` and logged; nothing escapes to
the turn loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import msgspec

from datadesk.offload.stream import TabularStream

log = logging.getLogger(__name__)

PERMISSIONS = ("code_execution", "memory", "admin")


class ToolError(Exception):
    """A failure the model can read and act on (bad arguments, bad SQL, refused statement)."""


class ToolSpec(msgspec.Struct, frozen=True):
    """What the registry knows about a tool.

    - `permission`: required user permission (one of PERMISSIONS) or None.
    - `offloadable`: its raw result may be offloaded to an artifact when large
      (False for first-party tools with an explicit return contract).
    - `read_only`: safe to re-run (used by re-query of expired artifacts).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    permission: str | None = None
    offloadable: bool = True
    read_only: bool = False
    source: str = "builtin"  # builtin | mcp:<server>
    workspace: str | None = None  # None: every workspace; else only that workspace's requests
    annotations: dict[str, Any] | None = None  # e.g. MCP tool annotations (readOnlyHint, ...)

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass
class ToolContext:
    """Who is calling and where: passed to every tool handler."""

    workspace: str
    user: str
    thread: str
    permissions: frozenset[str]
    workspace_dir: Path
    thread_dir: Path
    call_id: str = ""
    epoch: int | None = None  # the thread's epoch when the turn started (clear bumps it)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolResult:
    """The raw outcome of a tool call. `content` is what the model reads."""

    content: str
    is_error: bool = False
    data: Any = None  # structured form for callers (small results only)
    meta: dict[str, Any] = field(default_factory=dict)
    # A large tabular result, streamed: the offload pipeline writes it to an
    # artifact (or counts it for the truncated form) and replaces `content`.
    table: TabularStream | None = None


Handler = Callable[[dict[str, Any], ToolContext], Awaitable[ToolResult]]


@dataclass
class Tool:
    spec: ToolSpec
    handler: Handler


class ToolRegistry:
    """Named tools in registration order (a stable order keeps prompt caches warm).

    Built-in tools are global; MCP tools belong to one workspace (`spec.workspace`), so
    two workspaces may each have a `crm__search` without seeing the other's.
    """

    def __init__(self) -> None:
        self._tools: dict[tuple[str, str], Tool] = {}

    def register(self, spec: ToolSpec, handler: Handler) -> None:
        key = (spec.workspace or "", spec.name)
        if key in self._tools or ("", spec.name) in self._tools:
            raise ValueError(f"tool {spec.name!r} is already registered")
        if spec.permission is not None and spec.permission not in PERMISSIONS:
            raise ValueError(f"tool {spec.name!r}: unknown permission {spec.permission!r}")
        self._tools[key] = Tool(spec, handler)

    def unregister(self, name: str, workspace: str | None = None) -> None:
        self._tools.pop((workspace or "", name), None)

    def get(self, name: str, workspace: str | None = None) -> Tool | None:
        if workspace:
            hit = self._tools.get((workspace, name))
            if hit is not None:
                return hit
        return self._tools.get(("", name))

    def names(self, workspace: str | None = None) -> list[str]:
        return [n for (ws, n) in self._tools if ws in ("", workspace or "")]

    def permitted(self, permissions: frozenset[str], workspace: str | None = None) -> list[ToolSpec]:
        """Specs the holder of `permissions` may call (in `workspace`), in registration order."""
        return [
            t.spec
            for (ws, _), t in self._tools.items()
            if ws in ("", workspace or "") and (t.spec.permission is None or t.spec.permission in permissions)
        ]

    async def run(self, name: str, raw_arguments: str, ctx: ToolContext) -> ToolResult:
        """Run one call; every failure becomes an error result the model can act on."""
        tool = self.get(name, ctx.workspace)
        if tool is None:
            known = ", ".join(s.name for s in self.permitted(ctx.permissions, ctx.workspace)) or "none"
            return ToolResult(f"unknown tool {name!r}; available tools: {known}", is_error=True)
        if tool.spec.permission and tool.spec.permission not in ctx.permissions:
            return ToolResult(
                f"permission denied: tool {name!r} needs the {tool.spec.permission!r} permission",
                is_error=True,
            )
        try:
            args = msgspec.json.decode(raw_arguments or "{}")
        except msgspec.DecodeError as exc:
            return ToolResult(f"invalid arguments for {name!r}: not valid JSON ({exc})", is_error=True)
        if not isinstance(args, dict):
            return ToolResult(f"invalid arguments for {name!r}: expected a JSON object", is_error=True)
        missing = [k for k in tool.spec.parameters.get("required", []) if k not in args]
        if missing:
            return ToolResult(
                f"invalid arguments for {name!r}: missing required {', '.join(missing)}",
                is_error=True,
            )
        try:
            return await tool.handler(args, ctx)
        except ToolError as exc:
            return ToolResult(f"{name} failed: {exc}", is_error=True)
        except Exception as exc:  # a tool bug must not break the turn
            log.exception("tool %s raised", name)
            return ToolResult(f"{name} failed with an internal error ({type(exc).__name__})", is_error=True)
