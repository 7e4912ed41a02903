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
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.to_thread
import msgspec

from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec

log = logging.getLogger(__name__)

_TOOL_NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_SERVER_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_ENV_NAME_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_REF = re.compile(r"^\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}$")
_SECRET_KEY = re.compile(r"(?i)(token|secret|passw|pwd|key|auth|credential|cookie|session)")
_PASSED_ENV = ("PATH", "HOME", "LANG")
_BACKOFF_MAX_S = 60.0
_HEALTHY_S = 60.0  # a session up this long resets the backoff
_MAX_STDERR_LINE = 2000
_MAX_DESCRIPTION = 4000


# -- redaction -------------------------------------------------------------------
# The same patterns as datadesk.api.auth.redact (not imported: that module pulls in
# litestar and the runtime, which imports this one), plus common API-key shapes.
_SECRET_PATTERNS = [
    (re.compile(r"(?i)((?:code|token|access_token|refresh_token|api[_-]?key|key|secret|password|passwd|pwd)"
                r"[\"']?\s*[=:]\s*[\"']?)[^&\s\"',;]+"), r"\1[REDACTED]"),
    (re.compile(r"ddt_[A-Za-z0-9_-]+"), "ddt_[REDACTED]"),
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1[REDACTED]"),
    (re.compile(r"(?i)(basic\s+)[A-Za-z0-9+/=]{8,}"), r"\1[REDACTED]"),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}"), r"\1-[REDACTED]"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"), "gh_[REDACTED]"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{8,}"), "xox-[REDACTED]"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "AKIA[REDACTED]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"), "[REDACTED-JWT]"),
    (re.compile(r"(://[^/\s:@]+:)[^/\s@]+@"), r"\1***@"),
]


def redact(text: str, secrets: tuple[str, ...] | list[str] = ()) -> str:
    """Remove tokens and keys from a line meant for a log or a status page.

    `secrets`: known secret values (resolved env/header values) removed wherever they appear."""
    for value in secrets:
        if value and len(value) >= 4:
            text = text.replace(value, "[REDACTED]")
    for pattern, repl in _SECRET_PATTERNS:
        text = pattern.sub(repl, text)
    return text


# -- configuration -----------------------------------------------------------------
class MCPServerConfig(msgspec.Struct, forbid_unknown_fields=True):
    """One MCP server of a workspace (`[mcp.servers.<name>]`)."""

    command: list[str] | None = None  # stdio: argv
    url: str | None = None  # streamable HTTP endpoint
    env: dict[str, str] = {}
    headers: dict[str, str] = {}
    cwd: str | None = None  # relative to the workspace dir
    allow_tools: list[str] | None = None  # None: all tools
    read_only_tools: list[str] = []  # read-only even without the server's hint
    timeout_s: float = 60
    startup_timeout_s: float = 30
    enabled: bool = True

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def validate(self, name: str) -> None:
        """Raise ValueError naming the server and the offending key."""
        where = f"MCP server {name!r}"
        if not _SERVER_NAME_OK.match(name or ""):
            raise ValueError(f"{where}: the name must be 1-32 letters, digits, '_' or '-' "
                             "(starting with a letter or digit)")
        if (self.command is None) == (self.url is None):
            raise ValueError(f"{where}: set exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.command is not None:
            if not self.command or not all(isinstance(a, str) for a in self.command) or not self.command[0].strip():
                raise ValueError(f"{where}: `command` must be a non-empty list of strings (the argv)")
            if any("\x00" in a for a in self.command):
                raise ValueError(f"{where}: `command` must not contain NUL bytes")
            if self.headers:
                raise ValueError(f"{where}: `headers` only apply to a `url` server")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{where}: `url` must be an http:// or https:// URL")
            if self.cwd is not None:
                raise ValueError(f"{where}: `cwd` only applies to a `command` server")
        for key in self.env:
            if not _ENV_NAME_OK.match(key):
                raise ValueError(f"{where}: `env` key {key!r} is not a valid variable name")
        for key, value in self.headers.items():
            if not key or any(c in key for c in ":\r\n ") or "\n" in value or "\r" in value:
                raise ValueError(f"{where}: `headers` entry {key!r} is not a valid HTTP header")
        for section, values in (("env", self.env), ("headers", self.headers)):
            for key, value in values.items():
                if "${" in value and not _ENV_REF.match(value):
                    raise ValueError(f"{where}: `{section}.{key}` must be a plain value or exactly "
                                     "'${env:NAME}'")
        if self.cwd is not None and ("\x00" in self.cwd or not self.cwd.strip()):
            raise ValueError(f"{where}: `cwd` must be a directory path")
        if not (self.timeout_s > 0):
            raise ValueError(f"{where}: `timeout_s` must be > 0")
        if not (self.startup_timeout_s > 0):
            raise ValueError(f"{where}: `startup_timeout_s` must be > 0")
        if self.allow_tools is not None and not all(isinstance(t, str) and t for t in self.allow_tools):
            raise ValueError(f"{where}: `allow_tools` must be a list of tool names")
        if not all(isinstance(t, str) and t for t in self.read_only_tools):
            raise ValueError(f"{where}: `read_only_tools` must be a list of tool names")


class MCPConfigError(ValueError):
    """A server's configuration cannot be used (e.g. a missing secret): not retried."""


def mask(value: str) -> str:
    """A config value as shown to people: `${env:NAME}` references as they are, anything else `***`."""
    return value if _ENV_REF.match(value or "") else "***"


def _mask_url(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return redact(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)))


