"""Edit a question, regenerate an answer, in Chromium (issue 31, item 3, its Done-when line): the
old branch stays reachable through the "‹ n / m ›" switcher and out of the model's request."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import login, shot
from tests.e2e.test_web import api, until

pytestmark = pytest.mark.browser


def _chat_request(llm, question: str) -> str:
    """The model request of the turn that asked `question` (its last message), as text."""
    found = [r for r in llm.requests if r["messages"][-1].get("role") == "user"
             and r["messages"][-1].get("content") == question]
    assert found, f"no model request ended with {question!r}"
    return json.dumps([m.get("content") for m in found[-1]["messages"]])


def _answered(page, text: str) -> None:
    until(page, "[...document.querySelectorAll('#messages .msg.assistant')]"
                f".some(e => e.textContent.includes({text!r}))")


def test_edit_and_regenerate_keep_the_old_branch_reachable(server, page) -> None:
    llm = server.llm
    llm.clear()
    token = server.token()
    with api(server, token) as c:
        tid = c.post("/api/threads", json={"title": "branches"}).json()["id"]
        llm.default_text = "Answer one: 20 buildings."
        assert c.post(f"/api/threads/{tid}/messages", json={"content": "How many buildings?"}).status_code == 200
        llm.default_text = "Answer two: Tuesday peaks."
        assert c.post(f"/api/threads/{tid}/messages", json={"content": "Which weekday peaks?"}).status_code == 200

    login(page, server)
    page.goto(f"{server.base}/#t={tid}")
    page.wait_for_selector("#messages .msg.user .edit-msg")
    assert page.locator("#messages .branch-switch").count() == 0  # no branch yet

    # edit the second question inline: Save & submit asks it; the thread continues from answer one
    llm.default_text = "Answer edited: 42 sites."
    page.locator("#messages .msg.user .edit-msg").nth(1).click()
    page.fill("#messages .edit-area", "How many sites in total?")
    page.click("#messages .edit-save")
    _answered(page, "Answer edited")
    page.wait_for_selector("#messages .branch-switch")
    assert page.inner_text("#messages .branch-switch .branch-pos") == "2 / 2"
    assert "Tuesday peaks" not in page.inner_text("#messages")
    sent = _chat_request(llm, "How many sites in total?")
    assert "How many buildings?" in sent and "Which weekday peaks?" not in sent and "Tuesday peaks" not in sent

    # the earlier branch, read-only, through the switcher; then back to the newest
    page.click("#messages .branch-switch .branch-prev")
    page.wait_for_selector("#messages .branch-view")
    view = page.inner_text("#messages .branch-view")
    assert "Which weekday peaks?" in view and "Tuesday peaks" in view
    assert page.locator("#messages .branch-view .edit-msg").count() == 0
    shot(page, "branches-earlier")
    page.click("#messages .branch-switch .branch-next")
    until(page, "!document.querySelector('#messages .branch-view')")
    assert page.locator("#messages .msg.assistant:visible").last.inner_text().startswith("Answer edited")

    # regenerate the last answer: a new one; the edited one stays reachable
    llm.default_text = "Answer regenerated: 42 sites, checked."
    page.click("#messages .regenerate")
    _answered(page, "Answer regenerated")
    until(page, "document.querySelector('#messages .branch-switch .branch-pos') && "
                "document.querySelector('#messages .branch-switch .branch-pos').textContent === '3 / 3'")
    regen = _chat_request(llm, "How many sites in total?")
    assert "Answer edited" not in regen and "Tuesday peaks" not in regen and "Which weekday peaks?" not in regen
    page.click("#messages .branch-switch .branch-prev")
    page.wait_for_selector("#messages .branch-view")
    assert "Answer edited: 42 sites." in page.inner_text("#messages .branch-view")
    shot(page, "branches-regenerated")
    assert not page.js_errors, page.js_errors
