"""What a thread's report shows (threads/report/pins.py stores it): each pinned item resolved against
the thread as it is now, with what the last refresh changed in it.

`report_items(thread, artifacts, reader)` is the one place that does this; the report page
(`GET /api/threads/{tid}/report`), its exports (HTML, Markdown) and a shared read-only view all
read its answer, so they show the same thing:

- a **chart** shows its newest version: the same call re-run by a refresh (identical tool and
  arguments, threads/refresh.py re-runs them verbatim) made a new image at the same place
  (the same index among the call's charts, or the same /outputs file name);
- a **table** reads its current data (a refreshed query keeps its artifact id; a table the
  code wrote to /outputs is followed to its newest version like a chart), the first
  `rows` rows of its grid view (sort and filters), the count of the rows that match;
- a **paragraph** is its Markdown as pinned;
- `mark`: after a refresh, what it changed in the item ("rows 1,460 -> 1,429", "sum of kwh:
  ...", "new version of the chart"), with when; a paragraph written before a refresh that
  changed data is marked as possibly out of date.
"""

from __future__ import annotations

import bisect
from typing import Any

import msgspec

from datadesk.domain.branches import active_records
from datadesk.domain.records import Record
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.offload.grid.pages import GridError, GridLimit, GridReader, parse_request
from datadesk.store.interfaces.artifacts import ArtifactNotFound
from datadesk.store.threads import Thread
from datadesk.threads.refresh import last_report
from datadesk.threads.report.pins import VEGA_FORMAT, PinnedItem, ReportDoc, read_report

TABLE_ROWS = 20  # rows of a pinned table shown on the page and in its exports
LABEL_CHARS = 90  # the question quoted in an item's label


class ItemMark(msgspec.Struct):
    """What the last refresh changed in an item."""

    at: float  # when the refresh finished
    changes: list[str] = []
    changed: bool = True
    stale: bool = False  # a paragraph written before data it talks about changed


class ShownItem(msgspec.Struct, omit_defaults=True):
    id: str
    kind: str
    pinned_at: float
    note: str = ""
    label: str = ""
    seq: int | None = None
    artifact: str | None = None  # what is shown now (a chart's or table's newest version)
    pinned_artifact: str | None = None  # what was pinned, when that is not what is shown
    media_type: str | None = None  # a chart
    format: str | None = None  # a chart: "vega-lite" for an interactive one (drawn by the page)
    title: str | None = None  # a chart's own title
    text: str | None = None  # a paragraph's Markdown
    table: dict[str, Any] | None = None  # {columns, data, rows (matching), total_rows, sort, filters}
    missing: str | None = None  # why the item cannot be shown (expired, removed)
    mark: ItemMark | None = None


class ReportView(msgspec.Struct):
    thread: str
    title: str
    updated: float
    items: list[ShownItem]
    refreshed: dict[str, Any] | None = None  # {at, status, changes} of the last refresh


class _Log:
    """The thread's records as the resolution needs them: by seq, and the active branch's newest
    ok tool record per call (tool name and arguments)."""

    def __init__(self, thread: Thread) -> None:
        records = list(thread)
        self.by_seq = {r.seq: r for r in records}
        calls: dict[str, tuple[str, str]] = {}
        for r in records:
            for c in r.tool_calls or ():
                calls[c.id] = (c.name, c.arguments)
        self.call_of = {r.seq: calls.get(r.tool_call_id or "") for r in records if r.role == "tool"}
        self.questions = [(r.seq, r.content) for r in records
                          if r.role == "user" and r.content and (r.meta or {}).get("kind") != "upload"]
        self.newest: dict[tuple[str, str], Record] = {}
        for r in active_records(records):
            key = self.call_of.get(r.seq)
            if r.role == "tool" and r.status == "ok" and key is not None:
                self.newest[key] = r

    def question_of(self, seq: int | None) -> str | None:
        """The user's question the record `seq` answers (the last one asked before it)."""
        if seq is None:
            return None
        at = bisect.bisect_right(self.questions, (seq, "\uffff")) - 1
        if at < 0:
            return None
        text = " ".join(self.questions[at][1].split())
        return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"

    def newest_of(self, seq: int | None) -> Record | None:
        key = self.call_of.get(seq) if seq is not None else None
        return self.newest.get(key) if key is not None else None


def _current(log: _Log, item: PinnedItem) -> tuple[str, Record | None]:
    """The artifact that shows `item` now, and the newer record it comes from (None: the pinned one)."""
    aid = item.artifact or ""
    rec = log.newest_of(item.seq)
    if rec is None or rec.seq == item.seq:
        return aid, None
    meta = rec.meta or {}
    if item.image is not None:
        pinned = (log.by_seq.get(item.seq or -1) or rec).meta or {}
        listed = "charts" if aid in [str(i) for i in pinned.get("charts") or ()] else "images"  # Vega-Lite
        images = [str(i) for i in meta.get(listed) or ()]
        if item.image < len(images):
            return images[item.image], rec
    if item.file:
        for f in meta.get("artifacts") or ():
            if f.get("file") == item.file and f.get("id"):
                return str(f["id"]), rec
    return aid, None


