"""The dialect of a delimited text, sniffed over a sample: which delimiter (`,` `;` tab `|`),
which quote, decimal comma or point and the thousands separator (`1.234,56`, `1 234,56`,
`1,234.56`), a title or note block above the header (skipped and reported), a totals line at
the end (left out and reported). One module for every door: a file (an upload, a paste) and a
tool's text (`text.locate`, `sniff.locate_delimited`) read the same text the same way.

    sniff_dialect(text, complete, choices)   -> Dialect | None  (None: not a delimited table)
    consistent_delimiter(lines)              -> the delimiter splitting all lines alike, or None
    is_totals(line, dialect)                 -> whether a record is a totals line
    ReadChoices.parse(body)                  -> what the user chose on a re-import (ChoiceError
                                                naming the field)

Measured against the sniffers that exist (docs/analyst-guide.md, "CSV dialects"): clevercsv
takes ~0.5 s on a 64 KiB sample (too slow for every upload and tool result) and DuckDB's
`sniff_csv` 30-75 ms and needs a file; neither detects decimal commas, thousands separators or
totals lines. This one parses the sample with the csv module (C) once per candidate delimiter,
a few milliseconds, and scores each by how many records share one width (clevercsv's "pattern"
idea) and how clean its cells are.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from typing import Any

DELIMITERS = (",", ";", "\t", "|")
DECIMALS = (".", ",")
THOUSANDS = ("", ".", ",", " ")  # " " stands for U+0020, U+00A0 and U+202F alike
SPACES = (" ", "\u00a0", "\u202f")
_MAX_TITLE = 20  # title or note lines above the header, at most
_MAX_RECORDS = 200  # records of the sample the sniff looks at
_MAX_HEADER_ROW = 1_000_000
_SEP_LINE = re.compile(r"\A\s*sep=(.)\s*\Z")  # Excel's "sep=;" hint line
_TOTAL_WORDS = {"total", "totals", "grand total", "sum", "subtotal", "sub-total", "gesamt", "summe", "insgesamt",
                "gesamtsumme", "total général", "total general", "totale", "somme", "suma", "totaal", "totalt",
                "yhteensä", "razem", "celkem", "összesen"}
_TOTAL_VALUE = re.compile(r"\A[\s\d.,+\-()%€$£¥\u00a0\u202f']*\Z")
_INT = re.compile(r"\A[+-]?\d+\Z")
_DOT_DEC = re.compile(r"\A[+-]?\d*\.\d+\Z")
_COMMA_DEC = re.compile(r"\A[+-]?\d*,\d+\Z")
_DOT_GROUPS = re.compile(r"\A[+-]?\d{1,3}(?:\.\d{3})+(?:,\d+)?\Z")  # 1.234 / 1.234,56
_COMMA_GROUPS = re.compile(r"\A[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?\Z")  # 1,234 / 1,234.56
_SPACE_GROUPS = re.compile(r"\A[+-]?\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?:[.,]\d+)?\Z")  # 1 234,56
_GROUP3 = re.compile(r"\A[+-]?\d{1,3}[.,]\d{3}\Z")  # 1.234 or 1,234: either convention


class ChoiceError(ValueError):
    """A re-import option that cannot be used; `field` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class ReadChoices:
    """What the user chose on a re-import; None: sniff it as on the upload."""

    delimiter: str | None = None
    decimal: str | None = None
    thousands: str | None = None
    header_row: int | None = None  # the line of the header record (1 = the first); 0: no header
    encoding: str | None = None

    @classmethod
    def parse(cls, body: Any, encodings: tuple[str, ...]) -> "ReadChoices":
        """The choices of a JSON body, each checked (ChoiceError naming the field)."""
        if not isinstance(body, dict):
            raise ChoiceError("body", "send a JSON object such as {\"delimiter\": \";\", \"decimal\": \",\"}")
        known = ("delimiter", "decimal", "thousands", "header_row", "encoding")
        for key in body:
            if key not in known:
                raise ChoiceError(str(key)[:40], f"unknown option; the options are {', '.join(known)}")
        out: dict[str, Any] = {}
        delim = body.get("delimiter")
        if delim is not None:
            delim = {"tab": "\t", "\\t": "\t"}.get(delim, delim) if isinstance(delim, str) else delim
            if delim not in DELIMITERS:
                raise ChoiceError("delimiter", "must be one of ',', ';', '\\t' (or \"tab\"), '|'")
            out["delimiter"] = delim
        dec = body.get("decimal")
        if dec is not None:
            if dec not in DECIMALS:
                raise ChoiceError("decimal", "must be '.' or ','")
            out["decimal"] = dec
        th = body.get("thousands")
        if th is not None:
            if th not in THOUSANDS:
                raise ChoiceError("thousands", "must be '', '.', ',' or ' '")
            out["thousands"] = th
        if "decimal" in out and out.get("thousands") == out["decimal"]:
            raise ChoiceError("thousands", "cannot be the decimal separator too")
        row = body.get("header_row")
        if row is not None:
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row <= _MAX_HEADER_ROW:
                raise ChoiceError("header_row", "must be a line number (1 = the first line; 0 = no header row)")
            out["header_row"] = row
        enc = body.get("encoding")
        if enc is not None:
            name = enc.strip().lower().replace("_", "-") if isinstance(enc, str) else None
            name = {"utf8": "utf-8", "windows-1252": "cp1252", "latin-1": "iso-8859-1", "latin1": "iso-8859-1",
                    "utf16": "utf-16"}.get(name or "", name)
            if name not in encodings:
                raise ChoiceError("encoding", f"must be one of {', '.join(encodings)}")
            out["encoding"] = name
        return cls(**out)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Dialect:
    """How a delimited text is read. `header_row`: the line of the header record (1-based, 0:
    none); `skipped`: the lines above it (a title, notes); `totals`: the last record, a totals
    line left out of the rows. `encoding` is filled in by the file door."""

    delimiter: str = ","
    quote: str = '"'
    decimal: str = "."
    thousands: str = ""
    header_row: int = 1
    skipped: tuple[str, ...] = ()
    totals: str | None = None
    encoding: str = "utf-8"
    chosen: tuple[str, ...] = field(default=())  # the options the user set (the rest was sniffed)

    @property
    def header(self) -> bool:
        return self.header_row > 0

    @property
    def numbers_need_cast(self) -> bool:
        """Whether number cells need our cast (pyarrow reads plain `1234.5` / `1234,5` itself)."""
        return bool(self.thousands)

    def describe(self) -> str:
        """What the model and the card are told of a file, e.g. "CSV (';'-separated, decimal
        comma, '.' thousands separator, Windows-1252); a totals line was left out: ..."."""
        name = {"\t": "tab", ",": "','", ";": "';'", "|": "'|'"}[self.delimiter]
        parts = [f"{name}-separated"] + self._parts()
        if self.encoding != "utf-8":
            parts.append({"utf-8-sig": "UTF-8 with BOM", "utf-16-le": "UTF-16 LE", "utf-16-be": "UTF-16 BE",
                          "cp1252": "Windows-1252"}.get(self.encoding, self.encoding))
        if not self.header:
            parts.append("no header row")
        elif self.header_row > 1:
            parts.append(f"header on line {self.header_row}")
        text = f"{'TSV' if self.delimiter == chr(9) else 'CSV'} ({', '.join(parts)})"
        return "; ".join([text] + self.notes())

    def details(self) -> str:
        """What differs from a plain CSV/TSV, in brackets ("" when nothing): for a tool's text."""
        parts = ([f"{self.delimiter!r}-separated"] if self.delimiter in ";|" else []) + self._parts()
        return f" ({', '.join(parts)})" if parts else ""

    def _parts(self) -> list[str]:
        parts = []
        if self.decimal == ",":
            parts.append("decimal comma")
        if self.thousands:
            parts.append(f"{'space' if self.thousands == ' ' else repr(self.thousands)} thousands separator")
        if self.quote != '"':
            parts.append(f"quote {self.quote!r}")
        return parts

    def notes(self) -> list[str]:
        """What was left out of the rows, in words."""
        out = []
        lines = [ln.strip() for ln in self.skipped if ln.strip()]
        if lines:
            shown = " / ".join(ln[:80] for ln in lines[:3]) + (" / ..." if len(lines) > 3 else "")
            out.append(f"{len(lines)} line{'s' if len(lines) != 1 else ''} above the header "
                       f"{'were' if len(lines) != 1 else 'was'} skipped: {shown!r}")
        if self.totals is not None:
            out.append(f"a totals line was left out: {self.totals.strip()[:200]!r}")
        return out

    def reading(self) -> dict[str, Any]:
        """What the card shows and a re-import starts from."""
        out: dict[str, Any] = {"delimiter": self.delimiter, "quote": self.quote, "decimal": self.decimal,
                               "thousands": self.thousands, "header_row": self.header_row,
                               "encoding": self.encoding, "skipped": list(self.skipped), "totals": self.totals}
        if self.chosen:
            out["chosen"] = list(self.chosen)
        return out


