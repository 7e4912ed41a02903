"""Where a sheet's table is: a title or note block above the header (rows of one filled cell,
skipped and reported, as for a CSV), a header of two rows whose upper one has cells merged
across columns (`Q1` over `sales | units` -> `Q1 sales`, `Q1 units`), and a totals row at the
end (left out and reported). openpyxl's read-only mode does not give merged cells, so they are
read from the sheet's XML (`merged_ranges`) only when the header row has gaps that merges make.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from datadesk.offload.readers.csv.dialect import is_total_word

_MAX_TITLE = 10  # rows of one filled cell above the header, at most
_HEADER_AREA = 60  # merges below this row are not the header's
_MERGE = re.compile(rb"<(?:\w+:)?mergeCell\s+ref=\"([A-Z]{1,3})(\d+):([A-Z]{1,3})(\d+)\"")
_CHUNK = 1 << 20

Range = tuple[int, int, int, int]  # (first column, first row, last column, last row), 1-based


@dataclass
class SheetLayout:
    """The header of a sheet's table and what lies above it; `totals` once the rows were read."""

    sheet: str
    header: list[Any]
    header_row: int  # the sheet's row number of the (first) header row
    title: list[str] = field(default_factory=list)
    merged: bool = False  # two header rows joined
    totals: list[Any] | None = None
    rows: int = 0

    def describe(self) -> str:
        parts = [f"Excel sheet {self.sheet!r}"]
        if self.header_row > 1:
            parts.append(f"header on row {self.header_row}")
        if self.merged:
            parts.append("two header rows joined under merged cells (e.g. 'Q1 sales')")
        return "; ".join([", ".join(parts)] + self.notes())

    def notes(self) -> list[str]:
        out = []
        if self.title:
            shown = " / ".join(t[:80] for t in self.title[:3]) + (" / ..." if len(self.title) > 3 else "")
            n = len(self.title)
            out.append(f"{n} row{'s' if n != 1 else ''} above the header {'were' if n != 1 else 'was'} skipped: {shown!r}")
        if self.totals is not None:
            cells = " | ".join("" if v is None else str(v) for v in self.totals)
            out.append(f"a totals row was left out: {cells[:200]!r}")
        return out

    def reading(self) -> dict[str, Any]:
        return {"sheet": self.sheet, "header_row": self.header_row, "skipped": list(self.title),
                "totals": None if self.totals is None else [None if v is None else str(v) for v in self.totals],
                "merged_header": self.merged}


def filled(row: tuple[Any, ...] | list[Any]) -> int:
    """How many cells of `row` hold something."""
    return sum(1 for v in row if v is not None and not (isinstance(v, str) and not v.strip()))


def is_totals_row(row: tuple[Any, ...] | list[Any]) -> bool:
    """A row whose first filled cell is Total/Summe/... and whose other cells are numbers."""
    cells = [v for v in row if v is not None and not (isinstance(v, str) and not v.strip())]
    if len(cells) < 2 or not isinstance(cells[0], str) or not is_total_word(cells[0]):
        return False
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in cells[1:])


def find_header(sheet: str, rows: Iterator[tuple[Any, ...]], width_of, merges_of
                ) -> tuple[SheetLayout, Iterator[tuple[Any, ...]]] | None:
    """The header of the rows (None: the sheet is empty) and the data rows after it.

    `width_of(row)`: index after the last filled cell; `merges_of()`: the sheet's merged ranges
    (read only when the header row has gaps merged cells leave)."""
    ahead: list[tuple[int, tuple[Any, ...]]] = []  # (row number, row) of the non-empty rows read
    number = 0
    for row in rows:
        number += 1
        if not width_of(row):
            continue
        ahead.append((number, row))
        if filled(row) >= 2 or len(ahead) > _MAX_TITLE:
            break
    if not ahead:
        return None
    titles = ahead[:-1]
    if filled(ahead[-1][1]) >= 2 and all(filled(r) == 1 and _text_cell(r) for _, r in titles):
        h_number, h_row = ahead[-1]
        title = [str(_text_cell(r)).strip() for _, r in titles]
        rest: list[tuple[int, tuple[Any, ...]]] = []
    else:  # no title block: the first non-empty row is the header (a one-column sheet ...)
        (h_number, h_row), title, rest = ahead[0], [], ahead[1:]
    header = list(h_row[:width_of(h_row)])
    layout = SheetLayout(sheet, header, h_number, title)
    data = _chain([r for _, r in rest], rows)
    if not rest and _has_gaps(header):
        nxt = next(data, None)
        if nxt is not None:
            joined = two_row_header(header, list(nxt[:max(width_of(nxt), len(header))]), h_number, merges_of())
            if joined is not None:
                layout.header, layout.merged = joined, True
            else:
                data = _chain([nxt], data)
    return layout, data


def _text_cell(row: tuple[Any, ...]) -> str | None:
    v = next((v for v in row if v is not None and not (isinstance(v, str) and not v.strip())), None)
    return v if isinstance(v, str) else None


def _has_gaps(header: list[Any]) -> bool:
    return any(v is None or (isinstance(v, str) and not v.strip()) for v in header)


def _chain(first: list[tuple[Any, ...]], rest: Iterator[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    yield from first
    yield from rest


def two_row_header(upper: list[Any], lower: list[Any], row: int, merges: list[Range]) -> list[Any] | None:
    """The names of a header whose row `row` (`upper`) has cells merged across columns over a
    second header row (`lower`): "upper lower" under a merge, the one filled elsewhere; None
    when no merged cell of that row spans columns over a filled cell below it."""
    across = [m for m in merges if m[1] == row and m[2] > m[0]]
    if not across or not any(_filled(lower, c) for m in across for c in range(m[0], m[2] + 1)):
        return None
    down = {c for m in merges if m[1] == row and m[3] > row for c in range(m[0], m[2] + 1)}
    width = max(len(upper), len(lower), max(m[2] for m in across))
    names: list[Any] = []
    for c in range(1, width + 1):
        span = next((m for m in across if m[0] <= c <= m[2]), None)
        top = _cell(upper, span[0] if span else c)
        below = None if c in down else _cell(lower, c)
        parts = [str(v).strip() for v in (top, below) if v is not None and str(v).strip()]
        names.append(" ".join(parts) if parts else None)
    return names


def _cell(row: list[Any], column: int) -> Any:
    return row[column - 1] if column - 1 < len(row) else None


def _filled(row: list[Any], column: int) -> bool:
    v = _cell(row, column)
    return v is not None and not (isinstance(v, str) and not v.strip())


def merged_ranges(path: Path, part: str | None, tick=None) -> list[Range]:
    """The merged cells of the sheet stored at `part` (its XML, streamed: `<mergeCells>` comes
    after the data) that start within the first rows: the header's."""
    if not part:
        return []
    found: set[Range] = set()
    try:
        with zipfile.ZipFile(path) as zf, zf.open(part.lstrip("/")) as fh:
            carry = b""
            while chunk := fh.read(_CHUNK):
                data = carry + chunk
                for m in _MERGE.finditer(data):
                    first_row = int(m.group(2))
                    if first_row <= _HEADER_AREA:
                        found.add((_column(m.group(1)), first_row, _column(m.group(3)), int(m.group(4))))
                carry = data[-200:]
                if tick is not None:
                    tick()
    except (KeyError, zipfile.BadZipFile, OSError):
        return []
    return sorted(found)


def _column(letters: bytes) -> int:
    n = 0
    for ch in letters:
        n = n * 26 + ch - 64
    return n
