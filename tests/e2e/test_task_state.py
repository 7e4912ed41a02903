"""The summary state and the task state in the browser (issue 18, item 2): a summarizer that
only answers prose leaves history unsummarised; the chat shows a small notice, the context
inspector the state with its reason; the user pins a message and typed words as constraints,
sees them, removes one; the next request to the model carries what is pinned."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import login, shot
from tests.e2e.test_web import api, until, wait_idle

pytestmark = pytest.mark.browser

SUMMARY_SYSTEM = "You maintain the running summary"


def big(i: int) -> str:
    """About 5,000 tokens of readings: eight of them pass the 32,000-token budget and its allowance."""
    return f"part {i} of the readings: " + " ".join(
        f"reading {j} at building {j % 20} was {j * 37 % 1000} kWh;" for j in range(i * 1000, i * 1000 + 420))


def test_summary_state_notice_pin_and_unpin(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.default_text = "Noted."  # turns and summary requests alike: a summary never comes of it
    token = server.token()
    with api(server, token) as c:
        tid = c.post("/api/threads", json={"title": "energy"}).json()["id"]
        assert c.post(f"/api/threads/{tid}/messages", json={"content": "energy use per building, exclude holidays"}
                      ).status_code == 200
        for i in range(1, 10):
            assert c.post(f"/api/threads/{tid}/messages", json={"content": big(i)}).status_code == 200
        state = c.get(f"/api/threads/{tid}/task-state").json()["summary"]
    assert state["state"] == "failed" and state["dropped_unsummarised_through_seq"], state

    login(page, server)
    page.goto(f"{server.base}/#t={tid}")
    notice = page.locator("#messages .notice.summary-state")
    notice.wait_for()
    assert "could not be updated" in notice.inner_text() and "no longer sent to the model" in notice.inner_text()

    page.click("#open-context")
    page.wait_for_selector("#ctx-summary-state[data-state='failed']")
    assert "no JSON object" in page.inner_text("#ctx-summary-state")
    assert "No goal or constraint" in page.inner_text("#ctx-task-state")
    page.fill("#ctx-task-input", "kWh only, no MWh")
    page.click(".task-form button[type=submit]")
    until(page, "document.querySelector('#ctx-task-state li') && "
                "document.querySelector('#ctx-task-state').textContent.includes('kWh only, no MWh')")
    assert "pinned by you" in page.inner_text("#ctx-task-state")
    shot(page, "task-state-inspector")

    # the user's own first message, pinned from the chat
    page.locator("#messages .msg.user .pin-msg").first.click()
    until(page, "document.querySelector('#toast').textContent.startsWith('Pinned')")
    with api(server, token) as c:
        items = c.get(f"/api/threads/{tid}/task-state").json()["task_state"]["items"]
        assert [(i["text"], i["source"], i["user_seq"]) for i in items if i["status"] == "active"] == [
            ("kWh only, no MWh", "user", None), ("energy use per building, exclude holidays", "user", 1)]
    page.click("#open-context")  # closes the inspector; opening it again renders it anew
    page.click("#open-context")
    until(page, "document.querySelectorAll('#ctx-task-state li').length === 2")
    page.locator("#ctx-task-state li", has_text="kWh only").locator("button.unpin").click()
    until(page, "document.querySelectorAll('#ctx-task-state li').length === 1")

    llm.clear()
    with api(server, token) as c:
        c.post(f"/api/threads/{tid}/messages", json={"content": "recompute"})
    turn = [r for r in llm.requests if not str(r["messages"][0]["content"]).startswith(SUMMARY_SYSTEM)][-1]
    sent = json.dumps(turn["messages"])
    assert "exclude holidays" in sent and "kWh only" not in sent and "dropped unsummarised" in sent
    assert page.js_errors == []
