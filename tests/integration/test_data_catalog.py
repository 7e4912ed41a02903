"""The data panel's API: `GET /api/workspace/catalog` (warehouse tables with DuckDB comments and
estimates, a SQLite source, a down PostgreSQL source with its reason and no secret, an MCP server
over stdio) and `POST /api/workspace/catalog/sample` (through query slots, read-only check and
audit; table names only from the catalogue)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import duckdb
import pytest

from datadesk.audit import AuditFilter
from datadesk.llm.scripted import ScriptedModel
from datadesk.store.layout import Layout
from tests.dbkit import make_sqlite

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pw-SECRET-4711-xyz"


@pytest.fixture
def panel_home(home: Path, monkeypatch) -> Path:
    layout = Layout(home)
    data = layout.workspace_data_dir("demo")
    con = duckdb.connect(str(data / "warehouse.duckdb"))
    con.execute("COMMENT ON TABLE readings IS 'Hourly meter readings, kWh'")
    con.close()
    make_sqlite(data / "shop.sqlite", rows=500)
    monkeypatch.setenv("GONE_PW", SECRET)
    server = ROOT / "tests" / "fakes" / "mcp_server.py"
    cfg = layout.workspace_config("demo")
    cfg.write_text(cfg.read_text() + f'''
[sources.local]
url = "sqlite:///data/shop.sqlite"
description = "A SQLite copy of the shop"

[sources.gone]
url = "postgresql://reader@127.0.0.1:9/nowhere"
password = "${{env:GONE_PW}}"
description = "An archive that is switched off"
timeout_s = 2

[sources.leaky]
url = "postgresql://reader:{SECRET}@127.0.0.1:9/nowhere"

[mcp.fake]
command = {json.dumps([sys.executable, str(server)])}
timeout_s = 5
''')
    return home


def catalog_with_mcp_up(c) -> dict:
    for _ in range(200):  # the MCP server starts with the app; its tools are listed once it is up
        view = c.get("/api/workspace/catalog").json()
        if view["mcp"] and view["mcp"][0]["state"] == "up":
            return view
        asyncio.run(asyncio.sleep(0.1))
    raise AssertionError(f"the MCP server never came up: {view['mcp']}")


def test_catalog_lists_tables_sources_and_mcp_with_state(harness_factory, panel_home) -> None:
    h = harness_factory(ScriptedModel(then="ok"))
    with h.client(served=True, timeout=60) as api:
        view = catalog_with_mcp_up(api.client)
        text = api.client.get("/api/workspace/catalog").text
    by = {s["name"]: s for s in view["sources"]}
    assert list(by)[0] == "warehouse" and set(by) == {"warehouse", "gone", "leaky", "local"}
    readings = next(t for t in by["warehouse"]["tables"] if t["name"] == "readings")
    assert readings["comment"] == "Hourly meter readings, kWh"
    assert readings["row_estimate"] and readings["columns"] and all(c["type"] for c in readings["columns"])
    local = by["local"]
    assert local["state"] == "ok" and local["description"] == "A SQLite copy of the shop"
    orders = next(t for t in local["tables"] if t["name"] == "orders")
    assert [c["name"] for c in orders["columns"]][:3] == ["id", "customer_id", "amount"]
    gone = by["gone"]
    assert gone["state"] == "down" and gone["reason"] and gone["tables"] == []
    assert gone["description"] == "An archive that is switched off"
    assert by["leaky"]["state"] == "misconfigured" and by["leaky"]["reason"]  # a password in its URL
    assert SECRET not in text
    assert view["mcp"][0]["name"] == "fake" and any(t.startswith("fake__") for t in view["mcp"][0]["tools"])


def test_sample_goes_through_audit_and_validates_names(harness_factory, panel_home) -> None:
    h = harness_factory(ScriptedModel(then="ok"))
    with h.client() as api:
        c = api.client
        ok = c.post("/api/workspace/catalog/sample", json={"source": "local", "table": "orders"})
        wh = c.post("/api/workspace/catalog/sample", json={"table": "readings"})
        bad = c.post("/api/workspace/catalog/sample", json={"source": "local", "table": "orders; DROP TABLE x"})
        nosrc = c.post("/api/workspace/catalog/sample", json={"source": "nope", "table": "orders"})
        empty = c.post("/api/workspace/catalog/sample", json={"source": "local", "table": " "})
        down = c.post("/api/workspace/catalog/sample", json={"source": "gone", "table": "x"})
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["row_count"] == 20 and len(body["rows"]) == 20 and body["columns"][:2] == ["id", "customer_id"]
    assert wh.status_code == 200 and wh.json()["row_count"] == 20
    assert bad.status_code == 400 and "no table 'orders; DROP TABLE x'" in bad.json()["detail"]
    assert "orders" in bad.json()["detail"]  # the tables it has are named
    assert nosrc.status_code == 400 and "no source 'nope'" in nosrc.json()["detail"]
    assert empty.status_code == 400 and "'table'" in empty.json()["detail"]
    assert down.status_code == 400 and "no table 'x'" in down.json()["detail"]
    assert "it lists no tables (down: " in down.json()["detail"]  # and why
    queries = h.rt.audit.page(AuditFilter(action="query", user="alice"), None, 100).entries
    mine = [(e.source, e.outcome, e.rows, e.thread) for e in queries if e.user == "alice"]
    assert ("local", "ok", 20, "data-panel") in mine and ("warehouse", "ok", 20, "data-panel") in mine
    assert len(mine) == 2  # refused names never reach a source, so they are not queries


def test_sample_takes_a_query_slot_of_the_user(harness_factory, panel_home) -> None:
    h = harness_factory(ScriptedModel(then="ok"), limits={"sql_queries_per_user": 1, "sql_queue_s": 0.01})
    with h.client() as api:
        held = asyncio.run(h.rt.query_slots.acquire("alice"))
        try:
            busy = api.client.post("/api/workspace/catalog/sample", json={"source": "local", "table": "orders"})
        finally:
            held.release()
        again = api.client.post("/api/workspace/catalog/sample", json={"source": "local", "table": "orders"})
    assert busy.status_code == 503 and "sql_queries_per_user" in busy.json()["detail"]
    assert again.status_code == 200
    outcomes = [e.outcome for e in h.rt.audit.page(AuditFilter(action="query", user="alice"), None, 100).entries
                if e.user == "alice"]
    assert sorted(outcomes) == ["ok", "refused"]


def test_only_what_the_user_may_query_is_listed(harness_factory, panel_home) -> None:
    cfg = Layout(panel_home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + '\n[tool_permissions]\nsql_query = "admin"\nfake__fail = "admin"\n')
    h = harness_factory(ScriptedModel(then="ok"))
    h.rt.users.add("root", ["demo"], ["admin"])
    admin = {"Authorization": f"Bearer {h.rt.users.new_token('root')}"}
    with h.client(served=True, timeout=60) as api:
        view = catalog_with_mcp_up(api.client)
        sample = api.client.post("/api/workspace/catalog/sample", json={"source": "local", "table": "orders"})
        as_admin = api.client.get("/api/workspace/catalog", headers=admin).json()
        other = api.client.get("/api/workspace/catalog?workspace=nope")
        bad_id = api.client.get("/api/workspace/catalog?workspace=../x")
    assert view["sources"] == [] and sample.status_code == 400 and "may query" in sample.json()["detail"]
    tools = view["mcp"][0]["tools"]
    assert tools and "fake__fail" not in tools
    assert {s["name"] for s in as_admin["sources"]} == {"warehouse", "gone", "leaky", "local"}
    assert "fake__fail" in as_admin["mcp"][0]["tools"]
    assert other.status_code == 404 and bad_id.status_code == 400


class _SlowSource:
    """A source whose catalogue never answers in time (the panel's time bound)."""

    name, kind, dialect, description = "slow", "postgresql", "postgres", "a slow one"

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def describe(self) -> list:
        self.calls += 1
        self.release.wait(30)
        return []

    def status(self) -> dict:
        return {"state": "unknown", "description": self.description}


def test_introspection_is_time_bound_off_the_loop_and_cached() -> None:
    from datadesk.sources.datacatalog import DataCatalog

    class Set(list):
        broken: dict = {}

    slow = _SlowSource()
    sources = Set([slow])
    catalog = DataCatalog(ttl_s=60, timeout_s=0.2)

    async def twice() -> tuple:
        ticks = 0

        async def ticker() -> None:  # the loop keeps running while the catalogue is read
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.ensure_future(ticker())
        first = await catalog.sources("w", sources)
        second = await catalog.sources("w", sources)
        slow.release.set()  # the abandoned thread ends before the loop closes
        t.cancel()
        return first, second, ticks

    try:
        first, second, ticks = asyncio.run(twice())
    finally:
        slow.release.set()
    assert first[0]["state"] == "slow" and "0.2 s" in first[0]["reason"] and first[0]["tables"] == []
    assert second is first and slow.calls == 1 and ticks > 1
    catalog.clear("w")
