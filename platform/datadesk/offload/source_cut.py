"""What the source said beside its rows (issue 17): its own cut of the result, and the
metadata kept with the artifact.

    annotate(artifact, table)   -> the artifact with its shape, the source's metadata and the
                                   source's own truncation ("partial (by the source)")
    truncation_note(table, rows) -> for a result shown truncated: the line saying the source cut it

Truncation said by the source: a flag (`truncated`, `has_more`, `limited`, ...), a cursor
(`next_cursor`, `nextPageToken`, ...), a total larger than the rows, a warning or a prose line
that says so ("showing first 32 rows (output truncated)", "... 968 more rows": the words of
`readers.text.notes.CUT_WORDS`), a count line beside a text table that states more rows than
came ("(1,000 rows)", "Result: 1,000 rows", "1000 rows in set": `notes.stated_rows`), or exactly
as many rows as a documented cap (the tool's `limit`-like argument).
What the readers found beside the rows (`readers/base.py`: `SourceFacts`) is what is judged.

    marked(result, arguments, tool) -> a result small enough to pass through as it is, with the
                                       PARTIAL line added when its source says it cut it
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from datadesk.domain.artifacts import Artifact
from datadesk.domain.sources import SourceHints
from datadesk.domain.tools import TabularStream, ToolResult
from datadesk.offload.readers import result_stream
from datadesk.offload.readers.base import SourceFacts
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.text.notes import CUT_WORDS, stated_rows

MAX_META_CHARS = 2_000  # the source's metadata kept with the artifact and shown to the model
MAX_VALUE_CHARS = 300
MAX_WORDS_CHARS = 600

_FLAG_KEYS = {"truncated", "istruncated", "hasmore", "more", "limited", "partial", "incomplete",
              "moreavailable", "hasnext", "hasnextpage", "resultstruncated", "rowstruncated", "capped"}
_CURSOR_KEYS = {"nextcursor", "cursor", "nextpagetoken", "pagetoken", "nexttoken", "continuationtoken", "next",
                "nextpage", "nextoffset", "nextlink", "nexturl", "scrollid", "after"}
_TOTAL_KEYS = {"total", "totalcount", "totalrows", "totalresults", "totalhits", "total_size", "totalsize",
               "matched", "rowsmatched", "count_total"}
_CAP_KEYS = {"limit", "maxrows", "max_rows", "pagesize", "perpage", "top", "maxresults", "rowlimit"}
_NOTE_KEYS = {"warning", "warnings", "message", "messages", "note", "notes", "notice", "info", "hint"}
_CUT_WORDS = CUT_WORDS


def _norm(key: str) -> str:
    return key.replace("_", "").replace("-", "").lower()


def _truthy(v: Any) -> bool:
    return v not in (None, False, 0, "", "false", "False", [], {})


@dataclass
class Verdict:
    partial: bool
    words: list[str]
    how: str


def judge(facts: SourceFacts, rows: int, arguments: str | None = None, tool: str | None = None) -> Verdict:
    """Did the source itself cut the result? Its own words, and how to get the rest."""
    words: list[str] = []
    cursor = None
    for key, value in facts.envelope.items():
        k = _norm(key)
        if k in _FLAG_KEYS and _truthy(value):
            words.append(f"{key}: {json.dumps(value)}")
        elif k in _CURSOR_KEYS and _truthy(value) and isinstance(value, (str, int)):
            words.append(f"{key}: {json.dumps(value)}")
            cursor = (key, value)
        elif k in _TOTAL_KEYS and isinstance(value, int) and not isinstance(value, bool) and value > rows:
            words.append(f"{key}: {value:,} (this result has {rows:,} rows)")
        elif k in _CAP_KEYS and isinstance(value, int) and not isinstance(value, bool) and value == rows and rows:
            words.append(f"{key}: {value:,} (exactly as many rows came back)")
        elif k in _NOTE_KEYS:
            for text in (value if isinstance(value, list) else [value]):
                if isinstance(text, str) and _CUT_WORDS.search(text):
                    words.append(f"{key}: {text}")
    words += [ln.strip() for ln in facts.prose if _CUT_WORDS.search(ln)]
    stated = _stated(facts)
    if stated is not None and stated > rows:
        words.append(f"{stated:,} rows, its count says (this result has {rows:,})")
    hints = facts.hints
    cap_arg = None
    if hints is not None and hints.caps:
        args = _arguments(arguments)
        for name, default in hints.caps.items():
            limit = args.get(name, default)
            if not (isinstance(limit, int) and not isinstance(limit, bool) and limit == rows and rows):
                continue
            if name.startswith("("):  # documented in the tool's description, not an argument
                words.append(f"{rows:,} rows = the most its description says it returns")
                continue
            cap_arg = (name, limit)
            words.append(f"{rows:,} rows = the tool's `{name}` ({'given' if name in args else 'default'}: "
                         f"{limit:,})")
    words = _cap_words(words)
    if not words:
        return Verdict(False, [], "")
    return Verdict(True, words, _how(cursor, cap_arg, hints, tool))


def _stated(facts: SourceFacts) -> int | None:
    """The row count the source stated beside a text table (`(32 rows)`, `Result: 32 rows`)."""
    if facts.stated_rows is None and facts.prose:
        facts.stated_rows = stated_rows(facts.prose)
    return facts.stated_rows


def _arguments(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _how(cursor: tuple[str, Any] | None, cap_arg: tuple[str, int] | None, hints: SourceHints | None,
         tool: str | None) -> str:
    call = f"`{tool}`" if tool else "the tool"
    paging = (hints.paging or []) if hints is not None else []
    if cursor is not None and paging:
        return f"to get the next page, call {call} again with `{paging[0]}` = {json.dumps(cursor[1])}"
    if cursor is not None:
        return f"the source gave `{cursor[0]}` = {json.dumps(cursor[1])} for the next page; pass it back to {call}"
    if paging:
        return f"page through the rest with {call}'s `{paging[0]}` argument, or ask a narrower query"
    if cap_arg is not None:
        return (f"call {call} again with a larger `{cap_arg[0]}` (it was {cap_arg[1]:,}), or ask a narrower "
                "query (filters, aggregation)")
    return ("ask the source for less or in parts: a narrower query (filters, aggregation) or LIMIT/OFFSET pages")


def _cap_words(words: list[str]) -> list[str]:
    out, used = [], 0
    for w in dict.fromkeys(words):
        w = w if len(w) <= MAX_VALUE_CHARS else w[:MAX_VALUE_CHARS - 1] + "…"
        if used + len(w) > MAX_WORDS_CHARS:
            break
        out.append(w)
        used += len(w)
    return out


def cap_metadata(facts: SourceFacts, rows: int | None = None) -> dict[str, Any] | None:
    """The envelope's other keys (and prose around a table), at most MAX_META_CHARS of JSON."""
    meta: dict[str, Any] = {}
    for key, value in facts.envelope.items():
        meta[str(key)[:80]] = value
    if facts.prose:
        meta["text around the table"] = " / ".join(ln.strip() for ln in facts.prose)[:MAX_VALUE_CHARS]
    if rows is not None and _stated(facts) is not None:
        meta["rows stated by the source"] = facts.stated_rows
        if facts.stated_rows < rows:  # more came than it says: the count is kept, the rows too
            meta["rows stated by the source"] = f"{facts.stated_rows:,} (but {rows:,} rows were read)"
    if not meta:
        return None
    out: dict[str, Any] = {}
    used = 2
    for key, value in meta.items():
        text = json.dumps(value, ensure_ascii=False, default=str)
        if len(text) > MAX_VALUE_CHARS:
            value = text[:MAX_VALUE_CHARS - 1] + "…"
            text = json.dumps(value, ensure_ascii=False)
        if used + len(key) + len(text) + 4 > MAX_META_CHARS:
            out["…"] = f"{len(meta) - len(out)} more keys not kept"
            break
        out[key] = value
        used += len(key) + len(text) + 4
    return out


