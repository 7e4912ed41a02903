"""The turn's fence on every append (issue 28: "append checks the thread's epoch and the turn's
fence in one transaction"): a chat turn, on both sets, hands its claim's fence to every record
it appends; on the cluster set a turn whose claim another host took over (its lock connection
killed, then a second registry claiming the thread) cannot append any more (TurnFenced), ends
with a `taken_over` error, and nothing it writes afterwards lands."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from datadesk.chat.loop import start_turn
from datadesk.domain.events import TurnDone, TurnError
from datadesk.domain.records import Record
from datadesk.llm.scripted import ScriptedModel, ScriptStep
from datadesk.store.interfaces.threads import TurnFenced
from tests.conftest import make_harness, until

pytestmark = pytest.mark.cluster


def _user(rt: Any, name: str) -> Any:
    return next(u for u in rt.users.list() if u.name == name)


def _spy_events(turn: Any) -> list[Any]:
    """The events `turn` emits from now on (its task has not run yet when start_turn returns)."""
    seen: list[Any] = []
    emit = turn.emit

    def spy(payload: Any) -> None:
        seen.append(payload)
        emit(payload)

    turn.emit = spy
    return seen


@pytest.fixture(params=["embedded", "cluster"])
def set_name(request) -> str:
    return request.param


def test_every_append_of_a_turn_carries_its_fence(set_name, home, state_set) -> None:
    h = make_harness(home, ScriptedModel(["the answer"]), state={} if set_name == "embedded" else state_set)
    rt = h.rt

    async def main() -> tuple[list[int | None], int | None, list[Record]]:
        thread = rt.threads.create("demo", "alice")
        fences: list[int | None] = []
        append = thread.append

        def spy(make, epoch=None, fence=None):
            fences.append(fence)
            return append(make, epoch=epoch, fence=fence)

        thread.append = spy
        turn = await start_turn(rt.turn_services, rt.turns, thread, _user(rt, "alice"), "hello", background=True)
        fence = turn.fence
        await asyncio.wait_for(turn.task, 30)
        records = rt.threads.get(thread.id, "alice", ["demo"]).tail(10)
        await rt.stop()
        return fences, fence, records

    fences, fence, records = asyncio.run(main())
    assert fence is not None and fences == [fence, fence]  # the user record and the reply
    assert [r.role for r in records] == ["user", "assistant"]


def test_a_turn_taken_over_by_another_host_cannot_append(home, state_set, cluster_db_url) -> None:
    """Host A runs a turn whose model waits; A's lock connection dies and host B claims the thread
    (a new fence); when A's model answers, the reply is refused in the append's own transaction,
    the turn ends `taken_over`, and the log holds only the user record."""
    from datadesk.cluster.database import Database
    from datadesk.cluster.turns import build_turns

    gate: dict[str, asyncio.Event] = {}

    async def late_answer(messages, tools) -> ScriptStep:
        await gate["open"].wait()
        return ScriptStep(text="a late answer")

    h = make_harness(home, ScriptedModel([late_answer]), state=state_set)
    rt = h.rt
    db_b = Database(cluster_db_url, max_size=2, name="host-b")
    host_b = build_turns(db_b, SimpleNamespace(chat=SimpleNamespace(max_turns_per_user=2)), None)

    async def main() -> dict[str, Any]:
        gate["open"] = asyncio.Event()
        thread = rt.threads.create("demo", "alice")
        turn = await start_turn(rt.turn_services, rt.turns, thread, _user(rt, "alice"), "hello", background=True)
        events = _spy_events(turn)
        first_fence = turn.fence
        await until(lambda: len(thread.tail(5)) == 1, timeout=30)
        with db_b.connection() as conn:  # A's claim connection dies (its host's link, an admin)
            pid = conn.execute("SELECT backend_pid FROM turns WHERE thread_id = %s", (thread.id,)).fetchone()
            conn.execute("SELECT pg_terminate_backend(%s)", (pid["backend_pid"],))
        deadline = time.monotonic() + 10
        while True:  # B claims as soon as the server has dropped A's lock
            try:
                taken = host_b.reserve(thread.id, "alice")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        gate["open"].set()
        await asyncio.wait_for(turn.task, 30)
        out = {"fence_a": first_fence, "fence_b": taken.fence, "events": events,
               "records": rt.threads.get(thread.id, "alice", ["demo"]).tail(10)}
        # nothing A writes with its fence lands, while B's own record does
        again = rt.threads.get(thread.id, "alice", ["demo"])
        with pytest.raises(TurnFenced):
            again.append(lambda seq: Record(seq=seq, role="assistant", ts=time.time(), content="zombie"),
                         epoch=again.epoch, fence=first_fence)
        mine = again.append(lambda seq: Record(seq=seq, role="user", ts=time.time(), content="b's"),
                            epoch=again.epoch, fence=taken.fence)
        out["b_seq"] = mine.seq
        out["final"] = [r.content for r in rt.threads.get(thread.id, "alice", ["demo"]).tail(10)]
        host_b.release(taken)
        await rt.stop()
        return out

    try:
        out = asyncio.run(main())
    finally:
        host_b.close()
        db_b.close()
    assert out["fence_b"] > out["fence_a"]
    kinds = [e.kind for e in out["events"] if isinstance(e, TurnError)]
    assert kinds == ["taken_over"], out["events"]
    done = [e for e in out["events"] if isinstance(e, TurnDone)]
    assert done and done[0].status == "error"
    assert [r.content for r in out["records"]] == ["hello"]  # the late answer never landed
    assert out["b_seq"] == 2 and out["final"] == ["hello", "b's"]
