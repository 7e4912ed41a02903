"""The statement check of a source is an allow-list after normalisation (issue 24, part 3).

An attack corpus per dialect (comment tricks, escapes, quoted and qualified names, table
functions, calls hidden in ORDER BY, casts, windows, VALUES, subqueries, CTEs) must be
refused with the function or form named in the message; a corpus of typical analyst SQL
must pass: a legitimate query refused is as much a bug as an attack let through.

The corpora live in tests/unit/sql_corpus.py (and are re-exported here) so a test against
real servers can run them too: ATTACKS_<DIALECT> are (sql, name the message must contain),
LEGIT_<DIALECT> plain SQL. No database is started here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from datadesk.sources import sqlfunctions
from datadesk.sources.check import check_read
from datadesk.sources.config import parse_source
from datadesk.sources.database import DatabaseSource
from datadesk.sources.errors import SQLError, SQLRefused
from tests.unit.sql_corpus import (ATTACKS_DUCKDB, ATTACKS_GENERIC, ATTACKS_MYSQL, ATTACKS_POSTGRES, ATTACKS_SQLITE,
                                   LEGIT_DUCKDB, LEGIT_MYSQL, LEGIT_POSTGRES, LEGIT_SQLITE)

__all__ = ["ATTACKS_DUCKDB", "ATTACKS_GENERIC", "ATTACKS_MYSQL", "ATTACKS_POSTGRES", "ATTACKS_SQLITE", "LEGIT_DUCKDB",
           "LEGIT_MYSQL", "LEGIT_POSTGRES", "LEGIT_SQLITE"]  # the corpus, for a test against real servers

ATTACKS = {"postgres": ATTACKS_POSTGRES, "mysql": ATTACKS_MYSQL, "sqlite": ATTACKS_SQLITE, "duckdb": ATTACKS_DUCKDB}
LEGIT = {"postgres": LEGIT_POSTGRES, "mysql": LEGIT_MYSQL, "sqlite": LEGIT_SQLITE, "duckdb": LEGIT_DUCKDB}


def _cases(table: dict[str, list]) -> list:
    return [pytest.param(d, case, id=f"{d}-{i:03d}") for d, cases in table.items() for i, case in enumerate(cases)]


@pytest.mark.parametrize("dialect,case", _cases(ATTACKS))
def test_attack_is_refused_and_named(dialect: str, case: tuple[str, str]) -> None:
    sql, named = case
    with pytest.raises((SQLRefused, SQLError)) as err:
        check_read(sql, dialect, "sales")
    assert named in str(err.value), str(err.value)


@pytest.mark.parametrize("dialect,sql,named", ATTACKS_GENERIC)
def test_attack_is_refused_in_other_dialects(dialect: str, sql: str, named: str) -> None:
    with pytest.raises((SQLRefused, SQLError)) as err:
        check_read(sql, dialect, "sales")
    assert named in str(err.value), str(err.value)


@pytest.mark.parametrize("dialect,sql", _cases(LEGIT))
def test_analyst_sql_passes(dialect: str, sql: str) -> None:
    check_read(sql, dialect, "sales")


@pytest.mark.parametrize("dialect,sql", [
    ("snowflake", "SELECT DATE_TRUNC('day', ts), IFF(a > 1, 'x', 'y'), LISTAGG(b, ',') FROM t GROUP BY 1"),
    ("bigquery", "SELECT DATE_TRUNC(ts, MONTH), COUNTIF(x > 1), SAFE_DIVIDE(a, b) FROM `p.d.t` GROUP BY 1"),
    ("tsql", "SELECT TOP 10 ISNULL(a, 0), DATEADD(day, 1, ts), LEN(name) FROM dbo.t"),
    ("", "SELECT coalesce(a, b), count(*), lower(c) FROM t GROUP BY 1, 3"),
])
def test_other_dialects_fall_back_to_known_functions(dialect: str, sql: str) -> None:
    check_read(sql, dialect, "sales")


def test_denied_messages_say_why_and_that_config_cannot_enable_them() -> None:
    with pytest.raises(SQLRefused) as err:
        check_read("SELECT pg_terminate_backend(42)", "postgres", "sales", allow_functions=["pg_terminate_backend"])
    assert "pg_terminate_backend()" in str(err.value) and "allow_functions cannot enable it" in str(err.value)
    assert "other sessions" in str(err.value)
    with pytest.raises(SQLRefused, match="SQL given as text"):
        check_read("SELECT * FROM ts_stat('SELECT v FROM docs')", "postgres", "sales", allow_functions=["ts_stat"])


def test_unknown_function_message_points_at_allow_functions() -> None:
    with pytest.raises(SQLRefused) as err:
        check_read("SELECT analytics.score(id) FROM customers", "postgres", "sales")
    assert str(err.value) == (
        "the function analytics.score() is not allowed on source 'sales': only read-only built-in functions may be "
        "called (a user-defined one needs allow_functions in [sources.sales])")


@pytest.mark.parametrize("sql,allow,ok", [
    ("SELECT analytics.score(1)", ["analytics.score"], True),
    ("SELECT analytics.score(1)", ["score"], True),  # a bare name allows it in any schema
    ("SELECT score(1)", ["score"], True),
    ("SELECT score(1)", ["analytics.score"], False),  # search_path could find another score()
    ("SELECT other.score(1)", ["analytics.score"], False),
    ("SELECT ANALYTICS.Score(1)", ["analytics.score"], True),  # unquoted names fold to lower case
    ('SELECT "Score"(1)', ["score"], True),
    ("SELECT * FROM analytics.rows_of(1)", ["analytics.rows_of"], True),
    ("SELECT score(1), pg_sleep(1)", ["score", "pg_sleep"], False),
    ("SELECT pg_catalog.pg_sleep(1)", ["pg_catalog.pg_sleep"], False),
])
def test_allow_functions(sql: str, allow: list[str], ok: bool) -> None:
    if ok:
        check_read(sql, "postgres", "sales", allow_functions=allow)
    else:
        with pytest.raises(SQLRefused):
            check_read(sql, "postgres", "sales", allow_functions=allow)


def test_source_check_passes_its_allow_functions(tmp_path: Path) -> None:
    cfg = {"url": "postgresql://u@db.example/sales", "allow_functions": ["analytics.score"]}
    source = DatabaseSource(parse_source("sales", cfg), tmp_path, 30.0)
    source.check("SELECT analytics.score(id) FROM customers")
    with pytest.raises(SQLRefused, match=r"\[sources.sales\]"):
        source.check("SELECT analytics.other(id) FROM customers")


def test_positional_arguments_stay_compatible() -> None:
    tree = check_read("SELECT lower(name) FROM users", "postgres", "sales")
    assert tree.sql("postgres") == "SELECT LOWER(name) FROM users"


def test_unicode_escapes_are_decoded_before_the_check() -> None:
    check_read('SELECT U&"\\006Cower"(name), U&"c!006Fl" UESCAPE \'!\' FROM users', "postgres")
    with pytest.raises(SQLRefused, match="pg_sleep"):
        check_read('SELECT U&"\\D83D\\DE00", U&"pg_\\0073leep"(1)', "postgres")
    with pytest.raises(SQLError, match="surrogate"):
        check_read("SELECT U&'\\D83D'", "postgres")


def test_comment_markers_inside_strings_and_names_are_text() -> None:
    check_read("SELECT '/*! SLEEP(5) */' AS a, `/*!x*/` FROM t WHERE b = '#' OR c = '-- '", "mysql")
    check_read("SELECT $$/*! x */$$, \"/* a /* b */\" FROM t", "postgres")
    check_read("SELECT [/*! x */] FROM t", "sqlite")


def test_backslash_before_a_quote_is_refused_with_a_way_out() -> None:
    with pytest.raises(SQLRefused) as err:
        check_read("SELECT 'O\\'Brien'", "mysql")
    assert "NO_BACKSLASH_ESCAPES" in str(err.value) and "''" in str(err.value)
    check_read("SELECT 'O''Brien', 'a\\\\b'", "mysql")  # a doubled quote, an escaped backslash: read alike
    with pytest.raises(SQLRefused, match="E'...'"):
        check_read("SELECT replace(path, '\\', '/') FROM files", "postgres")
    check_read("SELECT replace(path, E'\\\\', '/') FROM files", "postgres")


@pytest.mark.parametrize("dialect", ["postgres", "mysql", "sqlite", "duckdb", "snowflake"])
def test_every_denied_name_is_refused_however_written(dialect: str) -> None:
    """Plain, upper case, quoted, qualified, in FROM, ORDER BY, a window and a CTE: sqlglot builds a
    different node for some of these names (typed, anonymous, a table), each must be refused."""
    quote = {"mysql": "`{}`", "sqlite": "[{}]"}.get(dialect, '"{}"')
    forms = ["SELECT {n}(1)", "SELECT {N}(1, 2)", "SELECT * FROM {n}(1)", "SELECT x FROM t ORDER BY {n}('a')",
             "SELECT {q}(1)", "SELECT sum(x) OVER (PARTITION BY {n}(1)) FROM t", "SELECT pg_catalog.{n}(1)",
             "WITH c AS (SELECT {n}()) SELECT * FROM c"]
    names = [n for n in sqlfunctions.DENIED if sqlfunctions.denied_reason(n, dialect)]
    names += ["pg_advisory_lock_shared", "pg_try_advisory_lock", "lo_unlink", "dblink_connect", "pg_ls_waldir",
              "pg_logical_emit_message", "pg_create_logical_replication_slot", "pg_stat_reset_shared"]
    let_through = []
    for name in names:
        for form in forms:
            sql = form.format(n=name, N=name.upper(), q=quote.format(name))
            try:
                check_read(sql, dialect, "sales")
                let_through.append(sql)
            except SQLRefused as exc:
                assert name.lower() in str(exc).lower(), (sql, str(exc))
            except SQLError:
                pass  # sqlglot's own arity check: refused too
    assert not let_through


@pytest.mark.parametrize("dialect", ["postgres", "mysql", "sqlite", "duckdb"])
def test_every_listed_builtin_passes(dialect: str) -> None:
    """Each name on a list is callable (with some argument count sqlglot accepts)."""
    refused = {}
    for name in sorted(sqlfunctions.builtin_names(dialect)):
        reasons = []
        for args in ("()", "(a)", "(a, b)", "(a, b, c)", "('a', 'b', 'c', 'd')"):
            try:
                check_read(f"SELECT {name}{args} FROM t", dialect)
                reasons = []
                break
            except SQLRefused as exc:
                reasons.append(str(exc))
            except SQLError:
                pass
        if reasons:
            refused[name] = reasons[0]
    assert not refused


def test_lists_hold_no_denied_name() -> None:
    for dialect, names in sqlfunctions.BUILTINS.items():
        bad = sorted(n for n in names | sqlfunctions.COMMON if sqlfunctions.denied_reason(n, dialect))
        assert not bad, (dialect, bad)
        assert all(n == n.lower() for n in names), dialect
    assert "glob" in sqlfunctions.builtin_names("sqlite") and "glob" not in sqlfunctions.builtin_names("duckdb")
    assert not any(sqlfunctions.denied_reason(n) for n in sqlfunctions.builtin_names("snowflake"))
