"""A thread for readers: the questions, the answers and the charts, without the plumbing.

The full export (threads/export.py) is a transcript: every tool call with its SQL, code and the
text the model read, including the offload notice ("NOTICE: this is a preview of 10 rows, NOT
the full data…") and sandbox paths (`/data/…`, `/outputs/…`). A page handed to a manager needs
none of that. `reader_turns(doc)` keeps, per question, the answers and the images the turn's
python calls produced (figures and image files written to /outputs; a Vega-Lite chart as its
title and a table of its data, threads/chart_table.py), and scrubs from the
answers what was meant for the model: notice lines, the offload header, and the sandbox folders
of paths (`/outputs/report.md` reads `report.md`). `reader_markdown(doc)` writes them as one
Markdown file; api/controllers/export.py renders the same turns as a printable page.
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field

from datadesk.threads.chart_table import ChartTable
from datadesk.threads.export import Entry, ThreadDocument

# lines meant for the model: the offload notice and header, the preview's row counts, tool-only notes
_MODEL_LINE = re.compile(
    r"^\s*(?:>\s*)?(?:NOTICE:|PARTIAL(?: \(by the source\))?:|\[Result saved as artifact |"
    r"\[The user ran this step themselves|sandbox path: |preview \(first \d)")
_SANDBOX_PATH = re.compile(r"(?<![\w./-])/(?:data|outputs)/(?=[\w.-])")
_IMAGE_FORMATS = ("png", "jpeg", "jpg", "gif", "webp")


@dataclass
class Figure:
    caption: str
    media_type: str
    data: bytes

    @property
    def uri(self) -> str:
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass
class ReaderTurn:
    """One question as a reader sees it."""

    question: str
    asked: float
    answers: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    charts: list[ChartTable] = field(default_factory=list)  # Vega-Lite charts, as a static page shows them

    @property
    def empty(self) -> bool:
        return not self.answers and not self.figures and not self.charts


def for_readers(text: str) -> str:
    """An answer without the lines meant for the model and with sandbox folders taken off paths."""
    kept = [line for line in text.splitlines() if not _MODEL_LINE.match(line)]
    return _SANDBOX_PATH.sub("", "\n".join(kept)).strip()


def _question(e: Entry) -> str:
    meta = e.record.meta or {}
    if meta.get("kind") == "upload":
        return f"Uploaded {meta.get('filename') or 'a file'}"
    return e.record.content or ""


def _figures(doc: ThreadDocument, e: Entry) -> list[Figure]:
    out: list[Figure] = []
    for n, aid in enumerate(doc.images_of(e), 1):
        img = doc.image(aid)
        if img is not None:
            out.append(Figure(f"Chart {n}", img[0], img[1]))
    for f in doc.files_of(e):
        if str(f.get("format")) in _IMAGE_FORMATS and (img := doc.image(str(f["id"]))) is not None:
            out.append(Figure(str(f["file"]).rsplit("/", 1)[-1], img[0], img[1]))
    return out


def reader_turns(doc: ThreadDocument) -> list[ReaderTurn]:
    """The thread's questions with their answers and charts; a failed answer and a call's text are
    left out, and so is a question that got neither an answer nor a chart."""
    turns: list[ReaderTurn] = []
    for e in doc.entries:
        if e.kind == "user":
            turns.append(ReaderTurn(_question(e), e.record.ts))
            continue
        if not turns:  # steps before any question (a user step on an empty thread)
            turns.append(ReaderTurn("", e.record.ts))
        if e.kind == "answer" and e.record.status != "error" and (text := for_readers(e.record.content or "")):
            turns[-1].answers.append(text)
        elif e.kind == "call" and e.status == "ok":
            turns[-1].figures.extend(_figures(doc, e))
            turns[-1].charts.extend(doc.chart(aid) for aid in doc.charts_of(e))
    return [t for t in turns if not t.empty]


def reader_markdown(doc: ThreadDocument) -> str:
    """The thread for readers as one Markdown file (charts embedded as `data:` images)."""
    when = time.strftime("%Y-%m-%d", time.gmtime(doc.exported))
    out = [f"# {doc.title}", "", f"_{when}_", ""]
    for turn in reader_turns(doc):
        if turn.question:
            out += [f"## {turn.question.strip().splitlines()[0][:200]}", ""]
            rest = "\n".join(turn.question.strip().splitlines()[1:]).strip()
            if rest:
                out += [rest, ""]
        for text in turn.answers:
            out += [text, ""]
        for fig in turn.figures:
            out += [f"![{fig.caption}]({fig.uri})", ""]
        for chart in turn.charts:
            out += [chart.markdown(), ""]
    return "\n".join(out).rstrip() + "\n"
