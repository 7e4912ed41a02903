"""Export a thread: Markdown, a Jupyter notebook, and a zip of the notebook with the thread's data.

`ThreadDocument.read` turns the log into entries in order (the user's messages, the answers,
and each tool call with its result), with the thread's artifacts at hand. From it:

- `to_markdown()`: every turn, the SQL and code of each call, its result head, charts
  embedded as `data:` images, so one file holds the whole conversation;
- `notebook_for(doc)` (threads/notebook.py): nbformat 4 (the tests check it with
  `nbformat.validate`). A first code cell maps the thread's artifacts (`./data`, the
  sandbox's `/data`) and defines `sql_result(sql, artifact=...)`: it re-runs a query against
  the DuckDB file named by `DATADESK_WAREHOUSE`, else reads the result DataDesk saved. Each
  SQL call becomes a cell that reproduces its result; each python call a cell with its code
  (`/data` and `/outputs` read as `./data` and `./outputs`) and the outputs it had. Each
  step is one cell: a refresh's re-runs are folded into the steps they re-ran, which show
  their latest run (`analysis_entries`: why, in threads/notebook.py);
- `write_bundle(doc, path)` (threads/notebook.py): a zip of `notebook.ipynb`, `thread.md`,
  `data/` (every available artifact file, as the kernel saw `/data`) and `README.txt`, so the
  analysis reruns outside DataDesk.

The HTML page is rendered in api/controllers/export.py (it needs the API's sanitizing Markdown renderer).
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import msgspec

from datadesk.domain.artifacts import Artifact
from datadesk.domain.branches import active_records
from datadesk.domain.records import Record, ToolCall
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.store.threads import Thread
from datadesk.threads.chart_table import ChartTable, chart_table

MAX_RESULT_CHARS = 4_000  # a tool result's head in Markdown and HTML (the notebook has the data)
MAX_IMAGE_BYTES = 8 << 20  # an image larger than this is named, not embedded
_SECTION = re.compile(r"^(stdout|stderr|result)(?: \([^\n]*\))?:$")
_PATHS = re.compile(r"""(["'])/(data|outputs)(?=[/"'])""")


@dataclass
class Entry:
    """One item of a thread in order: a user message, an answer, or a tool call and its result."""

    kind: str  # "user" | "answer" | "call"
    record: Record
    call: ToolCall | None = None
    result: Record | None = None

    @property
    def args(self) -> dict[str, Any]:
        try:
            value = msgspec.json.decode((self.call.arguments if self.call else "") or "{}")
        except (msgspec.DecodeError, RecursionError):  # model-written: may be nested too deep
            return {}
        return value if isinstance(value, dict) else {}

    @property
    def meta(self) -> dict[str, Any]:
        return (self.result.meta if self.result is not None else None) or {}

    @property
    def name(self) -> str:
        return (self.call.name if self.call else None) or (self.result.name if self.result else None) or "tool"

    @property
    def status(self) -> str:
        return self.result.status if self.result is not None else "no result recorded"


@dataclass
class ThreadDocument:
    """A thread, read for export: its title, entries and artifacts."""

    thread: Thread
    entries: list[Entry]
    artifacts: dict[str, Artifact]
    store: ArtifactStore
    exported: float = field(default_factory=time.time)

    @classmethod
    def read(cls, thread: Thread, store: ArtifactStore, records: Iterable[Record] | None = None) -> "ThreadDocument":
        entries: list[Entry] = []
        calls: dict[str, Entry] = {}
        # the active branch: an edited question's earlier branch is not exported (domain/branches.py)
        for rec in (records if records is not None else active_records(list(thread.log))):
            if rec.role == "user":
                entries.append(Entry("user", rec))
            elif rec.role == "assistant":
                if rec.content or rec.status == "error":
                    entries.append(Entry("answer", rec))
                for call in rec.tool_calls or ():
                    calls[call.id] = Entry("call", rec, call=call)
                    entries.append(calls[call.id])
            elif rec.role == "tool":
                entry = calls.get(rec.tool_call_id or "")
                if entry is None or entry.result is not None:
                    entry = Entry("call", rec)
                    entries.append(entry)
                entry.result = rec
        arts = {a.id: a for a in store.list(thread)}
        return cls(thread=thread, entries=entries, artifacts=arts, store=store)

    # -- what the entries point at ------------------------------------------------------
    @property
    def title(self) -> str:
        return self.thread.meta.title if self.thread.meta is not None else self.thread.id

    def data_file(self, aid: str) -> Path | None:
        """The data file of an available artifact of this thread (never a link), or None."""
        art = self.artifacts.get(aid)
        if art is None or not art.available:
            return None
        path = self.store.data_path(self.thread, art)
        return path if path.is_file() and not path.is_symlink() else None

    def image(self, aid: str) -> tuple[str, bytes] | None:
        """(media type, bytes) of an image artifact small enough to embed."""
        art = self.artifacts.get(aid)
        path = self.data_file(aid)
        if art is None or path is None or path.stat().st_size > MAX_IMAGE_BYTES:
            return None
        return (art.media_type if art.media_type.startswith("image/") else "image/png"), path.read_bytes()

    def images_of(self, entry: Entry) -> list[str]:
        return [str(a) for a in entry.meta.get("images") or []]

    def result_artifact(self, entry: Entry) -> Artifact | None:
        ref = entry.meta.get("artifact")
        return self.artifacts.get(ref["id"]) if isinstance(ref, dict) and ref.get("id") else None

    def charts_of(self, entry: Entry) -> list[str]:
        """The Vega-Lite charts a python call displayed, in order."""
        return [str(a) for a in entry.meta.get("charts") or []]

    def chart(self, aid: str) -> ChartTable:
        """A Vega-Lite chart as a static export shows it (title and a small table of its data)."""
        art = self.artifacts.get(aid)
        return chart_table(self.data_file(aid), art.title if art is not None else None)

    def files_of(self, entry: Entry) -> list[dict[str, Any]]:
        """The files a python call wrote (reports, CSVs), not its charts, their dark-theme
        variants or its Vega-Lite charts."""
        shown = {*self.images_of(entry), *self.charts_of(entry), *(entry.meta.get("dark_images") or {}).values()}
        return [f for f in entry.meta.get("artifacts") or [] if f.get("id") not in shown and f.get("file")]

    # -- Markdown ------------------------------------------------------------------------------
    def to_markdown(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.exported))
        out = [f"# {self.title}", "", f"_Exported from DataDesk on {when} · thread `{self.thread.id}` · "
               f"{sum(1 for e in self.entries if e.kind == 'user')} questions_", ""]
        for e in self.entries:
            out += self._md_entry(e)
        return "\n".join(out).rstrip() + "\n"

    def _md_entry(self, e: Entry) -> list[str]:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.record.ts))
        if e.kind == "user":
            body = e.record.content
            if (e.record.meta or {}).get("kind") == "upload":
                body = f"Uploaded **{e.record.meta.get('filename')}** (artifact `{e.record.meta.get('artifact')}`)"
            return [f"## You · {stamp}", "", body, ""]
        if e.kind == "answer":
            lines = [f"**Assistant** · {stamp}", "", e.record.content or ""]
            if e.record.status == "error":
                lines.append(f"\n> error: {(e.record.meta or {}).get('error') or 'the model failed'}")
            return lines + [""]
        return self._md_call(e)

    def _md_call(self, e: Entry) -> list[str]:
        code, lang = call_source(e)
        head = f"**Tool `{e.name}`** · {e.status}"
        art = self.result_artifact(e)
        if art is not None:
            head += f" · {art.rows:,} rows saved as `data/{art.file}`" if art.rows is not None else f" · `data/{art.file}`"
        lines = [head, ""]
        if code:
            lines += [f"```{lang}", code.rstrip(), "```", ""]
        if e.result is not None and e.result.content:
            text = e.result.content
            cut = f"\n… ({len(text) - MAX_RESULT_CHARS:,} more chars)" if len(text) > MAX_RESULT_CHARS else ""
            lines += ["<details><summary>result</summary>", "", "```text", text[:MAX_RESULT_CHARS] + cut, "```", "",
                      "</details>", ""]
        for aid in self.images_of(e):
            img = self.image(aid)
            lines += [f"![chart {aid}](data:{img[0]};base64,{base64.b64encode(img[1]).decode()})" if img
                      else f"_(chart {aid} is no longer available)_", ""]
        for aid in self.charts_of(e):
            lines += [self.chart(aid).markdown(), ""]
        for f in self.files_of(e):
            img = self.image(str(f["id"])) if str(f.get("format")) in ("png", "jpeg", "gif", "webp") else None
            lines += [f"![{f['file']}](data:{img[0]};base64,{base64.b64encode(img[1]).decode()})" if img
                      else f"File: `{f['file']}` (artifact `{f['id']}`)", ""]
        return lines


