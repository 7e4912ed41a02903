"""Real third-party MCP servers from the package index, through the real MCP client and the
real offload pipeline (issue 17): each returns tabular data in its own format, and each
result must become a typed Parquet artifact with the exact rows and sums of the source.

| server (PyPI)               | format of its rows                                   | its own cap            |
|-----------------------------|------------------------------------------------------|------------------------|
| mcp-server-sqlite 2025.4.25 | Python repr of a list of dicts (`str(results)`)      | none                   |
| mcp-server-motherduck 1.1.0 | JSON `{columns, columnTypes, rows: [[...]]}`          | 1,024 rows: `truncated`, `warning` |
| mcp-csv-database 0.1.7      | JSON envelope `{status, columns, row_count, limited, data: [{...}]}`, indent 2 | `limit` argument, default 100 |
| mcp-server-duckdb 1.1.0     | Python repr of a list of tuples (`str(fetchall())`)   | none                   |
| mcp-alchemy 2026.10.15.202659 | vertical records: `1. row` then `col: value` lines, `Result: N rows` | `EXECUTE_QUERY_MAX_CHARS` (4,000): "showing first N rows (output truncated)" |
| chdb-mcp 0.2.0 (chDB 4.4.0) | any ClickHouse format: `Vertical` gives `Row 1:` / `──` / `col: value` records | 1,000 rows ("Showed first 1000."), `CHDB_MCP_MAX_RESULT_BYTES` (1 MiB) |

Each needs its own `mcp` (and DuckDB) version, so `.ci/run` installs it in its own venv
(`.venv-mcp-sqlite`, `.venv-mcp-motherduck`, `.venv-mcp-csvdb`, `.venv-mcp-duckdb`,
`.venv-mcp-alchemy`, `.venv-mcp-chdb`);
DATADESK_MCP_<NAME> points at another console script. Without one the test skips;
DATADESK_REQUIRE_MCP_<NAME>=1 (set by .ci/run) makes that a failure. All data is local
(SQLite / DuckDB files, a CSV folder); telemetry and update checks are switched off.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import shlex
import sqlite3
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel
from datadesk.offload.pipeline import OffloadCapability
from datadesk.settings import OffloadSettings, SandboxSettings, Settings
from datadesk.tools.mcp.manager import MCPManager, MCPServerConfig
from datadesk.tools.registry import ToolContext, ToolRegistry
from tests.integration.test_mcp import reader_ctx as ctx

ROOT = Path(__file__).resolve().parents[2]
WS = "demo"
QUIET = {"FASTMCP_CHECK_FOR_UPDATES": "off", "FASTMCP_SHOW_SERVER_BANNER": "false", "DO_NOT_TRACK": "1",
         "MOTHERDUCK_TOKEN": "", "FASTMCP_LOG_LEVEL": "WARNING"}


def server_command(name: str, script: str) -> list[str]:
    """The console script of a third-party server (skip, or fail where CI requires it)."""
    env = os.environ.get(f"DATADESK_MCP_{name.upper()}")
    if env:
        return shlex.split(env)
    cand = ROOT / f".venv-mcp-{name}" / "bin" / script
    if cand.exists():
        return [str(cand)]
    missing(name, script, "is not installed")


def missing(name: str, script: str, why: str) -> NoReturn:
    msg = (f"{script} {why} (install it in its own venv, `.venv-mcp-{name}`, as .ci/run does, "
           f"or set DATADESK_MCP_{name.upper()} to its console script)")
    if os.environ.get(f"DATADESK_REQUIRE_MCP_{name.upper()}") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture
def rt(home: Path) -> Runtime:
    settings = Settings(home=home, sandbox=SandboxSettings(backend="none"),
                        offload=OffloadSettings(threshold_chars=2_000))
    return Runtime(settings=settings, model=ScriptedModel())


async def offload(rt: Runtime, reg: ToolRegistry, c: ToolContext, tool: str, **args: Any):
    """Call the tool over MCP, then run its result through the offload pipeline."""
    arguments = json.dumps(args)
    result = await reg.run(tool, arguments, c)
    assert not result.is_error, result.content[:500]
    spec = reg.get(tool, WS).spec
    outcome = await rt.offload.process(spec, result, c.thread, c.origin("tool", tool, arguments),
                                       OffloadCapability(True))
    assert outcome.artifact is not None, outcome.result.content[:1000]
    table = pq.read_table(c.thread.artifacts_dir / outcome.artifact.file)
    return outcome, table


async def started(mgr: MCPManager, name: str, cfg: MCPServerConfig, tmp_path: Path, script: str) -> None:
    await mgr.start_workspace(WS, {name: cfg}, tmp_path)
    st = next(s for s in mgr.status(WS) if s["name"] == name)
    if st["state"] != "up":
        missing(name, script, f"is not usable here: {st['last_error']}")


# -- mcp-server-sqlite: a Python repr of a list of dicts ------------------------------------------
def test_mcp_server_sqlite_repr_of_dicts(rt: Runtime, tmp_path: Path) -> None:
    cmd = server_command("sqlite", "mcp-server-sqlite")
    db = tmp_path / "shop.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE orders (id INTEGER, customer TEXT, amount REAL, qty INTEGER, day TEXT, paid INTEGER)")
    con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, f"customer {i % 977}", i * 0.25, i % 7, f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}", i % 2)
                     for i in range(60_000)])
    con.commit()
    con.close()

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            await started(mgr, "sqlite", MCPServerConfig(command=[*cmd, "--db-path", str(db)], timeout_s=120,
                                                         startup_timeout_s=60, env=QUIET), tmp_path, "mcp-server-sqlite")
            c = ctx(tmp_path)
            outcome, table = await offload(rt, reg, c, "sqlite__read_query", query="SELECT * FROM orders ORDER BY id")
            art = outcome.artifact
            assert art.shape == "Python repr of a list of dicts" and art.status == "ready" and art.partial_by is None
            assert table.num_rows == art.rows == 60_000
            assert table.column_names == ["id", "customer", "amount", "qty", "day", "paid"]
            assert str(table.schema.field("id").type) == "int64" and str(table.schema.field("day").type) == "date32[day]"
            assert pc.sum(table["id"]).as_py() == sum(range(60_000))
            assert pc.sum(table["amount"]).as_py() == sum(i * 0.25 for i in range(60_000))
            assert pc.sum(table["qty"]).as_py() == sum(i % 7 for i in range(60_000))
            assert "rows: 60,000" in outcome.result.content and "sent as: Python repr of a list of dicts" \
                in outcome.result.content
        finally:
            await mgr.stop()

    asyncio.run(main())


# -- mcp-server-motherduck: {columns, columnTypes, rows}, capped at 1,024 rows ---------------------
def _duckdb_file(cmd: list[str], path: Path, rows: int) -> None:
    """The DuckDB file, written by the server's own DuckDB (its storage version)."""
    python = Path(cmd[0]).parent / "python"
    sql = ("CREATE TABLE t AS SELECT i::INTEGER AS id, 'name ' || i AS name, i * 0.25 AS amount, "
           "((i % 1000) + (i % 100) / 100)::DECIMAL(10,2) AS price, DATE '2024-01-01' + (i % 365)::INTEGER AS day, "
           "TIMESTAMPTZ '2024-01-01 00:00:00+00' + to_seconds(i) AS ts, i % 3 = 0 AS paid FROM range(?) r(i)")
    code = f"import duckdb, sys; c = duckdb.connect(sys.argv[1]); c.execute({sql!r}, [{rows}]); c.close()"
    if not python.exists():
        missing("motherduck", "mcp-server-motherduck", f"has no python beside it ({python})")
    subprocess.run([str(python), "-c", code, str(path)], check=True, timeout=120)


