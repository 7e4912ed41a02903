"""MCP answers of any size, and MCP errors the model can act on (issue 26).

Against our fake stdio server (tests/fakes/mcp_server.py, tool `table`: n rows x 10 columns as one
JSON text, written piece by piece):

- a 200,000-row answer (38 MB) is spooled to disk as it arrives (the spool file is seen while the
  call runs), located and unescaped there, and offloaded from the files into a typed artifact
  with the exact row count and sums; no temp file is left;
- a spooled answer past `limits.mcp_result_max_mb` is refused naming the setting;
- a cancelled call removes its spool file at once; the connection is kept;
- a server that is down (failed to start, crashed) answers calls naming it and why;
- an error answered as ordinary text (`Error: ...`, `no such column`, `Catalog Error:`, a
  traceback ...) is an error, also on the tool card; a table mentioning errors stays a table.

Plus the pieces on their own: the spooling line splitter, the unescaping at piece boundaries,
`error_text`. bench/mcp_large.py measures 1,000,000 rows (time and memory, before and after).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel
from datadesk.offload.pipeline import OffloadCapability
from datadesk.settings import SandboxSettings, Settings
from datadesk.tools.mcp import spool as spool_mod
from datadesk.tools.mcp.manager import MCPManager, MCPServerConfig
from datadesk.tools.mcp.results import error_text
from datadesk.tools.mcp.spool import SpooledAnswer
from datadesk.tools.mcp.framing import LineSplitter
from datadesk.tools.registry import ToolContext, ToolRegistry
from tests.fakes.mcp_bombs import FAKE_MCP, PeakRSS
from tests.integration.test_mcp import call, http_mcp, one, wait_for
from tests.integration.test_mcp import reader_ctx as ctx

WS = "demo"
MB = 1024 * 1024
N = 200_000


def temp_files(c: ToolContext) -> list[str]:
    adir = c.thread.artifacts_dir
    return sorted(p.name for p in adir.iterdir() if p.name.startswith(".")) if adir.is_dir() else []


class Seen:
    """The names of the temp files that appear in a folder while a block runs (polled)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.names, self._task = folder, set(), None

    async def _poll(self) -> None:
        while True:
            if self.folder.is_dir():
                self.names |= {p.name.split(".~")[0] for p in self.folder.iterdir() if p.name.startswith(".")}
            await asyncio.sleep(0.01)

    async def __aenter__(self) -> "Seen":
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._task.cancel()


# -- a large answer, spooled and offloaded ----------------------------------------------------------
def test_200k_rows_are_spooled_to_disk_and_offloaded_exactly(home: Path, tmp_path: Path) -> None:
    rt = Runtime(settings=Settings(home=home, sandbox=SandboxSettings(backend="none")), model=ScriptedModel())

    async def main() -> None:
        await rt.mcp.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=300)}, tmp_path)
        c = ctx(tmp_path)
        try:
            args = json.dumps({"n": N})
            with PeakRSS() as rss:
                async with Seen(c.thread.artifacts_dir) as seen:
                    result = await rt.tools.run("fake__table", args, c)
                    assert not result.is_error, result.content[:300]
                    assert result.table is not None and "spooled to disk: JSON array of objects" in result.content
                    spec = rt.tools.get("fake__table", WS).spec
                    outcome = await rt.offload.process(spec, result, c.thread, c.origin("tool", "fake__table", args),
                                                       OffloadCapability(True))
            # the answer went to disk: the raw line, then its unescaped text (never one string in memory)
            assert {".mcp-spool", ".mcp-text"} <= seen.names, seen.names
            assert temp_files(c) == []  # and both are gone
            art = outcome.artifact
            assert art is not None and art.status == "ready" and art.rows == N, outcome.result.content[:500]
            assert art.shape == "JSON array of objects"
            table = pq.read_table(c.thread.artifacts_dir / art.file)
            assert table.num_rows == N
            assert table.column_names == ["id", "name", "amount", "qty", "day", "ts", "paid", "region", "price",
                                          "code"]
            types = {f.name: str(f.type) for f in table.schema}
            assert types["id"] == "int64" and types["amount"] == "double" and types["paid"] == "bool"
            assert types["day"] == "date32[day]" and types["ts"].startswith("timestamp")
            assert pc.sum(table["id"]).as_py() == N * (N - 1) // 2
            assert pc.sum(table["amount"]).as_py() == sum(i * 0.25 for i in range(N))
            assert pc.sum(table["qty"]).as_py() == sum(i % 7 for i in range(N))
            assert pc.sum(table["price"]).as_py() == sum(i % 1000 + 0.5 for i in range(N))
            assert pc.sum(table["paid"].cast("int64")).as_py() == sum(1 for i in range(N) if i % 3 == 0)
            assert table["code"][N - 1].as_py() == f"C{N - 1:07d}"
            assert f"rows: {N:,}" in outcome.result.content
            print(f"\n{N:,} rows (38 MB) over MCP: peak RSS +{rss.growth_mb:.0f} MB")
            # the connection is kept: a small call right after
            r = await call(rt.tools, c, "fake__echo", text="next")
            assert (r.content, r.is_error) == ("next", False)
        finally:
            await rt.mcp.stop()

    asyncio.run(main())