def _table(reader: GridReader | None, path: Any, item: PinnedItem, rows: int) -> dict[str, Any] | str:
    if reader is None:
        return "tables are not read here"
    params: dict[str, list[str]] = {"sort": list(item.view.sort) if item.view else []}
    if item.view and item.view.filter:
        params["filter"] = [item.view.filter]
    try:
        columns = reader.columns(path)
        view, _, _ = parse_request(params, columns, paging=False)
        page = reader.page(path, columns, view, 0, rows)
    except (GridError, GridLimit) as exc:  # a column the refreshed data no longer has
        return f"the table's view cannot be read now: {exc}"
    return {k: page[k] for k in ("columns", "data", "rows", "sort", "filters")}


def _refresh_marks(report: dict[str, Any] | None) -> tuple[dict[str, list[str]], float | None, bool]:
    """The last refresh's query changes by artifact, when it finished, and whether data changed."""
    if not report or report.get("finished") is None:
        return {}, None, False
    changes = {str(s["artifact"]): list(s.get("summary") or []) for s in report.get("steps") or ()
               if s.get("kind") == "query" and s.get("ok") and s.get("artifact")}
    return changes, float(report["finished"]), bool(report.get("changes"))


def _label(item: PinnedItem, art: Any, question: str | None) -> str:
    """"Chart · energy.png · <the question>", "Table · result of sql_query · <the question>"."""
    what = "Chart" if item.kind == "chart" else "Table view" if item.view else "Table"
    where = item.file or art.name or (f"result of {art.origin.tool}" if art.origin.tool else None)
    return " · ".join(p for p in (what, where, question) if p)


def _resolve(thread: Thread, artifacts: ArtifactStore, reader: GridReader | None, log: _Log,
             item: PinnedItem, refresh: dict[str, Any] | None, rows: int) -> ShownItem:
    shown = ShownItem(id=item.id, kind=item.kind, pinned_at=item.pinned_at, note=item.note, seq=item.seq)
    changes, finished, data_changed = _refresh_marks(refresh)
    if item.kind == "paragraph":
        question = log.question_of(item.seq)
        shown.text = item.text
        shown.label = f"From the answer to “{question}”" if question else f"From the answer #{item.seq}"
        rec = log.by_seq.get(item.seq or -1)
        if finished is not None and data_changed and rec is not None and rec.ts < float(refresh["started"]):
            shown.mark = ItemMark(at=finished, stale=True, changes=[
                "written before this refresh changed the data: its figures may be out of date"])
        return shown
    aid, newer = _current(log, item)
    shown.artifact = aid
    if aid != item.artifact:
        shown.pinned_artifact = item.artifact
    try:
        art = artifacts.load(thread, aid)
    except ArtifactNotFound:
        shown.missing = f"artifact {aid} was removed"
        return shown
    shown.label = _label(item, art, log.question_of(item.seq))
    if not art.available:
        shown.missing = f"artifact {aid} is {art.status}: re-run its query in the chat"
        return shown
    if item.kind == "chart" and art.format == VEGA_FORMAT:
        shown.media_type, shown.format, shown.title = art.media_type, VEGA_FORMAT, art.title
    elif item.kind == "chart":
        shown.media_type = art.media_type if art.media_type.startswith("image/") else "image/png"
    else:
        got = _table(reader, artifacts.data_path(thread, art), item, rows)
        if isinstance(got, str):
            shown.missing = got
        else:
            shown.table = {**got, "total_rows": art.rows}
    if finished is not None and aid in changes:
        shown.mark = ItemMark(at=finished, changes=changes[aid] or ["unchanged"],
                              changed=changes[aid] not in ([], ["unchanged"]))
    elif newer is not None and (newer.meta or {}).get("via") == "refresh":
        what = "chart" if item.kind == "chart" else "table"
        shown.mark = ItemMark(at=finished if finished is not None else newer.ts,
                              changes=[f"new version of the {what}, drawn again on the refreshed data"])
    return shown


def report_items(thread: Thread, artifacts: ArtifactStore, reader: GridReader | None,
                 rows: int = TABLE_ROWS, doc: ReportDoc | None = None) -> ReportView:
    """The report of `thread` as it shows now: its title and items in order (module docstring)."""
    doc = doc if doc is not None else read_report(thread)
    title = doc.title or (thread.meta.title if thread.meta else thread.id)
    refresh = last_report(thread)
    log = _Log(thread) if doc.items else None
    items = [_resolve(thread, artifacts, reader, log, item, refresh, rows) for item in doc.items] if log else []
    refreshed = None
    if refresh and refresh.get("finished") is not None:
        refreshed = {"at": refresh["finished"], "status": refresh.get("status"), "changes": refresh.get("changes", 0)}
    return ReportView(thread=thread.id, title=title, updated=doc.updated, items=items, refreshed=refreshed)
