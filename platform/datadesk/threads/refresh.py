"""Refresh an analysis: re-run a thread's queries against today's data, then the python that
used them, in a fresh kernel, and say what changed.

Which steps (read from the thread's log, in order; the plan is threads/refresh_plan.py):
- every query step whose result was saved as an artifact (SQL, MCP: a tool record with
  `meta.artifact`); it is re-run through the re-query path (tools/requery.py: read-only
  origins only, the permission checked again, the data written back under the SAME artifact id
  and /data path, so the python that reads it reads the new data);
- every python step from the first one whose code reads one of those artifacts (`/data/<aid>`),
  and every python step after it that ran without error (they may use its variables: the kernel
  is fresh, so they run again in order).
Inline query results (no artifact) are not re-run: no code can read them. Steps recorded by an
earlier refresh (`via: "refresh"`) are not planned again: the original steps are.

Versions: before a query is re-run, its old data is kept as an artifact of its own ("previous
version of <aid>", up to KEEP_PREVIOUS_BYTES) and the comparison (rows, schema, sums of numeric
columns, threads/refresh_compare.py) is made against it. Files under /outputs that the python
writes again become new artifacts (the old ones stay): the report lists old -> new per file.

Like a turn, a refresh holds the thread (a running turn: 409), streams events on the thread's
event stream (`refresh.started`, `refresh.step` per step as it starts and ends,
`refresh.completed` with the report, then `done`), and records its steps in the log (`via:
"refresh"`) followed by an assistant record with the summary; the last report is the thread's
`refresh` document (GET /api/threads/{tid}/refresh).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar

import msgspec

from datadesk.chat.turns import RunningTurn, TurnRegistry
from datadesk.domain.branches import active_records
from datadesk.domain.events import EventPayload, TurnDone, TurnError
from datadesk.domain.ids import new_id
from datadesk.domain.records import AssistantRecordMeta, Record, ToolCall, ToolRecordMeta, record_meta
from datadesk.domain.users import User
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.sandbox.registry import KernelRegistry
from datadesk.store.diskspace import DiskRoom
from datadesk.store.interfaces.threads import REFRESH
from datadesk.store.threads import Thread
from datadesk.threads.refresh_plan import PYTHON, REQUERY, VIA, PlannedStep, plan_steps
from datadesk.threads.refresh_compare import TableChange, compare, describe, facts_or_none
from datadesk.tools.context import ToolContext
from datadesk.tools.registry import ToolError, ToolRegistry
from datadesk.tools.requery import RequeryService

log = logging.getLogger(__name__)

KEEP_PREVIOUS_BYTES = 256 << 20  # an old result larger than this is compared, not kept


class NothingToRefresh(ValueError):
    """The thread has no saved query result to re-run (API: 400)."""


class StepOutcome(msgspec.Struct):
    n: int
    kind: str
    name: str
    ok: bool
    error: str | None = None
    artifact: str | None = None
    previous: str | None = None  # the artifact keeping the old data (query steps)
    change: TableChange | None = None
    outputs: list[dict[str, str | None]] = []  # {"file", "old", "new"} per /outputs file written again
    summary: list[str] = []


class RefreshReport(msgspec.Struct):
    """The last refresh of a thread (its `refresh` document and the GET answer)."""

    id: str
    thread: str
    trigger: str  # "user" | "schedule"
    started: float
    status: str = "running"  # running | ok | failed
    finished: float | None = None
    steps: list[StepOutcome] = []
    changes: int = 0  # steps whose data or outputs changed
    error: str | None = None


class RefreshStarted(EventPayload):
    type: ClassVar[str] = "refresh.started"
    refresh_id: str
    steps: int


class RefreshStepEvent(EventPayload, omit_defaults=True):
    type: ClassVar[str] = "refresh.step"
    n: int
    of: int
    kind: str
    name: str
    status: str  # running | ok | error
    summary: list[str] = []


class RefreshCompleted(EventPayload):
    type: ClassVar[str] = "refresh.completed"
    report: dict[str, Any]


def last_report(thread: Thread) -> dict[str, Any] | None:
    """The thread's last refresh report (None: never refreshed)."""
    raw = thread.read_doc(REFRESH)
    return msgspec.json.decode(raw) if raw else None


