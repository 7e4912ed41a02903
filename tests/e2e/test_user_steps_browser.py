"""Edit and re-run a step in Chromium (issue 31, item 2, its Done-when line): a card's SQL
edited and run shows a new "You ran" card with a new artifact, and the model's next request
carries the step."""

from __future__ import annotations

import json

import pytest

from datadesk.context.builder import USER_STEP_NOTE
from tests.e2e.conftest import login, shot
from tests.e2e.test_web import api, until

pytestmark = pytest.mark.browser

EDITED = "SELECT * FROM readings WHERE kwh > 1"


def test_an_edited_card_runs_as_the_users_step_and_reaches_the_model(server, page) -> None:
    llm = server.llm
    llm.clear()
    token = server.token()
    with api(server, token) as c:
        tid = c.post("/api/threads", json={"title": "steps"}).json()["id"]
        llm.add_tool_calls([{"id": "call_s1", "name": "sql_query", "arguments": {"sql": "SELECT * FROM readings"}}])
        llm.add_text("All readings are saved.")
        assert c.post(f"/api/threads/{tid}/messages", json={"content": "Get the readings"}).status_code == 200
        before = {a["id"] for a in c.get(f"/api/threads/{tid}/artifacts").json()}
    assert len(before) == 1

    login(page, server)
    page.goto(f"{server.base}/#t={tid}")
    page.wait_for_selector("#messages .tool-extras .edit-step")
    page.click("#messages .tool-extras .edit-step")
    assert page.input_value("#messages .step-input") == "SELECT * FROM readings"
    page.fill("#messages .step-input", EDITED)
    page.press("#messages .step-input", "Control+Enter")
    page.wait_for_selector("#messages .tool-card.user-step")
    card = page.locator("#messages .tool-card.user-step")
    assert "You ran" in card.inner_text()
    with api(server, token) as c:
        after = {a["id"] for a in c.get(f"/api/threads/{tid}/artifacts").json()}
    new = after - before
    assert len(new) == 1
    until(page, f"document.querySelector('#messages').textContent.includes({next(iter(new))!r})")
    shot(page, "user-step")

    # the SQL scratchpad: ad-hoc SQL on a picked source, run the same way
    page.click("#scratchpad-btn")
    page.wait_for_selector("#scratchpad .step-source option[value='warehouse']", state="attached")
    page.fill("#scratchpad .step-input", "SELECT count(*) AS n_buildings FROM buildings")
    page.click("#scratchpad .step-run")
    until(page, "document.querySelectorAll('#messages .tool-card.user-step').length === 2")
    assert page.locator("#scratchpad").count() == 0

    llm.default_text = "The edited step keeps fewer rows."
    page.fill("#input", "What did my query change?")
    page.click("#send")
    until(page, "[...document.querySelectorAll('#messages .msg.assistant')]"
                ".some(e => e.textContent.includes('fewer rows'))")
    req = next(r for r in reversed(llm.requests) if r["messages"][-1].get("content") == "What did my query change?")
    sent = json.dumps(req["messages"])
    assert EDITED in sent and json.dumps(USER_STEP_NOTE)[1:-1] in sent and "n_buildings" in sent
    assert not page.js_errors, page.js_errors


def test_python_steps_run_in_the_threads_warm_kernel(server) -> None:
    from tests.conftest import parse_sse
    with api(server, server.token()) as c:
        tid = c.post("/api/threads", json={"title": "python steps"}).json()["id"]
        first = c.post(f"/api/threads/{tid}/steps", json={"tool": "python", "arguments": {"code": "x = 6 * 7"}})
        assert first.status_code == 200, first.text
        assert parse_sse(first.text)[-1][1]["status"] == "ok"
        second = parse_sse(c.post(f"/api/threads/{tid}/steps",
                                  json={"tool": "python", "arguments": {"code": "print(x)"}}).text)
        finished = next(d for e, d in second if e == "tool.finished")
        assert finished["ok"] and "42" in finished["preview"]
