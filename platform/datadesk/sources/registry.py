"""The sources of one workspace (`SourceSet`): its DuckDB warehouse and its configured databases,
each behind one interface (`Source`), so the SQL tool, `describe_source` and re-query take the
same path whichever source a call names.

A source that is misconfigured or down never stops the app: it is listed with the reason, and
only calls to it fail, with that reason.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Iterator, Protocol

from datadesk.sources.config import WAREHOUSE, SourceConfigError, parse_source
from datadesk.sources.database import DatabaseSource
from datadesk.sources.errors import SQLError
from datadesk.sources.query import QueryControl, ResultStream, TableInfo
from datadesk.sources.sqllimits import SQLLimits
from datadesk.sources.warehouse import Warehouse

log = logging.getLogger(__name__)


class Source(Protocol):
    """A database the model queries: the warehouse (`warehouse.Warehouse`) or a configured one
    (`database.DatabaseSource`).

    `check` refuses, before any connection, what is not one read statement in its dialect;
    `record_batches` runs it read-only for `user` (errors of connection, refusal and engine
    raise here, as `errors.SQLError`) and hands back the stream; `control` lets another thread
    cancel it and carries the deadline (the source's `timeout_s` when it has none).
    """

    name: str
    kind: str  # "duckdb", "postgresql", "mysql", "sqlite", "adbc"
    dialect: str | None  # its SQL dialect (None: generic)
    description: str
    timeout_s: float  # until the first rows

    def check(self, sql: str) -> object: ...

    def record_batches(self, sql: str, user: str, control: QueryControl | None = None,
                       batch_size: int = 65_536) -> ResultStream: ...

    def describe(self) -> list[TableInfo]:
        """Tables and views with their columns, types and comments."""

    def probe(self) -> None:
        """Try the source once; `status()` then says how it went. Never raises."""

    def status(self) -> dict[str, Any]:
        """name, kind, dialect, description, url, schemas, state (ok | down | refused | unknown),
        reason, notes, open_connections."""

    def close(self) -> None: ...


class SourceSet:
    """The sources of one workspace: the warehouse (always there, under the reserved name
    `warehouse`, the default) and the `[sources.*]` tables, working or misconfigured with reasons."""

    def __init__(self, raw: dict[str, Any], workspace_dir: Path, default_timeout_s: float,
                 stream_timeout_s: float = 600.0, warehouse: Warehouse | None = None,
                 previous: "SourceSet | None" = None) -> None:
        """`warehouse`: the workspace's (as `workspace.toml` names it); None: `data/warehouse.duckdb`.
        `previous`: the set this one replaces; a source whose table is unchanged is taken over
        from it (its pool, state and catalogue), not reopened."""
        data = Path(workspace_dir) / "data"
        self.warehouse = warehouse or Warehouse(data / "warehouse.duckdb", data, timeout_s=default_timeout_s)
        self.raw = dict(raw)  # the `[sources.*]` tables it was built from
        self.databases: dict[str, DatabaseSource] = {}
        self.broken: dict[str, str] = {}
        for name, table in raw.items():
            if previous is not None and name in previous.databases and previous.raw.get(name) == table:
                self.databases[name] = previous.databases[name]
                continue
            try:
                self.databases[name] = DatabaseSource(parse_source(name, table), workspace_dir, default_timeout_s,
                                                      stream_timeout_s)
            except SourceConfigError as exc:
                self.broken[name] = str(exc)

    @classmethod
    def of(cls, warehouse: Warehouse) -> "SourceSet":
        """The warehouse alone (no `[sources.*]`), e.g. for a tool registry of its own."""
        return cls({}, warehouse.data_dir.parent, warehouse.timeout_s, warehouse=warehouse)

    def __iter__(self) -> Iterator[Source]:
        """Every usable source, the warehouse first."""
        yield self.warehouse
        yield from self.databases.values()

    def names(self) -> list[str]:
        """The warehouse, then each configured source (misconfigured ones too), by name."""
        return [WAREHOUSE, *sorted([*self.databases, *self.broken])]

    def get(self, name: str) -> Source:
        """The source `name` (empty: the warehouse); SQLError naming the usable ones, or why
        `name` cannot be used."""
        if not name or name == WAREHOUSE:
            return self.warehouse
        if name in self.databases:
            return self.databases[name]
        if name in self.broken:
            raise SQLError(f"source {name!r} is misconfigured: {self.broken[name]}")
        known = ", ".join([WAREHOUSE, *sorted(self.databases)])
        raise SQLError(f"there is no source {name!r} in this workspace; sources: {known}")

    def statuses(self, probe: bool = False) -> list[dict[str, Any]]:
        """The state of each configured `[sources.*]` (probed first when `probe`). The warehouse's
        is `warehouse.status()`: the workspace view shows it with its catalogue, apart."""
        out = []
        for name in sorted([*self.databases, *self.broken]):
            if name in self.broken:
                out.append({"name": name, "state": "misconfigured", "reason": self.broken[name]})
            else:
                src = self.databases[name]
                if probe:
                    src.probe()
                out.append(src.status())
        return out

    def prompt_text(self) -> str:
        """The system message section listing each source (empty when only the warehouse is there:
        the base rules and the SQL tool already speak of it)."""
        if not (self.databases or self.broken):
            return ""
        lines = ["## Data sources",
                 "`sql_query` runs on the DuckDB warehouse unless you pass `source`; write each source's own "
                 "SQL dialect. `describe_source(source)` lists its tables and columns."]
        for st in [self.warehouse.status(), *self.statuses()]:
            if st["state"] == "misconfigured":
                lines.append(f"- {st['name']}: MISCONFIGURED, cannot be queried ({st['reason']})")
                continue
            desc = f": {st['description']}" if st["description"] else ""
            down = (f" — DOWN at the last attempt: {st['reason']}" if st["state"] == "down" else
                    f" — REFUSED, cannot be queried: {st['reason']}" if st["state"] == "refused" else "")
            lines.append(f"- {st['name']} ({st['dialect']}){desc}{down}")
        return "\n".join(lines)

    def close(self) -> None:
        for src in self:
            src.close()


class WorkspaceSources:
    """The SourceSet of each workspace, built on first use from its `workspace.toml`: the
    warehouse it names (with its `[views]`) and its `[sources.*]`.

    Rebuilt when the config changed (`Workspaces.config` re-reads an edited file): a source whose
    settings are unchanged is kept as it is; one removed or changed is closed (its idle
    connections now; those of a query still running when the query gives them back), so a
    running query is never broken. A caller that holds the old set keeps a working one."""

    def __init__(self, workspaces: Any, default_timeout_s: float, stream_timeout_s: float = 600.0,
                 limits: SQLLimits | None = None) -> None:
        self.workspaces = workspaces  # store.workspaces.Workspaces: config(ws) and layout
        self.default_timeout_s = default_timeout_s
        self.stream_timeout_s = stream_timeout_s
        self.limits = limits or SQLLimits(tmp_root=workspaces.layout.home / "tmp" / "sql")
        self._sets: dict[str, tuple[Any, SourceSet]] = {}  # ws -> (the config it was built from, set)
        self._lock = threading.Lock()

    def _warehouse(self, ws: str, cfg: Any, previous: SourceSet | None) -> Warehouse:
        layout = self.workspaces.layout
        wdir = layout.workspace_dir(ws)
        views = {k: str(wdir / v) for k, v in cfg.views.items()}
        old = previous.warehouse if previous is not None else None
        if old is not None and old.db_path == (wdir / cfg.warehouse).absolute() and old.views == views:
            return old
        return Warehouse(wdir / cfg.warehouse, layout.workspace_data_dir(ws), views=views,
                         timeout_s=self.default_timeout_s, limits=self.limits)

    def get(self, ws: str) -> SourceSet:
        """The sources of `ws` as its config is now."""
        cfg = self.workspaces.config(ws)  # outside the lock: it may read the file
        with self._lock:
            held = self._sets.get(ws)
            if held is not None and held[0] is cfg:
                return held[1]
            old = held[1] if held is not None else None
            raw = dict(getattr(cfg, "sources", {}) or {})
            warehouse = self._warehouse(ws, cfg, old)
            if old is not None and old.raw == raw and old.warehouse is warehouse:
                self._sets[ws] = (cfg, old)  # the config changed elsewhere (prompt, flags, MCP)
                return old
            found = SourceSet(raw, self.workspaces.layout.workspace_dir(ws), self.default_timeout_s,
                              self.stream_timeout_s, warehouse=warehouse, previous=old)
            self._sets[ws] = (cfg, found)
        if old is not None:
            self._retire(ws, old, found)
        return found

    @staticmethod
    def _retire(ws: str, old: SourceSet, new: SourceSet) -> None:
        """Close what `old` had and `new` does not (idle connections now, busy ones when freed)."""
        kept = {id(src) for src in new}
        gone = [src for src in old if id(src) not in kept]
        for src in gone:
            src.close()
        log.info("workspace %s: sources reloaded (%s); closed: %s", ws, ", ".join(new.names()),
                 ", ".join(src.name for src in gone) or "none")

    def probe(self, workspaces: list[str]) -> None:
        """Try each source of `workspaces` once (at start), so the model and admins see a source
        that is down with its reason before anyone queries it. Never raises."""
        for ws in workspaces:
            try:
                self.get(ws).statuses(probe=True)
            except Exception as exc:  # a workspace that cannot be read is reported elsewhere
                log.info("probing the sources of %s failed: %s", ws, exc)

    def close(self) -> None:
        with self._lock:
            sets, self._sets = [s for _, s in self._sets.values()], {}
        for s in sets:
            s.close()
