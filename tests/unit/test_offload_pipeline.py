"""The offload pipeline on its own: types, bad shapes, ceilings and failures."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel
from datadesk.llm.tokens import count_tokens
from datadesk.offload.pipeline import OffloadCapability
from datadesk.settings import OffloadSettings, SandboxSettings, Settings
from datadesk.store.threads import Thread
from datadesk.tools.registry import ToolContext, ToolResult, ToolSpec
from tests.fakes.sandbox import FakeSandbox

YES = OffloadCapability(True)
NO = OffloadCapability(False, "you do not have the code_execution permission")


@pytest.fixture
def rt(home: Path) -> Runtime:
    runtime = Runtime(settings=Settings(home=home, sandbox=SandboxSettings(backend="none")), model=ScriptedModel())
    FakeSandbox(runtime)
    return runtime


def ctx(rt: Runtime, tid: str = "t1") -> ToolContext:
    tdir = rt.layout.thread_dir("demo", "alice", tid)
    tdir.mkdir(parents=True, exist_ok=True)
    return ToolContext(thread=Thread.at(tdir), workspace="demo", user="alice",
                       permissions=frozenset({"code_execution"}), call_id="c1")


def process(rt: Runtime, spec: ToolSpec | None, arguments: str, result: ToolResult, c: ToolContext, cap):
    """The pipeline on the result of a call of `spec` with `arguments` in `c`'s thread."""
    origin = c.origin("tool", spec.name if spec else None, arguments)
    return rt.offload.process(spec, result, c.thread, origin, cap, c.epoch)


def sql(rt: Runtime, query: str, cap=YES):
    c = ctx(rt)
    args = json.dumps({"sql": query})

    async def go():
        result = await rt.tools.run("sql_query", args, c)
        return await process(rt, rt.tools.get("sql_query").spec, args, result, c, cap)

    return asyncio.run(go()), c


def text_tool(rt: Runtime, text: str, cap=YES):
    spec = ToolSpec(name="mcp__fetch", description="", parameters={}, read_only=True)
    c = ctx(rt)
    return asyncio.run(process(rt, spec, "{}", ToolResult(text), c, cap)), c


def data_file(c: ToolContext, out) -> Path:
    return c.thread.artifacts_dir / out.artifact.file


def test_type_fidelity_from_sql(rt: Runtime) -> None:
    out, c = sql(rt, """
        SELECT i::BIGINT AS n, i * 0.5 AS x, CASE WHEN i % 3 = 0 THEN NULL ELSE i END AS maybe,
               TIMESTAMP '2024-01-01 00:00:00' + INTERVAL (i) MINUTE AS ts, DATE '2024-01-01' + i::INT AS d,
               'name ' || i AS s, i % 2 = 0 AS flag
        FROM range(5000) t(i)""")
    t = pq.read_table(data_file(c, out))
    types = {f.name: f.type for f in t.schema}
    assert types["n"] == pa.int64() and pa.types.is_floating(types["x"]) or pa.types.is_decimal(types["x"])
    assert pa.types.is_timestamp(types["ts"]) and pa.types.is_date(types["d"])
    assert types["s"] in (pa.string(), pa.large_string()) and types["flag"] == pa.bool_()
    assert t.column("maybe").null_count == 1667
    row = t.slice(7, 1).to_pylist()[0]
    assert row["ts"] == dt.datetime(2024, 1, 1, 0, 7) and row["d"] == dt.date(2024, 1, 8)
    assert row["flag"] is False and row["n"] == 7


def test_type_fidelity_from_json_text(rt: Runtime) -> None:
    rows = [{"id": i, "v": i / 4, "ok": i % 2 == 0, "when": f"2024-03-{1 + i % 28:02d}T10:00:00",
             "note": None if i % 5 else "x" * 10} for i in range(2_000)]
    out, c = text_tool(rt, json.dumps(rows))
    t = pq.read_table(data_file(c, out))
    types = {f.name: f.type for f in t.schema}
    assert types["id"] == pa.int64() and types["v"] == pa.float64() and types["ok"] == pa.bool_()
    assert pa.types.is_timestamp(types["when"]) and t.num_rows == 2_000
    assert t.column("note").null_count == 1_600


