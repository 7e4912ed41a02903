"""What a source's login may do, asked of the database itself (the first of three layers).

A denylist in front of a database cannot be complete, so the guarantee lives in the database:
the login should only be able to read. When a source opens a connection, DataDesk asks the
server what the login may do beyond reading:

- PostgreSQL: role attributes (SUPERUSER, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS),
  membership of the predefined roles that reach files, programs or other sessions, CREATE and
  TEMP on the database, CREATE on (or ownership of) every schema it can use, and INSERT,
  UPDATE, DELETE, TRUNCATE, TRIGGER on (or ownership of) every table, view and sequence there.
- MySQL / MariaDB: `SHOW GRANTS` of the login and of every role granted to it; any privilege
  but SELECT, SHOW VIEW, SHOW DATABASES and USAGE is one it should not have.

A login that may write is refused unless the source sets `allow_write_privileges = true`; the
queries of an accepted one still run in a read-only transaction (the second layer) after the
statement check (the third). Nothing here ever keeps or shows a grant line as written: MariaDB
prints the password hash in it.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from datadesk.sources.errors import SQLError

Rows = Callable[[str], list[tuple]]  # runs one internal query on an open session
_SHOWN = 8  # capabilities named in a message; the rest are counted

_PG_SYSTEM = ("n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%' "
              "AND n.nspname NOT LIKE 'pg_temp%'")
PG_SQL = f"""
SELECT 'role attribute ' || a FROM pg_roles r,
  LATERAL (VALUES ('SUPERUSER', r.rolsuper), ('CREATEROLE', r.rolcreaterole), ('CREATEDB', r.rolcreatedb),
                  ('REPLICATION', r.rolreplication), ('BYPASSRLS', r.rolbypassrls)) AS v(a, has)
  WHERE r.rolname = current_user AND v.has
UNION ALL
SELECT 'member of ' || p FROM unnest(ARRAY['pg_write_server_files', 'pg_execute_server_program',
  'pg_read_server_files', 'pg_signal_backend', 'pg_write_all_data']) AS p
  WHERE EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p) AND pg_has_role(current_user, p, 'USAGE')
UNION ALL
SELECT p || ' on database ' || current_database() FROM unnest(ARRAY['CREATE', 'TEMPORARY']) AS p
  WHERE has_database_privilege(current_database(), p)
UNION ALL
SELECT CASE WHEN pg_has_role(n.nspowner, 'USAGE') THEN 'owns schema ' ELSE 'CREATE on schema ' END
       || quote_ident(n.nspname)
  FROM pg_namespace n
  WHERE {_PG_SYSTEM} AND has_schema_privilege(n.oid, 'USAGE')
    AND (has_schema_privilege(n.oid, 'CREATE') OR pg_has_role(n.nspowner, 'USAGE'))
UNION ALL
SELECT CASE WHEN pg_has_role(c.relowner, 'USAGE') THEN 'owns ' ELSE 'writes to ' END
       || quote_ident(n.nspname) || '.' || quote_ident(c.relname)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE {_PG_SYSTEM} AND has_schema_privilege(n.oid, 'USAGE') AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
    AND (pg_has_role(c.relowner, 'USAGE')
    OR (c.relkind IN ('r', 'p', 'v', 'm', 'f')
        AND (has_table_privilege(c.oid, 'DELETE, TRUNCATE, TRIGGER')
             OR has_any_column_privilege(c.oid, 'INSERT, UPDATE')))
    OR (c.relkind = 'S' AND has_sequence_privilege(c.oid, 'UPDATE, USAGE')))
