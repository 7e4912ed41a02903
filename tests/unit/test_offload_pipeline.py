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

from datadesk.chat.runtime import Runtime
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
    import datadesk.offload.sink as sink_mod

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
