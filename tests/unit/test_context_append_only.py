"""The cache-friendly window (issue 18, item 5): append-only between trims, trims in one
large chunk, the budget always held.

While nothing forces a change (`window_change == "append"`), every message of the previous
request is byte-for-byte the start of the next one: old tool results keep the form they
were shown in instead of turning into stubs as they age. When the budget forces a change,
it is made once: results are re-compacted by age and whole turns dropped from the start
until at most `trim_target_fraction` of the budget is left (at least a chunk).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from datadesk.context.builder import BuiltContext
from datadesk.domain.records import ToolCall
from datadesk.llm.tokens import count_tokens
from tests.unit.test_context_properties import (
    ThreadUnderTest,
    huge_text,
    make_builder,
    turn_text,
    turns,
    write_and_build,
)


def encoded(built: BuiltContext) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in built.messages]


def tool_turn(th: ThreadUnderTest, i: int, result_chars: int, answer_tokens: int) -> None:
    th.add("assistant", tool_calls=[ToolCall(f"call_{i}", "sql_query", f'{{"sql": "SELECT {i}"}}')])
    th.add("tool", huge_text(i, result_chars), tool_call_id=f"call_{i}", name="sql_query", meta={"rows": 100})


def test_the_prefix_stays_until_a_trim_and_a_trim_drops_a_large_chunk(tmp_path: Path) -> None:
    budget = 24_000  # a turn (question, a ~6,000-char result, an answer) is ~16% of it
    b = make_builder(tmp_path, history_budget_tokens=budget)
    th = ThreadUnderTest(tmp_path / "t", b)
    prev: BuiltContext | None = None
    changes = []
    for i in range(30):
        th.add("user", turn_text(i, 40))
        for step in (1, 2):
            built = th.build()
            m = built.manifest
            assert m.regions["history"] + m.regions["current"] <= budget + 2  # the budget holds
            if prev is not None:
                changes.append(m.window_change)
                if m.window_change == "append":
                    assert encoded(built)[:len(prev.messages)] == encoded(prev)  # nothing before changed
                    assert m.first_seq == prev.manifest.first_seq
                else:
                    assert m.window_change in ("trimmed", "recompacted")
                    assert prev.manifest.regions["history"] + prev.manifest.regions["current"] > 0.5 * budget
                    if m.window_change == "trimmed":
                        # one large drop: the window is left at most half full, so it can grow again
                        assert m.regions["history"] + m.regions["current"] <= 0.5 * budget + 2
            prev = built
            if step == 1:
                tool_turn(th, i, 6_000, 0)
        th.add("assistant", turn_text(i + 500, 700))
    assert changes.count("trimmed") >= 3  # long enough to trim several times
    assert changes.count("append") >= 0.8 * len(changes), changes  # and append-only otherwise


def test_old_results_keep_their_form_until_a_trim_forces_the_change(tmp_path: Path) -> None:
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path, history_budget_tokens=20_000))
    for i in range(4):
        th.add("user", f"question {i}")
        tool_turn(th, i, 3_000, 0)
        th.add("assistant", f"answer {i}")
        built = th.build()
    assert built.manifest.window_change == "append" and not built.manifest.compacted  # 4 turns old, still whole
    aged = ThreadUnderTest(tmp_path / "a", make_builder(tmp_path, history_budget_tokens=20_000, append_only=False))
    for i in range(4):
        aged.add("user", f"question {i}")
        tool_turn(aged, i, 3_000, 0)
        aged.add("assistant", f"answer {i}")
        old = aged.build()
    assert old.manifest.window_change == "aged" and len(old.manifest.compacted) == 2  # compacted by age


def test_newest_turns_larger_than_the_target_trim_only_what_the_budget_needs(tmp_path: Path) -> None:
    """Two recent results of ~40% of the budget each: dropping to the target would empty the
    window of every older turn for nothing; the trim keeps the older stubs the budget allows."""
    budget = 8_000
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path, history_budget_tokens=budget,
                                                       recent_result_chars=12_000))
    for i in range(12):
        th.add("user", f"question {i}")
        th.add("assistant", tool_calls=[ToolCall(f"c{i}", "sql_query", "{}")])
        th.add("tool", "x " * 3_300, tool_call_id=f"c{i}", name="sql_query")
        th.add("assistant", f"answer {i}")
        built = th.build()
        m = built.manifest
        assert m.regions["history"] + m.regions["current"] <= budget + 2
    assert m.compacted, m  # older turns are still there, as stubs
    assert count_tokens("x " * 3_300) > 0.4 * budget


# DATADESK_PROPERTY_EXAMPLES=2000 explores further
@settings(max_examples=int(__import__("os").environ.get("DATADESK_PROPERTY_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=turns(), budget=st.integers(2_000, 6_000) | st.integers(2_000, 40_000))
def test_random_threads_are_append_only_between_forced_changes(plan, budget) -> None:
    for turn in plan:  # images are the one other thing that may change (max_images): not here
        turn.upload = None
        for step in turn.steps:
            step.images = [0] * len(step.images)
    with tempfile.TemporaryDirectory() as tmp:
        th = ThreadUnderTest(Path(tmp) / "thread", make_builder(Path(tmp), history_budget_tokens=budget))
        builds = [b for b, _ in write_and_build(th, plan)]
    for prev, cur in zip(builds, builds[1:]):
        if cur.manifest.window_change == "append":
            assert encoded(cur)[:len(prev.messages)] == encoded(prev)
        m = cur.manifest
        if m.regions["current"] <= budget:
            assert m.regions["history"] + m.regions["current"] <= budget + 2


def test_a_trim_waits_for_the_summary_with_the_bytes_unchanged(tmp_path: Path) -> None:
    """No gap: a forced trim that would drop uncovered records waits (within the allowance)
    with every byte as it was, and asks for the summary; once the summary covers, the trim
    comes in one change."""
    from datadesk.context.builder import Coverage
    from datadesk.context.manifest import append_manifest

    budget = 24_000
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path, history_budget_tokens=budget))

    def build(covered: int) -> BuiltContext:
        built = th.builder.build(th.thread, model=th.model, system_prompt="You are DataDesk.", tools=[],
                                 turn_id="t", step=1, coverage=Coverage(covered_through=covered))
        append_manifest(th.thread, built.manifest)
        return built

    prev = None
    for i in range(30):
        th.add("user", turn_text(i, 40))
        built = build(0)
        if prev is not None and built.manifest.over_budget_through_seq:
            break
        prev = built
        tool_turn(th, i, 6_000, 0)
        th.add("assistant", turn_text(i + 500, 700))
    m = built.manifest
    assert m.window_change == "append" and m.first_seq == 1 and not built.needs_summary
    assert encoded(built)[:len(prev.messages)] == encoded(prev)  # waiting changed nothing before
    assert budget < m.regions["history"] + m.regions["current"] <= 1.25 * budget + 2
    covered = m.over_budget_through_seq
    after = build(covered)  # the summary landed: now the trim, once, large
    assert after.manifest.window_change == "trimmed" and after.manifest.first_seq > covered
    assert after.manifest.regions["history"] + after.manifest.regions["current"] <= 0.5 * budget + 2
