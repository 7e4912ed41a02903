"""The `sql_query` tool: one read-only DuckDB statement against the workspace warehouse.

The model reads `content`: compact JSON (columns, types, row_count, rows),
cut at a row boundary to `SQLSettings.result_chars` characters. When rows are
left out, the JSON carries a `notice` saying so in words the model cannot
mistake for a complete answer. `data` holds the full result (up to max_rows)
for offload to an artifact.
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from datadesk.settings import SQLSettings
from datadesk.store.warehouse import QueryResult, SQLError, Warehouse
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec

TOOL_NAME = "sql_query"

_encode = msgspec.json.Encoder().encode


def _description(settings: SQLSettings) -> str:
    return (
        "Run ONE read-only DuckDB SQL statement against this workspace's data warehouse "
        "and get the result as JSON (columns, types, row_count, rows). Allowed: SELECT "
        "(also WITH ... SELECT, FROM-first, VALUES), DESCRIBE <table>, SHOW TABLES, "
        "SUMMARIZE <table>, EXPLAIN <select>. Use SHOW TABLES and DESCRIBE <table> to learn "
        "the schema first. Filter and aggregate in SQL: at most "
        f"{settings.max_rows:,} rows come back, long results are cut to fit (a notice says "
        f"so), and a statement is stopped after {settings.timeout_s:g} s. Writes, SET/PRAGMA, "
        "extensions and files outside the warehouse are not available."
    )


def _parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "sql": {
                "type": "string",
                "description": "One DuckDB SQL statement (no trailing second statement).",
            }
        },
        "required": ["sql"],
        "additionalProperties": False,
    }


def render_result(result: QueryResult, max_chars: int) -> str:
    """Compact JSON of `result`, rows cut to fit `max_chars` at a row boundary.

    The header (columns, types, row_count) is always kept. When rows are left
    out -- here, or already by the warehouse's max_rows cap -- a `notice`
    field states how many were shown, so a cut result is never read as whole.
    """
    total = len(result.rows)
    shown_total = f"more than {total}" if result.truncated else str(result.row_count)
    row_texts = [_encode(row).decode() for row in result.rows]

    def build(n: int, notice: str | None) -> str:
        head: dict[str, Any] = {"columns": result.columns, "types": result.types,
                                "row_count": result.row_count}
        if result.truncated:
            head["truncated"] = True
        if notice is not None:
            head["notice"] = notice
        prefix = _encode(head).decode()[:-1] + ',"rows":['
        return prefix + ",\n".join(row_texts[:n]) + "]}"

    def notice_for(n: int) -> str:
        return (f"shown {n} of {shown_total} rows; this is not the full result — "
                "narrow the query or aggregate in SQL")

    if not result.truncated:
        full = build(total, None)
        if len(full) <= max_chars:
            return full
    # Size the header with the widest notice, then add rows while they fit.
    fixed = len(build(0, notice_for(total)))
    budget, n = max_chars - fixed, 0
    for text in row_texts:
        cost = len(text) + (2 if n else 0)  # ",\n" between rows
        if cost > budget:
            break
        budget -= cost
        n += 1
    return build(n, notice_for(n))


def register_sql_tool(
    registry: ToolRegistry,
    warehouse_for: Callable[[ToolContext], Warehouse],
    settings: SQLSettings,
) -> None:
    """Register `sql_query`; `warehouse_for` picks the caller's workspace warehouse."""

    async def handler(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        sql = args.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise ToolError("`sql` must be a non-empty string holding one read-only SQL statement")
        try:
            result = await warehouse_for(ctx).query(sql)
        except SQLError as exc:  # includes SQLRefused and SQLTimeout
            raise ToolError(str(exc)) from None
        content = render_result(result, settings.result_chars)
        return ToolResult(
            content=content,
            data=result.to_dict(),
            meta={"row_count": result.row_count, "truncated": result.truncated},
        )

    registry.register(
        ToolSpec(
            name=TOOL_NAME,
            description=_description(settings),
            parameters=_parameters(),
            permission=None,
            offloadable=True,
            read_only=True,
        ),
        handler,
    )
