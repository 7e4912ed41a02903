"""A thread as a Jupyter notebook (nbformat 4.5), built as plain JSON (see threads/export.py).

The first code cell makes the notebook rerun outside DataDesk: it maps the thread's artifacts in
`./data` (the sandbox's `/data`), creates `./outputs`, and defines `sql_result`, which re-runs a
query against the DuckDB file named by `DATADESK_WAREHOUSE` when set, and otherwise reads the
result DataDesk saved (the artifact, or the rows of a small inline result). A re-run result is
written over `data/<artifact>`, so the python cells after it read the fresh data, never the
stale saved file: the same numbers as a Refresh in DataDesk (threads/refresh.py).

A refreshed thread holds each analysis step twice in its log: the original call and the
refresh's re-run of it (`via: "refresh"`). The notebook holds each step once (`analysis_entries`):
the original cell, where it was asked, with the outputs of its LATEST run. That is the version
that matches the current artifacts: a refresh writes a query's new data back under the same
artifact id (so `data/<artifact>` in the bundle is the refreshed data), and its python re-runs
read that data; so the refreshed outputs are what re-running the notebook from `data/` gives.
The original's position and source stay because they carry what the refresh call lacks: the
SQL (a refresh records `requery_artifact` with only the artifact id) and the question it
answered. The refresh's summary stays as a markdown cell; the Markdown and HTML exports keep
the whole conversation, refreshes included.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

from datadesk.domain.records import Record
from datadesk.threads.export import (Entry, ThreadDocument, call_source, python_sections, safe_name,
                                     sandbox_paths_to_local)
from datadesk.threads.refresh_plan import PYTHON, REQUERY, VIA, plan_steps
from datadesk.llm.scripted import parse_tool_result

MAX_BUNDLE_BYTES = 2 << 30  # data files in one zip (artifacts are bounded by the quotas anyway)

SETUP = '''# DataDesk export of the thread {title!r} ({tid}).
# ./data holds the thread's artifacts (the sandbox's /data); files the code writes go to ./outputs.
import os
from pathlib import Path

import pandas as pd

DATA = Path("data")
OUTPUTS = Path("outputs")
OUTPUTS.mkdir(exist_ok=True)
ARTIFACTS = {artifacts}
missing = sorted(name for name in ARTIFACTS if not (DATA / name).is_file())
print(f"{{len(ARTIFACTS) - len(missing)}} of {{len(ARTIFACTS)}} artifacts in {{DATA.resolve()}}"
      + (f"; missing: {{missing}}" if missing else ""))
WAREHOUSE = os.environ.get("DATADESK_WAREHOUSE")  # a DuckDB file: the SQL cells re-run against it


def sql_result(sql, artifact=None, inline=None):
    """A query of the thread: re-run on WAREHOUSE when set, else the result DataDesk saved.
    A re-run result replaces data/<artifact>, which the python cells read (as a Refresh in
    DataDesk does); the exported file is kept beside it as data/<artifact>.exported."""
    if WAREHOUSE:
        import duckdb

        with duckdb.connect(WAREHOUSE, read_only=True) as con:
            df = con.sql(sql).df()
        if artifact is not None:
            saved, kept = DATA / artifact, DATA / (artifact + ".exported")
            if saved.is_file() and not kept.exists():
                saved.rename(kept)
            DATA.mkdir(exist_ok=True)
            df.to_parquet(saved, index=False)
        return df
    if artifact is not None:
        return pd.read_parquet(DATA / artifact)
    if inline is not None:
        return pd.DataFrame(inline["rows"], columns=inline["columns"])
    raise FileNotFoundError("this result was not saved: set DATADESK_WAREHOUSE to re-run the query")
'''


class _Cells:
    """Cells with ids and execution counts, in order."""

    def __init__(self) -> None:
        self.cells: list[dict[str, Any]] = []
        self.count = 0

    def _id(self) -> str:
        return f"dd-{len(self.cells) + 1:04d}"

    def markdown(self, text: str) -> None:
        self.cells.append({"cell_type": "markdown", "id": self._id(), "metadata": {}, "source": text})

    def code(self, source: str, outputs: list[dict[str, Any]] | None = None, ran: bool = False) -> None:
        n = None
        if ran:
            self.count += 1
            n = self.count
            for out in outputs or []:
                if out["output_type"] == "execute_result":
                    out["execution_count"] = n
        self.cells.append({"cell_type": "code", "id": self._id(), "metadata": {}, "execution_count": n,
                           "source": source, "outputs": outputs or []})


def _literal(text: str) -> str:
    """`text` as a Python string literal (triple-quoted when it reads well)."""
    if '"""' not in text and "\\" not in text and not text.endswith('"'):
        return '"""' + text + '"""'
    return repr(text)


