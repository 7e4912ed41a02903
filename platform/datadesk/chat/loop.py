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
from typing import Any

import msgspec

from datadesk.chat.runtime import Runtime
from datadesk.chat.turns import RunningTurn
from datadesk.context.builder import ContextTooLarge
from datadesk.context.manifest import append_manifest
from datadesk.context.rules import BASE_RULES
from datadesk.summary.model import render_summary
from datadesk.domain.records import Record, ToolCall
from datadesk.domain.users import User
from datadesk.llm.base import ModelDelta, ModelError, ModelReply
from datadesk.offload.pipeline import OffloadCapability, artifact_ref
from datadesk.store.threadlog import LogClosed, current_epoch
from datadesk.store.threads import ThreadHandle
from datadesk.tools.registry import ToolContext, ToolResult

log = logging.getLogger(__name__)

PREVIEW_CHARS = 16_000  # the tool card shows the whole preview the model got (<2,000 tokens when offloaded)


def system_prompt(rt: Runtime, workspace: str) -> str:
    cfg, _ = rt.workspace(workspace)
    parts = [BASE_RULES]
    if cfg.prompt.strip():
        parts.append("## Workspace\n" + cfg.prompt.strip())
    catalog = rt.skills.catalog_text(workspace)
    if catalog:
        parts.append(catalog)
    return "\n\n".join(parts)


