"""The statement check of a source: one read statement that calls only allowed functions.

One of three layers: the login may only read (sources/privileges.py, checked at every new
connection), every query runs in a read-only transaction and the session is reset after it
(each driver), and this check runs before the query is sent. It is an allow-list, applied
after normalising the text the way the source's server reads it:

1. Lexical (sqllex.py): the text is split into code, strings and comments with the server's
   own rules and compared with sqlglot's tokens. Refused: MySQL/MariaDB executable comments
   (`/*! */`, `/*M! */`), optimizer hints (`/*+ */`), a `/*` inside a comment, a backslash
   that moves a string's end under some server setting, NUL characters, and any place where
   sqlglot would read the text differently from the server. PostgreSQL `U&"..."` names and
   `U&'...'` strings (with UESCAPE) are decoded into plain ones before parsing.
2. Statement: sqlglot parses the text in the source's dialect; what gets through is one
   SELECT (also WITH ... SELECT, set operations, VALUES, TABLE t) containing no write
   anywhere (a CTE with DELETE, SELECT ... INTO, FOR UPDATE/SHARE locks, SET, PRAGMA, NEXT VALUE FOR,
   optimizer hints, an operator from outside pg_catalog). Text sqlglot cannot parse
   is refused with its message and the dialect named: a statement the check does not
   understand is not run.
3. Functions: every call anywhere in the tree (select list, table functions in FROM,
   LATERAL, casts, ORDER BY, window specs, VALUES, subqueries, CTEs) is checked by the name
   as written in the SQL: lowercased (PostgreSQL keeps a quoted name's case), a qualified
   name by its last part, its qualifier deciding whether it is a built-in (the system
   schema, pg_catalog) or a user-defined function (any other schema). Built-ins must be on
   the dialect's list of read-only functions (sqlfunctions.py); a user-defined function must
   be named in the source's `allow_functions` ("fn" allows fn in any schema, "schema.fn"
   only that one); the deny list (locks, sleeps, other sessions, settings, sequences, files,
   other servers, SQL given as text) is refused whatever the configuration says.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from functools import lru_cache

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel, ParseError
from sqlglot.tokens import Token, TokenType

from datadesk.sources import sqlfunctions, sqllex
from datadesk.sources.errors import SQLError, SQLRefused

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its "falling back to Command" warnings are ours to report

_WRITES = (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Create, exp.Drop, exp.Alter, exp.Copy, exp.Command,
           exp.Set, exp.TruncateTable, exp.Grant, exp.Transaction, exp.Commit, exp.Rollback, exp.Pragma, exp.Use,
           exp.LoadData, exp.Attach, exp.Detach, exp.Into, exp.Lock)
_READ_ROOTS = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)
_QUOTES = {'"': '"', "`": "`", "[": "]"}
ALLOWED = "one SELECT (also WITH ... SELECT, UNION, VALUES) that reads; no writes, locks or SET"


def check_read(sql: object, dialect: str, source: str = "",
               allow_functions: Iterable[str] = ()) -> exp.Expression:
    """Parse `sql` as one read statement in `dialect`; return its tree or raise SQLError/SQLRefused.

    `source` names the source in messages; `allow_functions` are the user-defined functions
    ("fn" or "schema.fn") its configuration lets a query call."""
    shown = f"{dialect or 'generic SQL'} dialect" + (f", source {source!r}" if source else "")
    if not isinstance(sql, str) or not sql.strip():
        raise SQLError(f"empty SQL: send one read-only statement ({ALLOWED})")
    text, tokens = sqllex.tokenize(sql, dialect, shown)
    try:
        parser = Dialect.get_or_raise(dialect or None).parser(error_level=ErrorLevel.RAISE)
        statements = [s for s in parser.parse(tokens, text) if s is not None]
    except ParseError as exc:
        detail = "; ".join(f"{e.get('description')} at line {e.get('line')}, column {e.get('col')}"
                           for e in exc.errors[:2]) or str(exc).splitlines()[0]
        raise SQLError(f"syntax error ({shown}): {detail}") from None
    except Exception as exc:  # a sqlglot builder failing on odd arguments (IndexError, ...): still unreadable
        raise SQLError(f"syntax error ({shown}): the statement could not be parsed ({type(exc).__name__}: "
                       f"{exc})") from None
    if not statements:
        raise SQLError(f"empty SQL (only comments or semicolons): send one statement ({ALLOWED})")
    if len(statements) > 1:
        raise SQLRefused(f"one statement at a time: got {len(statements)}; send each as its own call")
    tree = statements[0]
    _check_statement(tree, tokens[0].text.upper(), dialect)
    _check_functions(tree, text, tokens, dialect, source, allow_functions)
    return tree


def _check_statement(tree: exp.Expression, first_word: str, dialect: str) -> None:
    """Refuse a root that is not a read, and any write, lock, hint or foreign operator inside it."""
    if not isinstance(tree, _READ_ROOTS):
        kind = str(tree.this).upper() if isinstance(tree, exp.Command) else first_word
        hint = " (read a table's columns with SELECT * FROM pragma_table_info('t'))" if kind == "PRAGMA" else ""
        raise SQLRefused(f"{kind} statements are not allowed: sources are read-only ({ALLOWED}){hint}")
    for node in tree.walk():
        if isinstance(node, _WRITES):
            if isinstance(node, exp.Lock):
                what = "FOR UPDATE / FOR SHARE locks are"
            elif isinstance(node, exp.Into):
                what = "SELECT ... INTO is"
            else:
                what = f"{node.key.upper()} inside a query is"
            raise SQLRefused(f"{what} not allowed: sources are read-only ({ALLOWED})")
        if isinstance(node, exp.NextValueFor):
            raise SQLRefused("NEXT VALUE FOR is not allowed: it moves a sequence, a write the rollback does not undo")
        if isinstance(node, exp.Hint):
            raise SQLRefused("optimizer hints (/*+ ... */) are not allowed: they can change settings for the statement")
        if isinstance(node, exp.Operator):
            schema = str(node.args.get("operator") or "").rpartition(".")[0]
            if schema and schema.lower() != "pg_catalog":
                raise SQLRefused(f"the operator OPERATOR({node.args.get('operator')}) is not allowed: an operator "
                                 "outside pg_catalog runs a user-defined function")
        if dialect == "duckdb" and isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            if node.this.quoted and any(c in node.this.name for c in "./\\:*?"):
                raise SQLRefused(f"the table {node.this.name!r} looks like a file path: reading files is not "
                                 "allowed on a source")


def _unquote(raw: str) -> tuple[str, bool]:
    """A name as written (`raw`) without its quotes, and whether it was quoted."""
    close = _QUOTES.get(raw[:1])
    if close and len(raw) >= 2 and raw.endswith(close):
        body = raw[1:-1]
        return (body if close == "]" else body.replace(close * 2, close)), True
    return raw, False


def _parts(node: exp.Expression) -> list[str]:
    if isinstance(node, exp.Dot):
        return _parts(node.this) + _parts(node.expression)
    if isinstance(node, exp.Column):
        return [p.name for p in node.parts]
    if isinstance(node, exp.Identifier):
        return [node.name]
    return [node.sql()]  # an expression before the dot (DuckDB's method syntax x.f())


def _qualifier(node: exp.Func) -> tuple[str, ...]:
    """The schema (or catalog.schema) written before a function's name, if any."""
    parent = node.parent
    if isinstance(parent, exp.Dot) and node.arg_key == "expression":
        return tuple(_parts(parent.this))
    if isinstance(parent, exp.Table) and node.arg_key == "this":  # FROM schema.fn(...)
        return tuple(p.name for p in (parent.args.get("catalog"), parent.args.get("db")) if p is not None and p.name)
    return ()


