"""`ScriptedModel`: a deterministic ChatModel that plays a script, and the demo model.

Tests use it to drive the chat loop without a network: each `stream()` call
plays the next step. A step is

- a `str`: a text reply, streamed in `chunk_size` pieces;
- a `ScriptStep`: text and/or tool calls, with optional `delay_s` between
  chunks (cancel tests), a `gate` event awaited first (ordering tests), and an
  `error` raised after the text (failure tests);
- a callable `(messages, tools) -> ScriptStep | str` (sync or async), to react
  to tool results already in the context.

When the script runs out, `then` is played (default: "(script finished)").
Every call's messages and tools are recorded in `.calls` / `.tools_seen`.

`demo_model()` here is the one-query demo: one `sql_query` over the demo
warehouse chosen from the user's words, then a description of the result.
The model used when no LLM is configured is llm/demo.py's, which runs
scripted analyses for its suggested questions and this for the others.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, Union

from datadesk.domain.records import ToolCall, Usage
from datadesk.llm.base import ModelDelta, ModelEvent, ModelReply
from datadesk.llm.reply_json import extract_json
from datadesk.llm.tokens import count_messages, count_tokens, count_tool_call

FINISHED_TEXT = "(script finished)"


@dataclass
class ScriptStep:
    """One scripted reply: text and/or tool calls, plus test knobs."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    delay_s: float = 0.0  # sleep before each chunk, so a cancel can land mid-reply
    gate: asyncio.Event | None = None  # awaited before anything is streamed
    error: BaseException | None = None  # raised after the text chunks
    usage: Usage | None = None  # default: estimated with tokens.py
    provider_fields: dict[str, Any] | None = None
    finish_reason: str | None = None


StepFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Union["ScriptStep", str, Awaitable[Any]]]
Step = Union[str, ScriptStep, StepFn]


