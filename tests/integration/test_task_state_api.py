"""The task-state API over HTTP: pin a message or typed words, bad input named, unpin, the next
request carries what is pinned, and a clear takes the task state and the summary status away."""

from __future__ import annotations

import json

import httpx

from datadesk.llm.scripted import ScriptedModel
from datadesk.store.interfaces.threads import TASK_STATE


def test_pin_unpin_inject_and_clear(harness_factory) -> None:
    model = ScriptedModel(then="OK.")
    h = harness_factory(model)
    with h.client("bob", served=True, timeout=60) as api:
        c, tid, base = api.client, api.tid, api.base
        url = f"/api/threads/{tid}/task-state"
        c.post(f"/api/threads/{tid}/messages", json={"content": "exclude holidays from every chart"})
        empty = c.get(url).json()
        assert empty["task_state"]["items"] == [] and empty["summary"]["state"] == "off"  # summaries off here
        pinned = c.post(url, json={"seq": 1}).json()["item"]
        assert (pinned["text"], pinned["source"], pinned["user_seq"]) == ("exclude holidays from every chart", "user", 1)
        goal = c.post(url, json={"text": "an energy report for the board", "kind": "goal"}).json()["item"]
        for body, status, words in [({"seq": 2}, 400, "not one of your messages"),
                                    ({"seq": 1, "text": "x"}, 400, "either `seq`"),
                                    ({"text": "x" * 501}, 400, "at most 500"),
                                    ({"text": "x", "kind": "rule"}, 400, "kind")]:
            r = c.post(url, json=body)
            assert r.status_code == status and words in r.text, (body, r.text)
        assert c.delete(f"{url}/cnope").status_code == 404
        assert c.delete(f"{url}/..%2Fx").status_code in (400, 404)
        c.post(f"/api/threads/{tid}/messages", json={"content": "recompute"})
        sent = json.dumps(model.calls[-1])
        assert "exclude holidays from every chart" in sent and "Goal: an energy report for the board" in sent
        assert c.delete(f"{url}/{goal['id']}").json()["item"]["status"] == "withdrawn"
        c.post(f"/api/threads/{tid}/messages", json={"content": "again"})
        assert "for the board" not in json.dumps(model.calls[-1])
        assert httpx.get(f"{base}{url}", headers=h.auth("alice")).status_code == 404  # another user's thread
        thread = h.rt.threads.get(tid, "bob", ["demo"])
        assert thread.read_doc(TASK_STATE) is not None  # task_state.json, or the thread's document row
        assert c.post(f"/api/threads/{tid}/clear").status_code == 200
        assert thread.read_doc(TASK_STATE) is None
        assert c.get(url).json()["task_state"]["items"] == []