def test_ragged_records_keep_every_row(rt: Runtime) -> None:
    rows = [{"a": i} if i % 2 else {"a": str(i), "b": [i]} for i in range(3_000)]
    out, c = text_tool(rt, json.dumps(rows))
    t = pq.read_table(data_file(c, out))
    assert t.num_rows == 3_000 and set(t.column_names) == {"a", "b"}


def test_text_that_claims_to_be_json_is_kept_as_text(rt: Runtime) -> None:
    text = '[{"a": 1}, {"a": 2}, this is not json ' + "z" * 9_000
    out, c = text_tool(rt, text)
    assert out.artifact.format == "text" and data_file(c, out).read_text() == text
    assert "NOT the full text" in out.result.content and count_tokens(out.result.content) < 2_000


def test_binary_looking_text_and_huge_cells(rt: Runtime) -> None:
    junk = "".join(chr(c) for c in range(1, 32)) * 400 + "\ufffd" * 2_000
    out, _ = text_tool(rt, junk)
    assert out.artifact.format == "text" and count_tokens(out.result.content) < 2_000
    rows = [{"id": i, "blob": "y" * 200_000} for i in range(20)]
    out, c = text_tool(rt, json.dumps(rows))
    assert out.artifact.rows == 20 and count_tokens(out.result.content) < 2_000
    assert "…" in out.result.content


def test_truncated_text_without_python(rt: Runtime) -> None:
    out, c = text_tool(rt, "line\n" * 10_000, cap=NO)
    assert out.artifact is None and len(out.result.content) <= 8_000
    assert "of 50,000 chars" in out.result.content and "code_execution" in out.result.content
    assert not (c.thread.artifacts_dir).exists() or not list((c.thread.artifacts_dir).glob("a*"))


def test_byte_ceiling_marks_partial_with_exact_rows(home: Path) -> None:
    rt = Runtime(settings=Settings(home=home, offload=OffloadSettings(result_max_bytes=400_000),
                                    sandbox=SandboxSettings(backend="none")),
                 model=ScriptedModel())
    FakeSandbox(rt)
    out, c = sql(rt, "SELECT i, md5(i::VARCHAR) AS h FROM range(1000000) t(i)")
    art = out.artifact
    written = pq.read_metadata(data_file(c, out)).num_rows
    assert art.status == "partial" and art.rows == written and 0 < written < 1_000_000
    assert f"exactly {written:,} rows were written" in out.result.content
    assert os.path.getsize(data_file(c, out)) <= 400_000 * 1.1


def test_disk_full_gives_truncated_form_and_leaves_nothing(rt: Runtime, monkeypatch) -> None:
    import datadesk.offload.parquet.writer as sink_mod

    real = sink_mod.ParquetSink.add

    def full(self, batch):
        real(self, batch)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sink_mod.ParquetSink, "add", full)
    out, c = sql(rt, "SELECT * FROM readings")
    assert out.artifact is None and "No space left on device" in out.result.content
    adir = c.thread.artifacts_dir
    assert not adir.exists() or [p.name for p in adir.iterdir() if p.name != ".lock"] == []


def test_empty_result_is_not_offloaded(rt: Runtime) -> None:
    out, c = text_tool(rt, "[]" + " " * 9_000)
    assert out.artifact is None
    out, c = sql(rt, "SELECT * FROM readings WHERE false")
    assert out.artifact is None and json.loads(out.result.content)["row_count"] == 0


def test_first_party_tools_are_never_offloaded(rt: Runtime) -> None:
    spec = ToolSpec(name="remember", description="", parameters={}, offloadable=False)
    c = ctx(rt)
    out = asyncio.run(process(rt, spec, "{}", ToolResult("m" * 50_000), c, YES))
    assert out.artifact is None and len(out.result.content) == 50_000


def test_artifact_files_are_readable_by_the_sandbox_user(rt: Runtime) -> None:
    out, c = sql(rt, "SELECT * FROM readings LIMIT 5000")
    assert os.stat(data_file(c, out)).st_mode & 0o777 == 0o644