def test_mcp_server_motherduck_columns_rows_and_its_cap(rt: Runtime, tmp_path: Path) -> None:
    cmd = server_command("motherduck", "mcp-server-motherduck")
    db = tmp_path / "sales.duckdb"
    _duckdb_file(cmd, db, 3_000)

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            cfg = MCPServerConfig(command=[*cmd, "--db-path", str(db), "--max-chars", "10000000"], timeout_s=120,
                                  startup_timeout_s=90, env={**QUIET, "HOME": str(tmp_path)})
            await started(mgr, "md", cfg, tmp_path, "mcp-server-motherduck")
            c = ctx(tmp_path)
            # the whole result, under its cap: typed from the source's own columnTypes
            outcome, table = await offload(rt, reg, c, "md__execute_query", sql="SELECT * FROM t ORDER BY id LIMIT 1000")
            art = outcome.artifact
            assert art.status == "ready" and art.rows == table.num_rows == 1000
            assert art.shape and "columns" in art.shape
            assert [str(f.type) for f in table.schema] == ["int32", "string", "decimal128(22, 2)", "decimal128(10, 2)",
                                                           "date32[day]", "timestamp[us, tz=UTC]", "bool"]
            assert pc.sum(table["amount"]).as_py() == sum(Decimal(i) / 4 for i in range(1000))
            assert pc.sum(table["id"]).as_py() == sum(range(1000))
            assert pc.sum(table["price"]).as_py() == sum(Decimal(f"{i % 1000}.{i % 100:02d}") for i in range(1000))
            assert pc.sum(table["paid"].cast("int64")).as_py() == sum(1 for i in range(1000) if i % 3 == 0)
            assert art.source_meta and art.source_meta.get("success") is True

            # past its cap: the server says `truncated` and warns; the artifact and the model say so
            outcome, table = await offload(rt, reg, c, "md__execute_query", sql="SELECT * FROM t ORDER BY id")
            art = outcome.artifact
            assert table.num_rows == art.rows == 1024
            assert art.status == "partial" and art.partial_by == "source"
            assert "Results limited to 1,024 rows" in (art.source_note or "")
            content = outcome.result.content
            assert "PARTIAL (by the source)" in content and "Results limited to 1,024 rows" in content
            assert "narrower query" in content
            assert pc.sum(table["id"]).as_py() == sum(range(1024))
        finally:
            await mgr.stop()

    asyncio.run(main())