@dataclass
class _Candidate:
    delimiter: str
    header: int  # index into the records
    width: int
    score: float


def _records(text: str, delimiter: str, quote: str) -> list[tuple[int, list[str]]]:
    """(first line, cells) of the first records of `text` (blank ones included as [])."""
    out: list[tuple[int, list[str]]] = []
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, quotechar=quote, strict=False)
    line = 1
    try:
        for cells in reader:
            out.append((line, cells))
            line = reader.line_num + 1
            if len(out) >= _MAX_RECORDS + _MAX_TITLE:
                break
    except csv.Error:
        pass  # a record csv cannot take (a NUL, a huge field): judge what came before it
    return out


def _quote_of(text: str) -> str:
    """`'` when the text quotes with it and never with `"`; else `"`."""
    if '"' in text or "'" not in text:
        return '"'
    return "'" if re.search(r"(?:^|[,;\t|])'[^'\n]*'(?:[,;\t|]|$)", text, re.M) else '"'


def _candidate(records: list[tuple[int, list[str]]], delimiter: str, complete: bool,
               fixed_header: int | None) -> _Candidate | None:
    rows = [(line, cells) for line, cells in records if cells and any(c.strip() for c in cells)]
    if not complete and len(rows) > 2:
        rows = rows[:-1]  # the last record may be cut by the end of the sample
    if fixed_header is not None:
        heads = [i for i, (line, _) in enumerate(rows) if line >= fixed_header][:1]
    else:
        heads = range(min(_MAX_TITLE + 1, len(rows)))
    for i in heads:
        width = len(rows[i][1])
        rest = [len(cells) for _, cells in rows[i:]]
        if width < 2 or len(rest) < 2:
            continue
        same = sum(1 for w in rest if w == width)
        ragged = len(rest) - same
        # most as wide as the header: a table even with a ragged row (reading it then names the line)
        if ragged and not (len(rest) >= 3 and same >= min(len(rest) - 1, 0.8 * len(rest))):
            if fixed_header is not None:
                return _Candidate(delimiter, i, width, 0.1)  # the user said so: read it and name the bad line
            continue
        cells = [c for _, row in rows[i:i + 50] for c in row]
        others = [d for d in DELIMITERS if d not in (delimiter, ",")]
        dirty = sum(1 for c in cells if any(d in c for d in others)) / max(1, len(cells))
        score = (same - 0.5 * i) * (1.0 - dirty) * (1.0 + 0.01 * min(width, 50))
        return _Candidate(delimiter, i, width, score)
    return None


