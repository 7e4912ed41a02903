"""The running app follows an edited `workspace.toml` (issue 31, the data panel): a source and a
view added while it serves show in `GET /api/workspace/catalog` and answer `sql_query`'s path, a
removed source is gone, an MCP server added is started and one removed is stopped, and a bad edit
keeps the last good config while the panel and the admin view name the file and the key."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from datadesk.llm.scripted import ScriptedModel
from datadesk.store.layout import Layout
from tests.dbkit import make_sqlite

ROOT = Path(__file__).resolve().parents[2]
LOCAL = '\n[sources.local]\nurl = "sqlite:///data/shop.sqlite"\ndescription = "A SQLite copy of the shop"\n'


def until(fetch, ok, timeout: float = 90.0):
    """`fetch()` again until `ok(value)` (the file is looked at once a second; an MCP server takes
    seconds to stop and start on a loaded machine), else fail with it."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never reached: {value}")
        time.sleep(0.1)


def rewrite(path: Path, text: str) -> None:
    path.write_text(text)


@pytest.fixture
def shop_home(home: Path) -> Path:
    make_sqlite(Layout(home).workspace_data_dir("demo") / "shop.sqlite", rows=30)
    return home


def test_sources_and_views_added_and_removed_while_serving(harness_factory, shop_home) -> None:
    cfg = Layout(shop_home).workspace_config("demo")
    original = cfg.read_text()
    h = harness_factory(ScriptedModel(then="ok"))
    with h.client(served=True, timeout=60) as api:
        catalog = lambda: api.client.get("/api/workspace/catalog").json()  # noqa: E731
        first = catalog()
        assert [s["name"] for s in first["sources"]] == ["warehouse"] and first["config_error"] is None

        (Layout(shop_home).workspace_data_dir("demo") / "targets.csv").write_text("region,target\nn,5\n")
        rewrite(cfg, original + LOCAL + '\n[views]\ntargets = "data/targets.csv"\n')
        view = until(catalog, lambda v: [s["name"] for s in v["sources"]] == ["warehouse", "local"])
        local = view["sources"][1]
        assert local["state"] == "ok" and local["description"] == "A SQLite copy of the shop"
        assert {"customers", "orders"} <= {t["name"] for t in local["tables"]}
        assert "targets" in {t["name"] for t in view["sources"][0]["tables"]}  # the new view
        sample = api.client.post("/api/workspace/catalog/sample", json={"source": "local", "table": "orders"})
        assert sample.status_code == 200 and sample.json()["row_count"] == 20

        rewrite(cfg, original)  # the source and the view removed
        view = until(catalog, lambda v: [s["name"] for s in v["sources"]] == ["warehouse"])
        assert "targets" not in {t["name"] for t in view["sources"][0]["tables"]}
        gone = api.client.post("/api/workspace/catalog/sample", json={"source": "local", "table": "orders"})
        assert gone.status_code == 400 and "no source 'local'" in gone.json()["detail"]


def test_bad_edit_keeps_serving_the_last_good_config_and_says_where(harness_factory, shop_home) -> None:
    cfg = Layout(shop_home).workspace_config("demo")
    rewrite(cfg, cfg.read_text() + LOCAL)
    good = cfg.read_text()
    h = harness_factory(ScriptedModel(then="ok"))
    h.rt.users.add("root", ["demo"], ["admin"])
    admin = {"Authorization": f"Bearer {h.rt.users.new_token('root')}"}
    with h.client(served=True, timeout=60) as api:
        catalog = lambda: api.client.get("/api/workspace/catalog").json()  # noqa: E731
        assert [s["name"] for s in catalog()["sources"]] == ["warehouse", "local"]
        rewrite(cfg, good.replace("[sources.local]", 'memory = "yes"\n[sources.local]'))  # not a boolean
        view = until(catalog, lambda v: v["config_error"] is not None)
        assert str(cfg) in view["config_error"] and "key 'memory'" in view["config_error"]
        assert [s["name"] for s in view["sources"]] == ["warehouse", "local"]  # the last good config
        assert view["sources"][1]["state"] == "ok"
        shown = api.client.get("/api/workspace", headers=admin).json()
        assert shown["config_error"] == view["config_error"] and shown["sources"][0]["name"] == "local"

        rewrite(cfg, good + '\n[mcp.broken]\ncommand = "not a list"\n')  # an MCP table the manager refuses
        view = until(catalog, lambda v: "mcp.broken" in (v["config_error"] or ""))
        assert h.rt.workspaces.config("demo").mcp == {} and view["mcp"] == []

        rewrite(cfg, "memory = true\n" + good)  # fixed (and one flag changed)
        until(catalog, lambda v: v["config_error"] is None)
        assert h.rt.workspaces.config("demo").memory is True


def test_mcp_servers_added_changed_and_removed_while_serving(harness_factory, shop_home) -> None:
    cfg = Layout(shop_home).workspace_config("demo")
    original = cfg.read_text()
    server = json.dumps([sys.executable, str(ROOT / "tests" / "fakes" / "mcp_server.py")])
    h = harness_factory(ScriptedModel(then="ok"))
    with h.client(served=True, timeout=60) as api:
        catalog = lambda: api.client.get("/api/workspace/catalog").json()  # noqa: E731
        assert catalog()["mcp"] == []
        rewrite(cfg, original + f"\n[mcp.fake]\ncommand = {server}\ntimeout_s = 5\n")
        view = until(catalog, lambda v: v["mcp"] and v["mcp"][0]["state"] == "up")
        tools = view["mcp"][0]["tools"]
        assert tools and all(t.startswith("fake__") for t in tools)
        assert h.rt.tools.get(tools[0], "demo") is not None
        first_config = h.rt.mcp_status("demo")[0]["config"]

        rewrite(cfg, original + f"\n[mcp.fake]\ncommand = {server}\ntimeout_s = 7\n")  # changed: restarted
        until(lambda: h.rt.mcp_status("demo"),
              lambda st: st and st[0]["state"] == "up" and st[0]["config"] != first_config)

        rewrite(cfg, original)  # removed: stopped, its tools gone
        until(catalog, lambda v: v["mcp"] == [])
        until(lambda: h.rt.tools.get(tools[0], "demo"), lambda tool: tool is None)  # once it has stopped
