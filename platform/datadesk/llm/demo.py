"""The demo model: what answers when no LLM is configured.

It shows the real flow of the product, not canned text. A suggested question (or one naming
its topic, `demo_plans.pick_plan`) runs a scripted analysis for real: `sql_query` over the
demo warehouse (a large result, offloaded to a Parquet artifact), `python` over the full
artifact (a chart, a Markdown report in /outputs, its numbers printed as `DEMO_RESULT`), and
a final answer citing those numbers. An uploaded table is profiled the same way. A question on
the topic of a canned query gets that query and a description of its result (llm/scripted.py);
any other (an off-script follow-up) gets what the demo can answer and how to connect a model
(llm/demo_help.py), never an unrelated table.

Each step is decided from the context alone (what the tools answered since the question), so
the model keeps no state and survives re-attaching, retries and concurrent threads. It says it
is a demo once per thread, in its first answer; the UI's banner says it once per page.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from datadesk.domain.records import ToolCall
from datadesk.llm.demo_plans import (PLANS, RESULT_MARK, SUGGESTED_QUESTIONS, UPLOAD_CODE, DemoPlan,
                                     pick_plan, plan_code, upload_answer)
from datadesk.llm.scripted import (DEMO_BANNER, DEMO_NAME, ScriptedModel, ScriptStep, _demo_step, _describe,
                                   _text, demo_topic, parse_tool_result)
from datadesk.llm.demo_help import off_script_answer

__all__ = ["demo_model", "demo_step", "SUGGESTED_QUESTIONS", "PLANS"]

_OFFLOADED = re.compile(r"^\[Result saved as artifact ([A-Za-z0-9_-]+)", re.M)
_SANDBOX_PATH = re.compile(r"^sandbox path: (/data/[A-Za-z0-9_-]{1,64}\.parquet)\s*$", re.M)
_UPLOAD = re.compile(r"^\[The user uploaded (a file|an image): (.+?)(?: \(artifact [^)]*\))?\]", re.M)
_RESULT = re.compile(re.escape(RESULT_MARK) + r"(\{.*\})")


def _call(name: str, args: dict[str, Any]) -> list[ToolCall]:
    return [ToolCall(id=f"call_demo_{uuid.uuid4().hex[:12]}", name=name, arguments=json.dumps(args))]


def _tool_names(tools: list[dict[str, Any]]) -> set[str]:
    return {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}


def _result_numbers(content: str) -> dict[str, Any] | None:
    m = _RESULT.search(content)
    if not m:
        return None
    try:
        value = json.loads(m.group(1))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _failed(content: str) -> str:
    lines = [ln for ln in content.splitlines() if ln.startswith(("error:", "status:"))]
    return "\n".join(lines)[:800] or content.strip()[:800] or "(no output)"


class _Turn:
    """What the context says about the current question."""

    def __init__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        self.last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        self.question = _text(messages[self.last_user].get("content")) if self.last_user >= 0 else ""
        earlier = messages[: max(self.last_user, 0)]
        self.first_answer = not any(m.get("role") == "assistant" and _text(m.get("content")) for m in earlier)
        self.results = [_text(m.get("content")) for m in messages[self.last_user + 1:] if m.get("role") == "tool"]
        self.tools = _tool_names(tools)
        self.upload = self._upload(messages)

    def _upload(self, messages: list[dict[str, Any]]) -> tuple[str, str, str | None] | None:
        """(kind, filename, sandbox path) of the upload the question is about, if any: one made
        since the last answer, or the newest when the question speaks of a file."""
        q = self.question.lower()
        wants_file = any(w in q for w in ("upload", "file", "my data", "this data", "the data i"))
        for i in range(self.last_user, -1, -1):
            m = messages[i]
            if m.get("role") == "assistant" and _text(m.get("content")) and not wants_file:
                return None
            if m.get("role") != "user":
                continue
            text = _text(m.get("content"))
            found = _UPLOAD.search(text)
            if found:
                path = _SANDBOX_PATH.search(text)
                return found.group(1), found.group(2), path.group(1) if path else None
        return None

    def say(self, text: str) -> str:
        """`text`, labelled as the demo when this is the thread's first answer."""
        return f"{DEMO_BANNER}\n\n{text}" if self.first_answer else text


