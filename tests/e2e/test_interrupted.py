"""A turn cut off by a dying server, in a real browser: `datadesk serve` is SIGKILLed while the
answer streams and started again on the same port; the chat shows the answer so far marked
interrupted with Retry (live, or after a reload), and Retry sends the question again."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from tests.conftest import free_port
from tests.e2e.conftest import shot
from tests.e2e.test_web import new_chat, until, wait_idle
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.integration.test_interrupted_turns import STORY, kill, serve

# serial: SIGKILL while the answer streams, then a restart on the same port (which another test
# could take meanwhile)
pytestmark = [pytest.mark.browser, pytest.mark.faults, pytest.mark.serial]

NOTICE = "#messages .notice.interrupted"


def story_once() -> Any:
    """The first question gets a long answer streamed slowly; any later one a short answer."""
    count = itertools.count()

    def respond(req: dict[str, Any]) -> FakeReply:
        last = (req.get("messages") or [{}])[-1]
        if last.get("role") == "user" and next(count) == 0:
            return FakeReply(text=STORY, chunks=600, delay_s=0.05)
        return FakeReply(text=f"Short answer to: {last.get('content')}", chunks=2)

    return respond


def test_an_answer_cut_off_by_a_killed_server_shows_interrupted_and_retry_asks_again(home: Path, browser) -> None:
    _, token = UserStore(Layout(home)).add("alice", ["demo"], [])
    port = free_port()
    with FakeOpenAIServer() as fake:
        fake.responder = story_once()
        ctx = browser.new_context(viewport={"width": 1280, "height": 860})
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        with serve(home, fake, port=port, log_name="first.log") as (base, proc, _, _):
            page.goto(base)
            page.fill("#login-secret", token)
            page.press("#login-secret", "Enter")
            page.wait_for_selector("#app-view:not([hidden])")
            new_chat(page)
            page.fill("#input", "Tell me a long story")
            page.press("#input", "Enter")
            until(page, "(document.querySelector('.msg.assistant') || {}).textContent?.length > 300", 30)
            time.sleep(0.6)  # what the page shows has reached the turn's journal
            kill(proc)
        with serve(home, fake, port=port, log_name="second.log"):
            # the page re-attaches (five tries) and gets the end live, or is redrawn from the log
            deadline = time.time() + 20
            while not page.locator(NOTICE).count() and time.time() < deadline:
                page.wait_for_timeout(200)
            live = page.locator(NOTICE).count() > 0
            if not live:
                page.reload()
                page.wait_for_selector(NOTICE)
            wait_idle(page)
            assert "the server stopped while this answer was being written" in page.inner_text(NOTICE)
            bubble = page.locator(".msg.assistant.interrupted")
            assert bubble.count() == 1 and STORY.startswith(bubble.inner_text().strip()[:200])
            page.reload()  # as drawn from the log: the same, with Retry
            page.wait_for_selector(f"{NOTICE} button.retry")
            assert page.locator(".msg.assistant.interrupted").count() == 1
            shot(page, "interrupted-answer-retry")
            page.click(f"{NOTICE} button.retry")
            until(page, "document.querySelectorAll('.msg.user').length === 2")
            wait_idle(page)
            until(page, "[...document.querySelectorAll('.msg.assistant')].some((m) => "
                        "m.textContent.includes('Short answer to: Tell me a long story'))")
            assert page.locator(".msg.user").nth(1).inner_text().startswith("Tell me a long story")
            assert page.input_value("#input") == ""
        ctx.close()
    assert not errors, errors
    print(f"\nthe page got the end of the cut-off turn {'live (re-attached)' if live else 'after a reload'}")
