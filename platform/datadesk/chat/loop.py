"""One turn: user record -> context -> model -> tools -> records -> repeat -> answer.

Every step is recorded as it completes, so a crash or a cancel leaves a log
the next turn can continue from: an assistant record with tool calls is
always followed by one tool record per call (a cancelled call gets a
`cancelled` record), and a reply stopped mid-stream is kept with its partial
text and status `cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from datadesk.chat.policy import TurnPolicy
from datadesk.chat.turns import RunningTurn, TurnRegistry
from datadesk.context.builder import BuiltContext, ContextTooLarge
from datadesk.context.request import RequestAssembler
from datadesk.domain.branches import abandoned_stretch
from datadesk.domain.events import (ArtifactCreated, MessageCompleted, MessageDelta, ToolFinished, ToolProgress,
                                    ToolStarted, TurnDone, TurnError)
from datadesk.domain.ids import ID_PATTERN, new_id
from datadesk.domain.records import ArtifactRef, AssistantRecordMeta, Record, ToolCall, record_meta
from datadesk.domain.users import User
from datadesk.llm.base import ChatModel, ModelDelta, ModelError, ModelReply
from datadesk.offload.pipeline import OffloadCapability, OffloadOutcome, OffloadPipeline
from datadesk.settings import ChatSettings
from datadesk.store.diskspace import DiskRoom
from datadesk.store.files import StoreWriteError, not_saved
from datadesk.store.interfaces.errors import ClusterUnavailable
from datadesk.store.interfaces.threads import TurnFenced
from datadesk.store.threadlog import LogClosed
from datadesk.store.threads import Thread, ThreadStore
from datadesk.summary.service import SummaryService
from datadesk.telemetry import TOOL_SECONDS, timed_turn
from datadesk.tools.registry import ToolContext, ToolRegistry, ToolResult, TurnFacts

log = logging.getLogger(__name__)

LOST_MESSAGE = ("this turn stopped: this server lost its hold on the thread (the cluster database was unreachable, "
                "or another server took the thread over); what was recorded before is kept. Send the message again")
PREVIEW_CHARS = 16_000


class HoldLost(TurnFenced):
    """A write of a turn whose hold on the thread is already known lost: refused before it is
    tried (its fence would refuse it; with the database gone, trying would only wait)."""  # the tool card shows the whole preview the model got (<2,000 tokens when offloaded)


@dataclass(frozen=True)
class TurnServices:
    """Exactly what a turn uses, handed over by the composition root (composition.py)."""

    model: ChatModel
    requests: RequestAssembler  # builds each step's request, records its manifest
    tools: ToolRegistry
    offload: OffloadPipeline  # large tool results -> artifacts (or the truncated form)
    summaries: SummaryService  # the background refresh after the reply
    threads: ThreadStore  # title and `updated` of the thread
    policy: TurnPolicy  # permitted tools, offload capability, request parts, memory extraction
    settings: ChatSettings
    calibrate: bool = True  # the model's reported usage is real: learn the token correction
    disk: DiskRoom | None = None  # store.min_free_mb: no new turn on a disk that is nearly full


class TurnLoop:
    """Runs one turn of one thread, emitting events on `turn` and appending records."""

    def __init__(self, services: TurnServices, turn: RunningTurn, thread: Thread, user: User) -> None:
        self.services = services
        self.turn = turn
        self.thread = thread
        self.user = user
        self.epoch = thread.meta.epoch  # the epoch seen at the start (a clear bumps it)
        self.settings = services.settings
        self.user_seq = 0  # seq of this turn's user record
        self.tool_output_seen = False  # whether a tool result came back earlier in this turn
        self.allowed: set[str] = set()  # tool names permitted in this turn
        self.last_built: BuiltContext | None = None  # the latest request (its manifest drives the summary)
        self.fenced = False  # the turn lost the thread to another host: nothing of it is written any more

    def _append(self, **fields: Any) -> Record:
        if self._lost():  # fenced out anyway: no write (nor a wait on a database that is gone)
            raise HoldLost(LOST_MESSAGE)
        fields.setdefault("turn_id", self.turn.turn_id)
        # a clear during this turn makes every later append fail (LogClosed); so does another host
        # taking the thread over (the claim's fence is gone: TurnFenced), checked in the append's
        # own transaction on the cluster set
        return append_fenced(self.thread, self.turn, lambda seq: Record(seq=seq, ts=time.time(), **fields),
                             self.epoch)

    async def run(self, text: str, user_meta: dict[str, Any] | None = None) -> None:
        with timed_turn() as outcome:  # /metrics: running now, then finished by outcome
            outcome[0] = await self._run(text, user_meta)

    async def _run(self, text: str, user_meta: dict[str, Any] | None = None) -> str:
        """The turn; returns its outcome for the metrics (ok, cancelled, or the error's kind)."""
        status = outcome = "ok"
        try:
            user_rec = self._append(role="user", content=text, meta=user_meta)  # meta: a branch (domain/branches.py)
            self.user_seq = user_rec.seq
            stretch = abandoned_stretch(user_rec)
            if stretch is not None:  # what the earlier branch said leaves the task state before the first request
                await asyncio.to_thread(self.services.requests.tasks.forget_stretch, self.thread, self.epoch, *stretch)
            if self.thread.meta.title == "New chat":
                await asyncio.to_thread(self.services.threads.touch, self.thread,
                                        title=text.strip().splitlines()[0][:80] or None)
            status = outcome = await self._steps()
            self._after_reply()
            self.services.policy.after_turn(self.user, self.thread, [user_rec])  # memory extraction: user words only
        except asyncio.CancelledError:
            status = outcome = "cancelled"
            if self._lost():  # its lease renewal failed, not a user's stop
                outcome = "lost"
                self.turn.emit(TurnError(kind="lost", message=LOST_MESSAGE))
            else:
                self.turn.emit(TurnError(kind="cancelled", message="the turn was cancelled; what completed is kept"))
        except ClusterUnavailable as exc:  # the database (or the store) went away mid-turn: say which
            status, outcome = "error", "database"
            log.warning("turn %s stopped: %s", self.turn.turn_id, exc)
            self.turn.emit(TurnError(kind="database", message=f"this turn stopped: {exc}. What was recorded "
                                                             "before is kept; send the message again shortly"))
        except TurnFenced as exc:  # another server holds the thread now: this turn writes nothing more
            lost = isinstance(exc, HoldLost)
            status, outcome = "error", "lost" if lost else "taken_over"
            self.fenced = True
            log.warning("turn %s stopped: %s", self.turn.turn_id, exc)
            self.turn.emit(TurnError(kind="lost", message=LOST_MESSAGE) if lost else
                           TurnError(kind="taken_over", message=f"{exc}; what this turn recorded before is kept"))
        except LogClosed as exc:
            status, outcome = "error", "thread_gone"
            self.turn.emit(TurnError(kind="thread_gone", message=str(exc)))
        except StoreWriteError as exc:  # a full disk: what was not saved is named, nothing is half-kept
            status, outcome = "error", "disk"
            self.turn.emit(TurnError(kind="disk", message=f"{exc}. Free space on the disk of the data directory, "
                                                          "then send the message again."))
        except Exception as exc:  # never lose the stream without saying why
            status, outcome = "error", "internal"
            if self._lost():  # e.g. the database went mid-write
                outcome = "lost"
                log.warning("turn %s stopped after losing its hold on the thread: %s", self.turn.turn_id, exc)
                self.turn.emit(TurnError(kind="lost", message=LOST_MESSAGE))
            else:
                log.exception("turn %s failed", self.turn.turn_id)
                self.turn.emit(TurnError(kind="internal", message=f"internal error ({type(exc).__name__})"))
        finally:
            # the meta's `updated` and store.fsync = "turn" (the turn's records reach the disk): two
            # fsyncs, in a thread, not on the loop every other user's request waits on
            ending = asyncio.ensure_future(asyncio.to_thread(self._end_records))
            try:
                await asyncio.shield(ending)
            except asyncio.CancelledError:  # cancelled again while ending: the end still runs, and is said
                pass
            self.turn.emit(TurnDone(turn_id=self.turn.turn_id, status=status))
        return outcome

    def _lost(self) -> bool:
        """Whether this turn's hold on the thread is gone (renewal failed: the database went, or
        another server took the thread over)."""
        return self.turn.claim is not None and self.turn.claim.lost

    def _end_records(self) -> None:
        if self.fenced or (self.turn.claim is not None and self.turn.claim.lost):
            return  # the thread's new holder owns its meta now
        try:
            self.services.threads.touch(self.thread)
            self.thread.end_turn()
        except Exception:
            log.warning("could not end the records of turn %s", self.turn.turn_id, exc_info=True)

    async def _steps(self) -> str:
        specs = self.services.policy.permitted_tools(self.user, self.thread.meta.workspace)
        self.allowed = {s.name for s in specs}
        request = self.services.policy.turn_request(self.user, self.thread, self.epoch, self.turn.turn_id, specs)
        for step in range(1, self.settings.max_steps + 1):
            try:
                built = await self.services.requests.build(request, step)
            except ContextTooLarge as exc:
                self._append(role="assistant", status="error", content="",
                             meta=record_meta(AssistantRecordMeta(error=str(exc), kind="context")))
                self.turn.emit(TurnError(kind="context", message=str(exc)))
                return "error"
            reply: ModelReply | None = None
            self.last_built = built
            try:
                reply = await self._call_model(built.messages, built.tools)
            finally:  # also when cancelled: what was sent is recorded
                self.services.requests.record(request, built, reply.usage if reply else None, replied=reply is not None,
                                        calibrate=self.services.calibrate)
            if reply is None:
                return "error"
            if not reply.tool_calls:
                rec = self._append(role="assistant", content=reply.content, model=reply.model or self.services.model.name,
                                   usage=reply.usage, provider_fields=reply.provider_fields)
                self.turn.emit(MessageCompleted(seq=rec.seq, content=rec.content, model=rec.model, usage=rec.usage))
                return "ok"
            calls = _unique_ids(reply.tool_calls)
            self._append(role="assistant", content=reply.content, tool_calls=calls,
                         model=reply.model or self.services.model.name, usage=reply.usage,
                         provider_fields=reply.provider_fields)
            cap = self.services.policy.offload_capability(self.user, self.thread.meta.workspace, specs)
            await self._run_tools(calls, cap)
        rec = self._append(role="assistant", status="error",
                           content=f"I stopped after {self.settings.max_steps} tool rounds without a final answer.",
                           meta=record_meta(AssistantRecordMeta(error="step_limit")))
        self.turn.emit(TurnError(kind="step_limit", message=rec.content))
        return "error"

    def _after_reply(self) -> None:
        """Schedule the summary refresh when due; the reply never waits for it."""
        upto = self.services.requests.due_summary(self.thread, self.last_built)
        if upto is not None:
            self.services.summaries.schedule(self.thread, upto, self.epoch)

    async def _call_model(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply | None:
        parts: list[str] = []
        try:
            async for ev in self.services.model.stream(messages, tools):
                if isinstance(ev, ModelDelta):
                    parts.append(ev.text)
                    self.turn.emit(MessageDelta(text=ev.text))
                elif isinstance(ev, ModelReply):
                    return ev
            raise ModelError("the model stream ended without a reply")
        except asyncio.CancelledError:
            self._append(role="assistant", content="".join(parts), status="cancelled",
                         model=self.services.model.name)
            raise
        except ModelError as exc:
            self._append(role="assistant", content="".join(parts), status="error",
                         model=self.services.model.name,
                         meta=record_meta(AssistantRecordMeta(error=str(exc), kind=type(exc).__name__)))
            self.turn.emit(TurnError(kind="model", message=str(exc)))
            return None

    async def _run_tools(self, calls: list[ToolCall], cap: OffloadCapability) -> None:
        recorded: set[str] = set()
        printed: dict[str, list[str]] = {}  # what each call printed live, kept if it is stopped
        facts = TurnFacts(user_seq=self.user_seq, after_tool_output=self.tool_output_seen, user_asked=True,
                          project=self.thread.meta.project)

        async def one(call: ToolCall) -> None:
            self.turn.emit(ToolStarted(call_id=call.id, name=call.name, arguments=call.arguments))
            started = time.perf_counter()
            def progress(**fields: Any) -> None:
                _keep_printed(printed.setdefault(call.id, []), fields)
                elapsed = round(time.perf_counter() - started, 1)
                self.turn.emit(ToolProgress(call_id=call.id, name=call.name, elapsed_s=elapsed, **fields))

            ctx = ToolContext(thread=self.thread, workspace=self.thread.meta.workspace, user=self.user.id,
                              permissions=self.user.permission_set, call_id=call.id, epoch=self.epoch, facts=facts,
                              progress=progress)
            try:
                if call.name not in self.allowed:
                    # hidden by the workspace, or not permitted: same answer as an unknown tool
                    result = ToolResult(f"unknown tool {call.name!r} (or not available here); available tools: "
                                        f"{', '.join(sorted(self.allowed)) or 'none'}", is_error=True)
                else:
                    # a tool bounding its own calls (python: the execution deadline, then the
                    # interrupt and a restart) is not cut short by the turn's tool timeout
                    found = self.services.tools.get(call.name, self.thread.meta.workspace)
                    limit = max(self.settings.tool_timeout_s, (found.spec.time_limit_s or 0) if found else 0)
                    result = await asyncio.wait_for(
                        self.services.tools.run(call.name, call.arguments, ctx), limit
                    )
            except asyncio.TimeoutError:
                result = ToolResult(f"{call.name} timed out after {limit:g} s", is_error=True)
            tool = self.services.tools.get(call.name, self.thread.meta.workspace)
            try:
                outcome = await self.services.offload.process(
                    tool.spec if tool else None, result, self.thread, ctx.origin("tool", call.name, call.arguments),
                    cap, self.epoch, progress=ctx.report)
            except asyncio.CancelledError:
                if result.table is not None:  # stop the query behind the stream (safe from any thread)
                    result.table.interrupt()
                raise
            except OSError as exc:  # a full disk while the result was written: no artifact, the reason
                error = not_saved(exc, f"the result of {call.name}")
                if error is None:
                    raise
                if result.table is not None:
                    result.table.interrupt()
                log.error("turn %s: %s", self.turn.turn_id, error)
                outcome = OffloadOutcome(ToolResult(f"{call.name} failed: {error}", is_error=True))
            result = outcome.result
            if outcome.artifact is not None:
                self.turn.emit(ArtifactCreated(call_id=call.id, artifact=ArtifactRef.of(outcome.artifact)))
            for produced in result.meta.artifacts or ():  # charts and files written by code
                self.turn.emit(ArtifactCreated(call_id=call.id, artifact=produced))
            ms = round((time.perf_counter() - started) * 1000, 1)
            # an unknown name (the model's invention) is one label value, not one series each
            TOOL_SECONDS.labels(call.name if call.name in self.allowed else "unknown",
                                "error" if result.is_error else "ok").observe(ms / 1000)
            # a tool that timed its own work (the python kernel) keeps its figure in the record
            kept = result.meta if result.meta.duration_ms is not None else \
                msgspec.structs.replace(result.meta, duration_ms=ms)
            rec = self._append(role="tool", tool_call_id=call.id, name=call.name, content=result.content,
                               status="error" if result.is_error else "ok", meta=record_meta(kept))
            recorded.add(call.id)
            self.turn.emit(ToolFinished(call_id=call.id, name=call.name, ok=not result.is_error, seq=rec.seq,
                                        duration_ms=ms, preview=result.content[:PREVIEW_CHARS],
                                        meta=result.meta if record_meta(result.meta) else None))

        try:
            await asyncio.gather(*(one(c) for c in calls))
            self.tool_output_seen = True
        except asyncio.CancelledError:
            for call in calls:
                if call.id not in recorded:
                    self._append(role="tool", tool_call_id=call.id, name=call.name, status="cancelled",
                                 content=cancelled_content(printed.get(call.id)))
            raise


STOPPED_CONTENT = "cancelled: the user stopped the turn before this call finished"
PRINTED_KEEP_CHARS = 20_000  # of a stopped call's live output, the newest (as the card shows it)


def _keep_printed(parts: list[str], fields: dict[str, Any]) -> None:
    """Add a progress event's printed text (stdout, stderr) to `parts`, keeping the newest chars."""
    for stream in ("stdout", "stderr"):
        text = fields.get(stream)
        if isinstance(text, str) and text:
            parts.append(text)
    total = sum(len(p) for p in parts)
    if total > 2 * PRINTED_KEEP_CHARS:
        joined = "".join(parts)[-PRINTED_KEEP_CHARS:]
        parts[:] = [joined]


def cancelled_content(parts: list[str] | None) -> str:
    """The record of a stopped call: the notice, then what it printed before the Stop (if any)."""
    text = "".join(parts or ())
    if not text:
        return STOPPED_CONTENT
    if len(text) > PRINTED_KEEP_CHARS:
        text = f"… [{len(text) - PRINTED_KEEP_CHARS:,} chars cut]\n" + text[-PRINTED_KEEP_CHARS:]
    return f"{STOPPED_CONTENT}; printed before the stop:\n{text}"


def _unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """Give every call a distinct, valid id (some servers send none or repeat them)."""
    seen: set[str] = set()
    out = []
    for c in calls:
        cid = c.id if c.id and ID_PATTERN.fullmatch(c.id) and c.id not in seen else new_id("call_")
        seen.add(cid)
        out.append(ToolCall(id=cid, name=c.name, arguments=c.arguments))
    return out


def append_fenced(thread: Thread, turn: RunningTurn, make: Any, epoch: int | None) -> Record:
    """`thread.append` for a write made by `turn` (a chat turn, an upload, a re-query): carries
    the turn's fence when it has one, so the write is refused (TurnFenced) once another host took
    the thread over."""
    fence = turn.fence
    if fence is None:
        return thread.append(make, epoch=epoch)
    return thread.append(make, epoch=epoch, fence=fence)


async def start_turn(services: TurnServices, turns: TurnRegistry, thread: Thread, user: User, text: str,
                     background: bool, user_meta: dict[str, Any] | None = None) -> RunningTurn:
    """Reserve the thread (409/429 if not possible, 507 with too little disk) and start the turn task."""
    if services.disk is not None:
        services.disk.check("a new turn")
    turn = turns.reserve(thread.id, user.id, events_at=thread.events_path)
    turn.background = background
    return turns.launch(turn, TurnLoop(services, turn, thread, user).run(text, user_meta), "turn")
