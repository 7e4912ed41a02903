"""Sources without a server: configuration, the statement check, type normalisation, the pool,
SQLite files and the generic ADBC path (adbc_driver_sqlite)."""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pytest

from datadesk.sources.check import check_read
from datadesk.sources.config import MASK, SourceConfigError, masked_config, parse_source
from datadesk.sources.errors import SQLCancelled, SQLError, SQLRefused, SQLTimeout
from datadesk.sources.normalize import Normalizer, interval_duration, uuid_text
from datadesk.sources.query import QueryControl
from datadesk.sources.registry import SourceSet
from datadesk.sources.session import SessionPool, SourceBusy
from datadesk.sources.warehouse import Warehouse
from tests.dbkit import make_sqlite


@pytest.mark.parametrize("raw,needle", [
    ({"url": "postgresql://u:s3cr3t-v4l@h/db"}, "may not carry a password"),
    ({"url": "postgresql://u@h/db", "password": "l1t3r4l"}, "${env:VARIABLE}"),
    ({"url": "oracle://u@h/db"}, "unknown kind 'oracle'"),
    ({"url": "postgresql://u@h/"}, "name the database"),
    ({"url": "sqlite:///../outside.db"}, "inside the workspace"),
    ({"url": "sqlite:////etc/passwd"}, "sqlite:///<path inside the workspace>"),
    ({"url": "postgresql://u@h/db", "hostt": "x"}, "hostt"),
    ({"driver": "snowflake"}, "adbc_driver_snowflake"),
    ({"driver": "adbc_driver_x", "options": {"password": "pl41n"}}, "options.password"),
    ({"url": "postgresql://u@h/db", "dialect": "klingon"}, "unknown SQL dialect"),
    ({"url": "postgresql://u@h/db", "max_connections": 0}, "max_connections"),
])
def test_bad_source_entries_name_the_key(raw, needle) -> None:
    with pytest.raises(SourceConfigError) as err:
        parse_source("sales", raw)
    assert needle in str(err.value)
    assert not any(v in str(err.value) for v in ("s3cr3t-v4l", "l1t3r4l", "pl41n"))


def test_kinds_dialects_and_masking() -> None:
    assert parse_source("a", {"url": "postgres://u@h:5433/db"}).dialect == "postgres"
    assert parse_source("a", {"url": "mariadb://u@h/db"}).kind == "mysql"
    assert parse_source("a", {"url": "sqlite:///data/x.db"}).path == "data/x.db"
    assert parse_source("a", {"driver": "adbc_driver_snowflake"}).dialect == "snowflake"
    assert parse_source("a", {"driver": "adbc_driver_flightsql"}).dialect == ""  # generic SQL
    with pytest.raises(SourceConfigError):
        parse_source("warehouse", {"url": "sqlite:///data/x.db"})
    shown = masked_config("a", {"url": "postgresql://u:pw@h/db", "password": "oops-literal",
                                "options": {"token": "t0k3n", "role": "r"}})
    assert shown["password"] == MASK and shown["options"] == {"token": MASK, "role": "r"}
    assert "pw" not in shown["url"]
    assert masked_config("a", {"password": "${env:X}"})["password"] == "${env:X}"