class ThreadRefresh:
    """Starts refreshes (one per thread, as a turn) and runs their steps."""

    def __init__(self, requery: RequeryService, tools: ToolRegistry, artifacts: ArtifactStore,
                 turns: TurnRegistry, kernels: KernelRegistry | None, tool_timeout_s: float,
                 disk: DiskRoom | None = None) -> None:
        self.requery = requery
        self.tools = tools
        self.artifacts = artifacts
        self.turns = turns
        self.kernels = kernels
        self.tool_timeout_s = tool_timeout_s
        self.disk = disk

    def plan(self, thread: Thread) -> list[PlannedStep]:
        # the active branch only: steps of an edited-away branch are never re-run
        return plan_steps(active_records(list(thread)))

    async def start(self, thread: Thread, user: User, trigger: str = "user") -> RunningTurn:
        """Reserve the thread (TurnConflict: 409) and start the refresh task; NothingToRefresh
        when the thread has no saved query result."""
        if self.disk is not None:
            self.disk.check("a refresh")
        steps = await asyncio.to_thread(self.plan, thread)
        if not steps:
            raise NothingToRefresh("this thread has no saved query result to refresh: ask a question "
                                   "that queries the data first")
        turn = self.turns.reserve(thread.id, user.id, events_at=thread.events_path)
        report = RefreshReport(id=new_id("rfr"), thread=thread.id, trigger=trigger, started=time.time())
        return self.turns.launch(turn, self.run(thread, user, turn, steps, report), "refresh")

    async def run(self, thread: Thread, user: User, turn: RunningTurn, steps: list[PlannedStep],
                  report: RefreshReport) -> RefreshReport:
        """Run `steps` in a fresh kernel, stopping at the first that fails; record and emit as it goes."""
        epoch = thread.meta.epoch if thread.meta else None
        turn.emit(RefreshStarted(refresh_id=report.id, steps=len(steps)))
        status = "ok"
        try:
            if self.kernels is not None and any(s.kind == "python" for s in steps):
                await self.kernels.shutdown_thread((thread.workspace, user.id, thread.id))  # a fresh kernel
            for n, step in enumerate(steps, 1):
                turn.emit(RefreshStepEvent(n=n, of=len(steps), kind=step.kind, name=step.name, status="running"))
                outcome = await self._step(thread, user, turn, step, n, epoch)
                report.steps.append(outcome)
                turn.emit(RefreshStepEvent(n=n, of=len(steps), kind=step.kind, name=step.name,
                                           status="ok" if outcome.ok else "error", summary=outcome.summary))
                if not outcome.ok:
                    report.error = f"step {n} ({step.name}) failed: {outcome.error}"
                    break
            status = "failed" if report.error else "ok"
        except asyncio.CancelledError:
            status, report.error = "cancelled", "the refresh was cancelled; the steps that completed are kept"
            raise
        except Exception as exc:  # a bug must not leave the thread held or the report 'running'
            log.exception("refresh %s of %s", report.id, thread.id)
            status, report.error = "failed", f"internal error ({type(exc).__name__})"
        finally:
            self._finish(thread, turn, report, status, epoch)
        return report

    def _finish(self, thread: Thread, turn: RunningTurn, report: RefreshReport, status: str,
                epoch: int | None) -> None:
        report.status, report.finished = status, time.time()
        report.changes = sum(1 for s in report.steps if _changed(s))
        data = msgspec.to_builtins(report)
        try:
            thread.write_doc(REFRESH, data, epoch)
            meta = thread.reload()  # the thread list's badge: "refreshed 07:30, 2 changes"
            thread.write_meta(msgspec.structs.replace(meta, updated=report.finished, refreshed={
                "at": report.finished, "status": status, "changes": report.changes, "trigger": report.trigger}))
            self._append(thread, turn, epoch, role="assistant", content=summary_text(report),
                         status="ok" if status == "ok" else "error",
                         meta=record_meta(AssistantRecordMeta(via=VIA, error=report.error)))
            thread.end_turn()
        except Exception:
            log.exception("refresh %s: the report was not recorded", report.id)
        if report.error:
            turn.emit(TurnError(kind="refresh", message=report.error))
        turn.emit(RefreshCompleted(report=data))
        turn.emit(TurnDone(turn_id=turn.turn_id, status=status))

    def _append(self, thread: Thread, turn: RunningTurn, epoch: int | None, **fields: Any) -> Record:
        fields.setdefault("turn_id", turn.turn_id)
        return thread.append(lambda seq: Record(seq=seq, ts=time.time(), **fields), epoch=epoch, fence=turn.fence)

    async def _step(self, thread: Thread, user: User, turn: RunningTurn, step: PlannedStep, n: int,
                    epoch: int | None) -> StepOutcome:
        call_id = new_id("call_")
        ctx = ToolContext(thread=thread, workspace=thread.workspace, user=user.id, permissions=user.permission_set,
                          call_id=call_id, epoch=epoch)
        if step.kind == "query":
            name, args = REQUERY, msgspec.json.encode({"artifact_id": step.artifact}).decode()
        else:
            name, args = PYTHON, step.arguments
        self._append(thread, turn, epoch, role="assistant", tool_calls=[ToolCall(call_id, name, args)],
                     meta=record_meta(AssistantRecordMeta(via=VIA)))
        if step.kind == "query":
            outcome, content, meta = await self._query(thread, ctx, step, n)
        else:
            outcome, content, meta = await self._python(thread, ctx, step, n)
        self._append(thread, turn, epoch, role="tool", tool_call_id=call_id, name=name, content=content,
                     status="ok" if outcome.ok else "error", meta=record_meta(meta))
        return outcome

    async def _query(self, thread: Thread, ctx: ToolContext, step: PlannedStep,
                     n: int) -> tuple[StepOutcome, str, ToolRecordMeta]:
        aid = step.artifact or ""
        art = self.artifacts.load(thread, aid)
        path = self.artifacts.data_path(thread, art) if art.available else None
        old = await asyncio.to_thread(facts_or_none, path)
        previous = await asyncio.to_thread(self._keep_previous, thread, ctx, art, path)
        try:
            rep = await self.requery.requery(aid, ctx)
        except ToolError as exc:
            out = StepOutcome(n=n, kind="query", name=step.name, ok=False, error=str(exc), artifact=aid,
                              previous=previous)
            return out, f"refresh failed: {exc}", ToolRecordMeta(via=VIA)
        new_art = self.artifacts.load(thread, aid)
        new = await asyncio.to_thread(facts_or_none, self.artifacts.data_path(thread, new_art))
        if new is None:
            change = TableChange(rows_old=art.rows, rows_new=rep.rows_after, changed=rep.changed)
        else:
            change = compare(old, new, rows_old=art.rows)
        out = StepOutcome(n=n, kind="query", name=step.name, ok=True, artifact=aid, previous=previous,
                          change=change, summary=describe(change) or ["unchanged"])
        return out, msgspec.json.encode(rep).decode(), ToolRecordMeta(requery=rep, via=VIA)

    def _keep_previous(self, thread: Thread, ctx: ToolContext, art: Any, path: Any) -> str | None:
        """Keep the old data of `art` as an artifact of its own (None: expired, or too large)."""
        if path is None or not path.is_file() or path.stat().st_size > KEEP_PREVIOUS_BYTES:
            return None
        origin = msgspec.structs.replace(art.origin, filename=f"previous version of {art.id}")
        kept = self.artifacts.save_bytes(thread, path.read_bytes(), path.suffix.lstrip("."), "result",
                                         art.media_type, origin, ctx.epoch)
        return kept.id

    async def _python(self, thread: Thread, ctx: ToolContext, step: PlannedStep,
                      n: int) -> tuple[StepOutcome, str, ToolRecordMeta]:
        tool = self.tools.get(PYTHON, thread.workspace)
        limit = max(self.tool_timeout_s, (tool.spec.time_limit_s or 0) if tool else 0)
        try:
            result = await asyncio.wait_for(self.tools.run(PYTHON, step.arguments, ctx), limit)
        except asyncio.TimeoutError:
            return (StepOutcome(n=n, kind="python", name=PYTHON, ok=False, error=f"timed out after {limit:g} s"),
                    f"python timed out after {limit:g} s", ToolRecordMeta(via=VIA))
        meta = msgspec.structs.replace(result.meta, via=VIA)
        new_files = {o.file: o.id for o in result.meta.artifacts or () if o.file}
        outputs = [{"file": f, "old": step.outputs.get(f), "new": new_files.get(f)}
                   for f in sorted(set(step.outputs) | set(new_files))]
        summary = [f"{o['file']}: new version {o['new']}" for o in outputs if o["new"]]
        if result.is_error:
            first = result.content.strip().splitlines()[-1][:300] if result.content.strip() else "error"
            return (StepOutcome(n=n, kind="python", name=PYTHON, ok=False, error=first, outputs=outputs),
                    result.content, meta)
        return (StepOutcome(n=n, kind="python", name=PYTHON, ok=True, outputs=outputs, summary=summary),
                result.content, meta)


def _changed(step: StepOutcome) -> bool:
    return bool(step.change is not None and step.change.changed)


def summary_text(report: RefreshReport) -> str:
    """The refresh as the assistant record says it (Markdown): what changed, step by step."""
    head = {"ok": "Refreshed", "failed": "Refresh failed", "cancelled": "Refresh cancelled"}.get(report.status,
                                                                                               "Refresh")
    lines = [f"**{head}** ({report.changes} change{'s' if report.changes != 1 else ''}, "
             f"{len(report.steps)} step{'s' if len(report.steps) != 1 else ''} re-run)."]
    if report.error:
        lines.append(f"\n{report.error}")
    for s in report.steps:
        what = f"artifact {s.artifact}" if s.kind == "query" else "python"
        lines.append(f"- step {s.n}, {s.name} ({what}): " + ("; ".join(s.summary) if s.ok and s.summary else
                                                            "ok" if s.ok else f"failed: {s.error}"))
    return "\n".join(lines)
