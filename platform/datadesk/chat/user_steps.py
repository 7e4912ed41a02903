"""A step the user runs: one `sql_query` or `python` call made on the analyst's behalf, outside
the model (an edited tool card re-run, the SQL scratchpad).

It runs like a model's call, through the same pieces of the turn loop (chat/loop.py
`TurnLoop._run_tools`): the tool registry (permissions, argument checks, query slots, per-user
caps, the thread's warm kernel), the offload pipeline (a large result becomes an artifact with
its preview and notice) and the same events (`tool.started`, `tool.progress`, `tool.finished`,
`artifact.created`, then `done`) on the thread's event stream. It holds the thread like a turn
(a running turn: TurnConflict, HTTP 409), so Stop and a second tab work on it.

Recorded in `log.jsonl` as the pair a model's call leaves: an assistant record with the call,
marked `meta.via = "user"` (and `meta.edited_from`, the call id of the card it was edited
from: a call of the active branch, never one an edit or regenerate left behind), then its tool record, as the loop writes it. Older code reads it as an ordinary call pair. The
context builder adds USER_STEP_NOTE to that assistant message, so the model's next request
carries the step, its result (or the offload notice) and who ran it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from datadesk.chat.loop import LOST_MESSAGE, TurnLoop, TurnServices
from datadesk.chat.turns import RunningTurn, TurnRegistry
from datadesk.domain.branches import marked_newest_first
from datadesk.domain.events import TurnDone, TurnError
from datadesk.domain.ids import ID_PATTERN, new_id
from datadesk.domain.records import AssistantRecordMeta, ToolCall, record_meta
from datadesk.domain.users import User
from datadesk.store.files import StoreWriteError
from datadesk.store.interfaces.errors import ClusterUnavailable
from datadesk.store.interfaces.threads import TurnFenced
from datadesk.store.threadlog import LogClosed
from datadesk.store.threads import Thread
from datadesk.tools.arguments import InvalidArguments, parse_arguments

log = logging.getLogger(__name__)

USER_TOOLS = ("sql_query", "python")
INPUT_FIELD = {"sql_query": "sql", "python": "code"}
MAX_INPUT_CHARS = 100_000  # of the SQL or the code of one step
VIA = "user"
EDIT_SCAN_RECORDS = 5_000  # how far back `edited_from` is looked for (newest first)


class StepRefused(ValueError):
    """A step that cannot run: `status` is the HTTP status (403, 404, 413, 422), the message names
    what was wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_step(services: TurnServices, thread: Thread, user: User, tool: str, arguments: Any,
               edited_from: str | None = None) -> ToolCall:
    """The call the step makes, or StepRefused saying why not."""
    if tool not in USER_TOOLS:
        raise StepRefused(422, f"tool: {tool!r} cannot be run as a step; one of {', '.join(USER_TOOLS)}")
    found = services.tools.get(tool, thread.meta.workspace)
    if found is None:
        raise StepRefused(422, f"tool: {tool} is not set up on this server")
    permitted = {s.name for s in services.policy.permitted_tools(user, thread.meta.workspace)}
    if tool not in permitted:
        needed = found.spec.permission or services.policy.workspaces.config(
            thread.meta.workspace).tool_permissions.get(tool)
        raise StepRefused(403, f"running {tool} needs the {needed!r} permission" if needed
                          else f"{tool} is turned off in this workspace")
    if not isinstance(arguments, dict):
        raise StepRefused(422, "arguments: expected a JSON object")
    field = INPUT_FIELD[tool]
    text = arguments.get(field)
    if not isinstance(text, str) or not text.strip():
        raise StepRefused(422, f"arguments.{field}: required, a non-empty string")
    if len(text) > MAX_INPUT_CHARS:
        raise StepRefused(413, f"arguments.{field} is too long ({len(text):,} chars; limit {MAX_INPUT_CHARS:,})")
    known = set((found.spec.parameters.get("properties") or {}).keys())
    extra = sorted(set(arguments) - known) if known else []
    if extra:
        raise StepRefused(422, f"arguments.{extra[0]}: unknown field; {tool} takes {', '.join(sorted(known))}")
    if found.arguments is not None:
        try:
            parse_arguments(tool, arguments, found.arguments)
        except InvalidArguments as exc:
            raise StepRefused(422, f"arguments: {exc}") from None
    if edited_from is not None:
        _check_edited_from(thread, edited_from)
    return ToolCall(id=new_id("call_"), name=tool, arguments=msgspec.json.encode(arguments).decode())


