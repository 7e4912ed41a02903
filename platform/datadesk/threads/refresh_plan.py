"""Which steps a refresh re-runs (threads/refresh.py), read from a thread's records in order.

- every query step whose result was saved as an artifact (SQL, MCP: a tool record with
  `meta.artifact`);
- every python step from the first one whose code reads one of those artifacts (`/data/<aid>`),
  and every python step after it that ran without error (they may use its variables: the kernel
  is fresh, so they run again in order).
Steps recorded by an earlier refresh (`via: "refresh"`) are not planned again: the original
steps are. The notebook export (threads/notebook.py) reads the same plan to know which original
step each of a refresh's recorded steps re-ran.
"""

from __future__ import annotations

import re
from typing import Iterable

import msgspec

from datadesk.domain.records import Record, ToolCall

PYTHON = "python"
REQUERY = "requery_artifact"
VIA = "refresh"
_DATA_REF = re.compile(r"/data/([A-Za-z0-9_-]{1,64})\.(?:parquet|txt)")


class PlannedStep(msgspec.Struct, omit_defaults=True):
    """One step to re-run: a query (`artifact` it produced) or a python call."""

    kind: str  # "query" | "python"
    name: str  # the tool
    arguments: str
    seq: int  # of the original tool record
    artifact: str | None = None
    outputs: dict[str, str] = {}  # python: /outputs file name -> the artifact it was last saved as


def plan_steps(records: Iterable[Record]) -> list[PlannedStep]:
    """The steps a refresh re-runs, in log order (see the module docstring)."""
    calls: dict[str, ToolCall] = {}
    queries: list[PlannedStep] = []
    steps: list[PlannedStep] = []
    latest_outputs: dict[str, str] = {}  # /outputs file -> its newest version, at the end of the log
    files_of: list[tuple[PlannedStep, list[str]]] = []
    python_started = False
    for rec in records:
        meta = rec.meta or {}
        if rec.role == "assistant":
            for call in rec.tool_calls or ():
                calls[call.id] = call
            continue
        if rec.role != "tool" or rec.status != "ok":
            continue
        for out in meta.get("artifacts") or ():
            if out.get("file"):
                latest_outputs[out["file"]] = out["id"]
        call = calls.get(rec.tool_call_id or "")
        if call is None or meta.get("via") == VIA or call.name == REQUERY:
            continue
        art = (meta.get("artifact") or {}).get("id")
        if art and call.name != PYTHON:
            step = PlannedStep("query", call.name, call.arguments, rec.seq, artifact=art)
            queries.append(step)
            steps.append(step)
        elif call.name == PYTHON:
            code = _code(call.arguments)
            reads = set(_DATA_REF.findall(code)) & {q.artifact for q in queries}
            if reads or python_started:
                python_started = True
                step = PlannedStep("python", PYTHON, call.arguments, rec.seq)
                files_of.append((step, [o["file"] for o in meta.get("artifacts") or () if o.get("file")]))
                steps.append(step)
    for step, files in files_of:
        step.outputs = {f: latest_outputs[f] for f in files}
    return steps


def _code(arguments: str) -> str:
    try:
        args = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return ""
    return str(args.get("code") or "") if isinstance(args, dict) else ""
