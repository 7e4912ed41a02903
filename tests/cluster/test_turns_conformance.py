"""`TurnDirectory` conformance on both sets, through two `TurnRegistry`s on one home (embedded:
two workers) or one database (cluster: two hosts, each with its own pool): one turn per thread
and the per-user cap across both (50 concurrent claims, no overshoot), growing fences, cancel
via B stopping A's turn (delays measured), a cancel naming an older turn doing nothing,
re-attach via B with the same event ids, clear holding the thread, and holders that die: a
killed process frees its thread at once, and on the cluster set a turn whose connection the
server killed stops itself (its claim is lost) while the thread is claimed elsewhere."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from datadesk.chat.turns import TurnRegistry
from datadesk.store.interfaces.turns import TooManyTurns, TurnConflict, TurnDirectory
from tests.cluster import sets

pytestmark = pytest.mark.cluster


class Hosts(sets.Hosts):
    """Registries of one set; every `registry()` is another worker (embedded) or host (cluster)."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        super().__init__(kind, request, tmp_path)
        self.home = tmp_path
        self.lock_dir = tmp_path / "locks" / "turns"

    def events_at(self, thread_id: str) -> Path:
        d = self.home / "threads" / thread_id
        d.mkdir(parents=True, exist_ok=True)
        return d / "events.jsonl"

    def registry(self, max_per_user: int = 2) -> TurnRegistry:
        if self.kind == "embedded":
            return self.closing(TurnRegistry(max_per_user, lock_dir=self.lock_dir))
        from datadesk.cluster.turns import build_turns

        settings = SimpleNamespace(chat=SimpleNamespace(max_turns_per_user=max_per_user))
        return self.closing(build_turns(self.database("turns-host", max_size=4), settings, None))

    def directory(self) -> TurnDirectory:
        reg = self.registry()
        assert reg.directory is not None
        return reg.directory


hosts = sets.hosts_fixture(Hosts)


def start(reg: TurnRegistry, thread_id: str, user_id: str, events_at: Path | None = None,
          body=None) -> object:
    """A turn on `thread_id` whose task runs `body(turn)` (default: until cancelled); the task
    records when it was cancelled in `turn.cancelled_at`."""
    turn = reg.reserve(thread_id, user_id, events_at=events_at)

    async def runner() -> None:
        try:
            if body is None:
                await asyncio.sleep(3600)
            else:
                await body(turn)
        except asyncio.CancelledError:
            turn.cancelled_at = time.monotonic()
            raise
        finally:
            reg.release(turn)

    turn.cancelled_at = None
    turn.task = asyncio.get_running_loop().create_task(runner())
    return turn


async def stop(*turns) -> None:
    await asyncio.sleep(0)  # a task cancelled before its first step would never release
    for t in turns:
        t.task.cancel()
    await asyncio.gather(*(t.task for t in turns), return_exceptions=True)


def test_one_turn_per_thread_across_both_and_fences_grow(hosts) -> None:
    a, b = hosts.registry(), hosts.registry()

    async def main() -> None:
        t1 = start(a, "th1", "u1", hosts.events_at("th1"))
        with pytest.raises(TurnConflict, match="already running on thread th1"):
            b.reserve("th1", "u2")
        with pytest.raises(TurnConflict):
            a.reserve("th1", "u1")
        assert b.running("th1") and b.current_turn("th1") == t1.turn_id
        assert b.status("th1", b.marker_names()) == (True, t1.turn_id)
        assert b.status("th2", b.marker_names()) == (False, None)
        first = t1.fence
        await stop(t1)
        assert not b.running("th1") and b.current_turn("th1") is None
        t2 = start(b, "th1", "u2")  # a turn without events: running, but nothing to follow
        assert a.status("th1") == (True, None)
        assert t2.fence > first
        await stop(t2)

    asyncio.run(main())


def test_the_user_cap_holds_across_both(hosts) -> None:
    a, b = hosts.registry(max_per_user=2), hosts.registry(max_per_user=2)

    async def main() -> None:
        t1, t2 = start(a, "c1", "u1"), start(b, "c2", "u1")
        for reg in (a, b):
            with pytest.raises(TooManyTurns, match=r"limit 2"):
                reg.reserve("c3", "u1")
        other = start(b, "c3", "u2")  # another user has slots of their own
        await stop(t1)
        t3 = start(a, "c4", "u1")  # the slot came back
        await stop(t2, t3, other)

    asyncio.run(main())


