"""A thread's report page (issue 32): the charts, tables and answer paragraphs an analyst pinned,
in their order, with a title and a note per item.

Stored as the thread's `report` document (`report.json` in the thread folder, replaced
atomically under the thread's guard, like the task state):

    {"version": 1, "title": "...", "updated": <ts>,
     "items": [{"id": "pin_...", "kind": "chart" | "table" | "paragraph", "pinned_at": <ts>,
                "pinned_by": "<uid>", "note": "...", "artifact": "<aid>", "seq": <record>,
                "image": <index in the call's images, or in its Vega-Lite charts>, "file": "<the /outputs file>",
                "paragraph": <block index>, "text": "<the paragraph's Markdown>",
                "view": {"sort": ["col:desc"], "filter": "[{...}]"}}]}

A pin names what it shows the way the thread does: a chart or table by its artifact and the
tool record that made it (so a refresh's new version can be found, threads/report/view.py),
a paragraph by the answer's record and its block index, with the block's Markdown kept (a
record never changes, but the copy makes the report readable on its own). A grid view is a
table pin with the grid's sort and filters, checked against the table's columns when pinned.

Errors: `ReportError` (a bad field, named; API 400), `PinNotFound` (API 404).
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any, Iterable, Literal

import msgspec
from markdown_it import MarkdownIt

from datadesk.domain.artifacts import Artifact
from datadesk.domain.ids import new_id
from datadesk.domain.records import Record
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.offload.grid.pages import GridError, GridReader, parse_request
from datadesk.store.interfaces.threads import REPORT
from datadesk.store.threads import Thread

VERSION = 1
MAX_PINS = 50
MAX_NOTE_CHARS = 2_000
MAX_TITLE_CHARS = 200
MAX_TEXT_CHARS = 20_000  # a pinned paragraph's Markdown
CHART_FORMATS = frozenset({"png", "jpeg", "jpg", "gif", "webp"})  # never SVG (it could carry script)
VEGA_FORMAT = "vega-lite"  # an interactive chart (tools/charts.py): a spec, drawn by the page
TABLE_FORMATS = frozenset({"parquet", "csv", "tsv"})  # what the grid reads
Kind = Literal["chart", "table", "paragraph"]


class ReportError(ValueError):
    """A pin, note, title or order the report cannot take; `field` names what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class PinNotFound(LookupError):
    """No pinned item with this id in the thread's report."""


class TableView(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """The grid's view of a table, as `GET /api/artifacts/{aid}/rows` takes it."""

    sort: list[str] = []  # "column:asc" | "column:desc"
    filter: str | None = None  # the grid's JSON list of {column, op, value}


class PinnedItem(msgspec.Struct, omit_defaults=True):
    id: str
    kind: Kind
    pinned_at: float
    pinned_by: str
    note: str = ""
    artifact: str | None = None
    seq: int | None = None
    image: int | None = None
    file: str | None = None
    paragraph: int | None = None
    text: str | None = None
    view: TableView | None = None


class ReportDoc(msgspec.Struct):
    version: int = VERSION
    title: str = ""
    updated: float = 0.0
    items: list[PinnedItem] = []


class PinRequest(msgspec.Struct, forbid_unknown_fields=True):
    """What the analyst pins: a chart or table (`artifact`, a table optionally with the grid's
    `view`), or a paragraph of an answer (`seq` of the answer, `paragraph` its block; without
    `paragraph`, the whole answer)."""

    kind: Kind
    artifact: str | None = None
    seq: int | None = None
    paragraph: int | None = None
    view: TableView | None = None
    note: str = ""


def read_report(thread: Thread) -> ReportDoc:
    """The thread's report document (an empty one when nothing was pinned yet)."""
    raw = thread.read_doc(REPORT)
    return msgspec.json.decode(raw, type=ReportDoc) if raw else ReportDoc()


@lru_cache(maxsize=1)
def _blocks_parser() -> MarkdownIt:
    # the same block rules as the chat's renderer (api/render.py): one top-level block per element
    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])