def test_a_spooled_answer_past_the_limit_is_refused_naming_the_setting(tmp_path: Path) -> None:
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=20 * MB)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=120)}, tmp_path)
        c = ctx(tmp_path)
        try:
            async with Seen(c.thread.artifacts_dir) as seen:
                r = await call(reg, c, "fake__table", n=N)  # 38 MB
            assert r.is_error and ("the MCP server fake answered with more than 20 MB (limits.mcp_result_max_mb); "
                                   "ask it for less: filter, paginate or aggregate") in r.content, r.content
            assert ".mcp-spool" in seen.names and temp_files(c) == []
            r = await call(reg, c, "fake__table", n=10_000)  # 2 MB: in memory, as ever
            assert not r.is_error and len(json.loads(r.content)) == 10_000
            assert one(mgr.status(WS), "fake")["restarts"] == 0
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_a_cancelled_call_removes_its_spool_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="datadesk.mcp.fake")

    def line_ended() -> bool:  # the fake says so on stderr once it wrote the whole line
        return any(r.getMessage().startswith("table: ") for r in caplog.records if r.name == "datadesk.mcp.fake")

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=120)}, tmp_path)
        c = ctx(tmp_path)
        try:
            task = asyncio.create_task(call(reg, c, "fake__table", n=N, seconds=6))  # 38 MB over 6 s
            assert await wait_for(lambda: any(n.startswith(".mcp-spool") for n in temp_files(c)), 20, 0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await wait_for(lambda: temp_files(c) == [], 5, 0.02), temp_files(c)  # at once
            # the server still ends that line (its writes may not interleave with another answer's)
            assert await wait_for(line_ended, 60, 0.05)
            await asyncio.sleep(0.2)
            assert temp_files(c) == []  # the rest of the line was skipped, never spooled
            r = await call(reg, c, "fake__echo", text="after")
            assert (r.content, r.is_error) == ("after", False)
            assert one(mgr.status(WS), "fake")["restarts"] == 0
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_an_answer_the_disk_has_no_room_for_is_refused_naming_the_free_space(tmp_path: Path) -> None:
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, min_free_bytes=10**18)  # store.min_free_mb far above what any disk has
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=120)}, tmp_path)
        c = ctx(tmp_path)
        try:
            r = await call(reg, c, "fake__table", n=N)
            assert r.is_error and "the MCP server fake sent an answer too large to keep in memory that could not " \
                                  "be saved to disk (the disk has only" in r.content, r.content
            assert "below store.min_free_mb" in r.content and temp_files(c) == []
            r = await call(reg, c, "fake__echo", text="next")  # the connection is kept
            assert (r.content, r.is_error) == ("next", False)
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_http_answers_stay_bounded_in_memory(tmp_path: Path) -> None:
    """Over streamable HTTP the SDK holds an answer in memory: past 32 MB it is refused, whatever
    limits.mcp_result_max_mb (which spools stdio answers)."""

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)  # the default limit, 256 MB
        await mgr.start_workspace(WS, {"web": MCPServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout_s=60)},
                                  tmp_path)
        c = ctx(tmp_path)
        try:
            r = await call(reg, c, "web__big_text", mb=40)
            assert r.is_error and "answered with more than 32 MB (the most an MCP server over HTTP may send at " \
                                  "once, held in memory; limits.mcp_result_max_mb applies to stdio servers" in r.content
            r = await call(reg, c, "web__echo", text="next")
            assert (r.content, r.is_error) == ("next", False)
        finally:
            await mgr.stop()

    with http_mcp() as port:
        asyncio.run(main())


