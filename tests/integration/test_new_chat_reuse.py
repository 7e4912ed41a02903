"""'+ New chat' reuses the user's empty untitled chat instead of leaving another behind (issue 19)."""

from __future__ import annotations

from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel


def test_new_chat_reuses_an_empty_chat_only(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"))
    with TestClient(h.app()) as client:
        new = lambda **kw: client.post("/api/threads", json={"reuse_empty": True, **kw}, headers=h.auth("bob"))  # noqa: E731
        a = new().json()["id"]
        assert new().json()["id"] == a  # still empty: the same chat
        assert client.post("/api/threads", json={}, headers=h.auth("bob")).json()["id"] != a  # no reuse asked
        client.post(f"/api/threads/{a}/messages", json={"content": "hello"}, headers=h.auth("bob"))
        b = new().json()["id"]
        assert b != a
        client.patch(f"/api/threads/{b}", json={"title": "Q3 numbers"}, headers=h.auth("bob"))
        others = {new().json()["id"], new(title="Named").json()["id"], new(project="p1").json()["id"]}
        assert a not in others and b not in others and len(others) == 3  # a titled or labelled chat is new
        alice = client.post("/api/threads", json={"reuse_empty": True}, headers=h.auth("alice")).json()["id"]
        assert alice not in others | {a, b}  # never another user's
        assert client.post("/api/threads", json={"reuse_empty": "yes"}, headers=h.auth("bob")).status_code == 400