@pytest.mark.parametrize("dialect,sql,kind", [
    ("postgres", "INSERT INTO t VALUES (1)", SQLRefused),
    ("postgres", "UPDATE t SET a = 1", SQLRefused),
    ("postgres", "CREATE TABLE x (a int)", SQLRefused),
    ("postgres", "COPY (SELECT 1) TO PROGRAM 'id'", SQLRefused),
    ("postgres", "SELECT * FROM orders FOR UPDATE", SQLRefused),
    ("postgres", "WITH gone AS (DELETE FROM orders RETURNING *) SELECT count(*) FROM gone", SQLRefused),
    ("postgres", "SELECT set_config('default_transaction_read_only', 'off', false)", SQLRefused),
    ("postgres", "SELECT pg_catalog.pg_advisory_lock(1)", SQLRefused),
    ("postgres", "SELECT * INTO copy_of_orders FROM orders", SQLRefused),
    ("postgres", "SELECT 1; SELECT 2", SQLRefused),
    ("postgres", "SET statement_timeout = 0", SQLRefused),
    ("postgres", "SELEC 1", SQLError),
    ("postgres", "SELECT pg_sleep(1)", SQLRefused),
    ("mysql", "SELECT GET_LOCK('x', 1)", SQLRefused),
    ("mysql", "SELECT * FROM orders LOCK IN SHARE MODE", SQLRefused),
    ("sqlite", "ATTACH 'other.db' AS o", SQLRefused),
    ("sqlite", "SELECT load_extension('x')", SQLRefused),
])
def test_statement_check_refuses_writes_in_each_dialect(dialect, sql, kind) -> None:
    with pytest.raises(kind) as err:
        check_read(sql, dialect, "src")
    if kind is SQLError:
        assert f"{dialect} dialect" in str(err.value)


@pytest.mark.parametrize("dialect,sql", [
    ("postgres", "WITH x AS (SELECT 1 AS a) SELECT a FROM x UNION ALL SELECT 2"),
    ("postgres", "SELECT amount::numeric(10, 2), tags[1], meta->>'k' FROM orders WHERE ts > now() - interval '1 day'"),
    ("mysql", "SELECT `id`, DATE_FORMAT(ts, '%Y') FROM orders LIMIT 5"),
    ("sqlite", "SELECT * FROM orders WHERE day BETWEEN '2024-01-01' AND '2024-02-01'"),
    ("postgres", "VALUES (1), (2)"),
])
def test_statement_check_lets_reads_through(dialect, sql) -> None:
    check_read(sql, dialect, "src")


def test_normaliser_uuid_interval_numeric_json_lists() -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    raw = pa.array([u.bytes for u in ids] + [None], pa.binary(16))
    assert uuid_text(raw).to_pylist() == [str(u) for u in ids] + [None]
    iv = pa.array([pa.MonthDayNano([1, 2, 3_000_000_000]), None], pa.month_day_nano_interval())
    assert interval_duration(iv).to_pylist()[0].total_seconds() == 32 * 86400 + 3
    opaque = pa.opaque(pa.string(), "numeric", "PostgreSQL")
    field = pa.field("amount", opaque, metadata={b"POSTGRESQL:typmod": str(((12 << 16) | 2) + 4).encode()})
    plain = pa.field("x", opaque)
    schema = pa.schema([field, plain, pa.field("j", pa.json_(pa.string())), pa.field("l", pa.list_(pa.uuid()))])
    batch = pa.RecordBatch.from_arrays([
        pa.ExtensionArray.from_storage(opaque, pa.array(["1.25", "NaN"])),
        pa.ExtensionArray.from_storage(opaque, pa.array(["1e300", "Infinity"])),
        pa.ExtensionArray.from_storage(pa.json_(pa.string()), pa.array(['{"a": 1}', None])),
        pa.ListArray.from_arrays(pa.array([0, 1, 1], pa.int32()),
                                 pa.ExtensionArray.from_storage(pa.uuid(), pa.array([ids[0].bytes], pa.binary(16))),
                                 mask=pa.array([False, True])),
    ], schema=schema)
    norm = Normalizer(schema)
    out = norm(batch)
    assert str(out.schema.field("amount").type) == "decimal128(12, 2)"
    assert out.schema.field("x").type == pa.float64() and out.schema.field("j").type == pa.string()
    assert out.column(0).to_pylist()[1] is None and out.column(1).to_pylist() == [1e300, float("inf")]
    assert out.column(3).to_pylist() == [[str(ids[0])], None]


