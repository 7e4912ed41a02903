"""`read_tool_result`: page an original tool result back from the thread log.

Compaction shows old results as stubs; this tool makes that lossless. It is
first-party (an explicit return contract, never offloaded) and read-type, so
what it returns is itself kept longer by compaction.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from datadesk.domain.ids import ID_PATTERN
from datadesk.domain.records import ToolRecordMeta
from datadesk.summary.model import render_summary
from datadesk.summary.service import SummaryService
from datadesk.tools.arguments import ToolArguments
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec

PAGE_CHARS = 8_000


class ReadToolResult(ToolArguments):
    """Arguments of `read_tool_result`."""

    call_id: Annotated[str, msgspec.Meta(description="the tool call id")]
    offset: Annotated[int, msgspec.Meta(description="first character (default 0)")] = 0
    limit: Annotated[int, msgspec.Meta(description=f"characters to return (default {PAGE_CHARS})")] = PAGE_CHARS

    hints = {"call_id": "`call_id` must be the id of an earlier tool call in this thread (e.g. 'call_ab12')",
             "offset": "`offset` must be a non-negative integer",
             "limit": "`limit` must be an integer between 1 and 50000"}


class Compact(ToolArguments):
    """Arguments of `compact`."""

    focus: Annotated[str, msgspec.Meta(description="what matters now")] | None = None

    hints = {"focus": "`focus` must be a short text (at most 500 chars) saying what matters now"}


async def read_tool_result(args: ReadToolResult, ctx: ToolContext) -> ToolResult:
    call_id, offset, limit = args.call_id, args.offset, args.limit
    if not ID_PATTERN.fullmatch(call_id):
        raise ToolError(ReadToolResult.hints["call_id"])
    if offset < 0:
        raise ToolError(ReadToolResult.hints["offset"])
    if not 1 <= limit <= 50_000:
        raise ToolError(ReadToolResult.hints["limit"])
    found = ctx.thread.log.find(lambda r: r.role == "tool" and r.tool_call_id == call_id)
    if not found:
        raise ToolError(f"no tool result with call id {call_id!r} in this thread")
    rec = found[0]
    text = rec.content
    if offset >= len(text) and text:
        raise ToolError(f"offset {offset} is past the end: the result has {len(text):,} chars")
    page = text[offset: offset + limit]
    end = offset + len(page)
    more = (f" next page: read_tool_result(\"{call_id}\", offset={end})" if end < len(text) else " (end)")
    header = (f"[result of {rec.name} (call {call_id}, seq {rec.seq}, {rec.status}): chars {offset:,}-{end:,} "
              f"of {len(text):,};{more}]\n")
    return ToolResult(content=header + page, meta=ToolRecordMeta(call_id=call_id, offset=offset, end=end))


def register_history_tools(registry: ToolRegistry) -> None:
    registry.register(
        ToolSpec(
            name="read_tool_result",
            description=("Page back the original, complete result of an earlier tool call of this thread "
                         "(old results are shown compacted). Use the call id from the compacted stub."),
            parameters=ReadToolResult.schema(),
            offloadable=False,
            read_only=True,
        ),
        read_tool_result,
        ReadToolResult,
    )


def register_compact_tool(registry: ToolRegistry, summaries: SummaryService) -> None:
    """`compact(focus)`: refresh the thread summary now, emphasising `focus`."""

    async def compact(args: Compact, ctx: ToolContext) -> ToolResult:
        focus = args.focus
        if focus is not None and len(focus) > 500:
            raise ToolError(Compact.hints["focus"])
        upto = (ctx.facts.user_seq or 1) - 1  # everything before the current message
        if upto < 1 or ctx.epoch is None:
            raise ToolError("nothing to summarize yet: this is the start of the thread")
        summary = await summaries.refresh(ctx.thread, upto, ctx.epoch, focus=focus, synchronous=True)
        if summary is None:
            raise ToolError("the summary could not be refreshed now; the previous one (if any) is kept")
        return ToolResult(content="Summary refreshed:\n" + render_summary(summary),
                          meta=ToolRecordMeta(covers_through_seq=summary.covers_through_seq))

    registry.register(
        ToolSpec(
            name="compact",
            description=("Refresh the structured summary of this thread now (goal, constraints, decisions, "
                         "data references, state), emphasising `focus`. Use it when the conversation has "
                         "drifted or before a long new phase of work."),
            parameters=Compact.schema(),
            offloadable=False,
            read_only=False,
        ),
        compact,
        Compact,
    )
