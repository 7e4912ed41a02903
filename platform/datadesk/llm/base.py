"""The one interface every chat model implements (real client and scripted model alike).

A model streams `ModelDelta` events while it writes text, then ends with
exactly one `ModelReply` holding the assembled message.

Errors (all subclasses of `ModelError`, each with a message fit for the user):
- `ModelUnavailable`: endpoint down, timeouts, 429/5xx after the retries.
- `ModelAuthError`: 401/403, bad API key.
- `ModelNotFound`: the configured model does not exist on the endpoint.
- `ModelProtocolError`: the endpoint answered something that is not a valid
  chat-completions stream (garbage, truncated JSON, a call with no name).
- `ModelStreamBroken`: the stream failed after text had reached the user, so
  it was not retried (retrying would repeat deltas).
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Protocol

import msgspec

from datadesk.domain.records import ToolCall, Usage


class ModelError(Exception):
    """Base of every model failure; `str(exc)` is shown to the user."""


class ModelUnavailable(ModelError):
    pass


class ModelAuthError(ModelError):
    pass


class ModelNotFound(ModelError):
    pass


class ModelProtocolError(ModelError):
    pass


class ModelStreamBroken(ModelError):
    pass


class ModelDelta(msgspec.Struct):
    """A piece of assistant text, to forward to the user as it arrives."""

    text: str


class ModelReply(msgspec.Struct):
    """The assembled reply: text, parallel tool calls, usage, raw provider fields."""

    content: str
    tool_calls: list[ToolCall]
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    provider_fields: dict[str, Any] | None = None  # e.g. {"reasoning_content": "..."}


ModelEvent = ModelDelta | ModelReply


class ChatModel(Protocol):
    """A chat model. `messages` and `tools` are in Chat Completions shape."""

    name: str
    is_demo: bool

    def stream(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
        response_format: dict[str, Any] | None = None,  # JSON mode / structured outputs, when asked
    ) -> AsyncIterator[ModelEvent]: ...
