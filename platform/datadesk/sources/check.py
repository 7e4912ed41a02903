"""The statement check of a source: exactly one read statement, parsed in the source's dialect.

The first of two layers (the database session is read-only too, see each driver). sqlglot
parses the text in the source's dialect; what gets through is one SELECT (also WITH ...
SELECT, set operations, VALUES, TABLE t) containing no write anywhere (a CTE with DELETE,
SELECT ... INTO, FOR UPDATE/SHARE locks) and no call of a function with side effects
outside the transaction (set_config, advisory locks, large objects, server files, sequences,
backends). Text sqlglot cannot parse is refused with its message and the dialect named:
a statement the check does not understand is not run.
"""

from __future__ import annotations

import logging
import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError

from datadesk.store.warehouse import SQLError, SQLRefused

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its "falling back to Command" warnings are ours to report

_WRITES = (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Create, exp.Drop, exp.Alter, exp.Copy, exp.Command,
           exp.Set, exp.TruncateTable, exp.Grant, exp.Transaction, exp.Commit, exp.Rollback, exp.Pragma, exp.Use,
           exp.LoadData, exp.Attach, exp.Detach, exp.Into, exp.Lock)
_READ_ROOTS = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)
# functions whose effect outlives the read-only transaction, or that reach outside the database
_DENIED = re.compile(
    r"(set_config|pg_advisory\w*|pg_try_advisory\w*|lo_\w+|pg_read_\w+|pg_ls_\w+|pg_stat_file|pg_file_\w+"
    r"|pg_terminate_backend|pg_cancel_backend|pg_reload_conf|pg_rotate_logfile|pg_switch_wal|pg_notify"
    r"|pg_create_\w+|pg_drop_\w+|pg_logical_\w+|pg_replication_\w+|pg_promote|pg_import_system_collations"
    r"|dblink\w*|nextval|setval|txid_current|pg_current_xact_id|get_lock|release_lock|release_all_locks"
    r"|is_used_lock|load_file|sys_exec|sys_eval|load_extension|readfile|writefile|edit|fts3_tokenizer"
    r"|query_to_xml\w*|table_to_xml\w*|database_to_xml\w*|cursor_to_xml\w*|schema_to_xml\w*)", re.I)
ALLOWED = "one SELECT (also WITH ... SELECT, UNION, VALUES) that reads; no writes, locks or SET"


def _function_names(tree: exp.Expression) -> list[str]:
    names = []
    for node in tree.find_all(exp.Func):
        names.append(node.name if isinstance(node, exp.Anonymous) else node.sql_name())
    return [n.lower() for n in names if n]


def check_read(sql: object, dialect: str, source: str = "") -> exp.Expression:
    """Parse `sql` as one read statement in `dialect`; return its tree or raise SQLError/SQLRefused."""
    shown = f"{dialect or 'generic SQL'} dialect" + (f", source {source!r}" if source else "")
    if not isinstance(sql, str) or not sql.strip():
        raise SQLError(f"empty SQL: send one read-only statement ({ALLOWED})")
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect or None, error_level=ErrorLevel.RAISE)
                      if s is not None]
    except ParseError as exc:
        detail = "; ".join(f"{e.get('description')} at line {e.get('line')}, column {e.get('col')}"
                           for e in exc.errors[:2]) or str(exc).splitlines()[0]
        raise SQLError(f"syntax error ({shown}): {detail}") from None
    if not statements:
        raise SQLError(f"empty SQL (only comments or semicolons): send one statement ({ALLOWED})")
    if len(statements) > 1:
        raise SQLRefused(f"one statement at a time: got {len(statements)}; send each as its own call")
    tree = statements[0]
    if not isinstance(tree, _READ_ROOTS):
        kind = tree.key.upper() if not isinstance(tree, exp.Command) else str(tree.this).upper()
        raise SQLRefused(f"{kind} statements are not allowed: sources are read-only ({ALLOWED})")
    for node in tree.walk():
        if isinstance(node, _WRITES):
            if isinstance(node, exp.Lock):
                what = "FOR UPDATE / FOR SHARE locks are"
            elif isinstance(node, exp.Into):
                what = "SELECT ... INTO is"
            else:
                what = f"{node.key.upper()} inside a query is"
            raise SQLRefused(f"{what} not allowed: sources are read-only ({ALLOWED})")
    for name in _function_names(tree):
        if _DENIED.fullmatch(name):
            raise SQLRefused(f"the function {name}() is not allowed on a source: it has effects outside a "
                             "read-only query")
    return tree


def referenced_tables(tree: exp.Expression) -> list[tuple[str, str]]:
    """(schema, table) of every table the query names, CTE names excluded (for 'unknown table' hints)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    out = []
    for t in tree.find_all(exp.Table):
        if t.name and t.name.lower() not in ctes:
            out.append((t.db or "", t.name))
    return out
