"""The model's side of the sources: `describe_source`, and the help text of the `source`
argument that `sql_query` shares.

`describe_source(source, table)` lists a source's tables and views with their columns, types
and comments from its own catalogue (a configured database's is cached per source for
`catalog_ttl_s`); with `table`, that table only, or the nearest names when there is none. The
warehouse (the default source) is described the same way, through the same `SourceSet.get`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Callable

import msgspec

from datadesk.domain.tools import ToolError, ToolResult, ToolSpec
from datadesk.sources.catalog import render_tables
from datadesk.sources.config import WAREHOUSE
from datadesk.sources.errors import SQLError
from datadesk.sources.registry import SourceSet
from datadesk.tools.arguments import ToolArguments
from datadesk.tools.registry import ToolContext, ToolRegistry

TOOL_NAME = "describe_source"
SOURCE_HELP = ("A data source name from the system message's 'Data sources' list; empty or "
               f"\"{WAREHOUSE}\": the workspace's DuckDB warehouse.")


class DescribeSource(ToolArguments):
    """Arguments of `describe_source`."""

    source: Annotated[str, msgspec.Meta(description=SOURCE_HELP)] = ""
    table: Annotated[str, msgspec.Meta(description="One table (or schema.table) to show; empty: all tables.")] = ""


def register_source_tools(registry: ToolRegistry, sources_for: Callable[[ToolContext], SourceSet]) -> None:
    """Register `describe_source` (read-only, first-party: its text is its own contract)."""

    async def handler(args: DescribeSource, ctx: ToolContext) -> ToolResult:
        try:
            src = sources_for(ctx).get(args.source)
            tables = await asyncio.to_thread(src.describe)
            text = render_tables(tables, args.table or None)
        except LookupError as exc:
            raise ToolError(f"{exc}") from None
        except SQLError as exc:
            raise ToolError(str(exc)) from None
        return ToolResult(content=f"source {src.name} ({src.dialect or 'SQL'}):\n{text}")

    registry.register(
        ToolSpec(name=TOOL_NAME,
                 description=("List the tables and views of a data source (the warehouse by default) with "
                              "their columns, types and comments, from the source's own catalogue. Use it "
                              "before writing SQL for a source."),
                 parameters=DescribeSource.schema(), permission=None, offloadable=False, read_only=True),
        handler, DescribeSource)