def sniff_dialect(text: str | None, complete: bool, choices: ReadChoices | None = None) -> Dialect | None:
    """The dialect of a delimited text whose beginning is `text` (all of it when `complete`),
    or None when no delimiter splits it into a table (records of one width, at least two
    columns and two records). `choices` fix what the user chose; the rest is sniffed."""
    if not text:
        return None
    choices = choices or ReadChoices()
    lines_above: tuple[str, ...] = ()
    forced = choices.delimiter
    first_nl = text.find("\n")
    first = text[: first_nl if first_nl >= 0 else len(text)].rstrip("\r")
    sep = _SEP_LINE.match(first)
    body, base = text, 0
    if sep and sep.group(1) in DELIMITERS:
        forced = forced or sep.group(1)
        body, base, lines_above = text[first_nl + 1:] if first_nl >= 0 else "", 1, (first,)
    quote = _quote_of(body[:16_384])
    fixed = choices.header_row - base if choices.header_row else None
    best: _Candidate | None = None
    best_records: list[tuple[int, list[str]]] = []
    for delim in (forced,) if forced else DELIMITERS:
        if delim not in body:
            continue
        records = _records(body, delim, quote)
        found = _candidate(records, delim, complete, fixed)
        if found is not None and (best is None or found.score > best.score):
            best, best_records = found, records
    if best is None:
        return None
    rows = [(line, cells) for line, cells in best_records if cells and any(c.strip() for c in cells)]
    header_line, _ = rows[best.header]
    lines = body.split("\n")
    skipped = lines_above + tuple(ln.rstrip("\r") for ln in lines[: header_line - 1])
    if best.delimiter == "|" and len(rows) > best.header + 1 and _is_rule(rows[best.header + 1][1]):
        return None  # a Markdown table, not a pipe-separated file
    data = [cells for _, cells in rows[best.header + 1:]]
    decimal, thousands = _numbers(data, best.delimiter)
    if choices.decimal is not None and choices.decimal != decimal:
        decimal = choices.decimal
        thousands = "" if thousands == decimal else thousands
    if choices.thousands is not None:
        thousands = choices.thousands
    chosen = tuple(k for k, v in choices.as_dict().items() if k != "encoding")
    header_row = header_line + base
    if choices.header_row == 0:
        header_row, skipped = 0, lines_above
    return Dialect(best.delimiter, quote, decimal, thousands, header_row, skipped, chosen=chosen)


