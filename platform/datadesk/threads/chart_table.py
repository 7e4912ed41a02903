"""A Vega-Lite chart as a static export shows it: its title and a small table of its data.

Exports (Markdown, the printable page, the copy for readers, the report page's exports in
threads/report/vega.py) run no script, so an interactive
chart cannot be drawn there. Its spec carries its data inline (tools/charts.py refuses a `url`),
so the export shows the first rows of that data under the chart's title, with a line saying the
chart itself is interactive in DataDesk. Bounded: at most `MAX_ROWS` rows, `MAX_COLS` columns,
each cell cut at `MAX_CELL` characters, from a spec file of at most `MAX_SPEC_BYTES`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_ROWS = 20
MAX_COLS = 8
MAX_CELL = 60
MAX_SPEC_BYTES = 2 << 20
NOTE = "Interactive chart: open the thread in DataDesk to explore it."


@dataclass
class ChartTable:
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    total_rows: int = 0

    def markdown(self) -> str:
        """`**title**`, the note, and the data as a Markdown table (when it has any)."""
        out = [f"**{_md_cell(self.title)}**", "", f"_{NOTE}_"]
        if self.columns:
            out += ["", "| " + " | ".join(_md_cell(c) for c in self.columns) + " |",
                    "|" + "---|" * len(self.columns)]
            out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in self.rows]
            if self.total_rows > len(self.rows):
                out += ["", f"_first {len(self.rows)} of {self.total_rows:,} data rows_"]
        return "\n".join(out)


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _cell(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = "" if value is None else str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def inline_rows(spec: dict[str, Any]) -> list[Any]:
    """The chart's inline rows: its own `data.values`, else a view's, else the first dataset."""
    for node in (spec, *(v for k in ("layer", "concat", "hconcat", "vconcat") for v in spec.get(k) or []
                         if isinstance(v, dict))):
        data = node.get("data") if isinstance(node, dict) else None
        if isinstance(data, dict) and isinstance(data.get("values"), list):
            return data["values"]
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            named = (spec.get("datasets") or {}).get(data["name"])
            if isinstance(named, list):
                return named
    for rows in (spec.get("datasets") or {}).values() if isinstance(spec.get("datasets"), dict) else ():
        if isinstance(rows, list):
            return rows
    return []


def chart_table(path: Path | None, title: str | None) -> ChartTable:
    """The table of the chart saved at `path` (a `.vljson` spec); only the title when the file is
    gone, too large or not a spec."""
    table = ChartTable(title=title or "Chart")
    try:
        if path is None or path.stat().st_size > MAX_SPEC_BYTES:
            return table
        spec = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return table
    rows = [r for r in inline_rows(spec) if isinstance(r, dict)] if isinstance(spec, dict) else []
    if not rows:
        return table
    columns: list[str] = []
    for row in rows[:MAX_ROWS]:
        for key in row:
            if key not in columns and len(columns) < MAX_COLS:
                columns.append(str(key))
    table.columns = columns
    table.rows = [[_cell(r.get(c)) for c in columns] for r in rows[:MAX_ROWS]]
    table.total_rows = len(rows)
    return table
