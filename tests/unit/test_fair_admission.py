"""Issue 27: a query slot covers the database work only, writes run in a bounded writer pool,
waiters are served fairly (in order per user, round-robin across users) and a wait is reported
as progress; a refusal comes only after `limits.sql_queue_s` and names it. Against the real demo
warehouse, the real `sql_query` tool and the real offload pipeline."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from datadesk.llm.tokens import count_tokens
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.offload.pipeline import OffloadCapability, OffloadPipeline
from datadesk.offload.readahead import ReadAhead
from datadesk.offload.writers import WriterPool
from datadesk.settings import OffloadSettings
from datadesk.store.admission import Busy, MemoryGuard, QuerySlots
from datadesk.store.layout import Layout
from datadesk.store.threads import Thread
from datadesk.tools.registry import ToolContext, ToolRegistry
from tests.unit.test_admission import BIG, _registry, _streamed_under_the_slot, warehouse  # noqa: F401 (fixtures)

YES = OffloadCapability(True)


def _ctx(root: Path, user: str, progress=None) -> ToolContext:
    tdir = root / "ws" / "users" / user / "threads" / "t1"
    tdir.mkdir(parents=True, exist_ok=True)
    return ToolContext(thread=Thread.at(tdir), workspace="ws", user=user, permissions=frozenset(),
                       call_id="c", progress=progress)


async def _run(registry: ToolRegistry, ctx: ToolContext, sql: str):
    return await registry.run("sql_query", json.dumps({"sql": sql}), ctx)


async def _until(cond, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def _pipeline(root: Path, writers: WriterPool, on_created=None) -> OffloadPipeline:
    return OffloadPipeline(OffloadSettings(), ArtifactStore(Layout(root)), count_tokens, on_created=on_created,
                           writers=writers)


async def _offload(pipeline: OffloadPipeline, registry: ToolRegistry, ctx: ToolContext, sql: str, progress=None):
    result = await _run(registry, ctx, sql)
    spec = registry.get("sql_query").spec
    args = json.dumps({"sql": sql})
    return await pipeline.process(spec, result, ctx.thread, ctx.origin("tool", spec.name, args), YES, ctx.epoch,
                                  progress=progress)


# -- what a slot covers --------------------------------------------------------------------------

def test_the_slot_is_free_once_the_source_is_read_while_the_writer_still_holds_a_batch(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=1, wait_s=5)
    registry = _registry(warehouse, slots)

    async def scenario() -> None:
        result = await _run(registry, _ctx(root, "ann"), BIG)
        assert result.table is not None and slots.running("ann") == 1  # not read yet: the query is running
        with ReadAhead(result.table) as batches:
            first = next(iter(batches))  # the "writer" takes one batch and stops there
            await _until(lambda: slots.running() == 0)  # the read-ahead thread read the rest: freed
            other = await _run(registry, _ctx(root, "bob"), "SELECT 2 AS x")
            assert not other.is_error and '"rows":[[2]]' in other.content
            assert first.num_rows > 0 and slots.running() == 0
        result.table.close()

    asyncio.run(scenario())


def test_the_write_and_quota_pass_run_after_the_slot_is_given_back(warehouse) -> None:
    """The quota pass (the last step of a write) is blocked: the query slot is already free and
    another query of the same user runs at once; the artifact appears when it is let go."""
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=1, wait_s=5)
    registry = _registry(warehouse, slots)
    in_quota, go_on = threading.Event(), threading.Event()

    def quota(art) -> None:
        in_quota.set()
        go_on.wait(30)

    pipeline = _pipeline(root, WriterPool(1, 1), on_created=quota)

    async def scenario() -> None:
        ctx = _ctx(root, "ann")
        write = asyncio.ensure_future(_offload(pipeline, registry, ctx, BIG))
        await _until(in_quota.is_set)
        assert slots.running() == 0 and pipeline.writers.running("ann") == 1
        again = await _run(registry, ctx, "SELECT 3 AS x")  # the user's own next query is not held up
        assert not again.is_error and '"rows":[[3]]' in again.content
        go_on.set()
        out = await write
        assert out.artifact is not None and out.artifact.rows == 50000
        assert pipeline.writers.running() == 0

    try:
        asyncio.run(scenario())
    finally:
        go_on.set()


def test_inline_exhausted_and_closed_streams_free_the_slot(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=1, wait_s=0)
    registry = _registry(warehouse, slots)

    async def scenario() -> None:
        ctx = _ctx(root, "ann")
        small = await _run(registry, ctx, "SELECT 1 AS x")
        assert small.table is None and slots.running() == 0
        # every row read for the size check, too wide to inline: no query runs any more
        wide = await _run(registry, ctx, "SELECT range AS i, repeat('x', 200) AS s FROM range(500)")
        assert wide.table is not None and slots.running() == 0
        wide.table.close()
        big = await _run(registry, ctx, BIG)
        assert slots.running() == 1
        big.table.close()  # never read to its end: closing frees it
        assert slots.running() == 0

    asyncio.run(scenario())


def test_a_large_result_read_whole_within_the_hold_budget_frees_the_slot_at_once(warehouse, monkeypatch) -> None:
    """50,000 rows of a few MB: read to their end in the call, held for the writer, the slot back
    before any writer is awaited; past the budget the result streams under the slot."""
    from datadesk.tools import sql as sql_tool

    monkeypatch.setattr(sql_tool, "HOLD_BYTES", 8 * 1024 * 1024)
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=1, wait_s=0)
    registry = _registry(warehouse, slots)
    query = "SELECT * FROM readings ORDER BY building_id, ts LIMIT 50000"

    async def scenario() -> None:
        ctx = _ctx(root, "ann")
        held = await _run(registry, ctx, query)
        assert held.table is not None and slots.running() == 0
        assert sum(b.num_rows for b in held.table) == 50_000  # every row is there for the writer
        monkeypatch.setattr(sql_tool, "HOLD_BYTES", 64 * 1024)
        streamed = await _run(registry, ctx, query)
        assert slots.running() == 1
        assert sum(b.num_rows for b in streamed.table) == 50_000
        assert slots.running() == 0

    asyncio.run(scenario())


# -- the fair line -------------------------------------------------------------------------------

def test_waiters_are_served_round_robin_across_users_in_order_within_one() -> None:
    slots = QuerySlots(per_user=3, total=1, wait_s=10)
    order: list[str] = []

    async def call(name: str) -> None:
        slot = await slots.acquire(name.split("-")[0])
        order.append(name)
        slot.release()

    async def scenario() -> None:
        holder = slots.try_acquire("x")
        tasks = []
        for name in ["ann-1", "ann-2", "ann-3", "bob-1", "bob-2", "cid-1"]:
            tasks.append(asyncio.ensure_future(call(name)))
            await asyncio.sleep(0)  # each is in line before the next arrives
        assert slots.waiting() == 6 and slots.waiting("ann") == 3
        holder.release()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert order == ["ann-1", "bob-1", "cid-1", "ann-2", "bob-2", "ann-3"]


def test_the_number_ahead_follows_the_round_robin() -> None:
    from datadesk.store.fair_queue import FairQueue, Waiter

    line = FairQueue(per_user=1, total=1)
    assert line.offer(Waiter("x"))
    waiters = {name: Waiter(name.split("-")[0]) for name in ["ann-1", "ann-2", "ann-3", "bob-1", "cid-1"]}
    for w in waiters.values():
        assert not line.offer(w)
    ahead = {name: line.ahead(w) for name, w in waiters.items()}
    # served: ann-1, bob-1, cid-1, ann-2, ann-3
    assert ahead == {"ann-1": 0, "bob-1": 1, "cid-1": 2, "ann-2": 3, "ann-3": 4}


def test_a_user_at_their_own_limit_does_not_hold_up_the_others() -> None:
    slots = QuerySlots(per_user=1, total=2, wait_s=10)

    async def scenario() -> None:
        ann = slots.try_acquire("ann")
        second = asyncio.ensure_future(slots.acquire("ann"))  # waits for ann's own
        await asyncio.sleep(0)
        bob = await asyncio.wait_for(slots.acquire("bob"), 5)  # a free global slot: served at once
        assert slots.running() == 2 and slots.waiting("ann") == 1
        ann.release()
        (await second).release()
        bob.release()
        assert slots.running() == 0 and slots.waiting() == 0

    asyncio.run(scenario())


def test_a_thread_waiting_with_acquire_blocking_is_served_in_line() -> None:
    slots = QuerySlots(per_user=1, total=1, wait_s=10)
    holder = slots.try_acquire("x")
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire_blocking("ann", "table download").what))
    waiter.start()
    while slots.waiting() == 0:
        threading.Event().wait(0.01)
    assert slots.try_acquire("bob") is None  # ann is in line first
    holder.release()
    waiter.join(10)
    assert got == ["table download"] and slots.running("ann") == 1


def test_a_wait_is_reported_as_progress_through_the_sql_tool(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=1, wait_s=30)
    registry = _registry(warehouse, slots)
    seen: dict[str, list[str]] = {"ann": [], "bob": []}

    async def scenario() -> None:
        holder = slots.try_acquire("x")
        ann = asyncio.ensure_future(_run(registry, _ctx(root, "ann", lambda **f: seen["ann"].append(f["message"])),
                                         "SELECT 1 AS x"))
        await _until(lambda: seen["ann"])
        bob = asyncio.ensure_future(_run(registry, _ctx(root, "bob", lambda **f: seen["bob"].append(f["message"])),
                                         "SELECT 2 AS x"))
        await _until(lambda: seen["bob"])
        assert seen == {"ann": ["waiting for a query slot: 0 ahead"], "bob": ["waiting for a query slot: 1 ahead"]}
        holder.release()
        assert not (await ann).is_error and not (await bob).is_error
        assert slots.running() == 0

    asyncio.run(scenario())


def test_a_wait_past_the_queue_time_is_refused_naming_the_settings() -> None:
    slots = QuerySlots(per_user=1, total=1, wait_s=0.2)

    async def scenario() -> tuple[str, str]:
        other = slots.try_acquire("x")
        with pytest.raises(Busy) as everyone:
            await slots.acquire("ann")
        assert slots.waiting() == 0  # it left the line
        other.release()
        mine = slots.try_acquire("ann")
        with pytest.raises(Busy) as own:
            await slots.acquire("ann")
        mine.release()
        assert slots.running() == 0 and slots.waiting() == 0
        return str(everyone.value), str(own.value)

    everyone, own = asyncio.run(scenario())
    assert "limits.sql_queries)" in everyone and "limits.sql_queue_s" in everyone and "0.2 s" in everyone
    assert "limits.sql_queries_per_user" in own and "limits.sql_queue_s" in own


def test_a_call_cancelled_in_line_takes_no_slot_even_when_granted_in_that_moment() -> None:
    slots = QuerySlots(per_user=1, total=1, wait_s=10)

    async def scenario() -> None:
        holder = slots.try_acquire("x")
        queued = asyncio.ensure_future(slots.acquire("ann"))
        await asyncio.sleep(0)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert slots.waiting() == 0 and slots.running() == 1
        raced = asyncio.ensure_future(slots.acquire("ann"))
        await asyncio.sleep(0)
        holder.release()  # hands the slot to `raced` ...
        raced.cancel()  # ... which is cancelled before it ran again
        with pytest.raises(asyncio.CancelledError):
            await raced
        assert slots.running() == 0 and slots.waiting() == 0
        assert slots.try_acquire("bob") is not None

    asyncio.run(scenario())


def test_memory_that_rose_during_the_wait_refuses_the_query_and_frees_its_slot() -> None:
    rss = [100 << 20]
    slots = QuerySlots(per_user=1, total=1, wait_s=10, guard=MemoryGuard(1000, sample=lambda: rss[0]))

    async def scenario() -> None:
        holder = slots.try_acquire("x")
        queued = asyncio.ensure_future(slots.acquire("ann"))
        await _until(lambda: slots.waiting() == 1)
        rss[0] = 900 << 20  # past the admit level while it waited
        holder.release()
        with pytest.raises(Busy, match="limits.app_memory_mb"):
            await queued
        assert slots.running() == 0 and slots.waiting() == 0

    asyncio.run(scenario())


# -- the writer pool -----------------------------------------------------------------------------

def test_the_writer_pool_is_bounded_per_user_and_in_all_and_never_refuses() -> None:
    pool = WriterPool(per_user=1, total=2)
    served: list[str] = []

    async def write(user: str, tag: str):
        w = await pool.acquire(user)
        served.append(tag)
        return w

    async def scenario() -> None:
        a1 = await write("ann", "ann-1")
        a2 = asyncio.ensure_future(write("ann", "ann-2"))  # ann's own limit
        await asyncio.sleep(0)
        b1 = await write("bob", "bob-1")
        c1 = asyncio.ensure_future(write("cid", "cid-1"))  # the global limit
        await asyncio.sleep(0)
        assert pool.running() == 2 and pool.running("ann") == 1 and pool.waiting() == 2
        a1.release()
        (await a2).release()
        (await c1).release()
        b1.release()
        assert pool.running() == 0 and pool.waiting() == 0

    asyncio.run(scenario())
    assert served == ["ann-1", "bob-1", "ann-2", "cid-1"]


def test_a_write_waiting_for_a_writer_reports_it_then_writes(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=2, wait_s=5)
    registry = _registry(warehouse, slots)
    pipeline = _pipeline(root, WriterPool(1, 1))
    seen: list[dict] = []

    async def scenario():
        busy = await pipeline.writers.acquire("x")
        write = asyncio.ensure_future(_offload(pipeline, registry, _ctx(root, "ann"), BIG, lambda **f: seen.append(f)))
        await _until(lambda: seen)
        assert seen == [{"message": "waiting for a writer: 0 ahead"}] and not write.done()
        busy.release()
        return await write

    out = asyncio.run(scenario())
    assert out.artifact is not None and out.artifact.rows == 50000 and not out.result.is_error
    assert pipeline.writers.running() == 0 and slots.running() == 0


def test_a_write_cancelled_while_waiting_for_a_writer_leaves_no_slot_writer_or_artifact(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=1, wait_s=5)
    registry = _registry(warehouse, slots)
    pipeline = _pipeline(root, WriterPool(1, 1))
    ctx = _ctx(root, "cancel")

    async def scenario() -> None:
        busy = await pipeline.writers.acquire("x")
        write = asyncio.ensure_future(_offload(pipeline, registry, ctx, BIG))
        await _until(lambda: pipeline.writers.waiting() == 1)
        assert slots.running() == 1  # the stream is open, its query waits to be read
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        assert pipeline.writers.waiting() == 0 and pipeline.writers.running() == 1
        assert slots.running() == 0  # the stream was closed: its query stopped
        busy.release()
        assert pipeline.writers.running() == 0

    asyncio.run(scenario())
    adir = ctx.thread.artifacts_dir
    assert not adir.is_dir() or [p.name for p in adir.iterdir() if p.name != ".lock"] == []


@pytest.mark.parametrize("key,value", [("offload_writers", -1), ("offload_writers_per_user", 0), ("sql_queue_s", -1)])
def test_a_bad_limit_is_refused_naming_it(key: str, value: float) -> None:
    from datadesk.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match=f"limits.{key}"):
        load_settings(env={}, limits={key: value})
