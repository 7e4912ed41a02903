"""The JSON object in a model's reply, wherever the model put it.

Models asked for "JSON only" still wrap it: a ```json fence, a sentence before or
after, a `<think>` block, a trailing comma before `}` or `]`. `extract_json` finds
the object and returns its text, so the caller's strict decoder (msgspec, with its
own type) names what is wrong with it. Used by the summarizer, memory extraction
and the scripted model.

Where it looks, in order: the contents of each fenced block, then the whole reply;
in each, every `{` (up to a limit) as the start of an object, as written and then
with trailing commas removed (outside strings). Nothing else is "repaired": a
reply that is not JSON stays an error the caller can show the model.

`unwrap_object` adds the wrappers some models put around the object they were asked
for: `{"summary": {...}}`, `{"result": {...}}` (a single key of any name), or a JSON
string holding the object. The caller's decoder is tried on the object as given
first, so an answer that validates is never unwrapped.
"""

from __future__ import annotations

import json
import re
from typing import Callable, TypeVar

T = TypeVar("T")

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_-]*[ \t]*\r?\n?(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()
_MAX_STARTS = 64  # `{` tried as the object's start; a reply is not a haystack


def strip_trailing_commas(text: str) -> str:
    """`text` without the commas that directly precede `}` or `]` (whitespace between), strings left alone."""
    out: list[str] = []
    in_string = escaped = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j < n and text[j] in "}]":
                i += 1
                continue  # the comma goes; the whitespace and the bracket follow
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _first_object(text: str) -> str | None:
    """The text of the first well-formed JSON object starting at a `{` of `text`, else None."""
    start, tries = text.find("{"), 0
    while start >= 0 and tries < _MAX_STARTS:
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            pass
        else:
            if isinstance(value, dict):
                return text[start:end]
        start, tries = text.find("{", start + 1), tries + 1
    return None


def extract_json(text: str) -> str:
    """The text of the first JSON object in `text` (fences, text around it and trailing commas tolerated).

    When no `{` starts a well-formed object, the span from the first `{` to the last `}`
    is returned for the caller's decoder to report on; ValueError when there is no `{`."""
    text = _THINK.sub("", text).strip()
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the reply (it is prose, not JSON)")
    candidates = [m.group(1) for m in _FENCE.finditer(text) if "{" in m.group(1)] + [text]
    for candidate in candidates:
        found = _first_object(candidate)
        if found is not None:
            return found
    for candidate in candidates:
        found = _first_object(strip_trailing_commas(candidate))
        if found is not None:
            return found
    last = text.rfind("}")
    return text[start : last + 1] if last > start else text[start:]


def _loads(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        try:
            return json.loads(strip_trailing_commas(body))
        except ValueError:
            return None


def _unwrapped(body: str) -> str | None:
    """The object inside a single-key wrapper (as an object or a JSON string), else None."""
    value = _loads(body)
    if not isinstance(value, dict) or len(value) != 1:
        return None
    inner = next(iter(value.values()))
    if isinstance(inner, dict):
        return json.dumps(inner)
    if isinstance(inner, str) and "{" in inner:
        try:
            return extract_json(inner)
        except ValueError:
            return None
    return None


def unwrap_object(text: str, decode: Callable[[str], T]) -> T:
    """`decode(extract_json(text))`; when that fails, `decode` of the object inside a wrapper.

    Wrappers: the whole reply is a JSON string holding the object; the object is the only
    value of a single-key object (`{"summary": {...}}`, any key), given as an object or as
    a JSON string; at most two levels. `decode` raises ValueError (msgspec's errors are
    ValueErrors); when no unwrapped form decodes, the first error is raised."""
    whole = _loads(text.strip())
    if isinstance(whole, str) and "{" in whole:
        text = whole  # the reply is a JSON string with the object in it
    body = extract_json(text)
    try:
        return decode(body)
    except ValueError as exc:
        first = exc
    for _ in range(2):
        inner = _unwrapped(body)
        if inner is None:
            break
        try:
            return decode(inner)
        except ValueError:
            body = inner
    raise first