def _sql_cell(doc: ThreadDocument, e: Entry, n: int, cells: _Cells) -> None:
    sql, _ = call_source(e)
    var = f"q{n}"
    art = doc.result_artifact(e)
    if art is not None:
        rows = f"{art.rows:,} rows" if art.rows is not None else "the result"
        note = f"# {e.name}: {rows}, saved by DataDesk as data/{art.file}"
        call = f"{var} = sql_result({_literal(sql)}, artifact={art.file!r})"
        if not art.available:
            note += " (expired in DataDesk: set DATADESK_WAREHOUSE to re-run it)"
    else:
        inline = parse_tool_result(e.result.content) if e.result is not None else None
        note = f"# {e.name}: {e.status}"
        keep = {"columns": inline["columns"], "rows": inline["rows"]} if inline else None
        call = f"{var} = sql_result({_literal(sql)}" + (f", inline={keep!r})" if keep else ")")  # Python, not JSON: None, True
    cells.code(f"{note}\n{call}\n{var}")


def _python_outputs(doc: ThreadDocument, e: Entry) -> list[dict[str, Any]]:
    parts = python_sections(e.result.content if e.result is not None else "")
    outputs: list[dict[str, Any]] = []
    for name in ("stdout", "stderr"):
        if parts.get(name):
            outputs.append({"output_type": "stream", "name": name, "text": parts[name].rstrip("\n") + "\n"})
    for aid in doc.images_of(e):
        img = doc.image(aid)
        if img is not None:
            outputs.append({"output_type": "display_data", "metadata": {},
                            "data": {img[0]: base64.b64encode(img[1]).decode("ascii"), "text/plain": f"<chart {aid}>"}})
    if parts.get("result"):
        outputs.append({"output_type": "execute_result", "execution_count": None, "metadata": {},
                        "data": {"text/plain": parts["result"]}})
    if "error" in parts:
        ename, _, evalue = parts["error"].partition("\n")[0].partition(": ")
        outputs.append({"output_type": "error", "ename": ename or "Error", "evalue": evalue,
                        "traceback": parts["error"].splitlines()})
    return outputs


def _refresh_turn(e: Entry) -> str | None:
    """The turn id of the refresh that recorded this call (None: not a refresh's step)."""
    if e.kind != "call" or ((e.record.meta or {}).get("via") != VIA and e.meta.get("via") != VIA):
        return None
    return e.record.turn_id or f"#{e.record.seq}"


def analysis_entries(entries: list[Entry]) -> list[Entry]:
    """`entries` with each refresh's steps folded into the steps they re-ran (see the module
    docstring): a refresh's python re-run gives its result to the original call (the latest run
    wins), its `requery_artifact` call goes (the original SQL cell reads the same artifact). A
    refresh's recorded steps are matched, in order, with the plan it ran (`plan_steps` over the
    records before it); a step that does not match is kept as it is (nothing is lost)."""
    records = sorted({r.seq: r for e in entries for r in (e.record, e.result) if r is not None}.values(),
                     key=lambda r: r.seq)
    by_result = {e.result.seq: e for e in entries if e.kind == "call" and e.result is not None}
    runs: dict[str, list[Entry]] = {}
    for e in entries:
        turn = _refresh_turn(e)
        if turn is not None:
            runs.setdefault(turn, []).append(e)
    latest: dict[int, Record] = {}  # id(original entry) -> the result of its newest run
    folded: set[int] = set()
    for steps in runs.values():  # oldest refresh first: a later one wins
        first = min(s.record.seq for s in steps)
        for planned, step in zip(plan_steps(r for r in records if r.seq < first), steps):
            original = by_result.get(planned.seq)
            same = step.call is not None and (step.call.name == REQUERY if planned.kind == "query" else
                                              step.call.name == PYTHON and step.call.arguments == planned.arguments)
            if original is None or not same:
                break  # not the plan this refresh ran (an older log): keep its steps as they are
            if planned.kind == "python" and step.result is not None:
                latest[id(original)] = step.result
            folded.add(id(step))
    return [dataclasses.replace(e, result=latest[id(e)]) if id(e) in latest else e
            for e in entries if id(e) not in folded]


