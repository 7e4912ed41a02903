"""Detached turns: a turn outlives its client, its events carry ids, and `GET .../events`
re-attaches from any client and any worker (real HTTP, uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator

import httpx
import msgspec

from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel, ScriptStep, tool_step
from datadesk.tools.registry import ToolResult, ToolSpec
from tests.conftest import Harness, serve_app, wait_until

ANSWER = " ".join(f"w{i}" for i in range(120))


class Events:
    """Reads an SSE response event by event: (id, event, data); keeps one line iterator alive
    (dropping it closes the response, which the server sees as a disconnect)."""

    def __init__(self, resp: httpx.Response) -> None:
        self.lines: Iterator[str] = resp.iter_lines()
        self.got: list[tuple[str | None, str, dict[str, Any]]] = []

    def next(self) -> tuple[str | None, str, dict[str, Any]] | None:
        eid, ev, data = None, "message", []
        for line in self.lines:
            if not line:
                if data:
                    item = (eid, ev, msgspec.json.decode("\n".join(data)))
                    self.got.append(item)
                    return item
                eid, ev, data = None, "message", []
            elif line.startswith("id:"):
                eid = line[3:].strip()
            elif line.startswith("event:"):
                ev = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        return None

    def until(self, pred) -> tuple[str | None, str, dict[str, Any]]:
        while (item := self.next()) is not None:
            if pred(item):
                return item
        raise AssertionError(f"stream ended; got {[e for _, e, _ in self.got]}")

    def rest(self) -> list[tuple[str | None, str, dict[str, Any]]]:
        while self.next() is not None:
            pass
        return self.got


def text_of(events) -> str:
    return "".join(d.get("text", "") for _, e, d in events if e == "message.delta")


def plain(events) -> list[tuple[str | None, str, dict[str, Any]]]:
    """Events with an id, without the rendering (`html` depends on when a client reads)."""
    return [(i, e, {k: v for k, v in d.items() if k != "html"}) for i, e, d in events if i is not None]


def gated_tool(h: Harness, release: threading.Event, started: threading.Event) -> None:
    async def wait(args, ctx):
        started.set()
        for i in range(400):
            if release.is_set():
                break
            if i % 10 == 0:
                ctx.report(stdout=f"tick {i}\n")
            await asyncio.sleep(0.01)
        return ToolResult("released")

    h.rt.tools.register(ToolSpec(name="wait", description="waits", parameters={"type": "object"}), wait)


def test_a_client_leaving_stops_nothing_and_the_answer_is_kept(harness_factory) -> None:
    h = harness_factory(ScriptedModel([ScriptStep(text=ANSWER, delay_s=0.01)]))
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "talk"}) as resp:
            first = Events(resp).until(lambda it: it[1] == "message.delta")
        turn_id = first[0].split(":")[0]
        assert c.get(f"/api/threads/{tid}").json()["thread"]["turn"] == turn_id
        wait_until(lambda: h.rt.turns.get(tid) is None)
        recs = c.get(f"/api/threads/{tid}").json()["records"]
        assert recs[-1].get("status", "ok") == "ok" and recs[-1]["content"] == ANSWER
        # nothing runs: 204; a client that had seen event 1 of that turn gets the rest of it
        assert c.get(f"/api/threads/{tid}/events").status_code == 204
        with c.stream("GET", f"/api/threads/{tid}/events", headers={"Last-Event-ID": first[0]}) as resp:
            rest = Events(resp).rest()
        assert text_of([first, *rest]) == ANSWER and rest[-1][1] == "done"
        assert c.get(f"/api/threads/{tid}/events?after=nonsense").status_code == 400
        assert c.get(f"/api/threads/{tid}").json()["thread"]["turn"] is None


def test_reattach_with_last_event_id_gets_only_the_missing_events(harness_factory) -> None:
    release, started = threading.Event(), threading.Event()
    h = harness_factory(ScriptedModel([ScriptStep(text="before the tool ", tool_calls=tool_step("wait", {}).tool_calls),
                                       ScriptStep(text=ANSWER, delay_s=0.005)]))
    gated_tool(h, release, started)
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "go"}) as resp:
            a = Events(resp)
            a.until(lambda it: it[1] == "tool.progress")
        seen = [i for i, _, _ in a.got if i is not None]
        with c.stream("GET", f"/api/threads/{tid}/events", headers={"Last-Event-ID": seen[-1]}) as resp:
            b = Events(resp)
            b.until(lambda it: it[1] == "tool.progress")
            release.set()
            rest = b.rest()
        ns = [int(i.split(":")[1]) for i, _, _ in rest if i is not None]
        assert ns[0] == int(seen[-1].split(":")[1]) + 1 and ns == list(range(ns[0], ns[0] + len(ns)))
        assert rest[-1][1] == "done" and rest[-1][2]["status"] == "ok"
        assert text_of(a.got + rest) == "before the tool " + ANSWER
        # a full replay of the turn is what the two clients saw together
        with c.stream("GET", f"/api/threads/{tid}/events?after={seen[0].split(':')[0]}:0") as resp:
            full = Events(resp).rest()
        assert plain(full) == plain(a.got) + plain(rest)


def test_two_clients_see_the_same_events_and_either_can_stop_the_turn(harness_factory) -> None:
    release, started = threading.Event(), threading.Event()
    h = harness_factory(ScriptedModel([ScriptStep(text="checking ", tool_calls=tool_step("wait", {}).tool_calls),
                                       "never reached"]))
    gated_tool(h, release, started)
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("bob"), timeout=30) as c, \
            httpx.Client(base_url=base, headers=h.auth("bob"), timeout=30) as other:
        tid = c.post("/api/threads", json={}).json()["id"]
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "go"}) as ra:
            a = Events(ra)
            a.until(lambda it: it[1] == "tool.started")
            with other.stream("GET", f"/api/threads/{tid}/events") as rb:
                b = Events(rb)
                b.until(lambda it: it[1] == "tool.progress")
                assert other.post(f"/api/threads/{tid}/cancel").json()["cancelled"] is True
                got_b = b.rest()
            got_a = a.rest()
        assert plain(got_a) == plain(got_b)
        assert got_a[-1][1] == "done" and got_a[-1][2]["status"] == "cancelled"
        assert any(e == "error" and d["kind"] == "cancelled" for _, e, d in got_a)
        recs = c.get(f"/api/threads/{tid}").json()["records"]
        assert recs[-1]["role"] == "tool" and recs[-1]["status"] == "cancelled"


def test_reattach_from_another_worker_follows_the_event_file(harness_factory) -> None:
    release, started = threading.Event(), threading.Event()
    h = harness_factory(ScriptedModel([ScriptStep(text="first ", tool_calls=tool_step("wait", {}).tool_calls),
                                       ScriptStep(text=ANSWER, delay_s=0.005), tool_step("wait", {}), "unused"]))
    gated_tool(h, release, started)
    # a second worker: its own runtime on the same data directory
    h2 = Harness(rt=Runtime(settings=h.rt.settings, model=ScriptedModel([])), tokens=h.tokens)
    with serve_app(h.app()) as base, serve_app(h2.app()) as base2, \
            httpx.Client(base_url=base, headers=h.auth("bob"), timeout=30) as c, \
            httpx.Client(base_url=base2, headers=h.auth("bob"), timeout=30) as c2:
        tid = c.post("/api/threads", json={}).json()["id"]
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "go"}) as ra:
            a = Events(ra)
            a.until(lambda it: it[1] == "tool.progress")
            turn = c2.get(f"/api/threads/{tid}").json()["thread"]
            assert turn["running"] and turn["turn"] == a.got[0][0].split(":")[0]
            with c2.stream("GET", f"/api/threads/{tid}/events", headers={"Last-Event-ID": a.got[1][0]}) as rb:
                b = Events(rb)
                b.until(lambda it: it[1] == "tool.progress")
                release.set()
                got_b = b.rest()
            got_a = a.rest()
        assert plain(got_b) == plain(got_a)[2:]
        assert got_b[-1][1] == "done" and got_b[-1][2]["status"] == "ok"
        assert text_of(got_b) == ANSWER
        # Stop from the other worker
        release.clear()
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "again"}) as ra:
            a = Events(ra)
            a.until(lambda it: it[1] == "tool.started")
            assert c2.post(f"/api/threads/{tid}/cancel").json()["cancelled"] is True
            assert a.rest()[-1][2]["status"] == "cancelled"
