"""Tool arguments declared once (tools/arguments.py): the schema the model gets, the validation
the registry runs, and the typed struct the handler receives."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import pytest

from datadesk.domain.events import ToolFinished, TurnEvent
from datadesk.domain.records import ToolRecordMeta, record_meta
from datadesk.store.threads import Thread
from datadesk.tools.arguments import InvalidArguments, ToolArguments, arguments_schema, parse_arguments
from datadesk.tools.registry import ToolContext, ToolRegistry, ToolResult, ToolSpec


class Inner(msgspec.Struct):
    """A nested part."""

    n: int


class Sample(ToolArguments):
    """Arguments of a sample tool (this docstring is not sent)."""

    text: Annotated[str, msgspec.Meta(description="the text")]
    mode: Annotated[Literal["a", "b"], msgspec.Meta(description="default 'a'",
                                                    extra_json_schema={"type": "string"})] = "a"
    count: Annotated[int, msgspec.Meta(ge=1, le=5, description="default 2")] = 2
    note: Annotated[str, msgspec.Meta(description="optional")] | None = None
    inner: Inner | None = None

    hints = {"text": "`text` must be the text to use"}


def test_schema_is_plain_json_schema_with_no_titles_defaults_or_refs() -> None:
    assert arguments_schema(Sample) == {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "the text"},
            "mode": {"type": "string", "enum": ["a", "b"], "description": "default 'a'"},
            "count": {"type": "integer", "minimum": 1, "maximum": 5, "description": "default 2"},
            "note": {"type": "string", "description": "optional"},
            "inner": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                      "additionalProperties": False, "description": "A nested part."},
        },
        "required": ["text"],
        "additionalProperties": False,
    }
    assert Sample.schema() is arguments_schema(Sample)  # derived once


def test_validation_names_the_field_and_what_it_must_hold() -> None:
    assert parse_arguments("t", {"text": "x", "note": None, "extra": 1}, Sample) == Sample(text="x")
    with pytest.raises(InvalidArguments) as exc:
        parse_arguments("sample", {"text": 3}, Sample)
    assert str(exc.value) == ("invalid arguments for 'sample': Expected `str`, got `int` - at `$.text`; "
                              "`text` must be the text to use")
    with pytest.raises(InvalidArguments, match=r"Expected `int` <= 5 - at `\$\.count`$"):
        parse_arguments("sample", {"text": "x", "count": 9}, Sample)
    with pytest.raises(InvalidArguments, match=r"Invalid enum value 'c' - at `\$\.mode`"):
        parse_arguments("sample", {"text": "x", "mode": "c"}, Sample)


def _ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(thread=Thread(tmp_path / "t1"), workspace="ws", user="u", permissions=frozenset())


def test_registry_hands_the_typed_struct_and_answers_bad_arguments(tmp_path: Path) -> None:
    got: list[Sample] = []

    async def handler(args: Sample, ctx: ToolContext) -> ToolResult:
        got.append(args)
        return ToolResult(f"{args.text} x{args.count}", meta=ToolRecordMeta(rows=args.count))

    reg = ToolRegistry()
    reg.register(ToolSpec(name="sample", description="d", parameters=Sample.schema()), handler, Sample)
    ok = asyncio.run(reg.run("sample", json.dumps({"text": "hi", "count": 3}), _ctx(tmp_path)))
    assert ok.content == "hi x3" and got == [Sample(text="hi", count=3)] and ok.meta.rows == 3
    bad = asyncio.run(reg.run("sample", json.dumps({"text": "hi", "count": "3"}), _ctx(tmp_path)))
    assert bad.is_error and "invalid arguments for 'sample'" in bad.content and "`$.count`" in bad.content
    missing = asyncio.run(reg.run("sample", "{}", _ctx(tmp_path)))
    assert missing.is_error and "missing required text" in missing.content
    assert len(got) == 1  # the handler never saw the bad calls


def test_parameters_must_be_the_declared_schema() -> None:
    async def handler(args: Sample, ctx: ToolContext) -> ToolResult:
        return ToolResult("")

    with pytest.raises(ValueError, match="parameters differ from its Sample declaration"):
        ToolRegistry().register(ToolSpec(name="sample", description="d", parameters={"type": "object"}),
                                handler, Sample)


def test_meta_and_events_keep_their_wire_keys() -> None:
    assert record_meta(ToolRecordMeta()) is None
    assert record_meta(ToolRecordMeta(duration_ms=1.5, rows=0)) == {"duration_ms": 1.5, "rows": 0}
    plain = TurnEvent(ToolFinished(call_id="c", name="n", ok=True, seq=2, duration_ms=1.0, preview="p"))
    assert plain.type == "tool.finished" and "meta" not in plain.data
    with_meta = TurnEvent(ToolFinished(call_id="c", name="n", ok=True, seq=2, duration_ms=1.0, preview="p",
                                       meta=ToolRecordMeta(rows=4)))
    assert with_meta.data["meta"] == {"rows": 4}
