"""Cancel, client disconnect, background turns, concurrency limits and the step limit,
over real HTTP (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from datadesk.llm.scripted import ScriptedModel, ScriptStep, tool_step
from datadesk.tools.registry import ToolResult, ToolSpec
from tests.conftest import parse_sse, serve_app, wait_until


def waiting_step(release: threading.Event, then: ScriptStep | str):
    async def step(messages: list[dict[str, Any]], tools: list[dict[str, Any]]):
        while not release.is_set():
            await asyncio.sleep(0.01)
        return then
    return step


def slow_text(text: str = "word " * 200) -> ScriptStep:
    return ScriptStep(text=text, delay_s=0.02)


def register_sleepy(h, started: threading.Event) -> None:
    async def sleepy(args, ctx):
        started.set()
        await asyncio.sleep(30)
        return ToolResult("slept")

    async def quick(args, ctx):
        return ToolResult("quick done")

    h.rt.tools.register(ToolSpec(name="sleepy", description="sleeps", parameters={"type": "object"}), sleepy)
    h.rt.tools.register(ToolSpec(name="quick", description="quick", parameters={"type": "object"}), quick)


class SSEReader:
    """Reads an SSE response incrementally. Keeps one line iterator alive: dropping an
    httpx line iterator closes the response, which the server sees as a disconnect."""

    def __init__(self, resp: httpx.Response) -> None:
        self.lines = resp.iter_lines()
        self.text: list[str] = []

    def until(self, event: str) -> None:
        for line in self.lines:
            self.text.append(line)
            if line.startswith("event:") and line[6:].strip() == event:
                return
        raise AssertionError(f"stream ended before {event}")

    def rest(self) -> list[tuple[str, dict]]:
        self.text.extend(self.lines)
        return parse_sse("\n".join(self.text))


def records(c: httpx.Client, tid: str) -> list[dict[str, Any]]:
    return c.get(f"/api/threads/{tid}").json()["records"]


def test_cancel_mid_reply_keeps_partial_text_and_next_turn_continues(harness_factory) -> None:
    model = ScriptedModel([slow_text(), "second answer"])
    h = harness_factory(model)
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "talk"}) as resp:
            sse = SSEReader(resp)
            sse.until("message.delta")
            r = c.post(f"/api/threads/{tid}/cancel")
            assert r.json() == {"cancelled": True, "thread": tid}
            rest = sse.rest()
        assert rest[-2][0] == "error" and rest[-2][1]["kind"] == "cancelled"
        assert rest[-1][1]["status"] == "cancelled"
        recs = records(c, tid)
        assert [(r["role"], r.get("status", "ok")) for r in recs] == [("user", "ok"), ("assistant", "cancelled")]
        assert recs[1]["content"].startswith("word")
        # nothing running any more; the next turn continues from the log
        assert c.post(f"/api/threads/{tid}/cancel").json()["cancelled"] is False
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "again"}).text)
        assert events[-1][1]["status"] == "ok"
    sent = model.calls[-1]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2]["content"].endswith("[reply stopped by the user]")


def test_cancel_during_parallel_tools_records_each_call(harness_factory) -> None:
    started = threading.Event()
    model = ScriptedModel([
        ScriptStep(tool_calls=[*tool_step("quick", {}, call_id="c_quick").tool_calls,
                               *tool_step("sleepy", {}, call_id="c_sleepy").tool_calls]),
        "after cancel",
    ])
    h = harness_factory(model)
    register_sleepy(h, started)
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "go"}) as resp:
            sse = SSEReader(resp)
            assert started.wait(10)
            assert c.post(f"/api/threads/{tid}/cancel").json()["cancelled"] is True
            events = sse.rest()
        assert [d["name"] for e, d in events if e == "tool.finished"] == ["quick"]
        recs = records(c, tid)
        assert [r["role"] for r in recs] == ["user", "assistant", "tool", "tool"]
        by_call = {r["tool_call_id"]: r for r in recs[2:]}
        assert by_call["c_quick"].get("status", "ok") == "ok"
        assert by_call["c_sleepy"]["status"] == "cancelled"
        assert parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "next"}).text)[-1][1]["status"] == "ok"
    roles = [m["role"] for m in model.calls[-1]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]


def test_client_disconnect_cancels_the_turn(harness_factory) -> None:
    """Only a turn started with `background: false` stops when its client leaves (the default
    outlives it: test_turn_reattach.py)."""
    h = harness_factory(ScriptedModel([slow_text()]))
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "talk", "background": False}) as resp:
            SSEReader(resp).until("message.delta")
        # leaving the block closes the connection
        wait_until(lambda: len(records(c, tid)) == 2 and h.rt.turns.get(tid) is None)
        assert records(c, tid)[1]["status"] == "cancelled"


def test_background_turn_survives_disconnect(harness_factory) -> None:
    h = harness_factory(ScriptedModel([ScriptStep(text="finished in the background " * 5, delay_s=0.01)]))
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages",
                      json={"content": "talk", "background": True}) as resp:
            SSEReader(resp).until("message.delta")
        wait_until(lambda: len(records(c, tid)) == 2 and h.rt.turns.get(tid) is None)
        final = records(c, tid)[1]
        assert final.get("status", "ok") == "ok" and final["content"].startswith("finished in the background")


def test_second_turn_on_same_thread_is_409_and_per_user_limit_is_429(harness_factory) -> None:
    release = threading.Event()
    h = harness_factory(ScriptedModel(then=waiting_step(release, "done")))
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("bob"), timeout=30) as c:
        t1, t2, t3 = (c.post("/api/threads", json={}).json()["id"] for _ in range(3))
        results: dict[str, list] = {}

        def run(tid: str) -> None:
            with httpx.Client(base_url=base, headers=h.auth("bob"), timeout=30) as c2:
                results[tid] = parse_sse(c2.post(f"/api/threads/{tid}/messages", json={"content": "x"}).text)

        workers = [threading.Thread(target=run, args=(t,)) for t in (t1, t2)]
        for w in workers:
            w.start()
        wait_until(lambda: h.rt.turns.get(t1) is not None and h.rt.turns.get(t2) is not None)
        r = c.post(f"/api/threads/{t1}/messages", json={"content": "again"})
        assert r.status_code == 409 and "already running" in r.json()["error"]
        r = c.post(f"/api/threads/{t3}/messages", json={"content": "third"})
        assert r.status_code == 429 and "limit 2" in r.json()["error"]
        # another user is not affected by bob's limit
        other = c.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        with c.stream("POST", f"/api/threads/{other}/messages", json={"content": "hi"},
                      headers=h.auth("alice")) as resp:
            assert resp.status_code == 200
            release.set()
            assert parse_sse(resp.read().decode())[-1][1]["status"] == "ok"
        for w in workers:
            w.join(10)
        assert all(v[-1][1]["status"] == "ok" for v in results.values())
        # the refused requests left no record behind
        assert [r["role"] for r in records(c, t1)] == ["user", "assistant"]
        assert records(c, t3) == []


def test_step_limit(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then=tool_step("sql_query", {"sql": "SELECT 1"})), chat={"max_steps": 3})
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "loop"}).text)
        recs = records(c, tid)
    assert events[-2][1]["kind"] == "step_limit" and events[-1][1]["status"] == "error"
    assert [r["role"] for r in recs] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert recs[-1]["status"] == "error" and "3 tool rounds" in recs[-1]["content"]


def test_delete_cancels_a_running_turn(harness_factory) -> None:
    h = harness_factory(ScriptedModel([slow_text()]))
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "talk"}) as resp:
            sse = SSEReader(resp)
            sse.until("message.delta")
            assert c.delete(f"/api/threads/{tid}").status_code == 204
            events = sse.rest()
        assert events[-1][0] == "done"
        assert c.get(f"/api/threads/{tid}").status_code == 404
        assert h.rt.turns.get(tid) is None
        assert not any(t.id == tid for t in h.rt.threads.folders("demo", "bob"))  # nothing of it is kept
