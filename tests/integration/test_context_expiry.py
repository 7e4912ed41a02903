"""Expired artifacts are marked wherever the model sees them (issue 18, item 4).

A query result offloaded to an artifact, whose data then expires: in the turn right after
expiry the model's window still holds the original "saved at /data/..." result, and it
now ends with the mark naming `requery_artifact("<aid>")`; later, as a stub, it says the
same (`context.append_only = false`, compacted by age); a python call that names the file
by its sandbox path is marked too; after the re-query the mark is gone. An expired upload says so in the user message that announced it.
"""

from __future__ import annotations

import json

import pytest

from datadesk.llm.scripted import ScriptedModel, tool_step
from tests.conftest import parse_sse
from tests.fakes.sandbox import FakeSandbox

BIG = "SELECT * FROM readings WHERE building_id IN ('B01', 'B02')"


@pytest.fixture
def api(api):
    """The shared client (tests/conftest.py) with the stand-in python tool: results may be offloaded."""
    FakeSandbox(api.h.rt)
    return api


def turn(h, client, model, tid: str, text: str, *steps) -> list:
    model.steps.extend(steps)
    r = client.post(f"/api/threads/{tid}/messages", json={"content": text}, headers=h.auth("alice"))
    return parse_sse(r.text)


def tool_contents(call: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in call if m["role"] == "tool"}


def test_the_turn_right_after_expiry_shows_the_mark(api) -> None:
    h, client, model = api.h, api.client, api.model
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    events = turn(h, client, model, tid, "all readings of B01 and B02",
                  tool_step("sql_query", {"sql": BIG}, call_id="call_q"), "saved")
    aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    turn(h, client, model, tid, "look at the file",
         tool_step("python", {"code": f"print(open('/data/{aid}.parquet','rb').read(4))"}, call_id="call_py"),
         "looked")
    turn(h, client, model, tid, "before expiry", "fine")
    before = tool_contents(model.calls[-1])
    assert f"/data/{aid}.parquet" in before["call_q"] and "has expired" not in json.dumps(before)

    thread = h.rt.threads.get(tid, "alice", ["demo"])
    h.rt.artifacts.expire(thread, aid)
    turn(h, client, model, tid, "and now?", "answer")  # the turn right after expiry
    after = tool_contents(model.calls[-1])
    mark = f"[artifact {aid} has expired: its data is no longer in /data; requery_artifact(\"{aid}\") restores it"
    assert mark in after["call_q"]  # whole (append-only window) or as a stub, it says so
    assert mark in after["call_py"]  # named by its sandbox path in a python result
    manifest = client.get(f"/api/threads/{tid}/context", headers=h.auth("alice")).json()
    assert manifest["regions"]["history"] > 0

    events = turn(h, client, model, tid, "restore it", tool_step("requery_artifact", {"artifact_id": aid}), "back")
    assert next(d for e, d in events if e == "tool.finished")["ok"]
    turn(h, client, model, tid, "thanks", "bye")
    assert "has expired" not in json.dumps(tool_contents(model.calls[-1])[("call_q")])


@pytest.mark.parametrize("append_only", [True, False])
def test_a_stub_says_so_too(harness_factory, append_only: bool) -> None:
    model = ScriptedModel(then="ok")
    h = harness_factory(model, context={"append_only": append_only})
    FakeSandbox(h.rt)
    with h.client() as api:
        client, tid = api.client, api.tid
        events = turn(h, client, model, tid, "all", tool_step("sql_query", {"sql": BIG}, call_id="call_q"), "ok")
        aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
        for i in range(3):
            turn(h, client, model, tid, f"more {i}", "fine")
        h.rt.artifacts.expire(h.rt.threads.get(tid, "alice", ["demo"]), aid)
        turn(h, client, model, tid, "and now?", "answer")
    shown = tool_contents(model.calls[-1])["call_q"]
    assert shown.startswith("[compacted result of sql_query") is (not append_only)
    assert f"artifact {aid} (expired)" in shown or append_only
    assert f"requery_artifact(\"{aid}\") restores it by re-running the call]" in shown


def test_a_full_result_in_the_next_turn_is_marked_too(api) -> None:
    h, client, model = api.h, api.client, api.model
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    events = turn(h, client, model, tid, "all readings", tool_step("sql_query", {"sql": BIG}, call_id="call_q"), "ok")
    aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    h.rt.artifacts.expire(h.rt.threads.get(tid, "alice", ["demo"]), aid)
    turn(h, client, model, tid, "next", "answer")
    shown = tool_contents(model.calls[-1])["call_q"]
    assert not shown.startswith("[compacted")  # the original "saved at /data/..." message...
    assert f"/data/{aid}.parquet" in shown and shown.rstrip().endswith(  # ...ends with the mark
        f"requery_artifact(\"{aid}\") restores it by re-running the call]")


def test_an_expired_upload_says_so_in_the_user_message(api) -> None:
    h, client, model = api.h, api.client, api.model
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    csv = "building,kwh\n" + "".join(f"B{i % 20:02d},{i * 0.5}\n" for i in range(2_000))
    r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("meters.csv", csv.encode(), "text/csv")},
                    headers=h.auth("alice"))
    assert r.status_code in (200, 201), r.text
    aid = r.json()["artifact"]["id"] if "artifact" in r.json() else r.json()["id"]
    h.rt.artifacts.expire(h.rt.threads.get(tid, "alice", ["demo"]), aid)
    turn(h, client, model, tid, "sum the kwh", "answer")
    users = [m["content"] for m in model.calls[-1] if m["role"] == "user" and isinstance(m["content"], str)]
    assert any(f"[artifact {aid} has expired" in u and "upload it again" in u for u in users), users