class CountingSession:
    """A real (in-memory) session object for the pool: it only counts what happens to it."""

    opened = 0

    def __init__(self) -> None:
        CountingSession.opened += 1
        self.broken = False
        self.closed = False

    def end(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_pool_keeps_sessions_per_user_with_per_user_and_global_caps() -> None:
    pool = SessionPool("s", CountingSession, max_total=3, max_per_user=2, wait_s=0.2)
    a1, a2 = pool.acquire("alice"), pool.acquire("alice")
    with pytest.raises(SourceBusy, match="max_connections_per_user = 2"):
        pool.acquire("alice")
    b1 = pool.acquire("bob")
    with pytest.raises(SourceBusy, match="all 3 connections"):
        pool.acquire("carol")
    pool.release("alice", a1)
    assert pool.acquire("alice") is a1  # the same user's idle session comes back
    pool.release("alice", a1)
    c1 = pool.acquire("carol")  # full: carol evicts alice's idle session, never reuses it
    assert c1 is not a1 and pool.open_count == 3
    b1.broken = True
    pool.release("bob", b1)  # a broken session is closed, not kept
    assert pool.open_count == 2
    pool.release("alice", a2)
    pool.release("carol", c1)
    pool.close_all()
    assert pool.open_count == 0


def _sqlite_set(tmp_path, **extra):
    make_sqlite(tmp_path / "data" / "shop.sqlite", rows=50_000)
    return SourceSet({"local": {"url": "sqlite:///data/shop.sqlite", **extra},
                      "broken": {"url": "postgresql://u:pw@h/db"}}, tmp_path, 30)


def test_sqlite_source_reads_read_only_and_lists_broken_ones(tmp_path) -> None:
    sources = _sqlite_set(tmp_path)
    src = sources.get("local")
    with src.record_batches("SELECT count(*) AS n, sum(amount) AS s FROM orders", "alice") as stream:
        rows = pa.Table.from_batches(list(stream), schema=stream.schema).to_pylist()
    assert rows == [{"n": 50_000, "s": sum((i % 1000) + 0.25 for i in range(1, 50_001))}]
    session = src.pool.acquire("alice")
    with pytest.raises(Exception, match="readonly"):  # the engine itself refuses (mode=ro), check bypassed
        session.execute("CREATE TABLE x (a)", 10)
    session.broken = True
    src.pool.release("alice", session)
    with pytest.raises(SQLError, match="misconfigured") as err:
        sources.get("broken")
    assert "pw" not in str(err.value).replace("password", "")
    assert "MISCONFIGURED" in sources.prompt_text() and "local (sqlite)" in sources.prompt_text()
    with pytest.raises(SQLError, match="nearest: main.orders"):
        src.record_batches("SELECT * FROM orderz", "alice")
    described = {t.name: [c.name for c in t.columns] for t in src.describe()}
    assert described["orders"][:3] == ["id", "customer_id", "amount"]


def test_the_warehouse_is_one_source_of_the_set(tmp_path) -> None:
    """The default source, by name or by no name, with the same interface and status keys as a
    configured database; a missing warehouse file shows as DOWN with the reason, in the prompt too."""
    sources = _sqlite_set(tmp_path)
    wh = sources.get("")
    assert isinstance(wh, Warehouse) and sources.get("warehouse") is wh and next(iter(sources)) is wh
    assert sources.names() == ["warehouse", "broken", "local"]
    assert set(wh.status()) == set(sources.get("local").status())
    assert "- warehouse (duckdb): this workspace's warehouse (the default)\n" in sources.prompt_text()
    with pytest.raises(SQLError, match="warehouse not found"):
        wh.record_batches("SELECT 1", "alice")
    assert wh.status()["state"] == "down" and "warehouse not found" in wh.status()["reason"]
    assert "warehouse (the default) — DOWN at the last attempt: warehouse not found" in sources.prompt_text()
    with pytest.raises(SQLRefused):
        wh.check("COPY t TO 'x.csv'")  # refused before any connection, as a database's check does
    (tmp_path / "data" / "v.csv").write_text("a\n1\n2\n")
    only = SourceSet.of(Warehouse(tmp_path / "data" / "none.duckdb", tmp_path / "data", timeout_s=5,
                                  views={"v": str(tmp_path / "data" / "v.csv")}))
    with only.get("").record_batches("SELECT sum(a) AS s FROM v", "alice") as stream:
        assert pa.Table.from_batches(list(stream)).to_pylist() == [{"s": 3}]
    assert only.get("").status()["state"] == "ok" and only.prompt_text() == ""  # only the warehouse: no section
    with pytest.raises(SQLError, match="no source 'local' in this workspace; sources: warehouse$"):
        only.get("local")


def test_sqlite_link_out_of_the_workspace_is_refused(tmp_path) -> None:
    outside = make_sqlite(tmp_path / "outside.sqlite", rows=10)
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "shop.sqlite").symlink_to(outside)
    sources = SourceSet({"local": {"url": "sqlite:///data/shop.sqlite"}}, ws, 30)
    with pytest.raises(SQLError, match="symbolic link"):
        sources.get("local").record_batches("SELECT 1", "alice")