def test_a_result_finishing_after_a_clear_leaves_nothing(rt: Runtime) -> None:
    import msgspec

    c = msgspec.structs.replace(ctx(rt, "tclear"), epoch=0)
    (c.thread.dir / "meta.json").write_text('{"id": "tclear", "workspace": "demo", "owner": "alice", '
                                            '"title": "t", "created": 0, "updated": 0, "epoch": 1}')
    args = json.dumps({"sql": "SELECT * FROM readings"})

    async def go():
        result = await rt.tools.run("sql_query", args, c)
        return await process(rt, rt.tools.get("sql_query").spec, args, result, c, YES)

    out = asyncio.run(go())
    assert out.result.is_error and "cleared" in out.result.content
    assert [p.name for p in (c.thread.artifacts_dir).iterdir() if p.name != ".lock"] == []


# -- cancellation and progress ---------------------------------------------------------------

BIG_SQL = "SELECT range AS i, range * 0.5 AS x, 'name ' || range AS s FROM range(30000000)"


def leftovers(c: ToolContext) -> list[str]:
    """Everything in the thread's artifacts folder but its lock: data, metadata, temp files."""
    d = c.thread.artifacts_dir
    return sorted(p.name for p in d.iterdir() if p.name != ".lock") if d.is_dir() else []


