"""workspace.toml: precise errors, views over files, tool permissions, skills, the admin view."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.store.layout import Layout
from datadesk.store.workspaces import WorkspaceConfigError, load_workspace
from tests.conftest import parse_sse


@pytest.mark.parametrize("text,needle", [
    ('prompt = "x"\nwarehous = "a.duckdb"\n', "warehous"),
    ('warehouse = "../other/x.duckdb"\n', "key 'warehouse'"),
    ('[views]\nsales = "/etc/passwd.csv"\n', "key 'views.sales'"),
    ('[views]\n"bad name" = "data/a.parquet"\n', "views.bad name"),
    ('[views]\nsales = "data/a.json"\n', ".parquet, .csv or .tsv"),
    ('[tool_permissions]\nsql_query = "root"\n', "key 'tool_permissions.sql_query'"),
    ('memory = "yes"\n', "memory"),
    ('prompt = """unterminated\n', "invalid TOML"),
    ('[mcp."bad/name"]\ncommand = ["x"]\n', "key 'mcp.bad/name'"),
])
def test_bad_workspace_files_name_the_file_and_key(tmp_path, text, needle) -> None:
    layout = Layout(tmp_path)
    path = layout.workspace_config("w1")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(WorkspaceConfigError) as err:
        load_workspace(layout, "w1")
    assert str(path) in str(err.value) and needle in str(err.value)


def test_views_over_parquet_and_csv_files_next_to_the_duckdb_tables(harness_factory, home) -> None:
    data = Layout(home).workspace_data_dir("demo")
    (data / "sales").mkdir()
    for i in range(3):
        pq.write_table(pa.table({"region": ["n", "s"], "amount": [i, 10 * i]}), data / "sales" / f"p{i}.parquet")
    (data / "targets.csv").write_text("region,target\nn,5\ns,50\n")
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + '\n[views]\nsales = "data/sales/*.parquet"\ntargets = "data/targets.csv"\n')
    h = harness_factory(ScriptedModel(then="ok"))
    wh = h.rt.sources.get("demo").get("warehouse")
    assert wh.query_sync("SELECT sum(amount) FROM sales").rows == [[33]]
    assert wh.query_sync("SELECT count(*) FROM readings").rows == [[190_560]]  # the DuckDB file too
    assert wh.query_sync("SELECT target FROM targets WHERE region = 's'").rows == [[50]]
    from datadesk.sources.errors import SQLError

    with pytest.raises(SQLError):
        wh.query_sync("SELECT * FROM read_text('/etc/passwd')")
    with pytest.raises(SQLError):
        wh.query_sync("CREATE TABLE x AS SELECT 1")


def test_skills_catalog_load_skill_and_tool_permissions(harness_factory, home) -> None:
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + '\n[tool_permissions]\nload_skill = "admin"\n')
    skill = Layout(home).workspace_dir("demo") / "skills" / "chart-style"
    (skill / "palette.txt").write_text("#1f4e79 #f28e2b")
    model = ScriptedModel([tool_step("load_skill", {"name": "monthly-energy-report"}), "ok",
                           tool_step("load_skill", {"name": "chart-style", "file": "palette.txt"}), "ok",
                           tool_step("load_skill", {"name": "chart-style", "file": "../../workspace.toml"}), "ok"])
    h = harness_factory(model)
    h.rt.users.add("root", ["demo"], ["admin"])
    token = h.rt.users.new_token("root")
    with TestClient(h.app()) as c:
        auth = {"Authorization": f"Bearer {token}"}
        tid = c.post("/api/threads", json={}, headers=auth).json()["id"]
        ev1 = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "report"}, headers=auth).text)
        ev2 = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "palette"}, headers=auth).text)
        ev3 = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "escape"}, headers=auth).text)
        bob_tid = c.post("/api/threads", json={}, headers=h.auth("bob")).json()["id"]
        c.post(f"/api/threads/{bob_tid}/messages", json={"content": "hi"}, headers=h.auth("bob"))
        view = c.get("/api/workspace", headers=auth).json()
        assert c.get("/api/workspace", headers=h.auth("bob")).status_code == 403
    system = model.calls[0][0]["content"]
    assert "## Skills" in system and "- chart-style: The house style for matplotlib charts" in system
    assert "holidays excluded" in system
    body = next(d for e, d in ev1 if e == "tool.finished")["preview"]
    assert "Exclude public holidays" in body and "palette" not in body
    assert "#1f4e79 #f28e2b" in next(d for e, d in ev2 if e == "tool.finished")["preview"]
    assert "plain name of a file" in next(d for e, d in ev3 if e == "tool.finished")["preview"]
    assert "load_skill" not in [t["function"]["name"] for t in model.tools_seen[-1]]  # bob is no admin
    assert {s["name"] for s in view["skills"]} == {"monthly-energy-report", "chart-style"}
    assert view["data"]["tables"] and view["tool_permissions"] == {"load_skill": "admin"}
    assert view["disk"]["min_free_mb"] == 100 and view["disk"]["low"] is False  # the admin sees the disk
