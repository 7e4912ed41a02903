"""What an input is, by its content (never by a name), and where its rows are: the sniffs and
locates of `ORDER` (`readers/__init__.py`).

- A file (an upload, a paste once staged): `FileHead` is what the sniffs read of it (its first
  64 KiB, its last bytes, its size, its head decoded as text); magic numbers first, then by the
  text's beginning: a Python repr, JSON, an HTML table, vertical records, a drawn table, TSV,
  CSV (any dialect of `csv.dialect`: `,` `;` tab `|`, after a title block; most records as wide
  as the header), any other table a tool's text may hold.
  Where the text is a shape of a tool's text, its head is sniffed as one (`FileHead.probe`).
- A tool's text: `TextProbe` holds it with its lines and the first table found in them
  (`text.locate.find_table`); a Python repr and JSON by their first characters, an HTML
  `<table>`, vertical records (`text.vertical`), then a table in the lines (after up to 20
  lines of prose): JSON or a repr in prose, CSV/TSV, a drawn one.
  Each `locate_*` says where the rows are and what the model is told the shape was.
"""

from __future__ import annotations

import re
import zipfile
from functools import cached_property
from pathlib import Path
from typing import Callable

from datadesk.offload.readers.base import SourceFacts
from datadesk.offload.readers.csv.dialect import Dialect, consistent_delimiter, sniff_dialect
from datadesk.offload.readers.csv.encoding import bom_length, decode_head, sniff_encoding, stream_encoding
from datadesk.offload.readers.csv.header import csv_has_header
from datadesk.offload.readers.csv.plan import plan_text
from datadesk.offload.readers.csv.pyarrow_engine import DelimitedText
from datadesk.offload.readers.html import stdlib_engine as html
from datadesk.offload.readers.json.locate import JsonRows, locate
from datadesk.offload.readers.text.locate import TextTable, find_table
from datadesk.offload.readers.text.pyarrow_engine import DrawnTable
from datadesk.offload.readers.text.vertical import VerticalRecords, find_records

_SNIFF_CHARS = 64 * 1024
_WS = re.compile(r"[ \t\n\r]*")


# ------------------------------------------------------------------------- files

class FileHead:
    """What the sniffs read of a file: its first 64 KiB (`data`), its last 4 bytes, its size and
    the head as text (`text`: None when it looks binary or is an archive)."""

    def __init__(self, data: bytes, tail: bytes, size: int, text: str | None, complete: bool,
                 path: Path | None = None) -> None:
        self.data, self.tail, self.size, self.text, self.complete, self.path = data, tail, size, text, complete, path

    @classmethod
    def of_file(cls, path: Path) -> "FileHead":
        with open(path, "rb") as f:
            head = f.read(_SNIFF_CHARS)
            size = f.seek(0, 2)
            tail = b""
            if size >= 8:
                f.seek(size - 4)
                tail = f.read(4)
        complete = size <= len(head)
        text = None if head[:4] == b"PK\x03\x04" else _text_prefix(head, complete)  # a zip is never text
        return cls(head, tail, size, text.lstrip("\ufeff") if text is not None else None, complete, Path(path))

    @classmethod
    def of_text(cls, text: str) -> "FileHead":
        """A pasted text, sniffed as the file it will be saved as (only its text can match)."""
        return cls(b"", b"", len(text), text[:_SNIFF_CHARS].lstrip("\ufeff"), len(text) <= _SNIFF_CHARS)

    @cached_property
    def records(self) -> str | None:
        """The text without its last line when that may be cut short (the head of a longer file)."""
        if self.text is None or self.complete:
            return self.text
        cut = self.text.rfind("\n")
        return self.text[:cut] if cut > 0 else self.text

    @cached_property
    def dialect(self) -> Dialect | None:
        """The delimited dialect of the head (`csv.dialect`), None when it is not delimited records."""
        return sniff_dialect(self.text, self.complete) if self.text is not None else None

    @cached_property
    def probe(self) -> "TextProbe | None":
        """The head as a tool's text, for the sniffs of shapes a tool's text may have."""
        return TextProbe(self.records) if self.text is not None else None


def is_parquet(head: FileHead) -> bool:
    return head.size >= 12 and head.data[:4] == b"PAR1" and head.tail == b"PAR1"