def tool_step(name: str, arguments: dict[str, Any] | str, text: str = "", call_id: str | None = None) -> ScriptStep:
    """A step that asks for one tool call (arguments as a dict or raw JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ScriptStep(text=text, tool_calls=[ToolCall(id=call_id or f"call_{uuid.uuid4().hex[:12]}",
                                                      name=name, arguments=args)])


class ScriptedModel:
    """A ChatModel that plays `steps` in order, one per `stream()` call."""

    def __init__(
        self,
        steps: Sequence[Step] = (),
        name: str = "scripted",
        is_demo: bool = False,
        chunk_size: int = 8,
        then: Step | None = None,
        max_recorded: int | None = None,
    ) -> None:
        self.steps = list(steps)
        self.name = name
        self.reports_real_usage = False  # its usage is an estimate: never calibrate against it
        self.is_demo = is_demo
        self.chunk_size = max(1, chunk_size)
        self.then: Step = then if then is not None else FINISHED_TEXT
        self.max_recorded = max_recorded  # a long-lived demo model must not grow forever
        self.calls: list[list[dict[str, Any]]] = []
        self.tools_seen: list[list[dict[str, Any]]] = []
        self.formats: list[dict[str, Any] | None] = []  # the response_format of each call
        self._index = 0

    @property
    def remaining(self) -> int:
        return max(0, len(self.steps) - self._index)

    async def aclose(self) -> None:
        return None

    def _chunks(self, text: str) -> list[str]:
        return [text[i : i + self.chunk_size] for i in range(0, len(text), self.chunk_size)]

    async def _resolve(self, step: Step, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ScriptStep:
        if callable(step) and not isinstance(step, ScriptStep):
            step = step(messages, tools)
            if inspect.isawaitable(step):
                step = await step
        if isinstance(step, str):
            return ScriptStep(text=step)
        if not isinstance(step, ScriptStep):
            raise TypeError(f"script step must be str, ScriptStep or callable, got {type(step).__name__}")
        return step

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     response_format: dict[str, Any] | None = None) -> AsyncIterator[ModelEvent]:
        """Play the next step: ModelDelta chunks, then one ModelReply (`response_format` is recorded)."""
        # Record a copy: callers mutate their context list after the call.
        self.calls.append(copy.deepcopy(messages))
        self.formats.append(response_format)
        self.tools_seen.append(copy.deepcopy(tools or []))
        if self.max_recorded is not None and len(self.calls) > self.max_recorded:
            del self.calls[0], self.tools_seen[0], self.formats[0]
        # Take the step before any await so concurrent calls get distinct steps.
        if self._index < len(self.steps):
            raw = self.steps[self._index]
            self._index += 1
        else:
            raw = self.then
        step = await self._resolve(raw, messages, tools or [])
        if step.gate is not None:
            await step.gate.wait()
        for piece in self._chunks(step.text):
            if step.delay_s:
                await asyncio.sleep(step.delay_s)
            yield ModelDelta(text=piece)
        if step.error is not None:
            raise step.error
        usage = step.usage
        if usage is None:
            out = count_tokens(step.text) + sum(count_tool_call(c.name, c.arguments) for c in step.tool_calls)
            prompt = count_messages(messages)
            usage = Usage(prompt_tokens=prompt, completion_tokens=out, total_tokens=prompt + out)
        yield ModelReply(
            content=step.text,
            tool_calls=list(step.tool_calls),
            finish_reason=step.finish_reason or ("tool_calls" if step.tool_calls else "stop"),
            usage=usage,
            model=self.name,
            provider_fields=step.provider_fields,
        )


# -- the demo model ---------------------------------------------------------------

DEMO_NAME = "demo (no LLM configured)"
DEMO_BANNER = (
    "**Demo model — no LLM is configured.** To chat with a real model, set "
    "`DATADESK_LLM_BASE_URL`, `DATADESK_LLM_API_KEY` and `DATADESK_LLM_MODEL` "
    "(any OpenAI-compatible endpoint) and restart DataDesk."
)

# (keywords, what the query shows, SQL) over the demo warehouse; first match wins.
_DEMO_QUERIES: list[tuple[tuple[str, ...], str, str]] = [
    (("month",), "total consumption per month",
     "SELECT strftime(ts, '%Y-%m') AS month, round(sum(kwh), 1) AS total_kwh\n"
     "FROM readings GROUP BY 1 ORDER BY 1"),
    (("holiday",), "average consumption on holidays versus other days",
     "SELECT CASE WHEN h.date IS NULL THEN 'other days' ELSE 'holidays' END AS day_type,\n"
     "       round(avg(r.kwh), 2) AS avg_kwh, count(*) AS readings\n"
     "FROM readings r LEFT JOIN holidays h ON CAST(r.ts AS DATE) = h.date\n"
     "GROUP BY 1 ORDER BY 1"),
    (("temperature", "weather", "cold", "hot"), "average consumption by outdoor temperature (5 °C bands)",
     "SELECT CAST(floor(temperature_c / 5) * 5 AS INTEGER) AS temp_band_c,\n"
     "       round(avg(kwh), 2) AS avg_kwh, count(*) AS readings\n"
     "FROM readings GROUP BY 1 ORDER BY 1"),
    (("occupancy", "occupied", "people"), "average consumption by occupancy level",
     "SELECT CAST(floor(occupancy / 10) * 10 AS INTEGER) AS occupancy_band,\n"
     "       round(avg(kwh), 2) AS avg_kwh, count(*) AS readings\n"
     "FROM readings GROUP BY 1 ORDER BY 1"),
    (("hvac", "heating", "cooling"), "average consumption per m² by HVAC type",
     "SELECT hvac_type, round(avg(kwh_per_m2), 2) AS avg_kwh_per_m2, count(*) AS buildings\n"
     "FROM (SELECT b.hvac_type, sum(r.kwh) / max(b.floor_area_m2) AS kwh_per_m2\n"
     "      FROM readings r JOIN buildings b USING (building_id)\n"
     "      GROUP BY b.building_id, b.hvac_type)\n"
     "GROUP BY 1 ORDER BY avg_kwh_per_m2 DESC"),
    (("city", "cities"), "total consumption per city",
     "SELECT b.city, round(sum(r.kwh), 1) AS total_kwh, count(DISTINCT b.building_id) AS buildings\n"
     "FROM readings r JOIN buildings b USING (building_id)\n"
     "GROUP BY 1 ORDER BY total_kwh DESC"),
]
_DEFAULT_QUERY = (
    "the five buildings with the highest total consumption",
    "SELECT b.name, b.city, round(sum(r.kwh), 1) AS total_kwh\n"
    "FROM readings r JOIN buildings b USING (building_id)\n"
    "GROUP BY b.name, b.city ORDER BY total_kwh DESC LIMIT 5",
)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


# a question with one of these words is about the default query (the top buildings)
_DEFAULT_WORDS = ("building", "top", "most", "highest", "largest", "biggest")


def demo_topic(question: str) -> str | None:
    """What the canned query for `question` shows, or None when the question is about none of
    them (the demo then says what it can answer: llm/demo_help.py)."""
    q = question.lower()
    for words, what, _sql in _DEMO_QUERIES:
        if any(w in q for w in words):
            return what
    return _DEFAULT_QUERY[0] if any(w in q for w in _DEFAULT_WORDS) else None


def _pick_query(question: str) -> tuple[str, str]:
    q = question.lower()
    for words, what, sql in _DEMO_QUERIES:
        if any(w in q for w in words):
            return what, sql
    return _DEFAULT_QUERY


def parse_tool_result(content: str) -> dict[str, Any] | None:
    """The `{"columns", "rows"}` object of a tool result, or None.

    The JSON may be followed by a notice line (e.g. "rows truncated"): only
    the first JSON object is decoded (`llm.reply_json`).
    """
    try:
        value = json.loads(extract_json(content))
    except (ValueError, TypeError):
        return None
    if isinstance(value, dict) and isinstance(value.get("columns"), list) and isinstance(value.get("rows"), list):
        return value
    return None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}".rstrip("0").rstrip(".")
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "" if v is None else str(v).replace("|", "\\|")


def _describe(what: str, result: dict[str, Any] | None, raw: str) -> str:
    if result is None:
        snippet = raw.strip()[:600] or "(empty)"
        return f"{DEMO_BANNER}\n\nI queried {what}, but the tool answered:\n\n```\n{snippet}\n```"
    cols, rows = [str(c) for c in result["columns"]], result["rows"]
    if not rows:
        return f"{DEMO_BANNER}\n\nI queried {what}; the query returned no rows."
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows[:10]:
        cells = list(row) if isinstance(row, (list, tuple)) else [row]
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    first = list(rows[0]) if isinstance(rows[0], (list, tuple)) else [rows[0]]
    pairs = ", ".join(f"{c} **{_fmt(v)}**" for c, v in zip(cols, first))
    more = f" (showing 10 of {len(rows)} rows)" if len(rows) > 10 else ""
    return (f"{DEMO_BANNER}\n\nI queried {what}{more}:\n\n" + "\n".join(lines)
            + f"\n\nThe first row: {pairs}.")


def _demo_step(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ScriptStep:
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    what, sql = _pick_query(question)
    results = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
    if results:  # the query ran: describe it (one round only, never loop)
        raw = _text(results[-1].get("content"))
        return ScriptStep(text=_describe(what, parse_tool_result(raw), raw))
    names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
    if "sql_query" not in names:
        return ScriptStep(text=f"{DEMO_BANNER}\n\n(The `sql_query` tool is not available here, so I cannot look at the data.)")
    return ScriptStep(
        text=f"Demo model: querying {what}.\n\n",
        tool_calls=[ToolCall(id=f"call_demo_{uuid.uuid4().hex[:12]}", name="sql_query",
                             arguments=json.dumps({"sql": sql}))],
    )


def demo_model() -> ScriptedModel:
    """The one-query demo: a canned query per question, described. What `serve` runs without an
    LLM is llm/demo.py's `demo_model`, which uses this for free questions and adds the analyses."""
    return ScriptedModel(steps=(), name=DEMO_NAME, is_demo=True, chunk_size=24, then=_demo_step, max_recorded=20)
