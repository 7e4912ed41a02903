"""The `sql_query` tool: one read-only statement on one of the workspace's sources (the DuckDB
warehouse by default, or a configured database with `source`), all through one path:
`SourceSet.get(source)` -> `check` on the loop -> a query slot (a wait in line is reported as
progress) -> `record_batches` for the caller in a worker thread, cancellable. The slot covers
the database work: it goes back when the source was read to its end (the offload writer's
read-ahead thread reads the rest of a large result), failed or was closed.

Small results come back inline: compact JSON (columns, types, row_count,
rows) within `offload.threshold_chars`. When rows are
left out, the JSON carries a `notice` saying so in words the model cannot
mistake for a complete answer. Results too large to inline are returned as
a `TabularStream` for the offload pipeline, which writes them to Parquet.
"""

from __future__ import annotations

import itertools
import sys
from typing import Annotated, Any, Callable, Iterator

import msgspec
import pyarrow as pa

from datadesk.audit.queries import QueryEntry
from datadesk.domain.records import ToolRecordMeta
from datadesk.domain.tools import TabularStream, ToolError, ToolResult, ToolSpec
from datadesk.settings import SQLSettings
from datadesk.sources.errors import SQLError
from datadesk.sources.query import QueryControl, QueryResult, interruptible, jsonable
from datadesk.sources.registry import WAREHOUSE, Source, SourceSet
from datadesk.store.admission import Busy, QuerySlots
from datadesk.tools.arguments import ToolArguments
from datadesk.tools.registry import ToolContext, ToolRegistry
from datadesk.tools.sources import SOURCE_HELP

TOOL_NAME = "sql_query"

_encode = msgspec.json.Encoder().encode


def _description(settings: SQLSettings) -> str:
    return (
        "Run ONE read-only DuckDB SQL statement against this workspace's data warehouse "
        "and get the result as JSON (columns, types, row_count, rows). Allowed: SELECT "
        "(also WITH ... SELECT, FROM-first, VALUES), DESCRIBE <table>, SHOW TABLES, "
        "SUMMARIZE <table>, EXPLAIN <select>. Use SHOW TABLES and DESCRIBE <table> to learn "
        "the schema first. Filter and aggregate in SQL. A large result is saved as an artifact "
        "(you get its schema, row count and a preview, and can load it with the python tool) or, "
        "without the python tool, cut to fit with a notice. A statement is stopped after "
        f"{settings.timeout_s:g} s. Writes, SET/PRAGMA, "
        "extensions and files outside the warehouse are not available. With `source`, the statement "
        "runs read-only on that configured database instead, in its own SQL dialect."
    )


SQL_HINT = "`sql` must be a non-empty string holding one read-only SQL statement"


class SqlQuery(ToolArguments):
    """Arguments of `sql_query`."""

    sql: Annotated[str, msgspec.Meta(description="One SQL statement (no trailing second statement): DuckDB SQL "
                                                 "for the warehouse, the source's own dialect with `source`.")]
    source: Annotated[str, msgspec.Meta(description=SOURCE_HELP)] = ""

    hints = {"sql": SQL_HINT}


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


INLINE_MAX_ROWS = 2_000  # more rows than this never fit the inline threshold anyway
# a result read to its end within this many bytes is held in memory for its writer, and the query
# slot goes back at once; a larger one streams to its writer under the slot (the database works on)
HOLD_BYTES = 8 * 1024 * 1024


def first_rows(src: Source, user: str, sql: str, threshold_chars: int, stream_timeout_s: float,
               control: QueryControl | None = None, on_end: Callable[[], None] | None = None,
               entry: QueryEntry | None = None) -> ToolResult:
    """Run `sql` on `src` for `user`; small results come back inline, large ones as a stream for offload.

    The execution step of every read-only query the app runs for someone: the `sql_query`
    tool, and the data panel's table sample (tools/sqlsample.py; `threshold_chars` `sys.maxsize`,
    so its few rows come back inline). Blocking: call it in a worker thread (`interruptible`),
    after `src.check(sql)` and with the caller's query slot held. A result of at most
    INLINE_MAX_ROWS rows whose JSON fits `threshold_chars`, or an empty one, comes back inline
    (`content`, and `data`: columns, types, rows, row_count); any other carries a
    `TabularStream` (`ToolResult.table`, empty `content`) for the offload pipeline. SQLError
    (and its subclasses) when the source fails the statement.

    One execution: the batches already read for the size check are chained
    in front of the rest of the stream. `control` cancels it from another thread; the
    stream handed on keeps that hook (`TabularStream.interrupt`) for the offload writer.
    `on_end()` (the query slot's release) runs once the database work is over: the source
    read to its end (here, or by the offload writer's read-ahead thread), failed, or closed.
    `entry` (its audit entry) is written then too, with the rows and bytes the source returned.
    """
    stream = src.record_batches(sql, user, control=control)  # the statement timeout covers the first rows
    try:
        it = iter(stream)
        head: list[pa.RecordBatch] = []
        rows = 0
        exhausted = True
        held = 0
        for batch in it:
            if not head:
                stream.extend(stream_timeout_s)  # rows are flowing: allow time to write them out
            head.append(batch)
            rows += batch.num_rows
            held += batch.nbytes
            if rows > INLINE_MAX_ROWS and held > HOLD_BYTES:
                exhausted = False
                break
        if exhausted:
            if rows <= INLINE_MAX_ROWS:  # small enough to be answered inline, if its text fits
                table = pa.Table.from_batches(head, schema=stream.schema)
                result = QueryResult(
                    columns=table.column_names, types=stream.sql_types or [str(t) for t in table.schema.types],
                    rows=[[jsonable(v) for v in row.values()] for row in table.to_pylist()],
                    row_count=table.num_rows, truncated=False,
                )
                content = render_result(result, sys.maxsize)
                if len(content) <= threshold_chars and rows:
                    stream.close()
                    _answered(entry, rows, held)
                    return ToolResult(content=content, data=result.to_dict(), meta=ToolRecordMeta(rows=rows))
                if not rows:
                    stream.close()
                    _answered(entry, 0, held)
                    return ToolResult(content=content, data=result.to_dict(), meta=ToolRecordMeta(rows=0))
            # every row is in `head` (too wide to inline, or read whole within HOLD_BYTES): the
            # database work is done, and the slot goes back before the writer is awaited
            stream.close()
            if on_end is not None:
                on_end()
            _answered(entry, rows, held)
            return ToolResult(content="", table=TabularStream(stream.schema, iter(head)))
        batches = itertools.chain(head, it)
        table = TabularStream(stream.schema, _until_end(entry.counting(batches) if entry else batches, on_end),
                              stream.close, stream.interrupt)
        if on_end is not None:
            table.also_on_close(on_end)  # closed before it was read to its end
        if entry is not None:
            table.also_on_close(entry.closed)  # written already when it was read to its end
        return ToolResult(content="", table=table)
    except BaseException:
        stream.close()
        raise


