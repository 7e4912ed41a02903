"""The result grid (issue 19): pages of a tabular artifact's *full* data, sorted and filtered
on the server with DuckDB. A table is a Parquet artifact (query results, uploads, DataFrames the
code saved with `to_parquet`) or a CSV/TSV file the code wrote under /outputs.

Nothing the client sends becomes SQL text. A request names columns, operators and values;
columns are checked against the file's own schema and quoted, operators come from a fixed
table, values travel as bound parameters (cast to the column's type, itself checked against
a list of scalar types: a STRUCT's field names come from the file and are never pasted).

Each file is read by an in-memory DuckDB of its own, locked down before any query runs: the
one file is the only path it may read (`allowed_paths`, external access off), with the
memory, threads and spill bounds of `limits.sql_*` (sources/sqllimits.py), its settings
locked; each request takes a cursor of it and a deadline (`sql.timeout_s`) that interrupts
its statement. The database stays warm a minute for the next request on the same file
(offload/grid/databases.py: making one costs more than a page's query); a CSV stream opens
one of its own.

Counts (rows matching the filters, non-null values per column) cost a scan; they are
cached per (file, filters), so paging and sorting a view scan only for its page.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import math
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import duckdb
import msgspec
import pyarrow as pa

from datadesk.offload.grid.databases import GridDatabases, locked_database
from datadesk.offload.grid.csv_download import CSV_BATCH_ROWS, CSVEncoder, CSVError, one_line, stream
from datadesk.offload.grid.view import (Column, Filter, GridError, GridView, parse_filters, parse_sorts, quote,
                                        view_out, where_sql)
from datadesk.sources.sqllimits import SQLLimits, limit_message

__all__ = ["Column", "Filter", "GridError", "GridLimit", "GridReader", "GridView", "parse_request", "quote",
           "where_sql"]

log = logging.getLogger(__name__)

MAX_LIMIT = 1_000  # rows per page
MAX_OFFSET = 10**12
CELL_CHARS = 2_000  # a longer text cell is cut (with "…") in a page; the CSV has it whole
MAX_CELLS = 200_000  # per page (limit x columns)
COUNT_CACHE = 128
PARAMS = {"offset", "limit", "sort", "filter"}
_SAFE_INT = 2**53
ROW_NUMBER = "file_row_number"
TEXT_TABLES = {".csv", ".tsv"}


class GridLimit(RuntimeError):
    """The query hit a bound (time, memory, spill space); the message names it."""


# --------------------------------------------------------------------------- parsing
def _int(params: Mapping[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = params.get(name) or []
    if len(values) > 1:
        raise GridError(name, "give it once")
    if not values or values[0] == "":
        return default
    try:
        value = int(values[0])
    except ValueError:
        raise GridError(name, f"{values[0][:40]!r} is not a whole number") from None
    if not low <= value <= high:
        raise GridError(name, f"{value} is out of range ({low}-{high})")
    return value


def parse_request(params: Mapping[str, list[str]], columns: Sequence[Column],
                  paging: bool = True) -> tuple[GridView, int, int]:
    """The view, offset and limit of a request's query parameters (GridError naming a bad one)."""
    unknown = sorted(set(params) - PARAMS)
    if unknown:
        raise GridError(unknown[0], f"unknown parameter (use {', '.join(sorted(PARAMS))})")
    by_name = {c.name: c for c in columns}
    view = GridView(parse_sorts([s for s in params.get("sort", []) if s], by_name),
                    parse_filters(params.get("filter", []), by_name))
    if not paging:
        return view, 0, 0
    offset = _int(params, "offset", 0, 0, MAX_OFFSET)
    limit = _int(params, "limit", 100, 1, MAX_LIMIT)
    return view, offset, max(1, min(limit, MAX_CELLS // max(1, len(columns))))


# --------------------------------------------------------------------------- SQL
def is_csv(path: Path) -> bool:
    return path.suffix.lower() in TEXT_TABLES


def row_numbered(path: Path, columns: Sequence[Column]) -> bool:
    """Whether the source has DuckDB's file row number (Parquet, when no column takes its name)."""
    return not is_csv(path) and not any(c.name == ROW_NUMBER for c in columns)


def order_sql(view: GridView, rowno: bool, reverse: bool = False) -> str:
    """The ORDER BY of a sorted view (ties in file order when `rowno`); `reverse`: the opposite."""
    if not view.sort:
        return ""  # file order (DuckDB keeps it for one file)
    keys = [f"{quote(c)} {'DESC' if d != reverse else 'ASC'} NULLS {'FIRST' if reverse else 'LAST'}"
            for c, d in view.sort]
    if rowno:
        keys.append(f"{ROW_NUMBER}{' DESC' if reverse else ''}")  # ties in file order: pages are stable
    return " ORDER BY " + ", ".join(keys)


def from_the_end(view: GridView, rowno: bool, matching: int | None, offset: int) -> bool:
    """A sorted page past the middle is read in the opposite order from the end (DuckDB's top-N
    then keeps the rows after it, not the ones before: 600 ms -> ~260 ms at 900,000 of 1M)."""
    return bool(view.sort) and rowno and matching is not None and offset > matching // 2


def source_sql(path: Path, rowno: bool) -> str:
    """The FROM clause (the file is parameter 1): Parquet with its row number for the sort's ties,
    or a CSV/TSV file a kernel wrote (its dialect and types sniffed by DuckDB)."""
    if is_csv(path):
        return "read_csv(?, auto_detect=true, sample_size=20480)"
    return f"read_parquet(?, {ROW_NUMBER}=true)" if rowno else "read_parquet(?)"


def cell(value: Any) -> Any:
    """A value as the grid shows it (JSON-safe, exact: big ints and decimals as text)."""
    if value is None or isinstance(value, (bool, str)):
        return value if not isinstance(value, str) or len(value) <= CELL_CHARS else value[:CELL_CHARS] + "…"
    if isinstance(value, int):
        return value if -_SAFE_INT < value < _SAFE_INT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if isinstance(value, (decimal.Decimal, dt.timedelta)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value[:CELL_CHARS // 2]).hex() + ("…" if len(value) > CELL_CHARS // 2 else "")
    text = msgspec.json.encode(value, enc_hook=str).decode()
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + "…"


# --------------------------------------------------------------------------- reading
class GridReader:
    """Pages and CSV exports of Parquet files, each on a locked-down DuckDB of its own."""

    def __init__(self, limits: SQLLimits, timeout_s: float, stream_timeout_s: float = 600.0) -> None:
        self.limits = limits
        self.timeout_s = float(timeout_s)
        self.stream_timeout_s = float(stream_timeout_s)
        self._counts: OrderedDict[tuple, tuple[int, list[int]]] = OrderedDict()
        self._columns: OrderedDict[tuple, list[Column]] = OrderedDict()
        self._lock = threading.Lock()
        self.databases = GridDatabases(limits)  # warm, locked-down databases (offload/grid/databases.py)

    def _connect(self, path: Path) -> tuple[duckdb.DuckDBPyConnection, Path]:
        """A database of its own (a CSV stream: long-running, it keeps no warm one busy)."""
        return locked_database(self.limits, path)

    def _run(self, path: Path, work: Callable[[duckdb.DuckDBPyConnection], Any], timeout_s: float) -> Any:
        with self.databases.cursor(path) as con:
            timer = threading.Timer(timeout_s, con.interrupt)
            timer.daemon = True
            timer.start()
            try:
                return work(con)
            except duckdb.InterruptException:
                raise GridLimit(f"the grid query took longer than {timeout_s:g} s (sql.timeout_s): "
                                "add a filter, or sort by fewer columns") from None
            except duckdb.Error as exc:
                raise self._error(exc) from None
            finally:
                timer.cancel()

    def query(self, path: Path, work: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """`work(con)` on a locked-down connection that may read `path` only, under the grid's
        deadline and bounds (GridLimit, GridError as for a page)."""
        return self._run(path, work, self.timeout_s)

    def _error(self, exc: duckdb.Error) -> Exception:
        limited = limit_message(exc, self.limits)
        if limited:
            return GridLimit(limited.replace("the query", "the grid query"))
        if isinstance(exc, (duckdb.ConversionException, duckdb.InvalidInputException)):
            first = str(exc).splitlines()[0][:300]
            return GridError("filter", f"a value does not fit its column's type ({first})")
        return GridLimit(f"the table could not be read: {str(exc).splitlines()[0][:300]}")

    def columns(self, path: Path) -> list[Column]:
        """The file's columns as DuckDB reads them (names and types; cached per file version)."""
        st = path.stat()
        key = ("columns", str(path), st.st_mtime_ns, st.st_size)
        with self._lock:
            known = self._columns.get(key)
        if known is not None:
            return known
        rows = self._run(path, lambda con: con.execute(
            f"DESCRIBE SELECT * FROM {source_sql(path, False)}", [str(path)]).fetchall(), self.timeout_s)
        found = [Column(str(r[0]), str(r[1])) for r in rows]
        with self._lock:
            self._columns[key] = found
            while len(self._columns) > COUNT_CACHE:
                self._columns.popitem(last=False)
        return found

    def _count_key(self, path: Path, view: GridView) -> tuple:
        st = path.stat()
        return (str(path), st.st_mtime_ns, st.st_size, view.filters)

    def page(self, path: Path, columns: Sequence[Column], view: GridView, offset: int, limit: int) -> dict[str, Any]:
        """One page of the view: its rows, the rows matching the filters, non-null counts per column."""
        key = self._count_key(path, view)
        with self._lock:
            counts = self._counts.get(key)
            if counts is not None:
                self._counts.move_to_end(key)
        where, params = where_sql(view, columns)
        names = ", ".join(quote(c.name) for c in columns)
        rowno = row_numbered(path, columns)
        src = source_sql(path, rowno)

        def work(con: duckdb.DuckDBPyConnection) -> tuple[list[tuple], tuple[int, list[int]]]:
            found = counts
            if found is None:
                aggs = ", ".join(["count(*)", *(f"count({quote(c.name)})" for c in columns)])
                row = con.execute(f"SELECT {aggs} FROM {src}{where}", [str(path), *params]).fetchall()[0]
                found = (int(row[0]), [int(v) for v in row[1:]])
            if from_the_end(view, rowno, found[0], offset):
                take = max(0, min(limit, found[0] - offset))
                found_rows = con.execute(
                    f"SELECT {names} FROM {src}{where}{order_sql(view, rowno, reverse=True)} LIMIT ? OFFSET ?",
                    [str(path), *params, take, max(0, found[0] - offset - take)]).fetchall()[::-1]
            else:
                found_rows = con.execute(f"SELECT {names} FROM {src}{where}{order_sql(view, rowno)} LIMIT ? OFFSET ?",
                                         [str(path), *params, limit, offset]).fetchall()
            return found_rows, found

        table, counts = self._run(path, work, self.timeout_s)
        with self._lock:
            self._counts[key] = counts
            while len(self._counts) > COUNT_CACHE:
                self._counts.popitem(last=False)
        matching, non_null = counts
        data = [[cell(v) for v in row] for row in table]
        return {
            "rows": matching, "offset": offset, "limit": limit, "data": data,
            "columns": [{"name": c.name, "type": c.type, "kind": c.kind, "nulls": matching - n}
                        for c, n in zip(columns, non_null)],
            **view_out(view),
        }

    def _csv_sql(self, path: Path, columns: Sequence[Column], view: GridView,
                 sort: bool = True) -> tuple[str, list[Any]]:
        where, params = where_sql(view, columns)
        names = ", ".join(quote(c.name) for c in columns)
        rowno = row_numbered(path, columns)
        order = order_sql(view, rowno) if sort else ""
        return f"SELECT {names} FROM {source_sql(path, rowno)}{where}{order}", [str(path), *params]

    def csv_check(self, path: Path, columns: Sequence[Column], view: GridView, keep: bool = False) -> None:
        """Try what the CSV of the view writes before its response starts: every column's type and
        the first CSV_BATCH_ROWS rows matching the filters, encoded (GridError for a filter value
        its column cannot hold, GridLimit, CSVError). Unsorted: a sort costs a scan of its own and
        changes which rows come first, not how they are written."""
        sql, params = self._csv_sql(path, columns, view, sort=False)

        def work(con: duckdb.DuckDBPyConnection) -> None:
            table = con.sql(f"{sql} LIMIT {CSV_BATCH_ROWS}", params=params).to_arrow_table()
            try:
                encoder = CSVEncoder(table.schema, keep)
                for batch in table.to_batches():
                    encoder.encode(batch)
                encoder.header()
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise CSVError(f"{path.name} could not be written as CSV: {one_line(exc)}") from None

        self._run(path, work, self.timeout_s)

    def _stream_error(self, exc: Exception) -> str:
        if isinstance(exc, duckdb.InterruptException):
            return f"it took longer than {self.stream_timeout_s:g} s (offload.stream_timeout_s)"
        return str(self._error(exc)) if isinstance(exc, duckdb.Error) else one_line(exc)

    def csv(self, path: Path, columns: Sequence[Column], view: GridView, keep: bool = False) -> Iterator[bytes]:
        """Every row of the view as CSV (header first), streamed in batches (see offload/grid/csv_download.py;
        `keep`: formula-like text cells as they are). This runs once the response has started:
        a failure is logged and raised, so the download is cut rather than ended cleanly."""
        sql, params = self._csv_sql(path, columns, view)
        what = f"the table {path.name}"
        con, temp = self._connect(path)
        timer = threading.Timer(self.stream_timeout_s, con.interrupt)
        timer.daemon = True
        timer.start()
        try:
            try:
                reader = con.sql(sql, params=params).to_arrow_reader(CSV_BATCH_ROWS)
                encoder = CSVEncoder(reader.schema, keep)
            except Exception as exc:
                message = self._stream_error(exc)
                log.error("the CSV download of %s failed before its first row: %s", what, message)
                raise CSVError(f"the CSV download of {what} failed: {message}") from exc
            yield from stream(b"", reader, encoder, what, explain=self._stream_error)
        finally:
            timer.cancel()
            con.close()
            shutil.rmtree(temp, ignore_errors=True)
