"""Every common shape of tabular tool output -> typed record batches, plus what the source
said about its result (issue 17). The one entry point for the offload pipeline and the bench.

    parse_text(text, hints)   -> ShapedStream | None   (None: not a table)
    result_stream(result)     -> the stream of a ToolResult (structured content first)
    annotate(artifact, table) -> the artifact with shape, source metadata and the
                                 source's own truncation ("partial (by the source)")

Shapes: JSON (arrays of objects / arrays with or without a header row, `{columns, rows}`,
envelopes `{data|rows|results|items: [...], ...}`, NDJSON, dicts of lists, nested objects
as structs; `shapes_json`), Python reprs (`shapes_repr`, exact fallback `pyrepr`), CSV/TSV
with or without a header (`csvfile`), Markdown, ASCII-box, psql and fixed-width tables and
any of these inside prose (`shapes_text`). Never `eval`.

Truncation said by the source: a flag (`truncated`, `has_more`, `limited`, ...), a cursor
(`next_cursor`, `nextPageToken`, ...), a total larger than the rows, a warning or a prose line
that says so, or exactly as many rows as a documented cap (the tool's `limit`-like argument).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import msgspec
import pyarrow as pa

from datadesk.domain.artifacts import Artifact
from datadesk.domain.sources import SourceHints
from datadesk.domain.tools import TabularStream, ToolResult
from datadesk.offload.readers.json import locate as shapes_json
from datadesk.offload.readers.columns import TabularParseError
from datadesk.offload.readers.csv.pyarrow_engine import csv_batches
from datadesk.offload.readers.pyrepr.exact import repr_batches
from datadesk.offload.readers.pyrepr.json_engine import looks_like_repr
from datadesk.offload.readers.text.locate import csv_has_header, find_table, text_batches

BATCH_ROWS = 131_072
MAX_META_CHARS = 2_000  # the source's metadata kept with the artifact and shown to the model
MAX_VALUE_CHARS = 300
MAX_WORDS_CHARS = 600


@dataclass
class SourceFacts:
    """What came with the rows: the shape, the envelope's other keys, prose around a table."""

    shape: str
    envelope: dict[str, Any] = field(default_factory=dict)
    prose: list[str] = field(default_factory=list)
    hints: SourceHints | None = None


class ShapedStream(TabularStream):
    """A tabular stream that knows its shape and what its source said beside the rows."""

    def __init__(self, schema: pa.Schema | None, batches: Iterator[pa.RecordBatch], facts: SourceFacts) -> None:
        super().__init__(schema, batches)
        self.facts = facts


# ------------------------------------------------------------------------ parsing

def parse_text(text: str, hints: SourceHints | None = None, batch_rows: int = BATCH_ROWS) -> ShapedStream | None:
    """The table in `text`, whatever its shape, or None when there is none.

    The first batch is read now (a parse error there means "not a table"); the rest streams.
    Errors further on raise TabularParseError naming the place."""
    try:
        gen, facts = _open(text.lstrip("\ufeff"), batch_rows)
    except TabularParseError:
        return None
    if gen is None:
        return None
    facts.hints = hints
    try:
        first = next(gen)
    except StopIteration:
        return ShapedStream(None, iter(()), facts)
    except TabularParseError:
        return None
    if first.num_columns == 0:
        return None
    return ShapedStream(first.schema, _chain(first, gen, hints), facts)


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], hints: SourceHints | None) -> Iterator[pa.RecordBatch]:
    formats = hints.column_formats if hints is not None else None
    yield _formatted(first, formats)
    for batch in rest:
        yield _formatted(batch, formats)


def _formatted(batch: pa.RecordBatch, formats: dict[str, str] | None) -> pa.RecordBatch:
    if not formats:
        return batch
    from datadesk.offload.readers.casts import sql_cast

    sql = {"date": "DATE", "date-time": "TIMESTAMP WITH TIME ZONE", "integer": "BIGINT", "number": "DOUBLE",
           "boolean": "BOOLEAN"}
    arrays = [sql_cast(col, sql.get(formats.get(name, ""))) if formats.get(name) in sql else col
              for name, col in zip(batch.schema.names, batch.columns)]
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _open(text: str, batch_rows: int) -> tuple[Iterator[pa.RecordBatch] | None, SourceFacts]:
    head = text.lstrip()[:1]
    if head in ("[", "{", "("):
        try:
            return _structured_text(text, batch_rows, [])
        except TabularParseError:
            pass  # perhaps JSON followed by prose: found below
    lines = text.splitlines()
    table = find_table(lines)
    if table is None:
        raise TabularParseError("no table found in the text")
    prose = [ln for ln in table.before + table.after if ln.strip()]
    if table.kind == "json":
        body = "\n".join(lines[table.start:table.end])
        return _structured_text(body, batch_rows, prose)
    if table.kind in ("csv", "tsv"):
        body = text if not prose else "\n".join(lines[table.start:table.end])
        delim = "\t" if table.kind == "tsv" else ","
        header = csv_has_header("\n".join(lines[table.start:table.start + 200]), delim)
        shape = f"{table.kind.upper()} {'with a header row' if header else 'without a header row'}"
        return csv_batches(body, delim, header=header), SourceFacts(shape + (" in prose" if prose else ""),
                                                                   prose=prose)
    facts = SourceFacts(table.shape + (" in prose" if prose else ""), prose=prose)
    return text_batches(lines, table, batch_rows), facts


