"""MCP server configuration: the `[mcp.<server>]` table, secrets and tool names.

`env` and `headers` values may be `${env:NAME}`: resolved from the app's environment at
connect time, never shown (`mask`, `masked_config`) and redacted from every log line
(`redact`). Exposed tool names follow OpenAI's `^[a-zA-Z0-9_-]{1,64}$`.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit

import msgspec

from datadesk.domain.redaction import redact  # the one rule for log lines and status pages

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


_SECRET_FLAG = re.compile(r"--?[\w.-]*(token|secret|passw|pwd|api[-_]?key|auth|credential)[\w.-]*", re.I)


def masked_config(cfg: MCPServerConfig) -> dict[str, Any]:
    """The config for a status page: never a secret value (env/header values masked)."""
    out: dict[str, Any] = msgspec.to_builtins(cfg)
    out["env"] = {k: mask(v) for k, v in cfg.env.items()}
    out["headers"] = {k: mask(v) for k, v in cfg.headers.items()}
    if cfg.command is not None:
        out["command"] = [mask(a) if i and _SECRET_FLAG.fullmatch(cfg.command[i - 1]) else redact(a)
                          for i, a in enumerate(cfg.command)]  # `--token <value>`: the value masked
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


def workspace_servers(path: Any, mcp: Mapping[str, Any]) -> dict[str, MCPServerConfig]:
    """The `[mcp.<server>]` tables of a workspace as MCPServerConfig, or WorkspaceConfigError
    naming the file and the key."""
    from datadesk.store.workspaces import WorkspaceConfigError

    servers = {}
    for name, raw in mcp.items():
        try:
            server = msgspec.convert(raw, MCPServerConfig)
            server.validate(name)
        except (msgspec.ValidationError, ValueError) as exc:
            raise WorkspaceConfigError(f"{path}: key 'mcp.{name}': {exc}") from None
        servers[name] = server
    return servers
