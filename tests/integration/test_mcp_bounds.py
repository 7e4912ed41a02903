"""MCP results are bounded in memory and time (issue 15, `limits.mcp_result_max_mb`, `timeout_s`).

Real MCP servers over stdio (tests/fakes/mcp_server.py, and its hand-written TypeScript-style mode
that puts the JSON-RPC id last) and over streamable HTTP (SSE and JSON bodies): a result past the
limit is refused with a ToolError naming the setting and how to narrow, this process's RSS grows
by less than twice the limit meanwhile, the connection is kept and the next call works; an endless
line ends in the timeout and a clean restart. Plus the bounded line reader on its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from datadesk.settings import LimitsSettings
from datadesk.tools.mcp.manager import MCPManager, MCPServerConfig
from datadesk.tools.mcp.framing import LineSplitter, scan_head, scan_tail
from datadesk.tools.registry import ToolRegistry
from tests.fakes.mcp_bombs import FAKE_MCP, PeakRSS, mcp_bomb_config
from tests.integration.test_mcp import call, ctx, http_mcp, one, wait_for

pytestmark = pytest.mark.security

WS = "demo"
MB = 1024 * 1024
REFUSAL = "answered with more than {mb} MB (limits.mcp_result_max_mb); ask it for less: filter, paginate or aggregate"


# -- the bounded line reader ------------------------------------------------------------------------
def test_line_splitter_holds_at_most_the_limit() -> None:
    s = LineSplitter(1000)
    assert s.feed(b'{"a":1}\n{"b"') == [("line", b'{"a":1}')]
    assert s.feed(b':2}\n\n  \n') == [("line", b'{"b":2}')]  # split across chunks; blank lines dropped
    assert s.partial_since is None
    events = s.feed(b'{"jsonrpc":"2.0","id":7,"result":"' + b"x" * 600)
    assert events == [] and s.partial_since is not None and s.held == 634
    events = s.feed(b"y" * 600)
    assert [k for k, _ in events] == ["oversized"] and s.held == 0
    big = events[0][1]
    assert big.head.startswith(b'{"jsonrpc":"2.0","id":7') and big.size == 1234
    for _ in range(1000):  # 10 MB more of the same line: nothing more is held
        assert s.feed(b"z" * 10_000) == [] and s.held == 0
    events = s.feed(b'tail","id":9}\n{"ok":1}\n')
    assert [k for k, _ in events] == ["oversized_end", "line"] and events[1][1] == b'{"ok":1}'
    assert big.size == 1234 + 10_000_000 + 13 and big.tail.endswith(b'tail","id":9}') and len(big.tail) <= 4096
    assert scan_head(big.head) == ("jsonrpc", 7)
    assert scan_tail(big.tail) == 9


def test_ids_found_in_head_or_tail_only_at_the_top_level() -> None:
    assert scan_head(b'{"jsonrpc": "2.0", "id": "r-1", "result": {"content"') == ("jsonrpc", "r-1")
    assert scan_head(b'{"result":{"content":[{"type":"text","id":3') == ("result", None)
    assert scan_head(b'{"jsonrpc":"2.0","method":"notifications/message","params"') == ("jsonrpc", None)
    assert scan_head(b'{"method":"x","id":4,"params":{') == ("method", 4)
    assert scan_head(b"garbage") == (None, None)
    assert scan_tail(b'xx"}]},"jsonrpc":"2.0","id":12}') == 12
    assert scan_tail(b'xx"}]},"id":12,"jsonrpc":"2.0"}\r') == 12
    assert scan_tail(b'xx","id":5}]}}') is None  # a nested "id" is not the message's
    assert scan_tail(b'xx\\"id\\":5}') is None  # nor one inside a string
    assert LimitsSettings().mcp_result_max_mb == 256


def test_parse_matches_the_sdk_and_returns_bad_lines_as_errors() -> None:
    import mcp_types as types

    from datadesk.tools.mcp.framing import parse_message

    lines = [b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":[1,2.5,null]}}}',
             b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"\\u00e9\\n\xc3\xa9"}}',
             b'{"result":{"content":[{"type":"text","text":"\\ud83d\\ude00 big 12345678901234567890"}]},'
             b'"jsonrpc":"2.0","id":"abc"}',
             b'{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"m","data":{"k":true}}}',
             b'{"jsonrpc":"2.0","id":8,"result":{"n":123456789012345678901234567890,"f":1e400}}']
    for line in lines:
        ours = parse_message(line)
        assert ours.message == types.jsonrpc_message_adapter.validate_json(line, by_name=False), line
    for bad in (b'{"jsonrpc":"2.0","id":1', b'\xff\xfe', b'{"jsonrpc":"1.0","id":1,"result":{}}', b"[1,2]"):
        assert isinstance(parse_message(bad), ValueError), bad


# -- stdio: the Python SDK's server (the id first) ----------------------------------------------------
def test_result_past_the_limit_is_refused_in_bounded_memory_and_the_next_call_works(tmp_path: Path) -> None:
    """Past 8 MB the answer goes to a spool file, past the limit (256 MB) that file goes and the
    call is refused at once; nothing of it is held in memory meanwhile."""
    limit = LimitsSettings().mcp_result_max_mb * MB
    bomb_mb = limit // MB + 24

    async def main() -> dict[str, Any]:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=limit)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=120)}, tmp_path)
        c = ctx(tmp_path)
        lag = 0.0
        stop = asyncio.Event()

        async def heartbeat() -> None:  # how long the event loop is held (another user's request)
            nonlocal lag
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                lag = max(lag, time.perf_counter() - t - 0.01)

        try:
            assert one(mgr.status(WS), "fake")["state"] == "up"
            beat = asyncio.create_task(heartbeat())
            with PeakRSS() as rss:
                t0 = time.perf_counter()
                r = await call(reg, c, "fake__big_text", mb=bomb_mb)
                refused_s = time.perf_counter() - t0
            stop.set()
            await beat
            assert r.is_error, r.content[:200]
            assert f"the MCP server fake {REFUSAL.format(mb=limit // MB)}" in r.content, r.content
            assert rss.growth_mb < 64, rss.growth_mb  # spooled to disk, then dropped: not memory
            assert not [p for p in c.thread.artifacts_dir.iterdir() if p.name.startswith(".")]
            # the connection is kept (no restart) and the next call works, also a large one
            r = await call(reg, c, "fake__echo", text="after the bomb")
            assert (r.content, r.is_error) == ("after the bomb", False)
            r = await call(reg, c, "fake__big_text", mb=20)
            assert not r.is_error and len(r.content) == 20 * MB
            st = one(mgr.status(WS), "fake")
            assert st["state"] == "up" and st["restarts"] == 0, st
        finally:
            await mgr.stop()
        return {"refused_s": refused_s, "rss_growth_mb": rss.growth_mb, "loop_lag_s": lag}

    numbers = asyncio.run(main())
    print(f"\n{bomb_mb} MB MCP result: refused in {numbers['refused_s']:.2f} s, peak RSS +{numbers['rss_growth_mb']:.0f} MB, "
          f"max event-loop lag {numbers['loop_lag_s'] * 1000:.0f} ms")


def test_just_under_the_limit_works_just_over_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=4 * MB)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=60)}, tmp_path)
        c = ctx(tmp_path)
        try:
            r = await call(reg, c, "fake__big_text", mb=4 - 0.001)  # the message: text + ~100 bytes
            assert not r.is_error and len(r.content) == int((4 - 0.001) * MB)
            r = await call(reg, c, "fake__big_text", mb=4)
            assert r.is_error and REFUSAL.format(mb=4) in r.content, r.content
            r = await call(reg, c, "fake__rows", n=3)
            assert not r.is_error and len(json.loads(r.content)) == 3
            assert one(mgr.status(WS), "fake")["restarts"] == 0
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_a_trickled_line_past_the_limit_is_refused_at_once(tmp_path: Path) -> None:
    """The head already names the request: refused while the line is still streaming; the line
    never ends, so past timeout_s the connection is closed and the server restarted."""
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=1 * MB)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=3)}, tmp_path)
        c = ctx(tmp_path)
        try:
            task = asyncio.create_task(call(reg, c, "fake__trickle", mb=4, seconds=2, finish=False))
            r = await asyncio.wait_for(task, 10)
            assert r.is_error and REFUSAL.format(mb=1) in r.content, r.content
            assert await wait_for(lambda: one(mgr.status(WS), "fake")["restarts"] >= 1, 20)
            assert await wait_for(lambda: one(mgr.status(WS), "fake")["state"] == "up", 20)
            r = await call(reg, c, "fake__echo", text="restarted")
            assert (r.content, r.is_error) == ("restarted", False)
        finally:
            await mgr.stop()

    asyncio.run(main())


def test_an_endless_line_under_the_limit_times_out_and_restarts(tmp_path: Path) -> None:
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=8 * MB)
        await mgr.start_workspace(WS, {"fake": MCPServerConfig(command=FAKE_MCP, timeout_s=2)}, tmp_path)
        c = ctx(tmp_path)
        try:
            with PeakRSS() as rss:
                r = await call(reg, c, "fake__trickle", mb=1, seconds=30, finish=False)
            assert r.is_error and "did not answer within 2 s (timeout_s of [mcp.fake])" in r.content, r.content
            assert rss.growth_mb < 16, rss.growth_mb
            assert await wait_for(lambda: one(mgr.status(WS), "fake")["restarts"] >= 1, 20)
            assert await wait_for(lambda: one(mgr.status(WS), "fake")["state"] == "up", 20)
            r = await call(reg, c, "fake__echo", text="next")
            assert (r.content, r.is_error) == ("next", False)
        finally:
            await mgr.stop()

    asyncio.run(main())


# -- stdio: a TypeScript-style server (the id last) ---------------------------------------------------
def test_id_last_response_is_refused_at_once_with_other_calls_pending(tmp_path: Path) -> None:
    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=2 * MB)
        cfg = MCPServerConfig(command=[*FAKE_MCP, "--raw-ts"], timeout_s=60)
        await mgr.start_workspace(WS, {"ts": cfg}, tmp_path)
        c = ctx(tmp_path)
        try:
            assert one(mgr.status(WS), "ts")["state"] == "up", mgr.status(WS)
            assert (await call(reg, c, "ts__echo", text="hi")).content == "hi"
            held = asyncio.create_task(call(reg, c, "ts__hold", seconds=8))  # pending meanwhile
            await asyncio.sleep(0.3)
            r = await call(reg, c, "ts__big_text", mb=20)
            assert r.is_error and f"the MCP server ts {REFUSAL.format(mb=2)}" in r.content, r.content
            assert not held.done()  # refused from the id at the end of the line, not by a timeout
            r = await call(reg, c, "ts__echo", text="still here")
            assert (r.content, r.is_error) == ("still here", False)
            r = await held
            assert (r.content, r.is_error) == ("held", False)
            assert one(mgr.status(WS), "ts")["restarts"] == 0
        finally:
            await mgr.stop()

    asyncio.run(main())


# -- streamable HTTP ----------------------------------------------------------------------------------
@pytest.mark.parametrize("body", ["sse", "json"])
def test_http_result_past_the_limit_is_refused(tmp_path: Path, body: str) -> None:

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=2 * MB)
        await mgr.start_workspace(WS, {"web": MCPServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout_s=60)},
                                  tmp_path)
        c = ctx(tmp_path)
        try:
            assert one(mgr.status(WS), "web")["state"] == "up", mgr.status(WS)
            with PeakRSS() as rss:
                r = await call(reg, c, "web__big_text", mb=100)
            assert r.is_error and f"the MCP server web {REFUSAL.format(mb=2)}" in r.content, r.content
            assert rss.growth_mb < 2 * 2 * 2, rss.growth_mb  # twice the limit (the text and its JSON)
            r = await call(reg, c, "web__big_text", mb=1.5)
            assert not r.is_error and len(r.content) == int(1.5 * MB)
            r = await call(reg, c, "web__echo", text="next")
            assert (r.content, r.is_error) == ("next", False)
            st = one(mgr.status(WS), "web")
            assert st["state"] == "up" and st["restarts"] == 0, st
        finally:
            await mgr.stop()

    with http_mcp(*(["--json"] if body == "json" else [])) as port:
        asyncio.run(main())


# -- the bench helper ----------------------------------------------------------------------------------
def test_mcp_bomb_config_declares_the_server(tmp_path: Path) -> None:
    import tomllib

    tool, args = mcp_bomb_config(tmp_path)
    assert (tool, args) == ("bomb__big_text", {"mb": 300}) and 300 > LimitsSettings().mcp_result_max_mb
    cfg = tomllib.loads((tmp_path / "workspaces" / "demo" / "workspace.toml").read_text())
    assert cfg["mcp"]["bomb"]["command"] == FAKE_MCP
    mcp_bomb_config(tmp_path)  # twice: declared once
    assert (tmp_path / "workspaces" / "demo" / "workspace.toml").read_text().count("[mcp.bomb]") == 1


# -- through the whole product -------------------------------------------------------------------------
def test_bomb_through_the_api_names_the_setting(harness_factory, home: Path) -> None:
    """workspace.toml declares the server (the bench helper), the setting reaches the manager,
    the model gets the refusal as the tool result, and the next call of the turn works."""
    import httpx

    from tests.conftest import parse_sse, serve_app
    from tests.fakes.openai_server import FakeOpenAIServer
    from tests.integration.test_mcp_e2e import llm

    tool, args = mcp_bomb_config(home, mb=20)
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "c1", "name": tool, "arguments": args}])
        fake.add_tool_calls([{"id": "c2", "name": "bomb__echo", "arguments": {"text": "after"}}])
        fake.add_text("done")
        h = harness_factory(llm(fake), limits={"mcp_result_max_mb": 8})
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=120) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go"}).text)
        to_model = [m["content"] for m in fake.requests[1]["messages"] if m["role"] == "tool"]
    fins = {d["call_id"]: d for e, d in events if e == "tool.finished"}
    assert not fins["c1"]["ok"] and REFUSAL.format(mb=8) in fins["c1"]["preview"], fins["c1"]
    assert any(REFUSAL.format(mb=8) in t for t in to_model), to_model
    assert fins["c2"]["ok"] and events[-1][1]["status"] == "ok"


def test_http_gzip_bomb_is_refused_without_inflating(tmp_path: Path) -> None:
    """We ask for uncompressed bodies; a server that gzips anyway (200 MB in a 200 KB body) is refused."""

    async def main() -> None:
        reg = ToolRegistry()
        mgr = MCPManager(reg, result_max_bytes=8 * MB)
        await mgr.start_workspace(WS, {"gz": MCPServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout_s=60)},
                                  tmp_path)
        c = ctx(tmp_path)
        try:
            assert one(mgr.status(WS), "gz")["state"] == "up", mgr.status(WS)
            with PeakRSS() as rss:
                r = await call(reg, c, "gz__big_text", mb=200)
            assert r.is_error and "the response is compressed (gzip)" in r.content, r.content
            assert "inflated size cannot be bounded" in r.content
            assert rss.growth_mb < 16, rss.growth_mb
            r = await call(reg, c, "gz__echo", text="plain")
            assert (r.content, r.is_error) == ("plain", False)
        finally:
            await mgr.stop()

    with http_mcp(flag="--http-gzip") as port:
        asyncio.run(main())
