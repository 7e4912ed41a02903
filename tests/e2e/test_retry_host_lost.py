"""Retry after a host died mid-turn, in a real browser (issue 29 item 1), on the cluster set:
two `datadesk serve` hosts (PostgreSQL + SeaweedFS, tests/cluster/test_takeover.py `hosts`).

A turn runs on host A (a SQL step, then a slow answer); the page is open on host B and follows
it. A is SIGKILLed: within 15 s the page shows "this turn stopped with the server that ran it"
with a Retry button (B's follower gets the takeover's `error` (host_lost) + `done`). Retry sends
the same question as a new turn via B: the thread then has a second user record with the same
text, in a new turn that finished with the model's answer, which the page shows; a reload draws
the same from the log.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

import pytest

import tests.cluster.test_takeover as takeover
from datadesk.chat.interrupted import HOST_NOTICE
from datadesk.domain.records import HOST_LOST
# the cluster servers and the two hosts, reused: tests/cluster/conftest.py is not visible from here
from tests.cluster.conftest import cluster_db_url, cluster_pg, s3, seaweed  # noqa: F401
from tests.cluster.test_takeover import add_user, client, finished_records, hosts, start_followed_turn  # noqa: F401
from tests.e2e.conftest import shot
from tests.e2e.test_web import until, wait_idle
from tests.fakes.openai_server import FakeReply

# cluster: on its worker's PostgreSQL and SeaweedFS (session fixtures); not serial:
# the killed host is not started again, so no port is held across a restart
pytestmark = [pytest.mark.browser, pytest.mark.cluster]

QUESTION = "tell me a story"  # "story": takeover.respond's SQL step, then the slow answer
NOTICE = "#messages .notice.interrupted"
RETRIED = "Retried on another host:"
STORY_TURN = takeover.respond  # kept: the fixture below puts `Model` in its place


class Model:
    """The fake model of both hosts: takeover's story (a SQL step, then the answer streamed
    slowly, here over 60 s: time enough to open the page on a loaded machine) while host A runs
    the turn; once A is gone, a short answer naming the question."""

    def __init__(self) -> None:
        self.slow = True

    def __call__(self, req: dict[str, Any]) -> FakeReply:
        if self.slow:
            reply = STORY_TURN(req)
            return dataclasses.replace(reply, delay_s=0.15) if reply.delay_s else reply
        messages = req.get("messages") or []
        user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        return FakeReply(text=f"{RETRIED} {user}", chunks=2)


@pytest.fixture
def model(monkeypatch) -> Model:
    """Put before `hosts` in a test's arguments: the hosts' fake model answers with it."""
    fake = Model()
    monkeypatch.setattr(takeover, "respond", fake)  # `hosts` sets `fake.responder = respond`
    return fake


def open_on_b(browser, base: str, token: str, tid: str) -> tuple[Any, Any, list[str]]:
    """A page signed in on host B with thread `tid` open; returns (context, page, its JS errors
    and console errors)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.goto(f"{base}/#t={tid}")
    page.fill("#login-secret", token)
    page.press("#login-secret", "Enter")
    page.wait_for_selector("#app-view:not([hidden])")
    # from here on (before: the 401 of GET /api/me that shows the login form)
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    return ctx, page, errors


def thread_records(base: str, token: str, tid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with client(base, token) as c:
        body = c.get(f"/api/threads/{tid}").json()
    return body["thread"], body["records"]


def check_retry_recorded(base: str, token: str, tid: str, lost_turn: str) -> list[dict[str, Any]]:
    """The Retry is a new turn with the same question, finished with the model's answer."""
    thread, records = thread_records(base, token, tid)
    asked = [r for r in records if r["role"] == "user"]
    assert [r["content"] for r in asked] == [QUESTION, QUESTION], [(r["role"], r["content"]) for r in records]
    assert asked[0]["turn_id"] == lost_turn and asked[1]["turn_id"] not in (None, lost_turn), asked
    new = [r for r in records if r["turn_id"] == asked[1]["turn_id"]]
    assert [r["role"] for r in new] == ["user", "assistant"], new
    assert new[-1]["content"] == f"{RETRIED} {QUESTION}" and new[-1].get("status", "ok") == "ok", new[-1]
    assert thread.get("turn") is None, thread  # nothing runs on the thread any more
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    return records


def test_retry_after_the_host_running_the_turn_died(model, hosts, browser) -> None:
    token = add_user(hosts, "carol")
    (_, proc_a), (b, _) = hosts["a"], hosts["b"]
    tid, _, _, before = start_followed_turn(hosts, token)  # the turn runs on A; an API client follows via B
    lost_turn = before[0]["turn_id"]
    ctx, page, errors = open_on_b(browser, b, token, tid)
    try:
        # re-attached via B: the question, the SQL card and the answer streaming from A
        until(page, "document.querySelectorAll('.msg.user').length === 1 && "
                    "[...document.querySelectorAll('.msg.assistant')].some((m) => m.textContent.includes('word'))", 30)
        page.wait_for_selector("#stop:not([hidden])")
        assert not page.locator(NOTICE).count()
        model.slow = False
        killed = time.monotonic()
        os.killpg(proc_a.pid, signal.SIGKILL)
        proc_a.wait(10)
        page.wait_for_selector(f"{NOTICE} button.retry", timeout=15_000)
        took = time.monotonic() - killed
        assert HOST_NOTICE in page.inner_text(NOTICE), page.inner_text(NOTICE)
        assert page.locator(".msg.assistant.interrupted").count() == 1  # the answer so far, marked
        wait_idle(page)  # the turn ended (`done`): Send is back
        lost = finished_records(b, token, tid, timeout=15)[-1]
        assert lost["turn_id"] == lost_turn and lost["meta"]["kind"] == HOST_LOST
        shot(page, "host-lost-retry")

        page.click(f"{NOTICE} button.retry")
        until(page, "document.querySelectorAll('.msg.user').length === 2", 15)
        wait_idle(page)
        until(page, f"[...document.querySelectorAll('.msg.assistant')].some((m) => "
                    f"m.textContent.includes({f'{RETRIED} {QUESTION}'!r}))", 30)
        assert page.locator(".msg.user").nth(1).inner_text().startswith(QUESTION)
        records = check_retry_recorded(b, token, tid, lost_turn)

        page.reload()  # drawn from the log: the cut-off turn with its notice and Retry, then the retry
        page.wait_for_selector(f"{NOTICE} button.retry")
        until(page, "document.querySelectorAll('.msg.user').length === 2")
        assert HOST_NOTICE in page.inner_text(NOTICE)
        assert f"{RETRIED} {QUESTION}" in page.locator(".msg.assistant").last.inner_text()
    finally:
        ctx.close()
    assert not errors, errors
    print(f"\nthe page showed the notice and Retry {took:.2f} s after SIGKILL of host A; "
          f"{len(records)} records after the retry")
