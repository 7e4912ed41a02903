"""Offload end to end: HTTP API, real OpenAI client, fake OpenAI server, real DuckDB, real Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import httpx
import msgspec
import pyarrow.parquet as pq
import pytest

from datadesk.llm.client import OpenAIChatModel
from datadesk.llm.tokens import count_tokens
from datadesk.settings import LLMSettings
from datadesk.tools.registry import ToolResult, ToolSpec
from tests.conftest import parse_sse, serve_app
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.sandbox import FakeSandbox


def llm(server: FakeOpenAIServer) -> OpenAIChatModel:
    return OpenAIChatModel(LLMSettings(base_url=server.base_url, api_key="k", model="fake-model",
                                       retry_backoff_s=0.01))


def one_call_turn(harness_factory, call: dict, user: str = "alice", healthy: bool = True, setup=None):
    """Run one turn in which the model makes `call`; returns (events, tool message, harness, tid)."""
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "call_1", **call}])
        fake.add_text("done")
        h = harness_factory(llm(fake))
        box = FakeSandbox(h.rt, healthy=healthy)
        if setup:
            setup(h)
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth(user), timeout=120) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go"}).text)
        tool_msg = next(m for m in fake.requests[1]["messages"] if m["role"] == "tool")
        assert box is not None
        return events, tool_msg["content"], h, tid


def thread_dir(h, user: str, tid: str) -> Path:
    return h.rt.threads.get(tid, user, ["demo", "sales"]).dir


def stored(h, user: str, tid: str, aid: str) -> tuple[dict, Path]:
    """An artifact as the runtime's store keeps it: its metadata (as its `<aid>.json` holds it)
    and a local file of its data (the thread's folder, or the host's cache of the object store)."""
    thread = h.rt.threads.get(tid, user, ["demo", "sales"])
    art = h.rt.artifacts.load(thread, aid)
    return msgspec.to_builtins(art), h.rt.artifacts.data_path(thread, art)


def test_full_table_becomes_parquet_with_duckdbs_own_numbers(harness_factory, home: Path) -> None:
    events, content, h, tid = one_call_turn(
        harness_factory, {"name": "sql_query", "arguments": {"sql": "SELECT * FROM readings"}})
    created = [d for e, d in events if e == "artifact.created"]
    assert len(created) == 1
    aid = created[0]["artifact"]["id"]
    finished = next(d for e, d in events if e == "tool.finished")
    assert finished["meta"]["artifact"]["id"] == aid
    meta, path = stored(h, "alice", tid, aid)
    assert path.name == f"{aid}.parquet"
    table = pq.read_table(path)
    con = duckdb.connect(str(home / "workspaces/demo/data/warehouse.duckdb"), read_only=True)
    n, kwh, occ = con.execute("SELECT count(*), sum(kwh), sum(occupancy) FROM readings").fetchone()
    con.close()
    assert table.num_rows == n == 190_560
    assert table.column("kwh").to_pandas().sum() == pytest.approx(kwh)
    assert int(table.column("occupancy").to_pandas().sum()) == occ
    assert str(table.schema.field("ts").type).startswith("timestamp")
    # what the model received instead of the rows
    assert count_tokens(content) < 2_000
    assert f"artifact {aid}" in content and f"/data/{aid}.parquet" in content
    assert "190,560" in content and "building_id" in content and "timestamp" in content
    assert "NOT the full data" in content and "read_parquet" in content
    assert content.count("\n| ") >= 10  # header + 10 preview rows
    assert meta["origin"] == {"source": "tool", "user": "alice", "thread": tid, "workspace": "demo",
                              "tool": "sql_query", "arguments": '{"sql": "SELECT * FROM readings"}',
                              "call_id": "call_1"}
    assert meta["status"] == "ready" and meta["rows"] == n and len(meta["sha256"]) == 64


def test_500_columns_stay_under_budget(harness_factory) -> None:
    cols = ", ".join(f"i * {k} AS column_with_a_long_name_{k}" for k in range(500))
    events, content, h, tid = one_call_turn(
        harness_factory, {"name": "sql_query", "arguments": {"sql": f"SELECT {cols} FROM range(300) t(i)"}})
    assert count_tokens(content) < 2_000
    assert "columns: 500" in content and "more columns" in content and "NOT the full data" in content


def test_deeply_nested_json_from_a_tool_stays_under_budget(harness_factory) -> None:
    def nested(depth: int, i: int):
        return {"id": i, "v": i * 1.5} if depth == 0 else {"level": depth, "child": nested(depth - 1, i),
                                                             "tags": [f"t{depth}", f"x{i}"]}

    payload = json.dumps([{"row": i, "doc": nested(12, i), "text": "lorem ipsum " * 30} for i in range(400)])

    def setup(h):
        async def fetch(args, ctx):
            return ToolResult(payload)
        h.rt.tools.register(ToolSpec(name="crm__export", description="export",
                                     parameters={"type": "object"}, read_only=True), fetch)

    events, content, h, tid = one_call_turn(harness_factory, {"name": "crm__export", "arguments": {}},
                                            setup=setup)
    assert count_tokens(content) < 2_000
    assert "rows: 400" in content and "struct" in content and "NOT the full data" in content
    aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    table = pq.read_table(stored(h, "alice", tid, aid)[1])
    assert table.num_rows == 400


@pytest.mark.parametrize("user,healthy,reason", [
    ("bob", True, "code_execution permission"),
    ("alice", False, "sandbox is down"),
])
def test_no_code_execution_or_sandbox_down_gets_truncated_form(harness_factory, user, healthy, reason) -> None:
    events, content, h, tid = one_call_turn(
        harness_factory, {"name": "sql_query", "arguments": {"sql": "SELECT * FROM readings"}},
        user=user, healthy=healthy)
    assert not [e for e, _ in events if e == "artifact.created"]
    assert "of 190,560 rows" in content and reason in content
    assert "narrow the query" in content and len(content) <= 8_000
    assert not h.rt.artifacts.list(h.rt.threads.get(tid, user, ["demo"]))
    adir = thread_dir(h, user, tid) / "artifacts"
    assert not adir.exists() or not any(p.suffix in (".parquet", ".txt") for p in adir.iterdir())


def test_small_results_are_inline(harness_factory) -> None:
    events, content, h, tid = one_call_turn(
        harness_factory, {"name": "sql_query", "arguments": {"sql": "SELECT * FROM buildings"}})
    assert json.loads(content)["row_count"] == 20
    assert json.loads(content)["types"][0] == "VARCHAR"


def test_empty_results_say_zero_rows(harness_factory) -> None:
    events, content, h, tid = one_call_turn(
        harness_factory, {"name": "sql_query", "arguments": {"sql": "SELECT * FROM readings WHERE kwh < -1"}})
    assert json.loads(content)["row_count"] == 0
    assert not [e for e, _ in events if e == "artifact.created"]


def test_stop_during_a_large_offload_leaves_no_artifact_and_the_thread_works(harness_factory) -> None:
    """Stop while a 30 M-row result is being written (rows-written progress on the SSE stream):
    the call is recorded as cancelled, the writer stops, no metadata, no data and no temp file
    remain, and the next turn in the thread answers."""
    from datadesk.llm.scripted import ScriptedModel, tool_step
    from tests.integration.test_turn_control import SSEReader, records

    big = "SELECT range AS i, range * 0.5 AS x, 'name ' || range AS s FROM range(30000000)"
    h = harness_factory(ScriptedModel([tool_step("sql_query", {"sql": big}, call_id="c_big"),
                                       "second answer"]))
    FakeSandbox(h.rt)
    h.rt.offload.progress_interval_s = 0.05
    with h.client(served=True, timeout=60) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "all rows"}) as resp:
            sse = SSEReader(resp)
            sse.until("tool.progress")
            assert c.post(f"/api/threads/{tid}/cancel").json()["cancelled"] is True
            events = sse.rest()
        progress = [d for e, d in parse_sse("\n".join(sse.text)) if e == "tool.progress" and d.get("rows")]
        assert progress and 0 < progress[0]["rows"] < 30_000_000 and progress[0]["name"] == "sql_query"
        assert not [e for e, _ in events if e == "artifact.created"]
        adir = thread_dir(h, "alice", tid) / "artifacts"
        assert sorted(p.name for p in adir.iterdir() if p.name != ".lock") == []
        tool_rec = next(r for r in records(c, tid) if r["role"] == "tool")
        assert tool_rec["status"] == "cancelled"
        last = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "next"}).text)
        assert last[-1][1]["status"] == "ok"
        assert sorted(p.name for p in adir.iterdir() if p.name != ".lock") == []
