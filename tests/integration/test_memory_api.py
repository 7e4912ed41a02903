"""The memory panel API over the real app (real users, real data dir)."""

from __future__ import annotations

import json

import msgspec
import pytest
from litestar.testing import TestClient

from datadesk.api.controllers.memory import MemoryController
from datadesk.llm.scripted import ScriptedModel
from datadesk.domain.memory import Provenance
from datadesk.memory.store import MemoryStore
from datadesk.store.interfaces.threads import SUMMARY, SUMMARY_REVISIONS
from datadesk.store.layout import Layout


@pytest.fixture
def env(home, harness_factory):
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + "memory = true\n")  # sales keeps memory off
    h = harness_factory(ScriptedModel(then="fine"))
    users = h.rt.users
    _, h.tokens["dana"] = users.add("dana", ["demo"], ["memory"])
    _, h.tokens["erin"] = users.add("erin", ["demo", "sales"], ["memory"])
    if getattr(h.rt, "memory", None) is None:  # until the runtime builds it
        h.rt.memory = MemoryStore(h.rt.layout, h.rt.settings.memory)
    app = h.app()
    if not any(r.path.startswith("/api/memory") for r in app.routes):  # until app.py registers it
        app.register(MemoryController)
    with TestClient(app) as client:
        yield h, client


def add(client, h, user: str, text: str, **body) -> dict:
    r = client.post("/api/memory?workspace=demo", json={"text": text, **body}, headers=h.auth(user))
    assert r.status_code == 201, r.text
    return r.json()