def masked_config(cfg: MCPServerConfig) -> dict[str, Any]:
    """The config for a status page: never a secret value (env/header values masked)."""
    out: dict[str, Any] = msgspec.to_builtins(cfg)
    out["env"] = {k: mask(v) for k, v in cfg.env.items()}
    out["headers"] = {k: mask(v) for k, v in cfg.headers.items()}
    if cfg.command is not None:
        out["command"] = [redact(a) for a in cfg.command]
    if cfg.url is not None:
        out["url"] = _mask_url(cfg.url)
    return out


def resolve_values(server: str, section: str, values: Mapping[str, str],
                   environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Resolve `${env:NAME}` references from the app's environment (MCPConfigError when unset)."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for key, value in values.items():
        m = _ENV_REF.match(value)
        if m is None:
            out[key] = value
            continue
        ref = m.group(1)
        resolved = environ.get(ref)
        if resolved is None or resolved == "":
            raise MCPConfigError(f"MCP server {server!r}: `{section}.{key}` refers to the environment "
                                 f"variable {ref}, which is not set in the app's environment")
        out[key] = resolved
    return out


def exposed_tool_name(server: str, tool: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """`<server>__<tool>` fitted to `^[a-zA-Z0-9_-]{1,64}$`, not in `taken`.

    Characters outside the set become `_`; a name too long (or taken) is cut and given a
    short hash of the real tool name, so distinct tools keep distinct names."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")
    if len(name) <= 64 and name not in taken:
        return name
    digest = hashlib.sha1(tool.encode("utf-8", "surrogatepass")).hexdigest()
    for n in range(8, 41, 4):
        cand = f"{name[:64 - n - 1]}_{digest[:n]}"
        if cand not in taken:
            return cand
    raise ValueError(f"cannot name tool {tool!r} of MCP server {server!r}")


def _describe(exc: BaseException) -> str:
    """A one-line reason for an exception (unwrapping task-group exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"command not found: {exc.filename}"
    if isinstance(exc, TimeoutError):
        return text or "timed out"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- stderr → log --------------------------------------------------------------------
class _StderrPipe:
    """An OS pipe for a server's stderr; a thread logs it line by line, redacted."""

    def __init__(self, logger: logging.Logger, secrets: list[str]) -> None:
        self.logger = logger
        self.secrets = secrets
        self.tail: deque[tuple[float, str]] = deque(maxlen=5)  # (monotonic time, line)
        r, w = os.pipe()
        self._reader = os.fdopen(r, "rb", buffering=0)
        self.writer = os.fdopen(w, "w")
        self._thread = threading.Thread(target=self._pump, name=f"{logger.name}-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self._reader.read(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._emit(line)
                if len(buf) > _MAX_STDERR_LINE * 4:
                    self._emit(buf)
                    buf = b""
            if buf:
                self._emit(buf)
        except (OSError, ValueError):
            pass
        finally:
            try:
                self._reader.close()
            except OSError:
                pass

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if not line.strip():
            return
        if len(line) > _MAX_STDERR_LINE:
            line = line[:_MAX_STDERR_LINE] + " …"
        line = redact(line, self.secrets)
        self.tail.append((time.monotonic(), line.strip()))
        self.logger.info("%s", line)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def close_writer(self) -> None:
        """Close our copy of the write end (the child keeps its own): EOF comes when it exits."""
        try:
            self.writer.close()
        except OSError:
            pass


class _WatchedStream:
    """Wraps the transport's read stream (the SDK's ReadStream protocol): notes when it ends."""

    def __init__(self, inner: Any, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close = on_close

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_close()
            raise

    async def aclose(self) -> None:
        self._on_close()
        await self._inner.aclose()

    def __aiter__(self) -> "_WatchedStream":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> "_WatchedStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


# -- the manager ------------------------------------------------------------------------
@dataclass
class _ToolInfo:
    real: str
    spec: ToolSpec


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
                 save_image: Callable[[ToolContext, bytes, str], str] | None = None) -> None:
        self.registry = registry
        self.save_image = save_image
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

        if cfg.command is not None:
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

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
                async with stdio_client(params, errlog=pipe.writer) as (read, write):
                    pipe.close_writer()
                    await self._session(
                        srv, _WatchedStream(read, lambda: closed("the server process exited or closed its output")),
                        write)
            finally:
                pipe.close_writer()
        else:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            srv.stderr = None
            async with create_mcp_http_client(headers=headers or None) as client:
                async with streamable_http_client(cfg.url, http_client=client) as (read, write):
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
            wanted[exposed] = _ToolInfo(real=tool.name, spec=self._spec(srv, exposed, tool))
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

        info = srv.tools.get(exposed)
        if info is None:
            raise ToolError(f"the MCP server {srv.name} no longer offers this tool")
        session = srv.session
        if session is None or srv.state != "up":
            raise self._down_error(srv)
        timeout = srv.cfg.timeout_s
        try:
            with anyio.fail_after(timeout + 5):
                result = await session.call_tool(info.real, args, read_timeout_seconds=timeout)
        except TimeoutError:
            raise ToolError(f"the MCP server {srv.name} did not answer within {timeout:g} s") from None
        except MCPError as exc:
            code = exc.code
            if code == REQUEST_TIMEOUT:
                raise ToolError(f"the MCP server {srv.name} did not answer within {timeout:g} s") from None
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
        meta: dict[str, Any] = {"mcp_server": srv.name, "mcp_tool": info.real}
        if images:
            meta["images"] = images
        data = None
        if structured is not None:
            try:
                if len(json.dumps(structured, default=str)) <= 65536:
                    data = structured
            except (TypeError, ValueError):
                data = None
        return ToolResult(content=content, is_error=is_error, data=data, meta=meta)

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
