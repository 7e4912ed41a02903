"""Edit a question, regenerate an answer (issue 31, item 3) through the real HTTP API and the real
OpenAI client against the fake OpenAI-compatible server: the model's request after an edit holds
the new question and neither the old question nor the old answer; the earlier branch stays
listed and readable; regenerate gives a new answer and keeps the old one."""

from __future__ import annotations

import json

import httpx

from tests.conftest import parse_sse, serve_app
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.test_turn_openai import llm


def _texts(request: dict) -> str:
    return json.dumps([m.get("content") for m in request["messages"]])


def _ask(c: httpx.Client, tid: str, body: dict, path: str = "messages") -> list:
    resp = c.post(f"/api/threads/{tid}/{path}", json=body)
    assert resp.status_code == 200, resp.text
    events = parse_sse(resp.text)
    assert events[-1][0] == "done" and events[-1][1]["status"] == "ok", events[-1]
    return events


def test_edit_and_regenerate_keep_the_old_branch_out_of_the_model_request(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        for text in ("Answer one: 20 buildings.", "Answer two: Tuesday peaks.",
                     "Answer edited: 42 sites.", "Answer regenerated: 42 sites, checked."):
            fake.add_text(text)
        h = harness_factory(llm(fake), summary={"enabled": False})
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
            tid = c.post("/api/threads", json={"title": "branches"}).json()["id"]
            _ask(c, tid, {"content": "How many buildings?"})
            _ask(c, tid, {"content": "Which weekday peaks?"})
            # edit the second question (seq 3): the thread continues from the first answer
            _ask(c, tid, {"content": "How many sites in total?", "edit_of": 3})
            edited_request = fake.requests[-1]
            _ask(c, tid, {}, path="regenerate")  # the last question, asked again
            regen_request = fake.requests[-1]
            points = c.get(f"/api/threads/{tid}/branches").json()["points"]
            old = c.get(f"/api/threads/{tid}/branches/3").json()["records"]
            first_regen = c.get(f"/api/threads/{tid}/branches/5").json()["records"]
            view = c.get(f"/api/threads/{tid}").json()["records"]
            exported = c.get(f"/api/threads/{tid}/export", params={"format": "md"}).text

    sent = _texts(edited_request)
    assert "How many sites in total?" in sent and "How many buildings?" in sent
    assert "Which weekday peaks?" not in sent and "Tuesday peaks" not in sent
    regen = _texts(regen_request)
    assert regen.count("How many sites in total?") == 1  # the question once, not the old answer
    assert "Answer edited" not in regen and "Tuesday peaks" not in regen
    # the thread view and the export show the active branch only
    assert [r["content"] for r in view] == ["How many buildings?", "Answer one: 20 buildings.",
                                            "How many sites in total?", "Answer regenerated: 42 sites, checked."]
    assert "Answer regenerated" in exported and "Tuesday peaks" not in exported and "Answer edited" not in exported
    assert [r["content"] for r in old] == ["Which weekday peaks?", "Answer two: Tuesday peaks."]
    assert [r["content"] for r in first_regen] == ["How many sites in total?", "Answer edited: 42 sites."]
    # one branch point (after the first answer): the question, its edit, and the edit regenerated
    assert [p["at"] for p in points] == [2]
    assert [(b["seq"], b["kind"], b["active"]) for b in points[0]["branches"]] == [
        (3, "original", False), (5, "edit", False), (7, "regenerate", True)]

def test_a_bad_seq_is_refused_with_a_clear_message(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        fake.add_text("first answer")
        fake.add_text("edited answer")
        h = harness_factory(llm(fake), summary={"enabled": False})
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
            tid = c.post("/api/threads", json={"title": "bad"}).json()["id"]
            empty = c.post(f"/api/threads/{tid}/regenerate", json={})
            _ask(c, tid, {"content": "q one"})
            unknown = c.post(f"/api/threads/{tid}/messages", json={"content": "x", "edit_of": 99})
            answer = c.post(f"/api/threads/{tid}/regenerate", json={"seq": 2})
            negative = c.post(f"/api/threads/{tid}/regenerate", json={"seq": 0})
            no_branch = c.get(f"/api/threads/{tid}/branches/2")
            _ask(c, tid, {"content": "q one, edited", "edit_of": 1})
            abandoned = c.post(f"/api/threads/{tid}/messages", json={"content": "y", "edit_of": 1})
            other = httpx.get(f"{base}/api/threads/{tid}/branches", headers=h.auth("bob"))
    assert empty.status_code == 400 and "no question" in empty.json()["detail"]
    assert unknown.status_code == 404 and "#99" in unknown.json()["detail"]
    assert answer.status_code == 400 and "not a question" in answer.json()["detail"]
    assert negative.status_code == 400 and "positive" in negative.json()["detail"]
    assert no_branch.status_code == 404
    assert abandoned.status_code == 400 and "earlier branch" in abandoned.json()["detail"]
    assert other.status_code in (403, 404)


def test_a_constraint_noted_in_the_earlier_branch_leaves_the_task_state(harness_factory) -> None:
    """The model records a constraint (`note_constraint`) while answering a question; the user
    edits that question: the constraint is withdrawn (kept, `withdrawn_by: "branch"`) and the
    edited question's request does not carry it; one noted before the branch point stays."""
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"name": "note_constraint", "arguments": {"text": "only 2024",
                                                                       "user_words": "only 2024"}}])
        fake.add_text("Noted: 2024 only.")
        fake.add_tool_calls([{"name": "note_constraint", "arguments": {"text": "exclude PUFFINDAY holidays",
                                                                       "user_words": "exclude PUFFINDAY holidays"}}])
        fake.add_text("Per weekday, PUFFINDAY holidays excluded.")
        fake.add_text("Per month.")
        h = harness_factory(llm(fake), summary={"enabled": False})
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
            tid = c.post("/api/threads", json={"title": "task state"}).json()["id"]
            _ask(c, tid, {"content": "Energy use per city, only 2024"})  # seqs 1-4
            _ask(c, tid, {"content": "Per weekday, and exclude PUFFINDAY holidays"})  # seq 5 on
            before = c.get(f"/api/threads/{tid}/task-state").json()["task_state"]
            _ask(c, tid, {"content": "Per month instead", "edit_of": 5})
            edited_request = fake.requests[-1]
            after = c.get(f"/api/threads/{tid}/task-state").json()["task_state"]
    assert sorted(i["text"] for i in before["items"] if i["status"] == "active") == [
        "exclude PUFFINDAY holidays", "only 2024"]
    items = {i["text"]: i for i in after["items"]}
    assert [i["text"] for i in after["items"] if i["status"] == "active"] == ["only 2024"]
    gone = items["exclude PUFFINDAY holidays"]
    assert (gone["status"], gone["withdrawn_by"], gone["source"]) == ("withdrawn", "branch", "model")
    sent = _texts(edited_request)
    assert "PUFFINDAY" not in sent and "only 2024" in sent