def test_list_is_grouped_by_status_with_the_switch(env) -> None:
    h, client = env
    r = client.get("/api/memory?workspace=demo", headers=h.auth("dana"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["enabled"] is True and body["workspace"] == "demo"
    assert set(body["facts"]) == {"active", "candidate", "conflict", "superseded", "forgotten"}
    assert body["limits"]["max_active"] == 50
    f = add(client, h, "dana", "Reports in English", kind="preference")
    h.rt.memory.remember("demo", "dana", "Use kWh", provenance=Provenance(after_tool_output=True))
    body = client.get("/api/memory", headers=h.auth("dana")).json()  # default: first workspace
    assert [x["id"] for x in body["facts"]["active"]] == [f["id"]]
    assert [x["text"] for x in body["facts"]["candidate"]] == ["Use kWh"]


def test_access_rules(env) -> None:
    h, client = env
    assert client.get("/api/memory?workspace=demo").status_code == 401
    r = client.get("/api/memory?workspace=sales", headers=h.auth("dana"))  # not a member
    assert r.status_code == 404 and "not found" in r.json()["error"]
    r = client.get("/api/memory?workspace=sales", headers=h.auth("erin"))  # member, flag off
    assert r.status_code == 403 and "memory is off" in r.json()["error"]
    for user in ("alice", "bob"):  # members without the permission
        r = client.get("/api/memory?workspace=demo", headers=h.auth(user))
        assert r.status_code == 403 and "memory permission" in r.json()["error"]
        r = client.delete("/api/memory?workspace=demo", headers=h.auth(user))
        assert r.status_code == 403
    r = client.get("/api/memory?workspace=../etc", headers=h.auth("dana"))
    assert r.status_code in (400, 404)


def test_users_never_see_each_others_facts(env) -> None:
    h, client = env
    f = add(client, h, "dana", "Reports in English")
    assert client.get("/api/memory?workspace=demo", headers=h.auth("erin")).json()["facts"]["active"] == []
    for method, path, body in [("POST", f"/api/memory/{f['id']}/confirm", None),
                               ("POST", f"/api/memory/{f['id']}/edit", {"text": "x"}),
                               ("DELETE", f"/api/memory/{f['id']}", None)]:
        r = client.request(method, path + "?workspace=demo", json=body, headers=h.auth("erin"))
        assert r.status_code == 404, (path, r.text)
    assert h.rt.memory.get("demo", "dana", f["id"]).status == "active"


def test_panel_add_rules(env) -> None:
    h, client = env
    f = add(client, h, "dana", "Never show raw SQL", kind="instruction", importance=5)
    assert f["status"] == "active" and f["provenance"]["source"] == "panel"
    r = client.post("/api/memory?workspace=demo", json={"text": "never show raw sql."}, headers=h.auth("dana"))
    assert r.status_code == 409 and "already remembered" in r.json()["error"]
    assert r.json()["extra"] == {"fact": f["id"]}
    r = client.post("/api/memory?workspace=demo", json={"text": "password: Tr0ub4dor&3"}, headers=h.auth("dana"))
    assert r.status_code == 400 and "secrets" in r.json()["error"]
    r = client.post("/api/memory?workspace=demo", json={"text": "x", "colour": "red"}, headers=h.auth("dana"))
    assert r.status_code == 400
    r = client.post("/api/memory?workspace=demo", json={"text": "x", "kind": "gossip"}, headers=h.auth("dana"))
    assert r.status_code == 400 and "kind must be one of" in r.json()["error"]
    r = client.post("/api/memory?workspace=demo", json={"text": "y" * 501}, headers=h.auth("dana"))
    assert r.status_code == 400 and "limit is 500" in r.json()["error"]


def test_conflict_resolve_confirm_edit(env) -> None:
    h, client = env
    old = add(client, h, "dana", "Reports are in English")
    new = add(client, h, "dana", "Reports are in Chinese")
    assert new["status"] == "conflict" and new["conflicts_with"] == old["id"]
    r = client.post(f"/api/memory/{new['id']}/confirm?workspace=demo", headers=h.auth("dana"))
    assert r.status_code == 409 and "resolve" in r.json()["error"]
    r = client.post(f"/api/memory/{new['id']}/resolve?workspace=demo", json={"keep": "maybe"},
                    headers=h.auth("dana"))
    assert r.status_code == 400
    r = client.post(f"/api/memory/{new['id']}/resolve?workspace=demo", json={"keep": "new"},
                    headers=h.auth("dana"))
    assert r.status_code == 200 and r.json()["status"] == "active" and r.json()["supersedes"] == [old["id"]]
    groups = client.get("/api/memory?workspace=demo", headers=h.auth("dana")).json()["facts"]
    assert [x["id"] for x in groups["superseded"]] == [old["id"]]

    cand = h.rt.memory.remember("demo", "dana", "Weeks start on Monday",
                                provenance=Provenance(after_tool_output=True))
    r = client.post(f"/api/memory/{cand.id}/confirm?workspace=demo", headers=h.auth("dana"))
    assert r.status_code == 200 and r.json()["status"] == "active"
    r = client.post(f"/api/memory/{cand.id}/edit?workspace=demo", json={"text": "Weeks start on Sunday"},
                    headers=h.auth("dana"))
    assert r.status_code == 200 and r.json()["text"] == "Weeks start on Sunday"
    r = client.post("/api/memory/fnope/confirm?workspace=demo", headers=h.auth("dana"))
    assert r.status_code == 404


def test_user_switch(env) -> None:
    h, client = env
    r = client.put("/api/memory/settings?workspace=demo", json={"enabled": False}, headers=h.auth("dana"))
    assert r.status_code == 200 and r.json() == {"workspace": "demo", "enabled": False}
    assert client.get("/api/memory?workspace=demo", headers=h.auth("dana")).json()["enabled"] is False
    user = h.rt.users.get("dana")
    ok, why = h.rt.memory.allowed("demo", "dana", True, user.permissions)
    assert not ok and "turned memory off" in why
    # the panel still works with the switch off: the user can see and delete
    f = add(client, h, "dana", "Reports in English")
    assert client.delete(f"/api/memory/{f['id']}?workspace=demo", headers=h.auth("dana")).status_code == 200
    r = client.put("/api/memory/settings?workspace=demo", json={"enabled": "yes"}, headers=h.auth("dana"))
    assert r.status_code == 400


def _thread_with_summary(h, client, text: str):
    tid = client.post("/api/threads", json={"workspace": "demo"}, headers=h.auth("dana")).json()["id"]
    thread = h.rt.threads.get(tid, "dana", ["demo"])
    assert thread.write_doc(SUMMARY, {"goal": "monthly report", "active_constraints": [text, "kWh only"],
                                      "covers_through_seq": 8, "epoch": 0}, thread.meta.epoch)
    assert thread.append_line(SUMMARY_REVISIONS, json.dumps({"constraints": [f"Note: {text}."]}).encode(),
                              thread.meta.epoch)
    return thread


def _stored(h, thread) -> dict[str, bytes]:
    """What the stores keep of dana's memory and of `thread`'s summary, by the embedded file name."""
    return {"memory.json": msgspec.json.encode(h.rt.memory.docs.read("demo", "dana")),
            "memory.audit.jsonl": msgspec.json.encode(h.rt.memory.audit("demo", "dana")),
            "summary.json": thread.read_doc(SUMMARY) or b"",
            "summary.revisions.jsonl": b"\n".join(thread.lines(SUMMARY_REVISIONS))}


def test_delete_is_hard_and_redacts_summaries(env) -> None:
    h, client = env
    f = add(client, h, "dana", "Client Zephyr reports go to Ines")
    keep = add(client, h, "dana", "Energy is in kWh")
    thread = _thread_with_summary(h, client, "Client Zephyr reports go to Ines")
    r = client.delete(f"/api/memory/{f['id']}?workspace=demo", headers=h.auth("dana"))
    assert r.status_code == 200 and r.json()["deleted"] == [f["id"]]
    facts = client.get("/api/memory?workspace=demo", headers=h.auth("dana")).json()["facts"]
    assert [x["id"] for g in facts.values() for x in g] == [keep["id"]]
    for name, data in _stored(h, thread).items():
        assert b"Zephyr" not in data, name
    assert json.loads(thread.read_doc(SUMMARY))["active_constraints"] == ["[deleted memory]", "kWh only"]
    audit = msgspec.to_builtins(h.rt.memory.audit("demo", "dana"))
    assert {"event": "deleted", "fact": f["id"]}.items() <= audit[-1].items()
    # a later model call cannot bring it back; the panel can
    with pytest.raises(ValueError, match="deleted"):
        h.rt.memory.remember("demo", "dana", "Client Zephyr reports go to Ines")
    assert add(client, h, "dana", "Client Zephyr reports go to Ines")["status"] == "active"


def test_delete_all(env) -> None:
    h, client = env
    for t in ("Reports in English", "Energy is in kWh", "Head office is B07"):
        add(client, h, "dana", t)
    add(client, h, "erin", "Reports in English")
    thread = _thread_with_summary(h, client, "Head office is B07")
    r = client.delete("/api/memory?workspace=demo", headers=h.auth("dana"))
    assert r.status_code == 200 and len(r.json()["deleted"]) == 3
    body = client.get("/api/memory?workspace=demo", headers=h.auth("dana")).json()
    assert all(g == [] for g in body["facts"].values())
    assert b"B07" not in thread.read_doc(SUMMARY)
    # another user's memory in the same workspace is untouched
    assert len(client.get("/api/memory?workspace=demo", headers=h.auth("erin")).json()["facts"]["active"]) == 1
