"""Sources against real servers: PostgreSQL 15 and MariaDB (started once per run by tests/dbkit.py)
and a SQLite file, through the real app: offload, read-only sessions, cancel and timeouts,
connection failures, credentials, per-user sessions and re-query drift."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.sources.errors import SQLCancelled, SQLError, SQLRefused, SQLTimeout
from datadesk.sources.query import QueryControl
from datadesk.sources.registry import SourceSet
from datadesk.store.layout import Layout
from tests.conftest import make_harness, parse_sse
from tests.dbkit import ROWS, free_port, make_side_effect_functions, maria_root, pg_superuser
from tests.fakes.sandbox import FakeSandbox
from tests.sandbox_kit import ctx

pytestmark = pytest.mark.databases

PG_COLS = "id, customer_id, amount, ratio, ts, day, paid, note, meta, ref, tags, wait"
MY_COLS = "id, customer_id, amount, ratio, ts, day, paid, note, meta"


def run_turn(home: Path, steps: list, user: str = "alice", **settings):
    """One turn of the real app with a scripted model; (events, harness, thread id)."""
    h = make_harness(home, ScriptedModel([*steps, "done"]), **settings)
    FakeSandbox(h.rt)  # the python tool is there and healthy: large results become artifacts
    with TestClient(h.app()) as c:
        tid = c.post("/api/threads", json={}, headers=h.auth(user)).json()["id"]
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go"},
                                  headers=h.auth(user)).text)
    return events, h, tid


def finished(events) -> dict:
    return next(d for e, d in events if e == "tool.finished")


def artifact_file(h, user: str, tid: str, events) -> Path:
    aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    return h.rt.threads.get(tid, user, ["demo", "sales"]).dir / "artifacts" / f"{aid}.parquet"


def db_truth(kind: str, pg, maria, sqlite_path: Path) -> tuple[int, Decimal, int, int]:
    """count, sum(amount), sum(id), count of paid rows, asked of the database itself."""
    sql = "SELECT count(*), sum(amount), sum(id), sum(CASE WHEN paid THEN 1 ELSE 0 END) FROM orders"
    if kind == "pg":
        out = pg_superuser(pg, sql).strip().split("|")
    elif kind == "maria":
        out = maria_root(maria, sql.replace("FROM orders", "FROM sales.orders")).strip().split("\t")
    else:
        con = sqlite3.connect(sqlite_path)
        out = [str(v) for v in con.execute(sql.replace("WHEN paid", "WHEN paid = 1")).fetchone()]
        con.close()
    return int(out[0]), Decimal(out[1]), int(out[2]), int(out[3])


@pytest.mark.parametrize("kind,source,sql", [
    ("pg", "sales", f"SELECT {PG_COLS} FROM orders"),
    ("maria", "shop", f"SELECT {MY_COLS} FROM orders"),
    ("sqlite", "local", "SELECT * FROM orders"),
])
def test_300k_rows_offloaded_with_count_types_and_sums_of_the_database(sources_home, pg, maria, kind, source,
                                                                        sql) -> None:
    events, h, tid = run_turn(sources_home, [tool_step("sql_query", {"sql": sql, "source": source})])
    done = finished(events)
    assert done["ok"], done
    path = artifact_file(h, "alice", tid, events)
    table = pq.read_table(path)
    n, amount, ids, paid = db_truth(kind, pg, maria, Layout(sources_home).workspace_data_dir("demo") / "shop.sqlite")
    assert table.num_rows == n == ROWS
    assert sum(table.column("id").to_pylist()) == ids
    got_amount = sum(v for v in table.column("amount").to_pylist())
    assert Decimal(str(got_amount)) == amount if kind != "sqlite" else got_amount == pytest.approx(float(amount))
    types = {f.name: str(f.type) for f in table.schema}
    if kind == "sqlite":
        assert types["id"] == "int64" and types["amount"] == "double" and types["note"] == "string"
        assert sum(table.column("paid").to_pylist()) == paid
        return
    assert sum(table.column("paid").to_pylist()) == paid and types["paid"] == "bool"
    assert types["amount"] == "decimal128(12, 2)" and types["day"] == "date32[day]"
    assert types["meta"] == "string" and json.loads(table.column("meta")[0].as_py())["k"] == 1
    if kind == "pg":
        assert types["ts"] == "timestamp[us, tz=UTC]" and types["ref"] == "string"
        assert types["tags"].startswith("list<") and types["wait"] == "duration[us]"
        row = table.slice(0, 1).to_pylist()[0]
        assert len(row["ref"]) == 36 and row["tags"] == ["a1", "b"] and row["wait"].total_seconds() == 60
    else:
        assert types["ts"] == "timestamp[us]" and types["customer_id"] == "int32"
    meta = json.loads(path.with_suffix(".json").read_text())
    assert json.loads(meta["origin"]["arguments"])["source"] == source and meta["rows"] == ROWS


@pytest.mark.parametrize("source,sql,refused_by", [
    ("sales", "INSERT INTO customers VALUES (999, 'x', 'DE')", "parser"),
    ("sales", "UPDATE customers SET name = 'x'", "parser"),
    ("sales", "CREATE TABLE t (a int)", "parser"),
    ("sales", "COPY (SELECT 1) TO PROGRAM 'touch /tmp/pwned'", "parser"),
    ("sales", "SELECT * FROM customers FOR UPDATE", "parser"),
    ("sales", "WITH gone AS (DELETE FROM customers RETURNING *) SELECT count(*) FROM gone", "parser"),
    ("sales", "SELECT set_config('default_transaction_read_only', 'off', false)", "parser"),
    ("sales", "SELECT bump()", "parser"),  # a user-defined function not in allow_functions
    ("sales_rw", "SELECT bump()", "session"),  # listed: the owner login runs it, the transaction stops it
    ("shop", "INSERT INTO customers VALUES (999, 'x', 'DE')", "parser"),
    ("shop", "SELECT * FROM customers FOR UPDATE", "parser"),
    ("shop", "SELECT bump()", "parser"),
    ("shop_rw", "SELECT bump()", "session"),
])
def test_writes_are_refused_by_the_parser_or_the_session(rw_sources_home, pg, maria, source, sql, refused_by) -> None:
    make_side_effect_functions(pg, maria)
    h = make_harness(rw_sources_home, ScriptedModel())
    src = h.rt.sources.get("demo").get(source)
    with pytest.raises(SQLError) as err:
        list(src.record_batches(sql, "alice"))
    if refused_by == "parser":
        assert isinstance(err.value, SQLRefused), err.value
    else:
        assert "read-only transaction" in str(err.value) or "READ ONLY transaction" in str(err.value), err.value
    assert pg_superuser(pg, "SELECT count(*) FROM customers").strip() == "100"
    assert maria_root(maria, "SELECT count(*) FROM sales.customers").strip() == "100"
    assert not Path("/tmp/pwned").exists()
    h.rt.sources.close()


def test_the_session_itself_is_read_only_when_the_check_is_bypassed(rw_sources_home) -> None:
    h = make_harness(rw_sources_home, ScriptedModel())
    for name, sql, needle in [("sales_rw", "DELETE FROM customers", "read-only"),
                              ("shop_rw", "DELETE FROM customers", "read only"),
                              ("local", "DELETE FROM customers", "readonly"),
                              # read-only logins: the transaction or the privileges refuse, whichever is first
                              ("sales", "DELETE FROM customers", "read-only|permission denied"),
                              ("shop", "DELETE FROM customers", "DELETE command denied")]:
        src = h.rt.sources.get("demo").get(name)
        session = src.pool.acquire("alice")
        with pytest.raises(Exception, match=f"(?i){needle}"):
            _schema, batches, _ = session.execute(sql, 100)
            list(batches)
        session.broken = True
        src.pool.release("alice", session)
    h.rt.sources.close()


# slow on purpose without a sleep function (the statement check refuses pg_sleep and SLEEP): ~1e10 rows
SLOW = {"sales": "SELECT count(*) AS slow FROM generate_series(1, 100000) a, generate_series(1, 100000) b",
        "shop": "SELECT COUNT(*) AS slow FROM seq_1_to_100000 a, seq_1_to_100000 b WHERE a.seq + b.seq > 0",
        "local": "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 2000000000) "
                 "SELECT count(*) FROM g"}


@pytest.mark.parametrize("source", ["sales", "shop", "local"])
def test_long_query_stopped_by_the_statement_timeout(sources_home, source) -> None:
    cfg = Layout(sources_home).workspace_config("demo")
    cfg.write_text(cfg.read_text().replace('description = "Orders and customers, EUR"',
                                           'description = "Orders and customers, EUR"\ntimeout_s = 1')
                   .replace('description = "The web shop (MariaDB)"', 'description = "The web shop (MariaDB)"\n'
                            'timeout_s = 1').replace('description = "A SQLite copy of the shop"',
                                                     'description = "A SQLite copy of the shop"\ntimeout_s = 1'))
    h = make_harness(sources_home, ScriptedModel())
    src = h.rt.sources.get("demo").get(source)
    start = time.monotonic()
    with pytest.raises(SQLTimeout, match="exceeded 1 s"):
        list(src.record_batches(SLOW[source], "alice"))
    assert time.monotonic() - start < 6
    with src.record_batches("SELECT 1 AS one", "alice") as stream:  # the source still answers
        assert [b.to_pylist() for b in stream] == [[{"one": 1}]]
    h.rt.sources.close()


@pytest.mark.parametrize("source", ["sales", "shop", "local"])
def test_stop_cancels_the_running_statement(sources_home, pg, maria, source) -> None:
    h = make_harness(sources_home, ScriptedModel())
    c = ctx(h.rt)

    async def stopped() -> float:
        task = asyncio.create_task(h.rt.tools.run("sql_query", json.dumps({"sql": SLOW[source], "source": source}), c))
        await asyncio.sleep(1.0)
        start = time.monotonic()
        task.cancel()  # what Stop does to the running tool call
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - start
    assert asyncio.run(stopped()) < 5
    if source == "sales":
        time.sleep(0.5)
        assert pg_superuser(pg, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT count(*) AS slow%' "
                                "AND state = 'active'").strip() == "0"
    if source == "shop":
        time.sleep(0.5)
        assert "AS slow" not in maria_root(maria, "SELECT info FROM information_schema.processlist")
    src = h.rt.sources.get("demo").get(source)
    control = QueryControl(30)
    threading.Timer(0.5, control.cancel).start()
    with pytest.raises(SQLCancelled):
        list(src.record_batches(SLOW[source], "alice", control=control))
    h.rt.sources.close()


def test_wrong_password_and_unreachable_host_are_clear_and_never_fatal(sources_home, pg, maria, monkeypatch) -> None:
    monkeypatch.setenv("DD_TEST_WRONG", "not-the-password-123")
    port = free_port()
    sources = SourceSet({
        "badpw": {"url": pg.url(), "password": "${env:DD_TEST_WRONG}"},
        "badmy": {"url": maria.url(), "password": "${env:DD_TEST_WRONG}"},
        "nohost": {"url": f"postgresql://analyst@127.0.0.1:{port}/sales", "password": "${env:DD_TEST_WRONG}"},
        "noenv": {"url": pg.url(), "password": "${env:DD_TEST_NOT_SET}"},
    }, sources_home, 30)
    expect = {"badpw": "password authentication failed", "badmy": "Access denied", "nohost": "Connection refused",
              "noenv": "DD_TEST_NOT_SET is not set"}
    for name, needle in expect.items():
        with pytest.raises(SQLError) as err:
            sources.get(name).record_batches("SELECT 1", "alice")
        assert needle in str(err.value) and "not-the-password-123" not in str(err.value), err.value
        assert sources.get(name).status()["state"] == "down"
    # through the app: the tool call fails with the reason, other sources keep working, no artifact
    cfg = Layout(sources_home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + f'\n[sources.gone]\nurl = "postgresql://analyst@127.0.0.1:{port}/x"\n')
    events, h, tid = run_turn(sources_home, [tool_step("sql_query", {"sql": "SELECT 1", "source": "gone"}),
                                             tool_step("sql_query", {"sql": "SELECT 2 AS two", "source": "sales"})])
    results = [d for e, d in events if e == "tool.finished"]
    assert not results[0]["ok"] and "Connection refused" in results[0]["preview"]
    assert results[1]["ok"] and "two" in results[1]["preview"]
    assert not [e for e, _ in events if e == "artifact.created"]


@pytest.mark.parametrize("source", ["sales", "shop"])
def test_connection_dropped_mid_stream_is_an_error_with_no_partial_artifact(sources_home, pg, maria,
                                                                            source) -> None:
    sql = {"sales": "SELECT o.id, o.amount, o.note FROM orders o, generate_series(1, 10)",
           "shop": "SELECT o.id, o.amount, o.note FROM orders o JOIN seq_1_to_10"}[source]
    stop = threading.Event()

    def killer() -> None:
        while not stop.is_set():
            if source == "sales":
                killed = pg_superuser(pg, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                                          "usename = 'analyst' AND query LIKE '%SELECT o.id%' AND state = 'active'")
                if killed.strip() not in ("", "0"):
                    return
            else:
                ids = maria_root(maria, "SELECT id FROM information_schema.processlist WHERE user = 'analyst' "
                                        "AND info LIKE 'SELECT o.id%'").split()
                if ids:
                    maria_root(maria, f"KILL CONNECTION {ids[0]}")
                    return
            time.sleep(0.05)
    thread = threading.Thread(target=killer)
    thread.start()
    try:
        events, h, tid = run_turn(sources_home, [tool_step("sql_query", {"sql": sql, "source": source})])
    finally:
        stop.set()
        thread.join()
    done = finished(events)
    assert not done["ok"] and "connection was lost" in done["preview"], done
    adir = h.rt.threads.get(tid, "alice", ["demo"]).dir / "artifacts"
    assert not [p for p in adir.iterdir()] if adir.exists() else True
    assert not [e for e, _ in events if e == "artifact.created"]


def test_two_users_never_share_a_session(sources_home) -> None:
    h = make_harness(sources_home, ScriptedModel())
    sources = h.rt.sources.get("demo")

    def one(source: str, user: str, sql: str):
        with sources.get(source).record_batches(sql, user) as stream:
            return [r for b in stream for r in b.to_pylist()][0]
    alice_pid = one("sales", "alice", "SELECT pg_backend_pid() AS pid")["pid"]
    bob_pid = one("sales", "bob", "SELECT pg_backend_pid() AS pid")["pid"]
    assert alice_pid != bob_pid and one("sales", "alice", "SELECT pg_backend_pid() AS pid")["pid"] == alice_pid
    assert one("shop", "alice", "SELECT @mine := 42 AS v")["v"] == 42
    assert one("shop", "bob", "SELECT @mine AS v")["v"] is None  # bob's session has no trace of alice's
    # nor does alice's next query: the session is reset after each one (COM_RESET_CONNECTION)
    assert one("shop", "alice", "SELECT @mine AS v")["v"] is None
    h.rt.sources.close()


def test_credentials_reach_no_file_no_api_response_and_no_kernel(sources_home, pg, maria) -> None:
    steps = [tool_step("sql_query", {"sql": "SELECT * FROM orders", "source": "sales"}),
             tool_step("sql_query", {"sql": "SELECT * FROM nope", "source": "shop"}),
             tool_step("describe_source", {"source": "sales"})]
    events, h, tid = run_turn(sources_home, steps)
    results = [d for e, d in events if e == "tool.finished"]
    assert results[0]["ok"] and not results[1]["ok"] and "customers" in results[2]["preview"]
    assert "public.orders" in results[2]["preview"] and "hidden." not in results[2]["preview"]  # schemas = ["public"]
    h.rt.users.add("root", ["demo"], ["admin"])
    token = h.rt.users.new_token("root")
    with TestClient(h.app()) as c:
        view = c.get("/api/workspace", headers={"Authorization": f"Bearer {token}"}).json()
    states = {s["name"]: s["state"] for s in view["sources"]}
    assert states == {"sales": "ok", "shop": "ok", "local": "ok"}
    secrets = [pg.password.encode(), maria.password.encode()]
    assert not any(s in json.dumps(view).encode() for s in secrets)
    leaks = [p for p in sources_home.rglob("*") if p.is_file() and any(s in p.read_bytes() for s in secrets)]
    assert leaks == []
    system = h.rt.model.calls[0][0]["content"] if hasattr(h.rt.model, "calls") else ""
    assert "sales (postgres): Orders and customers, EUR" in system and "shop (mysql)" in system


def test_no_kernel_sees_the_source_passwords(sources_home, pg) -> None:
    from tests.sandbox_kit import py, run_with, runtime_with_sandbox
    import tempfile

    rt = runtime_with_sandbox(sources_home, {"backend": "local", "pool_size": 0,
                                             "run_dir": tempfile.mkdtemp(prefix="ddr-"), "exec_timeout_s": 20})
    result = run_with(rt, lambda: py(rt, ctx(rt), "import os\nprint(dict(os.environ))"))
    assert not result.is_error, result.content
    assert pg.password not in result.content and "DD_TEST_PG_PASSWORD" not in result.content


def test_requery_reruns_on_the_same_source_and_reports_drift(sources_home, pg) -> None:
    pg_superuser(pg, "DROP TABLE IF EXISTS public.events; CREATE TABLE public.events AS SELECT g AS id, "
                     "'event ' || g AS label FROM generate_series(1, 5000) g; ALTER TABLE public.events OWNER TO owner")
    events, h, tid = run_turn(sources_home, [tool_step("sql_query", {"sql": "SELECT * FROM events ORDER BY id",
                                                                      "source": "sales"})])
    aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    pg_superuser(pg, "INSERT INTO public.events SELECT g, 'late ' || g FROM generate_series(5001, 5010) g")
    with TestClient(h.app()) as c:
        report = c.post(f"/api/artifacts/{aid}/requery", headers=h.auth("alice")).json()
    assert report["restored"] and report["rows_before"] == 5000 and report["rows_after"] == 5010
    assert report["changed"] and report["schema_equal"] and not report["content_equal"]


def test_errors_the_model_can_act_on(sources_home) -> None:
    h = make_harness(sources_home, ScriptedModel())
    sources = h.rt.sources.get("demo")
    with pytest.raises(SQLError, match="nearest: public.orders"):
        sources.get("sales").record_batches("SELECT * FROM ordrs", "alice")
    with pytest.raises(SQLError, match="nearest: sales.orders"):
        sources.get("shop").record_batches("SELECT * FROM ordrs", "alice")
    with pytest.raises(SQLError, match="syntax error \\(postgres dialect"):
        sources.get("sales").record_batches("SELEC 1", "alice")
    with pytest.raises(SQLError, match="no source 'nope' in this workspace; sources: warehouse, local, sales, shop"):
        sources.get("nope")
    h.rt.sources.close()


def test_partial_and_no_code_permission_truncation_work_as_for_the_warehouse(sources_home, pg) -> None:
    step = tool_step("sql_query", {"sql": f"SELECT {PG_COLS} FROM orders", "source": "sales"})
    events, h, tid = run_turn(sources_home, [step], offload={"result_max_bytes": 2_000_000})
    art = next(d for e, d in events if e == "artifact.created")["artifact"]
    meta = json.loads(artifact_file(h, "alice", tid, events).with_suffix(".json").read_text())
    assert meta["status"] == "partial" and 0 < meta["rows"] < ROWS and art["id"] == meta["id"]
    time.sleep(0.5)  # the rest of the statement was cancelled, not streamed to nobody
    assert pg_superuser(pg, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'analyst' AND state = 'active' "
                            "AND query LIKE '%FROM orders%'").strip() == "0"


def test_without_code_permission_a_large_result_is_cut_with_a_notice(sources_home) -> None:
    step = tool_step("sql_query", {"sql": f"SELECT {PG_COLS} FROM orders", "source": "sales"})
    events, h, tid = run_turn(sources_home, [step], user="bob")  # bob has no code_execution: no file
    done = finished(events)
    assert done["ok"] and not [e for e, _ in events if e == "artifact.created"]
    assert f"{ROWS:,}" in done["preview"] or str(ROWS) in done["preview"]


def test_no_log_line_carries_a_password(sources_home, pg, maria, caplog, monkeypatch) -> None:
    import logging

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("DD_TEST_MY_PASSWORD", maria.password + "-wrong")  # a failing login is logged too
    steps = [tool_step("sql_query", {"sql": "SELECT * FROM orders", "source": "sales"}),
             tool_step("sql_query", {"sql": "SELECT 1", "source": "shop"})]
    events, h, tid = run_turn(sources_home, steps)
    text = "\n".join(r.getMessage() for r in caplog.records) + json.dumps(events)
    assert "Access denied" in json.dumps(events)
    assert pg.password not in text and maria.password not in text


@pytest.mark.parametrize("source", ["sales", "shop"])
def test_the_session_statement_timeout_stops_a_statement_the_client_would_let_run(sources_home, pg, maria,
                                                                                  source) -> None:
    from datadesk.store.workspaces import load_workspace

    raw = load_workspace(Layout(sources_home), "demo").sources
    sources = SourceSet({source: {**raw[source], "timeout_s": 1}}, sources_home, 30, stream_timeout_s=1)
    src = sources.get(source)
    setting = {"sales": "SELECT current_setting('statement_timeout') AS t", "shop": "SELECT @@max_statement_time AS t"}
    with src.record_batches(setting[source], "alice") as stream:
        assert str(next(iter(stream)).column(0)[0].as_py()) in ("1s", "1", "1.0")
    start = time.monotonic()
    with pytest.raises(SQLTimeout, match="statement timeout of its session"):
        list(src.record_batches(SLOW[source], "alice", control=QueryControl(30)))  # no client deadline
    assert time.monotonic() - start < 6
    sources.close()


def test_schemas_bound_what_a_query_may_name(sources_home) -> None:
    h = make_harness(sources_home, ScriptedModel())
    src = h.rt.sources.get("demo").get("sales")
    with pytest.raises(SQLRefused, match="schema 'hidden' is not visible"):
        src.record_batches("SELECT * FROM hidden.secrets", "alice")
    with pytest.raises(SQLError, match="does not exist"):  # search_path is the visible schemas only
        src.record_batches("SELECT * FROM secrets", "alice")
    h.rt.sources.close()


def test_the_app_tries_each_source_at_start(sources_home, monkeypatch) -> None:
    monkeypatch.setenv("DD_TEST_MY_PASSWORD", "wrong-on-purpose")
    h = make_harness(sources_home, ScriptedModel())
    with TestClient(h.app()):  # app start: each source is tried once in the background
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and h.rt.sources.get("demo").get("shop").status()["state"] == "unknown":
            time.sleep(0.1)
        states = {s["name"]: s["state"] for s in h.rt.sources.get("demo").statuses()}
        prompt = h.rt.sources.get("demo").prompt_text()
    assert states == {"sales": "ok", "shop": "down", "local": "ok"}
    assert "shop (mysql): The web shop (MariaDB) — DOWN at the last attempt" in prompt and "Access denied" in prompt
