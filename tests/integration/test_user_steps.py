"""User steps (chat/user_steps.py): an edited SQL card re-run by the user through the real API,
the real tool registry, DuckDB and the offload pipeline; the model's next request (the fake
OpenAI server's received requests) carries the step."""

from __future__ import annotations

import threading

import httpx

from datadesk.chat.user_steps import MAX_INPUT_CHARS
from datadesk.context.builder import USER_STEP_NOTE
from tests.conftest import parse_sse, serve_app
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.sandbox import FakeSandbox
from tests.integration.test_offload_e2e import llm

EDITED = "SELECT * FROM readings WHERE kwh > 0"


def _records(h, user: str, tid: str) -> list:
    return list(h.rt.threads.get(tid, user, ["demo", "sales"]).log.tail(100))


def test_an_edited_sql_step_makes_a_new_artifact_and_reaches_the_next_request(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "call_1", "name": "sql_query",
                              "arguments": {"sql": "SELECT * FROM readings"}}])
        fake.add_text("first answer")
        fake.add_text("second answer")
        h = harness_factory(llm(fake))
        FakeSandbox(h.rt)
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=120) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            first = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go"}).text)
            old = next(d for e, d in first if e == "artifact.created")["artifact"]["id"]
            r = c.post(f"/api/threads/{tid}/steps", json={"tool": "sql_query", "arguments": {"sql": EDITED},
                                                          "edited_from": "call_1"})
            assert r.status_code == 200, r.text
            events = parse_sse(r.text)
            kinds = [e for e, _ in events]
            assert kinds[0] == "tool.started" and kinds[-1] == "done"
            assert events[-1][1]["status"] == "ok"
            new = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
            assert new != old
            started = next(d for e, d in events if e == "tool.started")
            assert EDITED in started["arguments"]
            # the log: the user's call pair, marked, readable as an ordinary call pair
            recs = _records(h, "alice", tid)
            call_rec = next(x for x in recs if x.tool_calls and x.tool_calls[0].id == started["call_id"])
            assert call_rec.meta == {"via": "user", "edited_from": "call_1"}
            result = recs[recs.index(call_rec) + 1]
            assert result.role == "tool" and result.tool_call_id == started["call_id"]
            assert result.meta["artifact"]["id"] == new
            # the thread's page shows it too
            page = c.get(f"/api/threads/{tid}").json()["records"]
            assert any((p.get("meta") or {}).get("via") == "user" for p in page)
            parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "and now?"}).text)
        msgs = fake.requests[-1]["messages"]
        i = next(k for k, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")
                 and EDITED in m["tool_calls"][0]["function"]["arguments"])
        assert USER_STEP_NOTE in msgs[i]["content"]
        assert msgs[i + 1]["role"] == "tool" and new in msgs[i + 1]["content"]
        assert msgs[-1] == {"role": "user", "content": "and now?"}


def test_bad_steps_are_refused_with_what_was_wrong(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        h = harness_factory(llm(fake))
        FakeSandbox(h.rt)
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=60) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            url = f"/api/threads/{tid}/steps"
            cases = [
                ({"tool": "remember", "arguments": {"text": "x"}}, 422, "tool"),
                ({"tool": "sql_query", "arguments": {}}, 422, "arguments.sql"),
                ({"tool": "sql_query", "arguments": {"sql": 5}}, 422, "arguments.sql"),
                ({"tool": "sql_query", "arguments": {"sql": "SELECT 1", "nope": 1}}, 422, "arguments.nope"),
                ({"tool": "python", "arguments": {"code": "x" * (MAX_INPUT_CHARS + 1)}}, 413, "too long"),
                ({"tool": "sql_query", "arguments": {"sql": "SELECT 1"}, "edited_from": "call_nope"}, 404,
                 "call_nope"),
                ({"tool": "sql_query", "arguments": {"sql": "SELECT 1"}, "edited_from": "../x"}, 422,
                 "edited_from"),
            ]
            for body, status, named in cases:
                r = c.post(url, json=body)
                assert r.status_code == status, (body, r.text)
                assert named in r.text, (body, r.text)
            assert c.post("/api/threads/nope/steps", json=cases[1][0]).status_code in (404, 422)
            assert not _records(h, "alice", tid)  # nothing refused was recorded
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("bob"), timeout=60) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            r = c.post(f"/api/threads/{tid}/steps", json={"tool": "python", "arguments": {"code": "1"}})
            assert r.status_code == 403 and "code_execution" in r.text, r.text


def test_editing_a_step_of_an_earlier_branch_is_refused_naming_it(harness_factory) -> None:
    """The question whose answer ran `call_old` is edited: that card belongs to an earlier branch
    now, and a step edited from it is refused (422, naming the call and its record); a card of
    the active branch still can be edited."""
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "call_old", "name": "sql_query", "arguments": {"sql": "SELECT 1 AS a"}}])
        fake.add_text("first answer")
        fake.add_tool_calls([{"id": "call_new", "name": "sql_query", "arguments": {"sql": "SELECT 2 AS b"}}])
        fake.add_text("edited answer")
        h = harness_factory(llm(fake))
        FakeSandbox(h.rt)
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=120) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go"}).text)
            edited = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go on", "edit_of": 1}).text)
            assert edited[-1][1]["status"] == "ok", edited[-1]
            old = c.post(f"/api/threads/{tid}/steps", json={"tool": "sql_query", "arguments": {"sql": "SELECT 3"},
                                                            "edited_from": "call_old"})
            recorded = len(_records(h, "alice", tid))
            new = c.post(f"/api/threads/{tid}/steps", json={"tool": "sql_query", "arguments": {"sql": "SELECT 4"},
                                                            "edited_from": "call_new"})
    assert old.status_code == 422, old.text
    detail = old.json()["detail"]
    assert "call_old" in detail and "#2" in detail and "earlier branch" in detail
    assert recorded == 8  # nothing of the refused step: 4 records per answered question
    assert new.status_code == 200 and parse_sse(new.text)[-1][1]["status"] == "ok"


def test_a_step_while_a_turn_runs_is_refused_409(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        fake.add_text("slow answer " * 40, delay_s=0.25)
        h = harness_factory(llm(fake))
        FakeSandbox(h.rt)
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=60) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            got_first = threading.Event()

            def turn() -> None:
                with httpx.Client(base_url=base, headers=h.auth("alice"), timeout=60) as c2:
                    with c2.stream("POST", f"/api/threads/{tid}/messages", json={"content": "go"}) as s:
                        for line in s.iter_lines():
                            if line.startswith("event: message.delta"):
                                got_first.set()

            t = threading.Thread(target=turn)
            t.start()
            assert got_first.wait(30)
            r = c.post(f"/api/threads/{tid}/steps", json={"tool": "sql_query", "arguments": {"sql": "SELECT 1"}})
            assert r.status_code == 409, r.text
            assert tid in r.text or "running" in r.text or "turn" in r.text
            c.post(f"/api/threads/{tid}/cancel")
            t.join(60)
            # free again: the step runs
            r = c.post(f"/api/threads/{tid}/steps", json={"tool": "sql_query", "arguments": {"sql": "SELECT 1"}})
            assert r.status_code == 200 and parse_sse(r.text)[-1][1]["status"] == "ok"