def answer_blocks(text: str) -> list[str]:
    """The top-level Markdown blocks of an answer (paragraphs, headings, tables, lists, code), as
    the chat shows them: one element each, in order."""
    lines = text.splitlines()
    out: list[str] = []
    for tok in _blocks_parser().parse(text):
        if tok.level == 0 and tok.nesting in (0, 1) and tok.map is not None:
            out.append("\n".join(lines[tok.map[0]:tok.map[1]]).strip("\n"))
    return out


def _check_note(note: str) -> str:
    if len(note) > MAX_NOTE_CHARS:
        raise ReportError("note", f"note: {len(note):,} characters, at most {MAX_NOTE_CHARS:,}")
    return note


def find_origin(records: Iterable[Record], aid: str) -> tuple[int, int | None, str | None] | None:
    """(seq, chart index, /outputs file) of the tool record that made artifact `aid`, or None."""
    for rec in records:
        if rec.role != "tool":
            continue
        meta = rec.meta or {}
        images = [str(i) for i in meta.get("images") or ()]
        charts = [str(i) for i in meta.get("charts") or ()]
        files = {str(f.get("id")): f.get("file") for f in meta.get("artifacts") or ()}
        ref = meta.get("artifact") or {}
        if aid in images:
            return rec.seq, images.index(aid), files.get(aid)
        if aid in charts:  # a Vega-Lite chart: its index among the call's charts
            return rec.seq, charts.index(aid), files.get(aid)
        if aid in files or (isinstance(ref, dict) and ref.get("id") == aid):
            return rec.seq, None, files.get(aid)
    return None