def _plan_step(turn: _Turn, plan: DemoPlan) -> ScriptStep:
    if not turn.results:
        if "sql_query" not in turn.tools:
            return ScriptStep(text=turn.say("(The `sql_query` tool is not available here, so I cannot look at the data.)"))
        return ScriptStep(text=turn.say(f"Querying {plan.what}.\n\n"), tool_calls=_call("sql_query", {"sql": plan.sql}))
    if len(turn.results) == 1:
        raw = turn.results[0]
        path = _SANDBOX_PATH.search(raw)
        if _OFFLOADED.search(raw) and path and "python" in turn.tools:
            return ScriptStep(text="The result is saved as an artifact; analysing the full file with Python.\n\n",
                              tool_calls=_call("python", {"code": plan_code(plan, path.group(1))}))
        why = ("the python tool is not available here" if "python" not in turn.tools
               else "the result was not saved as a file")
        described = _describe(plan.what, parse_tool_result(raw), raw).replace(DEMO_BANNER + "\n\n", "")
        return ScriptStep(text=f"{described}\n\n(The full analysis needs Python over the whole result, but {why}.)")
    numbers = _result_numbers(turn.results[-1])
    if numbers is None:
        return ScriptStep(text=f"The analysis did not finish:\n\n```\n{_failed(turn.results[-1])}\n```")
    try:
        return ScriptStep(text=plan.answer(numbers))
    except (KeyError, TypeError, ValueError, IndexError):
        return ScriptStep(text=f"The analysis printed numbers I could not read:\n\n```\n{json.dumps(numbers)[:800]}\n```")


def _upload_step(turn: _Turn) -> ScriptStep:
    assert turn.upload is not None
    kind, filename, path = turn.upload
    if kind == "an image":
        return ScriptStep(text=turn.say(
            f"You uploaded the image **{filename}**. The demo model cannot look at images; a vision-capable "
            "model configured with `DATADESK_LLM_MODEL` would describe it. Tables (CSV, Excel, Parquet, JSON) "
            "I can profile here."))
    if not turn.results:
        if path is None or "python" not in turn.tools:
            return ScriptStep(text=turn.say(
                f"**{filename}** is uploaded, but the python tool is not available here, so only its preview "
                "reached me: its rows and columns are in the upload note above."))
        return ScriptStep(text=turn.say(f"Profiling **{filename}** over the full file with Python.\n\n"),
                          tool_calls=_call("python", {"code": UPLOAD_CODE.format(path=path)}))
    numbers = _result_numbers(turn.results[-1])
    if numbers is None:
        return ScriptStep(text=f"Reading **{filename}** failed:\n\n```\n{_failed(turn.results[-1])}\n```")
    return ScriptStep(text=upload_answer(filename, numbers))


def demo_step(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ScriptStep:
    """The demo's next step for this context (see the module docstring)."""
    turn = _Turn(messages, tools)
    plan = pick_plan(turn.question)
    if plan is not None:
        return _plan_step(turn, plan)
    if turn.upload is not None:
        return _upload_step(turn)
    if not turn.results and demo_topic(turn.question) is None:  # off the script: say what it can do
        return ScriptStep(text=turn.say(off_script_answer(turn.question, connect=not turn.first_answer)))
    step = _demo_step(messages, tools)  # one canned query, described
    if not turn.first_answer and step.text.startswith(DEMO_BANNER):
        step.text = step.text[len(DEMO_BANNER):].lstrip()
    return step


def demo_model() -> ScriptedModel:
    """The model used when no LLM is configured: labelled, and honest about it."""
    model = ScriptedModel(steps=(), name=DEMO_NAME, is_demo=True, chunk_size=24, then=demo_step, max_recorded=20)
    model.suggestions = list(SUGGESTED_QUESTIONS)  # type: ignore[attr-defined]  # shown on an empty chat
    return model
