"""The data panel's view of a workspace (`GET /api/workspace/catalog`): its warehouse tables and
views, its configured database sources and its MCP servers, each with its description
(`workspace.toml` and the database's own comments), columns and types, catalogue row estimates
(never a COUNT) and state; and a sample of a table's rows on demand
(`POST /api/workspace/catalog/sample`, run by `tools/sqlsample.py`).

Introspection reuses each source's `describe()` (the same catalogue `describe_source` and the
system message read; a database's is cached there for `catalog_ttl_s`), runs in worker threads
bounded by `DESCRIBE_TIMEOUT_S` per source, never on the event loop, and the whole view is kept
for `CACHE_TTL_S` seconds per workspace (made anew at once when the workspace's sources are
rebuilt from an edited `workspace.toml`). A source that is down, refused, misconfigured or slow
is listed with its reason (the reasons are the sources' own, secrets already masked there).

A sample is one `SELECT * FROM <table> LIMIT n` whose table name comes from the catalogue (the
request's name is only compared with it, never put into SQL), run like a `sql_query`: the
source's read-only check, a query slot of the caller (per-user and global limits), the source's
read-only session and one audit entry.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any

import msgspec

from datadesk.sources.errors import SQLError
from datadesk.sources.query import TableInfo
from datadesk.sources.registry import Source, SourceSet

CACHE_TTL_S = 30.0  # the panel's view of a workspace is reused this long
DESCRIBE_TIMEOUT_S = 10.0  # one source's introspection; a slower one is listed as "slow"
SAMPLE_ROWS = 20  # rows of a sample, at most
SQL_TOOL = "sql_query"  # who may not call it sees no database source in the panel
PANEL_THREAD = "data-panel"  # the audit entry's thread: a sample belongs to no thread


class CatalogRequestError(ValueError):
    """A sample request naming what is not in the catalogue (an HTTP 400 with this message)."""


def table_dict(t: TableInfo) -> dict[str, Any]:
    return msgspec.to_builtins(t)


class DataCatalog:
    """The panel's catalogue of each workspace, cached for `ttl_s` seconds (0: never)."""

    def __init__(self, ttl_s: float = CACHE_TTL_S, timeout_s: float = DESCRIBE_TIMEOUT_S) -> None:
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        # ws -> (when, the SourceSet it describes, entries): a set rebuilt from an edited workspace.toml
        # is another object, so its view is made anew
        self._cache: dict[str, tuple[float, SourceSet, list[dict[str, Any]]]] = {}

    def clear(self, ws: str | None = None) -> None:
        with self._lock:
            if ws is None:
                self._cache.clear()
            else:
                self._cache.pop(ws, None)

    async def sources(self, ws: str, sources: SourceSet) -> list[dict[str, Any]]:
        """Every source of `ws` (the warehouse first) with its tables, or why it has none."""
        with self._lock:
            hit = self._cache.get(ws)
            if hit is not None and hit[1] is sources and time.monotonic() - hit[0] < self.ttl_s:
                return hit[2]
        found = list(await asyncio.gather(*(self._one(src) for src in sources)))
        for name in sorted(sources.broken):
            found.append({"name": name, "kind": None, "dialect": None, "description": "",
                          "state": "misconfigured", "reason": sources.broken[name], "tables": []})
        with self._lock:
            self._cache[ws] = (time.monotonic(), sources, found)
        return found

    async def _one(self, src: Source) -> dict[str, Any]:
        tables: list[dict[str, Any]] = []
        try:
            described = await asyncio.wait_for(asyncio.to_thread(src.describe), self.timeout_s)
            tables = [table_dict(t) for t in described]
            reason = None
        except asyncio.TimeoutError:
            reason = f"its catalogue did not answer within {self.timeout_s:g} s"
        except SQLError as exc:
            reason = str(exc)
        st = src.status()
        state = st.get("state") or "unknown"
        if reason is not None:
            state = "slow" if reason.startswith("its catalogue did not") else (
                state if state in ("down", "refused") else "down")
        elif state == "unknown":
            state = "ok"  # its catalogue answered just now
        return {"name": src.name, "kind": src.kind, "dialect": src.dialect,
                "description": st.get("description") or src.description or "",
                "state": state, "reason": reason or (st.get("reason") if state != "ok" else None),
                "tables": tables}


def find_table(entry: dict[str, Any], table: str) -> dict[str, Any]:
    """The catalogue table `table` (name or schema.name) of one source entry, else a clear error."""
    want = table.strip().lower()
    for t in entry["tables"]:
        if want in (t["name"].lower(), f"{t['schema']}.{t['name']}".lower()):
            return t
    names = sorted(f"{t['schema']}.{t['name']}" if t["schema"] else t["name"] for t in entry["tables"])
    shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
    why = f" ({entry['state']}: {entry['reason']})" if entry.get("reason") else ""
    raise CatalogRequestError(f"there is no table {table!r} in source {entry['name']!r}"
                              + (f"; its tables: {shown}" if names else f"; it lists no tables{why}"))


def quote_ident(name: str, dialect: str | None) -> str:
    """`name` as a quoted identifier of `dialect` (the quote character doubled inside)."""
    q = "`" if dialect == "mysql" else '"'
    return q + name.replace(q, q + q) + q


def sample_sql(table: dict[str, Any], dialect: str | None, rows: int = SAMPLE_ROWS) -> str:
    """The sample statement for a catalogue `table` (its own names, quoted)."""
    name = quote_ident(table["name"], dialect)
    if table.get("schema"):
        name = f"{quote_ident(table['schema'], dialect)}.{name}"
    return f"SELECT * FROM {name} LIMIT {int(rows)}"


_CATALOGS: "weakref.WeakKeyDictionary[Any, DataCatalog]" = weakref.WeakKeyDictionary()


def catalog_for(owner: Any) -> DataCatalog:
    """The one DataCatalog of `owner` (the runtime's WorkspaceSources)."""
    with _CATALOGS_LOCK:
        found = _CATALOGS.get(owner)
        if found is None:
            found = _CATALOGS[owner] = DataCatalog()
        return found


_CATALOGS_LOCK = threading.Lock()


def permitted_mcp(servers: list[dict[str, Any]], permitted: set[str]) -> list[dict[str, Any]]:
    """The MCP servers a user sees: those offering a tool the user may call, or none yet (not
    up: shown with why); only those tools, and no config (the admin view has it, masked)."""
    out = []
    for srv in servers:
        tools = [t for t in srv.get("tools", []) if t in permitted]
        if srv.get("tools") and not tools:
            continue
        out.append({"name": srv["name"], "transport": srv.get("transport"), "state": srv.get("state"),
                    "reason": srv.get("last_error"), "tools": tools})
    return out