async def _wait_for(cond, seconds: float = 60.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def test_a_cancelled_offload_stops_the_writer_and_leaves_nothing(rt: Runtime) -> None:
    """Stop during a large offload (a real DuckDB query of 30 M rows): the writer thread stops,
    no metadata, no data file, no temp file; the next offload in the thread works."""
    c = ctx(rt)
    spec = rt.tools.get("sql_query").spec
    rt.offload.progress_interval_s = 0.05
    reports: list[dict] = []

    async def go():
        args = json.dumps({"sql": BIG_SQL})
        result = await rt.tools.run("sql_query", args, c)
        task = asyncio.create_task(rt.offload.process(spec, result, c.thread, c.origin("tool", spec.name, args),
                                                      YES, c.epoch, progress=lambda **f: reports.append(f)))
        await _wait_for(lambda: reports)  # rows are being written
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after_cancel = leftovers(c)
        count = len(reports)
        await asyncio.sleep(0.3)  # a writer still running would report again or publish
        return after_cancel, count, await process(rt, spec, "{}", await rt.tools.run(
            "sql_query", json.dumps({"sql": "SELECT * FROM range(5000)"}), c), c, YES)

    after_cancel, count, out = asyncio.run(go())
    assert after_cancel == []
    assert len(reports) == count and reports[-1]["rows"] < 30_000_000
    assert out.artifact is not None and out.artifact.rows == 5000
    assert leftovers(c) == [f"{out.artifact.id}.json", out.artifact.file]


def test_progress_reports_rows_and_bytes_during_a_large_offload(rt: Runtime) -> None:
    c = ctx(rt)
    spec = rt.tools.get("sql_query").spec
    rt.offload.progress_interval_s = 0.01
    reports: list[dict] = []
    args = json.dumps({"sql": "SELECT range AS i, 'name ' || range AS s FROM range(2000000)"})

    async def go():
        result = await rt.tools.run("sql_query", args, c)
        return await rt.offload.process(spec, result, c.thread, c.origin("tool", spec.name, args), YES, c.epoch,
                                        progress=lambda **f: reports.append(f))

    out = asyncio.run(go())
    assert out.artifact is not None and out.artifact.rows == 2_000_000
    assert len(reports) >= 2 and set(reports[0]) == {"rows", "bytes"}
    rows = [r["rows"] for r in reports]
    assert rows == sorted(rows) and 0 < rows[-1] <= 2_000_000
    assert reports[-1]["bytes"] > 0


def test_a_cancelled_sql_call_interrupts_the_query_and_the_next_call_answers(rt: Runtime) -> None:
    c = ctx(rt)

    async def go():
        slow = json.dumps({"sql": "SELECT count(*) FROM range(100000000) a, range(1000) b"})
        task = asyncio.create_task(rt.tools.run("sql_query", slow, c))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await rt.tools.run("sql_query", json.dumps({"sql": "SELECT 6 * 7 AS answer"}), c)

    result = asyncio.run(go())
    assert not result.is_error and json.loads(result.content)["rows"] == [[42]]


def test_an_artifact_published_just_before_the_cancel_is_removed(rt: Runtime) -> None:
    """The cancel arrives after the metadata was written: the artifact is removed again."""
    import threading

    from datadesk.offload.artifacts.store import new_artifact_id
    from datadesk.offload.worker import run_job

    c = ctx(rt)
    written = threading.Event()
    release = threading.Event()

    def write(job):
        art = rt.offload.write_text(c.thread, new_artifact_id(), "x" * 20_000, c.origin("tool", "t", "{}"),
                                    "result", job=job)
        written.set()
        release.wait(10)
        return art

    async def go():
        job = rt.offload.job(None)
        task = asyncio.create_task(run_job(job, write, job, discard=rt.offload.store.discard))
        await _wait_for(written.is_set)
        published = leftovers(c)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return published

    published = asyncio.run(go())
    assert len(published) == 2 and leftovers(c) == []


def test_a_write_cancelled_before_it_starts_writes_nothing(rt: Runtime) -> None:
    from datadesk.offload.artifacts.store import new_artifact_id
    from datadesk.offload.worker import WriteCancelled, WriteJob

    c = ctx(rt)
    job = WriteJob()
    job.cancel()
    with pytest.raises(WriteCancelled):
        rt.offload.write_text(c.thread, new_artifact_id(), "x" * 20_000, c.origin("tool", "t", "{}"), "result",
                              job=job)
    assert leftovers(c) == []


def _user(rt: Runtime):
    from datadesk.domain.users import User

    return User(id="alice", name="alice", workspaces=["demo"], permissions=["code_execution"])


@pytest.mark.parametrize("stage", ["receiving", "converting"])
def test_a_cancelled_upload_leaves_no_artifact_and_no_temp_file(rt: Runtime, tmp_path: Path, stage: str) -> None:
    """The client goes away while the file arrives, or while a large CSV is converted to Parquet."""
    import msgspec
    import pyarrow.csv as pacsv

    thread = rt.threads.create("demo", "alice")
    c = msgspec.structs.replace(ctx(rt), thread=thread)
    big = tmp_path / "big.csv"
    pacsv.write_csv(pa.table({"i": pa.array(range(1_500_000)), "name": pa.array(["row"] * 1_500_000)}), big)
    rt.offload.progress_interval_s = 0.01
    reports: list[dict] = []

    async def go():
        started = asyncio.Event()

        async def receive(fd: int) -> str:
            with os.fdopen(fd, "wb") as out:
                out.write(big.read_bytes()[: 1 << 20] if stage == "receiving" else big.read_bytes())
            started.set()
            if stage == "receiving":
                await asyncio.sleep(60)  # the rest never comes
            return "big.csv"

        task = asyncio.create_task(rt.attachments.upload(c.thread, _user(rt), receive,
                                                         progress=lambda **f: reports.append(f)))
        if stage == "receiving":
            await started.wait()
        else:
            await _wait_for(lambda: reports)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return leftovers(c)

    assert asyncio.run(go()) == []
    assert not rt.turns.running(c.thread.id)  # the thread is free for the next turn or upload


def test_a_cancelled_restore_keeps_the_tombstone_and_leaves_no_file(rt: Runtime) -> None:
    """Stop during a re-query of an expired artifact: it stays an expired tombstone, no data."""
    c = ctx(rt)
    spec = rt.tools.get("sql_query").spec
    rt.offload.progress_interval_s = 0.05
    reports: list[dict] = []

    async def go():
        small = json.dumps({"sql": "SELECT * FROM range(5000)"})
        out = await process(rt, spec, small, await rt.tools.run("sql_query", small, c), c, YES)
        rt.offload.store.expire(c.thread, out.artifact.id)
        tomb = rt.offload.store.load(c.thread, out.artifact.id)
        big = await rt.tools.run("sql_query", json.dumps({"sql": BIG_SQL}), c)
        task = asyncio.create_task(rt.offload.restore_async(c.thread, tomb, big,
                                                            progress=lambda **f: reports.append(f)))
        await _wait_for(lambda: reports)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return tomb

    tomb = asyncio.run(go())
    assert rt.offload.store.load(c.thread, tomb.id) == tomb
    assert leftovers(c) == [f"{tomb.id}.json"]
