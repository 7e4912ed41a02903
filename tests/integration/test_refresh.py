"""Refresh an analysis (threads/refresh.py, api/controllers/refresh.py): a real analysis thread
(the demo's offloaded SQL + python writing a report, run by the local sandbox); the warehouse
changes underneath; Refresh re-runs the query and the python in a fresh kernel, reports the row
and sum changes, keeps the old data and writes a new version of the report. Scheduled refreshes
(threads/scheduler.py) run on a faked clock: the test moves time and ticks the scheduler on the
app's own event loop, never sleeping."""

from __future__ import annotations

import asyncio
import io
import json
import re
import tempfile
import zipfile
from datetime import datetime, timezone

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
    # the scheduler's own loop stays off: the scheduler tests tick it themselves, on a faked clock
    h = make_harness(home, demo_model(), sandbox={"backend": "local", "pool_size": 0, "exec_timeout_s": 90,
                                                  "memory_mb": 2048, "run_dir": tempfile.mkdtemp(prefix="ddr-")},
                     refresh={"schedules": False})
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
    # the thread list's badge
    listed = next(t for t in api.client.get("/api/threads").json() if t["id"] == api.tid)
    assert listed["refreshed"]["changes"] == 1 and listed["refreshed"]["status"] == "ok"
    assert listed["refreshed"]["at"] == report["finished"]


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


def _utc(hh: int, mm: int) -> float:
    return datetime(2026, 12, 3, hh, mm, tzinfo=timezone.utc).timestamp()


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _tick(api) -> list[str]:
    """One scheduler tick on the app's loop, then wait for the refreshes it started."""
    sched = api.h.rt.scheduler

    async def tick_and_wait() -> list[str]:
        started = await sched.tick()
        await asyncio.gather(*(task for _, task in sched.running.values()))
        return started

    return api.client.blocking_portal.call(tick_and_wait)


