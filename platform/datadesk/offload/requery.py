"""Restoring an expired artifact by re-running the call that produced it.

Only read-only tools are re-run (first-party query tools, MCP tools with
`readOnlyHint`), and only after checking the caller's permission again. The
data comes back under the same id and sandbox path, and the report says what
changed: rows, schema and content hash, with the original and new times.
Nothing is ever reconstructed from a summary.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

from datadesk.domain.artifacts import Artifact
from datadesk.offload.pipeline import OffloadPipeline, result_table
from datadesk.offload.store import ArtifactNotFound, ArtifactStore
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry

log = logging.getLogger(__name__)


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds") if ts else None


def describe_origin(art: Artifact) -> str:
    o = art.origin
    if o.source == "tool":
        return f"{o.tool}({o.arguments})"
    if o.source == "upload":
        return f"upload of {o.filename!r}"
    return "python code"


def expired_message(art: Artifact) -> str:
    """What the model is told when it refers to an artifact whose data is gone."""
    base = (f"artifact {art.id} has expired (its data was removed from the cache at "
            f"{_iso(art.expired_at)}); it came from {describe_origin(art)}.")
    if art.origin.source == "tool":
        return base + f" Call requery_artifact(\"{art.id}\") to restore it by re-running that call."
    return base + " It cannot be re-created automatically: ask the user to upload it again."


class RequeryService:
    def __init__(self, pipeline: OffloadPipeline, registry: ToolRegistry, store: ArtifactStore) -> None:
        self.pipeline = pipeline
        self.registry = registry
        self.store = store

    async def requery(self, thread_dir: Path, aid: str, ctx: ToolContext) -> dict[str, Any]:
        """Re-run the origin call of `aid`; raises ToolError with a reason the model can act on."""
        import asyncio

        try:
            art = self.store.load(thread_dir, aid)
        except (ArtifactNotFound, ValueError):
            raise ToolError(f"there is no artifact {aid!r} in this thread") from None
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
        new = await asyncio.to_thread(self._rewrite, thread_dir, art, result)
        report = {
            "artifact": aid,
            "restored": new is not None,
            "path": new.sandbox_path if new else None,
            "rows_before": art.rows,
            "rows_after": new.rows if new else 0,
            "schema_equal": bool(new) and [c for c in new.schema] == [c for c in art.schema],
            "content_equal": bool(new) and new.sha256 == art.sha256,
            "original_time": _iso(art.created),
            "requeried_time": _iso(new.requeried_at if new else None),
        }
        report["changed"] = not (report["schema_equal"] and report["content_equal"])
        return report

    def _rewrite(self, thread_dir: Path, art: Artifact, result) -> Artifact | None:
        table = result_table(result)
        try:
            if table is not None:
                new, _, _ = self.pipeline.write_table(thread_dir, art.id, table, art.origin, art.kind, existing=art)
            else:
                new = self.pipeline.write_text(thread_dir, art.id, result.content, art.origin, art.kind,
                                               existing=art)
        finally:
            if table is not None:
                table.close()
        if new is not None and new.file != art.file:
            # the format changed (text <-> table): the old file must not linger
            old = thread_dir / "artifacts" / art.file
            if old.exists():
                old.unlink()
        return new

    async def ensure_available(self, thread_dir: Path, aids: list[str], ctx: ToolContext,
                               auto: bool) -> list[str]:
        """For artifacts named by code or the model: restore expired ones when `auto` allows
        (read-only origins only), else explain. Returns one message per problem."""
        problems: list[str] = []
        for aid in aids:
            try:
                art = self.store.load(thread_dir, aid)
            except (ArtifactNotFound, ValueError):
                problems.append(f"there is no artifact {aid} in this thread")
                continue
            if art.available:
                continue
            tool = (self.registry.get(art.origin.tool or "", art.origin.workspace)
                    if art.origin.source == "tool" else None)
            if auto and tool is not None and tool.spec.read_only:
                try:
                    report = await self.requery(thread_dir, aid, ctx)
                    problems.append(f"artifact {aid} had expired and was restored automatically "
                                    f"(rows {report['rows_before']} -> {report['rows_after']}, "
                                    f"{'changed' if report['changed'] else 'unchanged'})")
                    continue
                except ToolError as exc:
                    problems.append(f"{expired_message(art)} Automatic restore failed: {exc}")
                    continue
            problems.append(expired_message(art))
        return problems
