"""The skeleton's context: system prompt + the newest records within a token budget.

Records are read from the tail of the log (never the whole file), selected
newest-first until the budget is spent, then put back in order. The window
always starts at a user message and never separates a tool call from its
results: an assistant call whose result is missing gets a synthetic result
(providers reject unanswered calls), and a result whose call fell out of the
window is dropped.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import msgspec

from datadesk.domain.records import Record
from datadesk.store.threadlog import ThreadLog

BASE_RULES_VERSION = "base-rules/1"
BASE_RULES = """\
You are DataDesk, a careful data analyst working for the user.
- Answer from data: query the workspace warehouse with the `sql_query` tool \
(one read-only DuckDB statement per call; use SHOW TABLES and DESCRIBE first \
when unsure of the schema).
- Aggregate in SQL rather than pulling raw rows; never invent numbers. If a \
result says it was truncated or is a preview, say so and narrow the query.
- Be concise; show key numbers in Markdown tables; state assumptions."""

NO_RESULT = "no result recorded: the call did not complete"


class ContextManifest(msgspec.Struct, omit_defaults=True):
    """What went into one model request (kept in `context.jsonl`, one line per request)."""

    ts: float
    turn_id: str
    step: int
    model: str
    rules_version: str
    first_seq: int
    last_seq: int
    records: int
    messages: int
    tools: list[str]
    estimated_tokens: int
    dropped_orphans: int = 0
    synthetic_results: int = 0


def record_messages(rec: Record) -> dict[str, Any] | None:
    """One Chat Completions message for a record (None for records with nothing to say)."""
    if rec.role == "user":
        return {"role": "user", "content": rec.content}
    if rec.role == "assistant":
        content = rec.content
        if rec.status == "cancelled":
            content = (content + "\n[reply stopped by the user]").strip()
        if not content and not rec.tool_calls:
            return None  # a failed step with nothing to replay
        msg: dict[str, Any] = {"role": "assistant", "content": content or None}
        if rec.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in rec.tool_calls
            ]
        return msg
    return {"role": "tool", "tool_call_id": rec.tool_call_id or "", "content": rec.content}


class TokenCache:
    """Token counts of records, which never change once written: counted once, not every step.

    Bounded LRU keyed by (log path, seq, ts); without it, a long thread re-tokenizes
    its whole window (tool results included) on every model call.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._data: OrderedDict[tuple[str, int, float], int] = OrderedDict()
        self._lock = threading.Lock()

    def cost(self, log: ThreadLog, rec: Record, count: Callable[[list[dict[str, Any]]], int]) -> int:
        key = (str(log.path), rec.seq, rec.ts)
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
                return hit
        msg = record_messages(rec)
        value = count([msg]) if msg else 0
        with self._lock:
            self._data[key] = value
            if len(self._data) > self.capacity:
                self._data.popitem(last=False)
        return value


TOKEN_CACHE = TokenCache()


def select_window(
    log: ThreadLog, budget_tokens: int, count: Callable[[list[dict[str, Any]]], int]
) -> tuple[list[Record], list[dict[str, Any]], dict[str, int]]:
    """Newest records that fit `budget_tokens`, as (records, messages, stats)."""
    want = 64
    while True:
        records = log.tail(want)
        enough = len(records) < want  # whole log read
        total = 0
        start = len(records)
        for i in range(len(records) - 1, -1, -1):
            cost = TOKEN_CACHE.cost(log, records[i], count)
            if total + cost > budget_tokens and start < len(records):
                enough = True
                break
            total += cost
            start = i
        if enough or want >= 1 << 20:
            break
        want *= 4
    window = records[start:]
    # start at a user message
    while window and window[0].role != "user":
        window = window[1:]
    kept, messages, stats = _pair(window)
    stats["history_tokens"] = sum(TOKEN_CACHE.cost(log, r, count) for r in kept)
    return kept, messages, stats


def _pair(window: list[Record]) -> tuple[list[Record], list[dict[str, Any]], dict[str, int]]:
    call_ids = {c.id for r in window if r.tool_calls for c in r.tool_calls}
    results = {r.tool_call_id: r for r in window if r.role == "tool"}
    stats = {"dropped_orphans": 0, "synthetic_results": 0}
    messages: list[dict[str, Any]] = []
    kept: list[Record] = []
    for rec in window:
        if rec.role == "tool":
            # emitted right after its call (parallel results may be logged in any order)
            if rec.tool_call_id not in call_ids:
                stats["dropped_orphans"] += 1
            continue
        msg = record_messages(rec)
        if msg is None:
            continue
        kept.append(rec)
        messages.append(msg)
        for call in rec.tool_calls or ():
            res = results.get(call.id)
            if res is None:
                stats["synthetic_results"] += 1
                messages.append({"role": "tool", "tool_call_id": call.id, "content": NO_RESULT})
            else:
                kept.append(res)
                messages.append(record_messages(res))  # type: ignore[arg-type]
    return kept, messages, stats


def build_messages(
    system_prompt: str, log: ThreadLog, budget_tokens: int, count: Callable[[list[dict[str, Any]]], int]
) -> tuple[list[dict[str, Any]], list[Record], dict[str, int]]:
    records, history, stats = select_window(log, budget_tokens, count)
    system = {"role": "system", "content": system_prompt}
    stats["estimated_tokens"] = count([system]) + stats.pop("history_tokens")
    return [system, *history], records, stats


def manifest(turn_id: str, step: int, model: str, records: list[Record], messages: list[dict[str, Any]],
             tools: list[str], stats: dict[str, int]) -> ContextManifest:
    return ContextManifest(
        ts=time.time(), turn_id=turn_id, step=step, model=model, rules_version=BASE_RULES_VERSION,
        first_seq=min((r.seq for r in records), default=0), last_seq=max((r.seq for r in records), default=0),
        records=len(records), messages=len(messages), tools=tools, **stats,
    )