def test_schedule_validation_and_lifecycle(analysed) -> None:
    api, h = analysed, analysed.h
    h.rt.scheduler.clock = FakeClock(_utc(6, 0))
    url = f"/api/threads/{api.tid}/schedule"
    assert api.client.get(url).status_code == 404
    r = api.client.put(url, json={"at": "7:75"})
    assert r.status_code == 400 and r.json()["error"].startswith("at: ")
    r = api.client.put(url, json={"cron": "0 7 * *"})
    assert r.status_code == 400 and "cron: has 4 fields" in r.json()["error"]
    r = api.client.put(url, json={"at": "07:30", "tz": "Nowhere/City"})
    assert r.status_code == 400 and r.json()["error"].startswith("tz: ")
    r = api.client.put(url, content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "body" in r.json()["error"]
    r = api.client.put(url, json={"cron": "0 7 * * 1-5", "tz": "UTC"})
    assert r.status_code == 200, r.text
    assert r.json()["cron"] == "0 7 * * 1-5" and r.json()["next_run"] == "2026-12-03T07:00+00:00"  # a Thursday
    assert api.client.put(url, json={"at": "07:30"}, headers=h.auth("bob")).status_code == 404
    assert api.client.delete(url).status_code == 204
    assert api.client.get(url).status_code == 404 and api.client.delete(url).status_code == 404


def test_a_scheduled_refresh_runs_once_when_due_as_the_owner(analysed, home) -> None:
    api, h = analysed, analysed.h
    clock = h.rt.scheduler.clock = FakeClock(_utc(7, 0))
    r = api.client.put(f"/api/threads/{api.tid}/schedule", json={"at": "07:30", "tz": "UTC"})
    assert r.status_code == 200 and r.json()["next_run"] == "2026-12-03T07:30+00:00"
    _change_warehouse(h, home)
    assert _tick(api) == []  # 07:00: not due yet
    clock.now = _utc(7, 31)
    assert _tick(api) == [api.tid]
    report = api.client.get(f"/api/threads/{api.tid}/refresh").json()
    assert report["trigger"] == "schedule" and report["status"] == "ok" and report["changes"] == 1
    sched = api.client.get(f"/api/threads/{api.tid}/schedule").json()
    assert sched["last_status"] == "ok" and sched["last_changes"] == 1
    assert sched["next_run"] == "2026-12-04T07:30+00:00"
    assert _tick(api) == []  # handled: not again today
    # a lock another host holds for this thread: that host runs it, this one does not
    clock.now = _utc(7, 31) + 86400
    lease = h.rt.scheduler.locks.try_acquire(f"refresh-schedule-{api.tid}")
    try:
        assert _tick(api) == [api.tid]
        assert api.client.get(f"/api/threads/{api.tid}/refresh").json()["id"] == report["id"]
    finally:
        lease.release()
    # missed days while the server was down are one run, not a burst
    clock.now = _utc(7, 31) + 5 * 86400
    assert _tick(api) == [api.tid] and _tick(api) == []
    sched = api.client.get(f"/api/threads/{api.tid}/schedule").json()
    assert sched["next_run"] == "2026-12-09T07:30+00:00"


def test_a_scheduled_refresh_of_a_user_who_lost_access_fails_with_the_reason(analysed) -> None:
    api, h = analysed, analysed.h
    clock = h.rt.scheduler.clock = FakeClock(_utc(7, 0))
    assert api.client.put(f"/api/threads/{api.tid}/schedule", json={"at": "07:30", "tz": "UTC"}).status_code == 200
    h.rt.users.update("alice", permissions=[])  # code_execution taken away
    clock.now = _utc(7, 31)
    assert _tick(api) == [api.tid]
    sched = api.client.get(f"/api/threads/{api.tid}/schedule").json()
    assert sched["last_status"] == "failed" and "code_execution" in sched["last_error"]
    h.rt.users.update("alice", workspaces=["sales"])  # the thread's workspace taken away
    clock.now = _utc(7, 31) + 86400
    assert _tick(api) == [api.tid]
    thread = h.rt.threads.get(api.tid, "alice", ["demo"])
    from datadesk.threads.scheduler import read_schedule
    sched = read_schedule(thread)
    assert sched.last_status == "failed" and "no longer has access to workspace demo" in sched.last_error


def _demo_results(texts) -> list[dict]:
    return [json.loads(m.group(1)) for t in texts for m in re.finditer(r"DEMO_RESULT (\{.*\})", t or "")]


def test_the_exported_notebook_rerun_on_the_changed_warehouse_gives_the_refresh_numbers(analysed, home,
                                                                                         tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    api, h = analysed, analysed.h
    r = api.client.get(f"/api/threads/{api.tid}/export", params={"format": "zip"})
    assert r.status_code == 200
    zipfile.ZipFile(io.BytesIO(r.content)).extractall(tmp_path)
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    _change_warehouse(h, home)
    report = parse_sse(api.client.post(f"/api/threads/{api.tid}/refresh").text)[-2][1]["report"]
    assert report["status"] == "ok"
    records = api.client.get(f"/api/threads/{api.tid}").json()["records"]
    refreshed = _demo_results([rec["content"] for rec in records if rec["role"] == "tool"
                               and (rec.get("meta") or {}).get("via") == "refresh"])
    original = _demo_results([rec["content"] for rec in records if rec["role"] == "tool"
                              and (rec.get("meta") or {}).get("via") != "refresh"])
    assert len(refreshed) == 1 and refreshed[0]["rows"] == original[0]["rows"] - 31

    monkeypatch.setenv("DATADESK_WAREHOUSE", str(home / "workspaces/demo/data/warehouse.duckdb"))
    nb = nbformat.read(folder / "notebook.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    ran = _demo_results(["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream")
                         for c in nb.cells if c.cell_type == "code"])
    assert ran == refreshed  # the python cell read its SQL cell's fresh result, not the saved file
    assert (folder / "data" / f"{api.aid}.parquet.exported").is_file()  # the exported data is kept


def test_the_notebook_of_a_refreshed_thread_holds_each_step_once_and_reruns_to_the_refreshed_numbers(
        analysed, home, tmp_path) -> None:
    """Exported AFTER a refresh: one cell per analysis step (no second copy from the refresh), its
    outputs those of the refresh; run from the bundle's data/ (no warehouse), it gives them again."""
    import nbformat
    from nbclient import NotebookClient

    api, h = analysed, analysed.h
    _change_warehouse(h, home)
    report = parse_sse(api.client.post(f"/api/threads/{api.tid}/refresh").text)[-2][1]["report"]
    assert report["status"] == "ok" and report["changes"] == 1
    records = api.client.get(f"/api/threads/{api.tid}").json()["records"]
    refreshed = _demo_results([rec["content"] for rec in records if rec["role"] == "tool"
                               and (rec.get("meta") or {}).get("via") == "refresh"])
    r = api.client.get(f"/api/threads/{api.tid}/export", params={"format": "zip"})
    assert r.status_code == 200
    zipfile.ZipFile(io.BytesIO(r.content)).extractall(tmp_path)
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    nb = nbformat.read(folder / "notebook.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"][1:]  # after the setup cell
    assert [("sql_result(" in c.source) for c in code] == [True, False]  # one SQL cell, one python cell
    assert "requery_artifact" not in json.dumps(nb)
    shown = _demo_results(["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream")
                           for c in code])
    assert shown == refreshed  # the outputs of the refresh's run
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    ran = _demo_results(["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream")
                         for c in nb.cells if c.cell_type == "code"])
    assert ran == refreshed  # data/ holds the refreshed artifact: the re-run matches what the cells show
