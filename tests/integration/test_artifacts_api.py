"""Artifacts over the API: isolation, download, re-query (tool and endpoint), uploads."""

from __future__ import annotations

import io
import json
from pathlib import Path

import duckdb
import openpyxl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.domain.tools import ToolResult, ToolSpec
from tests.conftest import parse_sse
from tests.fakes.sandbox import FakeSandbox

BIG = "SELECT * FROM readings WHERE building_id IN ('B01', 'B02')"


@pytest.fixture
def api(api):
    """The shared client (tests/conftest.py) with the stand-in python tool: results may be offloaded."""
    FakeSandbox(api.h.rt)
    return api


def turn(h, client, model, user: str, tid: str, *steps) -> list:
    model.steps.extend(steps)
    r = client.post(f"/api/threads/{tid}/messages", json={"content": "go"}, headers=h.auth(user))
    return parse_sse(r.text)


def make_artifact(h, client, model, user="alice", sql=BIG) -> tuple[str, str]:
    tid = client.post("/api/threads", json={}, headers=h.auth(user)).json()["id"]
    events = turn(h, client, model, user, tid, tool_step("sql_query", {"sql": sql}), "done")
    return tid, next(d for e, d in events if e == "artifact.created")["artifact"]["id"]


def test_list_get_and_download(api) -> None:
    h, client, model = api.h, api.client, api.model
    tid, aid = make_artifact(h, client, model)
    auth = h.auth("alice")
    listed = client.get(f"/api/threads/{tid}/artifacts", headers=auth).json()
    assert [a["id"] for a in listed] == [aid]
    one = client.get(f"/api/artifacts/{aid}", headers=auth).json()
    assert one["rows"] == 2 * 24 * 397 and one["status"] == "ready" and one["can_requery"]
    assert one["expires_at"] > one["created"] and one["sandbox_path"] == f"/data/{aid}.parquet"
    r = client.get(f"/api/artifacts/{aid}/download", headers=auth)
    assert r.status_code == 200 and r.headers["x-content-type-options"] == "nosniff"
    assert "attachment" in r.headers["content-disposition"] and r.headers["content-security-policy"] == "sandbox"
    assert pq.read_table(io.BytesIO(r.content)).num_rows == one["rows"]
    r = client.get(f"/api/artifacts/{aid}/download?format=csv", headers=auth)
    lines = r.text.strip().splitlines()
    assert lines[0].startswith('"building_id","ts"') and len(lines) == one["rows"] + 1
    assert client.get(f"/api/artifacts/{aid}/download?format=xml", headers=auth).status_code == 400


def test_another_user_cannot_see_list_or_download(api) -> None:
    h, client, model = api.h, api.client, api.model
    tid, aid = make_artifact(h, client, model)
    bob = h.auth("bob")
    assert client.get(f"/api/threads/{tid}/artifacts", headers=bob).status_code == 404
    assert client.get(f"/api/artifacts/{aid}", headers=bob).status_code == 404
    assert client.get(f"/api/artifacts/{aid}/download", headers=bob).status_code == 404
    assert client.post(f"/api/artifacts/{aid}/requery", headers=bob).status_code == 404
    assert client.get("/api/artifacts/..%2Fusers/download", headers=bob).status_code in (400, 404)
    # through bob's own thread, alice's artifact id reaches nothing either
    btid = client.post("/api/threads", json={}, headers=bob).json()["id"]
    events = turn(h, client, model, "bob", btid, tool_step("requery_artifact", {"artifact_id": aid}), "x")
    fin = next(d for e, d in events if e == "tool.finished")
    assert not fin["ok"] and f"no artifact '{aid}' in this thread" in fin["preview"]


def test_other_thread_of_the_same_user_cannot_requery_it(api) -> None:
    h, client, model = api.h, api.client, api.model
    tid, aid = make_artifact(h, client, model)
    other = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    events = turn(h, client, model, "alice", other, tool_step("requery_artifact", {"artifact_id": aid}), "x")
    assert "no artifact" in next(d for e, d in events if e == "tool.finished")["preview"]


def test_requery_restores_and_reports_changes(api, home: Path) -> None:
    h, client, model = api.h, api.client, api.model
    tid, aid = make_artifact(h, client, model)
    thread = h.rt.threads.get(tid, "alice", ["demo"])
    before = h.rt.artifacts.load(thread, aid)
    h.rt.artifacts.expire(thread, aid)
    r = client.get(f"/api/artifacts/{aid}/download", headers=h.auth("alice"))
    assert r.status_code == 410 and "requery_artifact" in r.json()["error"]
    # unchanged data: restored, same hash
    events = turn(h, client, model, "alice", tid, tool_step("requery_artifact", {"artifact_id": aid}), "x")
    report = json.loads(next(d for e, d in events if e == "tool.finished")["preview"])
    assert report["restored"] and not report["changed"] and report["rows_after"] == before.rows
    restored = h.rt.artifacts.load(thread, aid)
    assert restored.available and restored.file == f"{aid}.parquet"
    assert h.rt.artifacts.data_path(thread, restored).exists()  # its data is kept again
    # the warehouse changes underneath: the endpoint re-runs the query and reports it (in this
    # process, a read-write open needs the warehouse's warm read-only connections closed first)
    h.rt.sources.get("demo").warehouse.close()
    con = duckdb.connect(str(home / "workspaces/demo/data/warehouse.duckdb"))
    con.execute("DELETE FROM readings WHERE building_id = 'B02' AND ts >= '2025-01-01'")
    con.close()
    r = client.post(f"/api/artifacts/{aid}/requery", headers=h.auth("alice"))
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["changed"] and not rep["content_equal"] and rep["schema_equal"]
    assert rep["rows_after"] == before.rows - 31 * 24 and rep["original_time"] and rep["requeried_time"]
    records = client.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["records"]
    assert records[-2]["tool_calls"][0]["name"] == "requery_artifact"
    assert json.loads(records[-1]["content"])["rows_after"] == rep["rows_after"]


