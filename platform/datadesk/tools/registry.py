"""The tool registry: specs, permissions, and a uniform way to run a call.

Built-in tools (`sql_query`, python, memory, skills, history, artifacts) and MCP tools
all register here, so the turn loop never special-cases one of them. A built-in tool
registers with its arguments Struct (tools/arguments.py): the registry decodes and
validates the call's JSON against it and the handler gets the typed struct. An MCP tool
registers without one: its server's schema is sent as is and its handler gets the dict.

Errors: a tool signals a problem the model can act on by raising `ToolError`
(bad arguments, bad SQL, a refused statement). Any other exception is turned
into a generic tool error by `ToolRegistry.run` and logged; nothing escapes to
the turn loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import msgspec

from datadesk.domain.tools import ToolError, ToolResult, ToolSpec
from datadesk.store.files import not_saved
from datadesk.tools.arguments import InvalidArguments, ToolArguments, arguments_schema, parse_arguments
from datadesk.tools.context import ToolContext, TurnFacts

__all__ = ["PERMISSIONS", "Handler", "Tool", "ToolContext", "ToolError", "ToolRegistry", "ToolResult",
           "ToolSpec", "TurnFacts"]

log = logging.getLogger(__name__)

PERMISSIONS = ("code_execution", "memory", "admin")

# A handler gets the arguments as its tool's ToolArguments struct (built-in tools) or as the
# decoded JSON object (MCP tools), and the context of the call.
Handler = Callable[[Any, ToolContext], Awaitable[ToolResult]]


@dataclass
class Tool:
    """A registered tool: what the model is told, what runs, and how its arguments are read."""

    spec: ToolSpec
    handler: Handler
    arguments: type[ToolArguments] | None = None  # None: the handler gets the dict


class ToolRegistry:
    """Named tools in registration order (a stable order keeps prompt caches warm).

    Built-in tools are global; MCP tools belong to one workspace (`spec.workspace`), so
    two workspaces may each have a `crm__search` without seeing the other's.
    """

    def __init__(self) -> None:
        self._tools: dict[tuple[str, str], Tool] = {}
        self._explainers: list[Callable[[str, str | None], str | None]] = []

    def explain_missing(self, explain: Callable[[str, str | None], str | None]) -> None:
        """Add `explain(name, workspace)`: why a tool the registry does not have is missing (the
        MCP server it belongs to is down), said to the model instead of "unknown tool"."""
        self._explainers.append(explain)

    def register(self, spec: ToolSpec, handler: Handler, arguments: type[ToolArguments] | None = None) -> None:
        """Add a tool. With `arguments`, `spec.parameters` must be its schema (`arguments_schema`):
        one declaration, for the model and for validation."""
        key = (spec.workspace or "", spec.name)
        if key in self._tools or ("", spec.name) in self._tools:
            raise ValueError(f"tool {spec.name!r} is already registered")
        if spec.permission is not None and spec.permission not in PERMISSIONS:
            raise ValueError(f"tool {spec.name!r}: unknown permission {spec.permission!r}")
        if arguments is not None and spec.parameters != arguments_schema(arguments):
            raise ValueError(f"tool {spec.name!r}: parameters differ from its {arguments.__name__} declaration")
        self._tools[key] = Tool(spec, handler, arguments)

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
            for explain in self._explainers:
                why = explain(name, ctx.workspace)
                if why:
                    return ToolResult(f"{name} failed: {why}", is_error=True)
            known = ", ".join(s.name for s in self.permitted(ctx.permissions, ctx.workspace)) or "none"
            return ToolResult(f"unknown tool {name!r}; available tools: {known}", is_error=True)
        if tool.spec.permission and tool.spec.permission not in ctx.permissions:
            return ToolResult(
                f"permission denied: tool {name!r} needs the {tool.spec.permission!r} permission",
                is_error=True,
            )
        try:
            args = msgspec.json.decode(raw_arguments or "{}")
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
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
            typed = parse_arguments(name, args, tool.arguments) if tool.arguments is not None else args
        except InvalidArguments as exc:
            return ToolResult(str(exc), is_error=True)
        try:
            return await tool.handler(typed, ctx)
        except ToolError as exc:
            return ToolResult(f"{name} failed: {exc}", is_error=True)
        except OSError as exc:  # a full disk: say so (the model can tell the user), nothing was kept
            error = not_saved(exc, f"the result of {name}")
            if error is None:
                log.exception("tool %s raised", name)
                return ToolResult(f"{name} failed with an internal error ({type(exc).__name__})", is_error=True)
            log.error("tool %s: %s", name, error)
            return ToolResult(f"{name} failed: {error}", is_error=True)
        except Exception as exc:  # a tool bug must not break the turn
            log.exception("tool %s raised", name)
            return ToolResult(f"{name} failed with an internal error ({type(exc).__name__})", is_error=True)