def is_workbook(head: FileHead) -> bool:
    """A zip holding `xl/workbook.xml` (an .xlsx); any other zip is nothing we read."""
    if head.data[:4] != b"PK\x03\x04" or head.path is None:
        return False
    try:
        with zipfile.ZipFile(head.path) as zf:
            return "xl/workbook.xml" in zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def magic(*prefixes: bytes) -> Callable[[FileHead], bool]:
    """The sniff of a format known by the bytes it starts with."""
    return lambda head: head.data.startswith(prefixes)


def is_webp(head: FileHead) -> bool:
    return head.data[:4] == b"RIFF" and head.data[8:12] == b"WEBP"


def is_json(head: FileHead) -> bool:
    """Text whose first character (after white space) opens a JSON array or object."""
    if head.text is None:
        return False
    pos = _WS.match(head.text).end()
    return head.text[pos:pos + 1] in ("[", "{")


def is_repr_text(head: FileHead) -> bool:
    """A Python repr (`[(1, 'a'), ...]`, `[{'a': 1}]`, `{'a': [1, 2]}`): before JSON, whose
    first character it shares."""
    return head.text is not None and looks_like_repr(head.text)


def is_html_text(head: FileHead) -> bool:
    return head.probe is not None and has_html_table(head.probe)


def is_vertical_text(head: FileHead) -> bool:
    return head.probe is not None and has_vertical_records(head.probe)


def is_drawn_text(head: FileHead) -> bool:
    """A Markdown / box / psql / fixed-width table: before CSV, which a Markdown table whose
    cells hold commas would pass for."""
    return head.probe is not None and has_drawn_table(head.probe)


def is_value_in_prose_text(head: FileHead) -> bool:
    """JSON (or a repr) after a preamble: before CSV, which the commas of JSON would pass for."""
    return head.probe is not None and has_value_in_prose(head.probe)


def is_text_table(head: FileHead) -> bool:
    """Any other table a tool's text may hold (CSV after a preamble the CSV sniff refused ...)."""
    return head.probe is not None and head.probe.table is not None


def is_tsv(head: FileHead) -> bool:
    return head.dialect is not None and head.dialect.delimiter == "\t"


def is_csv(head: FileHead) -> bool:
    """Records split by `,` `;` or `|` (`csv.dialect`: after a title, with a ragged row)."""
    return head.dialect is not None and head.dialect.delimiter != "\t"


def _text_prefix(head: bytes, complete: bool) -> str | None:
    """Decode a file head for sniffing in the encoding its bytes say (UTF-8, UTF-16 by its BOM
    or its NULs, else Windows-1252: `csv.encoding`), or None when it looks binary."""
    encoding = sniff_encoding(head, complete)
    if encoding is None:
        return None
    text = decode_head(head[bom_length(head, encoding):], stream_encoding(head, encoding), complete)
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r")
    if controls > len(text) // 100:
        return None
    return text


# ------------------------------------------------------------------- a tool's text

class TextProbe:
    """A tool's text as the sniffs look at it: its first character, its lines and the first table
    found in them, each worked out once, when a sniff first asks. `prose`: the lines around it,
    when it is a block found in prose."""

    def __init__(self, text: str, prose: list[str] | None = None) -> None:
        self.text = text
        self.prose = prose or []

    @cached_property
    def head(self) -> str:
        return self.text.lstrip()[:1]

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def table(self) -> TextTable | None:
        return find_table(self.lines)

    @cached_property
    def html(self) -> int | None:
        """Where an HTML `<table>` opens: anywhere in the head of an HTML document (the text
        starts with a tag), else after at most 20 lines of prose."""
        return html.find_table(self.text, 1 << 30 if self.head == "<" else 20)

    @cached_property
    def vertical(self) -> VerticalRecords | None:
        return find_records(self.lines)

    def shape(self, what: str) -> str:
        return what + (" in prose" if self.prose else "")


def looks_like_repr(text: str) -> bool:
    """A Python repr table starts `[(`, `[{'`, `((`, `{'` with a list, `[[`+quote or `[]` ... (cheap check)."""
    head = text.lstrip()[:3]
    return head[:2] in ("[(", "((", "[]", "{'") or head in ("[{'", "({'") or (head[:2] == "[[" and "'" in text[:200])


