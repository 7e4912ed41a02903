"""First-party artifact tools (explicit return contracts: never offloaded)."""

from __future__ import annotations

from typing import Any

import msgspec

from datadesk.offload.requery import RequeryService
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec


def register_artifact_tools(registry: ToolRegistry, requery: RequeryService) -> None:
    async def requery_artifact(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        aid = args.get("artifact_id")
        if not isinstance(aid, str) or not aid:
            raise ToolError("`artifact_id` must be the id of an artifact in this thread (e.g. 'a1b2c3...')")
        report = await requery.requery(ctx.thread_dir, aid, ctx)
        return ToolResult(content=msgspec.json.encode(report).decode(), meta={"requery": report})

    registry.register(
        ToolSpec(
            name="requery_artifact",
            description=(
                "Restore an expired artifact by re-running the read-only query that produced it. "
                "The data comes back at the same /data path; the answer says whether rows, schema or "
                "content changed since the original run."
            ),
            parameters={
                "type": "object",
                "properties": {"artifact_id": {"type": "string", "description": "the artifact id"}},
                "required": ["artifact_id"],
                "additionalProperties": False,
            },
            offloadable=False,
            read_only=False,
        ),
        requery_artifact,
    )
