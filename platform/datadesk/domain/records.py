"""Thread records: one line each in `log.jsonl`.

A record is the truth of what happened. The model context is derived from
records and never stored as truth (DESIGN section 1).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Role = Literal["user", "assistant", "tool"]
# ok: completed; error: failed with a message the model saw; cancelled: the
# step was stopped (cancel endpoint or client disconnect) before it finished.
Status = Literal["ok", "error", "cancelled"]


class ToolCall(msgspec.Struct, omit_defaults=True):
    """One function call requested by the model. `arguments` is the raw JSON text."""

    id: str
    name: str
    arguments: str = "{}"


class Usage(msgspec.Struct, omit_defaults=True):
    """Token usage reported by the provider for one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0


class Record(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=False):
    """One entry of a thread log.

    - user: `content` is the message.
    - assistant: `content` is the text; `tool_calls` the calls it asked for;
      `provider_fields` keeps provider-specific reply fields raw
      (e.g. `reasoning_content`) so a later layer can replay or strip them.
    - tool: `tool_call_id` pairs it with its call; `name` is the tool.
    """

    seq: int
    role: Role
    ts: float
    content: str = ""
    turn_id: str = ""
    status: Status = "ok"
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    model: str | None = None
    usage: Usage | None = None
    provider_fields: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


class ThreadMeta(msgspec.Struct, omit_defaults=True):
    """`meta.json` of a thread."""

    id: str
    workspace: str
    owner: str
    title: str
    created: float
    updated: float
    epoch: int = 0
    project: str | None = None  # project-scoped memory applies to threads with this label


def arguments_text(arguments: str) -> str:
    """Tool-call arguments (raw JSON) as one line of `key='value'` pairs, for people and stubs."""
    try:
        args = msgspec.json.decode(arguments or "{}")
        text = ", ".join(f"{k}={v!r}" for k, v in args.items()) if isinstance(args, dict) else str(arguments)
    except msgspec.DecodeError:
        text = arguments or ""
    return " ".join(text.split())


def short_arguments(arguments: str, limit: int) -> str:
    """`arguments_text`, cut to `limit` characters with an ellipsis."""
    text = arguments_text(arguments)
    return text if len(text) <= limit else text[: limit - 1] + "…"


record_encoder = msgspec.json.Encoder()
record_decoder = msgspec.json.Decoder(Record)