# -- a server that is down --------------------------------------------------------------------------
def test_a_server_that_failed_to_start_is_named_with_its_reason(tmp_path: Path) -> None:
    dying = [sys.executable, "-c", "import sys; sys.stderr.write('cannot open /data/shop.db: no such file\\n'); "
                                   "sys.exit(3)"]

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        await mgr.start_workspace(WS, {"shop": MCPServerConfig(command=dying, startup_timeout_s=10)}, tmp_path)
        c = ctx(tmp_path)
        try:
            st = one(mgr.status(WS), "shop")
            assert st["state"] == "down", st
            assert "exited with status 3" in st["last_error"] and "cannot open /data/shop.db" in st["last_error"], st
            r = await call(reg, c, "shop__read_query", query="SELECT 1")
            assert r.is_error and "unknown tool" not in r.content, r.content
            assert r.content.startswith("shop__read_query failed: the MCP server shop is down (")
            assert "exited with status 3" in r.content and "cannot open /data/shop.db: no such file" in r.content
            assert "its tools are unavailable" in r.content and "being restarted" in r.content
            r = await call(reg, c, "other__tool")  # no such server: as before
            assert "unknown tool 'other__tool'" in r.content
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_a_crashed_server_lists_its_tools_as_unavailable(tmp_path: Path) -> None:
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, allow_tools=["echo", "crash"])},
                                  tmp_path)
        c = ctx(tmp_path)
        try:
            assert one(mgr.status(WS), "fake")["unavailable_tools"] == []
            r = await call(reg, c, "fake__crash")
            assert r.is_error and "the MCP server fake is down" in r.content
            st = one(mgr.status(WS), "fake")
            if st["state"] != "up":  # it is restarted within a second or two
                assert sorted(st["unavailable_tools"]) == ["fake__crash", "fake__echo"], st
                r = await call(reg, c, "fake__echo", text="x")
                assert r.is_error and "the MCP server fake is down" in r.content and "unavailable" in r.content
            assert await wait_for(lambda: one(mgr.status(WS), "fake")["state"] == "up", 20)
            assert one(mgr.status(WS), "fake")["unavailable_tools"] == []
        finally:
            await mgr.stop()

    asyncio.run(main())


# -- errors given as ordinary text -------------------------------------------------------------------
ERRORS = [
    "Error: no such table: orders",
    "error: connection refused",
    "no such column: x",
    "Catalog Error: Table with name foo does not exist!\nDid you mean \"pg_tables\"?",
    "Binder Error: Referenced column \"x\" not found in FROM clause!",
    "Database error: Parser Error: syntax error at or near \"SELEC\"",
    "Traceback (most recent call last):\n  File \"server.py\", line 3, in run\nKeyError: 'x'",
    "sqlite3.OperationalError: no such table: t",
    "OperationalError('database is locked')",
    "ERROR:  syntax error at or near \"FORM\"\nLINE 1: SELECT * FORM t",
    'ERROR:  relation "sales" does not exist',
    "1054 (42S22): Unknown column 'x' in 'field list'",
    "(1146, \"Table 'shop.nope' doesn't exist\")",
    "Query failed: timeout",
    "Error executing tool read_query: near \"x\": syntax error",
    "Running the query...\nsyntax error at or near \"x\"",
    '{"error": "no such table: t"}',
    '{"success": false, "error": "Catalog Error: Table with name x does not exist!"}',
    '{"status": "error", "message": "permission denied for table t"}',
]
NOT_ERRORS = [
    "id,error,count\n1,timeout,3\n2,Error: disk,4\n",
    "| region | error rate |\n|---|---|\n| north | 0.1 |\n| south | Error: n/a |",
    '[{"id": 1, "error": "no such column: x"}, {"id": 2, "error": null}]',
    '{"rows": [{"error": "x"}], "status": "ok"}',
    "Mean squared error: 0.13 on 1,000 rows",
    "Error rate by region:\n| region | rate |\n|---|---|\n| north | 0.1 |",
    "[('Error: disk', 1), ('ok', 2)]",
    "The query returned 0 rows.",
    "x" * 10_000 + "\nTraceback (most recent call last):",  # a long text: only its start counts
]


@pytest.mark.parametrize("text", ERRORS)
def test_error_texts_are_errors(text: str) -> None:
    assert error_text(text), text


@pytest.mark.parametrize("text", NOT_ERRORS)
def test_tables_and_prose_that_mention_errors_are_not(text: str) -> None:
    assert error_text(text) is None, text


