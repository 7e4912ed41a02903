"""Which bytes of a delimited file or text are its table, and how to read them: the dialect
sniffed over its first 64 KiB (`dialect.sniff_dialect`; what the user chose on a re-import taken
as given), its encoding (`encoding.sniff_encoding`), the span from its header line (past a BOM
and a title block) to before a totals line found in its last 64 KiB. Nothing else of the file is
read: pyarrow then streams the span (`pyarrow_engine.csv_batches`).

    plan_file(path, delimiter, choices) -> (Dialect, Span)
    plan_text(body, delimiter, header)  -> (Dialect, Span)   CSV/TSV records in a tool's text
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from datadesk.offload.readers.csv import encoding as enc
from datadesk.offload.readers.csv.dialect import Dialect, ReadChoices, is_totals, sniff_dialect
from datadesk.offload.readers.csv.header import csv_has_header
from datadesk.offload.readers.errors import TabularParseError


@dataclass(frozen=True)
class Span:
    """The part of a file pyarrow reads: bytes [`start`, `end`) (past a BOM and the lines above
    the header; before a totals line), in `encoding`; `lines_before` lines come before `start`
    (errors name the line of the file)."""

    start: int = 0
    end: int | None = None  # < 0: that many bytes before the end (a tool's text)
    encoding: str = "utf-8"
    lines_before: int = 0

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end is None


_HEAD = 64 * 1024
_TAIL = 64 * 1024


def plan_file(path: Path, delimiter: str = ",", choices: ReadChoices | None = None) -> tuple[Dialect, Span]:
    """How to read a delimited file: its dialect sniffed over its first 64 KiB (what `choices`
    fix is taken as given), and the span from its header line to before a totals line."""
    choices = choices or ReadChoices()
    with open(path, "rb") as fh:
        head = fh.read(_HEAD)
        size = fh.seek(0, 2)
        complete = size <= len(head)
        encoding = choices.encoding or enc.sniff_encoding(head, complete)
        if encoding is None:
            raise TabularParseError("the file is not text (binary bytes where a CSV has characters)")
        bom = enc.bom_length(head, encoding)
        codec = enc.stream_encoding(head, encoding)
        text = enc.decode_head(head[bom:], codec, complete)
        dialect = sniff_dialect(text, complete, choices) or _unsniffed(delimiter, choices)
        if choices.header_row is None and dialect.header_row == 1 and not _has_header(text, dialect):
            dialect = replace(dialect, header_row=0)  # the first record is data, as a tool's text would say
        start = bom + _line_start(head[bom:], dialect.header_row - 1 if dialect.header else 0, codec)
        if start == bom and codec == enc.UTF8:
            start = 0  # pyarrow skips a UTF-8 BOM itself, and reads a whole file faster
        last, last_at = _last_line(fh, head, size, bom, codec, complete)
    end = None
    if last is not None and last_at > start and dialect.header and is_totals(last, dialect):
        dialect, end = replace(dialect, totals=last.strip()), last_at
    dialect = replace(dialect, encoding=encoding)
    return dialect, Span(start, end, codec, max(0, dialect.header_row - 1))


def _has_header(text: str, dialect: Dialect) -> bool:
    """Whether the first record is a header (`header.csv_has_header`, as for a tool's text)."""
    lines = text.split("\n", 201)[:200]
    return csv_has_header("\n".join(lines), dialect.delimiter)


def _unsniffed(delimiter: str, choices: ReadChoices) -> Dialect:
    """The dialect when no delimiter splits the head into a table: what the user chose, else the
    format's own (reading it then names what is wrong)."""
    header_row = 1 if choices.header_row is None else choices.header_row
    return Dialect(delimiter=choices.delimiter or delimiter, decimal=choices.decimal or ".",
                   thousands=choices.thousands or "", header_row=header_row,
                   chosen=tuple(k for k in choices.as_dict() if k != "encoding"))


def _newline(codec: str) -> bytes:
    return {"utf-16-le": b"\n\x00", "utf-16-be": b"\x00\n"}.get(codec, b"\n")


def _line_start(data: bytes, lines: int, codec: str) -> int:
    """Byte offset in `data` of the start of its line `lines + 1` (after `lines` newlines)."""
    nl, pos = _newline(codec), 0
    for _ in range(lines):
        found = data.find(nl, pos)
        while found >= 0 and len(nl) == 2 and found % 2:  # a UTF-16 newline sits on a code unit
            found = data.find(nl, found + 1)
        if found < 0:
            return len(data)
        pos = found + len(nl)
    return pos


def _last_line(fh, head: bytes, size: int, bom: int, codec: str, complete: bool) -> tuple[str | None, int]:
    """(the last non-blank line of the file, its byte offset) from the file's last 64 KiB;
    (None, 0) when there is none or it is longer than that."""
    base = bom if complete else max(bom, size - _TAIL)
    if len(_newline(codec)) == 2 and (base - bom) % 2:
        base += 1  # on a UTF-16 code unit
    if complete:
        data = head[base:]
    else:
        fh.seek(base)
        data = fh.read()
    if len(_newline(codec)) == 1:
        stripped = data.rstrip(b" \t\r\n")
        cut = stripped.rfind(b"\n")
        if cut < 0 and base > bom:
            return None, 0
        return stripped[cut + 1:].decode(codec, "replace").strip() or None, base + cut + 1
    text = data.decode(codec, "replace").rstrip()
    cut = text.rfind("\n")
    if cut < 0 and base > bom:
        return None, 0
    return text[cut + 1:].strip() or None, base + len(text[:cut + 1].encode(codec, "replace"))


def plan_text(body: str, delimiter: str, header: bool) -> tuple[Dialect, Span]:
    """How to read delimited records found in a tool's text: the same sniff as a file's, with
    the delimiter `text.locate` found; a totals line at the end is left out."""
    dialect = sniff_dialect(body[:_HEAD], len(body) <= _HEAD, ReadChoices(delimiter=delimiter)) \
        or Dialect(delimiter=delimiter)
    start = 0
    if not header:
        dialect = replace(dialect, header_row=0, skipped=())
    elif dialect.header_row > 1:
        at = 0
        for _ in range(dialect.header_row - 1):
            at = body.find("\n", at) + 1
        start = len(body[:at].encode("utf-8"))
    end = None
    last, at = _last_text_line(body)
    if at > 0 and is_totals(last, dialect):
        dialect, end = replace(dialect, totals=last.strip()), -len(body[at:].encode("utf-8"))
    return dialect, Span(start, end, "utf-8", max(0, dialect.header_row - 1))


def _last_text_line(body: str) -> tuple[str, int]:
    """The last non-blank line of `body` and where it starts (without copying the body)."""
    stop = len(body)
    while stop > 0 and body[stop - 1] in " \t\r\n":
        stop -= 1
    at = body.rfind("\n", 0, stop) + 1
    return body[at:stop], at
