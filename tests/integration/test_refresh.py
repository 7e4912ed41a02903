"""Refresh an analysis (threads/refresh.py, api/controllers/refresh.py): a real analysis thread
(the demo's offloaded SQL + python writing a report, run by the local sandbox); the warehouse
changes underneath; Refresh re-runs the query and the python in a fresh kernel, reports the row
and sum changes, keeps the old data and writes a new version of the report."""

from __future__ import annotations

import tempfile

import duckdb
import pyarrow.parquet as pq
import pytest

from datadesk.llm.demo import demo_model
from datadesk.llm.demo_plans import PLANS
from tests.conftest import make_harness, parse_sse

REPORT = "energy_through_the_year.md"


@pytest.fixture
def analysed(home):
    """alice's thread with the demo's first analysis (one SQL step, one python step writing a report)."""
    h = make_harness(home, demo_model(), sandbox={"backend": "local", "pool_size": 0, "exec_timeout_s": 90,
                                                  "memory_mb": 2048, "run_dir": tempfile.mkdtemp(prefix="ddr-")})
    with h.client(timeout=300) as api:
        events = api.turn(PLANS[0].question)
        assert events[-1][1]["status"] == "ok", events[-3:]
        api.aid = next(d["artifact"]["id"] for e, d in events
                       if e == "artifact.created" and d["artifact"]["format"] == "parquet")
        yield api


def _change_warehouse(h, home) -> None:
    h.rt.sources.get("demo").warehouse.close()  # its warm read-only connections, before a write
    con = duckdb.connect(str(home / "workspaces/demo/data/warehouse.duckdb"))
    con.execute("DELETE FROM readings WHERE building_id = 'B02' AND ts >= '2025-01-01'")
    con.close()




def test_refresh_reports_row_and_sum_changes_and_writes_a_new_report(analysed, home) -> None:
    api, h = analysed, analysed.h
    assert api.client.get(f"/api/threads/{api.tid}/refresh").status_code == 404  # never refreshed
    thread = h.rt.threads.get(api.tid, "alice", ["demo"])
    before = h.rt.artifacts.load(thread, api.aid)
    old_kwh = pq.read_table(h.rt.artifacts.data_path(thread, before)).column("kwh").to_pylist()
    _change_warehouse(h, home)

    r = api.client.post(f"/api/threads/{api.tid}/refresh")
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    kinds = [e for e, _ in events]
    assert kinds[0] == "refresh.started" and kinds[-2:] == ["refresh.completed", "done"]
    assert events[-1][1]["status"] == "ok"
    steps = [d for e, d in events if e == "refresh.step"]
    assert [(s["n"], s["kind"], s["status"]) for s in steps] == [
        (1, "query", "running"), (1, "query", "ok"), (2, "python", "running"), (2, "python", "ok")]
    report = events[-2][1]["report"]
    assert report["status"] == "ok" and report["changes"] == 1 and report["trigger"] == "user"

    query = report["steps"][0]
    change = query["change"]
    assert query["artifact"] == api.aid and change["changed"]
    assert change["rows_old"] == before.rows and change["rows_new"] == before.rows - 31
    kwh = next(s for s in change["sums"] if s["column"] == "kwh")
    assert kwh["old"] == pytest.approx(sum(old_kwh)) and kwh["new"] < kwh["old"]
    assert not change.get("columns_added") and not change.get("columns_removed")
    # the old data is kept as an artifact of its own; the new data is under the same id and path
    previous = h.rt.artifacts.load(thread, query["previous"])
    assert pq.read_table(h.rt.artifacts.data_path(thread, previous)).num_rows == before.rows
    now = h.rt.artifacts.load(thread, api.aid)
    assert now.rows == before.rows - 31 and now.sandbox_path == before.sandbox_path

    # the python step ran again on the new data, in a fresh kernel, and wrote a new report version
    python = report["steps"][1]
    out = next(o for o in python["outputs"] if o["file"] == REPORT)
    assert out["old"] and out["new"] and out["old"] != out["new"]
    old_md = api.client.get(f"/api/artifacts/{out['old']}/download").text
    new_md = api.client.get(f"/api/artifacts/{out['new']}/download").text
    assert f"{before.rows:,} building-days" in old_md and f"{before.rows - 31:,} building-days" in new_md

    # the report is kept, and the log ends with the refresh's records and its summary
    assert api.client.get(f"/api/threads/{api.tid}/refresh").json() == report
    records = api.client.get(f"/api/threads/{api.tid}").json()["records"]
    assert records[-1]["role"] == "assistant" and records[-1]["content"].startswith("**Refreshed** (1 change")
    assert f"rows {before.rows:,} -> {before.rows - 31:,}" in records[-1]["content"]
    assert (records[-1].get("meta") or {}).get("via") == "refresh"


def test_a_second_refresh_compares_with_the_first_and_plans_the_same_steps(analysed, home) -> None:
    api, h = analysed, analysed.h
    first = parse_sse(api.client.post(f"/api/threads/{api.tid}/refresh").text)[-2][1]["report"]
    assert first["changes"] == 0 and first["steps"][0]["summary"] == ["unchanged"]
    _change_warehouse(h, home)
    second = parse_sse(api.client.post(f"/api/threads/{api.tid}/refresh").text)[-2][1]["report"]
    assert len(second["steps"]) == 2 and second["changes"] == 1  # the refresh's own records are not re-planned
    out = next(o for o in second["steps"][1]["outputs"] if o["file"] == REPORT)
    first_out = next(o for o in first["steps"][1]["outputs"] if o["file"] == REPORT)
    assert out["old"] == first_out["new"]  # compared with the newest version


def test_refresh_refusals(analysed) -> None:
    api, h = analysed, analysed.h
    # a running turn (or refresh) holds the thread
    turn = h.rt.turns.reserve(api.tid, "alice")
    try:
        r = api.client.post(f"/api/threads/{api.tid}/refresh")
        assert r.status_code == 409, r.text
    finally:
        h.rt.turns.release(turn)
    # nothing saved to refresh
    empty = api.new_thread()
    r = api.client.post(f"/api/threads/{empty}/refresh")
    assert r.status_code == 400 and "no saved query result" in r.json()["error"]
    # another user's thread is not found; a bad id is refused
    assert api.client.post(f"/api/threads/{api.tid}/refresh", headers=h.auth("bob")).status_code == 404
    assert api.client.get(f"/api/threads/{api.tid}/refresh", headers=h.auth("bob")).status_code == 404
    assert api.client.post("/api/threads/bad..id/refresh").status_code in (400, 404)


def test_a_user_who_lost_the_permission_gets_a_failed_refresh_with_the_reason(analysed) -> None:
    api, h = analysed, analysed.h
    h.rt.users.update("alice", permissions=[])  # code_execution taken away after the analysis
    events = parse_sse(api.client.post(f"/api/threads/{api.tid}/refresh").text)
    report = events[-2][1]["report"]
    assert report["status"] == "failed" and events[-1][1]["status"] == "failed"
    assert report["steps"][0]["ok"] and not report["steps"][1]["ok"]
    assert "code_execution" in report["steps"][1]["error"] and "code_execution" in report["error"]
    assert any(e == "error" and d["kind"] == "refresh" for e, d in events)
