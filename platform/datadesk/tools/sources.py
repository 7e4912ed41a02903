"""The model's side of the configured sources: `describe_source`, and the source a
`sql_query(sql, source=...)` call runs on.

`describe_source(source, table)` lists a source's tables and views with their columns, types
and comments from its own catalogue (cached per source for `catalog_ttl_s`); with `table`, that
table only, or the nearest names when there is none. The warehouse is described the same way.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Callable

import msgspec

from datadesk.domain.tools import ToolError, ToolResult, ToolSpec
from datadesk.sources.catalog import render_tables
from datadesk.sources.config import WAREHOUSE
from datadesk.sources.registry import Source, SourceSet
from datadesk.store.warehouse import QueryControl, SQLError, Warehouse
from datadesk.tools.arguments import ToolArguments
from datadesk.tools.registry import ToolContext, ToolRegistry

TOOL_NAME = "describe_source"
SOURCE_HELP = ("A data source name from the system message's 'Data sources' list; empty or "
               f"\"{WAREHOUSE}\": the workspace's DuckDB warehouse.")


class BoundSource:
    """A source bound to the calling user, shaped like the warehouse for the SQL tool:
    `record_batches(sql, control=...)` runs on that user's own read-only session."""

    def __init__(self, source: Source, user: str) -> None:
        self.source = source
        self.user = user

    def check(self, sql: str) -> None:
        self.source.check(sql)

    def record_batches(self, sql: str, control: QueryControl | None = None) -> Any:
        return self.source.record_batches(sql, self.user, control=control)


def is_warehouse(name: str) -> bool:
    return not name or name == WAREHOUSE


def bound_source(sources: SourceSet | None, name: str, user: str) -> BoundSource:
    """The named source for `user`; SQLError naming the configured ones, or why it cannot be used."""
    if sources is None:
        raise SQLError(f"there is no source {name!r}: no sources are set up on this server")
    return BoundSource(sources.get(name), user)


class DescribeSource(ToolArguments):
    """Arguments of `describe_source`."""

    source: Annotated[str, msgspec.Meta(description=SOURCE_HELP)] = ""
    table: Annotated[str, msgspec.Meta(description="One table (or schema.table) to show; empty: all tables.")] = ""


def register_source_tools(registry: ToolRegistry, sources_for: Callable[[ToolContext], SourceSet],
                          warehouse_for: Callable[[ToolContext], Warehouse]) -> None:
    """Register `describe_source` (read-only, first-party: its text is its own contract)."""

    async def handler(args: DescribeSource, ctx: ToolContext) -> ToolResult:
        try:
            if is_warehouse(args.source):
                tables = await asyncio.to_thread(warehouse_for(ctx).describe)
                label = f"{WAREHOUSE} (duckdb)"
            else:
                src = sources_for(ctx).get(args.source)
                tables = await asyncio.to_thread(src.describe)
                label = f"{src.name} ({src.dialect or 'SQL'})"
            text = render_tables(tables, args.table or None)
        except LookupError as exc:
            raise ToolError(f"{exc}") from None
        except SQLError as exc:
            raise ToolError(str(exc)) from None
        return ToolResult(content=f"source {label}:\n{text}")

    registry.register(
        ToolSpec(name=TOOL_NAME,
                 description=("List the tables and views of a data source (the warehouse by default) with "
                              "their columns, types and comments, from the source's own catalogue. Use it "
                              "before writing SQL for a source."),
                 parameters=DescribeSource.schema(), permission=None, offloadable=False, read_only=True),
        handler, DescribeSource)
