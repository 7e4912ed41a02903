"""A search snippet as a reader sees the record, not as it is stored.

Records hold Markdown (answers) and JSON (tool results, call arguments); a snippet cut from
them showed `**B07**` and `"ratio": 1.98`. `readable_marked` removes that syntax from a
snippet whose matched words are between `MARK_START` and `MARK_END` (the embedded index's
FTS5 markers), keeping the markers on the words they mark; `split_marks` then turns the
markers into [start, end) offsets. Both search indexes (store/search.py, cluster/search.py)
pass their snippets through here, so the two show the same text.

Only syntax goes: every word and number of the record stays, so a highlight never loses its
word. What is removed: emphasis and code markers, heading and quote marks, list bullets,
link and image targets (their text stays), table pipes and separator rows, and, in text that
reads as JSON, the quotes around keys and strings, braces, brackets and escapes.
"""

from __future__ import annotations

import re

MARK_START = "\x02"
MARK_END = "\x03"

_M = f"[{MARK_START}{MARK_END}]*"  # markers may sit next to any syntax
_FENCE = re.compile(r"```[\w+-]*")
_IMAGE_OR_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\n]*\)")
_LINE_START = re.compile(rf"(^|\n|…)[ \t]*{_M}(?:#{{1,6}}[ \t]+|>[ \t]?|[-*+][ \t]+|\d+\.[ \t]+)", re.MULTILINE)
_EMPHASIS = re.compile(r"\*\*|__|~~|`")
_STAR = re.compile(r"(?<![\w*])\*(?=[^\s*])|(?<=[^\s*])\*(?![\w*])")
_UNDERSCORE = re.compile(r"(?<![\w_])_(?=[^\s_])|(?<=[^\s_])_(?![\w_])")  # _em_, never snake_case
_TABLE_RULE = re.compile(r"\|?(?:[ \t]*:?-{3,}:?[ \t]*\|)+[ \t]*:?-{0,}:?")
_PIPES = re.compile(r"[ \t]*\|[ \t]*")
_CELL_GAPS = re.compile(r"(?:\s*·\s*){2,}")
_JSON_HINT = re.compile(r'"[^"\n]{0,80}"\s*:|^\s*[\[{]')
_JSON_ESCAPE = re.compile(r"\\[nrt]")
_JSON_QUOTE = re.compile(r'\\?"')
_JSON_BRACKETS = re.compile(r"[{}\[\]]")
_SPACE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(rf"\s+({_M}[,:;.](?:\s|$))")


def looks_like_json(text: str) -> bool:
    """Whether a snippet reads as JSON (a key with a colon, or an opening brace or bracket)."""
    return bool(_JSON_HINT.search(text))


def readable_marked(marked: str) -> str:
    """`marked` (a snippet with its matched words between the markers) without Markdown or
    JSON syntax, on one line; the markers stay around their words."""
    text = _FENCE.sub(" ", marked)
    text = _IMAGE_OR_LINK.sub(r"\1", text)
    text = _LINE_START.sub(r"\1", text)
    text = _TABLE_RULE.sub(" ", text)
    text = _EMPHASIS.sub("", text)
    text = _STAR.sub("", text)
    text = _UNDERSCORE.sub("", text)
    if "|" in text:  # table cells, one "·" between two
        text = _CELL_GAPS.sub(" · ", _PIPES.sub(" · ", text)).strip(" ·")
    if looks_like_json(text):
        text = _JSON_ESCAPE.sub(" ", text)
        text = _JSON_QUOTE.sub("", text)
        text = _JSON_BRACKETS.sub(" ", text)
    text = _SPACE.sub(" ", text)
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    return text.strip()


def split_marks(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """Strip the markers of a snippet into (text, [start, end) offsets of the marked words)."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    pos, start = 0, None
    for ch in marked:
        if ch == MARK_START:
            start = pos
        elif ch == MARK_END:
            if start is not None and pos > start:
                spans.append((start, pos))
            start = None
        else:
            out.append(ch)
            pos += 1
    return "".join(out), spans


def mark(text: str, spans: list[tuple[int, int]]) -> str:
    """The inverse of `split_marks`: `text` with markers around each span."""
    out: list[str] = []
    pos = 0
    for a, b in sorted(spans):
        if a < pos or b > len(text):
            continue
        out += [text[pos:a], MARK_START, text[a:b], MARK_END]
        pos = b
    out.append(text[pos:])
    return "".join(out)


def readable_snippet(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """A marked snippet as the reader sees it: (text, highlight offsets)."""
    return split_marks(readable_marked(marked))


def readable_spans(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """`readable_snippet` for a snippet given as text and offsets (cluster/search.py)."""
    return readable_snippet(mark(text, spans))