@lru_cache(maxsize=64)
def _keyword_forms(dialect: str) -> frozenset[str]:
    """Function names whose parsed node carries no name to check: the special forms sqlglot parses
    itself (CAST, EXTRACT, STRING_AGG, IF, ...: no position recorded) and the names it builds into
    an operator (MOD -> %, GLOB, LIKE, ISNULL, ...). Their calls are read from the tokens instead.
    Found once per dialect by parsing each known name (a few tenths of a second)."""
    d = Dialect.get_or_raise(dialect or None)
    forms = {*d.parser_class.FUNCTION_PARSERS, "IF"}
    for name in d.parser_class.FUNCTIONS:
        for args in ("a", "a, b", "a, b, c"):
            try:
                tree = d.parse(f"SELECT {name}({args})")[0]
            except Exception:  # wrong arity, or a name sqlglot cannot parse alone
                continue
            first = tree.expressions[0] if isinstance(tree, exp.Select) and tree.expressions else None
            if first is not None and not isinstance(first, exp.Func):
                forms.add(name)
    return frozenset(forms)


def _calls(tree: exp.Expression, text: str, tokens: list[Token],
           dialect: str) -> Iterator[tuple[tuple[str, ...], str, bool]]:
    """(qualifier, name as written, quoted) of every function call of the statement."""
    for node in tree.find_all(exp.Func):
        if "start" in node.meta and "end" in node.meta:  # the name token of a call
            name, quoted = _unquote(text[node.meta["start"]:node.meta["end"] + 1])
        elif isinstance(node, exp.Anonymous):
            this = node.this
            name, quoted = (this.name, this.quoted) if isinstance(this, exp.Identifier) else (str(this), False)
        else:
            continue  # syntax, not a written name: ::, ->>, ~, CASE, CURRENT_DATE, ARRAY[...]
        yield _qualifier(node), name, quoted
    forms = _keyword_forms(dialect)
    for i, tok in enumerate(tokens[:-1]):
        if (tokens[i + 1].token_type == TokenType.L_PAREN and tok.text.upper() in forms
                and (i == 0 or tokens[i - 1].token_type != TokenType.DOT)):
            yield (), tok.text, tok.token_type == TokenType.IDENTIFIER


