"""Restoring an expired artifact by re-running the call that produced it.

Only read-only tools are re-run (first-party query tools, MCP tools with
`readOnlyHint`), and only after checking the caller's permission again. The
data comes back under the same id and sandbox path, and the report says what
changed: rows, schema and content hash, with the original and new times.
Nothing is ever reconstructed from a summary.
"""

from __future__ import annotations

import logging

from datadesk.domain.artifacts import Artifact
from datadesk.domain.records import RequeryReport
from datadesk.offload.pipeline import OffloadPipeline
from datadesk.offload.artifacts.expired import describe_origin, expired_message, iso_time
from datadesk.offload.artifacts.store import ArtifactNotFound, ArtifactStore
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry

log = logging.getLogger(__name__)


class RequeryService:
    """Re-runs origin calls through the registry and writes their data back through the pipeline."""

    def __init__(self, pipeline: OffloadPipeline, registry: ToolRegistry, store: ArtifactStore) -> None:
        self.pipeline = pipeline
        self.registry = registry
        self.store = store

    def _load(self, ctx: ToolContext, aid: str) -> Artifact | None:
        try:
            return self.store.load(ctx.thread, aid)
        except (ArtifactNotFound, ValueError):
            return None

    async def requery(self, aid: str, ctx: ToolContext) -> RequeryReport:
        """Re-run the origin call of `aid` in `ctx.thread`; ToolError with a reason the model can act on."""
        art = self._load(ctx, aid)
        if art is None:
            raise ToolError(f"there is no artifact {aid!r} in this thread")
        if art.origin.source != "tool" or not art.origin.tool:
            raise ToolError(f"artifact {aid} is {describe_origin(art)}, not a tool result: it cannot be "
                            "re-run. Ask the user to provide it again.")
        tool = self.registry.get(art.origin.tool, art.origin.workspace)
        if tool is None:
            raise ToolError(f"the tool {art.origin.tool!r} that produced {aid} is not available any more")
        if not tool.spec.read_only:
            raise ToolError(f"{art.origin.tool} is not a read-only tool, so the call cannot be safely "
                            "re-run automatically. Ask the user whether to run it again.")
        if tool.spec.permission and tool.spec.permission not in ctx.permissions:
            raise ToolError(f"re-running {art.origin.tool} needs the {tool.spec.permission!r} permission")
        result = await self.registry.run(art.origin.tool, art.origin.arguments or "{}", ctx)
        if result.is_error:
            if result.table is not None:
                result.table.close()
            raise ToolError(f"re-running {describe_origin(art)} failed: {result.content}")
        # a cancelled re-query stops the writer too; rows and bytes written show as progress
        new = await self.pipeline.restore_async(ctx.thread, art, result, progress=ctx.report)
        schema_equal = new is not None and list(new.schema) == list(art.schema)
        content_equal = new is not None and new.sha256 == art.sha256
        return RequeryReport(
            artifact=aid, restored=new is not None, path=new.sandbox_path if new else None,
            rows_before=art.rows, rows_after=new.rows if new else 0,
            schema_equal=schema_equal, content_equal=content_equal, original_time=iso_time(art.created),
            requeried_time=iso_time(new.requeried_at if new else None),
            changed=not (schema_equal and content_equal))

    async def ensure_available(self, aids: list[str], ctx: ToolContext, auto: bool) -> list[str]:
        """For artifacts named by code or the model: restore expired ones when `auto` allows
        (read-only origins only), else explain. Returns one message per problem."""
        problems: list[str] = []
        for aid in aids:
            art = self._load(ctx, aid)
            if art is None:
                problems.append(f"there is no artifact {aid} in this thread")
                continue
            if art.available:
                continue
            tool = (self.registry.get(art.origin.tool or "", art.origin.workspace)
                    if art.origin.source == "tool" else None)
            if auto and tool is not None and tool.spec.read_only:
                try:
                    report = await self.requery(aid, ctx)
                    problems.append(f"artifact {aid} had expired and was restored automatically "
                                    f"(rows {report.rows_before} -> {report.rows_after}, "
                                    f"{'changed' if report.changed else 'unchanged'})")
                    continue
                except ToolError as exc:
                    problems.append(f"{expired_message(art)} Automatic restore failed: {exc}")
                    continue
            problems.append(expired_message(art))
        return problems
