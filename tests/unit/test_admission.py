"""Query slots and the app's memory ceiling (issue 15): per-user and global slots held until a
large result is closed, a clear refusal naming each setting, and the memory guard stopping a
running query (against the real demo warehouse, through the `sql_query` tool)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from datadesk.settings import SQLSettings
from datadesk.sources.registry import SourceSet
from datadesk.sources.warehouse import Warehouse
from datadesk.store.admission import Busy, MemoryGuard, QuerySlots, rss_bytes
from datadesk.store.demo import create_demo_warehouse
from datadesk.store.threads import Thread
from datadesk.tools.registry import ToolContext, ToolRegistry
from datadesk.tools.sql import register_sql_tool

pytestmark = pytest.mark.security
BIG = "SELECT * FROM readings LIMIT 50000"  # offloaded: a stream, not inline
SLOW = "SELECT count(*) FROM range(3000000000) a WHERE a.range % 7 = 3"  # seconds of CPU, little memory


@pytest.fixture(autouse=True)
def _streamed_under_the_slot(monkeypatch):
    """These tests follow a large result that streams to its writer under the query slot; a
    result read whole within tools.sql.HOLD_BYTES frees its slot at once (tested on its own)."""
    monkeypatch.setattr("datadesk.tools.sql.HOLD_BYTES", 0)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> tuple[Path, Warehouse]:
    root = tmp_path_factory.mktemp("adm")
    data = root / "ws" / "data"
    db = create_demo_warehouse(data)
    return root, Warehouse(db, data, timeout_s=30)


def _registry(warehouse: tuple[Path, Warehouse], slots: QuerySlots) -> ToolRegistry:
    registry = ToolRegistry()
    register_sql_tool(registry, lambda ctx: SourceSet.of(warehouse[1]), SQLSettings(timeout_s=30), threshold_chars=2000,
                      slots=slots)
    return registry


def _ctx(root: Path, user: str) -> ToolContext:
    return ToolContext(thread=Thread(root / "ws" / "users" / user / "threads" / "t1"), workspace="ws", user=user,
                       permissions=frozenset(), call_id="c")


async def _run(registry: ToolRegistry, root: Path, user: str, sql: str):
    return await registry.run("sql_query", json.dumps({"sql": sql}), _ctx(root, user))


def test_rss_is_read_from_proc() -> None:
    assert rss_bytes() > 10 * 1024 * 1024


def test_a_users_second_query_waits_for_the_first_result_to_be_closed(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=4, wait_s=0.4)
    registry = _registry(warehouse, slots)

    async def scenario() -> None:
        first = await _run(registry, root, "ann", BIG)
        assert first.table is not None and slots.running("ann") == 1  # held while the stream is open
        started = time.monotonic()
        second = await _run(registry, root, "ann", "SELECT 1 AS x")
        assert second.is_error and time.monotonic() - started >= 0.35
        assert "limits.sql_queries_per_user" in second.content and "wait for it to finish" in second.content
        # a parallel call of the same turn: waits while the first result is written, then runs
        waiting = asyncio.ensure_future(_run(registry, root, "ann", "SELECT 5 AS x"))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        rows = sum(b.num_rows for b in first.table)
        first.table.close()
        assert '"rows":[[5]]' in (await waiting).content and rows == 50000
        first = await _run(registry, root, "ann", BIG)
        other = await _run(registry, root, "bob", "SELECT 2 AS x")  # another user is not affected
        assert not other.is_error and slots.running("bob") == 0
        assert sum(b.num_rows for b in first.table) == 50000
        first.table.close()
        assert slots.running() == 0
        again = await _run(registry, root, "ann", "SELECT 3 AS x")
        assert not again.is_error and '"rows":[[3]]' in again.content

    asyncio.run(scenario())


def test_errors_and_inline_results_release_the_slot(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=1, wait_s=0)
    registry = _registry(warehouse, slots)

    async def scenario() -> None:
        bad = await _run(registry, root, "ann", "SELECT * FROM no_such_table")
        assert bad.is_error and slots.running() == 0
        refused = await _run(registry, root, "ann", "DROP TABLE readings")
        assert refused.is_error and slots.running() == 0
        ok = await _run(registry, root, "ann", "SELECT 1 AS x")
        assert not ok.is_error and slots.running() == 0

    asyncio.run(scenario())


def test_global_slots_wait_then_refuse_naming_the_setting(warehouse) -> None:
    root, _ = warehouse
    slots = QuerySlots(per_user=1, total=2, wait_s=0.4)
    registry = _registry(warehouse, slots)

    async def scenario() -> None:
        a = await _run(registry, root, "ann", BIG)
        b = await _run(registry, root, "bob", BIG)
        started = time.monotonic()
        c = await _run(registry, root, "cid", "SELECT 1 AS x")
        assert c.is_error and time.monotonic() - started >= 0.35
        assert "limits.sql_queries" in c.content and "limits.sql_queue_s" in c.content
        # a slot that frees while waiting is taken
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, a.table.close)
        d = await _run(registry, root, "cid", "SELECT 4 AS x")
        assert not d.is_error
        b.table.close()
        assert slots.running() == 0

    asyncio.run(scenario())


class FakeRSS:
    """A settable RSS reading: the guard's logic, without using gigabytes in a test."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def test_near_the_ceiling_no_new_query_starts(warehouse) -> None:
    root, _ = warehouse
    rss = FakeRSS(900 * 1024 * 1024)
    slots = QuerySlots(1, 2, 0, MemoryGuard(1000, sample=rss))
    registry = _registry(warehouse, slots)
    result = asyncio.run(_run(registry, root, "ann", "SELECT 1 AS x"))
    assert result.is_error and "short of memory" in result.content and "limits.app_memory_mb" in result.content
    rss.value = 100 * 1024 * 1024
    assert not asyncio.run(_run(registry, root, "ann", "SELECT 1 AS x")).is_error


