"""Events streamed to the client during a turn (sent as SSE, DESIGN section 4).

Each event type has its payload struct (a subclass of `EventPayload`): its class attribute
`type` is the SSE event name and its fields are the JSON keys the client reads.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from datadesk.domain.records import ArtifactRef, OutputFile, ToolRecordMeta, Usage


class EventPayload(msgspec.Struct):
    """Base of the event payloads: `type` is the SSE event name."""

    type: ClassVar[str]


class MessageDelta(EventPayload):
    """A piece of the answer as it streams."""

    type: ClassVar[str] = "message.delta"
    text: str


class ToolStarted(EventPayload):
    type: ClassVar[str] = "tool.started"
    call_id: str
    name: str
    arguments: str  # raw JSON, as the model sent it


class ToolFinished(EventPayload, omit_defaults=True):
    """A call's result: `preview` is what the model got (cut for the card); `meta` only when set."""

    type: ClassVar[str] = "tool.finished"
    call_id: str
    name: str
    ok: bool
    seq: int
    duration_ms: float
    preview: str
    meta: ToolRecordMeta | None = None


class ToolProgress(EventPayload, omit_defaults=True):
    """How a running call is doing (throttled by the producer): output as it is printed, the
    seconds since it started, rows and bytes written so far by an offload or an upload."""

    type: ClassVar[str] = "tool.progress"
    call_id: str
    name: str
    elapsed_s: float
    stdout: str | None = None  # new text since the previous progress event (capped)
    stderr: str | None = None
    rows: int | None = None
    bytes: int | None = None
    message: str | None = None  # e.g. "interrupting the kernel", "restarting the kernel"


class ArtifactCreated(EventPayload):
    """A result saved as an artifact, or a chart or file the code wrote."""

    type: ClassVar[str] = "artifact.created"
    call_id: str
    artifact: ArtifactRef | OutputFile


class MessageCompleted(EventPayload):
    type: ClassVar[str] = "message.completed"
    seq: int
    content: str
    model: str | None
    usage: Usage | None


class TurnError(EventPayload):
    """Why the turn (or a step of it) failed: `kind` is context, model, step_limit, cancelled,
    thread_gone, taken_over (another server took the thread over: the turn's fence is gone),
    disk (a write to the data directory failed: the message names what was not saved), or
    internal."""

    type: ClassVar[str] = "error"
    kind: str
    message: str


class TurnDone(EventPayload):
    """Always the last event of a turn."""

    type: ClassVar[str] = "done"
    turn_id: str
    status: str


class TurnEvent(msgspec.Struct, frozen=True):
    """One event of a running turn: its typed payload; `type` and `data` are its SSE form."""

    payload: EventPayload

    @property
    def type(self) -> str:
        return self.payload.type

    @property
    def data(self) -> dict[str, Any]:
        """The JSON payload as sent (a fresh dict: the SSE layer may add keys such as `html`)."""
        return msgspec.to_builtins(self.payload)