def _allowed(qualifier: tuple[str, ...], name: str, quoted: bool, dialect: str, allow: set[str]) -> bool:
    low = name.lower()
    builtins = sqlfunctions.builtin_names(dialect)
    # PG: "LOWER" is not lower; no built-in has a non-ASCII name (and str.lower() folds some onto ASCII)
    builtin = name.isascii() and (name if quoted and dialect == "postgres" else low) in builtins
    if qualifier:
        schema = ".".join(qualifier).lower()
        if builtin and schema in sqlfunctions.SYSTEM_SCHEMAS.get(dialect, ()):
            return True
        return low in allow or f"{schema}.{low}" in allow
    return builtin or low in allow


def _check_functions(tree: exp.Expression, text: str, tokens: list[Token], dialect: str, source: str,
                     allow_functions: Iterable[str]) -> None:
    """Refuse a call of a denied function, or of one neither built-in nor in allow_functions."""
    allow = {a.lower() for a in allow_functions}
    on = f"source {source!r}" if source else "this source"
    for qualifier, name, quoted in _calls(tree, text, tokens, dialect):
        shown = ".".join((*qualifier, name))
        if reason := sqlfunctions.denied_reason(name, dialect):
            raise SQLRefused(f"the function {shown}() is not allowed on {on}: it {reason}, and allow_functions "
                             "cannot enable it")
        if not _allowed(qualifier, name, quoted, dialect, allow):
            where = f"[sources.{source}]" if source else "the source's configuration"
            raise SQLRefused(f"the function {shown}() is not allowed on {on}: only read-only built-in functions "
                             f"may be called (a user-defined one needs allow_functions in {where})")
    # a second net, independent of how sqlglot built the tree: no denied name directly before "("
    for tok, nxt in zip(tokens, tokens[1:]):
        if nxt.token_type == TokenType.L_PAREN and (reason := sqlfunctions.denied_reason(tok.text, dialect)):
            raise SQLRefused(f"the function {tok.text}() is not allowed on {on}: it {reason}, and "
                             "allow_functions cannot enable it")


def referenced_tables(tree: exp.Expression) -> list[tuple[str, str]]:
    """(schema, table) of every table the query names, CTE names excluded (for 'unknown table' hints)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    out = []
    for t in tree.find_all(exp.Table):
        if t.name and t.name.lower() not in ctes:
            out.append((t.db or "", t.name))
    return out
