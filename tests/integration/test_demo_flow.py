"""The demo without an LLM (llm/demo.py), at the API: each suggested question runs for real on the
demo warehouse (an offloaded SQL result, python over the full artifact with a chart, a Markdown
report in /outputs) and the answer cites numbers that DuckDB confirms; an upload is profiled."""

from __future__ import annotations

import re
import shutil
import tempfile

import duckdb
import httpx
import pytest

from datadesk.llm.demo import demo_model
from datadesk.llm.demo_plans import PLANS, SUGGESTED_QUESTIONS
from datadesk.llm.scripted import DEMO_BANNER
from datadesk.store.users import UserStore
from tests.conftest import parse_sse


def _settings() -> dict:
    return {"backend": "local", "pool_size": 0, "run_dir": tempfile.mkdtemp(prefix="ddr-"),
            "exec_timeout_s": 90, "memory_mb": 2048}


def _turn(c: httpx.Client, tid: str, text: str) -> list[tuple[str, dict]]:
    r = c.post(f"/api/threads/{tid}/messages", json={"content": text}, timeout=300)
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    assert events[-1][0] == "done" and events[-1][1]["status"] == "ok", events[-3:]
    return events


def _finished(events, name: str) -> dict:
    return next(d for e, d in events if e == "tool.finished" and d["name"] == name)


@pytest.fixture
def demo(harness_factory):
    h = harness_factory(demo_model(), sandbox=_settings())
    with h.client(served=True, thread=False, timeout=120) as api:
        yield h, api.client


def test_suggested_questions_run_the_real_flow(demo, tmp_path) -> None:
    h, c = demo
    me = c.get("/api/me").json()
    assert me["model"]["demo"] and me["model"]["suggestions"] == SUGGESTED_QUESTIONS
    tid = c.post("/api/threads", json={}).json()["id"]
    copy = tmp_path / "warehouse.duckdb"  # the app's own connection has its settings: check on a copy
    shutil.copy(h.rt.layout.workspace_data_dir("demo") / "warehouse.duckdb", copy)
    warehouse = duckdb.connect(str(copy), read_only=True)
    answers = []
    for plan in PLANS:
        events = _turn(c, tid, plan.question)
        sql = _finished(events, "sql_query")
        [rec] = [r for r in c.get(f"/api/threads/{tid}").json()["records"] if r.get("tool_call_id") == sql["call_id"]]
        assert "artifact" in rec["meta"], rec
        art = rec["meta"]["artifact"]  # the large result was offloaded, not inlined
        expected_rows = warehouse.execute(f"SELECT count(*) FROM ({plan.sql})").fetchall()[0][0]
        assert art["rows"] == expected_rows > 200 and art["format"] == "parquet"
        py = _finished(events, "python")
        assert py["ok"] and py["meta"]["images"], py  # a chart
        reports = [f for f in py["meta"]["artifacts"] if f["format"] == "md"]
        assert reports and reports[0]["file"].endswith(".md")  # a report in /outputs
        report = c.get(f"/api/artifacts/{reports[0]['id']}/download").text
        assert report.startswith("# ") and "|" in report
        answer = [d for e, d in events if e == "message.completed"][-1]["content"]
        answers.append(answer)
        assert re.search(r"\d[\d,.]*", answer) and "DEMO_RESULT" not in answer
    # the numbers are the data's: DuckDB over the warehouse says the same
    rows = warehouse.execute("SELECT count(*) FROM readings").fetchall()[0][0]
    assert f"{rows:,}" in answers[2]
    total = warehouse.execute("SELECT sum(kwh) FROM readings").fetchall()[0][0]
    said = float(re.search(r"used \*\*([\d,]+) kWh", answers[0]).group(1).replace(",", ""))
    assert abs(said - total) < 50  # the sum of the daily sums (rounded to 0.01 kWh in SQL)
    assert "B07" in answers[3] and "2024-10-14" in answers[3]
    # labelled as a demo once: in the thread's first answer only
    records = c.get(f"/api/threads/{tid}").json()["records"]
    labelled = [r for r in records if r["role"] == "assistant" and DEMO_BANNER in (r.get("content") or "")]
    assert len(labelled) == 1


def test_an_upload_is_profiled_and_memory_is_on(demo) -> None:
    h, c = demo
    tid = c.post("/api/threads", json={}).json()["id"]
    csv = "city,kwh,temp\n" + "".join(f"C{i % 7},{i * 1.5},{(i % 30) - 5}\n" for i in range(1, 501))
    r = c.post(f"/api/threads/{tid}/uploads", files={"file": ("meters.csv", csv.encode(), "text/csv")})
    assert r.status_code == 201, r.text
    events = _turn(c, tid, "What is in it?")
    py = _finished(events, "python")
    assert py["ok"] and py["meta"]["images"]
    answer = [d for e, d in events if e == "message.completed"][-1]["content"]
    assert "meters.csv" in answer and "500 rows" in answer and "3 columns" in answer
    assert f"{sum(i * 1.5 for i in range(1, 501)) / 500:,.2f}" in answer  # mean kwh over the full file
    # a free question still gets a canned query, unlabelled after the first answer
    events = _turn(c, tid, "which city uses most")
    assert _finished(events, "sql_query")["ok"]
    assert DEMO_BANNER not in [d for e, d in events if e == "message.completed"][-1]["content"]


def test_serve_makes_the_demo_workspace_with_memory_on(tmp_path) -> None:
    """`datadesk serve` on a fresh data dir: memory is on in the demo workspace and the first admin
    may use it, so its panel shows no error."""
    from datadesk.cli import bootstrap
    from datadesk.memory.store import memory_access
    from datadesk.settings import load_settings
    from datadesk.store.workspaces import Workspaces

    settings = load_settings({"DATADESK_HOME": str(tmp_path / "var")})
    bootstrap(settings)
    from datadesk.store.layout import Layout

    layout = Layout(settings.home)
    cfg = Workspaces(layout).config("demo")
    [admin] = UserStore(layout).list()
    assert cfg.memory and memory_access(cfg.memory, admin.permissions, "demo") == (True, "")
