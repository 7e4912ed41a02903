"""The result grid's rows endpoint (issue 19): pages, sorts and filters of the full data match
DuckDB over the same file; every bad parameter is a 400 naming it; another user gets 404."""

from __future__ import annotations

import io
import json
import shutil
from urllib.parse import quote, urlencode

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel, tool_step
from tests.conftest import parse_sse
from tests.fakes.sandbox import FakeSandbox

N_READINGS = 190_560


@pytest.fixture(scope="module")
def grid_env(tmp_path_factory, demo_warehouse_dir, module_state_set):
    from datadesk.store.layout import Layout
    from datadesk.store.workspaces import ensure_demo_workspace
    from tests.conftest import make_harness

    home = tmp_path_factory.mktemp("grid") / "var"
    data = Layout(home).workspace_data_dir("demo")
    data.mkdir(parents=True)
    shutil.copy(demo_warehouse_dir / "warehouse.duckdb", data / "warehouse.duckdb")
    ensure_demo_workspace(Layout(home))
    model = ScriptedModel(then="ok")
    h = make_harness(home, model, state=module_state_set)
    FakeSandbox(h.rt)
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={"title": "Readings 2024"}, headers=h.auth("alice")).json()["id"]
        model.steps.extend([tool_step("sql_query", {"sql": "SELECT * FROM readings"}), "done"])
        events = parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "go"},
                                       headers=h.auth("alice")).text)
        aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
        raw = client.get(f"/api/artifacts/{aid}/download", headers=h.auth("alice")).content
        yield h, client, aid, pq.read_table(io.BytesIO(raw))


def rows(client, h, aid, user="alice", **params):
    q = []
    for k, v in params.items():
        if k == "filter":
            q.append((k, json.dumps(v)))
            continue
        for item in (v if isinstance(v, list) else [v]):
            q.append((k, item))
    return client.get(f"/api/artifacts/{aid}/rows?{urlencode(q)}", headers=h.auth(user))


def test_first_page_counts_types_and_nulls(grid_env) -> None:
    h, client, aid, tbl = grid_env
    r = rows(client, h, aid, limit="50")
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["rows"] == page["total_rows"] == N_READINGS and len(page["data"]) == 50
    cols = {c["name"]: c for c in page["columns"]}
    assert cols["kwh"]["kind"] == "number" and cols["ts"]["type"].startswith("TIMESTAMP")
    nulls = duckdb.sql("SELECT count(*) - count(kwh) FROM tbl").fetchall()[0][0]
    assert cols["kwh"]["nulls"] == nulls
    first = tbl.slice(0, 50).to_pylist()
    names = [c["name"] for c in page["columns"]]
    assert [dict(zip(names, row))["building_id"] for row in page["data"]] == [x["building_id"] for x in first]
    assert page["name"] == "readings_2024"


def test_sort_and_page_deep_match_duckdb(grid_env) -> None:
    h, client, aid, tbl = grid_env
    r = rows(client, h, aid, sort=["kwh:desc", "building_id"], offset="100000", limit="20")
    assert r.status_code == 200, r.text
    names = [c["name"] for c in r.json()["columns"]]
    got = [dict(zip(names, row))["kwh"] for row in r.json()["data"]]
    want = [x[0] for x in duckdb.sql("SELECT kwh FROM tbl ORDER BY kwh DESC NULLS LAST, building_id "
                                     "LIMIT 20 OFFSET 100000").fetchall()]
    assert got == pytest.approx(want)


@pytest.mark.parametrize("offset", [0, 95_000, 150_000, 190_555, 190_560])
def test_pages_past_the_middle_read_from_the_end_are_the_same(grid_env, offset) -> None:
    h, client, aid, tbl = grid_env
    r = rows(client, h, aid, sort=["kwh:desc", "occupancy:asc"], offset=str(offset), limit="10")
    names = [c["name"] for c in r.json()["columns"]]
    got = [(d[names.index("building_id")], d[names.index("ts")][:19]) for d in r.json()["data"]]
    want = duckdb.sql("SELECT building_id, strftime(ts, '%Y-%m-%d %H:%M:%S') FROM (SELECT *, row_number() OVER () AS n "
                      "FROM tbl) ORDER BY kwh DESC NULLS LAST, occupancy ASC NULLS LAST, n "
                      f"LIMIT 10 OFFSET {offset}").fetchall()
    assert got == [tuple(w) for w in want]


