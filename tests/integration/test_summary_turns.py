"""Summaries in real turns: the seed scenario keeps "exclude holidays" after 15 turns about
chart colours; clearing during a background summary job writes nothing back."""

from __future__ import annotations

import asyncio
import json
import threading


from datadesk.llm.scripted import ScriptedModel, tool_step
from tests.scenarios import SEED, chart_specs, register_chart_spec
from tests.conftest import wait_until
from tests.unit.test_summary import faithful



def seed_run(harness_factory, summaries: bool, budget: int = 6_000):
    big = chart_specs(900)
    steps: list = [tool_step("sql_query", {"sql": "SELECT 1"}, call_id="call_q"), "Last month, holidays excluded."]
    for i in range(1, 16):
        steps += [tool_step("chart_spec", {"variant": i}, call_id=f"call_c{i}"), f"Colours updated ({i})."]
    steps += ["Recomputed."]
    model = ScriptedModel(steps)
    summarizer = ScriptedModel(then=faithful)
    h = harness_factory(model, summary_model=summarizer, context={"history_budget_tokens": budget},
                        summary={"enabled": summaries})

    register_chart_spec(h.rt, big)
    with h.client("bob", served=True, timeout=60) as api:
        c, tid = api.client, api.tid
        c.post(f"/api/threads/{tid}/messages", json={"content": SEED})
        for i in range(1, 16):
            c.post(f"/api/threads/{tid}/messages", json={"content": f"make the chart colours warmer ({i})"})
            wait_until(lambda: h.rt.summaries.pending == 0)  # this turn's summary job has finished
        c.post(f"/api/threads/{tid}/messages", json={"content": "recompute"})
        tdir = h.rt.threads.get(tid, "bob", ["demo"]).dir
    manifests = [json.loads(x) for x in (tdir / "context.jsonl").read_text().splitlines()]
    return model, summarizer, manifests


def test_seed_constraint_is_carried_by_the_summary(harness_factory) -> None:
    model, summarizer, manifests = seed_run(harness_factory, summaries=True)
    recompute = model.calls[-1]
    text = json.dumps(recompute)
    assert "exclude holidays" in text.lower()
    assert SEED not in [m.get("content") for m in recompute if m["role"] == "user"]  # the turn itself left
    assert manifests[-1]["summary"]["covers_through_seq"] >= 1
    assert summarizer.calls, "the summarizer was never asked"
    assert all(m.get("gap_through_seq") is None for m in manifests)  # no record left uncovered
    # the summarizer only ever saw records that had left the window, incrementally
    mean = sum(m["estimated_tokens"] for m in manifests) / len(manifests)
    print(f"\nseed scenario with summary: mean request tokens {mean:,.0f}, last {manifests[-1]['estimated_tokens']:,}")


def test_without_summaries_the_constraint_is_lost(harness_factory) -> None:
    model, _, manifests = seed_run(harness_factory, summaries=False)
    assert "exclude holidays" not in json.dumps(model.calls[-1]).lower()
    mean = sum(m["estimated_tokens"] for m in manifests) / len(manifests)
    print(f"\nseed scenario without summary: mean request tokens {mean:,.0f}, "
          f"last {manifests[-1]['estimated_tokens']:,}")


def test_seed_scenario_without_any_trimming(harness_factory) -> None:
    model, _, manifests = seed_run(harness_factory, summaries=False, budget=200_000)
    assert len(manifests) == len(model.calls) == 33  # 17 turns: a tool step and a reply each, but the last
    assert all(m["trimmed_through_seq"] == 0 and m["first_seq"] == 1 for m in manifests), \
        [(m["first_seq"], m["trimmed_through_seq"]) for m in manifests]
    assert all(m.get("gap_through_seq") is None and m.get("summary") is None for m in manifests)
    recompute = model.calls[-1]
    assert SEED in [m.get("content") for m in recompute if m["role"] == "user"]  # the first turn is still there
    assert "exclude holidays" in json.dumps(recompute).lower()
    mean = sum(m["estimated_tokens"] for m in manifests) / len(manifests)
    print(f"\nseed scenario, whole history (no trimming): mean request tokens {mean:,.0f}, "
          f"last {manifests[-1]['estimated_tokens']:,}")


def test_clear_during_a_summary_job_writes_nothing_back(harness_factory) -> None:
    gate = threading.Event()
    started = threading.Event()
    answered = threading.Event()

    async def gated(messages, tools):
        started.set()
        while not gate.is_set():
            await asyncio.sleep(0.01)
        answered.set()  # the job goes on to write, after the clear
        return faithful(messages, tools)

    model = ScriptedModel(then="ok")
    h = harness_factory(model, summary_model=ScriptedModel(then=gated),
                        context={"history_budget_tokens": 400}, summary={"enabled": True})
    with h.client("bob", served=True, timeout=60) as api:
        c, tid = api.client, api.tid
        for i in range(12):
            c.post(f"/api/threads/{tid}/messages", json={"content": f"constraint: rule {i}. " + "pad " * 40})
            if started.is_set():
                break
        assert started.wait(20), "no summary job started"
        tdir = h.rt.threads.get(tid, "bob", ["demo"]).dir
        assert c.post(f"/api/threads/{tid}/clear").status_code == 200
        gate.set()
        assert answered.wait(10), "the summary job was not left to finish"
        wait_until(lambda: h.rt.summaries.pending == 0)  # it tried to write, and was refused
        assert not (tdir / "summary.json").exists()
        assert c.get(f"/api/threads/{tid}").json()["records"] == []
