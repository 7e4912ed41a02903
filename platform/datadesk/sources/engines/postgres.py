"""PostgreSQL through ADBC (`adbc-driver-postgresql`): libpq, results as Arrow over binary COPY.

The session is read-only by the server's own rules: it starts with
`default_transaction_read_only=on` and a `statement_timeout` (libpq `options`: the cap of a whole
statement, streaming included; the first rows are awaited for the source's `timeout_s` by the caller),
and every query runs in its own `BEGIN READ ONLY` transaction with `SET LOCAL statement_timeout`,
rolled back afterwards. Then `DISCARD ALL` resets the session before it goes back to the pool:
session settings, advisory locks held at session level, temp objects, prepared statements,
cursors and LISTENs of a query never reach the next one (a session whose reset fails is closed).
Stop and the client deadline cancel the statement with libpq's cancel request (`adbc_cancel`).
"""

from __future__ import annotations

from typing import Iterator
from urllib.parse import quote, urlencode, parse_qsl

import pyarrow as pa

from datadesk.sources.engines.adbc import CursorSession
from datadesk.sources.config import ParsedSource, resolve_env
from datadesk.sources.session import SourceDown

PG_TIMEOUT = "57014"  # query_canceled: statement_timeout or a cancel request
_CONNECT_TIMEOUT_S = 5


def connection_uri(src: ParsedSource, timeout_s: float) -> str:
    """The libpq URI with the password from the environment (never logged, never stored)."""
    cfg = src.config
    password = resolve_env(cfg.password, f"sources.{src.name}.password") if cfg.password else ""
    params = dict(parse_qsl(src.query))
    params.update({k: resolve_env(v, f"sources.{src.name}.options.{k}") for k, v in cfg.options.items()})
    session_opts = (f"-c default_transaction_read_only=on -c statement_timeout={int(timeout_s * 1000)} "
                    "-c idle_in_transaction_session_timeout=600000")
    if cfg.schemas:  # unqualified names resolve in the visible schemas only
        session_opts += " -c search_path=" + ",".join('"' + s.replace('"', '""').replace(" ", "\\ ") + '"'
                                                      for s in cfg.schemas)
    params["options"] = (params.get("options", "") + " " + session_opts).strip()
    params.setdefault("connect_timeout", str(_CONNECT_TIMEOUT_S))
    params.setdefault("application_name", "datadesk")
    auth = quote(src.user, safe="")
    if password:
        auth += ":" + quote(password, safe="")
    host = f"[{src.host}]" if ":" in src.host else src.host
    port = f":{src.port}" if src.port else ""
    return f"postgresql://{auth}@{host}{port}/{quote(src.database, safe='')}?{urlencode(params, quote_via=quote)}"


class PostgresSession(CursorSession):
    """One libpq connection; each `execute` is one READ ONLY transaction."""

    def __init__(self, src: ParsedSource, timeout_s: float) -> None:
        import adbc_driver_postgresql.dbapi as pg

        super().__init__()
        self._timeout_ms = int(timeout_s * 1000)
        try:
            self._con = pg.connect(connection_uri(src, timeout_s), autocommit=True)
        except pg.Error as exc:
            raise SourceDown(f"cannot connect to source {src.name!r} (postgresql at {src.host}:{src.port or 5432}): "
                             f"{clean_message(str(exc))}") from None

    def execute(self, sql: str, batch_size: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
        cur = self._con.cursor()
        self._running(cur)
        cur.execute("BEGIN READ ONLY")
        cur.execute(f"SET LOCAL statement_timeout = {self._timeout_ms}")
        cur.execute(sql)
        reader = cur.fetch_record_batch()
        types = [(f.metadata or {}).get(b"POSTGRESQL:type", str(f.type).encode()).decode() for f in reader.schema]
        return reader.schema, iter(reader), types

    def end(self) -> None:
        """Roll back, then reset the session (RESET ALL, pg_advisory_unlock_all, DISCARD TEMP, ...);
        settings given at connect (read-only default, timeouts, search_path) are what RESET restores."""
        cur = self._take_cursor()
        if cur is not None:
            cur.close()
        with self._con.cursor() as c:
            c.execute("ROLLBACK")
            c.execute("DISCARD ALL")


def clean_message(text: str) -> str:
    """A libpq/ADBC error without the driver's prefixes and the echoed query."""
    lines = [ln for ln in text.replace("\t", " ").splitlines() if ln.strip() and not ln.startswith("Query was:")]
    out = " ".join(lines)
    for prefix in ("IO: ", "INVALID_ARGUMENT: ", "INVALID_STATE: ", "NOT_FOUND: ", "CANCELLED: ", "UNKNOWN: "):
        out = out.removeprefix(prefix)
    for noise in ("[libpq] ", "Failed to connect: ", "Failed to prepare query: ", "Execution error [PGRES_FATAL_ERROR]: ",
                  "Failed to execute query: ", "could not begin COPY: "):
        out = out.replace(noise, "")
    out = out.replace("ERROR:  ", "").replace("FATAL:  ", "")
    return out.split(". SQLSTATE:")[0].strip()


def sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    if state:
        return str(state)
    text = str(exc)
    return text.rsplit("SQLSTATE: ", 1)[1][:5] if "SQLSTATE: " in text else None


def is_timeout(exc: BaseException) -> bool:
    """statement_timeout fired (mid-stream the error comes from the Arrow reader, without a SQLSTATE)."""
    return "canceling statement due to statement timeout" in str(exc)


def is_connection_error(exc: BaseException) -> bool:
    text = str(exc)
    state = sqlstate(exc) or ""
    return state.startswith("08") or state.startswith("57P") or any(
        s in text for s in ("server closed the connection", "terminating connection", "connection to server",
                            "no connection to the server", "could not receive data"))


def catalog_sql(schemas: list[str]) -> str:
    """Tables, views and their columns (types, comments) the session's role can read."""
    only = ""
    if schemas:
        only = " AND n.nspname IN (" + ", ".join("'" + s.replace("'", "''") + "'" for s in schemas) + ")"
    return f"""
SELECT n.nspname AS schema_name, c.relname AS table_name,
       CASE WHEN c.relkind IN ('v', 'm') THEN 'view' ELSE 'table' END AS kind,
       obj_description(c.oid, 'pg_class') AS table_comment, GREATEST(c.reltuples, -1)::bigint AS row_estimate,
       a.attname AS column_name, format_type(a.atttypid, a.atttypmod) AS column_type,
       col_description(c.oid, a.attnum) AS column_comment
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relkind IN ('r', 'v', 'm', 'p', 'f') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%'
  AND has_table_privilege(c.oid, 'SELECT'){only}
ORDER BY 1, 2, a.attnum"""
