"""A configured database, `[sources.<name>]` of workspace.toml, as a `Source` (registry.py).

A `DatabaseSource` checks a statement in its dialect (check.py), runs it on a pooled read-only
session of the caller (session.py, a driver of engines/) and hands back a `SourceStream`; it
describes its catalogue (cached) and reports its state. A source that is down never stops the
app: it is listed with the reason, and only calls to it fail, with that reason.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from sqlglot import exp

from datadesk.sources.catalog import CatalogCache, nearest_tables, tables_from_rows
from datadesk.sources.check import check_read, referenced_tables
from datadesk.sources.config import ParsedSource, SourceConfigError, mask_text
from datadesk.sources.engines import mysql, postgres
from datadesk.sources.errors import SQLError, SQLRefused, SQLTimeout
from datadesk.sources.privileges import SourceRefused, accepted_note, capabilities_of, refusal, session_rows
from datadesk.sources.query import QueryControl, TableInfo
from datadesk.sources.session import Session, SessionPool, SourceDown, SourceStream

_MISSING = re.compile(r"does not exist|doesn't exist|no such table|unknown table|not found", re.I)
log = logging.getLogger(__name__)
CATALOG_USER = "_catalog"  # the pool bucket of describe() and probes (never a real user id)


class DatabaseSource:
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
            from datadesk.sources.engines.sqlite import SQLiteSession

            return SQLiteSession(self.parsed, self.workspace_dir, self.timeout_s)
        from datadesk.sources.engines.adbc import ADBCSession

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

    def close(self) -> None:
        """Close its sessions (those in use close when given back)."""
        self.pool.close_all()


def _sqlite_catalog(session: Any) -> list[tuple]:
    from datadesk.sources.engines.sqlite import catalog_rows

    return catalog_rows(session)
