"""`read_tool_result`: page an original tool result back from the thread log.

Compaction shows old results as stubs; this tool makes that lossless. It is
first-party (an explicit return contract, never offloaded) and read-type, so
what it returns is itself kept longer by compaction.
"""

from __future__ import annotations

from typing import Any

from datadesk.domain.ids import ID_PATTERN
from datadesk.store.threadlog import ThreadLog
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec

PAGE_CHARS = 8_000


async def read_tool_result(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    call_id = args.get("call_id")
    if not isinstance(call_id, str) or not ID_PATTERN.fullmatch(call_id):
        raise ToolError("`call_id` must be the id of an earlier tool call in this thread (e.g. 'call_ab12')")
    offset = args.get("offset", 0)
    limit = args.get("limit", PAGE_CHARS)
    if not isinstance(offset, int) or offset < 0:
        raise ToolError("`offset` must be a non-negative integer")
    if not isinstance(limit, int) or not 1 <= limit <= 50_000:
        raise ToolError("`limit` must be an integer between 1 and 50000")
    log = ThreadLog(ctx.thread_dir / "log.jsonl")
    found = log.find(lambda r: r.role == "tool" and r.tool_call_id == call_id)
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
    return ToolResult(content=header + page, meta={"call_id": call_id, "offset": offset, "end": end})


def register_history_tools(registry: ToolRegistry) -> None:
    registry.register(
        ToolSpec(
            name="read_tool_result",
            description=("Page back the original, complete result of an earlier tool call of this thread "
                         "(old results are shown compacted). Use the call id from the compacted stub."),
            parameters={
                "type": "object",
                "properties": {
                    "call_id": {"type": "string", "description": "the tool call id"},
                    "offset": {"type": "integer", "description": "first character (default 0)"},
                    "limit": {"type": "integer", "description": f"characters to return (default {PAGE_CHARS})"},
                },
                "required": ["call_id"],
                "additionalProperties": False,
            },
            offloadable=False,
            read_only=True,
        ),
        read_tool_result,
    )


def register_compact_tool(registry: ToolRegistry, summaries) -> None:
    """`compact(focus)`: refresh the thread summary now, emphasising `focus`."""
    from datadesk.summary.model import render_summary

    async def compact(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        focus = args.get("focus")
        if focus is not None and (not isinstance(focus, str) or len(focus) > 500):
            raise ToolError("`focus` must be a short text (at most 500 chars) saying what matters now")
        upto = int(ctx.extra.get("user_seq", 1)) - 1  # everything before the current message
        if upto < 1 or ctx.epoch is None:
            raise ToolError("nothing to summarize yet: this is the start of the thread")
        summary = await summaries.refresh(ctx.thread_dir, upto, ctx.epoch, focus=focus, synchronous=True)
        if summary is None:
            raise ToolError("the summary could not be refreshed now; the previous one (if any) is kept")
        return ToolResult(content="Summary refreshed:\n" + render_summary(summary),
                          meta={"covers_through_seq": summary.covers_through_seq})

    registry.register(
        ToolSpec(
            name="compact",
            description=("Refresh the structured summary of this thread now (goal, constraints, decisions, "
                         "data references, state), emphasising `focus`. Use it when the conversation has "
                         "drifted or before a long new phase of work."),
            parameters={"type": "object",
                        "properties": {"focus": {"type": "string", "description": "what matters now"}},
                        "additionalProperties": False},
            offloadable=False,
            read_only=False,
        ),
        compact,
    )
