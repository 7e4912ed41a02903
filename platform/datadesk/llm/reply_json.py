"""The JSON object in a model's reply, wherever the model put it.

Models asked for "JSON only" still wrap it: a ```json fence, a sentence before or
after, a `<think>` block. `extract_json` finds the object and returns its text, so
the caller's strict decoder (msgspec, with its own type) names what is wrong with
it. Used by the summarizer, memory extraction and the scripted model.
"""

from __future__ import annotations

import json
import re

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_DECODER = json.JSONDecoder()
_MAX_STARTS = 64  # `{` tried as the object's start; a reply is not a haystack


def extract_json(text: str) -> str:
    """The text of the first JSON object in `text` (fences and text around it ignored).

    When no `{` starts a well-formed object, the span from the first `{` to the last `}`
    is returned for the caller's decoder to report on; ValueError when there is no `{`."""
    text = _THINK.sub("", text).strip()
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the reply")
    first, tries = start, 0
    while start >= 0 and tries < _MAX_STARTS:
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            pass
        else:
            if isinstance(value, dict):
                return text[start:end]
        start, tries = text.find("{", start + 1), tries + 1
    last = text.rfind("}")
    return text[first : last + 1] if last > first else text[first:]
