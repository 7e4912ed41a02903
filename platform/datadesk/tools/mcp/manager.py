"""MCP client manager: a workspace's MCP servers, their tools in the registry.

Each configured server is connected over stdio (a subprocess, `command`) or
streamable HTTP (`url`). Its tools are registered in the `ToolRegistry` for
that workspace as `<server>__<tool>` (sanitised to OpenAI's
`^[a-zA-Z0-9_-]{1,64}$`; the real name is kept for the call).

Each server runs in its own long-lived asyncio task which owns the transport
and `ClientSession` context managers: the SDK's anyio cancel scopes must be
entered and exited in one task. Tool calls are sent from the callers' tasks
with `session.call_tool` (safe from other tasks of the same loop: the SDK's
dispatcher correlates requests through memory streams).

A server that goes away (process exit, transport error) keeps its tools
registered; they answer a clear ToolError while it is down, and the runner
reconnects with exponential backoff (1 s, 2 s, 4 s ... 60 s), then lists the
tools again (new ones registered, removed ones unregistered).

Secrets: `env` and `headers` values may be `${env:NAME}`, resolved from the
app's environment at connect time and never shown (see `masked_config`). A
stdio server gets only its own `env` plus PATH/HOME/LANG (the SDK adds its own
safe defaults: HOME, LOGNAME, PATH, SHELL, TERM, USER) — never the app's
environment. Its stderr goes to the log `datadesk.mcp.<server>` line by line,
redacted.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio
import anyio.to_thread

from datadesk.domain.records import ToolRecordMeta
from datadesk.tools.mcp.config import (  # noqa: F401  (re-exported: the public names live here too)
    _ENV_REF, _SECRET_KEY, _BACKOFF_MAX_S, _HEALTHY_S, _MAX_DESCRIPTION, _MAX_STDERR_LINE, _PASSED_ENV, MCPConfigError, MCPServerConfig,
    _describe, exposed_tool_name, mask, masked_config, redact, resolve_values,
)
from datadesk.tools.mcp.streams import _StderrPipe, _WatchedStream, warm_sdk_imports
from datadesk.tools.mcp.shapes import source_hints
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec

log = logging.getLogger(__name__)

@dataclass
class _ToolInfo:
    real: str
    spec: ToolSpec
    output_schema: dict[str, Any] | None = None  # the tool's outputSchema (column formats of its rows)


@dataclass
class _Server:
    ws: str
    name: str
    cfg: MCPServerConfig
    base_dir: Path
    log: logging.Logger
    state: str = "starting"
    session: Any = None
    tools: dict[str, _ToolInfo] = field(default_factory=dict)
    last_error: str | None = None
    restarts: int = 0
    secrets: list[str] = field(default_factory=list)
    task: asyncio.Task | None = None
    scope: anyio.CancelScope | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # first attempt over (up or down)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    conn_closed: str | None = None  # why the current connection ended
    relist: bool = False
    stopping: bool = False
    stderr: _StderrPipe | None = None
    up_since: float | None = None  # monotonic time the current connection came up


class MCPManager:
    """Connects workspaces' MCP servers and exposes their tools through the registry."""

    def __init__(self, registry: ToolRegistry,
                 save_image: Callable[[ToolContext, bytes, str], str] | None = None,
                 result_max_bytes: int = 32 * 1024**2) -> None:
        self.registry = registry
        self.save_image = save_image
        if result_max_bytes <= 0:
            raise ValueError("limits.mcp_result_max_mb must be > 0")
        self.result_max_bytes = result_max_bytes  # limits.mcp_result_max_mb: one message from a server
        self._servers: dict[str, dict[str, _Server]] = {}

    # -- lifecycle ---------------------------------------------------------------------
    async def start_workspace(self, ws: str, servers: dict[str, MCPServerConfig], base_dir: Path) -> None:
        """Connect every enabled server of `ws` (after stopping what ran there before).

        Returns when each server is up or down (its first attempt over); a down
        server keeps being retried in the background. Never raises for one bad server."""
        await self.stop_workspace(ws)
        table: dict[str, _Server] = {}
        self._servers[ws] = table
        for name, cfg in servers.items():
            srv = _Server(ws=ws, name=name, cfg=cfg, base_dir=Path(base_dir),
                          log=logging.getLogger(f"datadesk.mcp.{name}"))
            table[name] = srv
            if not cfg.enabled:
                srv.state = "disabled"
                srv.ready.set()
                continue
            try:
                cfg.validate(name)
            except ValueError as exc:
                self._config_down(srv, str(exc))
                continue
            srv.task = asyncio.create_task(self._runner(srv), name=f"mcp:{ws}:{name}")
        waits = [(srv, asyncio.ensure_future(srv.ready.wait())) for srv in table.values() if srv.task]
        for srv, fut in waits:
            try:
                await asyncio.wait_for(fut, srv.cfg.startup_timeout_s + 15)
            except asyncio.TimeoutError:
                srv.log.warning("MCP server %s: still not up after %.0f s", srv.name, srv.cfg.startup_timeout_s)

    async def stop_workspace(self, ws: str) -> None:
        table = self._servers.pop(ws, {})
        await asyncio.gather(*(self._stop_server(srv) for srv in table.values()))

    async def stop(self) -> None:
        """Close every session and end every server process."""
        for ws in list(self._servers):
            await self.stop_workspace(ws)

    async def _stop_server(self, srv: _Server) -> None:
        srv.stopping = True
        if srv.scope is not None:
            srv.scope.cancel()
        srv.wake.set()
        task = srv.task
        if task is not None:
            # The SDK's stdio shutdown is bounded (stdin closed, 2 s grace, SIGTERM, SIGKILL).
            done, _ = await asyncio.wait({task}, timeout=30)
            if not done:
                srv.log.warning("MCP server %s did not stop in time; cancelling its task", srv.name)
                task.cancel()
                await asyncio.wait({task}, timeout=10)
            if task.done() and not task.cancelled() and task.exception() is not None:
                srv.log.warning("MCP server %s: its task ended with %s", srv.name, _describe(task.exception()))
        for exposed in list(srv.tools):
            self.registry.unregister(exposed, srv.ws)
        srv.tools.clear()
        srv.session = None
        if srv.state != "disabled":
            srv.state = "down"
            srv.last_error = srv.last_error or "stopped"

    def _config_down(self, srv: _Server, reason: str) -> None:
        srv.state = "down"
        srv.last_error = redact(reason)
        srv.log.error("MCP server %s not started: %s", srv.name, srv.last_error)
        srv.ready.set()

    # -- status ------------------------------------------------------------------------
    def status(self, ws: str) -> list[dict[str, Any]]:
        out = []
        for srv in self._servers.get(ws, {}).values():
            out.append({
                "name": srv.name,
                "transport": srv.cfg.transport,
                "state": srv.state,
                "tools": list(srv.tools),
                "last_error": redact(srv.last_error, srv.secrets) if srv.last_error else None,
                "restarts": srv.restarts,
                "config": masked_config(srv.cfg),
            })
        return out

    # -- the per-server task -------------------------------------------------------------
    async def _runner(self, srv: _Server) -> None:
        delay = 1.0
        first = True
        try:
            with anyio.CancelScope() as scope:
                srv.scope = scope
                if srv.stopping:
                    scope.cancel()
                while not srv.stopping:
                    if not first:
                        srv.restarts += 1
                        srv.log.info("MCP server %s: restarting (attempt %d)", srv.name, srv.restarts)
                    first = False
                    srv.state = "starting"
                    srv.up_since = None
                    try:
                        await self._serve_once(srv)
                        reason = srv.conn_closed or "the connection closed"
                    except MCPConfigError as exc:
                        self._config_down(srv, str(exc))
                        return
                    except anyio.get_cancelled_exc_class():
                        raise
                    except Exception as exc:  # noqa: BLE001 - any failure: down, then retried
                        reason = _describe(exc)
                    if srv.stopping:
                        break
                    ended = time.monotonic()
                    if srv.stderr is not None:
                        await anyio.to_thread.run_sync(srv.stderr.join, 1.0)  # the last lines of a dying server
                        recent = [line for t, line in srv.stderr.tail if t >= ended - 3.0]
                        if recent:
                            reason = f"{reason}; last stderr: {recent[-1]}"
                    srv.state = "down"
                    srv.session = None
                    srv.last_error = redact(reason, srv.secrets)[:1000]
                    srv.log.warning("MCP server %s is down: %s", srv.name, srv.last_error)
                    srv.ready.set()
                    if srv.up_since is not None and time.monotonic() - srv.up_since >= _HEALTHY_S:
                        delay = 1.0
                    await anyio.sleep(delay)
                    delay = min(delay * 2, _BACKOFF_MAX_S)
        except Exception as exc:  # noqa: BLE001 - a bug here must not go unnoticed nor hang callers
            srv.log.exception("MCP server %s: the manager's task failed", srv.name)
            srv.state = "down"
            srv.last_error = f"internal error in the MCP manager ({type(exc).__name__})"
        finally:
            srv.session = None
            srv.ready.set()

    async def _serve_once(self, srv: _Server) -> None:
        """One connection: connect, initialize, list and register tools, serve until it ends."""
        cfg = srv.cfg
        env = resolve_values(srv.name, "env", cfg.env)
        headers = resolve_values(srv.name, "headers", cfg.headers)
        srv.secrets = sorted(
            {v for k, v in env.items() if _ENV_REF.match(cfg.env[k]) or _SECRET_KEY.search(k)}
            | set(headers.values()), key=len, reverse=True)
        srv.conn_closed = None
        srv.relist = False
        srv.wake.clear()

        def closed(reason: str) -> None:
            self._mark_closed(srv, reason)

        if "jsonschema.validators" not in sys.modules:  # once per process, off the event loop
            await anyio.to_thread.run_sync(warm_sdk_imports)
        if cfg.command is not None:
            from mcp import StdioServerParameters

            from datadesk.tools.mcp.stdio import bounded_stdio_client

            child_env = {k: os.environ[k] for k in _PASSED_ENV if os.environ.get(k)}
            child_env.update(env)
            cwd = srv.base_dir / cfg.cwd if cfg.cwd else srv.base_dir
            params = StdioServerParameters(command=cfg.command[0], args=list(cfg.command[1:]), env=child_env,
                                           cwd=str(cwd) if cwd.is_dir() else None)
            if cfg.cwd and not cwd.is_dir():
                raise MCPConfigError(f"MCP server {srv.name!r}: `cwd` {cfg.cwd!r} is not a directory")
            pipe = _StderrPipe(srv.log, srv.secrets)
            srv.stderr = pipe
            try:
                # our bounded transport (tools/mcp/stdio.py), not the SDK's unbounded stdio_client
                async with bounded_stdio_client(params, pipe.writer, max_bytes=self.result_max_bytes,
                                                line_timeout_s=cfg.timeout_s, logger=srv.log) as (read, write, t):
                    pipe.close_writer()
                    await self._session(srv, _WatchedStream(read, lambda: closed(
                        t.close_reason or "the server process exited or closed its output")), write)
            finally:
                pipe.close_writer()
        else:
            from mcp.client.streamable_http import streamable_http_client

            from datadesk.tools.mcp.http import bounded_http_client

            srv.stderr = None
            limit = self.result_max_bytes
            async with bounded_http_client(headers or None, limit) as client:
                async with streamable_http_client(cfg.url, http_client=client,
                                                  max_sse_event_size=limit) as (read, write):
                    await self._session(
                        srv, _WatchedStream(read, lambda: closed("the HTTP connection closed")), write)

    async def _session(self, srv: _Server, read: Any, write: Any) -> None:
        from mcp import ClientSession
        import mcp.types as mt

        async def on_message(message: Any) -> None:
            if isinstance(message, Exception):
                text = redact(_describe(message), srv.secrets)
                srv.log.warning("MCP server %s: transport error: %s", srv.name, text)
                if srv.cfg.url is not None and _is_transport_failure(message):
                    self._mark_closed(srv, f"transport error: {text}")
            elif isinstance(message, mt.ToolListChangedNotification):
                srv.relist = True
                srv.wake.set()

        async def on_log(params: Any) -> None:
            level = {"debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO,
                     "warning": logging.WARNING}.get(str(params.level), logging.ERROR)
            data = params.data if isinstance(params.data, str) else json.dumps(params.data, default=str)
            srv.log.log(level, "%s", redact(data[:_MAX_STDERR_LINE], srv.secrets))

        async with ClientSession(read, write, message_handler=on_message, logging_callback=on_log) as session:
            limit = srv.cfg.startup_timeout_s
            try:
                with anyio.fail_after(limit):
                    await session.initialize()
                    tools = await self._list_tools(session)
            except TimeoutError:
                raise TimeoutError(f"the server did not initialize and list its tools within {limit:g} s") from None
            self._sync_tools(srv, tools)
            srv.session = session
            srv.state = "up"
            srv.last_error = None
            srv.up_since = time.monotonic()
            srv.log.info("MCP server %s is up with %d tools", srv.name, len(srv.tools))
            srv.ready.set()
            try:
                while srv.conn_closed is None and not srv.stopping:
                    await srv.wake.wait()
                    srv.wake.clear()
                    if srv.relist and srv.conn_closed is None and not srv.stopping:
                        srv.relist = False
                        try:
                            with anyio.fail_after(srv.cfg.timeout_s):
                                self._sync_tools(srv, await self._list_tools(session))
                        except Exception as exc:  # noqa: BLE001
                            srv.log.warning("MCP server %s: re-listing tools failed: %s", srv.name,
                                            redact(_describe(exc), srv.secrets))
            finally:
                srv.session = None

    @staticmethod
    def _mark_closed(srv: _Server, reason: str) -> None:
        """The current connection is gone: calls answer 'down' at once; the runner reconnects."""
        if srv.conn_closed is None:
            srv.conn_closed = reason
        if srv.state == "up":
            srv.state = "down"
            srv.session = None
            srv.last_error = redact(reason, srv.secrets)
        srv.wake.set()

    @staticmethod
    async def _list_tools(session: Any) -> list[Any]:
        import mcp.types as mt

        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(100):
            result = await session.list_tools(params=mt.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(result.tools)
            cursor = result.next_cursor
            if not cursor:
                break
        return tools

    def _sync_tools(self, srv: _Server, tools: list[Any]) -> None:
        """Register the server's allowed tools; unregister those gone or changed."""
        cfg = srv.cfg
        allowed = None if cfg.allow_tools is None else set(cfg.allow_tools)
        listed = []
        for tool in tools:
            if (allowed is None or tool.name in allowed) and tool.name not in {t.name for t in listed}:
                listed.append(tool)
        # Names stay stable across re-listings: a tool still there keeps the name it had.
        by_real = {info.real: name for name, info in srv.tools.items()}
        taken = {by_real[t.name] for t in listed if t.name in by_real}
        wanted: dict[str, _ToolInfo] = {}
        for tool in listed:
            exposed = by_real.get(tool.name)
            if exposed is None:
                exposed = exposed_tool_name(srv.name, tool.name, taken)
                taken.add(exposed)
            wanted[exposed] = _ToolInfo(real=tool.name, spec=self._spec(srv, exposed, tool),
                                        output_schema=getattr(tool, "output_schema", None))
        for exposed, info in list(srv.tools.items()):
            new = wanted.get(exposed)
            if new is None or new.spec != info.spec:
                self.registry.unregister(exposed, srv.ws)
                del srv.tools[exposed]
        for exposed, info in wanted.items():
            if exposed in srv.tools:
                continue
            try:
                self.registry.register(info.spec, self._handler(srv, exposed))
            except ValueError as exc:
                srv.log.warning("MCP server %s: tool %s not registered: %s", srv.name, info.real, exc)
                continue
            srv.tools[exposed] = info

    def _spec(self, srv: _Server, exposed: str, tool: Any) -> ToolSpec:
        params = dict(tool.input_schema or {})
        params.setdefault("type", "object")
        if params.get("type") == "object":
            params.setdefault("properties", {})
        ann = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
        if tool.title and "title" not in ann:
            ann["title"] = tool.title
        description = (tool.description or tool.title or f"Tool {tool.name} of the MCP server {srv.name}.")
        return ToolSpec(
            name=exposed,
            description=description[:_MAX_DESCRIPTION],
            parameters=params,
            source=f"mcp:{srv.name}",
            workspace=srv.ws,
            offloadable=True,
            read_only=bool(ann.get("readOnlyHint")) or tool.name in srv.cfg.read_only_tools,
            annotations=ann or None,
        )

    # -- calls ---------------------------------------------------------------------------
    def _handler(self, srv: _Server, exposed: str):
        async def handler(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            return await self._call(srv, exposed, args, ctx)

        return handler

    def _down_error(self, srv: _Server) -> ToolError:
        if srv.stopping:
            return ToolError(f"the MCP server {srv.name} has been stopped")
        reason = redact(srv.last_error or srv.conn_closed or "not connected", srv.secrets)
        if srv.state == "starting" and not srv.last_error and srv.restarts == 0:
            return ToolError(f"the MCP server {srv.name} is still starting; try again in a moment")
        return ToolError(f"the MCP server {srv.name} is down ({reason}); it is being restarted")

    async def _call(self, srv: _Server, exposed: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        from datadesk.tools.mcp.stdio import LIMIT_SETTING, too_large_text

        info = srv.tools.get(exposed)
        if info is None:
            raise ToolError(f"the MCP server {srv.name} no longer offers this tool")
        session = srv.session
        if session is None or srv.state != "up":
            raise self._down_error(srv)
        timeout = srv.cfg.timeout_s
        late = (f"the MCP server {srv.name} did not answer within {timeout:g} s (timeout_s of [mcp.{srv.name}]); "
                "ask it for less or raise its timeout_s")
        try:
            with anyio.fail_after(timeout + 5):
                result = await session.call_tool(info.real, args, read_timeout_seconds=timeout)
        except TimeoutError:
            raise ToolError(late) from None
        except MCPError as exc:
            code = exc.code
            if LIMIT_SETTING in exc.message:  # the transport refused a result past limits.mcp_result_max_mb
                raise ToolError(f"the MCP server {srv.name} answered with {too_large_text(self.result_max_bytes)}; "
                                "ask it for less: filter, paginate or aggregate") from None
            if code == REQUEST_TIMEOUT:
                raise ToolError(late) from None
            if code == CONNECTION_CLOSED:
                reason = "the connection closed during the call"
                self._mark_closed(srv, reason)
                raise ToolError(f"the MCP server {srv.name} is down ({reason}); it is being restarted") from None
            raise ToolError(f"the MCP server {srv.name} refused the call: "
                            f"{redact(str(exc), srv.secrets)}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError) as exc:
            self._mark_closed(srv, _describe(exc))
            raise ToolError(f"the MCP server {srv.name} is down ({_describe(exc)}); it is being restarted") from None
        except RuntimeError as exc:  # e.g. structured content not matching the output schema
            raise ToolError(f"the MCP server {srv.name} sent an invalid result: {exc}") from None
        return self._convert(srv, info, result, ctx)

    def _convert(self, srv: _Server, info: _ToolInfo, result: Any, ctx: ToolContext) -> ToolResult:
        import mcp.types as mt

        parts: list[str] = []
        images: list[str] = []
        for item in getattr(result, "content", None) or []:
            if isinstance(item, mt.TextContent):
                parts.append(item.text)
            elif isinstance(item, mt.ImageContent):
                parts.append(self._image(srv, item, ctx, images))
            elif isinstance(item, mt.AudioContent):
                parts.append(f"(audio content, {item.mime_type}, not shown)")
            elif isinstance(item, mt.ResourceLink):
                parts.append(f"resource: {item.uri}" + (f" ({item.name})" if item.name else ""))
            elif isinstance(item, mt.EmbeddedResource):
                res = item.resource
                if isinstance(res, mt.TextResourceContents):
                    parts.append(res.text)
                else:
                    size = len(getattr(res, "blob", "") or "") * 3 // 4
                    parts.append(f"(binary resource {res.uri}, about {size:,} bytes, not shown)")
            else:
                parts.append(f"({getattr(item, 'type', 'unknown')} content, not shown)")
        structured = getattr(result, "structured_content", None)
        if not [p for p in parts if p] and structured is not None:
            parts.append(json.dumps(structured, ensure_ascii=False, default=str))
        content = "\n".join(parts)
        is_error = bool(getattr(result, "is_error", False))
        if not content:
            content = "the tool reported an error without a message" if is_error else "(no output)"
        meta = ToolRecordMeta(mcp_server=srv.name, mcp_tool=info.real, images=images or None)
        data = None
        if structured is not None:
            try:
                if len(json.dumps(structured, default=str)) <= 65536:
                    data = structured
            except (TypeError, ValueError):
                data = None
        # structuredContent (with the outputSchema's formats) is preferred over the text by the
        # offload pipeline's shape detection; the input schema tells its paging and row caps.
        hints = None if is_error else source_hints(info.spec.parameters, info.output_schema, structured,
                                                   info.spec.description)
        return ToolResult(content=content, is_error=is_error, data=data, meta=meta, source=hints)

    def _image(self, srv: _Server, item: Any, ctx: ToolContext, images: list[str]) -> str:
        mime = (item.mime_type or "application/octet-stream").lower()
        try:
            data = base64.b64decode(item.data, validate=True)
        except (binascii.Error, ValueError):
            return f"(an image from {srv.name} could not be decoded)"
        if self.save_image is None:
            return f"(an image was returned: {mime}, {len(data):,} bytes; images are not kept here)"
        try:
            aid = self.save_image(ctx, data, mime)
        except Exception as exc:  # noqa: BLE001 - quota, disk, cleared thread: a note, not a failure
            srv.log.warning("MCP server %s: image not saved: %s", srv.name, _describe(exc))
            return f"(an image was returned but not saved: {_describe(exc)})"
        images.append(aid)
        return f"image: artifact {aid} ({len(data):,} bytes {mime}), shown to the user in the chat"


def _is_transport_failure(exc: BaseException) -> bool:
    try:
        import httpx2
    except ImportError:  # pragma: no cover
        return isinstance(exc, (ConnectionError, OSError))
    return isinstance(exc, (httpx2.TransportError, ConnectionError, OSError))
