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

from datadesk.audit.queries import QueryEntry
from datadesk.tools.mcp.config import (  # noqa: F401  (re-exported: the public names live here too)
    _ENV_REF, _SECRET_KEY, _BACKOFF_MAX_S, _HEALTHY_S, _MAX_DESCRIPTION, _MAX_STDERR_LINE, _PASSED_ENV, MCPConfigError, MCPServerConfig,
    _describe, exposed_tool_name, mask, masked_config, redact, resolve_values,
)
from datadesk.tools.mcp.results import ResultReader
from datadesk.tools.mcp.spool import SPOOL_DIR, SPOOL_FAILED, SPOOL_META, SpooledAnswer
from datadesk.tools.mcp.streams import _StderrPipe, _WatchedStream, warm_sdk_imports
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
    transport: Any = None  # the stdio transport of the current connection (it holds spooled answers)
    exit_code: int | None = None  # the stdio server's exit status when its last connection ended with it
    known_tools: list[str] = field(default_factory=list)  # the tools it offered when last up


class MCPManager:
    """Connects workspaces' MCP servers and exposes their tools through the registry."""

    def __init__(self, registry: ToolRegistry,
                 save_image: Callable[[ToolContext, bytes, str], str] | None = None,
                 result_max_bytes: int = 256 * 1024**2, min_free_bytes: int = 0, audit: Any = None) -> None:
        self.registry = registry
        self.audit = audit  # one "query" entry per tool call (audit/queries.py): MCP servers reach data
        self.results = ResultReader(save_image)
        if result_max_bytes <= 0:
            raise ValueError("limits.mcp_result_max_mb must be > 0")
        self.result_max_bytes = result_max_bytes  # limits.mcp_result_max_mb: one message from a server
        self.min_free_bytes = min_free_bytes  # store.min_free_mb: what a spooled answer leaves free
        self._servers: dict[str, dict[str, _Server]] = {}
        self._locks: dict[str, asyncio.Lock] = {}  # per workspace: one start, reload or stop at a time
        registry.explain_missing(self._explain_missing)

    # -- lifecycle ---------------------------------------------------------------------
    async def start_workspace(self, ws: str, servers: dict[str, MCPServerConfig], base_dir: Path) -> None:
        """Connect every enabled server of `ws` (after stopping what ran there before).

        Returns when each server is up or down (its first attempt over); a down
        server keeps being retried in the background. Never raises for one bad server."""
        async with self._changing(ws):
            await asyncio.gather(*map(self._stop_server, self._servers.pop(ws, {}).values()))
            await self._apply(ws, servers, Path(base_dir))

    async def update_workspace(self, ws: str, servers: dict[str, MCPServerConfig], base_dir: Path) -> list[str]:
        """Bring `ws` to `servers` (its reloaded `[mcp.*]`): a server whose config changed is
        restarted, one no longer configured is stopped (its tools unregistered), a new one is
        started; the others keep running untouched. Returns the names started or restarted."""
        async with self._changing(ws):
            return await self._apply(ws, servers, Path(base_dir))

    def _changing(self, ws: str) -> asyncio.Lock:  # one start, reload or stop of `ws` at a time
        return self._locks.setdefault(ws, asyncio.Lock())

    async def _apply(self, ws: str, servers: dict[str, MCPServerConfig], base_dir: Path) -> list[str]:
        table = self._servers.setdefault(ws, {})
        gone = [table.pop(name) for name, srv in list(table.items()) if servers.get(name) != srv.cfg
                or srv.base_dir != base_dir]
        await asyncio.gather(*map(self._stop_server, gone))
        started = [self._launch(ws, name, cfg, base_dir) for name, cfg in servers.items() if name not in table]
        table.update({srv.name: srv for srv in started})
        for srv, fut in [(srv, asyncio.ensure_future(srv.ready.wait())) for srv in started if srv.task]:
            try:
                await asyncio.wait_for(fut, srv.cfg.startup_timeout_s + 15)
            except asyncio.TimeoutError:
                srv.log.warning("MCP server %s: still not up after %.0f s", srv.name, srv.cfg.startup_timeout_s)
        if not table:
            self._servers.pop(ws, None)
        return [srv.name for srv in started]

    def _launch(self, ws: str, name: str, cfg: MCPServerConfig, base_dir: Path) -> _Server:
        """A server of `ws` with its task started (none when disabled or misconfigured)."""
        srv = _Server(ws=ws, name=name, cfg=cfg, base_dir=base_dir, log=logging.getLogger(f"datadesk.mcp.{name}"))
        if not cfg.enabled:
            srv.state = "disabled"
            srv.ready.set()
            return srv
        try:
            cfg.validate(name)
        except ValueError as exc:
            self._config_down(srv, str(exc))
            return srv
        srv.task = asyncio.create_task(self._runner(srv), name=f"mcp:{ws}:{name}")
        return srv

    async def stop_workspace(self, ws: str) -> None:
        async with self._changing(ws):
            await asyncio.gather(*map(self._stop_server, self._servers.pop(ws, {}).values()))

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
                # while it is not up, the tools it offered when last up answer an error naming it
                "unavailable_tools": [] if srv.state == "up" else list(srv.tools) or list(srv.known_tools),
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
                    srv.exit_code = None
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
                    if srv.exit_code is not None and "exited" not in reason:  # e.g. "Connection closed"
                        during = "" if srv.up_since is not None else " while starting"
                        reason = f"{_exited(srv.exit_code)}{during} ({reason})"
                    ended = time.monotonic()
                    if srv.stderr is not None:
                        await anyio.to_thread.run_sync(srv.stderr.join, 1.0)  # the last lines of a dying server
                        recent = [line for t, line in srv.stderr.tail if t >= ended - 3.0]
                        if recent:  # the tail of a dying server's stderr: usually the real reason
                            reason = f"{reason}; last stderr: {' | '.join(recent[-3:])[-600:]}"
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
                                                line_timeout_s=cfg.timeout_s, logger=srv.log,
                                                spool_dir=srv.base_dir / ".mcp-spool",
                                                min_free_bytes=self.min_free_bytes) as (read, write, t):
                    pipe.close_writer()
                    srv.transport = t
                    try:
                        await self._session(srv, _WatchedStream(read, lambda: closed(
                            t.close_reason or _exited(t.exit_code))), write)
                    finally:
                        srv.exit_code = t.exit_code
            finally:
                srv.transport = None
                pipe.close_writer()
        else:
            from mcp.client.streamable_http import streamable_http_client

            from datadesk.tools.mcp.http import bounded_http_client

            srv.stderr = None
            limit = self._limit(srv)  # over HTTP an answer is held in memory: at most HTTP_HELD_MAX_BYTES
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
            srv.known_tools = list(srv.tools)
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
            entry = QueryEntry(self.audit, ctx.user, ctx.workspace, ctx.thread.id, f"mcp:{srv.name}",
                               json.dumps({"tool": exposed, "arguments": args}, ensure_ascii=False))
            try:
                result = await self._call(srv, exposed, args, ctx)
            except BaseException as exc:
                entry.failed(exc)
                raise
            entry.done("error" if result.is_error else "ok", detail=exposed)
            return result

        return handler

    def _down_error(self, srv: _Server) -> ToolError:
        if srv.stopping:
            return ToolError(f"the MCP server {srv.name} has been stopped")
        if srv.state == "disabled":
            return ToolError(f"the MCP server {srv.name} is disabled in this workspace ([mcp.{srv.name}] "
                             "enabled = false); its tools are unavailable")
        reason = redact(srv.last_error or srv.conn_closed or "not connected", srv.secrets)
        if srv.state == "starting" and not srv.last_error and srv.restarts == 0:
            return ToolError(f"the MCP server {srv.name} is still starting; try again in a moment")
        retried = srv.task is not None and not srv.task.done()
        then = ("it is being restarted" if retried else
                f"it is not retried until [mcp.{srv.name}] in workspace.toml is fixed")
        return ToolError(f"the MCP server {srv.name} is down ({reason}); its tools are unavailable, {then}")

    def _explain_missing(self, name: str, ws: str | None) -> str | None:
        """Why `name` is no tool in `ws` when it names one of a server that is not up (one that
        failed to start never listed its tools): the server and its reason, not "unknown tool"."""
        best: _Server | None = None
        for srv in self._servers.get(ws or "", {}).values():
            prefix = exposed_tool_name(srv.name, "")
            if name.startswith(prefix) and (best is None or len(prefix) > len(exposed_tool_name(best.name, ""))):
                best = srv
        if best is None or best.state == "up":  # an up server without it: "unknown tool", with the list
            return None
        return str(self._down_error(best))

    def _limit(self, srv: _Server) -> int:
        """The largest answer `srv` may send: limits.mcp_result_max_mb (spooled to disk over stdio);
        over HTTP, where the SDK holds an answer in memory, at most HTTP_HELD_MAX_BYTES."""
        from datadesk.tools.mcp.http import HTTP_HELD_MAX_BYTES

        return self.result_max_bytes if srv.cfg.command is not None else min(self.result_max_bytes,
                                                                             HTTP_HELD_MAX_BYTES)

    async def _call(self, srv: _Server, exposed: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        from datadesk.tools.mcp.http import http_too_large_text
        from datadesk.tools.mcp.framing import LIMIT_SETTING, too_large_text

        info = srv.tools.get(exposed)
        if info is None:
            raise ToolError(f"the MCP server {srv.name} no longer offers this tool")
        session = srv.session
        if session is None or srv.state != "up":
            raise self._down_error(srv)
        timeout = srv.cfg.timeout_s
        late = (f"the MCP server {srv.name} did not answer within {timeout:g} s (timeout_s of [mcp.{srv.name}]); "
                "ask it for less or raise its timeout_s")
        spool_dir = SPOOL_DIR.set(ctx.thread.artifacts_dir)  # a large answer is spooled into the caller's thread
        try:
            with anyio.fail_after(timeout + 5):
                result = await session.call_tool(info.real, args, read_timeout_seconds=timeout)
        except TimeoutError:
            raise ToolError(late) from None
        except MCPError as exc:
            code = exc.code
            if LIMIT_SETTING in exc.message:  # the transport refused a result past limits.mcp_result_max_mb
                limit = self._limit(srv)
                size = too_large_text(limit) if limit == self.result_max_bytes else http_too_large_text(limit)
                raise ToolError(f"the MCP server {srv.name} answered with {size}; "
                                "ask it for less: filter, paginate or aggregate") from None
            if SPOOL_FAILED in exc.message:  # the disk had no room for it
                why = exc.message.split(SPOOL_FAILED, 1)[1].lstrip(": ")
                raise ToolError(f"the MCP server {srv.name} sent an answer too large to keep in memory that "
                                f"could not be saved to disk ({why}); ask it for less, or free space on the "
                                "disk") from None
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
        finally:
            SPOOL_DIR.reset(spool_dir)
        answer = self._claim(srv, result)
        if answer is None:
            return self.results.convert(srv.name, info, result, ctx)
        try:  # read from disk in a worker thread; a cancel waits for it, then the files go
            return await anyio.to_thread.run_sync(self.results.convert_spooled, srv.name, info, answer, ctx)
        except Exception as exc:
            answer.release()
            srv.log.warning("MCP server %s: reading a spooled answer failed: %s", srv.name, _describe(exc))
            raise ToolError(f"the answer of the MCP server {srv.name} ({answer.size:,} bytes, spooled to disk) "
                            f"could not be read: {_describe(exc)}") from None
        except BaseException:
            answer.release()
            raise

    @staticmethod
    def _claim(srv: _Server, result: Any) -> SpooledAnswer | None:
        """The spooled answer a substitute result stands for (None: an ordinary result)."""
        meta = getattr(result, "meta", None)
        token = meta.get(SPOOL_META) if isinstance(meta, dict) else None
        if not isinstance(token, str):
            return None
        transport = srv.transport
        answer = transport.claim(token) if transport is not None else None
        if answer is None:
            raise ToolError(f"the answer of the MCP server {srv.name} was spooled to disk but is gone "
                            "(the connection closed meanwhile); try again")
        return answer

def _exited(code: int | None) -> str:
    """Why a stdio connection ended on the server's side, with its exit status when it is known."""
    if code is None:
        return "the server process exited or closed its output"
    if code < 0:
        return f"the server process was killed by signal {-code}"
    return f"the server process exited with status {code}"


def _is_transport_failure(exc: BaseException) -> bool:
    try:
        import httpx2
    except ImportError:  # pragma: no cover
        return isinstance(exc, (ConnectionError, OSError))
    return isinstance(exc, (httpx2.TransportError, ConnectionError, OSError))