def test_filters_match_duckdb_and_sum_of_pages(grid_env) -> None:
    h, client, aid, tbl = grid_env
    filters = [{"column": "building_id", "op": "contains", "value": "b0"},
               {"column": "kwh", "op": ">", "value": "50"},
               {"column": "ts", "op": "<", "value": "2024-03-01"}]
    want_n, want_sum = duckdb.sql("SELECT count(*), sum(kwh) FROM tbl WHERE lower(building_id) LIKE '%b0%' "
                                  "AND kwh > 50 AND ts < TIMESTAMP '2024-03-01'").fetchall()[0]
    got_sum, offset, n = 0.0, 0, None
    while True:
        r = rows(client, h, aid, filter=filters, sort="kwh:asc", offset=str(offset), limit="1000")
        assert r.status_code == 200, r.text
        page = r.json()
        n = page["rows"]
        k = [c["name"] for c in page["columns"]].index("kwh")
        got_sum += sum(row[k] for row in page["data"])
        offset += len(page["data"])
        if offset >= n or not page["data"]:
            break
    assert n == want_n and offset == want_n
    assert got_sum == pytest.approx(want_sum)
    null = rows(client, h, aid, filter=[{"column": "kwh", "op": "is null"}]).json()
    assert null["rows"] == duckdb.sql("SELECT count(*) FROM tbl WHERE kwh IS NULL").fetchall()[0][0]
    eq = rows(client, h, aid, filter=[{"column": "building_id", "op": "=", "value": "B07"}]).json()
    assert eq["rows"] == duckdb.sql("SELECT count(*) FROM tbl WHERE building_id = 'B07'").fetchall()[0][0]


def test_csv_of_the_current_view(grid_env) -> None:
    h, client, aid, tbl = grid_env
    f = json.dumps([{"column": "building_id", "op": "=", "value": "B03"}])
    r = client.get(f"/api/artifacts/{aid}/rows.csv?sort=kwh:desc&filter={quote(f)}", headers=h.auth("alice"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert "filename=\"readings_2024_view.csv\"" in r.headers["content-disposition"]
    assert "filename*=UTF-8''readings_2024_view.csv" in r.headers["content-disposition"]
    lines = r.text.strip().splitlines()
    want = duckdb.sql("SELECT count(*), max(kwh) FROM tbl WHERE building_id = 'B03'").fetchall()[0]
    assert len(lines) == want[0] + 1 and lines[0].startswith('"building_id"')
    k = lines[0].split(",").index('"kwh"')
    assert float(lines[1].split(",")[k]) == pytest.approx(want[1])
    bad = quote(json.dumps([{"column": "kwh", "op": ">", "value": "much"}]))
    r = client.get(f"/api/artifacts/{aid}/rows.csv?filter={bad}", headers=h.auth("alice"))
    assert r.status_code == 400 and r.json()["error"].startswith("filter:")


@pytest.mark.parametrize("query, param", [
    ("offset=-1", "offset"), ("offset=abc", "offset"), ("limit=0", "limit"), ("limit=5000", "limit"),
    ("limit=1&limit=2", "limit"), ("sort=nope", "sort"), ("sort=kwh&sort=kwh:desc", "sort"),
    ("sort=a&sort=b&sort=c&sort=d", "sort"), ("filter=%5B", "filter"), ("filter=42", "filter"),
    ("filter=" + quote(json.dumps([{"column": "kwh", "op": "like", "value": "1"}])), "filter"),
    ("filter=" + quote(json.dumps([{"column": "kwh\"; DROP TABLE x; --", "op": "=", "value": "1"}])), "filter"),
    ("filter=" + quote(json.dumps([{"column": "kwh", "op": "<", "value": "many"}])), "filter"),
    ("filter=" + quote(json.dumps([{"column": "ts", "op": ">", "value": "yesterday-ish"}])), "filter"),
    ("filter=" + quote(json.dumps([{"column": "kwh", "op": "="}])), "filter"),
    ("where=1", "where"),
])
def test_bad_parameters_are_400_naming_them(grid_env, query, param) -> None:
    h, client, aid, _ = grid_env
    r = client.get(f"/api/artifacts/{aid}/rows?{query}", headers=h.auth("alice"))
    assert r.status_code == 400, (query, r.text)
    assert r.json()["error"].startswith(f"{param}:"), r.json()


def test_another_user_gets_404_and_non_tables_400(grid_env) -> None:
    h, client, aid, _ = grid_env
    assert rows(client, h, aid, user="bob").status_code == 404
    assert client.get(f"/api/artifacts/{aid}/rows.csv", headers=h.auth("bob")).status_code == 404
    assert client.get("/api/artifacts/nope/rows", headers=h.auth("alice")).status_code == 404
    assert client.get("/api/artifacts/..%2Fx/rows", headers=h.auth("alice")).status_code in (400, 404)
    assert client.get(f"/api/artifacts/{aid}/rows").status_code == 401


def test_odd_column_names_are_quoted(grid_env, tmp_path) -> None:
    from datadesk.offload.grid.pages import GridReader, GridView, Filter
    from datadesk.sources.sqllimits import SQLLimits

    path = tmp_path / "odd.parquet"
    pq.write_table(pa.table({'a"b': [3, 1, 2], "x'); DROP": ["p", None, "q"], "file_row_number": [7, 8, 9]}), path)
    reader = GridReader(SQLLimits(tmp_root=tmp_path / "sql"), timeout_s=10)
    cols = reader.columns(path)
    page = reader.page(path, cols, GridView(sort=(('a"b', False),), filters=(Filter("x'); DROP", "not null"),)), 0, 10)
    assert page["rows"] == 2 and [r[0] for r in page["data"]] == [2, 3]
    assert [c["nulls"] for c in page["columns"]] == [0, 0, 0]


def test_download_names_from_the_title_or_the_query(grid_env) -> None:
    from datadesk.api.controllers.artifacts import attachment_header, download_stem
    from datadesk.domain.artifacts import Artifact, ArtifactOrigin

    h, client, aid, _ = grid_env
    cd = client.get(f"/api/artifacts/{aid}/download?format=csv", headers=h.auth("alice")).headers["content-disposition"]
    assert cd == "attachment; filename=\"readings_2024.csv\"; filename*=UTF-8''readings_2024.csv"
    cd = client.get(f"/api/artifacts/{aid}/download", headers=h.auth("alice")).headers["content-disposition"]
    assert 'filename="readings_2024.parquet"' in cd

    def art(**origin):
        return Artifact(id="a1", kind="result", format="parquet", file="a1.parquet", created=0, last_used=0,
                        origin=ArtifactOrigin(source="tool", user="u", thread="t", workspace="w", **origin))

    sql = '{"sql": "SELECT * FROM main.readings WHERE ts >= \'2024-01-01\'"}'
    assert download_stem("New chat", art(tool="sql_query", arguments=sql)) == "readings_2024"
    assert download_stem("New chat", art(tool="mcp_x", arguments="{}")) == "mcp_x_result"
    assert download_stem("Q3 report", art(filename="Meter data (raw).xlsx")) == "Meter data (raw)"
    header = attachment_header('Énergie "2024" / ../etc', "csv", "a1")
    assert header.startswith('attachment; filename="energie_2024_etc.csv"')
    assert "filename*=UTF-8''%C3%A9nergie_2024" in header and "/" not in header.split("filename*=")[1]
    assert attachment_header("???", "csv", "a1").startswith('attachment; filename="a1.csv"')


def test_upload_warns_when_a_file_parses_into_suspiciously_few_rows(grid_env) -> None:
    h, client, _, _ = grid_env
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    broken = 'a,b,c\n1,2,"3\n' + "4,5,6\n" * 200  # an unclosed quote: the rest is one cell
    r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("broken.csv", broken.encode(), "text/csv")},
                    headers=h.auth("alice"))
    assert r.status_code == 201, r.text
    assert r.json()["artifact"]["rows"] <= 1 and "only 1 row" in r.json()["warning"], r.json()
    good = "region,amount\n" + "north,10\n" * 100
    r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("ok.csv", good.encode(), "text/csv")},
                    headers=h.auth("alice"))
    assert r.status_code == 201 and "warning" not in r.json()