def test_fifty_concurrent_claims_from_two_instances_never_overshoot(hosts) -> None:
    dirs = [hosts.directory(), hosts.directory()]
    limit, got, refused, errors = 3, [], [], []
    barrier = threading.Barrier(50)

    def one(i: int) -> None:
        barrier.wait()
        try:
            got.append(dirs[i % 2].claim(f"cap{i}", "u1", f"turn{i}", limit=limit))
        except TooManyTurns:
            refused.append(i)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(got) == limit and len(refused) == 50 - limit
    for claim in got:
        dirs[int(claim.turn_id[4:]) % 2].release(claim)
    again = dirs[0].claim("cap-again", "u1", "turn-again", limit=limit)  # the slots are free again
    dirs[0].release(again)


def test_cancel_via_b_stops_the_turn_running_on_a(hosts) -> None:
    a, b = hosts.registry(), hosts.registry()
    delays: list[float] = []

    async def main() -> None:
        for i in range(20):
            t = start(a, "cx", "u1", hosts.events_at("cx"))
            await asyncio.sleep(0.05 if i else 0.3)  # the first: the owner's listener is up
            asked = time.monotonic()
            assert await b.cancel("cx") is True
            assert t.cancelled_at is not None, "cancel returned before the turn stopped"
            delays.append(t.cancelled_at - asked)
            await asyncio.gather(t.task, return_exceptions=True)
            assert not b.running("cx")
        assert await b.cancel("cx") is False  # nothing runs

    asyncio.run(main())
    sets.report_delays("cancel via another host", delays, hosts.kind)
    assert statistics.median(delays) < 1.0 and max(delays) < 3.0


def test_a_cancel_naming_an_older_turn_does_nothing(hosts, monkeypatch) -> None:
    import datadesk.cluster.turns as pg_turns

    monkeypatch.setattr(pg_turns, "RENEW_S", 0.1)  # the renewal re-reads requests: quickly here
    a, b = hosts.registry(), hosts.registry()

    async def main() -> None:
        old = start(a, "co", "u1")
        await stop(old)
        new = start(a, "co", "u1")
        assert b.directory.request_cancel("co", old.turn_id) is False
        assert b.directory.request_cancel("co", "turn-never") is False
        await asyncio.sleep(0.5)
        assert not new.task.done() and new.cancelled_at is None
        assert b.directory.request_cancel("co", new.turn_id) is True
        await asyncio.wait_for(asyncio.gather(new.task, return_exceptions=True), 5)
        assert new.cancelled_at is not None

    asyncio.run(main())


def test_reattach_via_b_gets_the_same_event_ids_to_the_end(hosts) -> None:
    a, b = hosts.registry(), hosts.registry()
    at = hosts.events_at("tr")

    async def body(turn) -> None:
        j = turn.journal
        for i in range(30):
            j.add_text(f"word{i} ")
            if i % 10 == 9:
                j.add("tool.started", {"call_id": f"c{i}", "name": "sql"})
            await asyncio.sleep(0.01)
        j.add("message.completed", {"content": "all"})
        await asyncio.sleep(0.2)
        j.add("done", {"turn_id": turn.turn_id, "status": "ok"})

    async def main() -> tuple[list[str], list[str], list[str]]:
        t = start(a, "tr", "u1", at, body)
        await asyncio.sleep(0.15)
        attached = b.attach("tr", at, None)
        assert attached is not None and attached.turn_id == t.turn_id and attached.seen == 0
        seen = [f"{attached.turn_id}:{ev.n}" async for ev in attached.events if ev is not None]
        await asyncio.gather(t.task)
        mine = [f"{t.turn_id}:{ev.n}" for ev in t.journal.kept]
        # the turn ended: a client with its cursor still gets the rest; one without gets nothing
        from datadesk.chat.journal import Cursor

        late = b.attach("tr", at, Cursor(t.turn_id, 5))
        assert late is not None and late.seen == 5
        rest = [f"{late.turn_id}:{ev.n}" async for ev in late.events if ev is not None]
        assert b.attach("tr", at, None) is None
        return seen, mine, rest

    seen, mine, rest = asyncio.run(main())
    turn = mine[0].rsplit(":", 1)[0]
    assert seen == mine and seen[0] == f"{turn}:1" and len(seen) >= 6  # text coalesced per 50 ms
    assert rest == mine  # the feed skips what the client had seen


def test_clear_holds_the_thread_so_no_turn_starts_meanwhile(hosts) -> None:
    a, b = hosts.registry(), hosts.registry()

    async def main() -> None:
        t = start(a, "cl", "u1", hosts.events_at("cl"))
        await asyncio.sleep(0.2)
        async with b.exclusive("cl", deleting=True):
            assert t.task.done() and t.cancelled_at is not None
            with pytest.raises(TurnConflict):
                a.reserve("cl", "u1")
            with b.idle("cl") as free:
                assert not free  # the clear holds it
        again = start(a, "cl", "u1")
        with b.idle("cl") as free:
            assert not free  # a turn runs
        await stop(again)
        with b.idle("cl") as free:
            assert free

    asyncio.run(main())