def annotate(art: Artifact, table: TabularStream) -> Artifact:
    """The artifact of a shaped stream, with its shape, metadata and the source's truncation."""
    facts = getattr(table, "facts", None)
    if not isinstance(facts, SourceFacts):
        return art
    art.shape = facts.shape
    art.source_meta = cap_metadata(facts, art.rows or 0)
    verdict = judge(facts, art.rows or 0, art.origin.arguments, art.origin.tool)
    if verdict.partial:
        said = "; ".join(verdict.words)
        art.source_note = f"the source says: {said}. {verdict.how[:1].upper()}{verdict.how[1:]}."
        if art.status != "partial":  # the byte ceiling, when also hit, keeps its own reason first
            art.status = "partial"
            art.partial_by = "source"
            art.partial_reason = f"cut by the source ({said})"
    return art


def truncation_note(table: TabularStream, rows: int) -> str:
    """For a result shown truncated (no artifact): the line saying the source cut it, or ""."""
    facts = getattr(table, "facts", None)
    if not isinstance(facts, SourceFacts):
        return ""
    verdict = judge(facts, rows)
    if not verdict.partial:
        return ""
    return (f"\nPARTIAL (by the source): the source itself cut this result ({'; '.join(verdict.words)}). "
            f"{verdict.how[:1].upper()}{verdict.how[1:]}.")


_WORTH_A_LOOK = re.compile(CUT_WORDS.pattern + r"|\d\s+rows?\b", re.I)


def marked(result: ToolResult, arguments: str | None = None, tool: str | None = None) -> ToolResult:
    """A result small enough to reach the model as it is: with a PARTIAL line added when it is a
    table whose source says it cut it (its words, or a count above the rows), so that those
    words never reach the model unmarked. Only a text that holds such words is read at all."""
    if result.table is not None or not _WORTH_A_LOOK.search(result.content):
        return result
    try:
        table = result_stream(result)
        if table is None:
            return result
        with table:
            rows = sum(batch.num_rows for batch in table)
    except TabularParseError:
        return result
    facts = getattr(table, "facts", None)
    if not isinstance(facts, SourceFacts):
        return result
    verdict = judge(facts, rows, arguments, tool)
    if not verdict.partial:
        return result
    note = (f"\n\nPARTIAL (by the source): the source itself cut this result ({'; '.join(verdict.words)}); "
            f"these {rows:,} rows are NOT all the data. {verdict.how[:1].upper()}{verdict.how[1:]}.")
    return msgspec.structs.replace(result, content=result.content + note,
                                   meta=msgspec.structs.replace(result.meta, rows=rows))