def _answered(entry: QueryEntry | None, rows: int, nbytes: int) -> None:
    if entry is not None:
        entry.done("ok", rows=rows, nbytes=nbytes)


def _close_late(result: ToolResult) -> None:
    """A result that arrived after the call was cancelled: release its connection."""
    if result.table is not None:
        result.table.close()


def _until_end(batches: Iterator[pa.RecordBatch],
               on_end: Callable[[], None] | None) -> Iterator[pa.RecordBatch]:
    """`batches`, then `on_end()` as soon as the source gave its last one (or raised, or the
    reader stopped): in the thread that reads it, while the writer may still be encoding."""
    try:
        yield from batches
    finally:
        if on_end is not None:
            on_end()


def register_sql_tool(
    registry: ToolRegistry,
    sources_for: Callable[[ToolContext], SourceSet],
    settings: SQLSettings,
    threshold_chars: int = 8_000,
    stream_timeout_s: float = 600.0,
    slots: QuerySlots | None = None,
    audit: Any = None,
) -> None:
    """Register `sql_query`; `sources_for` gives the caller's workspace's sources (its warehouse
    and databases); `slots` bounds how many queries run per user and in the app (held until the
    source is read to its end or closed: the database work, not the artifact's write). `audit`
    (the `AuditTrail`) gets one entry per call, whatever way it ends (audit/queries.py)."""

    async def handler(args: SqlQuery, ctx: ToolContext) -> ToolResult:
        entry = QueryEntry(audit, ctx.user, ctx.workspace, ctx.thread.id, args.source or WAREHOUSE, args.sql)
        try:
            return await run(args, ctx, entry)
        except BaseException as exc:  # cancelled, or failed: written now unless written already
            entry.failed(exc)
            raise

    async def run(args: SqlQuery, ctx: ToolContext, entry: QueryEntry) -> ToolResult:
        sql = args.sql
        if not sql.strip():
            entry.refused("no statement")
            raise ToolError(SQL_HINT)
        try:
            src = sources_for(ctx).get(args.source)
            src.check(sql)  # in its dialect, on the loop: before any thread, slot or connection
        except SQLError as exc:
            entry.failed(exc, before_run=True)
            raise ToolError(str(exc)) from None
        try:  # waiting in line shows on the tool card ("waiting for a query slot: 3 ahead")
            slot = await slots.acquire(ctx.user, progress=ctx.report) if slots is not None else None
        except Busy as exc:
            entry.failed(exc)
            raise ToolError(str(exc)) from None
        control = QueryControl()  # a cancelled call (Stop, tool timeout) interrupts the statement
        if slot is not None:
            slot.on_pressure = control.cancel  # the memory guard may stop it
        release = slot.release if slot is not None else None
        try:
            result = await interruptible(control, first_rows, src, ctx.user, sql, threshold_chars,
                                         stream_timeout_s, control, release, entry, late=_close_late,
                                         executor=slots.executor if slots is not None else None)
        except BaseException as exc:
            if slot is not None:
                slot.release()
            if isinstance(exc, SQLError):  # includes SQLRefused, SQLTimeout and SQLLimit
                entry.failed(exc)
                raise ToolError(str(exc)) from None
            raise
        if slot is not None and result.table is None:
            slot.release()  # inline: the source is closed already
        return result

    registry.register(
        ToolSpec(
            name=TOOL_NAME,
            description=_description(settings),
            parameters=SqlQuery.schema(),
            permission=None,
            offloadable=True,
            read_only=True,
        ),
        handler,
        SqlQuery,
    )