"""

# what a read-only MySQL/MariaDB login may hold; everything else lets it write or reach further
MYSQL_READ = {"SELECT", "SHOW VIEW", "SHOW DATABASES", "USAGE"}
_GRANT_ON = re.compile(r"^GRANT (?P<privs>.+?) ON (?P<what>(?:PROCEDURE |FUNCTION )?\S+) TO ", re.I | re.S)
_GRANT_ROLE = re.compile(r"^GRANT (?P<roles>.+?) TO ", re.I | re.S)
_WITH_GRANT = re.compile(r"\bWITH\b.*\bGRANT OPTION\b", re.I | re.S)


class SourceRefused(SQLError):
    """The source's login may write, and its config does not accept that (the message says what
    the login may do and the setting that accepts it)."""


def postgres_capabilities(rows: Rows) -> list[str]:
    """What the session's PostgreSQL role may do beyond reading (empty: a read-only login)."""
    return [str(r[0]) for r in rows(PG_SQL)]


def _split_privileges(text: str) -> list[str]:
    """`SELECT, INSERT (a, b), SHOW VIEW` -> ['SELECT', 'INSERT', 'SHOW VIEW'] (column lists dropped)."""
    out, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    return [re.sub(r"\(.*\)", "", p, flags=re.S).strip().upper() for p in out if p.strip()]


def _target(what: str) -> str:
    return what.replace("`", "")


def mysql_capabilities(rows: Rows) -> list[str]:
    """What the session's MySQL/MariaDB login (and every role granted to it) may do beyond reading."""
    out: list[str] = []
    seen_roles: set[str] = set()
    pending = ["SHOW GRANTS"]
    while pending:
        stmt = pending.pop(0)
        for (line, *_rest) in rows(stmt):
            line = str(line)
            granted = _GRANT_ON.match(line)
            if granted:
                privs = [p for p in _split_privileges(granted.group("privs")) if p not in MYSQL_READ]
                if _WITH_GRANT.search(line[granted.end():]):
                    privs.append("GRANT OPTION")
                if privs:
                    out.append(f"{', '.join(privs)} on {_target(granted.group('what'))}")
                continue
            role_grant = _GRANT_ROLE.match(line)
            if role_grant:  # GRANT `role` TO `user`: the role's own grants count too
                for role in role_grant.group("roles").split(","):
                    role = role.strip()
                    if role and role not in seen_roles and re.fullmatch(r"`[^`]+`(@`[^`]*`)?|\w+", role):
                        seen_roles.add(role)
                        pending.append(f"SHOW GRANTS FOR {role}")
    return out


def describe(capabilities: list[str]) -> str:
    """The first few capabilities, then how many more."""
    shown = "; ".join(capabilities[:_SHOWN])
    more = len(capabilities) - _SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def refusal(source: str, user: str, capabilities: list[str]) -> SourceRefused:
    """The error of a login that may write, naming what it may do and the setting that accepts it."""
    return SourceRefused(
        f"source {source!r} is refused: its login {user!r} may do more than read ({describe(capabilities)}). "
        f"Give the source a read-only login (docs/sources-and-mcp.md, 'A read-only login', shows the GRANT lines), or "
        f"set allow_write_privileges = true in [sources.{source}] to accept it (every query still runs "
        "read-only)")


def accepted_note(capabilities: list[str]) -> str:
    return (f"the login may write ({describe(capabilities)}); accepted by allow_write_privileges = true: "
            "every query still runs in a read-only transaction after the statement check")


def capabilities_of(kind: str, rows: Rows) -> list[str] | None:
    """The write capabilities of the login of a `kind` source; None when the kind cannot be asked
    (SQLite is opened read-only by the engine; a generic ADBC driver has no common question)."""
    if kind == "postgresql":
        return postgres_capabilities(rows)
    if kind == "mysql":
        return mysql_capabilities(rows)
    return None


def session_rows(session: Any) -> Rows:
    """A `Rows` over an open session: each query in its read-only transaction, ended after."""
    def rows(sql: str) -> list[tuple]:
        _schema, batches, _types = session.execute(sql, 65_536)
        try:
            return [tuple(r.values()) for batch in batches for r in batch.to_pylist()]
        finally:
            session.end()
    return rows
