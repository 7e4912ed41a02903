"""The grid as an explorer (issue 32): a column's profile and a group-by of a table artifact's
FULL data, on the grid's own locked-down DuckDB (offload/grid/pages.py `GridReader.query`: the
one file readable, the `limits.sql_*` bounds, the `sql.timeout_s` deadline).

A profile counts rows, nulls and distinct values of one column (of the rows matching the view's
filters, all rows without); numbers add min, max, mean and a histogram of equal-width bins,
dates and timestamps a range and a histogram, text and booleans their most frequent values.

A group-by groups the matching rows by 1-3 columns (a date or timestamp column may be truncated
to an hour, day, week, month or year) and computes count, sum(column) or mean(column) per group.

As for pages, nothing the client sends becomes SQL text: columns come from the file's schema
(quoted), truncation parts and aggregates from fixed tables, filter values are bound parameters.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import duckdb

from datadesk.offload.grid.pages import GridReader, cell, source_sql
from datadesk.offload.grid.view import (DATES, Column, GridError, GridView, column_of, parse_filters, quote,
                                        view_out, where_sql)

PROFILE_BINS = 20
MAX_BINS = 100
TOP_VALUES = 10
MAX_GROUP_KEYS = 3
MAX_AGGS = 10
GROUP_LIMIT = 200
MAX_GROUP_LIMIT = 1_000
TRUNCATE = ("hour", "day", "week", "month", "year")
AGGS = {"count": "count(*)", "sum": "sum({q})", "mean": "avg({q})"}
PROFILE_PARAMS = {"column", "bins", "filter"}
GROUP_PARAMS = {"by", "agg", "sort", "limit", "filter"}
_EPOCH = dt.datetime(1970, 1, 1)


def _one(params: Mapping[str, list[str]], name: str) -> str | None:
    values = [v for v in params.get(name, []) if v != ""]
    if len(values) > 1:
        raise GridError(name, "give it once")
    return values[0] if values else None


def _number(params: Mapping[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    raw = _one(params, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise GridError(name, f"{raw[:40]!r} is not a whole number") from None
    if not low <= value <= high:
        raise GridError(name, f"{value} is out of range ({low}-{high})")
    return value


def _known(params: Mapping[str, list[str]], allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise GridError(unknown[0], f"unknown parameter (use {', '.join(sorted(allowed))})")


def _where(view: GridView, columns: Sequence[Column], extra: str) -> tuple[str, list[Any]]:
    where, params = where_sql(view, columns)
    return (f"{where} AND {extra}" if where else f" WHERE {extra}"), params


# --------------------------------------------------------------------------- profile
@dataclass(frozen=True)
class ProfileRequest:
    column: Column
    bins: int
    view: GridView


def parse_profile(params: Mapping[str, list[str]], columns: Sequence[Column]) -> ProfileRequest:
    """`column` (required), `bins` (1-MAX_BINS) and `filter` (as for /rows); GridError naming a bad one."""
    _known(params, PROFILE_PARAMS)
    by_name = {c.name: c for c in columns}
    name = _one(params, "column")
    if name is None:
        raise GridError("column", "name the column to profile")
    return ProfileRequest(column_of(by_name, name, "column"), _number(params, "bins", PROFILE_BINS, 1, MAX_BINS),
                          GridView(filters=parse_filters(params.get("filter", []), by_name)))


def _histogram_edges(lo: float, hi: float, bins: int) -> tuple[float, int]:
    if hi <= lo:
        return 1.0, 1
    return (hi - lo) / bins, bins


def profile(reader: GridReader, path: Path, columns: Sequence[Column], req: ProfileRequest) -> dict[str, Any]:
    """The profile of `req.column` over the rows matching `req.view` (see the module docstring)."""
    col, q = req.column, quote(req.column.name)
    src = source_sql(path, False)
    where, params = where_sql(req.view, columns)
    numeric, dated = col.kind == "number", bool(DATES.fullmatch(col.type))
    stats = ["count(*)", f"count({q})", f"count(DISTINCT {q})"]
    if numeric:
        stats += [f"min({q})", f"max({q})", f"avg({q})", f"min(CAST({q} AS DOUBLE))", f"max(CAST({q} AS DOUBLE))"]
    elif dated:
        stats += [f"min({q})", f"max({q})", f"min(epoch_us({q}))", f"max(epoch_us({q}))"]
    elif col.kind == "time":
        stats += [f"min({q})", f"max({q})"]

    def work(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
        row = con.execute(f"SELECT {', '.join(stats)} FROM {src}{where}", [str(path), *params]).fetchall()[0]
        rows, non_null, distinct = int(row[0]), int(row[1]), int(row[2])
        out: dict[str, Any] = {"column": col.name, "type": col.type, "kind": col.kind, "rows": rows,
                               "nulls": rows - non_null, "distinct": distinct, **view_out(req.view)}
        if len(row) > 3:
            out["min"], out["max"] = cell(row[3]), cell(row[4])
        if numeric:
            out["mean"] = cell(row[5])
        if (numeric or dated) and non_null:
            lo, hi = (float(row[6]), float(row[7])) if numeric else (float(row[5]), float(row[6]))
            out["histogram"] = _histogram(con, path, columns, req, lo, hi, dated)
        elif col.kind in ("text", "bool", "other") and non_null:
            out["top"], out["top_other"] = _top(con, path, columns, req, non_null)
        return out

    return reader.query(path, work)


def _histogram(con: duckdb.DuckDBPyConnection, path: Path, columns: Sequence[Column], req: ProfileRequest,
               lo: float, hi: float, dated: bool) -> list[dict[str, Any]]:
    q = quote(req.column.name)
    value = f"epoch_us({q})" if dated else f"CAST({q} AS DOUBLE)"
    width, bins = _histogram_edges(lo, hi, req.bins)
    where, params = _where(req.view, columns, f"{q} IS NOT NULL")
    # grouped and ordered by position: a column named b or n must not stand in for the alias
    found = dict(con.execute(
        f"SELECT least(CAST(floor(({value} - ?) / ?) AS BIGINT), ?) AS b, count(*) FROM {source_sql(path, False)}"
        f"{where} GROUP BY 1", [lo, width, bins - 1, str(path), *params]).fetchall())

    def edge(x: float) -> Any:
        if not dated:
            return x
        moment = _EPOCH + dt.timedelta(microseconds=round(x))
        return cell(moment.date() if req.column.type == "DATE" and moment.time() == dt.time() else moment)

    return [{"low": edge(lo + i * width), "high": edge(hi if i == bins - 1 else lo + (i + 1) * width),
             "count": int(found.get(i, 0))} for i in range(bins)]


def _top(con: duckdb.DuckDBPyConnection, path: Path, columns: Sequence[Column], req: ProfileRequest,
         non_null: int) -> tuple[list[dict[str, Any]], int]:
    q = quote(req.column.name)
    where, params = _where(req.view, columns, f"{q} IS NOT NULL")
    found = con.execute(f"SELECT {q}, count(*) AS n FROM {source_sql(path, False)}{where} GROUP BY 1 "
                        f"ORDER BY 2 DESC, 1 LIMIT {TOP_VALUES}", [str(path), *params]).fetchall()
    top = [{"value": cell(v), "count": int(n)} for v, n in found]
    return top, non_null - sum(t["count"] for t in top)


# --------------------------------------------------------------------------- group-by
@dataclass(frozen=True)
class GroupKey:
    column: Column
    part: str | None = None  # a TRUNCATE part for a date or timestamp column

    @property
    def name(self) -> str:
        return f"{self.column.name} ({self.part})" if self.part else self.column.name

    def sql(self) -> str:
        q = quote(self.column.name)
        return f"date_trunc('{self.part}', {q})" if self.part else q  # part: from TRUNCATE only


@dataclass(frozen=True)
class Aggregate:
    fn: str  # a key of AGGS
    column: Column | None = None

    @property
    def name(self) -> str:
        return "count" if self.column is None else f"{self.fn}({self.column.name})"

    def sql(self) -> str:
        return AGGS[self.fn].format(q=quote(self.column.name) if self.column else "")


@dataclass(frozen=True)
class GroupRequest:
    keys: tuple[GroupKey, ...]
    aggs: tuple[Aggregate, ...]
    view: GridView
    sort: tuple[tuple[int, bool], ...]  # (output column index, descending)
    limit: int


def _key(raw: str, by_name: Mapping[str, Column]) -> GroupKey:
    head, sep, tail = raw.rpartition(":")
    if sep and tail in TRUNCATE and head in by_name:
        col = by_name[head]
        if not DATES.fullmatch(col.type):
            raise GridError("by", f"{raw[:80]!r}: only a date or timestamp column can be grouped by {tail}")
        return GroupKey(col, tail)
    return GroupKey(column_of(by_name, raw, "by"))


def _agg(raw: str, by_name: Mapping[str, Column]) -> Aggregate:
    fn, sep, name = raw.partition(":")
    if fn == "count" and not sep:
        return Aggregate("count")
    if fn not in ("sum", "mean") or not sep:
        raise GridError("agg", f"{raw[:80]!r}: use count, sum:<column> or mean:<column>")
    col = column_of(by_name, name, "agg")
    if col.kind != "number":
        raise GridError("agg", f"{raw[:80]!r}: column {col.name!r} is {col.type[:40]}, not a number")
    return Aggregate(fn, col)


def parse_groups(params: Mapping[str, list[str]], columns: Sequence[Column]) -> GroupRequest:
    """`by` (1-3), `agg` (count | sum:<col> | mean:<col>, default count), `sort` (an output
    column, `:desc` for descending; default the keys ascending), `limit` and `filter`."""
    _known(params, GROUP_PARAMS)
    by_name = {c.name: c for c in columns}
    raw_keys = [v for v in params.get("by", []) if v]
    if not 1 <= len(raw_keys) <= MAX_GROUP_KEYS:
        raise GridError("by", f"name 1-{MAX_GROUP_KEYS} columns to group by")
    keys = tuple(_key(k, by_name) for k in raw_keys)
    if len({k.name for k in keys}) != len(keys):
        raise GridError("by", "a column is named twice")
    raw_aggs = [v for v in params.get("agg", []) if v] or ["count"]
    if len(raw_aggs) > MAX_AGGS:
        raise GridError("agg", f"at most {MAX_AGGS} aggregates")
    aggs = tuple(_agg(a, by_name) for a in raw_aggs)
    names = [k.name for k in keys] + [a.name for a in aggs]
    if len(set(names)) != len(names):
        raise GridError("agg", "an aggregate is named twice")
    sort: list[tuple[int, bool]] = []
    for raw in [v for v in params.get("sort", []) if v]:
        head, sep, tail = raw.rpartition(":")
        name, desc = (head, tail == "desc") if sep and tail in ("asc", "desc") else (raw, False)
        if name not in names:
            raise GridError("sort", f"{name[:80]!r} is not a column of the result ({', '.join(names)})")
        sort.append((names.index(name), desc))
    return GroupRequest(keys, aggs, GridView(filters=parse_filters(params.get("filter", []), by_name)),
                        tuple(sort), _number(params, "limit", GROUP_LIMIT, 1, MAX_GROUP_LIMIT))


def group_sql(src: str, columns: Sequence[Column], req: GroupRequest, counts: bool = True) -> tuple[str, list[Any]]:
    """The group-by's SQL over `src` (a FROM source whose path is the first parameter) and the
    parameters after that path; `counts`: with the number of groups and of rows in each row."""
    where, params = where_sql(req.view, columns)
    outputs = [f"{k.sql()} AS {quote(k.name)}" for k in req.keys] + [f"{a.sql()} AS {quote(a.name)}" for a in req.aggs]
    if counts:
        outputs += ["count(*) OVER ()", "sum(count(*)) OVER ()"]
    n_keys = len(req.keys)
    order = req.sort or tuple((i, False) for i in range(n_keys))
    order_sql = ", ".join(f"{i + 1} {'DESC' if d else 'ASC'} NULLS LAST" for i, d in order)
    return (f"SELECT {', '.join(outputs)} FROM {src}{where} GROUP BY {', '.join(str(i + 1) for i in range(n_keys))} "
            f"ORDER BY {order_sql} LIMIT {int(req.limit)}"), params


def group_by(reader: GridReader, path: Path, columns: Sequence[Column], req: GroupRequest) -> dict[str, Any]:
    """The groups of the matching rows (first `req.limit` of them) with their aggregates, the
    number of groups and of matching rows."""
    sql, params = group_sql(source_sql(path, False), columns, req)

    def work(con: duckdb.DuckDBPyConnection) -> list[tuple]:
        return con.execute(sql, [str(path), *params]).fetchall()

    found = reader.query(path, work)
    groups = int(found[0][-2]) if found else 0
    rows = int(found[0][-1]) if found else 0
    out_cols = [{"name": k.name, "kind": k.column.kind, "type": k.column.type} for k in req.keys]
    out_cols += [{"name": a.name, "kind": "number", "type": "BIGINT" if a.column is None else "DOUBLE"}
                 for a in req.aggs]
    return {"columns": out_cols, "data": [[cell(v) for v in r[:-2]] for r in found], "groups": groups,
            "rows": rows, "limit": req.limit, "by": [k.name for k in req.keys],
            "aggs": [a.name for a in req.aggs], **view_out(req.view)}
