"""Summaries back off after repeated failures (issue 31, item 6): a summarizer that always
answers badly is not asked on every turn of a long thread, and the status says it paused.

The chat model and the summarizer are the real `OpenAIChatModel` against the fake server
(tests/fakes/openai_server.py), which counts the summarizer's calls.
"""

from __future__ import annotations

import json
import re

import pytest

from datadesk.llm.client import OpenAIChatModel
from datadesk.settings import LLMSettings
from datadesk.summary import service as summary_service
from tests.conftest import wait_until
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.test_summary_models import is_summary_request, never_a_summary, turn_reply
from tests.scenarios import SEED, register_chart_spec

TURNS = 40


def run_long_thread(harness_factory, server: FakeOpenAIServer) -> tuple[int, dict, list[int]]:
    """40 turns against a summarizer that never answers JSON: (summarizer calls, the
    summary state after, the summarizer calls counted after each turn)."""
    server.responder = lambda req: never_a_summary(req) if is_summary_request(req) else turn_reply(req)
    llm = LLMSettings(base_url=server.base_url, api_key="k", model="fake-model", max_retries=0)
    h = harness_factory(OpenAIChatModel(llm), context={"history_budget_tokens": 6_000}, summary={"enabled": True})
    register_chart_spec(h.rt, {i: f"chart spec {i}: " + ("colour=#%06x; " % (i * 4999)) * 900 for i in range(TURNS)})
    counts: list[int] = []
    with h.client("bob", served=True, timeout=120) as api:
        c, tid = api.client, api.tid
        assert c.post(f"/api/threads/{tid}/messages", json={"content": SEED}).status_code == 200
        for i in range(1, TURNS):
            c.post(f"/api/threads/{tid}/messages", json={"content": f"make the chart colours warmer ({i})"})
            wait_until(lambda: h.rt.summaries.pending == 0, timeout=60)
            counts.append(sum(1 for r in server.requests if is_summary_request(r)))
        state = c.get(f"/api/threads/{tid}/task-state").json()["summary"]
    return counts[-1], state, counts


@pytest.fixture
def server():
    with FakeOpenAIServer(models=None) as srv:
        yield srv


def test_a_summarizer_that_always_fails_is_asked_a_bounded_number_of_times(server, harness_factory) -> None:
    calls, state, counts = run_long_thread(harness_factory, server)
    # 2 calls a refresh (summary.max_attempts); pauses of 8, 16, 32, 64, 128 records over ~160
    print("summarizer calls per turn:", counts)
    assert 4 <= calls <= 16, counts
    assert counts[-1] == counts[-10], f"still asked in the last turns: {counts}"
    assert state["state"] == "failed", state
    assert re.search(r"summaries paused after \d+ failures, next try after record #\d+", state["reason"]), state
    assert "no JSON object" in state["reason"]


def test_without_the_back_off_it_would_be_asked_every_turn(server, harness_factory, monkeypatch) -> None:
    """The same thread with the back-off switched off: the bound above is what the back-off buys."""
    monkeypatch.setattr(summary_service, "BACKOFF_AFTER", 10_000)
    calls, state, _ = run_long_thread(harness_factory, server)
    print("without back-off:", calls)
    assert calls > 40 and "paused" not in state["reason"], (calls, state)


def test_the_back_off_survives_a_reload_and_a_settings_change_resets_it() -> None:
    import msgspec

    from datadesk.summary.status import SummaryStatus

    stored = msgspec.json.encode(SummaryStatus(state="failed", reason="x", attempted_through=40, epoch=1,
                                               failures=3, next_try_seq=56, fingerprint="abc"))
    status = msgspec.json.decode(stored, type=SummaryStatus)  # what a restarted server reads
    assert status.backing_off(50, "abc") and not status.backing_off(56, "abc")
    assert not status.backing_off(50, "other settings")
    ok = SummaryStatus(state="ok", attempted_through=40, epoch=1, next_try_seq=56, fingerprint="abc")
    assert not ok.backing_off(50, "abc")