def _sales_csv(folder: Path, rows: int) -> Path:
    """`rows` rows of id, region, amount, units as a CSV file in `folder`."""
    path = folder / "sales.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "region", "amount", "units"])
        for i in range(rows):
            w.writerow([i, f"region {i % 11}", i * 0.25, i % 13])
    return path


# -- mcp-csv-database: an envelope with `data` objects, its `limit` argument -----------------------
def test_mcp_csv_database_envelope_and_limit_argument(rt: Runtime, tmp_path: Path) -> None:
    cmd = server_command("csvdb", "mcp-csv-database")
    folder = tmp_path / "csv"
    folder.mkdir()
    _sales_csv(folder, 3_000)

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            cfg = MCPServerConfig(command=cmd, timeout_s=120, startup_timeout_s=60, env={**QUIET, "HOME": str(tmp_path)})
            await started(mgr, "csvdb", cfg, tmp_path, "mcp-csv-database")
            c = ctx(tmp_path)
            loaded = await reg.run("csvdb__load_csv_folder", json.dumps({"folder_path": str(folder)}), c)
            assert '"successful_loads": 1' in loaded.content, loaded.content[:400]
            # its default `limit` (100) cut the result: `limited: true`, and exactly 100 rows
            outcome, table = await offload(rt, reg, c, "csvdb__execute_sql_query", query="SELECT * FROM sales")
            art = outcome.artifact
            assert table.num_rows == art.rows == 100 and art.partial_by == "source"
            assert "limited: true" in (art.source_note or "") and "`limit`" in (art.source_note or "")
            assert "PARTIAL (by the source)" in outcome.result.content
            assert art.source_meta is not None and art.source_meta.get("status") == "success"
            assert "function_results_id" in art.source_meta
            # with a larger limit: the whole table, not partial, typed, exact sums
            outcome, table = await offload(rt, reg, c, "csvdb__execute_sql_query", query="SELECT * FROM sales",
                                           limit=10_000)
            art = outcome.artifact
            assert art.status == "ready" and art.partial_by is None and table.num_rows == 3_000
            assert table.column_names == ["id", "region", "amount", "units"]
            assert pc.sum(table["id"]).as_py() == sum(range(3_000))
            assert pc.sum(table["amount"]).as_py() == sum(i * 0.25 for i in range(3_000))
            assert pc.sum(table["units"]).as_py() == sum(i % 13 for i in range(3_000))
        finally:
            await mgr.stop()

    asyncio.run(main())


