"""A pinned Vega-Lite chart as the static exports show it (issue 32): the exports carry no script,
so a chart is its title and a small table of its inline data (`chart_table.inline_rows`, the same
rows and bounds as the thread's exports), bounded: at most `MAX_ROWS` rows and `MAX_COLUMNS` columns, each
cell cut to `MAX_CELL_CHARS`. The app's report page draws the chart itself (web/js/charts.js).
"""

from __future__ import annotations

import json
from typing import Any

from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.store.interfaces.artifacts import ArtifactNotFound
from datadesk.store.threads import Thread
from datadesk.threads.chart_table import MAX_CELL as MAX_CELL_CHARS
from datadesk.threads.chart_table import MAX_COLS as MAX_COLUMNS
from datadesk.threads.chart_table import MAX_ROWS, NOTE, inline_rows
from datadesk.tools.charts import CHART_FORMAT, MAX_SPEC_BYTES, chart_title

INTERACTIVE_LINE = NOTE.rstrip(".")


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS - 1] + "…"


def _kind(values: list[Any]) -> str:
    seen = [v for v in values if v is not None]
    if seen and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
        return "number"
    return "string"


def spec_table(spec: dict[str, Any]) -> dict[str, Any]:
    """{title, columns, data, rows} of a spec's inline data (module docstring); `columns` is
    empty when the spec has none."""
    values = inline_rows(spec)
    head = values[:MAX_ROWS]
    names: list[str] = []
    for row in head:
        for key in (row if isinstance(row, dict) else {"value": row}):
            if key not in names and len(names) < MAX_COLUMNS:
                names.append(str(key))
    rows = [[_cell((row if isinstance(row, dict) else {"value": row}).get(n)) for n in names] for row in head]
    columns = [{"name": _cell(n), "kind": _kind([r[i] for r in rows])} for i, n in enumerate(names)]
    return {"title": chart_title(spec) or "", "columns": columns, "data": rows, "rows": len(values)}


def vega_table(thread: Thread, artifacts: ArtifactStore, aid: str) -> dict[str, Any] | None:
    """`spec_table` of the `vega-lite` artifact `aid`, or None when it cannot be read."""
    try:
        art = artifacts.load(thread, aid)
    except ArtifactNotFound:
        return None
    path = artifacts.data_path(thread, art)
    if art.format != CHART_FORMAT or not art.available or not path.is_file() or path.is_symlink():
        return None
    if path.stat().st_size > 2 * MAX_SPEC_BYTES:
        return None
    try:
        spec = json.loads(path.read_bytes())
    except ValueError:
        return None
    if not isinstance(spec, dict):
        return None
    out = spec_table(spec)
    out["title"] = art.title or out["title"]
    return out
