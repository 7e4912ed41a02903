"""Read and write overlap in the offload: `ReadAhead` (the source read in a producer thread) and
`TailHasher` (the file hashed while it is written), alone and inside the real pipeline."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datadesk.composition import Runtime
from datadesk.domain.tools import TabularStream
from datadesk.llm.scripted import ScriptedModel
from datadesk.offload.readahead import ReadAhead
from datadesk.offload.pipeline import OffloadCapability
from datadesk.offload.parquet.writer import ParquetSink
from datadesk.offload.parquet.tail_hash import TailHasher
from datadesk.offload.worker import WriteCancelled, WriteJob
from datadesk.settings import OffloadSettings, SandboxSettings, Settings
from datadesk.store.threads import Thread
from datadesk.tools.registry import ToolContext, ToolResult, ToolSpec
from tests.fakes.sandbox import FakeSandbox

YES = OffloadCapability(True)
SPEC = ToolSpec(name="mcp__rows", description="", parameters={}, read_only=True, offloadable=True, source="mcp")


@pytest.fixture
def rt(home: Path) -> Runtime:
    runtime = Runtime(settings=Settings(home=home, sandbox=SandboxSettings(backend="none")), model=ScriptedModel())
    FakeSandbox(runtime)
    return runtime


def ctx(rt: Runtime) -> ToolContext:
    tdir = rt.layout.thread_dir("demo", "alice", "t1")
    tdir.mkdir(parents=True, exist_ok=True)
    return ToolContext(thread=Thread.at(tdir), workspace="demo", user="alice",
                       permissions=frozenset({"code_execution"}), call_id="c1")


def leftovers(c: ToolContext) -> list[str]:
    d = c.thread.artifacts_dir
    return sorted(p.name for p in d.iterdir() if p.name != ".lock") if d.is_dir() else []


def batch(start: int, n: int) -> pa.RecordBatch:
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.record_batch({"id": ids, "x": pc.multiply(ids, 3), "s": pa.array([f"r{i}" for i in range(start, start + n)])})


def read_ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "offload-read-ahead"]


def offload(rt: Runtime, c: ToolContext, table: TabularStream):
    result = ToolResult(content="", table=table)
    return rt.offload.process(SPEC, result, c.thread, c.origin("tool", SPEC.name, "{}"), YES, c.epoch)


# ------------------------------------------------------------------ ReadAhead alone

def test_batches_come_out_in_order_each_once_with_a_slow_consumer_and_a_slow_producer() -> None:
    def source():
        for k in range(40):
            if k % 7 == 0:
                time.sleep(0.005)  # a slow producer now and then
            yield batch(k * 100, 100)

    seen = []
    with ReadAhead(source(), depth=3) as batches:
        for k, b in enumerate(batches):
            if k % 5 == 0:
                time.sleep(0.005)  # a slow consumer now and then
            seen.append(b)
    ids = pa.Table.from_batches(seen).column("id").to_pylist()
    assert ids == list(range(4000))
    assert read_ahead_threads() == []


def test_the_queue_never_holds_more_than_its_bounds() -> None:
    produced = 0
    consumed = 0
    most = 0
    lock = threading.Lock()

    def source():
        nonlocal produced
        for k in range(60):
            with lock:
                produced += 1
            yield batch(k * 1000, 1000)

    one = batch(0, 1000).nbytes
    with ReadAhead(source(), depth=50, max_bytes=3 * one) as batches:
        for _ in batches:
            time.sleep(0.002)
            with lock:
                consumed += 1
                most = max(most, produced - consumed)
    # 3 batches fit the byte bound; the producer may hold one more it is trying to queue.
    assert consumed == 60 and most <= 4


def test_an_error_in_the_producer_is_raised_after_the_batches_before_it() -> None:
    class Broken(Exception):
        pass

    def source():
        yield batch(0, 10)
        yield batch(10, 10)
        raise Broken("row 20 is not a row")

    seen = []
    with pytest.raises(Broken, match="row 20"):
        with ReadAhead(source()) as batches:
            for b in batches:
                seen.append(b.num_rows)
    assert seen == [10, 10] and read_ahead_threads() == []


def test_a_cancel_is_noticed_while_the_source_is_blocked_and_the_source_is_interrupted() -> None:
    release = threading.Event()
    interrupted = []

    def source():
        yield batch(0, 10)
        release.wait(30)  # a read that blocks (a slow query)
        raise RuntimeError("the query was cancelled")

    def interrupt():
        interrupted.append(threading.current_thread().name)
        release.set()

    job = WriteJob()
    t0 = time.monotonic()
    with pytest.raises(WriteCancelled):
        with ReadAhead(source(), check=job.check, interrupt=interrupt) as batches:
            for _ in batches:
                job.cancel()
    assert time.monotonic() - t0 < 5
    assert interrupted and read_ahead_threads() == []


def test_an_early_stop_interrupts_and_joins_the_producer_before_the_source_is_closed() -> None:
    """The caller closes the source (a DuckDB connection) only after the producer stopped."""
    state = {"producing": False, "closed_while_producing": None}
    stop = threading.Event()

    def source():
        k = 0
        while not stop.is_set():
            state["producing"] = True
            time.sleep(0.002)
            yield batch(k, 10)
            k += 10
            state["producing"] = False
        raise RuntimeError("interrupted")

    ra = ReadAhead(source(), depth=2, interrupt=stop.set)
    with ra as batches:
        for k, _ in enumerate(batches):
            if k == 5:
                break
    state["closed_while_producing"] = any(t.is_alive() for t in read_ahead_threads())
    assert stop.is_set() and state["closed_while_producing"] is False


# ------------------------------------------------------------------ TailHasher

def test_the_digest_taken_while_writing_equals_the_file_hash(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    with open(path, "wb", buffering=0) as fh:
        hasher = TailHasher(path)
        size = 0
        for k in range(50):
            chunk = bytes([k]) * (37_000 + k)
            fh.write(chunk)
            size += len(chunk)
            if k % 10 == 0:
                hasher.advance(size)
            if k % 13 == 0:
                time.sleep(0.01)  # let it catch up by polling the size
    digest, n = hasher.finish(size)
    data = path.read_bytes()
    assert n == len(data) and digest == hashlib.sha256(data).hexdigest()


def test_a_file_shorter_than_its_writer_said_is_an_error_not_a_wrong_hash(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 1000)
    hasher = TailHasher(path)
    with pytest.raises(OSError, match="ended at 1000 bytes"):
        hasher.finish(2000)
    stopped = TailHasher(path)
    stopped.abort()
    stopped.abort()  # idempotent


def test_a_sink_with_many_row_groups_publishes_the_hash_of_its_file(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    with ParquetSink(out, 1 << 30, row_group_rows=3_000) as sink:
        for k in range(20):
            sink.add(batch(k * 1000, 1000))
        res = sink.close()
    data = out.read_bytes()
    assert res.sha256 == hashlib.sha256(data).hexdigest() and res.bytes == len(data)
    assert pq.read_metadata(out).num_row_groups == 7 and res.rows == 20_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]


def test_row_groups_grow_from_a_small_first_one(tmp_path: Path, monkeypatch) -> None:
    import datadesk.offload.parquet.writer as sink_mod

    monkeypatch.setattr(sink_mod, "ROW_GROUP_FIRST_BYTES", 1 << 16)
    monkeypatch.setattr(sink_mod, "ROW_GROUP_BYTES", 1 << 20)
    out = tmp_path / "out.parquet"
    with ParquetSink(out, 1 << 30) as sink:
        for k in range(100):
            sink.add(batch(k * 2_000, 2_000))
        sink.close()
    meta = pq.read_metadata(out)
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(sizes) == 200_000
    assert sizes[0] < sizes[1] < sizes[2] and max(sizes) == sizes[3]


# ------------------------------------------------------------------ inside the pipeline

def test_the_offload_keeps_every_row_in_order_with_exact_sums(rt: Runtime) -> None:
    c = ctx(rt)
    n, size = 300_000, 7_000  # uneven batches, several row groups
    batches = [batch(start, min(size, n - start)) for start in range(0, n, size)]
    out = asyncio.run(offload(rt, c, TabularStream(batches[0].schema, iter(batches))))
    table = pq.read_table(c.thread.artifacts_dir / out.artifact.file)
    assert out.artifact.rows == table.num_rows == n and out.artifact.status == "ready"
    assert table.column("id").to_pylist() == list(range(n))
    assert pc.sum(table.column("x")).as_py() == 3 * n * (n - 1) // 2
    assert table.column("s")[n - 1].as_py() == f"r{n - 1}"


def test_an_error_in_the_source_mid_write_is_reported_and_leaves_nothing(rt: Runtime) -> None:
    c = ctx(rt)

    def source():
        for k in range(30):
            yield batch(k * 10_000, 10_000)
        raise ValueError("line 300001: not a row")

    out = asyncio.run(offload(rt, c, TabularStream(None, source())))
    assert out.artifact is None and out.result.is_error
    assert "not a row" in out.result.content
    assert leftovers(c) == [] and read_ahead_threads() == []


def test_a_cancel_mid_write_stops_both_threads_and_leaves_nothing(rt: Runtime) -> None:
    c = ctx(rt)
    produced = []
    closed = []

    def endless():
        k = 0
        while True:
            time.sleep(0.001)
            produced.append(k)
            yield batch(k * 5_000, 5_000)
            k += 1

    async def go():
        table = TabularStream(None, endless(), close=lambda: closed.append(True))
        task = asyncio.create_task(offload(rt, c, table))
        while len(produced) < 50:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert leftovers(c) == [] and read_ahead_threads() == []
    count = len(produced)
    time.sleep(0.2)
    assert len(produced) == count and closed == [True]  # nothing reads it any more; it was closed


def test_a_real_duckdb_offload_stopped_at_the_ceiling_closes_the_query_after_the_reader(home: Path) -> None:
    rt = Runtime(settings=Settings(home=home, offload=OffloadSettings(result_max_bytes=2_000_000),
                                    sandbox=SandboxSettings(backend="none")), model=ScriptedModel())
    FakeSandbox(rt)
    c = ctx(rt)
    args = json.dumps({"sql": "SELECT i, md5(i::VARCHAR) AS h FROM range(20000000) t(i)"})

    async def go():
        result = await rt.tools.run("sql_query", args, c)
        return await rt.offload.process(rt.tools.get("sql_query").spec, result, c.thread,
                                        c.origin("tool", "sql_query", args), YES, c.epoch)

    out = asyncio.run(go())
    written = pq.read_metadata(c.thread.artifacts_dir / out.artifact.file).num_rows
    assert out.artifact.status == "partial" and out.artifact.rows == written > 0
    assert pq.read_table(c.thread.artifacts_dir / out.artifact.file).column("i").to_pylist() == list(range(written))
    assert read_ahead_threads() == []
    # The connection went back: the next query answers.
    again = asyncio.run(rt.tools.run("sql_query", json.dumps({"sql": "SELECT 6 * 7 AS answer"}), c))
    assert json.loads(again.content)["rows"] == [[42]]


def test_the_stream_timeout_mid_write_stops_the_offload_and_leaves_nothing(home: Path) -> None:
    """The statement's deadline fires while the reader thread streams into the writer: the
    model is told the query timed out, no artifact, no temp file, and the next query answers."""
    rt = Runtime(settings=Settings(home=home, offload=OffloadSettings(stream_timeout_s=0.3),
                                    sandbox=SandboxSettings(backend="none")), model=ScriptedModel())
    FakeSandbox(rt)
    c = ctx(rt)
    args = json.dumps({"sql": "SELECT range AS i, md5(range::VARCHAR) AS h FROM range(200000000)"})

    async def go():
        result = await rt.tools.run("sql_query", args, c)
        return await rt.offload.process(rt.tools.get("sql_query").spec, result, c.thread,
                                        c.origin("tool", "sql_query", args), YES, c.epoch)

    t0 = time.monotonic()
    out = asyncio.run(go())
    assert time.monotonic() - t0 < 30
    assert out.artifact is None and out.result.is_error
    assert "exceeded 0.3 s" in out.result.content  # the SQL timeout's own message
    assert leftovers(c) == [] and read_ahead_threads() == []
    again = asyncio.run(rt.tools.run("sql_query", json.dumps({"sql": "SELECT 6 * 7 AS answer"}), c))
    assert json.loads(again.content)["rows"] == [[42]]


def test_ordered_map_keeps_the_order_and_stops_early() -> None:
    import threading
    import time

    from datadesk.offload.readahead import ordered_map

    started: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            started.append(i)
        time.sleep(0.002 * (i % 3))  # later items finish first now and then
        return i * i

    assert [(i, r) for i, r in ordered_map(work, range(40))] == [(i, i * i) for i in range(40)]
    started.clear()
    for i, _ in ordered_map(work, range(1000), workers=2, ahead=3):
        if i == 5:
            break
    assert len(started) <= 5 + 1 + 3 + 2  # no more than the ones handed on, waiting and running


def test_ordered_map_raises_the_pieces_error_in_order() -> None:
    from datadesk.offload.readahead import ordered_map

    def work(i: int) -> int:
        if i == 3:
            raise ValueError("piece 3")
        return i

    got = []
    with pytest.raises(ValueError, match="piece 3"):
        for i, r in ordered_map(work, range(10)):
            got.append(r)
    assert got == [0, 1, 2]
