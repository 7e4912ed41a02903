"""`EventJournal` conformance on both sets (events.jsonl; `turn_events` rows): a turn written via
A is followed via B with the same numbers, types and data up to `done` (delay A-emit ->
B-deliver measured), from a cursor, without notifications (a missed NOTIFY loses nothing), a
writer that died (the follower ends with `error` + `done`), finishing a cut-off turn
(`read`, `ended`, `append_end`), the next turn replacing the kept events, and `drop`."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest

from datadesk.chat.journal import TurnJournal
from datadesk.store.interfaces.journal import EventJournal
from tests.cluster import sets

pytestmark = pytest.mark.cluster


class Hosts(sets.Hosts):
    """Journals of one set; every `journal()` is another worker (embedded) or host (cluster)."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        super().__init__(kind, request, tmp_path)
        self.at = tmp_path / "t1" / "events.jsonl"
        self.at.parent.mkdir()

    def journal(self) -> EventJournal:
        if self.kind == "embedded":
            from datadesk.chat.journal import FileEventJournal

            return FileEventJournal()
        from datadesk.cluster.journal import PgEventJournal

        return self.closing(PgEventJournal(self.database("journal-host", max_size=4)))

    def writer(self, journal: EventJournal, turn_id: str) -> TurnJournal:
        return TurnJournal(turn_id, self.at, journal.sink("t1", turn_id, self.at))


hosts = sets.hosts_fixture(Hosts)


async def collect(events, limit: int = 10_000) -> list:
    out = []
    async for ev in events:
        if ev is not None:
            out.append(ev)
            if len(out) >= limit:
                break
    return out


def test_a_turn_written_via_a_is_followed_via_b_to_its_end(hosts) -> None:
    a, b = hosts.journal(), hosts.journal()
    delays: list[float] = []

    async def main() -> tuple[list, list]:
        w = hosts.writer(a, "turn1")
        assert b.latest("t1", hosts.at) == "turn1"
        follower = asyncio.create_task(collect(b.follow("t1", "turn1", lambda t: not w.done, hosts.at)))

        async def timed() -> list:
            got = []
            async for ev in b.follow("t1", "turn1", lambda t: not w.done, hosts.at):
                if ev is not None and "sent" in ev.data:
                    delays.append(time.monotonic() - ev.data["sent"])
                if ev is not None:
                    got.append(ev)
                    if ev.type == "done":
                        return got
            return got

        timer = asyncio.create_task(timed())
        await asyncio.sleep(0.1)
        for i in range(40):
            if i % 4 == 0:
                w.add_text(f"piece {i} ")
            else:
                w.add("tool.progress", {"i": i, "sent": time.monotonic()})
            await asyncio.sleep(0.02)
        w.add("done", {"turn_id": "turn1", "status": "ok"})
        got = await asyncio.wait_for(follower, 10)
        await asyncio.wait_for(timer, 10)
        return got, w.kept

    got, kept = asyncio.run(main())
    assert [(e.n, e.type, e.data) for e in got] == [(e.n, e.type, e.data) for e in kept]
    assert got[0].n == 1 and got[-1].type == "done"
    sets.report_delays("emit on A -> deliver on B", delays, hosts.kind)
    assert statistics.median(delays) < 0.5


def test_follow_resumes_after_a_cursor(hosts) -> None:
    a, b = hosts.journal(), hosts.journal()

    async def main() -> list:
        w = hosts.writer(a, "turn1")
        for i in range(10):
            w.add("tool.progress", {"i": i})
        w.add("done", {"turn_id": "turn1", "status": "ok"})
        return await collect(b.follow("t1", "turn1", lambda t: False, hosts.at, after=7))

    got = asyncio.run(main())
    assert [e.n for e in got] == [8, 9, 10, 11] and got[-1].type == "done"


