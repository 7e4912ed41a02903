"""What a grid request asks to see: its columns (from the file's schema), sort keys and filters,
parsed from query parameters and compiled to parameterised SQL.

Nothing the client sends becomes SQL text. Columns are checked against the file's own schema
and quoted, operators come from a fixed table, values travel as bound parameters cast to the
column's type (itself checked against a list of scalar types). A value is checked against its
column's kind before any query runs (a number for a number column, an ISO date or timestamp
for a date column), so a bad one is a GridError naming the filter by its position, column and
operator: `filter 2 (kwh between): 'ten' is not a number`.

Filter operators:

- `contains` (text match, any column, case-insensitive), `is null`, `not null`;
- `=`, `!=`, `<`, `<=`, `>`, `>=` with one value;
- `between` with `[low, high]` (both included);
- `in` with a list of 1-MAX_IN values (matched exactly).

On a timestamp column a date-only value (`2024-01-31`) of a comparison or a range stands for
that whole day: `= 2024-01-31` is any time that day, `<= 2024-01-31` and `between 2024-01-01
and 2024-01-31` take in the 31st until midnight, `> 2024-01-31` starts on February 1st.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import msgspec

MAX_SORT = 3
MAX_FILTERS = 10
MAX_VALUE_CHARS = 1_000
MAX_IN = 500
OPS = {"contains": "contains", "=": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">=",
       "between": "between", "in": "in", "is null": "is null", "not null": "not null",
       "eq": "=", "ne": "!=", "<>": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
       "null": "is null", "notnull": "not null"}
OP_NAMES = "contains, =, !=, <, <=, >, >=, between, in, is null, not null"
COMPARE = {"=", "!=", "<", "<=", ">", ">="}
# scalar types a value may be cast to (the type string comes from the file's schema)
SCALAR = re.compile(r"(BOOLEAN|TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|UTINYINT|USMALLINT|UINTEGER|UBIGINT"
                    r"|UHUGEINT|FLOAT|DOUBLE|DECIMAL\(\d{1,2},\d{1,2}\)|VARCHAR|DATE|TIME|TIMESTAMP"
                    r"|TIMESTAMP WITH TIME ZONE|TIMESTAMP_S|TIMESTAMP_MS|TIMESTAMP_NS|INTERVAL|UUID)")
NUMERIC = re.compile(r"(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|U\w*INT|FLOAT|DOUBLE|DECIMAL.*)")
INTEGER = re.compile(r"(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|U\w*INT)")
TIME = re.compile(r"(DATE|TIME.*|INTERVAL)")
DATES = re.compile(r"(DATE|TIMESTAMP.*)")  # the time kinds a filter value is checked for
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


class GridError(ValueError):
    """A bad request parameter; `param` names it (the API answers 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Column:
    name: str
    type: str

    @property
    def kind(self) -> str:
        if NUMERIC.fullmatch(self.type):
            return "number"
        if self.type == "BOOLEAN":
            return "bool"
        if TIME.fullmatch(self.type):
            return "time"
        return "text" if self.type == "VARCHAR" else "other"


@dataclass(frozen=True)
class Filter:
    column: str
    op: str  # a canonical op: a value of OPS
    value: str | tuple[str, ...] | None = None  # a tuple for between (2) and in (1-MAX_IN)


@dataclass(frozen=True)
class GridView:
    """What the user looks at: sort keys (column, descending) and filters (all must hold)."""

    sort: tuple[tuple[str, bool], ...] = ()
    filters: tuple[Filter, ...] = ()


def quote(name: str) -> str:
    """A column name as a DuckDB identifier (only ever a name read from the file's schema)."""
    return '"' + name.replace('"', '""') + '"'


def column_of(columns: Mapping[str, Column], name: object, param: str) -> Column:
    """The column named `name` (GridError naming `param` when the table has none)."""
    if not isinstance(name, str) or name not in columns:
        shown = name[:80] if isinstance(name, str) else name
        raise GridError(param, f"no column {shown!r} in this table")
    return columns[name]


def parse_sorts(raw: list[str], columns: Mapping[str, Column]) -> tuple[tuple[str, bool], ...]:
    """`sort=<column>:asc|desc` (the suffix may be left out: ascending), up to MAX_SORT times."""
    if len(raw) > MAX_SORT:
        raise GridError("sort", f"at most {MAX_SORT} sort keys")
    out: list[tuple[str, bool]] = []
    for item in raw:
        name, desc = item, False
        head, sep, tail = item.rpartition(":")
        if sep and tail.lower() in ("asc", "desc"):
            name, desc = head, tail.lower() == "desc"
        col = column_of(columns, name, "sort")
        if any(c == col.name for c, _ in out):
            raise GridError("sort", f"column {col.name!r} is named twice")
        out.append((col.name, desc))
    return tuple(out)


def _text(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise GridError("filter", f"{where}: a value is needed (text or a number)")
    text = str(value)
    if len(text) > MAX_VALUE_CHARS:
        raise GridError("filter", f"{where}: the value is longer than {MAX_VALUE_CHARS} chars")
    return text


def check_value(col: Column, text: str, where: str) -> None:
    """GridError naming `where` when `text` cannot be a value of `col` (numbers and dates; other
    scalar types are left to DuckDB's cast, whose error also names the filter parameter)."""
    try:
        if INTEGER.fullmatch(col.type):
            int(text.strip())
        elif NUMERIC.fullmatch(col.type):
            float(text)
        elif col.type == "DATE":
            dt.date.fromisoformat(text.strip())
        elif DATES.fullmatch(col.type):
            dt.datetime.fromisoformat(text.strip())
        else:
            return
    except ValueError:
        want = ("a whole number" if INTEGER.fullmatch(col.type) else "a number" if NUMERIC.fullmatch(col.type)
                else "a date (YYYY-MM-DD)" if col.type == "DATE" else "a date or timestamp (YYYY-MM-DD[ HH:MM[:SS]])")
        raise GridError("filter", f"{where}: {text[:40]!r} is not {want}") from None


def _values(col: Column, op: str, value: object, where: str) -> str | tuple[str, ...]:
    if op == "between":
        if not isinstance(value, list) or len(value) != 2:
            raise GridError("filter", f"{where}: give the range as [low, high]")
        out: tuple[str, ...] = tuple(_text(v, where) for v in value)
    elif op == "in":
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_IN:
            raise GridError("filter", f"{where}: give a list of 1-{MAX_IN} values")
        out = tuple(_text(v, where) for v in value)
    else:
        out = (_text(value, where),)
    if (op != "contains") and not SCALAR.fullmatch(col.type):
        raise GridError("filter", f"{where}: column {col.name!r} is {col.type[:40]}: only contains and "
                                  "is null apply")
    if op != "contains":
        for text in out:
            check_value(col, text, where)
    return out if op in ("between", "in") else out[0]


def parse_filters(raw: list[str], columns: Mapping[str, Column]) -> tuple[Filter, ...]:
    """`filter=[{"column": ..., "op": ..., "value": ...}, ...]` (JSON; see the module docstring)."""
    if not raw or raw == [""]:
        return ()
    if len(raw) > 1:
        raise GridError("filter", "give one JSON list of filters")
    try:
        items = msgspec.json.decode(raw[0].encode())
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deep
        raise GridError("filter", 'not valid JSON: send [{"column": "...", "op": "=", "value": "..."}]') from None
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or len(items) > MAX_FILTERS:
        raise GridError("filter", f"a JSON list of at most {MAX_FILTERS} filters")
    out: list[Filter] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"column", "op", "value"}:
            raise GridError("filter", f"filter {i + 1}: an object with column, op and value")
        col = column_of(columns, item.get("column"), "filter")
        op = OPS.get(str(item.get("op", "")).strip().lower())
        if op is None:
            raise GridError("filter", f"filter {i + 1} ({col.name}): unknown op {str(item.get('op'))[:20]!r} "
                                      f"({OP_NAMES})")
        if op in ("is null", "not null"):
            out.append(Filter(col.name, op))
            continue
        out.append(Filter(col.name, op, _values(col, op, item.get("value"), f"filter {i + 1} ({col.name} {op})")))
    return tuple(out)


def _whole_day(col_type: str, value: str) -> bool:
    """Whether `value` is a date-only value on a timestamp column (it stands for that day)."""
    return col_type.startswith("TIMESTAMP") and bool(_DAY.fullmatch(value.strip()))


_NEXT_DAY = "CAST(? AS DATE) + INTERVAL 1 DAY"
# a comparison with a whole day: the SQL over the column `{q}`, then how many times the day is bound
_DAY_SQL = {"=": ("({q} >= CAST(? AS DATE) AND {q} < " + _NEXT_DAY + ")", 2),
            "!=": ("({q} < CAST(? AS DATE) OR {q} >= " + _NEXT_DAY + ")", 2),
            "<=": ("{q} < " + _NEXT_DAY, 1), ">": ("{q} >= " + _NEXT_DAY, 1)}


def where_sql(view: GridView, columns: Sequence[Column]) -> tuple[str, list[Any]]:
    """The WHERE clause of the view's filters and its parameters (values are never SQL text)."""
    types = {c.name: c.type for c in columns}
    parts: list[str] = []
    params: list[Any] = []
    for f in view.filters:
        q, t = quote(f.column), types[f.column]  # t: checked against SCALAR when parsed
        if f.op == "is null":
            parts.append(f"{q} IS NULL")
        elif f.op == "not null":
            parts.append(f"{q} IS NOT NULL")
        elif f.op == "contains":
            parts.append(f"contains(lower(CAST({q} AS VARCHAR)), lower(?))")
            params.append(f.value)
        elif f.op == "between":
            low, high = f.value  # type: ignore[misc]
            upper = f"{q} < {_NEXT_DAY}" if _whole_day(t, high) else f"{q} <= CAST(? AS {t})"
            parts.append(f"({q} >= CAST(? AS {t}) AND {upper})")
            params += [low, high]
        elif f.op == "in":
            parts.append(f"{q} IN ({', '.join(f'CAST(? AS {t})' for _ in f.value or ())})")
            params += list(f.value or ())
        elif f.op in _DAY_SQL and _whole_day(t, str(f.value)):
            sql, times = _DAY_SQL[f.op]
            parts.append(sql.format(q=q))
            params += [f.value] * times
        else:
            parts.append(f"{q} {f.op} CAST(? AS {t})")
            params.append(f.value)
    return (" WHERE " + " AND ".join(parts) if parts else ""), params


def view_out(view: GridView) -> dict[str, Any]:
    """The view as the API echoes it."""
    return {"sort": [{"column": c, "desc": d} for c, d in view.sort],
            "filters": [{"column": f.column, "op": f.op,
                         "value": list(f.value) if isinstance(f.value, tuple) else f.value} for f in view.filters]}
