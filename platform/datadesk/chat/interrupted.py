"""Finishing a turn that stopped without ending: the process running it died mid-turn.

One rule, whatever stopped the turn (a SIGKILL, the OOM killer, a power cut; or a host that
left the cluster: cluster/takeover.py, with `kind` HOST_LOST, HOST_NOTICE and the fence of its
takeover). The caller makes sure nothing runs the turn any more and holds the thread while
this runs (chat/recovery.py: the thread's turn lock, so no turn starts meanwhile and no
second finisher works on it; the cluster: the thread's advisory lock and a bumped fence); the
turn is read from its own event journal (`events.jsonl`, whose header names it, or its
`turn_events` rows) and from the log:

- the turn's records already in `log.jsonl` are read back first, so nothing is recorded twice;
- every tool call of the turn without a tool record gets one: status `error`, `meta.status`
  INTERRUPTED, TOOL_NOTICE as its content, so the next request pairs every call with a result;
- unless the turn's answer is recorded (its last record is a reply without tool calls, or a
  step that was cancelled), the answer so far is: the `message.delta` text after the last
  step that reached the log, as an assistant record with status `error`, `meta.kind`
  INTERRUPTED (or HOST_LOST) and the notice in `meta.error`. The UI shows the notice under the text with a
  Retry button; the model sees the reply marked as cut off (context/builder.py);
- the journal then ends like any turn: a `tool.finished` per interrupted call, `error` (of
  that kind) and `done` (status `error`), so a client that re-attaches (or follows, on any
  host) gets the end.

Text pieces of the last COALESCE_S + DELTA_FLUSH_S before the crash (journal.py: gathered into
one event, then written to the file; about 0.3 s) did not reach the journal, so the recorded
answer may lack the last words a live client saw.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from datadesk.chat.journal import EventFile, append_to_file, read_event_file
from datadesk.domain.events import ToolFinished, TurnDone, TurnError
from datadesk.domain.records import (CUT_OFF_KINDS, INTERRUPTED, AssistantRecordMeta, Record, ToolCall,
                                     ToolRecordMeta, record_meta)
from datadesk.store.threads import Thread

log = logging.getLogger(__name__)

ANSWER_NOTICE = "the server stopped while this answer was being written; what you see is what was written"
TOOL_NOTICE = "the server stopped while this tool was running; it did not finish"
# the same, when the host that ran the turn left the cluster and another one finished it
HOST_NOTICE = "this turn stopped with the server that ran it; what was recorded before is kept"
HOST_TOOL_NOTICE = "the server running this tool stopped; it did not finish"
# The dead process numbered events that never reached the file (text pieces not flushed yet,
# events past the journal's bound); the end is numbered past them, so that a client that saw
# them live, and re-attaches after its last id, still gets it.
LOST_EVENTS = 1_000_000
TS_SLACK_S = 60.0  # records of the turn are not older than its journal (clocks may step a little)


@dataclass
class Finished:
    """What finishing one turn did: the records it added and the events that ended the journal."""

    thread_id: str
    turn_id: str
    answer_chars: int | None = None  # the partial answer recorded (None: the answer was in the log)
    tools: list[str] = field(default_factory=list)  # call ids marked interrupted
    records: list[int] = field(default_factory=list)  # seqs appended
    events: int = 0  # events added to the journal


# how a finisher ends a journal: (kept turn, events, number of the first) -> the events written
WriteEnd = Callable[[EventFile, list[tuple[str, dict[str, Any]]], int], Any]


def finish_interrupted(thread: Thread, kept: EventFile, notice: str = ANSWER_NOTICE,
                       tool_notice: str = TOOL_NOTICE, *, kind: str = INTERRUPTED, fence: int | None = None,
                       write_end: WriteEnd | None = None) -> Finished:
    """Finish turn `kept.turn_id` of `thread` from its journal `kept` (see the module doc). The
    caller holds the thread and knows that nothing runs the turn; a journal that ended already
    is left alone. `kind`: of the error record and event; `fence`: carried by every append (a
    cluster takeover's); `write_end`: where the journal's end goes (default: the event file)."""
    done = Finished(thread.id, kept.turn_id)
    if kept.ended:
        return done
    if write_end is None:
        write_end = lambda k, evs, first: append_to_file(k, thread.events_path, evs, first)  # noqa: E731
    epoch = thread.meta.epoch if thread.meta is not None else None
    records = turn_records(thread, kept.turn_id, float(kept.header.get("started") or 0))
    events: list[tuple[str, dict[str, Any]]] = []
    for call in unanswered_calls(records):
        rec = _append(thread, epoch, fence, role="tool", turn_id=kept.turn_id, tool_call_id=call.id, name=call.name,
                      status="error", content=tool_notice,
                      meta=record_meta(ToolRecordMeta(duration_ms=0.0, status=INTERRUPTED)))
        done.tools.append(call.id)
        done.records.append(rec.seq)
        events.append((ToolFinished.type, msgspec.to_builtins(ToolFinished(
            call_id=call.id, name=call.name, ok=False, seq=rec.seq, duration_ms=0.0, preview=tool_notice,
            meta=ToolRecordMeta(status=INTERRUPTED)))))
    if records and not answer_recorded(records):
        # after a tool step the log has that step's text: what follows it is the answer so far
        text = answer_so_far(kept) if records[-1].role != "assistant" else ""
        rec = _append(thread, epoch, fence, role="assistant", turn_id=kept.turn_id, status="error", content=text,
                      meta=record_meta(AssistantRecordMeta(error=notice, kind=kind)))
        done.answer_chars = len(text)
        done.records.append(rec.seq)
    status = "error"
    last = records[-1] if records else None
    if done.records or last is None or _interrupted(last):
        events.append((TurnError.type, msgspec.to_builtins(TurnError(kind=kind, message=notice))))
    else:  # the answer was recorded, only the journal's end was lost: the turn ends as it did
        status = last.status
    events.append((TurnDone.type, msgspec.to_builtins(TurnDone(turn_id=kept.turn_id, status=status))))
    if done.records:
        thread.end_turn()  # store.fsync = "turn": the records reach the disk now, as a turn's do
    write_end(kept, events, kept.last_n + LOST_EVENTS)
    done.events = len(events)
    log.warning("finished turn %s of thread %s, cut off when its server stopped (%s): %s, %d tool call(s) marked "
                "interrupted, %d record(s) added", kept.turn_id, thread.id, kind,
                "answer already recorded" if done.answer_chars is None
                else f"{done.answer_chars:,} characters of the answer kept", len(done.tools), len(done.records))
    return done


def finish_thread(thread: Thread) -> Finished | None:
    """Read the thread's journal and finish its turn if it did not end (None: nothing to do).
    The caller holds the thread and knows that nothing runs its turn."""
    kept = read_event_file(thread.events_path)
    if kept is None or kept.ended:
        return None
    return finish_interrupted(thread, kept)


def turn_records(thread: Thread, turn_id: str, started: float = 0.0) -> list[Record]:
    """The records of turn `turn_id`, oldest first, read from the end of the log (the turn is
    the thread's latest: its user record, or a record older than the turn, ends the search)."""
    found: list[Record] = []
    for rec in thread.log.newest_first():
        if rec.turn_id == turn_id:
            found.append(rec)
            if rec.role == "user":
                break
        elif found or rec.ts < started - TS_SLACK_S:
            break
    return found[::-1]


def unanswered_calls(records: list[Record]) -> list[ToolCall]:
    """The tool calls of `records` that have no tool record among them, in call order."""
    answered = {r.tool_call_id for r in records if r.role == "tool"}
    return [c for r in records if r.role == "assistant" for c in r.tool_calls or () if c.id not in answered]


def answer_recorded(records: list[Record]) -> bool:
    """Whether the turn's end is in the log: a reply without tool calls, or a cancelled step
    (a cancel always ends the turn)."""
    last = records[-1]
    return last.status == "cancelled" or (last.role == "assistant" and not last.tool_calls)


def answer_so_far(kept: EventFile) -> str:
    """The text streamed after the journal's last event that is not text: the model's reply
    being written when the turn stopped."""
    parts: list[str] = []
    for ev in reversed(kept.events):
        if ev.type != "message.delta":
            break
        parts.append(str(ev.data.get("text", "")))
    return "".join(reversed(parts))


def _interrupted(rec: Record) -> bool:
    return rec.role == "assistant" and (rec.meta or {}).get("kind") in CUT_OFF_KINDS


def _append(thread: Thread, epoch: int | None, fence: int | None, **fields: Any) -> Record:
    # refused (LogClosed) when the thread was cleared since: nothing lands in a cleared chat;
    # with a fence (TurnFenced) when another host took the thread meanwhile
    make = lambda seq: Record(seq=seq, ts=time.time(), **fields)  # noqa: E731
    if fence is None:  # the embedded Thread's append has no fence before a turn
        return thread.append(make, epoch=epoch)
    return thread.append(make, epoch=epoch, fence=fence)

