"""MCP through the whole product: a real third-party server (mcp-server-duckdb) and our own
fake server, configured in workspace.toml, driven by the real OpenAI client via the HTTP API."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import httpx
import pyarrow.parquet as pq
import pytest

from datadesk.llm.client import OpenAIChatModel
from datadesk.llm.tokens import count_tokens
from datadesk.settings import LLMSettings
from datadesk.store.layout import Layout
from tests.conftest import parse_sse, serve_app
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.sandbox import FakeSandbox
from tests.integration.test_mcp import _duckdb_server_command, duckdb_server_missing

ROOT = Path(__file__).resolve().parents[2]


def llm(server: FakeOpenAIServer) -> OpenAIChatModel:
    return OpenAIChatModel(LLMSettings(base_url=server.base_url, api_key="k", model="fake-model",
                                       retry_backoff_s=0.01))


def add_mcp(home: Path, toml: str) -> None:
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + "\n" + toml)


def test_mcp_server_duckdb_result_is_offloaded(harness_factory, home: Path) -> None:
    cmd = _duckdb_server_command()
    if cmd is None:
        duckdb_server_missing("is not installed")
    db = Layout(home).workspace_data_dir("demo") / "mcp_sales.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE sales AS SELECT i::INTEGER AS id, 'customer ' || (i % 977) AS customer, "
                "(i * 0.25)::DOUBLE AS amount, DATE '2024-01-01' + (i % 365)::INTEGER AS day "
                "FROM range(200000) r(i)")
    expected_sum = con.execute("SELECT sum(amount) FROM sales").fetchone()[0]
    con.close()
    add_mcp(home, f'[mcp.duckdb]\ncommand = {json.dumps([*cmd, "--db-path", str(db), "--readonly"])}\n'
                  'read_only_tools = ["query"]\ntimeout_s = 120\nstartup_timeout_s = 60\n')
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "call_mcp", "name": "duckdb__query", "arguments": {"query": "SELECT * FROM sales"}}])
        fake.add_text("done")
        h = harness_factory(llm(fake))
        FakeSandbox(h.rt)
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=180) as c:
            state = [s for s in h.rt.mcp_status("demo") if s["name"] == "duckdb"][0]
            if state["state"] != "up":
                duckdb_server_missing(f"({' '.join(cmd)}) did not start: {state['last_error']}")
            tid = c.post("/api/threads", json={}).json()["id"]
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "all sales"}).text)
        tool_msg = next(m for m in fake.requests[1]["messages"] if m["role"] == "tool")["content"]
        assert "duckdb__query" in [t["function"]["name"] for t in fake.requests[0]["tools"]]
    art = next(d for e, d in events if e == "artifact.created")["artifact"]
    assert art["rows"] == 200_000
    table = pq.read_table(h.rt.threads.get(tid, "alice", ["demo"]).dir / "artifacts" / f"{art['id']}.parquet")
    assert table.num_rows == 200_000 and table.column("col_3").to_pandas().sum() == pytest.approx(expected_sum)
    assert count_tokens(tool_msg) < 2_000 and "NOT the full data" in tool_msg and "200,000" in tool_msg


def test_own_mcp_server_errors_images_and_masked_secrets(harness_factory, home: Path, monkeypatch,
                                                         caplog) -> None:
    monkeypatch.setenv("FAKE_TOKEN", "sk-live-SECRETVALUE123456")
    server = ROOT / "tests" / "fakes" / "mcp_server.py"
    add_mcp(home, f'[mcp.fake]\ncommand = {json.dumps([sys.executable, str(server)])}\n'
                  'env = { FAKE_TOKEN = "${env:FAKE_TOKEN}" }\ntimeout_s = 2\n')
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "c1", "name": "fake__fail", "arguments": {}},
                             {"id": "c2", "name": "fake__slow", "arguments": {"seconds": 10}},
                             {"id": "c3", "name": "fake__image", "arguments": {}},
                             {"id": "c4", "name": "fake__env", "arguments": {"name": "FAKE_TOKEN"}}])
        fake.add_text("done")
        h = harness_factory(llm(fake))
        h.rt.users.add("root", ["demo"], ["admin"])
        admin = {"Authorization": f"Bearer {h.rt.users.new_token('root')}"}
        with h.client(served=True, timeout=60) as api:
            c, tid = api.client, api.tid
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go"}).text)
            view = c.get("/api/workspace", headers=admin).text
    fins = {d["call_id"]: d for e, d in events if e == "tool.finished"}
    assert not fins["c1"]["ok"] and not fins["c2"]["ok"] and "2 s" in fins["c2"]["preview"]
    assert fins["c3"]["ok"] and fins["c3"]["meta"]["images"]
    assert events[-1][1]["status"] == "ok"
    assert "sk-live-SECRETVALUE123456" not in view and "${env:FAKE_TOKEN}" in view
    assert "sk-live-SECRETVALUE123456" not in caplog.text and "sk-live-abcdef123456" not in caplog.text