class TurnLoop:
    """Runs one turn of one thread, emitting events on `turn` and appending records."""

    def __init__(self, rt: Runtime, turn: RunningTurn, handle: ThreadHandle, user: User) -> None:
        self.rt = rt
        self.turn = turn
        self.handle = handle
        self.user = user
        self.log = handle.log
        self.epoch = handle.meta.epoch
        self.settings = rt.settings.chat

    def _append(self, **fields: Any) -> Record:
        fields.setdefault("turn_id", self.turn.turn_id)
        # the epoch seen at the start: a clear during this turn makes every later append fail
        return self.log.append(lambda seq: Record(seq=seq, ts=time.time(), **fields), epoch=self.epoch)

    async def run(self, text: str) -> None:
        status = "ok"
        try:
            user_rec = self._append(role="user", content=text)
            self.user_seq = user_rec.seq
            if self.handle.meta.title == "New chat":
                self.rt.threads.touch(self.handle, title=text.strip().splitlines()[0][:80] or None)
            status = await self._steps()
            self._after_reply()
            self.rt.after_turn(self.user, self.handle, [user_rec])  # memory extraction: user words only
        except asyncio.CancelledError:
            status = "cancelled"
            self.turn.emit("error", kind="cancelled", message="the turn was cancelled; what completed is kept")
        except LogClosed as exc:
            status = "error"
            self.turn.emit("error", kind="thread_gone", message=str(exc))
        except Exception as exc:  # never lose the stream without saying why
            log.exception("turn %s failed", self.turn.turn_id)
            status = "error"
            self.turn.emit("error", kind="internal", message=f"internal error ({type(exc).__name__})")
        finally:
            try:
                self.rt.threads.touch(self.handle)
            except Exception:
                pass
            self.turn.emit("done", turn_id=self.turn.turn_id, status=status)

    async def _steps(self) -> str:
        self.tool_output_seen = False
        specs = self.rt.permitted_tools(self.user, self.handle.meta.workspace)
        tools = [s.openai_schema() for s in specs]
        self.allowed = {s.name for s in specs}
        prompt = system_prompt(self.rt, self.handle.meta.workspace)
        for step in range(1, self.settings.max_steps + 1):
            try:
                built = await self._build(prompt, tools, step)
            except ContextTooLarge as exc:
                self._append(role="assistant", status="error", content="", meta={"error": str(exc),
                                                                                 "kind": "context"})
                self.turn.emit("error", kind="context", message=str(exc))
                return "error"
            reply: ModelReply | None = None
            self.last_manifest = built.manifest
            try:
                reply = await self._call_model(built.messages, built.tools)
            finally:  # also when cancelled: what was sent is recorded
                self._finish_manifest(built.manifest, reply)
            if reply is None:
                return "error"
            if not reply.tool_calls:
                rec = self._append(role="assistant", content=reply.content, model=reply.model or self.rt.model.name,
                                   usage=reply.usage, provider_fields=reply.provider_fields)
                self.turn.emit("message.completed", seq=rec.seq, content=rec.content, model=rec.model,
                               usage=msgspec.to_builtins(rec.usage) if rec.usage else None)
                return "ok"
            calls = _unique_ids(reply.tool_calls)
            self._append(role="assistant", content=reply.content, tool_calls=calls,
                         model=reply.model or self.rt.model.name, usage=reply.usage,
                         provider_fields=reply.provider_fields)
            cap = self.rt.offload_capability(self.user, self.handle.meta.workspace, specs)
            await self._run_tools(calls, cap)
        rec = self._append(role="assistant", status="error",
                           content=f"I stopped after {self.settings.max_steps} tool rounds without a final answer.",
                           meta={"error": "step_limit"})
        self.turn.emit("error", kind="step_limit", message=rec.content)
        return "error"

    async def _build(self, prompt: str, tools: list[dict[str, Any]], step: int):
        """The request for this step, with the summary (and memory) as the preamble. When
        uncovered records would leave the window, the summary is made first (no gap)."""
        rt, d = self.rt, self.handle.dir
        summaries = rt.settings.summary.enabled
        extra = self.rt.memory_preamble(self.user, self.handle)
        for attempt in range(2):
            summary = rt.summaries.store.load_current(d, self.epoch) if summaries else None
            preamble_parts = [render_summary(summary)] if summary else []
            memory_ids: list[str] = []
            if extra:
                preamble_parts.append(extra[0])
                memory_ids = extra[1]
            built = rt.context.build(
                thread_dir=d, model=rt.model.name, system_prompt=prompt, tools=tools,
                turn_id=self.turn.turn_id, step=step, preamble="\n\n".join(preamble_parts) or None,
                preamble_info={"covers_through_seq": summary.covers_through_seq, "epoch": summary.epoch}
                if summary else None, memory_facts=memory_ids,
                covered_through=(summary.covers_through_seq if summary else 0) if summaries else None,
                uncovered_allowance=rt.settings.summary.uncovered_allowance, accept_gap=attempt == 1)
            if not built.needs_summary:
                return built
            await rt.summaries.refresh(d, built.uncovered_through, self.epoch, synchronous=True)
        return built

    def _after_reply(self) -> None:
        """Schedule the summary refresh when due; the reply never waits for it."""
        m = getattr(self, "last_manifest", None)
        if m is None or not self.rt.settings.summary.enabled:
            return
        upto = max(m.trimmed_through_seq, m.over_budget_through_seq)
        if self.rt.summaries.due(self.handle.dir, upto, m.water):
            self.rt.summaries.schedule(self.handle.dir, upto, self.epoch)

    async def _call_model(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply | None:
        parts: list[str] = []
        try:
            async for ev in self.rt.model.stream(messages, tools):
                if isinstance(ev, ModelDelta):
                    parts.append(ev.text)
                    self.turn.emit("message.delta", text=ev.text)
                elif isinstance(ev, ModelReply):
                    return ev
            raise ModelError("the model stream ended without a reply")
        except asyncio.CancelledError:
            self._append(role="assistant", content="".join(parts), status="cancelled",
                         model=self.rt.model.name)
            raise
        except ModelError as exc:
            self._append(role="assistant", content="".join(parts), status="error",
                         model=self.rt.model.name, meta={"error": str(exc), "kind": type(exc).__name__})
            self.turn.emit("error", kind="model", message=str(exc))
            return None

    async def _run_tools(self, calls: list[ToolCall], cap: OffloadCapability) -> None:
        recorded: set[str] = set()

        async def one(call: ToolCall) -> None:
            self.turn.emit("tool.started", call_id=call.id, name=call.name, arguments=call.arguments)
            started = time.perf_counter()
            ctx = ToolContext(
                workspace=self.handle.meta.workspace, user=self.user.id, thread=self.handle.id,
                permissions=self.user.permission_set,
                workspace_dir=self.rt.layout.workspace_dir(self.handle.meta.workspace),
                thread_dir=self.handle.dir, call_id=call.id, epoch=self.epoch,
                extra={"user_seq": self.user_seq, "after_tool_output": self.tool_output_seen,
                       "user_asked": True, "project": getattr(self.handle.meta, "project", None)},
            )
            try:
                if call.name not in self.allowed:
                    # hidden by the workspace, or not permitted: same answer as an unknown tool
                    result = ToolResult(f"unknown tool {call.name!r} (or not available here); available tools: "
                                        f"{', '.join(sorted(self.allowed)) or 'none'}", is_error=True)
                else:
                    result = await asyncio.wait_for(
                        self.rt.tools.run(call.name, call.arguments, ctx), self.settings.tool_timeout_s
                    )
            except asyncio.TimeoutError:
                result = ToolResult(f"{call.name} timed out after {self.settings.tool_timeout_s:g} s", is_error=True)
            tool = self.rt.tools.get(call.name, self.handle.meta.workspace)
            outcome = await self.rt.offload.process(tool.spec if tool else None, call.arguments, result, ctx, cap)
            result = outcome.result
            if outcome.artifact is not None:
                self.turn.emit("artifact.created", call_id=call.id, **artifact_ref(outcome.artifact))
            for produced in result.meta.get("artifacts", ()):  # charts and files written by code
                self.turn.emit("artifact.created", call_id=call.id, artifact=produced)
            ms = round((time.perf_counter() - started) * 1000, 1)
            rec = self._append(role="tool", tool_call_id=call.id, name=call.name, content=result.content,
                               status="error" if result.is_error else "ok",
                               meta={"duration_ms": ms, **result.meta} if result.meta else {"duration_ms": ms})
            recorded.add(call.id)
            self.turn.emit("tool.finished", call_id=call.id, name=call.name, ok=not result.is_error,
                           seq=rec.seq, duration_ms=ms, preview=result.content[:PREVIEW_CHARS],
                           **({"meta": result.meta} if result.meta else {}))

        try:
            await asyncio.gather(*(one(c) for c in calls))
            self.tool_output_seen = True
        except asyncio.CancelledError:
            for call in calls:
                if call.id not in recorded:
                    self._append(role="tool", tool_call_id=call.id, name=call.name, status="cancelled",
                                 content="cancelled: the user stopped the turn before this call finished")
            raise

    def _finish_manifest(self, manifest, reply: ModelReply | None) -> None:
        """Record the request's manifest with the provider's usage, and calibrate token counts."""
        if reply is not None and reply.usage is not None and reply.usage.prompt_tokens:
            u = reply.usage
            manifest.usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                              "cached_tokens": u.cached_tokens}
            manifest.cache_ratio = round(u.cached_tokens / u.prompt_tokens, 4)
            if getattr(self.rt.model, "reports_real_usage", True):
                self.rt.calibration.observe(self.rt.model.name, manifest.estimated_raw_tokens, u.prompt_tokens)
        elif reply is None:
            manifest.error = "no reply"
        try:
            with self.log.lock():
                if current_epoch(self.handle.dir) == self.epoch:  # not after a clear
                    append_manifest(self.handle.dir / "context.jsonl", manifest)
        except OSError:
            log.warning("could not write the context manifest of %s", self.handle.id)


def _unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """Give every call a distinct, valid id (some servers send none or repeat them)."""
    from datadesk.domain.ids import ID_PATTERN, new_id

    seen: set[str] = set()
    out = []
    for c in calls:
        cid = c.id if c.id and ID_PATTERN.fullmatch(c.id) and c.id not in seen else new_id("call_")
        seen.add(cid)
        out.append(ToolCall(id=cid, name=c.name, arguments=c.arguments))
    return out


async def start_turn(rt: Runtime, handle: ThreadHandle, user: User, text: str, background: bool) -> RunningTurn:
    """Reserve the thread (409/429 if not possible) and start the turn task."""
    turn = rt.turns.reserve(handle.id, user.id)
    turn.background = background
    loop = TurnLoop(rt, turn, handle, user)

    async def runner() -> None:
        try:
            await loop.run(text)
        finally:
            rt.turns.release(turn)

    turn.task = asyncio.create_task(runner(), name=f"turn-{turn.turn_id}")
    return turn
