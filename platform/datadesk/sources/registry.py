"""The configured sources of one workspace (`SourceSet`) and one source (`Source`).

A `Source` checks a statement in its dialect, runs it on a pooled read-only session of the
caller and hands back a `SourceStream`; it describes its catalogue (cached) and reports its
state. A source that is misconfigured or down never stops the app: it is listed with the
reason, and only calls to it fail, with that reason.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from sqlglot import exp

from datadesk.sources import mysql, postgres
from datadesk.sources.catalog import CatalogCache, nearest_tables, tables_from_rows
from datadesk.sources.check import check_read, referenced_tables
from datadesk.sources.config import WAREHOUSE, ParsedSource, SourceConfigError, mask_text, parse_source
from datadesk.sources.privileges import SourceRefused, accepted_note, capabilities_of, refusal, session_rows
from datadesk.sources.session import Session, SessionPool, SourceDown, SourceStream
from datadesk.store.warehouse import QueryControl, SQLError, SQLRefused, SQLTimeout, TableInfo

_MISSING = re.compile(r"does not exist|doesn't exist|no such table|unknown table|not found", re.I)
log = logging.getLogger(__name__)
CATALOG_USER = "_catalog"  # the pool bucket of describe() and probes (never a real user id)


class Source:
    """One configured database: statement check, pooled read-only sessions, catalogue, state."""

    def __init__(self, parsed: ParsedSource, workspace_dir: Path, default_timeout_s: float,
                 stream_timeout_s: float = 600.0) -> None:
        """`timeout_s` (the source's, else `default_timeout_s`): until the first rows, as the
        warehouse's; the session's own statement timeout caps the whole statement, streaming
        included, at `stream_timeout_s` (offload.stream_timeout_s)."""
        self.parsed = parsed
        self.name, self.kind, self.dialect = parsed.name, parsed.kind, parsed.dialect
        self.description = parsed.config.description
        self.workspace_dir = Path(workspace_dir)
        self.timeout_s = parsed.config.timeout_s or default_timeout_s
        self.statement_cap_s = max(self.timeout_s, stream_timeout_s)
        cfg = parsed.config
        self.pool = SessionPool(self.name, self._open, cfg.max_connections, cfg.max_connections_per_user)
        self.catalog = CatalogCache(self._describe_now, cfg.catalog_ttl_s)
        self.last_error: str | None = None
        self.last_ok: float | None = None
        self.refused = False  # the login may write and the config does not accept it
        self.notes: list[str] = []

    # -- sessions ---------------------------------------------------------------------------
    def _open(self) -> Session:
        try:
            session = self._open_kind()
        except SourceConfigError as exc:
            self.last_error = str(exc)
            raise SQLError(f"source {self.name!r} is misconfigured: {exc}") from None
        except SourceDown as exc:
            self.last_error = mask_text(str(exc), self.parsed)
            raise SourceDown(self.last_error) from None
        if getattr(session, "read_only_session", True) is False:
            self.notes = ["the driver has no read-only session option: the statement check alone guards writes"]
        try:
            self._check_privileges(session)
        except BaseException:
            session.close()
            raise
        return session

    def _check_privileges(self, session: Session) -> None:
        """Ask the database what this login may do, on every new connection (grants change); a
        login that may write is refused unless `allow_write_privileges` accepts it."""
        try:
            found = capabilities_of(self.kind, session_rows(session))
        except Exception as exc:
            error = self.translate(exc, QueryControl())
            self.last_error = f"the login's privileges could not be read: {error}"
            raise SourceDown(f"source {self.name!r}: {self.last_error}") from None
        self.refused = bool(found) and not self.parsed.config.allow_write_privileges
        kept = [n for n in self.notes if not n.startswith("the login may write")]
        self.notes = kept + ([accepted_note(found)] if found and not self.refused else [])
        if self.refused:
            error = refusal(self.name, self.parsed.user, found or [])
            self.last_error = str(error)
            log.warning("%s", error)
            raise error

    def _open_kind(self) -> Session:
        if self.kind == "postgresql":
            return postgres.PostgresSession(self.parsed, self.statement_cap_s)
        if self.kind == "mysql":
            return mysql.MySQLSession(self.parsed, self.statement_cap_s)
        if self.kind == "sqlite":
            from datadesk.sources.sqlite import SQLiteSession

            return SQLiteSession(self.parsed, self.workspace_dir, self.timeout_s)
        from datadesk.sources.adbc import ADBCSession

        return ADBCSession(self.parsed)

    def _driver(self) -> Any:
        return {"postgresql": postgres, "mysql": mysql}.get(self.kind)

    # -- queries ----------------------------------------------------------------------------
    def check(self, sql: str) -> exp.Expression:
        """One read statement in this source's dialect, naming no schema outside `schemas`."""
        tree = check_read(sql, self.dialect, self.name, allow_functions=self.parsed.config.allow_functions)
        allowed = {s.lower() for s in self.parsed.config.schemas}
        if allowed:
            for schema, table in referenced_tables(tree):
                if schema and schema.lower() not in allowed:
                    raise SQLRefused(f"{schema}.{table}: schema {schema!r} is not visible on source {self.name!r} "
                                     f"(its schemas: {', '.join(sorted(allowed))})")
        return tree

    def record_batches(self, sql: str, user: str, control: QueryControl | None = None,
                       batch_size: int = 65_536) -> SourceStream:
        """Check `sql`, run it on `user`'s read-only session and stream its batches. Connection,
        refusal and engine errors raise here; `control` cancels it from another thread."""
        tree = self.check(sql)
        control = control or QueryControl()
        if control.timeout_s is None:
            control.timeout_s = self.timeout_s  # the SQL tool extends it once rows flow
        session = self.pool.acquire(user)
        released = False

        def release(s: Session) -> None:
            nonlocal released
            if not released:
                released = True
                self.pool.release(user, s)
        try:
            control.attach(session)
            schema, batches, types = session.execute(sql, batch_size)
            stream = SourceStream(session, schema, batches, types, control, self.translate, release)
        except BaseException as exc:
            control.finish()
            if not isinstance(exc, Exception):
                session.broken = True
                release(session)
                raise
            error = self.translate(exc, control)
            session.broken = session.broken or control.cancelled or isinstance(error, (SourceDown, SQLTimeout))
            release(session)
            raise self._with_hint(error, tree, user) from None
        self.last_ok, self.last_error = time.time(), None
        return stream

    def translate(self, exc: BaseException, control: QueryControl) -> SQLError:
        """What a driver error means for the model: cancelled, timed out, connection lost, or the
        database's own message (secrets masked, the source and dialect named)."""
        if isinstance(exc, SQLError):
            return exc
        if control.cancelled:
            return control.cancelled_error()
        driver = self._driver()
        if control.fired:
            return SQLTimeout(f"query exceeded {control.timeout_s or self.timeout_s:g} s on source {self.name!r}; "
                              "narrow it or add a LIMIT")
        if driver is not None and driver.is_timeout(exc):
            return SQLTimeout(f"query exceeded {self.statement_cap_s:g} s on source {self.name!r} (the statement "
                              "timeout of its session); narrow it or add a LIMIT")
        if driver is postgres:
            text = postgres.clean_message(str(exc))
        elif driver is mysql:
            text = mysql.clean_message(exc)
        else:
            text = str(exc).strip() or type(exc).__name__
        text = mask_text(text, self.parsed)[:600]
        lost = isinstance(exc, (ConnectionError, EOFError)) and driver is None
        if lost or (driver is not None and driver.is_connection_error(exc)):
            self.last_error = f"the connection was lost: {text}"
            return SourceDown(f"source {self.name!r}: the connection was lost ({text}); no data was kept")
        return SQLError(f"source {self.name!r} ({self.dialect or 'SQL'}): {text}")

    def _with_hint(self, error: SQLError, tree: exp.Expression, user: str) -> SQLError:
        """An unknown-table error with the nearest table names of the catalogue."""
        if type(error) is not SQLError or not _MISSING.search(str(error)):
            return error
        try:
            tables = self.catalog.cached() or self.catalog.get()
        except SQLError:
            return error
        known = {t.name.lower() for t in tables}
        hints = []
        for _schema, name in referenced_tables(tree):
            if name.lower() not in known:
                near = nearest_tables(name, tables)
                hints.append(f"no table {name!r}" + (f"; nearest: {', '.join(near)}" if near else ""))
        return SQLError(f"{error} ({'; '.join(hints)})") if hints else error

    # -- catalogue and state ----------------------------------------------------------------
    def describe(self) -> list[TableInfo]:
        """Tables and views with columns, types and comments (cached for catalog_ttl_s)."""
        return self.catalog.get()

    def _describe_now(self) -> list[TableInfo]:
        schemas = list(self.parsed.config.schemas)
        if self.kind in ("postgresql", "mysql"):
            sql = (postgres.catalog_sql(schemas) if self.kind == "postgresql"
                   else mysql.catalog_sql(self.parsed.database, schemas))
            return tables_from_rows(self._internal_rows(sql))
        session = self.pool.acquire(CATALOG_USER)
        try:
            rows = session.objects(schemas) if self.kind == "adbc" else _sqlite_catalog(session)  # type: ignore[attr-defined]
        except Exception as exc:
            session.broken = True
            raise self.translate(exc, QueryControl()) from None
        finally:
            self.pool.release(CATALOG_USER, session)
        return tables_from_rows(rows)

    def _internal_rows(self, sql: str) -> list[tuple]:
        """Rows of a catalogue query of ours (not checked: it is not the model's SQL)."""
        session = self.pool.acquire(CATALOG_USER)
        control = QueryControl(self.timeout_s)
        try:
            control.attach(session)
            _schema, batches, _types = session.execute(sql, 65_536)
            rows: list[tuple] = []
            for batch in batches:
                rows.extend(tuple(r.values()) for r in batch.to_pylist())
        except Exception as exc:
            session.broken = True
            raise self.translate(exc, control) from None
        finally:
            control.finish()
            self.pool.release(CATALOG_USER, session)
        self.last_ok, self.last_error = time.time(), None
        return rows

    def probe(self) -> None:
        """Open (or reuse) a session, ask again what its login may do and run a trivial query; the
        state records the outcome (a login that may write now is refused from here on)."""
        try:
            session = self.pool.acquire(CATALOG_USER)  # a new session is asked in _open
        except SQLError as exc:
            self.last_error = str(exc)
            if isinstance(exc, SourceRefused):
                self.pool.close_idle()  # sessions opened before the grants changed are not reused
            return
        try:
            self._check_privileges(session)
            session_rows(session)("SELECT 1")
            self.last_ok, self.last_error = time.time(), None
        except SourceRefused:
            session.broken = True
            self.pool.close_idle()  # sessions opened before the grants changed are not reused
        except SQLError as exc:
            session.broken = True
            self.last_error = str(exc)
        except Exception as exc:
            session.broken = True
            self.last_error = str(self.translate(exc, QueryControl()))
        finally:
            self.pool.release(CATALOG_USER, session)

    def status(self) -> dict[str, Any]:
        """What admins and the model are told: kind, dialect, description, state and reason."""
        state = "ok" if self.last_error is None and self.last_ok is not None else (
            "refused" if self.refused and self.last_error else "down" if self.last_error else "unknown")
        return {"name": self.name, "kind": self.kind, "dialect": self.dialect or "generic",
                "description": self.description, "url": self.parsed.display_url(),
                "schemas": list(self.parsed.config.schemas), "state": state, "reason": self.last_error,
                "notes": list(self.notes), "open_connections": self.pool.open_count}


def _sqlite_catalog(session: Any) -> list[tuple]:
    from datadesk.sources.sqlite import catalog_rows

    return catalog_rows(session)


class SourceSet:
    """The `[sources.*]` of one workspace: working sources and misconfigured ones with reasons."""

    def __init__(self, raw: dict[str, Any], workspace_dir: Path, default_timeout_s: float,
                 stream_timeout_s: float = 600.0) -> None:
        self.sources: dict[str, Source] = {}
        self.broken: dict[str, str] = {}
        for name, table in raw.items():
            try:
                self.sources[name] = Source(parse_source(name, table), workspace_dir, default_timeout_s,
                                            stream_timeout_s)
            except SourceConfigError as exc:
                self.broken[name] = str(exc)

    def __bool__(self) -> bool:
        return bool(self.sources or self.broken)

    def names(self) -> list[str]:
        return sorted([*self.sources, *self.broken])

    def get(self, name: str) -> Source:
        """The source `name`; SQLError naming the configured ones, or why it cannot be used."""
        if name in self.sources:
            return self.sources[name]
        if name in self.broken:
            raise SQLError(f"source {name!r} is misconfigured: {self.broken[name]}")
        known = ", ".join([WAREHOUSE, *sorted(self.sources)])
        raise SQLError(f"there is no source {name!r} in this workspace; sources: {known}")

    def statuses(self, probe: bool = False) -> list[dict[str, Any]]:
        out = []
        for name in self.names():
            if name in self.broken:
                out.append({"name": name, "state": "misconfigured", "reason": self.broken[name]})
            else:
                src = self.sources[name]
                if probe:
                    src.probe()
                out.append(src.status())
        return out

    def prompt_text(self) -> str:
        """The system message section listing each source (empty when none is configured)."""
        if not self:
            return ""
        lines = ["## Data sources",
                 "`sql_query` runs on the DuckDB warehouse unless you pass `source`; write each source's own "
                 "SQL dialect. `describe_source(source)` lists its tables and columns.",
                 f"- {WAREHOUSE} (duckdb): this workspace's warehouse (the default)"]
        for st in self.statuses():
            if st["state"] == "misconfigured":
                lines.append(f"- {st['name']}: MISCONFIGURED, cannot be queried ({st['reason']})")
                continue
            desc = f": {st['description']}" if st["description"] else ""
            down = (f" — DOWN at the last attempt: {st['reason']}" if st["state"] == "down" else
                    f" — REFUSED, cannot be queried: {st['reason']}" if st["state"] == "refused" else "")
            lines.append(f"- {st['name']} ({st['dialect']}){desc}{down}")
        return "\n".join(lines)

    def close(self) -> None:
        for src in self.sources.values():
            src.pool.close_all()


class WorkspaceSources:
    """The SourceSet of each workspace, built on first use from its `workspace.toml`."""

    def __init__(self, workspaces: Any, default_timeout_s: float, stream_timeout_s: float = 600.0) -> None:
        self.workspaces = workspaces  # store.workspaces.Workspaces: config(ws) and layout
        self.default_timeout_s = default_timeout_s
        self.stream_timeout_s = stream_timeout_s
        self._sets: dict[str, SourceSet] = {}
        self._lock = threading.Lock()

    def get(self, ws: str) -> SourceSet:
        with self._lock:
            found = self._sets.get(ws)
            if found is None:
                cfg = self.workspaces.config(ws)
                found = self._sets[ws] = SourceSet(dict(getattr(cfg, "sources", {}) or {}),
                                                   self.workspaces.layout.workspace_dir(ws), self.default_timeout_s,
                                                   self.stream_timeout_s)
            return found

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
            sets, self._sets = list(self._sets.values()), {}
        for s in sets:
            s.close()