def _is_rule(cells: list[str]) -> bool:
    return all(set(c.strip()) <= set("-:= ") for c in cells) and any("-" in c for c in cells)


def _numbers(rows: list[list[str]], delimiter: str) -> tuple[str, str]:
    """(decimal separator, thousands separator) the number cells of `rows` are written with."""
    comma = dot = 0
    groups = {".": 0, ",": 0, " ": 0}
    either = {".": 0, ",": 0}  # 1.234 / 1,234: a thousands separator or a decimal one
    for row in rows[:_MAX_RECORDS]:
        for cell in row:
            c = cell.strip()
            if not c or not (c[0].isdigit() or c[0] in "+-.,") or _INT.match(c):
                continue
            if _GROUP3.match(c):
                either["." if "." in c else ","] += 1
            elif _DOT_DEC.match(c):
                dot += 1
            elif _COMMA_DEC.match(c):
                comma += 1
            elif _DOT_GROUPS.match(c):
                groups["."] += 1
                comma += "," in c
            elif _COMMA_GROUPS.match(c):
                groups[","] += 1
                dot += "." in c
            elif _SPACE_GROUPS.match(c):
                groups[" "] += 1
                comma += "," in c
                dot += "." in c
    if (comma and not dot) or (groups["."] and not dot and not groups[","]):
        dots = groups["."] or either["."]
        return ",", "." if dots else (" " if groups[" "] else "")
    commas = (groups[","] or (either[","] and dot)) and not comma
    return ".", "," if commas else (" " if groups[" "] else "")


def is_total_word(text: str) -> bool:
    """Total, Totals, Sum, Summe, Gesamt ... (with or without a colon)."""
    return text.strip().rstrip(":").strip().lower() in _TOTAL_WORDS


def is_totals(line: str, dialect: Dialect) -> bool:
    """A record whose first filled cell is a word like Total/Summe/Sum and whose other cells are
    empty or numbers: a totals line (a report's, not a row of the data)."""
    try:
        cells = next(csv.reader([line], delimiter=dialect.delimiter, quotechar=dialect.quote))
    except (csv.Error, StopIteration):
        return False
    filled = [c.strip() for c in cells if c.strip()]
    if len(filled) < 2:
        return False
    return is_total_word(filled[0]) and all(_TOTAL_VALUE.match(c) for c in filled[1:])


def consistent_delimiter(lines: list[str]) -> str | None:
    """The delimiter (tab first, then `,` `;` `|`) that splits every one of `lines` into the same
    number (at least two) of fields: what `text.locate` takes for delimited records."""
    for delim in ("\t", ",", ";", "|"):
        counts = [field_count(s, delim) for s in lines]
        if counts and counts[0] >= 2 and all(c == counts[0] for c in counts[1:]):
            return delim
    return None


def field_count(line: str, delim: str) -> int:
    if not line.strip() or delim not in line:
        return 0 if not line.strip() else 1
    try:
        return len(next(csv.reader([line], delimiter=delim)))
    except (csv.Error, StopIteration):
        return 0