def test_non_read_only_tool_is_refused(api) -> None:
    h, client, model = api.h, api.client, api.model

    async def export(args, ctx):
        return ToolResult("line of text\n" * 2_000)

    h.rt.tools.register(ToolSpec(name="crm__send_and_export", description="not read-only",
                                 parameters={"type": "object"}, read_only=False), export)
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    events = turn(h, client, model, "alice", tid, tool_step("crm__send_and_export", {}), "x")
    aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    one = client.get(f"/api/artifacts/{aid}", headers=h.auth("alice")).json()
    assert one["format"] == "text" and not one["can_requery"]
    r = client.post(f"/api/artifacts/{aid}/requery", headers=h.auth("alice"))
    assert r.status_code == 400 and "not a read-only tool" in r.json()["error"]


def _upload(client, h, tid, name: str, data: bytes, user="alice"):
    return client.post(f"/api/threads/{tid}/uploads", files={"file": (name, data)}, headers=h.auth(user))


def _xlsx(sheets: dict[str, list[list]]) -> bytes:
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for name, rows in sheets.items():
        ws = wb.create_sheet(name)
        for row in rows:
            ws.append(row)
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def _parquet() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2, 3], "v": [0.5, None, 2.5]}), buf)
    return buf.getvalue()


@pytest.mark.parametrize("name,data,rows,first_col", [
    ("sales.csv", b"region,amount,day\nnorth,10,2024-01-01\nsouth,12.5,2024-01-02\n", 2, "region"),
    ("sales.txt", b"region\tamount\nnorth\t10\nsouth\t12\n", 2, "region"),  # TSV by content, not by name
    ("book.xlsx", _xlsx({"Q1": [["region", "amount"], ["north", 10], ["south", 12]]}), 2, "region"),
    ("data.bin", _parquet(), 3, "id"),
    ("items.json", json.dumps([{"a": 1, "b": "x"}, {"a": 2}]).encode(), 2, "a"),
], ids=["csv", "tsv", "xlsx", "parquet", "json"])
def test_uploads_of_each_format(api, name, data, rows, first_col) -> None:
    h, client, model = api.h, api.client, api.model
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    r = _upload(client, h, tid, name, data)
    assert r.status_code == 201, r.text
    art = r.json()["artifact"]
    assert art["rows"] == rows and art["schema"][0]["name"] == first_col and art["kind"] == "upload"
    assert art["origin"]["filename"] == name
    rec = client.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["records"][-1]
    assert rec["role"] == "user" and f"uploaded a file: {name}" in rec["content"]
    assert "NOT the full data" in rec["content"] and art["id"] in rec["content"]


def test_image_upload_is_kept_as_an_image(api) -> None:
    h, client, model = api.h, api.client, api.model
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    r = _upload(client, h, tid, "chart.png", png)
    assert r.status_code == 201 and r.json()["artifact"]["format"] == "png"
    rec = client.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["records"][-1]
    assert rec["meta"]["image"] is True


@pytest.mark.parametrize("name,data,needle", [
    ("bad.csv", b"a,b\n1,2\n3,4,5\n", "line 3"),
    # Windows-1252 is read (tests/integration/test_upload_dialects.py); bytes it cannot map are named
    ("latin.csv", b"name,city\nJos\x81,K\x8dln\n", "not cp1252 at byte"),
    ("empty.xlsx", _xlsx({"Data": []}), "Data"),
    ("old.xls", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 100, ".xlsx"),
    ("random.bin", bytes(range(256)) * 4, "unsupported"),
    ("notjson.json", b"[1, 2, oops", "JSON"),
    ("empty.csv", b"", "empty"),
], ids=["ragged-csv", "latin1", "empty-sheet", "xls", "binary", "bad-json", "empty"])
def test_bad_uploads_get_a_clear_error_and_leave_nothing(api, name, data, needle) -> None:
    h, client, model = api.h, api.client, api.model
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    r = _upload(client, h, tid, name, data)
    assert r.status_code == 400, r.text
    assert needle.lower() in r.json()["error"].lower()
    adir = h.rt.threads.get(tid, "alice", ["demo"]).artifacts_dir
    leftovers = [p.name for p in adir.iterdir() if p.name != ".lock"] if adir.exists() else []
    assert leftovers == []
    assert client.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["records"] == []


def test_upload_size_cap_and_not_multipart(harness_factory) -> None:
    h = harness_factory(ScriptedModel(), offload={"upload_max_bytes": 1_000})
    with h.client() as api:
        client, tid = api.client, api.tid
        r = _upload(client, h, tid, "big.csv", b"a,b\n" + b"1,2\n" * 1_000)
        assert r.status_code == 413 and "upload limit" in r.json()["error"]
        r = client.post(f"/api/threads/{tid}/uploads", json={"x": 1}, headers=h.auth("alice"))
        assert r.status_code == 400 and "multipart" in r.json()["error"]
        assert _upload(client, h, tid, "x.csv", b"a\n1\n", user="bob").status_code == 404
