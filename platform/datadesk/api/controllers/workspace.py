"""`GET /api/workspace` (admins): data sources, MCP servers with state and tools, skills, flags.
Secrets are masked: environment/header values never leave the server."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Controller, get, post
from litestar.exceptions import ClientException, PermissionDeniedException, ServiceUnavailableException
from litestar.params import FromQuery, JSONBody

from datadesk.api.guards.access import member_workspace
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.sources import datacatalog
from datadesk.sources.config import MASK, SourceConfig, masked_config
from datadesk.sources.errors import SQLError
from datadesk.store.admission import Busy
from datadesk.tools.sqlsample import sample


_KNOWN_KEYS = set(SourceConfig.__struct_fields__)


def shown_config(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """`masked_config`, stricter where a table is wrong (the admin sees why it is misconfigured, no
    secret): a key sources do not take is masked (a secret under a wrong name), and in the URL the
    user info after ':' up to its last '@' (a password holding '@')."""
    out = {k: (v if k in _KNOWN_KEYS else MASK) for k, v in masked_config(name, raw).items()}
    url = out.get("url")
    if isinstance(url, str):
        scheme, sep, rest = url.partition("://")
        auth, at, host = rest.rpartition("@")
        if sep and at and ":" in auth:
            rest = f"{auth.split(':', 1)[0]}:{MASK}@{host}"
        out["url"] = scheme + sep + rest
    return out


class SampleRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /api/workspace/catalog/sample`: a table of the catalogue ("" source: the warehouse)."""

    table: str
    source: str = ""


async def _panel_sources(user: Any, rt: Any, ws: str) -> list[dict[str, Any]]:
    """The catalogue entries this user may query: the warehouse and databases only with `sql_query`."""
    if datacatalog.SQL_TOOL not in {s.name for s in rt.policy.permitted_tools(user, ws)}:
        return []
    return await datacatalog.catalog_for(rt.sources).sources(ws, rt.sources.get(ws))


class WorkspaceController(Controller):
    path = "/api/workspace"

    @get("/")
    async def workspace(self, user: CurrentUser, rt: RuntimeDep,
                        workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        if not user.can("admin"):
            raise PermissionDeniedException("the workspace view is for admins")
        ws = member_workspace(user, workspace)
        cfg, sources = rt.workspaces.config(ws), rt.sources.get(ws)
        try:  # the warehouse is a source; it is shown apart with its catalogue and views
            tables = [msgspec.to_builtins(t) for t in await asyncio.to_thread(sources.warehouse.describe)]
            warehouse_error = None
        except SQLError as exc:
            tables, warehouse_error = [], str(exc)
        return {
            "workspace": ws,
            "name": cfg.name,
            "config_error": rt.workspaces.error(ws),  # an edit not applied: the last good config is in use
            "prompt": cfg.prompt,
            "data": {"warehouse": cfg.warehouse, "views": cfg.views, "tables": tables, "error": warehouse_error},
            # each source probed now: state ok/down/refused/misconfigured with the reason; secrets masked
            "sources": [{**st, "config": shown_config(st["name"], cfg.sources.get(st["name"], {}))}
                        for st in await asyncio.to_thread(sources.statuses, True)],
            "mcp": rt.mcp_status(ws),
            "disk": await asyncio.to_thread(rt.disk.status),  # free space against store.min_free_mb
            "skills": [{"name": s.name, "description": s.description} for s in rt.skills.skills(ws)],
            "flags": {"memory": cfg.memory, "memory_extraction": cfg.memory_extraction,
                      "auto_requery": rt.auto_requery(ws)},
            "disabled_tools": cfg.disabled_tools,
            "tool_permissions": cfg.tool_permissions,
            "tools": [{"name": s.name, "source": s.source, "read_only": s.read_only, "permission": s.permission}
                      for s in rt.tools.permitted(frozenset({"code_execution", "memory", "admin"}), ws)],
        }

    @get("/catalog")
    async def catalog(self, user: CurrentUser, rt: RuntimeDep,
                      workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        """The data panel (any member): sources with tables, columns, comments, estimates, state;
        MCP servers with the tools this user may call. Only what the user may query. `config_error`:
        why the edited workspace.toml is not applied (file, key, problem; the last good one is)."""
        ws = member_workspace(user, workspace)
        permitted = {s.name for s in rt.policy.permitted_tools(user, ws)}
        return {"workspace": ws, "name": rt.workspaces.config(ws).name, "config_error": rt.workspaces.error(ws),
                "sources": await _panel_sources(user, rt, ws),
                "mcp": datacatalog.permitted_mcp(rt.mcp_status(ws), permitted),
                "sample_rows": datacatalog.SAMPLE_ROWS}

    @post("/catalog/sample", status_code=200)
    async def catalog_sample(self, user: CurrentUser, rt: RuntimeDep, data: JSONBody[SampleRequest],
                             workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        """A few rows of one catalogue table, through the limits, checks and audit of `sql_query`."""
        ws = member_workspace(user, workspace)
        name = data.source or "warehouse"
        entry = next((e for e in await _panel_sources(user, rt, ws) if e["name"] == name), None)
        if entry is None:
            raise ClientException(f"there is no source {name!r} you may query in workspace {ws!r}")
        if not data.table.strip():
            raise ClientException("'table' must name a table of the source")
        try:
            table = datacatalog.find_table(entry, data.table)
        except datacatalog.CatalogRequestError as exc:
            raise ClientException(str(exc)) from None
        try:
            src = rt.sources.get(ws).get(data.source)
            return await sample(src, table, user.id, ws, rt.query_slots, rt.audit,
                                            rt.settings.offload.stream_timeout_s)
        except Busy as exc:
            raise ServiceUnavailableException(str(exc)) from None
        except SQLError as exc:
            raise ClientException(f"the sample of {table['name']!r} failed: {exc}") from None
