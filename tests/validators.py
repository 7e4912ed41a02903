"""Request validators: the providers' documented ordering rules for Chat Completions messages.

Tests of the context builder run every built request through these, so a
request that a provider would answer with a 400 fails a test instead.

- `validate_openai(messages)`: OpenAI Chat Completions (and the servers that
  copy it: vLLM, llama.cpp, DeepSeek, ...).
- `validate_anthropic(messages)`: converts the messages as an OpenAI-to-
  Anthropic adapter does (leading system messages to the `system` prompt,
  `tool` messages to `tool_result` blocks in a user turn, consecutive
  same-role turns merged) and checks the Messages API rules.

Both raise `AssertionError` naming the message index and the rule broken.
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
SYSTEM_ROLES = ("system", "developer")


def _fail(index: int | None, text: str) -> None:
    where = f"message {index}" if index is not None else "request"
    raise AssertionError(f"{where}: {text}")


# -- OpenAI -------------------------------------------------------------------------------


def _check_text_parts(i: int, content: list[Any], allow_images: bool) -> None:
    if not content:
        _fail(i, "content is an empty list of parts")
    for k, part in enumerate(content):
        if not isinstance(part, dict):
            _fail(i, f"content part {k} is {type(part).__name__}, not an object")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                _fail(i, f"content part {k} (text) has no string 'text'")
        elif kind == "image_url" and allow_images:
            image = part.get("image_url")
            if not isinstance(image, dict) or not isinstance(image.get("url"), str) or not image["url"]:
                _fail(i, f"content part {k} (image_url) needs image_url.url as a non-empty string")
        else:
            allowed = "text or image_url" if allow_images else "text"
            _fail(i, f"content part {k} has type {kind!r}; a {allowed} part is expected here")


def _check_openai_message(i: int, msg: Any) -> None:
    if not isinstance(msg, dict):
        _fail(i, f"is {type(msg).__name__}, not an object")
    role = msg.get("role")
    if role not in ROLES:
        _fail(i, f"role {role!r} is not one of {', '.join(ROLES)}")
    content = msg.get("content")
    if role in SYSTEM_ROLES:
        if isinstance(content, list):
            _check_text_parts(i, content, allow_images=False)
        elif not isinstance(content, str):
            _fail(i, f"{role} content must be a string or text parts, not {type(content).__name__}")
    elif role == "user":
        if isinstance(content, list):
            _check_text_parts(i, content, allow_images=True)
        elif not isinstance(content, str):
            _fail(i, f"user content must be a string or a list of parts, not {type(content).__name__}")
    elif role == "assistant":
        calls = msg.get("tool_calls")
        if isinstance(content, list):
            _check_text_parts(i, content, allow_images=False)
        elif content is not None and not isinstance(content, str):
            _fail(i, f"assistant content must be a string, text parts or null, not {type(content).__name__}")
        if calls is not None:
            if not isinstance(calls, list) or not calls:
                _fail(i, "tool_calls must be a non-empty list when present")
            for k, call in enumerate(calls):
                if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
                    _fail(i, f"tool_calls[{k}] has no string id")
                if call.get("type") != "function":
                    _fail(i, f"tool_calls[{k}] has type {call.get('type')!r}, not 'function'")
                fn = call.get("function")
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    _fail(i, f"tool_calls[{k}] has no function.name")
                if not isinstance(fn.get("arguments"), str):
                    _fail(i, f"tool_calls[{k}].function.arguments must be a JSON string, "
                             f"not {type(fn.get('arguments')).__name__}")
        if content is None and not calls:
            _fail(i, "assistant message has neither content nor tool_calls")
    elif role == "tool":
        if not isinstance(content, str):
            _fail(i, f"tool content must be a string (tool messages are text-only), "
                     f"not {type(content).__name__}")
        if not isinstance(msg.get("tool_call_id"), str) or not msg["tool_call_id"]:
            _fail(i, "tool message has no tool_call_id")


def validate_openai(messages: list[dict[str, Any]]) -> None:
    """Raise AssertionError unless OpenAI's Chat Completions would accept `messages`."""
    if not isinstance(messages, list) or not messages:
        _fail(None, "messages must be a non-empty list")
    seen_ids: dict[str, int] = {}
    pending: dict[str, int] = {}  # call id -> index of the assistant message that made it
    leading = True
    for i, msg in enumerate(messages):
        _check_openai_message(i, msg)
        role = msg["role"]
        if role in SYSTEM_ROLES:
            if not leading:
                _fail(i, f"{role} message after a non-system message; system messages go only at the start")
        else:
            leading = False
        if role == "tool":
            call_id = msg["tool_call_id"]
            if call_id not in pending:
                if call_id in seen_ids:
                    _fail(i, f"tool message for call {call_id!r} does not directly follow its assistant "
                             f"message {seen_ids[call_id]} (or answers it twice)")
                _fail(i, f"tool message for call {call_id!r} answers no preceding assistant tool_calls")
            del pending[call_id]
            continue
        if pending:
            ids = ", ".join(sorted(pending))
            _fail(i, f"{role} message before every tool call of assistant message "
                     f"{next(iter(pending.values()))} was answered (unanswered: {ids})")
        if role == "assistant":
            for call in msg.get("tool_calls") or ():
                if call["id"] in seen_ids:
                    _fail(i, f"duplicate tool_call id {call['id']!r} (first in message {seen_ids[call['id']]})")
                seen_ids[call["id"]] = i
                pending[call["id"]] = i
    if pending:
        _fail(None, f"the request ends before every tool call was answered "
                    f"(unanswered: {', '.join(sorted(pending))})")
    if all(m["role"] in SYSTEM_ROLES for m in messages):
        _fail(None, "no user or assistant message")


