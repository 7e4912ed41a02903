""""Chart this view" (issue 32): the Python code of a chart step made from the grid's view.

The code reads the artifact's file in the kernel (its sandbox path, e.g. /data/<id>.parquet)
with DuckDB and the same SQL the grid ran (offload/grid/view.py `where_sql`, explore.py
`group_sql`), its filter values as a parameter list written with `repr` (never pasted into
the SQL), and draws it with matplotlib:

- a group-by: its first aggregate per group, a line over a date key, else bars (at most
  CHART_GROUPS groups);
- no group-by: a histogram of the chosen column (a number or a date; the first number column
  when none is chosen), or the counts of its most frequent values (text).

The code starts with a comment naming the artifact, the question and the view, so the model
reading the step next turn knows what the chart shows. It is run as a user step
(POST /api/threads/{tid}/steps), which the model sees as "the user ran this".
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Sequence

from datadesk.offload.grid.explore import GroupRequest, group_sql
from datadesk.offload.grid.pages import source_sql
from datadesk.offload.grid.view import DATES, Column, GridView, quote, where_sql

CHART_GROUPS = 50
CHART_BINS = 30
TOP_BARS = 20


def describe(view: GridView, groups: GroupRequest | None) -> str:
    """The view in words: `kwh between 10 and 20; building_id in B01, B02 · grouped by ...`."""
    parts = []
    for f in view.filters:
        if f.op == "between" and isinstance(f.value, tuple):
            parts.append(f"{f.column} between {f.value[0]} and {f.value[1]}")
        elif f.op == "in" and isinstance(f.value, tuple):
            parts.append(f"{f.column} in {', '.join(f.value)}")
        else:
            parts.append(f"{f.column} {f.op}" + (f" {f.value}" if f.value is not None else ""))
    text = "; ".join(parts) or "all rows"
    if groups is not None:
        text += f" · grouped by {', '.join(k.name for k in groups.keys)}: {', '.join(a.name for a in groups.aggs)}"
    if view.sort:
        text += " · sorted by " + ", ".join(f"{c} {'desc' if d else 'asc'}" for c, d in view.sort)
    return text


def _header(aid: str, question: str | None, view: GridView, groups: GroupRequest | None) -> list[str]:
    lines = [f"# Chart of the grid view of artifact {aid}"]
    if question:
        lines.append(f"# question: {' '.join(question.split())[:200]}")
    lines.append(f"# view: {describe(view, groups)}")
    return lines


def chart_code(aid: str, sandbox_path: str, question: str | None, columns: Sequence[Column], view: GridView,
               groups: GroupRequest | None = None, column: Column | None = None) -> str:
    """The Python code of the chart step (see the module docstring)."""
    src = source_sql(PurePosixPath(sandbox_path), False)  # type: ignore[arg-type]
    out = f"/outputs/view_{aid}.png"
    lines = _header(aid, question, view, groups) + ["import duckdb", "import matplotlib.pyplot as plt", ""]
    if groups is not None:
        req = GroupRequest(groups.keys, groups.aggs, groups.view, groups.sort, min(groups.limit, CHART_GROUPS))
        sql, params = group_sql(src, columns, req, counts=False)
        key, agg = req.keys[0], req.aggs[0]
        over_time = bool(DATES.fullmatch(key.column.type)) and len(req.keys) == 1
        lines += [f"SQL = {sql!r}", f"df = duckdb.execute(SQL, {[sandbox_path, *params]!r}).df()",
                  "fig, ax = plt.subplots(figsize=(8, 4))"]
        names = [k.name for k in req.keys]
        label = f"df[{names[0]!r}]" if len(names) == 1 else \
            "df[" + repr(names) + "].astype(str).agg(' · '.join, axis=1)"
        if over_time:
            lines.append(f"ax.plot(df[{key.name!r}], df[{agg.name!r}], marker='o')")
        else:
            lines.append(f"ax.bar({label}.astype(str), df[{agg.name!r}])")
            lines.append("ax.tick_params(axis='x', labelrotation=45)")
        lines += [f"ax.set_xlabel({' · '.join(names)!r})", f"ax.set_ylabel({agg.name!r})",
                  f"ax.set_title({(agg.name + ' by ' + ', '.join(names))!r})"]
    else:
        col = column or next((c for c in columns if c.kind == "number"), None) or columns[0]
        where, params = where_sql(view, columns)
        sql = f"SELECT {quote(col.name)} FROM {src}{where}"
        lines += [f"SQL = {sql!r}", f"df = duckdb.execute(SQL, {[sandbox_path, *params]!r}).df()",
                  "fig, ax = plt.subplots(figsize=(8, 4))"]
        if col.kind == "number" or DATES.fullmatch(col.type):
            lines += [f"ax.hist(df[{col.name!r}].dropna(), bins={CHART_BINS})", f"ax.set_xlabel({col.name!r})",
                      "ax.set_ylabel('rows')", f"ax.set_title({('Distribution of ' + col.name)!r})"]
        else:
            lines += [f"top = df[{col.name!r}].astype(str).value_counts().head({TOP_BARS})",
                      "ax.barh(top.index[::-1], top.values[::-1])", "ax.set_xlabel('rows')",
                      f"ax.set_title({('Most frequent ' + col.name)!r})"]
    lines += ["fig.tight_layout()", f"fig.savefig({out!r}, dpi=100)", "plt.show()"]
    return "\n".join(lines) + "\n"
