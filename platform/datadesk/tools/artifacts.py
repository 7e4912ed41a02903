"""First-party artifact tools (explicit return contracts: never offloaded)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from datadesk.domain.records import ToolRecordMeta
from datadesk.tools.arguments import ToolArguments
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec
from datadesk.tools.requery import RequeryService

REQUERY_TOOL = "requery_artifact"


class RequeryArtifact(ToolArguments):
    """Arguments of `requery_artifact`."""

    artifact_id: Annotated[str, msgspec.Meta(description="the artifact id")]

    hints = {"artifact_id": "`artifact_id` must be the id of an artifact in this thread (e.g. 'a1b2c3...')"}


def register_artifact_tools(registry: ToolRegistry, requery: RequeryService) -> None:
    async def requery_artifact(args: RequeryArtifact, ctx: ToolContext) -> ToolResult:
        if not args.artifact_id:
            raise ToolError(RequeryArtifact.hints["artifact_id"])
        report = await requery.requery(args.artifact_id, ctx)
        return ToolResult(content=msgspec.json.encode(report).decode(), meta=ToolRecordMeta(requery=report))

    registry.register(
        ToolSpec(
            name=REQUERY_TOOL,
            description=(
                "Restore an expired artifact by re-running the read-only query that produced it. "
                "The data comes back at the same /data path; the answer says whether rows, schema or "
                "content changed since the original run."
            ),
            parameters=RequeryArtifact.schema(),
            offloadable=False,
            read_only=False,
        ),
        requery_artifact,
        RequeryArtifact,
    )
