"""What the SQL may and may not do, and the `sql_query` tool built on it.

Layout built once per module (mirrors DESIGN.md section 3):

    home/users.json                                   (other people's tokens)
    home/workspaces/ws/data/warehouse.duckdb          the only readable dir
    home/workspaces/ws/data/extra.csv                 a file the SQL may read
    home/workspaces/ws/users/users.json               fake, must be unreachable
    home/workspaces/ws/users/bob/threads/t1/artifacts/a1.parquet   another user's artifact
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.settings import SQLSettings
from datadesk.sources.errors import SQLError, SQLRefused
from datadesk.sources.registry import SourceSet
from datadesk.sources.warehouse import Warehouse, check_statement
from datadesk.store.demo import create_demo_warehouse
from datadesk.store.threads import Thread
from datadesk.tools.registry import ToolContext, ToolRegistry
from datadesk.tools.sql import register_sql_tool, render_result


class Home:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ws = root / "workspaces" / "ws"
        self.data = self.ws / "data"
        self.db = create_demo_warehouse(self.data)
        (self.data / "extra.csv").write_text("a,b\n1,x\n2,y\n")
        secret = json.dumps({"users": [{"id": "bob", "token_hash": "deadbeef"}]})
        (root / "users.json").write_text(secret)
        (self.ws / "users").mkdir(parents=True)
        self.users_json = self.ws / "users" / "users.json"
        self.users_json.write_text(secret)
        artifacts = self.ws / "users" / "bob" / "threads" / "t1" / "artifacts"
        artifacts.mkdir(parents=True)
        self.artifact = artifacts / "a1.parquet"
        pq.write_table(pa.table({"salary": [100_000, 120_000]}), self.artifact)

    def warehouse(self, **kw) -> Warehouse:
        return Warehouse(self.db, self.data, timeout_s=kw.get("timeout_s", 10), max_rows=kw.get("max_rows", 1000))


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Home:
    return Home(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def wh(home) -> Warehouse:
    return home.warehouse()


# -- refused by the statement check --------------------------------------------------

REFUSED = {
    "attach": ("ATTACH '{root}/other.duckdb' AS other", "ATTACH"),
    "attach_memory": ("ATTACH ':memory:' AS m", "ATTACH"),
    "copy_out": ("COPY readings TO '{data}/dump.csv'", "COPY"),
    "copy_query": ("COPY (SELECT * FROM buildings) TO '{data}/b.parquet' (FORMAT parquet)", "COPY"),
    "explain_analyze_copy": ("EXPLAIN ANALYZE COPY buildings TO '{data}/e.csv'", "EXPLAIN is allowed only"),
    "explain_opts_copy": ("/* x /* y */ */ EXPLAIN (ANALYZE) COPY buildings TO '{data}/e.csv'",
                          "EXPLAIN is allowed only"),
    "install": ("INSTALL httpfs", "INSTALL/LOAD"),
    "load": ("LOAD httpfs", "INSTALL/LOAD"),
    "set": ("SET enable_external_access = true", "SET"),
    "reset": ("RESET allowed_directories", "SET"),
    "pragma": ("PRAGMA enable_profiling", "PRAGMA"),
    "call": ("CALL pragma_version()", "CALL"),
    "create": ("CREATE TABLE t AS SELECT 1", "CREATE"),
    "create_secret": ("CREATE SECRET (TYPE s3, KEY_ID 'x', SECRET 'y')", "CREATE"),
    "insert": ("INSERT INTO buildings (building_id) VALUES ('B99')", "INSERT"),
    "update": ("UPDATE readings SET kwh = 0", "UPDATE"),
    "delete": ("DELETE FROM readings", "DELETE"),
    "drop": ("DROP TABLE readings", "DROP"),
    "export": ("EXPORT DATABASE '{data}/exp'", "EXPORT"),
    "checkpoint": ("CHECKPOINT", "CALL"),
    "transaction": ("BEGIN TRANSACTION", "TRANSACTION"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_statements(home, wh, name):
    sql, named = REFUSED[name]
    sql = sql.format(root=home.root, data=home.data)
    with pytest.raises(SQLRefused) as info:
        wh.query_sync(sql)
    message = str(info.value)
    assert named in message
    assert "SELECT" in message and "DESCRIBE" in message  # says what is allowed
    assert sorted(p.name for p in home.data.iterdir()) == ["extra.csv", "warehouse.duckdb"]


@pytest.mark.parametrize("sql", [
    "SELECT 1; SELECT 2",
    "SELECT * FROM buildings; DROP TABLE readings",
    "SELECT 1; COPY readings TO 'x.csv'",
])
def test_multiple_statements_refused(wh, sql):
    with pytest.raises(SQLRefused, match="one statement at a time"):
        wh.query_sync(sql)


# -- refused by the engine (file access outside the data dir) ------------------------

def outside_reads(home: Home) -> dict[str, str]:
    return {
        "passwd": "SELECT * FROM read_text('/etc/passwd')",
        "passwd_csv": "SELECT * FROM read_csv('/etc/passwd')",
        "artifact": f"SELECT * FROM read_parquet('{home.artifact}')",
        "artifact_glob": f"SELECT * FROM '{home.ws}/users/*/threads/*/artifacts/*.parquet'",
        "users_json": f"SELECT * FROM read_json('{home.users_json}')",
        "users_text": f"SELECT content FROM read_text('{home.root}/users.json')",
        "dotdot": f"SELECT * FROM read_csv('{home.data}/../users/users.json')",
        "blob": f"SELECT * FROM read_blob('{home.artifact}')",
        "glob": "SELECT * FROM glob('/etc/*')",
        "http": "SELECT * FROM read_csv('https://example.com/x.csv')",
    }


@pytest.mark.parametrize("name", ["passwd", "passwd_csv", "artifact", "artifact_glob", "users_json",
                                  "users_text", "dotdot", "blob", "glob", "http"])
def test_files_outside_data_dir_unreachable(home, wh, name):
    sql = outside_reads(home)[name]
    with pytest.raises(SQLError) as info:
        wh.query_sync(sql)
    assert not isinstance(info.value, SQLRefused)  # the engine said no, not the check
    assert "Permission Error" in str(info.value)
    assert "deadbeef" not in str(info.value) and "salary" not in str(info.value)


def test_engine_lockdown_holds_even_without_the_statement_check(wh):
    con = wh._connect()  # bypass check_statement on purpose
    try:
        with pytest.raises(duckdb.Error, match="Permission|disabled"):
            con.execute("SELECT * FROM read_text('/etc/passwd')").fetchall()
        for stmt in ("SET enable_external_access = true", "SET allowed_directories = ['/']",
                     "SET lock_configuration = false", "SET autoload_known_extensions = true"):
            with pytest.raises(duckdb.Error, match="locked"):
                con.execute(stmt)
        with pytest.raises(duckdb.Error):
            con.execute("CREATE TABLE t AS SELECT 1")  # read-only file
    finally:
        con.close()


def test_second_connection_verifies_the_shared_lockdown(home, wh):
    # One process shares one DuckDB instance per file; while a connection is
    # open, the next one finds the instance locked and must check it instead.
    held = wh._connect()
    try:
        assert wh.query_sync("SELECT count(*) FROM buildings").rows == [[20]]
        with pytest.raises(SQLError, match="Permission Error"):
            wh.query_sync(f"SELECT * FROM read_parquet('{home.artifact}')")
        wider = Warehouse(home.db, home.ws, timeout_s=5, max_rows=10)  # other allowed dir
        with pytest.raises(SQLError, match="other access settings"):
            wider.query_sync("SELECT 1")
    finally:
        held.close()


# -- allowed ------------------------------------------------------------------------------

ALLOWED = {
    "select": "SELECT building_id, city FROM buildings ORDER BY 1 LIMIT 3",
    "with": "WITH d AS (SELECT ts::DATE AS day, sum(kwh) AS kwh FROM readings GROUP BY 1) "
            "SELECT count(*) FROM d",
    "from_first": "FROM holidays SELECT name ORDER BY date LIMIT 1",
    "values": "VALUES (1, 'a'), (2, 'b')",
    "describe": "DESCRIBE readings",
    "show_tables": "SHOW TABLES",
    "summarize": "SUMMARIZE buildings",
    "explain": "EXPLAIN SELECT avg(kwh) FROM readings",
    "explain_analyze": "-- plan\nEXPLAIN ANALYZE SELECT count(*) FROM buildings",
    "data_dir_file": "SELECT sum(a) FROM read_csv('{data}/extra.csv')",
}


@pytest.mark.parametrize("name", list(ALLOWED))
def test_allowed_statements(home, wh, name):
    res = wh.query_sync(ALLOWED[name].format(data=home.data))
    assert res.columns and res.rows


def test_allowed_answers(home, wh):
    assert wh.query_sync("SHOW TABLES").rows == [["buildings"], ["holidays"], ["readings"]]
    assert wh.query_sync(ALLOWED["with"]).rows == [[397]]
    assert wh.query_sync(ALLOWED["data_dir_file"].format(data=home.data)).rows == [[3]]
    described = wh.query_sync("DESCRIBE readings")
    assert described.rows[1][:2] == ["ts", "TIMESTAMP"]


def test_check_statement_kinds():
    assert check_statement("with x as (select 1) select * from x") == "SELECT"
    assert check_statement("explain select 1") == "EXPLAIN"


def test_concurrent_queries_share_the_locked_instance(wh):
    sql = "SELECT count(*) FROM readings WHERE building_id = 'B{:02d}'"
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: wh.query_sync(sql.format(i % 20 + 1)).rows[0][0], range(40)))
    assert results == [397 * 24] * 40


# -- the sql_query tool ------------------------------------------------------------------


def make_ctx(home: Home) -> ToolContext:
    thread = Thread(home.ws / "users" / "alice" / "threads" / "t1")
    return ToolContext(thread=thread, workspace="ws", user="alice", permissions=frozenset(), call_id="c1")


def make_registry(home: Home, settings: SQLSettings, **wh_kw) -> ToolRegistry:
    registry = ToolRegistry()
    warehouse = home.warehouse(**wh_kw)
    register_sql_tool(registry, lambda ctx: SourceSet.of(warehouse), settings)
    return registry


def run_tool(registry: ToolRegistry, home: Home, args: object) -> object:
    raw = args if isinstance(args, str) else json.dumps(args)
    return asyncio.run(registry.run("sql_query", raw, make_ctx(home)))


def test_tool_spec(home):
    registry = make_registry(home, SQLSettings())
    spec = registry.get("sql_query").spec
    assert spec.read_only and spec.offloadable and spec.permission is None
    assert spec.parameters["required"] == ["sql"]
    assert "SHOW TABLES" in spec.description and "DESCRIBE" in spec.description
    assert registry.permitted(frozenset()) == [spec]


def test_tool_small_result_is_complete_json(home):
    result = run_tool(make_registry(home, SQLSettings()), home,
                      {"sql": "SELECT building_id, floor_area_m2 FROM buildings ORDER BY 1 LIMIT 3"})
    assert not result.is_error
    body = json.loads(result.content)
    assert body == {"columns": ["building_id", "floor_area_m2"], "types": ["VARCHAR", "INTEGER"],
                    "row_count": 3, "rows": [["B01", 12400], ["B02", 8600], ["B03", 21500]]}
    assert result.data["rows"] == body["rows"] and result.data["truncated"] is False


def test_tool_hands_large_results_to_offload_as_a_stream(home):
    registry = ToolRegistry()
    warehouse = home.warehouse()
    register_sql_tool(registry, lambda ctx: SourceSet.of(warehouse), SQLSettings(), threshold_chars=2000)
    result = run_tool(registry, home, {"sql": "SELECT * FROM readings ORDER BY building_id, ts LIMIT 500"})
    assert not result.is_error and result.table is not None and result.content == ""
    with result.table as table:
        assert sum(b.num_rows for b in table) == 500
    small = run_tool(registry, home, {"sql": "SELECT * FROM readings LIMIT 3"})
    assert small.table is None and json.loads(small.content)["row_count"] == 3


def test_tool_streams_every_row_past_the_inline_cap(home):
    registry = make_registry(home, SQLSettings())
    result = run_tool(registry, home, {"sql": "SELECT * FROM range(5000) t(i)"})
    with result.table as table:
        rows = [v for b in table for v in b.column(0).to_pylist()]
    assert rows == list(range(5000))


def test_render_result_cuts_at_row_boundary_even_when_nothing_fits(wh):
    res = wh.query_sync("SELECT * FROM readings LIMIT 3")
    text = render_result(res, 50)
    body = json.loads(text)
    assert body["rows"] == [] and body["notice"].startswith("shown 0 of 3 rows")


@pytest.mark.parametrize("args, expected", [
    ({"sql": "SELEC * FROM readings"}, "syntax error"),
    ({"sql": "SELECT nope FROM readings"}, "nope"),
    ({"sql": "SELECT * FROM no_such_table"}, "no_such_table"),
    ({"sql": "DROP TABLE readings"}, "DROP statements are not allowed"),
    ({"sql": "SELECT 1; SELECT 2"}, "one statement at a time"),
    ({"sql": ""}, "non-empty string"),
    ({"sql": 42}, "non-empty string"),
    ({}, "missing required sql"),
])
def test_tool_errors_name_the_problem(home, args, expected):
    result = run_tool(make_registry(home, SQLSettings()), home, args)
    assert result.is_error
    assert expected in result.content


def test_tool_timeout_is_an_error_result(home):
    registry = make_registry(home, SQLSettings(), timeout_s=0.5)
    result = run_tool(registry, home, {"sql": "SELECT count(*) FROM range(100000000) a, range(1000) b"})
    assert result.is_error and "query exceeded 0.5 s; narrow it or add a LIMIT" in result.content


def test_tool_missing_warehouse(tmp_path, home):
    registry = ToolRegistry()
    missing = Warehouse(tmp_path / "warehouse.duckdb", tmp_path, timeout_s=1, max_rows=10)
    register_sql_tool(registry, lambda ctx: SourceSet.of(missing), SQLSettings())
    result = run_tool(registry, home, {"sql": "SELECT 1"})
    assert result.is_error and "warehouse not found" in result.content
