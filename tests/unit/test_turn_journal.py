"""The turn journal: ids, the event file other workers follow, its bounds, cursors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from datadesk.chat import journal as J
from datadesk.chat.journal import Cursor, TurnJournal, file_turn, follow_file


async def collect(it) -> list[J.JournalEvent]:
    return [ev async for ev in it]


def test_cursor_parse() -> None:
    assert Cursor.parse("turnab12:7") == Cursor("turnab12", 7)
    assert Cursor.parse("12") == Cursor(None, 12)
    assert Cursor.parse(None) is None and Cursor.parse(" ") is None
    for bad in ("x", "turn:", ":3", "turn:-1", "a:b"):
        with pytest.raises(ValueError, match="not an event id"):
            Cursor.parse(bad)


def test_the_file_replays_every_event_with_its_number_and_text_runs_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"turn": "old"}\n{"n": 1, "type": "done", "data": {}}\n')

    async def run() -> tuple[list, list]:
        j = TurnJournal("turn1", path)
        assert file_turn(path) == "turn1"  # replaced at once: the old turn's events are gone
        for word in ("a", "b", "c"):
            j.add("message.delta", {"text": word})
        j.add("tool.started", {"call_id": "c1", "name": "python", "arguments": "{}"})
        j.add("tool.progress", {"call_id": "c1", "name": "python", "elapsed_s": 1.0, "stdout": "hi\n"})
        j.add("done", {"turn_id": "turn1", "status": "ok"})
        live = await collect(j.subscribe())
        from_file = await collect(follow_file(path, "turn1", lambda tid: False))
        return live, from_file

    live, from_file = asyncio.run(run())
    assert [(e.n, e.type, e.data) for e in live] == [(e.n, e.type, e.data) for e in from_file]
    assert [e.n for e in live] == [1, 2, 3, 4, 5, 6]
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 1 + 3  # header, one line for the three text pieces, three others
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_turn_whose_worker_died_ends_with_an_error(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"turn": "t9"}\n{"n": 1, "type": "message.delta", "parts": ["x", "y"]}\n')
    got = asyncio.run(collect(follow_file(path, "t9", lambda tid: False)))
    assert [(e.n, e.type) for e in got] == [(1, "message.delta"), (2, "message.delta"), (3, "error"), (4, "done")]
    assert got[-1].data["status"] == "error"
    assert asyncio.run(collect(follow_file(path, "another", lambda tid: True))) == []


def test_bounds_drop_progress_text_first_then_all_but_the_ending_events(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(J, "PROGRESS_TEXT_BYTES", 2_000)
    monkeypatch.setattr(J, "KEEP_BYTES", 6_000)

    async def run() -> TurnJournal:
        j = TurnJournal("t", tmp_path / "events.jsonl")
        for i in range(100):
            j.add("tool.progress", {"call_id": "c", "name": "python", "elapsed_s": i, "stdout": "x" * 100, "rows": i})
        j.add("tool.finished", {"call_id": "c", "name": "python", "ok": True, "seq": 3, "duration_ms": 1,
                                "preview": "y" * 3_000})
        j.add("done", {"turn_id": "t", "status": "ok"})
        return j

    j = asyncio.run(run())
    assert j.n == 102 and j.dropped > 0
    progress = [e for e in j.kept if e.type == "tool.progress"]
    assert "stdout" in progress[0].data and "stdout" not in progress[-1].data and progress[-1].data["rows"] >= 0
    assert [e.type for e in j.kept[-2:]] == ["tool.finished", "done"]  # what ends a step is always kept
    assert j.kept_bytes < 6_000 + 4_000
    assert (tmp_path / "events.jsonl").stat().st_size < 12_000


def test_a_subscriber_that_falls_behind_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(J, "MAX_BEHIND", 5)

    async def run() -> list:
        j = TurnJournal("t", None)
        it = j.subscribe()
        for i in range(10):
            j.add("message.delta", {"text": str(i)})
        return await collect(it)

    got = asyncio.run(run())
    assert [e.n for e in got] == [1, 2, 3, 4, 5]  # then its stream ends without `done`


def test_a_quiet_stream_yields_keep_alives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(J, "IDLE_S", 0.05)
    monkeypatch.setattr(J, "FOLLOW_POLL_S", 0.01)

    async def run() -> tuple[list, list]:
        j = TurnJournal("t", tmp_path / "events.jsonl")
        live, filed = j.subscribe(), follow_file(tmp_path / "events.jsonl", "t", lambda tid: not j.done)
        got_live = [await anext(live), await anext(live)]
        got_file = [await anext(filed), await anext(filed)]
        j.add("done", {"turn_id": "t", "status": "ok"})
        got_live += [ev async for ev in live]
        got_file += [ev async for ev in filed]
        return got_live, got_file

    live, filed = asyncio.run(run())
    for got in (live, filed):
        assert got[0] is None and got[1] is None and got[-1].type == "done"


def test_a_worker_thread_of_a_tool_can_emit() -> None:
    import threading

    from datadesk.chat.turns import RunningTurn
    from datadesk.domain.events import ToolProgress

    async def run() -> list:
        turn = RunningTurn(turn_id="t", thread_id="th", user_id="u")
        it = turn.journal.subscribe()
        worker = threading.Thread(target=lambda: turn.emit(ToolProgress(call_id="c", name="sql", elapsed_s=1.0,
                                                                        rows=10)))
        worker.start()
        worker.join()
        first = await anext(it)
        return [first]

    got = asyncio.run(run())
    assert got[0].type == "tool.progress" and got[0].data["rows"] == 10


def test_an_event_file_that_lost_events_to_a_full_disk_is_removed_when_the_turn_ends(tmp_path) -> None:
    """A full disk fails the event file mid-turn (issue 25): the turn still ends for its clients,
    and the incomplete file goes, so the next turn does not take this one for a crashed turn."""
    import asyncio
    import resource
    import signal

    from datadesk.chat.journal import TurnJournal

    path = tmp_path / "events.jsonl"

    async def main() -> None:
        j = TurnJournal("t1", path)
        j.add("message.delta", {"text": "a"})
        j.add("tool.started", {"call_id": "c"})
        assert path.exists()
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 10, old[1]))  # room for no more
        try:
            j.add("tool.finished", {"call_id": "c", "preview": "x" * 1000})
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, handler)
        j.add("done", {"turn_id": "t1", "status": "ok"})
        assert [e.type for e in j.kept][-1] == "done"  # the clients of this worker still get every event
    asyncio.run(main())
    assert not path.exists()