class ThreadReport:
    """The report of one thread: pins, notes, order and title (read, checked, written under the
    thread's guard). `reader` checks a grid view against its table's columns."""

    def __init__(self, thread: Thread, artifacts: ArtifactStore, reader: GridReader | None = None) -> None:
        self.thread = thread
        self.artifacts = artifacts
        self.reader = reader

    def read(self) -> ReportDoc:
        return read_report(self.thread)

    def _change(self, change: Any) -> ReportDoc:
        """Apply `change(doc)` to the stored document under the guard and write it back."""
        def apply(raw: bytes | None) -> Any:
            doc = msgspec.json.decode(raw, type=ReportDoc) if raw else ReportDoc()
            change(doc)
            doc.updated = time.time()
            return msgspec.to_builtins(doc)
        epoch = self.thread.meta.epoch if self.thread.meta else None
        return msgspec.convert(self.thread.update_doc(REPORT, apply, epoch), ReportDoc)

    def pin(self, req: PinRequest, user: str) -> PinnedItem:
        """Add `req` at the end of the report (ReportError naming a bad field)."""
        item = self._item(req, user)

        def add(doc: ReportDoc) -> None:
            if len(doc.items) >= MAX_PINS:
                raise ReportError("items", f"the report holds {MAX_PINS} items already (at most {MAX_PINS}): "
                                           "unpin one first")
            doc.items.append(item)
        self._change(add)
        return item

    def _item(self, req: PinRequest, user: str) -> PinnedItem:
        item = PinnedItem(id=new_id("pin_"), kind=req.kind, pinned_at=time.time(), pinned_by=user,
                          note=_check_note(req.note))
        if req.kind == "paragraph":
            if req.artifact is not None or req.view is not None:
                raise ReportError("artifact", "a paragraph pin takes `seq` (and `paragraph`), not an artifact")
            item.seq, item.paragraph, item.text = self._paragraph(req.seq, req.paragraph)
            return item
        if req.artifact is None:
            raise ReportError("artifact", f"a {req.kind} pin needs `artifact` (the id of the {req.kind})")
        if req.seq is not None or req.paragraph is not None:
            raise ReportError("seq", f"a {req.kind} pin takes `artifact`, not `seq` or `paragraph`")
        art = self.artifacts.load(self.thread, req.artifact)  # ArtifactNotFound: 404
        self._check_kind(req, art)
        origin = find_origin(self.thread, art.id)
        item.artifact = art.id
        if origin is not None:
            item.seq, item.image, item.file = origin
        if req.view is not None:
            item.view = self._view(art, req.view)
        return item

    def _check_kind(self, req: PinRequest, art: Artifact) -> None:
        if not art.available:
            raise ReportError("artifact", f"artifact {art.id} is {art.status}: re-run its query first")
        fmt = art.format.lower()
        if req.kind == "chart" and fmt not in CHART_FORMATS and fmt != VEGA_FORMAT:
            raise ReportError("artifact", f"artifact {art.id} is {art.format}, not a chart image "
                                          f"({', '.join(sorted(CHART_FORMATS))}) or a {VEGA_FORMAT} chart")
        if req.kind == "table" and fmt not in TABLE_FORMATS:
            raise ReportError("artifact", f"artifact {art.id} is {art.format}, not a table "
                                          f"({', '.join(sorted(TABLE_FORMATS))})")
        if req.kind == "chart" and req.view is not None:
            raise ReportError("view", "a chart pin has no grid view")

    def _view(self, art: Artifact, view: TableView) -> TableView | None:
        """The grid view, checked against the table's columns (None: an empty view)."""
        params: dict[str, list[str]] = {"sort": list(view.sort)}
        if view.filter:
            params["filter"] = [view.filter]
        if self.reader is not None:
            columns = self.reader.columns(self.artifacts.data_path(self.thread, art))
            try:
                parse_request(params, columns, paging=False)
            except GridError as exc:
                raise ReportError(f"view.{exc.param}", f"view: {exc.param}: {exc}") from None
        return view if view.sort or view.filter else None

    def _paragraph(self, seq: int | None, paragraph: int | None) -> tuple[int, int | None, str]:
        if seq is None:
            raise ReportError("seq", "a paragraph pin needs `seq` (the answer's record)")
        found = [r for r in self.thread.since(seq, seq) if r.seq == seq]
        if not found or found[0].role != "assistant" or not found[0].content:
            raise ReportError("seq", f"record #{seq} is not an answer of this thread")
        text = found[0].content
        if paragraph is not None:
            blocks = answer_blocks(text)
            if not 0 <= paragraph < len(blocks):
                raise ReportError("paragraph", f"paragraph {paragraph}: the answer #{seq} has {len(blocks)} "
                                               f"(0 to {len(blocks) - 1})")
            text = blocks[paragraph]
        if len(text) > MAX_TEXT_CHARS:
            raise ReportError("paragraph", f"the text to pin is {len(text):,} characters (at most "
                                           f"{MAX_TEXT_CHARS:,}): pin one paragraph of it")
        return seq, paragraph, text

    def _find(self, doc: ReportDoc, pin_id: str) -> int:
        for i, item in enumerate(doc.items):
            if item.id == pin_id:
                return i
        raise PinNotFound(f"no pinned item {pin_id} in this thread's report")

    def note(self, pin_id: str, note: str) -> PinnedItem:
        """Set the analyst's note on item `pin_id` ("" removes it)."""
        _check_note(note)
        out: list[PinnedItem] = []

        def edit(doc: ReportDoc) -> None:
            item = doc.items[self._find(doc, pin_id)]
            item.note = note
            out.append(item)
        self._change(edit)
        return out[0]

    def unpin(self, pin_id: str) -> None:
        self._change(lambda doc: doc.items.pop(self._find(doc, pin_id)))

    def reorder(self, order: list[str]) -> ReportDoc:
        """Put the items in `order` (every pinned id once)."""
        def apply(doc: ReportDoc) -> None:
            have = {i.id: i for i in doc.items}
            unknown = [p for p in order if p not in have]
            if unknown:
                raise ReportError("order", f"order: no pinned item {unknown[0]} in this report")
            if len(set(order)) != len(order):
                raise ReportError("order", "order: an item is named twice")
            missing = [p for p in have if p not in order]
            if missing:
                raise ReportError("order", f"order: give every pinned item once; {', '.join(missing)} "
                                           "missing")
            doc.items = [have[p] for p in order]
        return self._change(apply)

    def retitle(self, title: str) -> ReportDoc:
        title = title.strip()
        if len(title) > MAX_TITLE_CHARS:
            raise ReportError("title", f"title: {len(title):,} characters, at most {MAX_TITLE_CHARS}")

        def apply(doc: ReportDoc) -> None:
            doc.title = title
        return self._change(apply)
