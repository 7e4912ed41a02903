"""Regression attacks on the endpoints added after issue 15's run (the grid, search, export, task
state, earlier records): two users over the real HTTP API; every bad input is a 4xx naming the
problem, never a 5xx, and nothing of one user's reaches the other."""

from __future__ import annotations

import json
import shutil
from urllib.parse import quote

import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel, tool_step
from tests.conftest import parse_sse
from tests.fakes.sandbox import FakeSandbox

pytestmark = pytest.mark.security

DEEP = "[" * 50_000 + "]" * 50_000  # past every JSON decoder's nesting limit


@pytest.fixture(scope="module")
def env(tmp_path_factory, demo_warehouse_dir):
    """alice has a thread with a query result (2,000 readings); bob (no permissions) has his own."""
    from datadesk.store.layout import Layout
    from datadesk.store.workspaces import ensure_demo_workspace
    from tests.conftest import make_harness

    home = tmp_path_factory.mktemp("secend") / "var"
    data = Layout(home).workspace_data_dir("demo")
    data.mkdir(parents=True)
    shutil.copy(demo_warehouse_dir / "warehouse.duckdb", data / "warehouse.duckdb")
    ensure_demo_workspace(Layout(home))
    model = ScriptedModel(then="ok")
    h = make_harness(home, model)
    FakeSandbox(h.rt)
    with TestClient(h.app(), raise_server_exceptions=False) as client:
        tid = client.post("/api/threads", json={"title": "Readings"}, headers=h.auth("alice")).json()["id"]
        model.steps.extend([tool_step("sql_query", {"sql": "SELECT * FROM readings LIMIT 2000"}), "done"])
        events = parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "go"},
                                       headers=h.auth("alice")).text)
        aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
        yield h, client, model, tid, aid


def _filter(value: object) -> str:
    return "filter=" + quote(value if isinstance(value, str) else json.dumps(value))


@pytest.mark.parametrize("endpoint", ["rows", "rows.csv"])
def test_a_grid_filter_nested_too_deep_is_a_400_naming_the_filter(env, endpoint) -> None:
    h, client, _, _, aid = env
    r = client.get(f"/api/artifacts/{aid}/{endpoint}?{_filter('[' * 2500 + ']' * 2500)}", headers=h.auth("alice"))
    assert r.status_code == 400, r.text
    assert r.json()["extra"]["param"] == "filter" and "JSON" in r.json()["error"]


def test_a_csv_of_a_view_whose_filter_value_does_not_fit_is_a_400_not_an_empty_download(env) -> None:
    h, client, _, _, aid = env
    bad = _filter([{"column": "kwh", "op": "=", "value": "abc"}])
    r = client.get(f"/api/artifacts/{aid}/rows.csv?{bad}", headers=h.auth("alice"))
    assert r.status_code == 400, (r.status_code, r.content[:200])
    assert "does not fit" in r.json()["error"] and "abc" in r.json()["error"]
    good = _filter([{"column": "kwh", "op": ">", "value": "0"}])
    r = client.get(f"/api/artifacts/{aid}/rows.csv?{good}", headers=h.auth("alice"))
    assert r.status_code == 200 and r.text.startswith('"building_id"') and r.text.count("\n") > 10


def test_a_model_tool_call_nested_too_deep_leaves_the_thread_readable(env) -> None:
    h, client, model, _, _ = env
    auth = h.auth("alice")
    tid = client.post("/api/threads", json={"title": "deep"}, headers=auth).json()["id"]
    model.steps.extend([tool_step("sql_query", '{"sql": "SELECT 1", "x": ' + DEEP + "}"), "answered anyway"])
    r = client.post(f"/api/threads/{tid}/messages", json={"content": "zebrafish"}, headers=auth)
    events = parse_sse(r.text)
    assert r.status_code == 200 and events[-1][0] == "done", r.text[:300]
    finished = next(d for e, d in events if e == "tool.finished")
    assert not finished["ok"] and "invalid arguments" in finished["preview"]
    assert client.get(f"/api/threads/{tid}", headers=auth).status_code == 200
    for fmt in ("md", "html", "ipynb", "zip"):
        r = client.get(f"/api/threads/{tid}/export?format={fmt}", headers=auth)
        assert r.status_code == 200, (fmt, r.text[:200])
    hits = client.get("/api/search?q=zebrafish", headers=auth).json()["results"]
    assert [x["thread"] for x in hits] == [tid]
