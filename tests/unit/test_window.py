"""The skeleton's context window: budget, start at a user message, call/result pairing."""

from __future__ import annotations

import time
from pathlib import Path

from datadesk.context.window import NO_RESULT, build_messages
from datadesk.domain.records import Record, ToolCall
from datadesk.llm.tokens import count_messages
from datadesk.store.threadlog import ThreadLog


def add(log: ThreadLog, role: str, content: str = "", **kw) -> Record:
    return log.append(lambda seq: Record(seq=seq, role=role, ts=time.time(), content=content, **kw))


def test_parallel_results_in_any_order_follow_their_call(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    add(log, "user", "q")
    add(log, "assistant", tool_calls=[ToolCall("a", "sql_query", "{}"), ToolCall("b", "sql_query", "{}")])
    add(log, "tool", "rb", tool_call_id="b", name="sql_query")
    add(log, "user", "interjection")  # out of order in the log: must not split call from results
    add(log, "tool", "ra", tool_call_id="a", name="sql_query")
    msgs, records, stats = build_messages("sys", log, 10_000, count_messages)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert [m["tool_call_id"] for m in msgs[3:5]] == ["a", "b"]


def test_missing_result_gets_a_synthetic_one_and_orphans_are_dropped(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    add(log, "user", "q")
    add(log, "tool", "orphan", tool_call_id="zzz", name="x")
    add(log, "assistant", tool_calls=[ToolCall("a", "sql_query", "{}")])
    msgs, _, stats = build_messages("sys", log, 10_000, count_messages)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[-1] == {"role": "tool", "tool_call_id": "a", "content": NO_RESULT}
    assert stats["dropped_orphans"] == 1 and stats["synthetic_results"] == 1
    assert stats["estimated_tokens"] > 0


def test_budget_keeps_newest_and_starts_at_a_user_message(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    for i in range(300):
        add(log, "user", f"question {i} " + "pad " * 50)
        add(log, "assistant", f"answer {i} " + "pad " * 50)
    msgs, records, _ = build_messages("sys", log, 2_000, count_messages)
    assert msgs[1]["role"] == "user"
    assert msgs[-1]["content"].startswith("answer 299")
    assert count_messages(msgs[1:]) <= 2_000
    assert 5 < len(records) < 60
    assert records == sorted(records, key=lambda r: r.seq)


def test_failed_empty_assistant_steps_are_not_replayed(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    add(log, "user", "q")
    add(log, "assistant", "", status="error", meta={"error": "down"})
    add(log, "user", "again")
    msgs, _, _ = build_messages("sys", log, 10_000, count_messages)
    assert [m["role"] for m in msgs] == ["system", "user", "user"]