# -- mcp-server-duckdb: a Python repr of a list of tuples ------------------------------------------
def test_mcp_server_duckdb_repr_of_tuples_through_the_pipeline(rt: Runtime, tmp_path: Path) -> None:
    import duckdb

    env = os.environ.get("DATADESK_MCP_DUCKDB")
    cand = ROOT / ".venv-mcp-duckdb" / "bin" / "mcp-server-duckdb"
    cmd = shlex.split(env) if env else [str(cand)] if cand.exists() else None
    if cmd is None:
        missing("duckdb", "mcp-server-duckdb", "is not installed")
    db = tmp_path / "t.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE t AS SELECT i::INTEGER AS id, 'name ' || i AS name, (i * 0.25)::DOUBLE AS amount, "
                "DATE '2024-01-01' + (i % 365)::INTEGER AS day FROM range(200000) r(i)")
    con.close()

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            cfg = MCPServerConfig(command=[*cmd, "--db-path", str(db), "--readonly"], timeout_s=120,
                                  startup_timeout_s=60)
            await started(mgr, "duckdb", cfg, tmp_path, "mcp-server-duckdb")
            c = ctx(tmp_path)
            outcome, table = await offload(rt, reg, c, "duckdb__query", query="SELECT * FROM t ORDER BY id")
            assert outcome.artifact.shape == "Python repr of a list of tuples"
            assert table.num_rows == 200_000 and table.column_names == ["col_1", "col_2", "col_3", "col_4"]
            assert pc.sum(table["col_1"]).as_py() == sum(range(200_000))
            assert pc.sum(table["col_3"]).as_py() == sum(i * 0.25 for i in range(200_000))
            assert str(table.schema.field("col_4").type) == "date32[day]"
        finally:
            await mgr.stop()

    asyncio.run(main())


# -- mcp-alchemy: vertical records (`1. row`, `col: value`), cut by its own EXECUTE_QUERY_MAX_CHARS ---
def _orders_db(path: Path, rows: int) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE orders (id INTEGER, customer TEXT, amount REAL, day TEXT, paid INTEGER)")
    con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                    [(i, f"customer {i % 7}", i * 0.25, f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}", i % 2)
                     for i in range(rows)])
    con.commit()
    con.close()


def test_mcp_alchemy_vertical_records_and_its_own_cut(rt: Runtime, tmp_path: Path) -> None:
    cmd = server_command("alchemy", "mcp-alchemy")
    db = tmp_path / "shop.db"
    _orders_db(db, 3_000)

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            env = {**QUIET, "DB_URL": f"sqlite:///{db}", "EXECUTE_QUERY_MAX_CHARS": "100000000"}
            await started(mgr, "alchemy", MCPServerConfig(command=cmd, timeout_s=120, startup_timeout_s=60, env=env),
                          tmp_path, "mcp-alchemy")
            c = ctx(tmp_path)
            outcome, table = await offload(rt, reg, c, "alchemy__execute_query",
                                           query="SELECT * FROM orders ORDER BY id")
            art = outcome.artifact
            assert art.shape == "vertical records (N. row)" and art.status == "ready" and art.partial_by is None
            assert table.num_rows == art.rows == 3_000
            assert table.column_names == ["id", "customer", "amount", "day", "paid"]
            assert str(table.schema.field("id").type) == "int64"
            assert str(table.schema.field("day").type) == "date32[day]"
            assert pc.sum(table["id"]).as_py() == sum(range(3_000))
            assert pc.sum(table["amount"]).as_py() == sum(i * 0.25 for i in range(3_000))
            assert pc.sum(table["paid"]).as_py() == 1_500
            assert "sent as: vertical records (N. row)" in outcome.result.content
            # an error is ordinary text ("Error: (sqlite3.OperationalError) no such column"): told as an error
            r = await reg.run("alchemy__execute_query", json.dumps({"query": "SELECT nope FROM orders"}), c)
            assert r.is_error and "the MCP server alchemy answered with an error: Error: (sqlite3.OperationalError) " \
                                  "no such column: nope" in r.content, r.content
        finally:
            await mgr.stop()
        # its default cut (4,000 characters): "showing first N rows (output truncated)", said as the source's cut
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            env = {**QUIET, "DB_URL": f"sqlite:///{db}"}
            await started(mgr, "alchemy", MCPServerConfig(command=cmd, timeout_s=120, startup_timeout_s=60, env=env),
                          tmp_path, "mcp-alchemy")
            c = ctx(tmp_path)
            outcome, table = await offload(rt, reg, c, "alchemy__execute_query",
                                           query="SELECT * FROM orders ORDER BY id")
            art = outcome.artifact
            assert art.status == "partial" and art.partial_by == "source" and 0 < table.num_rows == art.rows < 3_000
            assert f"showing first {art.rows} rows (output truncated)" in (art.source_note or "")
            assert "PARTIAL (by the source)" in outcome.result.content
            assert pc.sum(table["id"]).as_py() == sum(range(art.rows))
        finally:
            await mgr.stop()

    asyncio.run(main())


