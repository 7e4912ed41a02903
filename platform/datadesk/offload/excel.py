""".xlsx -> Arrow record batches, streaming (openpyxl read-only mode).

The header is the first non-empty row of the sheet. Cells keep their Python
types (int/float/bool/datetime/str) and go through the same per-column
inference as JSON rows (`rows_to_batch`). Fully empty rows are skipped: in
read-only mode they are mostly formatting leftovers and carry no data.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from datadesk.offload.columns import TabularParseError, rows_to_batch


def _last_filled(row: tuple[Any, ...]) -> int:
    """Index after the last non-empty cell (0 for an empty row)."""
    for i in range(len(row) - 1, -1, -1):
        v = row[i]
        if v is not None and not (isinstance(v, str) and not v.strip()):
            return i + 1
    return 0


def xlsx_batches(path: Path, sheet: str | None = None, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Open `sheet` (default: the first one) and return an iterator of batches.

    Opening, choosing the sheet and finding the header happen now, so an
    unreadable file, an unknown sheet or an empty sheet raise
    TabularParseError (naming the sheet) before any batch is requested.
    """
    import openpyxl  # heavy import; only needed for Excel uploads

    from openpyxl.utils.exceptions import InvalidFileException

    # A file object, not the path: openpyxl refuses paths that do not end in
    # .xlsx, and uploads sit under temporary names (we sniff by content).
    fh = open(path, "rb")
    try:
        # data_only: cached formula results, not the formula text.
        wb = openpyxl.load_workbook(fh, read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, InvalidFileException) as exc:
        fh.close()
        raise TabularParseError(f"not a readable .xlsx workbook: {exc}") from None
    wb._datadesk_fh = fh  # closed together with the workbook (see _close)
    try:
        if sheet is None:
            if not wb.worksheets:
                raise TabularParseError("workbook has no sheets")
            ws = wb.worksheets[0]
        elif sheet in wb.sheetnames:
            ws = wb[sheet]
        else:
            raise TabularParseError(f"no sheet named {sheet!r}; sheets: {', '.join(wb.sheetnames)}")
        if not hasattr(ws, "iter_rows"):  # a chartsheet
            raise TabularParseError(f"sheet {ws.title!r} is a chart, not a table")
        # Some writers store a wrong <dimension>; trusting it would silently
        # cut rows, so read until the real end of the sheet data.
        ws.reset_dimensions()
        rows = ws.iter_rows(values_only=True)
        header: tuple[Any, ...] | None = None
        for row in rows:
            width = _last_filled(row)
            if width:
                header = row[:width]
                break
        if header is None:
            raise TabularParseError(f"sheet {ws.title!r} is empty: no header row")
    except BaseException:
        _close(wb)
        raise
    return _stream(wb, rows, list(header), batch_rows)


def _stream(wb: Any, rows: Iterator[tuple[Any, ...]], header: list[Any],
            batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        buf: list[tuple[Any, ...]] = []
        width = len(header)
        emitted = False
        for row in rows:
            filled = _last_filled(row)
            if not filled:
                continue
            buf.append(row[:filled])
            width = max(width, filled)
            if len(buf) >= batch_rows:
                yield _to_batch(header, width, buf)
                emitted = True
                buf, width = [], len(header)
        if buf or not emitted:
            yield _to_batch(header, width, buf)
    finally:
        _close(wb)


def _close(wb: Any) -> None:
    wb.close()
    wb._datadesk_fh.close()


def _to_batch(header: list[Any], width: int, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    # Cells right of the header are data too: they get `column_N` names
    # (the same position always gets the same name) rather than being lost.
    names = [str(h) if h is not None else None for h in header] + [None] * (width - len(header))
    return rows_to_batch(names, rows)