def call_source(e: Entry) -> tuple[str, str]:
    """(the SQL or code of a call, its language) — the arguments as JSON otherwise."""
    args = e.args
    if isinstance(args.get("sql"), str):
        return args["sql"], "sql"
    if isinstance(args.get("code"), str):
        return args["code"], "python"
    if isinstance(args.get("query"), str):
        return args["query"], "sql"
    return (json.dumps(args, indent=2, ensure_ascii=False) if args else ""), "json"


def sandbox_paths_to_local(code: str) -> str:
    """`"/data/..."` and `"/outputs/..."` in code become `"data/..."` and `"outputs/..."`."""
    return _PATHS.sub(lambda m: f"{m.group(1)}{m.group(2)}", code)


def python_sections(content: str) -> dict[str, str]:
    """The stdout, stderr, result and error parts of a python tool result (as the model read it)."""
    parts: dict[str, list[str]] = {}
    current: str | None = None
    for line in content.splitlines():
        m = _SECTION.match(line)
        if m:
            current = m.group(1)
            parts[current] = []
        elif line.startswith("error: "):
            current = "error"
            parts["error"] = [line[len("error: "):]]
        elif current is not None and current != "error" and line.startswith(("image: artifact ", "file: /outputs/")):
            current = None  # the references after the output
        elif current is not None:
            parts[current].append(line)
    return {k: "\n".join(v) for k, v in parts.items()}


def safe_name(title: str) -> str:
    """A file name from a title: letters, digits, '-' and '_' (`thread` when nothing is left)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", title).strip("_")[:60]
    return name or "thread"