def is_python_repr(probe: TextProbe) -> bool:
    return looks_like_repr(probe.text)


def is_json_value(probe: TextProbe) -> bool:
    return probe.head in ("[", "{")


def has_html_table(probe: TextProbe) -> bool:
    return probe.html is not None


def has_vertical_records(probe: TextProbe) -> bool:
    return probe.vertical is not None


def has_value_in_prose(probe: TextProbe) -> bool:
    """A line opening a JSON value (or a repr) after up to 20 lines of prose, the rest a trailer."""
    return probe.table is not None and probe.table.kind == "json"


def has_delimited_table(probe: TextProbe) -> bool:
    return probe.table is not None and probe.table.kind in ("csv", "tsv")


def has_drawn_table(probe: TextProbe) -> bool:
    return probe.table is not None and probe.table.kind in ("markdown", "box", "psql", "fixed")


def locate_repr(probe: TextProbe) -> tuple[str, SourceFacts]:
    return probe.text, SourceFacts(probe.shape(f"Python repr of {_repr_kind(probe.text)}"), prose=probe.prose)


def _repr_kind(text: str) -> str:
    head = text.lstrip()[:3]
    if head.startswith("{"):
        return "a dict of lists"
    outer = "a tuple" if head[0] == "(" else "a list"
    inner = {"(": "tuples", "{": "dicts", "[": "lists", "]": "nothing (empty)"}.get(head[1:2], "values")
    return f"{outer} of {inner}"


def locate_json(probe: TextProbe) -> tuple[JsonRows, SourceFacts]:
    """Where the rows of the JSON text are (TabularParseError: not tabular JSON after all)."""
    found = locate(probe.text)
    return found, SourceFacts(probe.shape(found.shape), envelope=found.envelope, prose=probe.prose)


def value_block(probe: TextProbe) -> TextProbe:
    """The lines of a JSON value (or repr) found in prose, with the prose around them."""
    table = probe.table
    return TextProbe("\n".join(probe.lines[table.start:table.end]), prose=_prose(table))


def locate_html(probe: TextProbe) -> tuple[html.HtmlText, SourceFacts]:
    """The HTML text; its prose (the text around the table) is found while it is read."""
    facts = SourceFacts("HTML table")
    return html.HtmlText(probe.text, facts), facts


def locate_vertical(probe: TextProbe) -> tuple[VerticalRecords, SourceFacts]:
    """The records; the trailer after them (a count, a cut) is added to the prose as they are read."""
    records = probe.vertical
    before = [ln for ln in probe.lines[:records.start] if ln.strip()]
    records.facts = SourceFacts(records.shape + (" in prose" if before else ""), prose=before)
    return records, records.facts


def locate_delimited(probe: TextProbe) -> tuple[DelimitedText, SourceFacts]:
    """CSV/TSV records (any delimiter of `csv.dialect`), read in the dialect a file of them would
    be: decimal comma, thousands separators, a totals line at the end left out and said."""
    table, lines = probe.table, probe.lines
    prose = _prose(table)
    body = probe.text if not prose else "\n".join(lines[table.start:table.end])
    delim = consistent_delimiter(lines[table.start:table.start + 6]) or ("\t" if table.kind == "tsv" else ",")
    header = csv_has_header("\n".join(lines[table.start:table.start + 200]), delim)
    dialect, span = plan_text(body, delim, header)
    shape = f"{table.kind.upper()} {'with a header row' if header else 'without a header row'}"
    shape += dialect.details() + (" in prose" if prose else "")
    facts = SourceFacts("; ".join([shape] + dialect.notes()), prose=prose)
    return DelimitedText(body, delim, header, dialect, span), facts


def locate_drawn(probe: TextProbe) -> tuple[DrawnTable, SourceFacts]:
    table = probe.table
    prose = _prose(table)
    return DrawnTable(probe.lines, table), SourceFacts(table.shape + (" in prose" if prose else ""), prose=prose)


def _prose(table: TextTable) -> list[str]:
    return [ln for ln in table.before + table.after if ln.strip()]