# -- chdb-mcp: ClickHouse's Vertical format (`Row 1:`, a rule, `col: value`) on a local CSV file ------
def _chdb_config(cmd: list[str], tmp_path: Path) -> MCPServerConfig:
    env = {**QUIET, "HOME": str(tmp_path), "CHDB_MCP_SESSION_PATH": str(tmp_path / "chdb-session"),
           "CHDB_MCP_MAX_RESULT_BYTES": "100000000"}
    return MCPServerConfig(command=cmd, timeout_s=120, startup_timeout_s=90, env=env)


def test_chdb_mcp_vertical_records(rt: Runtime, tmp_path: Path) -> None:
    cmd = server_command("chdb", "chdb-mcp")
    path = _sales_csv(tmp_path, 3_000)

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            await started(mgr, "chdb", _chdb_config(cmd, tmp_path), tmp_path, "chdb-mcp")
            c = ctx(tmp_path)
            sql = (f"SELECT * FROM file('{path}', 'CSVWithNames') ORDER BY id "
                   "SETTINGS output_format_pretty_max_rows = 100000")
            outcome, table = await offload(rt, reg, c, "chdb__query", sql=sql, format="Vertical")
            art = outcome.artifact
            assert art.shape == "vertical records (Row N:)" and art.status == "ready" and art.partial_by is None
            assert table.num_rows == art.rows == 3_000
            assert table.column_names == ["id", "region", "amount", "units"]
            assert str(table.schema.field("id").type) == "int64"
            assert str(table.schema.field("amount").type) == "double"
            assert pc.sum(table["id"]).as_py() == sum(range(3_000))
            assert pc.sum(table["amount"]).as_py() == sum(i * 0.25 for i in range(3_000))
            assert pc.sum(table["units"]).as_py() == sum(i % 13 for i in range(3_000))
            # an unknown table: told to the model as an error naming the server
            r = await reg.run("chdb__query", json.dumps({"sql": "SELECT * FROM nope", "format": "Vertical"}), c)
            assert r.is_error and "the MCP server chdb answered with an error" in r.content and "nope" in r.content
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_chdb_mcp_vertical_records_past_its_own_row_cap(rt: Runtime, tmp_path: Path) -> None:
    cmd = server_command("chdb", "chdb-mcp")
    path = _sales_csv(tmp_path, 3_000)

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        try:
            await started(mgr, "chdb", _chdb_config(cmd, tmp_path), tmp_path, "chdb-mcp")
            c = ctx(tmp_path)
            sql = f"SELECT * FROM file('{path}', 'CSVWithNames') ORDER BY id"
            outcome, table = await offload(rt, reg, c, "chdb__query", sql=sql, format="Vertical")
            art = outcome.artifact
            assert table.num_rows == art.rows == 1_000 and pc.sum(table["id"]).as_py() == sum(range(1_000))
            assert art.status == "partial" and art.partial_by == "source"
            assert "Showed first 1000" in (art.source_note or "")
        finally:
            await mgr.stop()

    asyncio.run(main())