def _check_edited_from(thread: Thread, call_id: str) -> None:
    """`edited_from` names a call of the active branch: 404 when the thread has no such call,
    422 when it is a step of an earlier branch (an edit or a regenerate left it behind: a step
    edited from there would continue a branch the model no longer sees)."""
    if not isinstance(call_id, str) or not ID_PATTERN.fullmatch(call_id):
        raise StepRefused(422, "edited_from: not a valid call id")
    for n, (rec, active) in enumerate(marked_newest_first(thread.log.newest_first())):
        if any(c.id == call_id for c in rec.tool_calls or ()):
            if active:
                return
            raise StepRefused(422, f"edited_from: call {call_id!r} (record #{rec.seq}) is a step of an earlier "
                                   "branch, left behind by an edited or regenerated question: edit a step of "
                                   "the current branch instead")
        if n >= EDIT_SCAN_RECORDS:
            break
    raise StepRefused(404, f"edited_from: there is no call {call_id!r} in this thread")


async def run_user_step(services: TurnServices, turns: TurnRegistry, thread: Thread, user: User, tool: str,
                        arguments: dict[str, Any], edited_from: str | None = None,
                        background: bool = True) -> RunningTurn:
    """Check the step (StepRefused), take the thread (TurnConflict: 409, TooManyTurns: 429; DiskLow
    with too little disk) and start it; its events are on the returned turn's journal."""
    call = check_step(services, thread, user, tool, arguments, edited_from)
    if services.disk is not None:
        services.disk.check("a step")
    turn = turns.reserve(thread.id, user.id, events_at=thread.events_path)
    turn.background = background
    return turns.launch(turn, _run(TurnLoop(services, turn, thread, user), call, edited_from), "step")


async def _run(loop: TurnLoop, call: ToolCall, edited_from: str | None) -> None:
    """The step: its call record, the call (as the model's calls run), then `done`."""
    status = "ok"
    turn = loop.turn
    try:
        loop.allowed = {call.name}
        loop.tool_output_seen = True  # what the step returns is tool output, not the user's words
        loop._append(role="assistant", content="", tool_calls=[call],
                     meta=record_meta(AssistantRecordMeta(via=VIA, edited_from=edited_from)))
        cap = loop.services.policy.offload_capability(loop.user, loop.thread.meta.workspace)
        await loop._run_tools([call], cap)
    except asyncio.CancelledError:
        status = "cancelled"
        turn.emit(TurnError(kind="cancelled", message="the step was cancelled; what completed is kept"))
    except (TurnFenced, LogClosed, StoreWriteError, ClusterUnavailable) as exc:
        status = "error"
        loop.fenced = isinstance(exc, TurnFenced)
        kind = ("lost" if loop.fenced else "thread_gone" if isinstance(exc, LogClosed)
                else "disk" if isinstance(exc, StoreWriteError) else "database")
        turn.emit(TurnError(kind=kind, message=LOST_MESSAGE if loop.fenced else str(exc)))
    except Exception as exc:  # never lose the stream without saying why
        status = "error"
        log.exception("step %s failed", turn.turn_id)
        turn.emit(TurnError(kind="internal", message=f"internal error ({type(exc).__name__})"))
    finally:
        ending = asyncio.ensure_future(asyncio.to_thread(loop._end_records))
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            pass
        turn.emit(TurnDone(turn_id=turn.turn_id, status=status))


def is_user_step(meta: dict[str, Any] | None) -> bool:
    """Whether a record (its stored `meta`) belongs to a step the user ran."""
    return (meta or {}).get("via") == VIA


__all__ = ["StepRefused", "check_step", "is_user_step", "run_user_step"]