HOST = """
import asyncio, sys, types
sys.path[:0] = [sys.argv[3], sys.argv[4]]
from datadesk.chat.turns import TurnRegistry

async def main():
    if sys.argv[1] == "embedded":
        reg = TurnRegistry(1, lock_dir=sys.argv[2])
    else:
        from datadesk.cluster.database import Database
        from datadesk.cluster.turns import build_turns
        reg = build_turns(Database(sys.argv[2], max_size=2),
                          types.SimpleNamespace(chat=types.SimpleNamespace(max_turns_per_user=1)), None)
    turn = reg.reserve("dead", "u1")
    print(turn.turn_id, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_a_killed_host_frees_its_thread_and_its_slot(hosts) -> None:
    """The process running a turn is SIGKILLed (the server sees its connections close): another
    host may claim the thread and the user's slot at once; the row or marker it left is expired."""
    where = str(hosts.lock_dir) if hosts.kind == "embedded" else hosts.url
    b = hosts.registry(max_per_user=1)
    with sets.process(HOST, hosts.kind, where) as proc:
        dead_turn = proc.stdout.readline().strip()
        assert dead_turn.startswith("turn")

        async def busy() -> None:
            with pytest.raises(TurnConflict):
                b.reserve("dead", "u2")
            with pytest.raises(TooManyTurns):
                b.reserve("other", "u1")
        asyncio.run(busy())
        sets.kill(proc)

    async def after() -> None:
        deadline = time.monotonic() + 5
        while b.running("dead") and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not b.running("dead")
        assert [e.turn_id for e in b.directory.expired()] == [dead_turn]
        with b.idle("dead") as free:
            assert free
            b.forget("dead", dead_turn)
        assert b.directory.expired() == []
        t = start(b, "dead", "u1")
        await stop(t)

    asyncio.run(after())


def test_a_turn_whose_connection_was_killed_stops_and_is_fenced_out(hosts, monkeypatch) -> None:
    """Cluster only (the embedded lock cannot be lost while its process lives): the server kills
    the session holding A's turn lock; B claims the thread with a higher fence; A's renewal finds
    its claim lost and stops the turn; A's fence no longer holds."""
    if hosts.kind != "cluster":
        pytest.skip("an embedded claim lives as long as its process")
    import datadesk.cluster.turns as pg_turns
    from datadesk.cluster.turns import fence_holds

    monkeypatch.setattr(pg_turns, "RENEW_S", 0.2)
    a, b = hosts.registry(), hosts.registry()

    async def main() -> None:
        t = start(a, "fz", "u1")
        pid = t.claim.handle.conn.info.backend_pid
        with hosts.db.connection() as conn:
            assert fence_holds(conn, "fz", t.fence)
        with hosts.db.connection() as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 5
        while b.running("fz") and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        t2 = start(b, "fz", "u1")
        assert t2.fence > t.fence
        await asyncio.wait_for(asyncio.gather(t.task, return_exceptions=True), 5)
        assert t.cancelled_at is not None
        with hosts.db.connection() as conn:
            assert not fence_holds(conn, "fz", t.fence) and fence_holds(conn, "fz", t2.fence)
        assert b.current_turn("fz") is None and b.running("fz")  # A's release did not end B's turn
        await stop(t2)

    asyncio.run(main())


def test_a_hung_holder_past_its_lease_is_taken_over(hosts, monkeypatch) -> None:
    """Cluster only: a holder connected but not renewing (its event loop stuck) loses the thread
    once its lease is past; its session is ended and the new claim fences it out."""
    if hosts.kind != "cluster":
        pytest.skip("embedded liveness is the holder's pid, no lease")
    import datadesk.cluster.turns as pg_turns

    monkeypatch.setattr(pg_turns, "LEASE_S", 0.3)
    a, b = hosts.directory(), hosts.directory()
    hung = a.claim("hx", "u1", "turn-hung", limit=2)  # nobody renews it
    with pytest.raises(TurnConflict):
        b.claim("hx", "u1", "turn-new", limit=2)
    time.sleep(0.5)
    new = b.claim("hx", "u1", "turn-new", limit=2)
    assert new.fence > hung.fence
    assert a.renew(hung) is False and hung.lost
    a.release(hung)  # harmless: it marks nothing of the new turn
    assert b.current("hx").turn_id == "turn-new"
    b.release(new)
