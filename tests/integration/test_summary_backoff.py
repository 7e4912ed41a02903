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
from tests.conftest import wait_until
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.test_summary_models import is_summary_request, never_a_summary, turn_reply
from tests.scenarios import SEED, register_chart_spec

TURNS = 40


def run_long_thread(harness_factory, server: FakeOpenAIServer, **summary: object) -> tuple[int, dict, list[int]]:
    """40 turns against a summarizer that never answers JSON: (summarizer calls, the
    summary state after, the summarizer calls counted after each turn); `summary`: more
    `[summary]` settings."""
    server.responder = lambda req: never_a_summary(req) if is_summary_request(req) else turn_reply(req)
    llm = LLMSettings(base_url=server.base_url, api_key="k", model="fake-model", max_retries=0)
    h = harness_factory(OpenAIChatModel(llm), context={"history_budget_tokens": 6_000}, summary={"enabled": True, **summary})
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


def test_without_the_back_off_it_would_be_asked_every_turn(server, harness_factory) -> None:
    """The same thread with the back-off switched off (`summary.backoff_after = 0`): the bound
    above is what the back-off buys."""
    calls, state, _ = run_long_thread(harness_factory, server, backoff_after=0)
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


def test_configured_back_off_settings_are_honoured(tmp_path) -> None:
    """`summary.backoff_after` and `summary.backoff_max_records` replace the built-in 2 and 256:
    here the first failure pauses, and no pause is longer than 5 records."""
    import asyncio

    from datadesk.llm.scripted import ScriptedModel
    from datadesk.settings import SummarySettings
    from datadesk.summary.service import SummaryService
    from datadesk.summary.status import SummaryStatusStore
    from datadesk.summary.store import SummaryStore
    from datadesk.summary.summarizer import Summarizer
    from tests.unit.test_summary import chat, make_thread

    settings = SummarySettings(backoff_after=1, backoff_max_records=5)
    model = ScriptedModel(then="not a summary")
    status = SummaryStatusStore()
    service = SummaryService(SummaryStore(), Summarizer(model, settings), settings, status)
    tdir = make_thread(tmp_path)
    last = chat(tdir, *[(f"question {i}", f"answer {i}") for i in range(30)])
    seen = []
    for upto in range(4, last + 1):
        before = len(model.calls)
        asyncio.run(service.refresh(tdir, upto, 0))
        if len(model.calls) > before:
            s = status.load(tdir, 0)
            seen.append((upto, s.failures, s.next_try_seq))
    # failure 1 already pauses (the default waits for 2): 4 records, then 8 -> 5, 16 -> 5, ...
    assert seen[0] == (4, 1, 8), seen
    assert seen[1] == (8, 2, 13), seen
    assert all(nxt - upto == 5 for upto, _f, nxt in seen[1:]), seen
    assert [f for _u, f, _n in seen] == list(range(1, len(seen) + 1))
    assert f"summaries paused after {len(seen)} failures" in status.load(tdir, 0).reason


def test_a_bad_back_off_setting_is_refused_by_name(tmp_path) -> None:
    import pytest as _pytest

    from datadesk.settings import SettingsError, load_settings

    (tmp_path / "datadesk.toml").write_text("[summary]\nbackoff_max_records = 0\n")
    with _pytest.raises(SettingsError, match=r"datadesk.toml.*>= 1.*summary.backoff_max_records"):
        load_settings({"DATADESK_HOME": str(tmp_path)})
    (tmp_path / "datadesk.toml").write_text("[summary]\nbackoff_after = -1\n")
    with _pytest.raises(SettingsError, match=r">= 0.*summary.backoff_after"):
        load_settings({"DATADESK_HOME": str(tmp_path)})