def test_past_the_ceiling_the_running_query_is_stopped(warehouse) -> None:
    root, _ = warehouse
    rss = FakeRSS(100 * 1024 * 1024)
    slots = QuerySlots(1, 2, 0, MemoryGuard(1000, sample=rss), watch_interval_s=0.05)
    registry = _registry(warehouse, slots)
    threading.Timer(0.5, lambda: setattr(rss, "value", 990 * 1024 * 1024)).start()
    started = time.monotonic()
    result = asyncio.run(_run(registry, root, "ann", SLOW))
    assert time.monotonic() - started < 10
    assert result.is_error, result.content
    assert "memory ceiling" in result.content and "limits.app_memory_mb" in result.content
    assert slots.running() == 0 and slots.stopped_for_memory == 1


def test_slot_release_is_idempotent_and_thread_safe() -> None:
    slots = QuerySlots(per_user=2, total=2, wait_s=0)
    s1 = slots.try_acquire("ann")
    s2 = slots.try_acquire("ann")
    assert s1 and s2 and slots.try_acquire("bob") is None
    with pytest.raises(Busy, match="short of memory"):
        QuerySlots(1, 1, 0, MemoryGuard(1, sample=lambda: 2 << 20)).try_acquire("ann")
    assert slots.try_acquire("ann") is None  # ann's own two are running
    threads = [threading.Thread(target=s1.release) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slots.running() == 1
    s2.release()
    assert slots.running() == 0 and slots.try_acquire("bob") is not None


def test_a_memory_stop_names_the_ceiling_for_source_streams_too() -> None:
    """The reason of an app-enforced cancel reaches every reader of the control (warehouse and
    source streams), not only the DuckDB path."""
    import pyarrow as pa

    from datadesk.sources.session import SourceStream
    from datadesk.sources.errors import SQLCancelled, SQLLimit
    from datadesk.sources.query import QueryControl

    class Session:  # the one piece of the Session protocol a stream touches here
        broken = False

        def interrupt(self) -> None:
            pass

    def run(reason: str | None):
        control = QueryControl()
        control.cancel(reason)
        batch = pa.record_batch({"x": [1, 2]})
        stream = SourceStream(Session(), batch.schema, iter([batch]), ["int"], control,
                              lambda exc, c: c.cancelled_error(), lambda s: None)
        with pytest.raises((SQLLimit, SQLCancelled)) as err:
            list(stream)
        return err.value

    stopped = run("the query was stopped: the server reached its memory ceiling (limits.app_memory_mb)")
    assert isinstance(stopped, SQLLimit) and "limits.app_memory_mb" in str(stopped)
    assert isinstance(run(None), SQLCancelled)