def notebook_for(doc: ThreadDocument) -> dict[str, Any]:
    """The nbformat 4 notebook of a thread (see the module docstring)."""
    cells = _Cells()
    artifacts = {a.file: f"{a.kind} {a.id}" + (f", {a.rows:,} rows" if a.rows is not None else "")
                 for a in doc.artifacts.values() if a.kind != "deliverable" or a.format not in ("png", "jpeg")}
    cells.markdown(f"# {doc.title}\n\nExported from DataDesk (thread `{doc.thread.id}`). Run it from the folder "
                   "it was unzipped into: `data/` holds the thread's artifacts. The SQL cells read the results "
                   "DataDesk saved; set `DATADESK_WAREHOUSE` to a DuckDB file to re-run them against the "
                   "warehouse (their results then replace the files in `data/` that the python cells "
                   "read; the exported ones are kept as `*.exported`). The python cells are as they ran, with `/data` and `/outputs` read as "
                   "`data/` and `outputs/`.")
    cells.code(SETUP.format(title=doc.title, tid=doc.thread.id, artifacts=json.dumps(artifacts, indent=4)))
    queries = 0
    for e in analysis_entries(doc.entries):  # each step once, with its latest run
        if e.kind == "user":
            meta = e.record.meta or {}
            text = (f"Uploaded **{meta.get('filename')}** (`data/` has it as artifact `{meta.get('artifact')}`)"
                    if meta.get("kind") == "upload" else e.record.content)
            cells.markdown("**You:** " + text)
        elif e.kind == "answer":
            cells.markdown(e.record.content or f"_(the answer failed: {(e.record.meta or {}).get('error')})_")
        elif "sql" in e.args:
            queries += 1
            _sql_cell(doc, e, queries, cells)
        elif e.name == "python" and isinstance(e.args.get("code"), str):
            code = sandbox_paths_to_local(e.args["code"])
            cells.code(code, _python_outputs(doc, e), ran=e.result is not None)
        else:
            source, lang = call_source(e)
            cells.markdown(f"_Tool `{e.name}` ({e.status})_" + (f"\n\n```{lang}\n{source}\n```" if source else ""))
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "language_info": {"name": "python"},
                     "datadesk": {"thread": doc.thread.id, "title": doc.title, "exported": doc.exported}},
        "cells": cells.cells,
    }


def write_bundle(doc: ThreadDocument, path: Path | str) -> int:
    """Write the zip (notebook.ipynb, thread.md, data/, README.txt) to `path`; returns the data
    bytes included."""
    included = 0
    folder = safe_name(doc.title)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{folder}/notebook.ipynb", json.dumps(notebook_for(doc), indent=1))
        zf.writestr(f"{folder}/thread.md", doc.to_markdown())
        skipped = []
        for aid, art in sorted(doc.artifacts.items()):
            src = doc.data_file(aid)
            if src is None:
                continue
            size = src.stat().st_size
            if included + size > MAX_BUNDLE_BYTES:
                skipped.append(art.file)
                continue
            zf.write(src, f"{folder}/data/{art.file}")
            included += size
        zf.writestr(f"{folder}/README.txt", _readme(doc, skipped))
    return included


def _readme(doc: ThreadDocument, skipped: list[str]) -> str:
    lines = [f"{doc.title} - exported from DataDesk (thread {doc.thread.id})", "",
             "notebook.ipynb  the analysis: run it with Jupyter from this folder (pandas, pyarrow, matplotlib;",
             "                duckdb to re-run the SQL against a warehouse: set DATADESK_WAREHOUSE to its file)",
             "thread.md       the whole conversation", "data/           the thread's artifacts (the sandbox's /data)",
             "outputs/        created by the notebook for the files its code writes (the sandbox's /outputs)"]
    if skipped:
        lines += ["", f"Not included (over {MAX_BUNDLE_BYTES >> 20} MB in all): " + ", ".join(skipped)]
    return "\n".join(lines) + "\n"
