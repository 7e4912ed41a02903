"""The notebook of a refreshed thread (threads/notebook.py `analysis_entries`): each analysis step
is one cell, where it was first asked, with the outputs of its latest run (a refresh's re-run);
the refresh's `requery_artifact` calls are not cells of their own. Real thread log, real
artifact store; the records are the ones the turn loop and threads/refresh.py write."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import nbformat

from datadesk.domain.records import Record, ToolCall
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.store.layout import Layout
from datadesk.store.threads import ThreadStore
from datadesk.threads.export import ThreadDocument
from datadesk.threads.notebook import analysis_entries, notebook_for

SQL = json.dumps({"sql": "SELECT building_id, kwh FROM readings"})
CODE = json.dumps({"code": "import pandas as pd\ndf = pd.read_parquet('/data/a1.parquet')\nprint('rows:', len(df))"})


def _add(thread, role: str, turn: str, **fields) -> Record:
    return thread.append(lambda seq: Record(seq=seq, role=role, ts=time.time(), turn_id=turn, **fields))


def _refresh(thread, turn: str, rows: int) -> None:
    """What threads/refresh.py records: a requery of the artifact, the python again, the summary."""
    via = {"via": "refresh"}
    _add(thread, "assistant", turn, content="", meta=via,
         tool_calls=[ToolCall(f"{turn}_q", "requery_artifact", json.dumps({"artifact_id": "a1"}))])
    _add(thread, "tool", turn, tool_call_id=f"{turn}_q", name="requery_artifact", content="{}",
         meta={"requery": {"rows_after": rows}, "via": "refresh"})
    _add(thread, "assistant", turn, content="", meta=via, tool_calls=[ToolCall(f"{turn}_p", "python", CODE)])
    _add(thread, "tool", turn, tool_call_id=f"{turn}_p", name="python", content=f"stdout:\nrows: {rows}\n",
         meta=via)
    _add(thread, "assistant", turn, content=f"**Refreshed** (1 change, 2 steps re-run): {rows} rows.", meta=via)


def _cells(tmp_path: Path, refreshes: list[int]) -> tuple[list[dict], ThreadDocument]:
    layout = Layout(tmp_path)
    thread = ThreadStore(layout).create("demo", "alice", "Energy")
    _add(thread, "user", "t1", content="Energy per building")
    _add(thread, "assistant", "t1", content="", tool_calls=[ToolCall("c1", "sql_query", SQL)])
    _add(thread, "tool", "t1", tool_call_id="c1", name="sql_query", content="saved as artifact a1",
         meta={"artifact": {"id": "a1"}})
    _add(thread, "assistant", "t1", content="", tool_calls=[ToolCall("c2", "python", CODE)])
    _add(thread, "tool", "t1", tool_call_id="c2", name="python", content="stdout:\nrows: 100\n")
    _add(thread, "assistant", "t1", content="100 rows.")
    for n, rows in enumerate(refreshes):
        _refresh(thread, f"rf{n}", rows)
    doc = ThreadDocument.read(thread, ArtifactStore(layout))
    nb = notebook_for(doc)
    nbformat.validate(nbformat.from_dict(nb))
    return nb["cells"], doc


def _stdout(cell: dict) -> str:
    return "".join(o.get("text", "") for o in cell["outputs"] if o["output_type"] == "stream")


def test_a_refreshed_step_is_one_cell_with_the_refreshed_outputs(tmp_path: Path) -> None:
    cells, doc = _cells(tmp_path, [70])
    code = [c for c in cells if c["cell_type"] == "code"][1:]  # after the setup cell
    assert len(code) == 2  # the SQL cell and the python cell, once each
    sql, python = code
    assert "SELECT building_id, kwh FROM readings" in sql["source"]
    assert python["source"].count("print('rows:', len(df))") == 1 and _stdout(python) == "rows: 70\n"
    told = next(i for i, c in enumerate(cells) if "**Refreshed**" in json.dumps(c["source"]))
    assert cells.index(python) < told  # where it was asked, before the refresh's summary
    text = json.dumps(cells)
    assert "requery_artifact" not in text and "rows: 100" not in text
    assert "**Refreshed** (1 change" in text  # the refresh is still told, as markdown
    # the Markdown export keeps the whole conversation, refresh included
    assert "requery_artifact" in doc.to_markdown() and "rows: 100" in doc.to_markdown()


def test_two_refreshes_leave_one_cell_with_the_latest_run(tmp_path: Path) -> None:
    cells, doc = _cells(tmp_path, [70, 64])
    code = [c for c in cells if c["cell_type"] == "code"][1:]
    assert len(code) == 2 and _stdout(code[1]) == "rows: 64\n"
    assert len(analysis_entries(doc.entries)) == len(doc.entries) - 4  # two steps of each refresh folded


def test_a_thread_never_refreshed_is_unchanged(tmp_path: Path) -> None:
    cells, doc = _cells(tmp_path, [])
    assert analysis_entries(doc.entries) == doc.entries
    assert _stdout([c for c in cells if c["cell_type"] == "code"][2]) == "rows: 100\n"


def test_a_refresh_step_that_matches_no_plan_is_kept(tmp_path: Path) -> None:
    """A refresh's python whose code is not the planned one (a log from before the plan was the
    rule): nothing is folded, nothing is lost."""
    layout = Layout(tmp_path)
    thread = ThreadStore(layout).create("demo", "alice", "Odd")
    _add(thread, "user", "t1", content="q")
    _add(thread, "assistant", "t1", content="", tool_calls=[ToolCall("c1", "sql_query", SQL)])
    _add(thread, "tool", "t1", tool_call_id="c1", name="sql_query", content="saved", meta={"artifact": {"id": "a1"}})
    other = msgspec.json.encode({"code": "print('other')"}).decode()
    _add(thread, "assistant", "rf", content="", meta={"via": "refresh"}, tool_calls=[ToolCall("p", "python", other)])
    _add(thread, "tool", "rf", tool_call_id="p", name="python", content="stdout:\nother\n", meta={"via": "refresh"})
    doc = ThreadDocument.read(thread, ArtifactStore(layout))
    assert analysis_entries(doc.entries) == doc.entries
