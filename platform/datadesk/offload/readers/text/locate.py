"""Where a table is in a tool's text: Markdown, ASCII boxes (MySQL/prettytable, psql, Unicode
box drawing), fixed-width columns under a dashed rule, CSV/TSV with or without a header, and
any of these (or JSON, a Python repr) embedded in prose: a preamble, the table, a trailer.

`find_table(lines)` says where the table is (`TextTable`: its kind, the lines before and
after it); the drawn ones are cut into cells by `pyarrow_engine`, CSV/TSV go to the CSV
reader, a JSON or repr value to theirs (the order: `readers/__init__.py`).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from datadesk.offload.readers.csv.dialect import consistent_delimiter, field_count
from datadesk.offload.readers.text.notes import is_note

_MD_RULE = re.compile(r"\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*\Z")
_BOX_RULE = re.compile(r"\s*[+|├┌└╞╒╘╔╚╠╟┼┬┴─═╤╧╪┤┐┘╡╕╛╗╝╣╢\-=]+\s*\Z")
_PSQL_RULE = re.compile(r"\s*-+(\+-+)+\s*\Z")
_FIXED_RULE = re.compile(r"\s*-{2,}(\s+-{2,})+\s*\Z")
PIPES = ("|", "│", "║", "┃")
_MAX_PROSE_LINES = 20


@dataclass
class TextTable:
    """A table found in text: `kind`, its lines [start, end), and the prose around it."""

    kind: str  # markdown | box | psql | fixed | csv | tsv | json
    start: int
    end: int
    before: list[str]
    after: list[str]
    shape: str


def _is_box_rule(line: str) -> bool:
    s = line.strip()
    return len(s) >= 3 and s[0] in "+├┌└╞╒╘╔╚╠╟" and bool(_BOX_RULE.match(s))


def pipe_line(line: str) -> bool:
    s = line.lstrip()
    return bool(s) and s[0] in PIPES


def find_table(lines: list[str]) -> TextTable | None:
    """The first table in `lines` (after at most 20 lines of prose), or None."""
    n = len(lines)
    for k in range(min(_MAX_PROSE_LINES + 1, n)):
        line, nxt = lines[k], lines[k + 1] if k + 1 < n else ""
        kind = None
        if "|" in line and "-" in nxt and _MD_RULE.match(nxt) and "+" not in nxt:
            kind, shape = "markdown", "Markdown table"
        elif _is_box_rule(line) and pipe_line(nxt):
            kind, shape = "box", "ASCII box table"
        elif "|" in line and _PSQL_RULE.match(nxt):
            kind, shape = "psql", "psql-style table"
        elif line.strip() and _FIXED_RULE.match(nxt):
            kind, shape = "fixed", "fixed-width table"
        elif line.lstrip()[:1] in ("[", "{"):
            kind, shape = "json", "JSON"
        if kind is not None:
            end = _block_end(lines, k, kind)
            if _prose_lines(lines[end:]) > _MAX_PROSE_LINES:
                return None  # a document with a table in it, not a table: it stays text
            return TextTable(kind, k, end, lines[:k], lines[end:], shape)
        delimited = _delimited_at(lines, k)
        if delimited is not None and (k == 0 or _header_like(lines[k], delimited[2])):
            kind, end, _ = delimited
            return TextTable(kind, k, end, lines[:k], lines[end:], f"{kind.upper()} text")
    return None


def _prose_lines(lines: list[str]) -> int:
    count = 0
    for line in lines:
        if line.strip():
            count += 1
            if count > _MAX_PROSE_LINES:
                break
    return count


def _block_end(lines: list[str], k: int, kind: str) -> int:
    n = len(lines)
    if kind == "json":  # the last line that closes a JSON value, within the last 20 lines
        for end in range(n, max(k, n - _MAX_PROSE_LINES - 1), -1):
            if lines[end - 1].rstrip()[-1:] in ("]", "}"):
                return end
        return n
    if kind == "box":
        end = k + 2
        while end < n and (pipe_line(lines[end]) or _is_box_rule(lines[end])):
            end += 1
        return end
    if kind == "markdown":  # outer pipes are optional in Markdown
        end = k + 2
        while end < n and "|" in lines[end]:
            end += 1
        return end
    end = k + 2  # psql, fixed width: to a blank line, "(3 rows)" or another count or cut line (no pipe)
    while end < n and lines[end].strip() and not lines[end].lstrip().startswith("(") \
            and ("|" in lines[end] or not is_note(lines[end])):
        end += 1
    return end


def _delimited_at(lines: list[str], k: int) -> tuple[str, int, str] | None:
    """("csv"|"tsv", end, delimiter) when lines from k on are delimited records of one width
    (tab, `,`, `;` or `|`: `csv.dialect.consistent_delimiter`, as a file's sniff tries them)."""
    sample = lines[k:k + 6]
    if len(sample) < 2:
        return None
    delim = consistent_delimiter(sample)
    if delim is None:
        return None
    width = field_count(sample[0], delim)
    end = len(lines)
    tail = max(k + 2, end - _MAX_PROSE_LINES)
    while end > tail and (field_count(lines[end - 1], delim) != width or _is_note(lines[end - 1])):
        end -= 1
    return ("tsv" if delim == "\t" else "csv"), end, delim


def _header_like(line: str, delimiter: str) -> bool:
    """After prose, a delimited block must start with a header-like record (short names,
    no sentences), so that prose with a comma per line is not taken for a table."""
    try:
        cells = next(csv.reader([line], delimiter=delimiter))
    except (csv.Error, StopIteration):
        return False
    return all(0 < len(c.strip()) <= 64 and ". " not in c for c in cells)


def _is_note(line: str) -> bool:
    """A trailer such as "(2 rows, more available)" or "Total: 3 rows", not a record."""
    s = line.strip()
    return (s.startswith("(") and s.endswith(")")) or s.endswith(":") or s.endswith(".")