# -- Anthropic ----------------------------------------------------------------------------


def _blank(text: Any) -> bool:
    return not isinstance(text, str) or not text.strip()


def to_anthropic(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, turns) as an OpenAI-to-Anthropic adapter builds them.

    Each turn is {"role": "user" | "assistant", "content": [blocks]}; consecutive
    turns of one role are merged. Raises AssertionError on what no adapter can map.
    """
    if not isinstance(messages, list) or not messages:
        _fail(None, "messages must be a non-empty list")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    leading = True
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            _fail(i, f"role {msg.get('role') if isinstance(msg, dict) else msg!r} is not one of {', '.join(ROLES)}")
        role, content = msg["role"], msg.get("content")
        if role in SYSTEM_ROLES:
            if not leading:
                _fail(i, "system message after the conversation started; Anthropic takes only one "
                         "top-level system prompt (put later instructions in a user message)")
            system.append(content if isinstance(content, str) else
                          "\n".join(p.get("text", "") for p in content or () if isinstance(p, dict)))
            continue
        leading = False
        blocks: list[dict[str, Any]] = []
        if role == "tool":
            if not isinstance(content, str):
                _fail(i, f"tool content must be a string, not {type(content).__name__}")
            blocks.append({"type": "tool_result", "tool_use_id": msg.get("tool_call_id"), "content": content,
                           "_index": i})
            role = "user"
        else:
            if isinstance(content, str):
                if content:  # an adapter leaves out an empty string (tool-call-only assistant turns)
                    blocks.append({"type": "text", "text": content, "_index": i})
            elif isinstance(content, list):
                for k, part in enumerate(content):
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind == "text":
                        blocks.append({"type": "text", "text": part.get("text"), "_index": i})
                    elif kind == "image_url" and role == "user":
                        blocks.append({"type": "image", "source": part.get("image_url"), "_index": i})
                    else:
                        _fail(i, f"content part {k} of type {kind!r} has no Anthropic {role} block")
            elif content is not None:
                _fail(i, f"content of type {type(content).__name__} has no Anthropic form")
            for k, call in enumerate(msg.get("tool_calls") or ()) if role == "assistant" else ():
                fn = call.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except (TypeError, ValueError):
                    _fail(i, f"tool_calls[{k}] arguments are not JSON; tool_use.input must be an object")
                if not isinstance(args, dict):
                    _fail(i, f"tool_calls[{k}] arguments are JSON {type(args).__name__}; "
                             "tool_use.input must be an object")
                blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                               "input": args, "_index": i})
            if msg.get("tool_calls") and role != "assistant":
                _fail(i, f"a {role} message cannot carry tool_calls")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
            turns[-1]["_indexes"].append(i)
        else:
            turns.append({"role": role, "content": blocks, "_indexes": [i]})
    return "\n\n".join(system), turns


def validate_anthropic(messages: list[dict[str, Any]]) -> None:
    """Raise AssertionError unless the Anthropic Messages API would accept `messages`
    once converted by an OpenAI-to-Anthropic adapter (see `to_anthropic`)."""
    _, turns = to_anthropic(messages)
    if not turns:
        _fail(None, "no user or assistant message (Anthropic needs at least one message)")
    if turns[0]["role"] != "user":
        _fail(turns[0]["_indexes"][0], f"the first turn is {turns[0]['role']!r}; Anthropic requires 'user'")
    seen_use: dict[str, int] = {}
    for t, turn in enumerate(turns):
        first = turn["_indexes"][0]
        if t and turn["role"] == turns[t - 1]["role"]:
            _fail(first, f"turn {t} repeats role {turn['role']!r}; roles must alternate")
        if not turn["content"]:
            _fail(first, f"turn {t} ({turn['role']}) has empty content")
        for block in turn["content"]:
            if block["type"] == "text" and _blank(block["text"]):
                _fail(block["_index"], f"turn {t} has an empty text block; Anthropic rejects blank text")
        uses = [b for b in turn["content"] if b["type"] == "tool_use"]
        results = [b for b in turn["content"] if b["type"] == "tool_result"]
        for b in uses:
            if b["id"] in seen_use:
                _fail(b["_index"], f"duplicate tool_use id {b['id']!r} (first in message {seen_use[b['id']]})")
            seen_use[b["id"]] = b["_index"]
        if results:
            prev = turns[t - 1] if t else None
            asked = {b["id"] for b in prev["content"] if b["type"] == "tool_use"} if prev else set()
            for b in results:
                if b["tool_use_id"] not in asked:
                    _fail(b["_index"], f"tool_result for {b['tool_use_id']!r} has no matching tool_use in "
                                       "the previous assistant turn")
            n = len(results)
            if any(b["type"] != "tool_result" for b in turn["content"][:n]):
                bad = next(b for b in turn["content"][:n] if b["type"] != "tool_result")
                _fail(bad["_index"], f"turn {t}: a {bad['type']} block comes before the tool_result blocks; "
                                     "tool_result blocks must come first in the user turn")
            ids = [b["tool_use_id"] for b in results]
            dupes = {x for x in ids if ids.count(x) > 1}
            if dupes:
                _fail(results[0]["_index"], f"turn {t} answers tool_use {sorted(dupes)} more than once")
        if uses:
            nxt = turns[t + 1] if t + 1 < len(turns) else None
            answered = {b["tool_use_id"] for b in nxt["content"] if b["type"] == "tool_result"} if nxt else set()
            missing = sorted(b["id"] for b in uses if b["id"] not in answered)
            if missing:
                _fail(uses[0]["_index"], f"tool_use ids {missing} have no tool_result block in the "
                                         "immediately following user turn")
