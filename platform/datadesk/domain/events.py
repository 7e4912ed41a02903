"""Events streamed to the client during a turn (sent as SSE, DESIGN section 4)."""

from __future__ import annotations

from typing import Any

import msgspec

EVENT_TYPES = (
    "message.delta",
    "tool.started",
    "tool.finished",
    "artifact.created",
    "message.completed",
    "error",
    "done",
)


class TurnEvent(msgspec.Struct):
    """One event of a running turn: `type` is one of EVENT_TYPES, `data` its JSON payload."""

    type: str
    data: dict[str, Any]
