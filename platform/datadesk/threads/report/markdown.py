"""A thread's report as one Markdown file (`GET /api/threads/{tid}/report?format=md`): the title,
each pinned item in order with the analyst's note, charts embedded as `data:` images (a Vega-Lite
chart as its title and a table of its data, threads/report/vega.py), tables as Markdown tables
(numbers right-aligned), the refresh marks. The HTML export is rendered in
api/report/page.py (it needs the API's sanitizing Markdown renderer); both read
`report_items` (threads/report/view.py) and `item_image` below.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.store.interfaces.artifacts import ArtifactNotFound
from datadesk.store.threads import Thread
from datadesk.threads.report.pins import VEGA_FORMAT
from datadesk.threads.report.vega import INTERACTIVE_LINE, vega_table
from datadesk.threads.report.view import ItemMark, ReportView, ShownItem

MAX_IMAGE_BYTES = 8 << 20  # a larger chart is named, not embedded
MAX_EMBEDDED_BYTES = 64 << 20  # all the charts of one export together; past it, the rest are named
NUMERIC_KINDS = frozenset({"number", "integer", "float", "decimal"})


def stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + " UTC"


def item_image(thread: Thread, artifacts: ArtifactStore, aid: str,
               budget: list[int] | None = None) -> tuple[str, bytes] | None:
    """(media type, bytes) of a chart small enough to embed (and within what is left of the
    export's `budget`, which it spends), or None."""
    try:
        art = artifacts.load(thread, aid)
    except ArtifactNotFound:
        return None
    path = artifacts.data_path(thread, art)
    if not art.available or not path.is_file() or path.is_symlink():
        return None
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES or (budget is not None and size > budget[0]):
        return None
    if budget is not None:
        budget[0] -= size
    media = art.media_type if art.media_type.startswith("image/") and "svg" not in art.media_type else "image/png"
    return media, path.read_bytes()


def mark_text(mark: ItemMark) -> str:
    """The refresh mark in words: "updated by refresh at 2026-01-05 07:30 UTC: rows 1,460 -> 1,429"."""
    head = ("written before the refresh at " if mark.stale else
            "updated by refresh at " if mark.changed else "refreshed at ") + stamp(mark.at)
    lines = [c for c in mark.changes if not mark.stale]
    return head + (": " + "; ".join(lines) if lines and mark.changed else " (unchanged)" if not mark.changed else "")


def cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.6g}" if abs(value) < 1e15 else str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def is_numeric(column: dict[str, Any]) -> bool:
    return str(column.get("kind")) in NUMERIC_KINDS


def _filter_text(f: dict[str, Any]) -> str:
    value = f.get("value")
    return f"{f['column']} {f['op']}" + ("" if value is None else f" {value}")


def table_caption(table: dict[str, Any]) -> str:
    shown, matching, total = len(table["data"]), table["rows"], table.get("total_rows")
    parts = [f"{shown:,} of {matching:,} rows" if shown < matching else f"{matching:,} rows"]
    if table.get("filters"):
        parts.append("filtered: " + ", ".join(_filter_text(f) for f in table["filters"]))
        if total is not None:
            parts.append(f"of {total:,} in all")
    if table.get("sort"):
        parts.append("sorted by " + ", ".join(f"{s['column']} {'desc' if s['desc'] else 'asc'}" for s in table["sort"]))
    return " · ".join(parts)


def _md_cell(value: Any) -> str:
    return cell_text(value).replace("|", "\\|").replace("\n", " ")


def table_markdown(table: dict[str, Any]) -> str:
    cols = table["columns"]
    head = "| " + " | ".join(_md_cell(c["name"]) for c in cols) + " |"
    rule = "| " + " | ".join("---:" if is_numeric(c) else "---" for c in cols) + " |"
    body = ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in table["data"]]
    return "\n".join([head, rule, *body]) + f"\n\n_{table_caption(table)}_"


def _vega_markdown(thread: Thread, artifacts: ArtifactStore, aid: str) -> list[str]:
    """A Vega-Lite chart without script: its title, its inline data's first rows, the way back."""
    got = vega_table(thread, artifacts, aid)
    if got is None:
        return [f"_chart {aid} cannot be read: open it in DataDesk_"]
    out = [f"**{_md_cell(got['title'])}**"] if got["title"] else []
    if got["columns"]:
        out.append(table_markdown(got))
    return [*out, f"_{INTERACTIVE_LINE}_"]


def _item_markdown(thread: Thread, artifacts: ArtifactStore, n: int, item: ShownItem,
                   budget: list[int]) -> list[str]:
    out = [f"## {n}. {item.label or item.kind}"]
    if item.mark is not None:
        out.append(f"> {mark_text(item.mark)}")
    if item.missing:
        out.append(f"_{item.missing}_")
    elif item.kind == "paragraph":
        out.append(item.text or "")
    elif item.kind == "chart" and item.artifact and item.format == VEGA_FORMAT:
        out.extend(_vega_markdown(thread, artifacts, item.artifact))
    elif item.kind == "chart" and item.artifact:
        img = item_image(thread, artifacts, item.artifact, budget)
        out.append(f"![{item.label}](data:{img[0]};base64,{base64.b64encode(img[1]).decode('ascii')})"
                   if img else f"_chart {item.artifact} is too large to embed: open it in DataDesk_")
    elif item.table is not None:
        out.append(table_markdown(item.table))
    if item.note:
        out.append("**Note:** " + item.note)
    return out


def report_markdown(view: ReportView, thread: Thread, artifacts: ArtifactStore) -> str:
    """The report as Markdown (module docstring)."""
    out = [f"# {view.title}", f"_Report exported from DataDesk on {stamp(time.time())} · thread {view.thread}"
           + (f" · last refreshed {stamp(view.refreshed['at'])}" if view.refreshed else "") + "_"]
    if not view.items:
        out.append("Nothing is pinned to this report yet.")
    budget = [MAX_EMBEDDED_BYTES]
    for n, item in enumerate(view.items, 1):
        out.extend(_item_markdown(thread, artifacts, n, item, budget))
    return "\n\n".join(out) + "\n"
