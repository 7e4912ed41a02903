"""Finishing a turn cut off by a dead process (chat/interrupted.py, chat/recovery.py): on real
thread folders, journals and file locks, with several processes racing to finish."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from pathlib import Path

import msgspec

from datadesk.chat.interrupted import ANSWER_NOTICE, LOST_EVENTS, TOOL_NOTICE, finish_thread
from datadesk.chat.journal import file_ended, follow_file, read_event_file
from datadesk.chat.recovery import CutOffTurns
from datadesk.chat.turns import TurnRegistry
from datadesk.domain.records import Record, ToolCall
from datadesk.sandbox.ownership import file_lock
from datadesk.store.layout import Layout
from datadesk.store.threads import Thread, ThreadStore

TURN = "turncut1"


def thread_with(home: Path, records: list[dict], events: list[dict], torn: bool = False) -> Thread:
    """A thread whose turn TURN left `records` in the log and `events` in its journal, no `done`."""
    thread = ThreadStore(Layout(home)).create("demo", "alice")
    for fields in records:
        thread.append(lambda seq, f=fields: Record(seq=seq, ts=time.time(), turn_id=TURN, **f))
    lines = [json.dumps({"turn": TURN, "pid": 999_999, "started": time.time() - 5})]
    lines += [json.dumps(e) for e in events]
    thread.events_path.write_text("\n".join(lines) + ("\n" if not torn else '\n{"n": 9, "ty'))
    return thread


def records(thread: Thread) -> list[Record]:
    return list(thread.log)


async def _collect(path: Path) -> list:
    return [ev async for ev in follow_file(path, TURN, lambda tid: False)]


def test_a_cut_off_answer_is_recorded_once_with_the_text_written_so_far(tmp_path: Path) -> None:
    thread = thread_with(tmp_path, [{"role": "user", "content": "tell me"}],
                         [{"n": 1, "type": "message.delta", "parts": ["Once ", "upon ", "a "]}], torn=True)
    assert file_ended(thread.events_path) is False
    done = finish_thread(thread)
    assert done is not None and done.answer_chars == len("Once upon a ")
    last = records(thread)[-1]
    assert (last.role, last.status, last.content, last.turn_id) == ("assistant", "error", "Once upon a ", TURN)
    assert last.meta == {"error": ANSWER_NOTICE, "kind": "interrupted"}
    # the journal ends like any turn (the torn line closed), numbered past what the dead process gave out
    got = asyncio.run(_collect(thread.events_path))
    assert [e.type for e in got][-2:] == ["error", "done"]
    assert got[-2].data == {"kind": "interrupted", "message": ANSWER_NOTICE} and got[-2].n == 3 + LOST_EVENTS
    assert got[-1].data == {"turn_id": TURN, "status": "error"}
    assert file_ended(thread.events_path) is True
    assert all(msgspec.json.decode(x) for x in thread.events_path.read_bytes().splitlines())  # the torn line went
    assert finish_thread(thread) is None and len(records(thread)) == 2  # never twice


def test_cut_off_tool_calls_get_a_result_and_the_turn_an_interrupted_answer(tmp_path: Path) -> None:
    calls = [ToolCall(id="c1", name="sql_query", arguments='{"sql": "SELECT 1"}'),
             ToolCall(id="c2", name="python", arguments='{"code": "1"}')]
    thread = thread_with(tmp_path, [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "name": "sql_query", "content": "[1]"},
    ], [{"n": 1, "type": "message.delta", "parts": ["Let me look."]},
        {"n": 2, "type": "tool.started", "data": {"call_id": "c1", "name": "sql_query", "arguments": "{}"}},
        {"n": 3, "type": "tool.started", "data": {"call_id": "c2", "name": "python", "arguments": "{}"}},
        {"n": 4, "type": "tool.finished", "data": {"call_id": "c1", "name": "sql_query", "ok": True, "seq": 3,
                                                   "duration_ms": 1.0, "preview": "[1]"}}])
    done = finish_thread(thread)
    assert done is not None and done.tools == ["c2"] and done.answer_chars == 0
    tool, answer = records(thread)[-2:]
    assert (tool.role, tool.tool_call_id, tool.name, tool.status, tool.content) == \
        ("tool", "c2", "python", "error", TOOL_NOTICE)
    assert tool.meta == {"duration_ms": 0.0, "status": "interrupted"}
    assert (answer.role, answer.content, answer.meta["kind"]) == ("assistant", "", "interrupted")
    ended = read_event_file(thread.events_path)
    assert [e.type for e in ended.events[-3:]] == ["tool.finished", "error", "done"]
    assert ended.events[-3].data["call_id"] == "c2" and ended.events[-3].data["ok"] is False


def test_a_recorded_answer_whose_done_was_lost_only_ends_the_journal(tmp_path: Path) -> None:
    thread = thread_with(tmp_path, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}],
                         [{"n": 1, "type": "message.delta", "parts": ["Hello."]}])
    done = finish_thread(thread)
    assert done is not None and done.records == [] and done.answer_chars is None
    assert [e.type for e in read_event_file(thread.events_path).events] == ["message.delta", "done"]
    assert read_event_file(thread.events_path).events[-1].data["status"] == "ok"
    # a cancelled step ends the turn too: it ends as cancelled, nothing is added
    other = thread_with(tmp_path / "b", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [ToolCall(id="c9", name="python")]},
        {"role": "tool", "tool_call_id": "c9", "name": "python", "status": "cancelled", "content": "cancelled"},
    ], [])
    assert finish_thread(other).records == []
    assert read_event_file(other.events_path).events[-1].data["status"] == "cancelled"


def test_a_turn_cut_off_before_its_first_record_only_ends_the_journal(tmp_path: Path) -> None:
    thread = thread_with(tmp_path, [], [])
    thread.append(lambda seq: Record(seq=seq, ts=time.time() - 3600, role="user", content="old", turn_id="old"))
    done = finish_thread(thread)
    assert done.records == [] and [r.turn_id for r in records(thread)] == ["old"]
    assert [e.type for e in read_event_file(thread.events_path).events] == ["error", "done"]


def test_recovery_skips_a_thread_held_by_a_live_turn_and_the_next_turn_finishes_it(tmp_path: Path) -> None:
    thread = thread_with(tmp_path, [{"role": "user", "content": "q"}],
                         [{"n": 1, "type": "message.delta", "parts": ["partial"]}])
    turns = TurnRegistry(4, lock_dir=tmp_path / "locks")
    cut = CutOffTurns(Layout(tmp_path), turns)
    held = file_lock(tmp_path / "locks" / f"t-{thread.id}.lock")  # as a live worker's turn holds it
    held.acquire()
    try:
        assert cut.finish_all() == [] and len(records(thread)) == 1
    finally:
        held.release()
    turns.before_turn = cut.before_turn

    async def next_turn() -> None:
        turn = turns.reserve(thread.id, "alice", events_at=thread.events_path)
        turns.release(turn)

    asyncio.run(next_turn())  # the previous turn is finished before its journal is replaced
    assert [r.role for r in records(thread)] == ["user", "assistant"]
    assert records(thread)[-1].content == "partial"


def _finish_all(home: str, out: "multiprocessing.Queue[int]") -> None:
    cut = CutOffTurns(Layout(Path(home)), TurnRegistry(4, lock_dir=Path(home) / "locks" / "turns"))
    out.put(len(cut.finish_all()))


def test_several_workers_starting_at_once_finish_each_turn_once(tmp_path: Path) -> None:
    threads = [thread_with(tmp_path, [{"role": "user", "content": f"q{i}"}],
                           [{"n": 1, "type": "message.delta", "parts": [f"answer {i} so far"]}]) for i in range(40)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_finish_all, args=(str(tmp_path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    counts = [out.get(timeout=5) for _ in procs]
    assert sum(counts) == 40, counts
    for i, thread in enumerate(threads):
        recs = records(thread)
        assert [(r.role, r.content) for r in recs] == [("user", f"q{i}"), ("assistant", f"answer {i} so far")]
        lines = thread.events_path.read_bytes().splitlines()
        assert [msgspec.json.decode(x).get("type") for x in lines[2:]] == ["error", "done"]