def test_a_grid_query_takes_a_query_slot(grid_env) -> None:
    h, client, aid, _ = grid_env
    slots = h.rt.query_slots
    old = slots.wait_s
    slots.wait_s = 0.3
    held = slots.try_acquire("alice", "SQL query")
    try:
        assert held is not None
        r = rows(client, h, aid)
        assert r.status_code == 503 and "limits.sql_queries_per_user" in r.json()["error"], r.text
        assert client.get(f"/api/artifacts/{aid}/rows.csv", headers=h.auth("alice")).status_code == 503
    finally:
        held.release()
        slots.wait_s = old
    assert rows(client, h, aid).status_code == 200 and slots.running("alice") == 0
    r = client.get(f"/api/artifacts/{aid}/rows.csv", headers=h.auth("alice"))
    assert r.status_code == 200 and slots.running("alice") == 0  # the stream gave its slot back


def test_a_csv_the_code_wrote_opens_in_the_grid(grid_env) -> None:
    from datadesk.domain.artifacts import ArtifactOrigin

    h, client, _, _ = grid_env
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    handle = h.rt.threads.get(tid, "alice", ["demo"])
    body = "building,kwh,note\n" + "".join(f"B{i % 7:02d},{i * 1.5},{'x' if i % 3 else ''}\n" for i in range(500))
    origin = ArtifactOrigin(source="python", user="alice", thread=tid, workspace="demo", filename="daily.csv")
    art = h.rt.artifacts.save_bytes(handle, body.encode(), "csv", "deliverable", "text/csv", origin)
    page = rows(client, h, art.id, sort="kwh:desc", filter=[{"column": "building", "op": "=", "value": "B03"}],
                limit="5").json()
    assert page["rows"] == sum(1 for i in range(500) if i % 7 == 3)
    assert [r[1] for r in page["data"]] == sorted((i * 1.5 for i in range(500) if i % 7 == 3), reverse=True)[:5]
    assert {c["name"]: c["kind"] for c in page["columns"]} == {"building": "text", "kwh": "number", "note": "text"}
    assert client.get(f"/api/artifacts/{art.id}/rows.csv", headers=h.auth("alice")).text.count("\n") == 501
    txt = h.rt.artifacts.save_bytes(handle, b"hello", "txt", "deliverable", "text/plain", origin)
    r = rows(client, h, txt.id)
    assert r.status_code == 400 and "not a table" in r.json()["error"]