def test_without_notifications_nothing_is_lost(hosts, monkeypatch) -> None:
    """The writer's NOTIFY goes nowhere: the follower's fallback poll still reads every row."""
    a, b = hosts.journal(), hosts.journal()

    async def main() -> tuple[list, list, float]:
        w = hosts.writer(a, "turn1")
        follower = asyncio.create_task(collect(b.follow("t1", "turn1", lambda t: not w.done, hosts.at)))
        await asyncio.sleep(0.3)  # its listener is up
        if hosts.kind == "cluster":
            import datadesk.cluster.journal as pg_journal

            monkeypatch.setattr(pg_journal, "CHANNEL", "turn_events_nobody_listens")
        started = time.monotonic()
        for i in range(5):
            w.add("tool.progress", {"i": i})
            await asyncio.sleep(0.05)
        w.add("done", {"turn_id": "turn1", "status": "ok"})
        got = await asyncio.wait_for(follower, 10)
        return got, w.kept, time.monotonic() - started

    got, kept, took = asyncio.run(main())
    assert [(e.n, e.type) for e in got] == [(e.n, e.type) for e in kept]
    assert took < 5


def test_a_writer_that_died_ends_with_an_error(hosts) -> None:
    a, b = hosts.journal(), hosts.journal()

    async def main() -> list:
        w = hosts.writer(a, "turn1")
        w.add("tool.started", {"call_id": "c1"})
        w.add("tool.progress", {"i": 1})
        w._flush()  # as a process killed now leaves it: no `done`
        await asyncio.sleep(0.3)
        return await collect(b.follow("t1", "turn1", lambda t: False, hosts.at))

    got = asyncio.run(main())
    assert [(e.n, e.type) for e in got] == [(1, "tool.started"), (2, "tool.progress"), (3, "error"), (4, "done")]
    assert got[-1].data == {"turn_id": "turn1", "status": "error"}


def test_a_cut_off_turn_is_read_and_finished(hosts) -> None:
    a, b = hosts.journal(), hosts.journal()

    async def main() -> None:
        assert b.ended("t1", hosts.at) is None and b.read("t1", hosts.at) is None
        w = hosts.writer(a, "turn1")
        w.add("tool.started", {"call_id": "c1"})
        w.add_text("half an ans")
        w.flush_text()
        w._flush()
        await asyncio.sleep(0.3)
        assert b.ended("t1", hosts.at) is False
        kept = b.read("t1", hosts.at)
        assert kept is not None and kept.turn_id == "turn1" and kept.header["turn"] == "turn1"
        assert [(e.n, e.type) for e in kept.events] == [(1, "tool.started"), (2, "message.delta")]
        assert kept.events[1].data == {"text": "half an ans"} and not kept.ended and kept.last_n == 2
        if hosts.kind == "cluster":
            assert b.unfinished() == ["t1"]
        added = b.append_end("t1", kept, [("error", {"kind": "interrupted"}), ("done", {"status": "error"})],
                             kept.last_n + 1_000_000, hosts.at)
        assert [e.n for e in added] == [1_000_002, 1_000_003]
        assert b.ended("t1", hosts.at) is True and b.read("t1", hosts.at).ended
        got = await collect(a.follow("t1", "turn1", lambda t: False, hosts.at, after=2))
        assert [(e.n, e.type) for e in got] == [(1_000_002, "error"), (1_000_003, "done")]
        if hosts.kind == "cluster":
            assert b.unfinished() == []

    asyncio.run(main())


def test_the_next_turn_replaces_the_kept_events_and_drop_forgets_them(hosts) -> None:
    a, b = hosts.journal(), hosts.journal()

    async def main() -> None:
        w1 = hosts.writer(a, "turn1")
        w1.add("done", {"turn_id": "turn1", "status": "ok"})
        w2 = hosts.writer(b, "turn2")  # the next turn runs on host B
        assert a.latest("t1", hosts.at) == "turn2"
        assert [e.n for e in a.read("t1", hosts.at).events] == []
        w2.add("tool.progress", {"i": 1})
        w2.add("done", {"turn_id": "turn2", "status": "ok"})
        got = await collect(a.follow("t1", "turn2", lambda t: False, hosts.at))
        assert [e.type for e in got] == ["tool.progress", "done"]
        old = await collect(a.follow("t1", "turn1", lambda t: False, hosts.at))
        assert [e.type for e in old] in ([], ["error", "done"])  # its events are gone
        a.drop("t1", hosts.at)
        assert b.latest("t1", hosts.at) is None and b.ended("t1", hosts.at) is None

    asyncio.run(main())