def test_a_summary_of_the_earlier_branch_is_left_out_of_the_edited_request(harness_factory) -> None:
    import asyncio

    from datadesk.llm.scripted import ScriptedModel
    from tests.conftest import wait_until
    from tests.unit.test_summary import faithful

    model = ScriptedModel(then="ok")
    h = harness_factory(model, summary_model=ScriptedModel(then=faithful), summary={"enabled": True})
    with h.client("bob", served=True, timeout=60) as api:
        c, tid = api.client, api.tid
        c.post(f"/api/threads/{tid}/messages", json={"content": "Monthly consumption per city."})
        c.post(f"/api/threads/{tid}/messages", json={"content": "Plot it with OLDWORD colours. Constraint: "
                                                                "exclude OLDWORD days."})
        wait_until(lambda: h.rt.summaries.pending == 0)
        thread = h.rt.threads.get(tid, "bob", ["demo"])
        asyncio.run(h.rt.summaries.refresh(thread, 4, thread.meta.epoch, synchronous=True))
        assert "OLDWORD" in json.dumps(msgspec_builtins(h.rt.summaries.store.load_current(thread, thread.meta.epoch)))
        c.post(f"/api/threads/{tid}/messages", json={"content": "Thanks."})  # merges that summary's constraint
        wait_until(lambda: h.rt.summaries.pending == 0)
        before = json.dumps(model.calls[-1])
        state = c.get(f"/api/threads/{tid}/task-state").json()
        assert "exclude OLDWORD days" in json.dumps(state)
        c.post(f"/api/threads/{tid}/messages", json={"content": "Plot it as bars.", "edit_of": 3})
    edited = json.dumps(model.calls[-1])
    assert "Plot it as bars." in edited and "Monthly consumption per city." in edited
    assert "OLDWORD" not in edited  # neither the old question, nor a summary or task state holding it
    assert "OLDWORD" in before


def msgspec_builtins(obj):
    import msgspec

    return msgspec.to_builtins(obj)
