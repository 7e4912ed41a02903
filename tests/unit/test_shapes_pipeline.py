"""Shapes through the real offload pipeline: what the artifact, the model and the API say
about a result the source itself cut, its metadata, and structured content first."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.fixtures.shapes import TRUNCATED
from datadesk.api.controllers.artifacts import artifact_out
from datadesk.composition import Runtime
from datadesk.domain.sources import SourceHints
from datadesk.llm.scripted import ScriptedModel
from datadesk.llm.tokens import count_tokens
from datadesk.offload.pipeline import OffloadCapability
from datadesk.settings import SandboxSettings, Settings
from datadesk.store.threads import Thread
from datadesk.tools.mcp.shapes import column_formats, input_hints
from datadesk.tools.registry import ToolContext, ToolResult, ToolSpec

YES = OffloadCapability(True)


@pytest.fixture
def rt(home: Path) -> Runtime:
    return Runtime(settings=Settings(home=home, sandbox=SandboxSettings(backend="none")), model=ScriptedModel())


def run(rt: Runtime, result: ToolResult, arguments: str = "{}", parameters: dict | None = None):
    tdir = rt.layout.thread_dir("demo", "alice", "t1")
    tdir.mkdir(parents=True, exist_ok=True)
    c = ToolContext(thread=Thread.at(tdir), workspace="demo", user="alice", permissions=frozenset({"code_execution"}),
                    call_id="c1")
    spec = ToolSpec(name="crm__export", description="", parameters=parameters or {}, read_only=True)
    origin = c.origin("tool", spec.name, arguments)
    out = asyncio.run(rt.offload.process(spec, result, c.thread, origin, YES, c.epoch))
    assert out.artifact is not None, out.result.content[:500]
    return out, pq.read_table(c.thread.artifacts_dir / out.artifact.file), c


def test_source_truncation_reaches_the_artifact_the_model_and_the_api(rt: Runtime) -> None:
    text = TRUNCATED["json_columns_rows"](1024, truncated=True)
    out, table, c = run(rt, ToolResult(text))
    art = out.artifact
    assert table.num_rows == art.rows == 1024 and pc.sum(table["id"]).as_py() == sum(range(1024))
    assert art.status == "partial" and art.partial_by == "source"
    assert "Results limited to 1,024 rows" in art.source_note and "truncated: true" in art.source_note
    content = out.result.content
    assert "PARTIAL (by the source)" in content and "NOT all the data" in content
    assert "Results limited to 1,024 rows. Query returned more data." in content
    assert "source metadata:" in content and '"rowCount": 1024' in content
    assert count_tokens(content) <= rt.settings.offload.max_tokens
    api = artifact_out(rt, "t1", art)
    assert api.partial_by == "source" and api.status == "partial" and api.shape == art.shape
    saved = rt.artifacts.load(c.thread, art.id)  # what is on disk says it too
    assert saved.partial_by == "source" and saved.source_note == art.source_note


def test_cursor_and_paging_argument_say_how_to_get_the_rest(rt: Runtime) -> None:
    text = TRUNCATED["json_envelope"](600, truncated=True)
    hints = SourceHints(paging=["cursor"])
    out, table, _ = run(rt, ToolResult(text, source=hints))
    assert table.num_rows == 600 and out.artifact.partial_by == "source"
    assert "`cursor` = \"c2\"" in out.result.content and "has_more: true" in out.result.content
    assert out.artifact.source_meta["request_id"] == "r-42"


def test_documented_cap_of_the_tool_marks_partial(rt: Runtime) -> None:
    rows = [{"id": i, "v": i * 0.5} for i in range(500)]
    params = {"type": "object", "properties": {"query": {"type": "string"},
                                               "max_rows": {"type": "integer", "default": 500}}}
    paging, caps = input_hints(params)
    out, table, _ = run(rt, ToolResult(json.dumps(rows), source=SourceHints(caps=caps, paging=paging or None)),
                        parameters=params)
    assert table.num_rows == 500 and out.artifact.partial_by == "source"
    assert "larger `max_rows`" in out.result.content
    out, _, _ = run(rt, ToolResult(json.dumps(rows), source=SourceHints(caps=caps)), arguments='{"max_rows": 900}')
    assert out.artifact.status == "ready" and out.artifact.partial_by is None


def test_structured_content_is_preferred_over_the_text(rt: Runtime) -> None:
    structured = {"items": [{"id": i, "day": f"2024-01-{1 + i % 28:02d}"} for i in range(2000)], "total": 2000}
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "day": {"type": "string", "format": "date"}}}}}}
    hints = SourceHints(structured=structured, column_formats=column_formats(schema))
    out, table, _ = run(rt, ToolResult("Found 2000 items. " * 600, source=hints))
    assert table.num_rows == 2000 and str(table.schema.field("day").type) == "date32[day]"
    assert out.artifact.shape.startswith("structured content") and out.artifact.status == "ready"
    assert column_formats(schema) == {"id": "integer", "day": "date"}


def test_metadata_is_capped(rt: Runtime) -> None:
    meta = {f"k{i}": "x" * 500 for i in range(40)}
    text = json.dumps({**meta, "data": [{"a": i} for i in range(3000)]})
    out, table, _ = run(rt, ToolResult(text))
    kept = json.dumps(out.artifact.source_meta)
    assert table.num_rows == 3000 and len(kept) <= 2_300 and "more keys not kept" in kept


def test_source_truncation_is_said_when_nothing_can_be_saved(rt: Runtime) -> None:
    tdir = rt.layout.thread_dir("demo", "alice", "t2")
    tdir.mkdir(parents=True, exist_ok=True)
    c = ToolContext(thread=Thread.at(tdir), workspace="demo", user="alice", permissions=frozenset(), call_id="c2")
    spec = ToolSpec(name="crm__export", description="", parameters={}, read_only=True)
    text = TRUNCATED["json_columns_rows"](1024, truncated=True)
    out = asyncio.run(rt.offload.process(spec, ToolResult(text), c.thread, c.origin("tool", spec.name, "{}"),
                                         OffloadCapability(False, "no sandbox"), c.epoch))
    assert out.artifact is None and out.result.meta.truncated
    assert "PARTIAL (by the source)" in out.result.content and "Results limited to 1,024 rows" in out.result.content


def test_cap_documented_in_the_description() -> None:
    from datadesk.tools.mcp.shapes import described_cap, source_hints

    assert described_cap("Run a query. Returns at most 1,000 rows.") == 1000
    assert described_cap("Lists tables") is None
    hints = source_hints({"type": "object", "properties": {}}, None, None, "Search; up to 50 results")
    assert hints is not None and hints.caps == {"(its description)": 50}
    from datadesk.offload.readers import parse_text
    from datadesk.offload.source_cut import judge

    stream = parse_text(json.dumps([{"a": i} for i in range(50)]), hints)
    verdict = judge(stream.facts, 50)
    assert verdict.partial and "description" in verdict.words[0] and "narrower query" in verdict.how