def _structured_text(text: str, batch_rows: int, prose: list[str]) -> tuple[Iterator[pa.RecordBatch], SourceFacts]:
    if looks_like_repr(text):
        kind = _repr_kind(text)
        return repr_batches(text, batch_rows), SourceFacts(f"Python repr of {kind}" + (" in prose" if prose else ""),
                                                          prose=prose)
    found = shapes_json.locate(text)
    facts = SourceFacts(found.shape + (" in prose" if prose else ""), envelope=found.envelope, prose=prose)
    return shapes_json.batches(found, batch_rows), facts


def _repr_kind(text: str) -> str:
    head = text.lstrip()[:3]
    if head.startswith("{"):
        return "a dict of lists"
    outer = "a tuple" if head[0] == "(" else "a list"
    inner = {"(": "tuples", "{": "dicts", "[": "lists", "]": "nothing (empty)"}.get(head[1:2], "values")
    return f"{outer} of {inner}"


def result_stream(result: ToolResult, batch_rows: int = BATCH_ROWS) -> TabularStream | None:
    """The table of a tool result: its own stream, its structured content, or its text."""
    if result.table is not None:
        return result.table
    hints = result.source
    structured = hints.structured if hints is not None else None
    if structured is not None:
        table = _structured(structured, hints, batch_rows)
        if table is not None:
            return table
    return parse_text(result.content, hints, batch_rows)


def _structured(value: Any, hints: SourceHints, batch_rows: int) -> ShapedStream | None:
    if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), str):
        return parse_text(next(iter(value.values())), hints, batch_rows)  # {"result": "<the text>"}
    if not isinstance(value, (dict, list)):
        return None
    try:
        data = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError):
        data = json.dumps(value, default=str).encode()
    table = parse_text(data.decode("utf-8"), hints, batch_rows)
    if table is not None:
        table.facts.shape = f"structured content: {table.facts.shape}"
    return table


# ------------------------------------------------------------------- truncation

_FLAG_KEYS = {"truncated", "istruncated", "hasmore", "more", "limited", "partial", "incomplete",
              "moreavailable", "hasnext", "hasnextpage", "resultstruncated", "rowstruncated", "capped"}
_CURSOR_KEYS = {"nextcursor", "cursor", "nextpagetoken", "pagetoken", "nexttoken", "continuationtoken", "next",
                "nextpage", "nextoffset", "nextlink", "nexturl", "scrollid", "after"}
_TOTAL_KEYS = {"total", "totalcount", "totalrows", "totalresults", "totalhits", "total_size", "totalsize",
               "matched", "rowsmatched", "count_total"}
_CAP_KEYS = {"limit", "maxrows", "max_rows", "pagesize", "perpage", "top", "maxresults", "rowlimit"}
_NOTE_KEYS = {"warning", "warnings", "message", "messages", "note", "notes", "notice", "info", "hint"}
_CUT_WORDS = re.compile(r"truncat|limited to|limit(ed)? of|only (the )?first|showing (the )?first|first \d[\d,]* (rows|results)"
                        r"|more (rows|results|data|available)|has more|next page|were omitted|omitted|capped|cut off|partial",
                        re.I)


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


def cap_metadata(facts: SourceFacts) -> dict[str, Any] | None:
    """The envelope's other keys (and prose around a table), at most MAX_META_CHARS of JSON."""
    meta: dict[str, Any] = {}
    for key, value in facts.envelope.items():
        meta[str(key)[:80]] = value
    if facts.prose:
        meta["text around the table"] = " / ".join(ln.strip() for ln in facts.prose)[:MAX_VALUE_CHARS]
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
    art.source_meta = cap_metadata(facts)
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
