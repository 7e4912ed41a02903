"""Thread records: one line each in `log.jsonl`.

A record is the truth of what happened. The model context is derived from
records and never stored as truth (DESIGN section 1).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from datadesk.domain.artifacts import Artifact

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
    # as stored: a dict, written only from the role's meta struct through `record_meta`
    meta: dict[str, Any] | None = None


# -- what a record's `meta` holds, per role -------------------------------------------------
class ArtifactRef(msgspec.Struct):
    """The artifact a tool result was saved as (tool records, `tool.finished`, `artifact.created`)."""

    id: str
    status: str
    rows: int | None
    columns: int | None
    bytes: int
    format: str
    path: str  # where the sandbox reads it (/data/<file>)

    @classmethod
    def of(cls, art: Artifact) -> "ArtifactRef":
        return cls(id=art.id, status=art.status, rows=art.rows, columns=art.columns, bytes=art.bytes,
                   format=art.format, path=art.sandbox_path)


class OutputFile(msgspec.Struct):
    """An artifact that code produced: a chart, a file under /outputs, the full output text."""

    id: str
    kind: str
    format: str
    file: str | None  # its name under /outputs (None for a chart)
    bytes: int
    path: str

    @classmethod
    def of(cls, art: Artifact) -> "OutputFile":
        return cls(id=art.id, kind=art.kind, format=art.format, file=art.origin.filename, bytes=art.bytes,
                   path=art.sandbox_path)


class RequeryReport(msgspec.Struct):
    """What restoring an expired artifact found: whether it came back and whether the data changed."""

    artifact: str
    restored: bool
    path: str | None
    rows_before: int | None
    rows_after: int | None
    schema_equal: bool
    content_equal: bool
    original_time: str | None
    requeried_time: str | None
    changed: bool


class ToolRecordMeta(msgspec.Struct, omit_defaults=True):
    """`meta` of a tool record (and `ToolResult.meta`): only the facts a call has are set.

    Per tool: sql `rows`; offload `artifact` or `rows`/`chars` + `truncated`, `offload_failed`;
    python `status` (of the run), `artifacts`, `images` (with `dark_images`), `charts`;
    remember/forget `fact`, `status` (of the fact); load_skill `skill`, `file`; read_tool_result `call_id`, `offset`, `end`; compact
    `covers_through_seq`; requery_artifact `requery`; MCP `mcp_server`, `mcp_tool`, `images`.
    `via: "api"` marks a call the API made on the user's request, not the model.
    """

    duration_ms: float | None = None
    status: str | None = None
    rows: int | None = None
    chars: int | None = None
    truncated: bool = False
    offload_failed: bool = False
    artifact: ArtifactRef | None = None
    artifacts: list[OutputFile] | None = None
    images: list[str] | None = None
    dark_images: dict[str, str] | None = None  # python: image id -> its dark-theme variant's id
    charts: list[str] | None = None  # python: the Vega-Lite chart artifacts, in display order
    fact: str | None = None
    skill: str | None = None
    file: str | None = None
    call_id: str | None = None
    offset: int | None = None
    end: int | None = None
    covers_through_seq: int | None = None
    requery: RequeryReport | None = None
    mcp_server: str | None = None
    mcp_tool: str | None = None
    via: str | None = None


# `kind` of an assistant record, `status` of a tool record: the server stopped mid-turn (a crash),
# so the answer holds only what was written and the call never finished (chat/interrupted.py)
INTERRUPTED = "interrupted"
# `kind` of an assistant record and of the turn's `error`: the host running the turn left the
# cluster (crashed, lost, hung past its lease); another host finished the turn (cluster/takeover.py)
HOST_LOST = "host_lost"
CUT_OFF_KINDS = frozenset({INTERRUPTED, HOST_LOST})  # a reply that holds only what was written


class AssistantRecordMeta(msgspec.Struct, omit_defaults=True):
    """`meta` of an assistant record: why it failed (`error`, its `kind`: e.g. "context", the model
    error's class, INTERRUPTED), or `via: "api"`."""

    error: str | None = None
    kind: str | None = None
    via: str | None = None  # "api", "refresh", "user" (a step the user ran: chat/user_steps.py)
    edited_from: str | None = None  # a user step: the call id of the card it was edited from


class UserRecordMeta(msgspec.Struct, omit_defaults=True):
    """`meta` of a user record that announces an upload (`kind: "upload"`): the artifact id."""

    kind: str | None = None
    artifact: str | None = None
    filename: str | None = None
    image: bool | None = None
    artifacts: list[str] | None = None  # every artifact of the upload (a workbook: one per sheet)
    skipped_sheets: list[str] | None = None  # a workbook's sheets left out ("Notes (empty)")
    reimport: bool | None = None  # the upload read again with the analyst's options


RecordMeta = ToolRecordMeta | AssistantRecordMeta | UserRecordMeta


def record_meta(meta: RecordMeta) -> dict[str, Any] | None:
    """The stored form of a record's meta (None when nothing is set): the keys it always had,
    so old logs read the same. Read it back typed with `msgspec.convert(rec.meta, <its struct>)`."""
    return msgspec.to_builtins(meta) or None


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
    # the last refresh, for the thread list's badge: {at, status, changes, trigger} (threads/refresh.py)
    refreshed: dict[str, Any] | None = None


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