def test_error_text_results_reach_the_model_as_errors(tmp_path: Path) -> None:
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP)}, tmp_path)
        c = ctx(tmp_path)
        try:
            r = await call(reg, c, "fake__error_text", text="Catalog Error: Table with name foo does not exist!")
            assert r.is_error and r.content == ("fake__error_text failed: the MCP server fake answered with an "
                                                "error: Catalog Error: Table with name foo does not exist!")
            assert r.meta.mcp_server == "fake"
            r = await call(reg, c, "fake__fail")  # isError, the protocol's flag: named the same way
            assert r.is_error and r.content.startswith("fake__fail failed: the MCP server fake answered with an "
                                                       "error: ") and "failed on purpose" in r.content
            for text in NOT_ERRORS[:3]:
                r = await call(reg, c, "fake__error_text", text=text)
                assert not r.is_error and r.content == text
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_an_error_text_shows_as_an_error_on_the_tool_card(harness_factory, home: Path) -> None:
    from tests.fakes.openai_server import FakeOpenAIServer
    from tests.integration.test_mcp_e2e import add_mcp, llm

    add_mcp(home, f"[mcp.fake]\ncommand = {json.dumps(FAKE_MCP)}\n")
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "c1", "name": "fake__error_text", "arguments": {"text": "no such column: x"}},
                             {"id": "c2", "name": "shop__query", "arguments": {}}])
        fake.add_text("done")
        h = harness_factory(llm(fake))
        with h.client(served=True) as api:
            events = api.turn("go")
        to_model = [m["content"] for m in fake.requests[1]["messages"] if m["role"] == "tool"]
    fins = {d["call_id"]: d for e, d in events if e == "tool.finished"}
    assert fins["c1"]["ok"] is False, fins["c1"]
    assert "the MCP server fake answered with an error: no such column: x" in fins["c1"]["preview"]
    assert any("the MCP server fake answered with an error: no such column: x" in t for t in to_model), to_model
    assert fins["c2"]["ok"] is False and "unknown tool" in fins["c2"]["preview"]  # no server "shop" at all


# -- the pieces on their own -------------------------------------------------------------------------
def test_line_splitter_spools_a_long_response_and_holds_little(tmp_path: Path) -> None:
    opened: list[spool_mod.SpoolFile] = []

    def open_spool(head: bytes) -> spool_mod.SpoolFile | None:
        if b'"method"' in head[:40]:
            return None
        opened.append(spool_mod.SpoolFile(tmp_path, 7))
        return opened[-1]

    s = LineSplitter(10_000, spool_bytes=1_000, open_spool=open_spool, held_max=2_000)
    assert s.feed(b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"' + b"x" * 900) == []
    assert s.held > 900 and not opened
    assert s.feed(b"y" * 500) == [] and s.held == 0 and len(opened) == 1
    for _ in range(10):
        assert s.feed(b"z" * 500) == [] and s.held == 0
    events = s.feed(b'"}]}}\n{"jsonrpc":"2.0","id":8,"result":{}}\n')
    assert [k for k, _ in events] == ["spooled", "line"]
    assert events[0][1].path.read_bytes().endswith(b'z"}]}}') and events[0][1].size == opened[0].path.stat().st_size
    # past the limit: the spool file goes, the line is skipped and refused
    events = s.feed(b'{"jsonrpc":"2.0","id":9,"result":"' + b"q" * 11_000)
    assert [k for k, _ in events] == ["oversized"] and not opened[1].path.exists() and s.held == 0
    assert [k for k, _ in s.feed(b'"}\n')] == ["oversized_end"]
    # a message of the server's own is never spooled: held up to held_max, then skipped
    events = s.feed(b'{"jsonrpc":"2.0","method":"notifications/message","params":"' + b"m" * 1_500)
    assert events == [] and s.held > 1_500 and len(opened) == 2
    assert [k for k, _ in s.feed(b"m" * 600)] == ["oversized"]
    s.feed(b"\n")
    # a cancelled request's answer being spooled: dropped at once, nothing answered
    s.feed(b'{"jsonrpc":"2.0","id":7,"result":"' + b"c" * 1_200)
    assert len(opened) == 3 and opened[2].path.exists()
    assert s.abort(7) and not opened[2].path.exists()
    events = s.feed(b'c"}\n')  # the rest is skipped, already answered: the transport says nothing
    assert [k for k, _ in events] == ["oversized_end"] and events[0][1].answered


@pytest.mark.parametrize("piece", [5, 7, 11, 64])
def test_spooled_text_is_unescaped_exactly_across_piece_boundaries(tmp_path: Path, piece: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    text = ('[{"a": "x\\"y", "b": "é😀\\u00e9", "c": "\\n\\t\\\\", "d": "\u2028\ud7ff"}, ' * 40 + "\\\\\\" + '"]')
    line = json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"content": [{"type": "text", "text": text}],
                                                              "isError": False}}, ensure_ascii=piece % 2 == 0)
    path = tmp_path / "line.json"
    path.write_text(line, encoding="utf-8")
    monkeypatch.setattr(spool_mod, "_PIECE", piece)
    monkeypatch.setattr(spool_mod, "_SMALL_ITEM", 16)  # the text counts as large here
    answer = SpooledAnswer.open(path, path.stat().st_size)
    try:
        assert answer.rid == 3 and not answer.is_error and answer.items[0][0] == "text"
        out, size = answer.text_file(answer.items[0][1])
        assert out.read_text(encoding="utf-8") == text and size == len(text.encode("utf-8"))
    finally:
        answer.release()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())
