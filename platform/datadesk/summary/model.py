"""The structured thread summary and its rendering for the model.

`SummaryFields` is exactly what the summarizer model is asked to produce
(validated strictly: unknown fields are refused, lists hold strings).
`ThreadSummary` adds what the code knows: how far it covers, the thread epoch,
the model that wrote it and when.
"""

from __future__ import annotations

import string
from typing import Any

import msgspec

LIST_FIELDS = ("active_constraints", "decisions", "superseded", "data_refs", "open_items", "next_steps")
TEXT_FIELDS = ("goal", "state")
FIELD_NAMES = ("goal", "active_constraints", "decisions", "superseded", "data_refs", "state",
               "open_items", "next_steps")

_END_PUNCT = string.punctuation + string.whitespace + "\u201c\u201d\u2018\u2019\u00ab\u00bb\u2026\u2013\u2014\u2022\u00b7"


class SummaryFields(msgspec.Struct, forbid_unknown_fields=True):
    """The summarizer's output: every field present, nothing else.

    `goal` and `state` may be null (read as empty).
    """

    goal: str | None
    active_constraints: list[str]
    decisions: list[str]
    superseded: list[str]
    data_refs: list[str]
    state: str | None
    open_items: list[str]
    next_steps: list[str]


# The JSON schema of `SummaryFields` for structured outputs: every key required, nothing else
# (OpenAI's strict mode needs both), lists of strings, goal/state a string or null.
SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {name: ({"type": ["string", "null"]} if name in TEXT_FIELDS
                          else {"type": "array", "items": {"type": "string"}}) for name in FIELD_NAMES},
    "required": list(FIELD_NAMES),
    "additionalProperties": False,
}
WEAKER_OUTPUT = {"json_schema": "json_object", "json_object": "none"}  # when a server refuses a mode


def response_format(mode: str) -> dict[str, Any] | None:
    """The `response_format` of a summarizer request for a profile's `structured_output` mode."""
    if mode == "json_schema":
        return {"type": "json_schema",
                "json_schema": {"name": "thread_summary", "strict": True, "schema": SUMMARY_SCHEMA}}
    if mode == "json_object":
        return {"type": "json_object"}
    return None


class ThreadSummary(msgspec.Struct, kw_only=True):
    """`summary.json` of a thread (and one line of `summary.revisions.jsonl`).

    Unknown fields are ignored when reading (a file written by a newer version
    stays readable); the strict schema is `SummaryFields`, for model output.
    """

    goal: str = ""
    active_constraints: list[str] = msgspec.field(default_factory=list)
    decisions: list[str] = msgspec.field(default_factory=list)
    superseded: list[str] = msgspec.field(default_factory=list)  # withdrawn decisions/constraints
    data_refs: list[str] = msgspec.field(default_factory=list)  # artifact ids, queries, files
    state: str = ""
    open_items: list[str] = msgspec.field(default_factory=list)
    next_steps: list[str] = msgspec.field(default_factory=list)
    covers_through_seq: int = 0  # every record with seq <= this is reflected here
    epoch: int = 0  # the thread epoch it was made in (a clear bumps it)
    model: str = ""
    created: float = 0.0

    def fields(self) -> dict[str, Any]:
        """The model-facing part (what `SummaryFields` holds)."""
        return {name: getattr(self, name) for name in FIELD_NAMES}


def normalize_item(text: str) -> str:
    """The comparison form of an item: casefold, collapse whitespace, strip punctuation at the ends."""
    return " ".join(str(text).casefold().split()).strip(_END_PUNCT)


def clean_list(items: list[str]) -> list[str]:
    """Items stripped, empty ones and duplicates (by normalized form) removed, order kept."""
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        text = " ".join(str(item).split())
        key = normalize_item(text)
        if key and key not in seen:
            seen.add(key)
            out.append(text)
    return out


def render_summary(summary: ThreadSummary) -> str:
    """Compact text of a summary for the model context; empty sections are left out."""
    lines = [f"Thread summary (covers records up to #{summary.covers_through_seq}):"]
    if summary.goal.strip():
        lines.append(f"Goal: {summary.goal.strip()}")
    sections = (
        ("Active constraints", summary.active_constraints),
        ("Superseded (do not apply)", summary.superseded),
        ("Decisions", summary.decisions),
        ("Data references", summary.data_refs),
    )
    for title, items in sections:
        if items:
            lines.append(f"{title}:")
            lines.extend(f"- {item}" for item in items)
    if summary.state.strip():
        lines.append(f"State: {summary.state.strip()}")
    for title, items in (("Open items", summary.open_items), ("Next steps", summary.next_steps)):
        if items:
            lines.append(f"{title}:")
            lines.extend(f"- {item}" for item in items)
    return "\n".join(lines)