def test_sqlite_long_query_stopped_by_cancel_and_by_timeout(tmp_path) -> None:
    sources = _sqlite_set(tmp_path, timeout_s=0.5)
    src = sources.get("local")
    slow = "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 500000000) SELECT count(*) FROM g"
    with pytest.raises(SQLTimeout, match="0.5 s"):
        list(src.record_batches(slow, "alice"))
    control = QueryControl(30)
    threading.Timer(0.3, control.cancel).start()
    with pytest.raises(SQLCancelled):
        list(src.record_batches(slow, "alice", control=control))
    with src.record_batches("SELECT count(*) AS n FROM orders", "alice") as stream:  # the session still works
        assert next(iter(stream)).column(0).to_pylist() == [50_000]


def test_generic_adbc_driver_by_module_name(tmp_path) -> None:
    make_sqlite(tmp_path / "data" / "g.sqlite", rows=1_000)
    sources = SourceSet({"g": {"driver": "adbc_driver_sqlite", "dialect": "sqlite",
                               "url": f"file:{tmp_path / 'data' / 'g.sqlite'}?mode=ro"}}, tmp_path, 30)
    src = sources.get("g")
    with src.record_batches("SELECT count(*) AS n, sum(id) AS s FROM orders", "alice") as stream:
        assert pa.Table.from_batches(list(stream)).to_pylist() == [{"n": 1_000, "s": 500_500}]
    assert {"orders", "customers"} <= {t.name for t in src.describe()}
    with pytest.raises(SQLRefused):
        src.record_batches("DELETE FROM orders", "alice")
    sources.close()


def test_app_starts_with_a_bad_source_and_shows_it_masked(home) -> None:
    import asyncio

    from litestar.testing import TestClient

    from datadesk.llm.scripted import ScriptedModel
    from datadesk.store.layout import Layout
    from tests.conftest import make_harness
    from tests.sandbox_kit import ctx

    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + '\n[sources.crm]\nurl = "mysql://app:hunter2-secret@crm/db"\n'
                   '\n[sources.odd]\nurl = "sqlite:///data/none.sqlite"\ndescription = "missing file"\n')
    h = make_harness(home, ScriptedModel(then="ok"))
    described = asyncio.run(h.rt.tools.run("describe_source", "{}", ctx(h.rt)))  # the warehouse by default
    assert not described.is_error and "readings" in described.content and "warehouse (duckdb)" in described.content
    h.rt.users.add("root", ["demo"], ["admin"])
    token = h.rt.users.new_token("root")
    with TestClient(h.app()) as c:
        view = c.get("/api/workspace", headers={"Authorization": f"Bearer {token}"}).json()
        tid = c.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        c.post(f"/api/threads/{tid}/messages", json={"content": "hi"}, headers=h.auth("alice"))
    by_name = {s["name"]: s for s in view["sources"]}
    assert by_name["crm"]["state"] == "misconfigured" and "may not carry a password" in by_name["crm"]["reason"]
    assert by_name["odd"]["state"] == "down" and "does not exist" in by_name["odd"]["reason"]
    assert "hunter2-secret" not in str(view) and by_name["crm"]["config"]["url"] == "mysql://app:********@crm/db"
    system = h.rt.model.calls[0][0]["content"]
    assert "crm: MISCONFIGURED" in system and "odd (sqlite): missing file" in system
