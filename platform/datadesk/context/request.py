"""The model request of one turn step, assembled in one place (DESIGN section 5).

The turn loop describes the turn once (`TurnRequest`: the thread, the model, the
workspace's standing instructions, the permitted tools, whose memory applies) and
then, for every step, calls `RequestAssembler.build` and, when the reply is in,
`RequestAssembler.record`. Everything between is here:

1. system message: base rules (versioned) + workspace prompt + skills catalog;
2. tools: the permitted ones, in the registry's stable order;
3. preamble: the task state (the user's goal and constraints, `context.taskstate`), the
   notice of history dropped unsummarised (when it was), the thread summary (current
   epoch only), the memory block;
4. + 5. the history window and the current turn (`ContextBuilder`): compaction,
   pairing, budget and water levels;
and the no-gap rule: when uncovered records would leave the window, the summary is
made first and the request built again; when that fails, the window trims and the
request itself says that earlier history was dropped unsummarised (and why). `record` writes the request's manifest
(the thread's manifests, through the `Thread`, never after a clear) with the provider's
usage, and feeds the token calibration.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from datadesk.domain.branches import abandoned_since
from datadesk.context.builder import BuiltContext, ContextBuilder, Coverage, Preamble
from datadesk.context.calibration import Calibration
from datadesk.context.manifest import append_manifest, last_manifest
from datadesk.context.rules import BASE_RULES
from datadesk.context.taskstate import TaskStateStore, render_task_state
from datadesk.domain.records import Usage
from datadesk.memory.store import MemoryStore
from datadesk.settings import SummarySettings
from datadesk.store.interfaces.threads import Thread
from datadesk.summary.model import ThreadSummary, render_summary
from datadesk.summary.service import SummaryService

log = logging.getLogger(__name__)

GAP_MESSAGE_CHARS = 300  # of each dropped user message, quoted in the notice
GAP_WORDS_CHARS = 3_000  # of all of them


@dataclass(frozen=True)
class MemoryScope:
    """Whose long-term memory a turn may see: the workspace flag and the user's permissions
    decide (with the user's own switch) whether the block is injected at all."""

    workspace: str
    user: str
    project: str | None
    workspace_on: bool
    permissions: frozenset[str]


@dataclass(frozen=True)
class TurnRequest:
    """What every request of one turn is made of; fixed for the turn, so the prefix is stable."""

    thread: Thread
    epoch: int
    model: str
    turn_id: str
    tools: list[dict[str, Any]]  # OpenAI tool schemas, permitted ones only, in registry order
    workspace_prompt: str = ""
    skills_catalog: str = ""
    memory: MemoryScope | None = None
    sources_catalog: str = ""  # the workspace's data sources with dialect and description (if any)

    def system_prompt(self) -> str:
        parts = [BASE_RULES]
        if self.workspace_prompt.strip():
            parts.append("## Workspace\n" + self.workspace_prompt.strip())
        if self.sources_catalog:
            parts.append(self.sources_catalog)
        if self.skills_catalog:
            parts.append(self.skills_catalog)
        return "\n\n".join(parts)


class RequestAssembler:
    """Builds each step's request (`build`) and records what went in (`record`)."""

    def __init__(self, window: ContextBuilder, summaries: SummaryService, summary_settings: SummarySettings,
                 memory: MemoryStore, calibration: Calibration, tasks: TaskStateStore | None = None) -> None:
        self.window = window
        self.tasks = tasks or TaskStateStore()  # the user's goal and constraints, per thread
        self.summaries = summaries
        self.summary_settings = summary_settings
        self.memory = memory
        self.calibration = calibration

    def memory_block(self, scope: MemoryScope | None) -> tuple[str, list[str]] | None:
        """The memory block for this turn and the injected fact ids (None when off or empty)."""
        if scope is None:
            return None
        if not self.memory.allowed(scope.workspace, scope.user, scope.workspace_on, scope.permissions)[0]:
            return None
        facts = self.memory.active(scope.workspace, scope.user, scope.project)
        if not facts:
            return None
        return self.memory.block(scope.workspace, scope.user, scope.project), [f.id for f in facts]

    async def build(self, turn: TurnRequest, step: int) -> BuiltContext:
        """The request for this step (ContextTooLarge when it cannot fit). When uncovered records
        would leave the window, the summary is made first and the window built again (no gap);
        if that fails too, the window trims anyway, the manifest records the gap and the request
        tells the model that earlier history was dropped unsummarised. The task state (the user's
        goal and constraints) is in every request, whatever the summary holds."""
        summaries_on = self.summary_settings.enabled
        memory = self.memory_block(turn.memory)
        system_prompt = turn.system_prompt()
        built: BuiltContext | None = None
        notice: tuple[int, str] | None = None  # (gap through seq, text) once history was dropped
        for attempt in range(4):
            summary = self.summaries.store.load_current(turn.thread, turn.epoch) if summaries_on else None
            if summary is not None and abandoned_since(turn.thread.log.since(summary.covers_through_seq + 1),
                                                       summary.covers_through_seq):
                summary = None  # it holds an earlier branch (an edit rewound past it): re-derived later
                self.tasks.forget_branch(turn.thread, turn.epoch)  # and so does what it gave the task state
            tasks = self.tasks.merge_summary(turn.thread, turn.epoch, summary)
            preamble = self.preamble(render_task_state(tasks), summary, memory, notice[1] if notice else None)
            coverage = Coverage(covered_through=summary.covers_through_seq if summary else 0,
                                allowance=self.summary_settings.uncovered_allowance,
                                accept_gap=attempt >= 1) if summaries_on else None
            built = self.window.build(turn.thread, model=turn.model, system_prompt=system_prompt,
                                      tools=turn.tools, turn_id=turn.turn_id, step=step,
                                      preamble=preamble, coverage=coverage)
            if built.needs_summary:
                await self.summaries.refresh(turn.thread, built.uncovered_through, turn.epoch, synchronous=True)
                continue
            gap = built.manifest.gap_through_seq
            if not gap or (notice is not None and notice[0] == gap):
                return built
            # the notice is part of the request: build again with it (its size may move the start)
            notice = (gap, self.gap_notice(turn.thread, turn.epoch, summary, gap))
        assert built is not None
        return built

    @staticmethod
    def preamble(task_state: str | None, summary: ThreadSummary | None,
                 memory: tuple[str, list[str]] | None, notice: str | None) -> Preamble:
        """The derived block: task state, the notice of dropped history, summary, memory."""
        parts = [p for p in (task_state, notice, render_summary(summary) if summary else None,
                             memory[0] if memory else None) if p]
        return Preamble(
            text="\n\n".join(parts) or None,
            summary={"covers_through_seq": summary.covers_through_seq, "epoch": summary.epoch} if summary else None,
            memory_facts=memory[1] if memory else [])

    def gap_notice(self, thread: Thread, epoch: int, summary: ThreadSummary | None, gap_through: int) -> str:
        """What the model is told when records left the request with no summary covering them."""
        first = (summary.covers_through_seq if summary else 0) + 1
        status = self.summaries.status.load(thread, epoch)
        why = status.reason if status is not None and status.state == "failed" and status.reason \
            else "no summary could be made in time"
        span = f"#{first} to #{gap_through}" if first < gap_through else f"#{gap_through}"
        text = (f"[Earlier history dropped unsummarised] Records {span} of this thread are not in this request "
                f"and no summary covers them ({why}). Do not assume what the rest of them said; the task state "
                "above still holds. If an earlier detail matters, say that it is not available to you and ask "
                "the user.")
        said = self._dropped_user_words(thread, first, gap_through)
        return f"{text}\nThe user's own messages among them (where their goal and constraints were stated):\n{said}" \
            if said else text

    @staticmethod
    def _dropped_user_words(thread: Thread, first: int, last: int) -> str:
        """The user's messages in records first..last, oldest first, each and all capped: the tool
        results are what fills a window; what the user asked for is short and must not be lost."""
        lines: list[str] = []
        total = left = 0
        for rec in thread.log.since(first, last):
            if rec.role != "user" or not rec.content.strip():
                continue
            if total >= GAP_WORDS_CHARS:
                left += 1
                continue
            text = " ".join(rec.content.split())
            text = text if len(text) <= GAP_MESSAGE_CHARS else text[:GAP_MESSAGE_CHARS].rstrip() + " …"
            lines.append(f"- #{rec.seq}: {text}")
            total += len(text)
        if left:
            lines.append(f"- … and {left} later message{'s' if left != 1 else ''} of the user, not shown")
        return "\n".join(lines)

    def continuity(self, thread: Thread) -> dict[str, Any]:
        """The thread's task state and summary state, for the context inspector and the chat:
        summary `state` is `off`, `none` (nothing left the window yet), `ok`, `stale` (records
        outside the window wait for the next refresh) or `failed` (with the `reason`)."""
        epoch = thread.current_epoch()
        return {"task_state": msgspec.to_builtins(self.tasks.load(thread, epoch)),
                "summary": self.summary_state(thread, epoch)}

    def summary_state(self, thread: Thread, epoch: int | None) -> dict[str, Any]:
        """Where the thread's summary stands (see `continuity`), from the summary, the status of
        the last refresh and the latest manifest (how far records left the window, and the gap)."""
        if not self.summary_settings.enabled:
            return {"state": "off", "reason": "summaries are switched off (summary.enabled)"}
        summary = self.summaries.store.load_current(thread, epoch)
        status = self.summaries.status.load(thread, epoch)
        manifest = last_manifest(thread)
        covers = summary.covers_through_seq if summary else 0
        outside = manifest.trimmed_through_seq if manifest is not None else 0
        gap = manifest.gap_through_seq if manifest is not None else None
        out: dict[str, Any] = {"covers_through_seq": covers, "outside_window_through_seq": outside,
                               "dropped_unsummarised_through_seq": gap, "reason": ""}
        if status is not None and status.state == "failed" and status.attempted_through > covers:
            out.update(state="failed", reason=status.reason, failed_at=status.at)
        elif outside > covers:
            out.update(state="stale", reason=f"records #{covers + 1} to #{outside} are outside the window and "
                                             "not summarised yet")
        else:
            out["state"] = "ok" if summary is not None else "none"
        return out

    def record(self, turn: TurnRequest, built: BuiltContext, usage: Usage | None, replied: bool,
               calibrate: bool = True) -> None:
        """Write the request's manifest with the provider's usage (also when the call was
        cancelled or failed: what was sent is recorded), and learn the token correction."""
        manifest = built.manifest
        if replied and usage is not None and usage.prompt_tokens:
            manifest.usage = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                              "cached_tokens": usage.cached_tokens}
            manifest.cache_ratio = round(usage.cached_tokens / usage.prompt_tokens, 4)
            if calibrate:
                self.calibration.observe(turn.model, manifest.estimated_raw_tokens, usage.prompt_tokens)
        elif not replied:
            manifest.error = "no reply"
        try:
            append_manifest(turn.thread, manifest, turn.epoch)  # dropped after a clear
        except OSError:
            log.warning("could not write the context manifest of %s", turn.thread.id)

    def due_summary(self, thread: Thread, built: BuiltContext | None) -> int | None:
        """After the reply: the seq to summarize through when a background refresh is due."""
        if built is None or not self.summary_settings.enabled:
            return None
        m = built.manifest
        upto = max(m.trimmed_through_seq, m.over_budget_through_seq)
        return upto if self.summaries.due(thread, upto, m.water) else None

