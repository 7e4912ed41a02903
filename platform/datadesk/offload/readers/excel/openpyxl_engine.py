""".xlsx -> Arrow record batches, streaming (openpyxl read-only mode).

Every sheet is a table of its own (`read_sheets`; `xlsx_batches` reads one). Its header is
found by `layout.find_header`: the first non-empty row, after a title block of one-cell rows,
joined with the row below it under merged cells; a totals row at the end is left out. What was
skipped is said in the stream's facts. Cells keep their Python types (int/float/bool/datetime/str)
and go through the same per-column inference as JSON rows (`rows_to_batch`). Fully empty rows
are skipped: in read-only mode they are mostly formatting leftovers and carry no data.

An .xlsx is a zip: its entries are checked before anything is inflated (`check_archive`:
unpacked size, compression ratio, nested archives), then rows stream under `UploadLimits`
(rows, columns, cell size, seconds; Excel's own 1,048,576 x 16,384 grid too).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from datadesk.offload.readers.base import FileTable, ShapedStream, SourceFacts
from datadesk.offload.readers.columns import rows_to_batch
from datadesk.offload.readers.excel.layout import SheetLayout, find_header, is_totals_row, merged_ranges
from datadesk.offload.readers.errors import LimitExceeded, TabularParseError
from datadesk.offload.readers.limits import UploadLimits, human

EXCEL_MAX_ROWS = 1_048_576
EXCEL_MAX_COLUMNS = 16_384
_RATIO_FROM = 1024 * 1024  # entries smaller than this are not held to the ratio
_TICK_ROWS = 2048
_STRINGS_COST = 12  # ~9-10 bytes of memory per byte of short unique strings + the child's ~390 MB base


def _last_filled(row: tuple[Any, ...]) -> int:
    """Index after the last non-empty cell (0 for an empty row)."""
    for i in range(len(row) - 1, -1, -1):
        v = row[i]
        if v is not None and not (isinstance(v, str) and not v.strip()):
            return i + 1
    return 0


def check_archive(path: Path, limits: UploadLimits) -> None:
    """Refuse a zip whose entries (from its central directory, before inflating any) unpack to
    more than `limits.unpacked_bytes` or compress better than `limits.zip_ratio`, or that holds
    another archive. Python's zipfile never inflates past an entry's declared size (the CRC
    check fails instead), so the declared sizes bound the work."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            total = 0
            for info in infos:
                total += info.file_size
                if total > limits.unpacked_bytes:
                    raise LimitExceeded(
                        f"the workbook unpacks to more than {human(limits.unpacked_bytes)} "
                        "(offload.upload_max_unpacked_bytes); save a smaller file or export the sheet as CSV")
                ratio = info.file_size / max(info.compress_size, 1)
                if info.file_size >= _RATIO_FROM and ratio > limits.zip_ratio:
                    raise LimitExceeded(
                        f"workbook part {info.filename!r} is compressed {ratio:,.0f}:1, more than the "
                        f"{limits.zip_ratio:g}:1 allowed (offload.upload_max_zip_ratio): a zip bomb?")
                # openpyxl holds every shared string before the first row, ~10 bytes of memory per
                # byte of XML for short strings (bench/upload_bombs.py): refuse now, not after ~40 s
                if (limits.memory_bytes and info.filename == "xl/sharedStrings.xml"
                        and info.file_size > limits.memory_bytes // _STRINGS_COST):
                    raise LimitExceeded(
                        f"the workbook's shared strings unpack to {human(info.file_size)}; reading them needs "
                        f"more than the {human(limits.memory_bytes)} memory limit (offload.upload_max_memory_bytes)"
                        "; export the sheet as CSV")
                if info.filename.lower().endswith((".zip", ".gz", ".7z", ".rar")) or _is_zip(zf, info):
                    raise LimitExceeded(f"the workbook holds another archive ({info.filename!r}); "
                                        "nested archives are refused")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise TabularParseError(f"not a readable .xlsx workbook: {exc}") from None


def _is_zip(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """Whether an entry is itself a zip (4 bytes inflated); embedded objects are not read."""
    if info.is_dir() or info.file_size < 4 or info.filename.startswith("xl/embeddings/"):
        return False
    with zf.open(info) as fh:
        return fh.read(4) == b"PK\x03\x04"


def xlsx_batches(path: Path, sheet: str | None = None, batch_rows: int = 65_536,
                 limits: UploadLimits | None = None) -> ShapedStream:
    """Open `sheet` (default: the first one) and return a stream of its batches.

    Opening, choosing the sheet and finding the header happen now, so an
    unreadable file, an unknown sheet or an empty sheet raise
    TabularParseError (naming the sheet) before any batch is requested;
    a file past `limits` raises LimitExceeded (before inflating, for sizes).
    """
    limits = limits if limits is not None else UploadLimits().started()
    check_archive(path, limits)
    if limits.memory_bytes:
        (table,) = _in_child(Path(path), sheet, False, batch_rows, limits)
        return table.stream
    return open_sheet(path, sheet, batch_rows, limits)


def read_file(path: Path, batch_rows: int, sheet: str | None,
              limits: UploadLimits) -> tuple[None, ShapedStream]:
    """The reader of an .xlsx file (one sheet: the first, or `sheet`): types inferred per column
    while reading, so no schema up front."""
    return None, xlsx_batches(path, sheet, batch_rows, limits)


def read_sheets(path: Path, batch_rows: int, limits: UploadLimits) -> Iterator[FileTable]:
    """Every sheet of the workbook, in order: each a stream to read before the next one is asked
    for, or skipped (empty, a chart). TabularParseError: the workbook cannot be read at all."""
    check_archive(path, limits)
    if limits.memory_bytes:
        yield from _in_child(Path(path), None, True, batch_rows, limits)
        return
    wb = _load(path)
    try:
        for ws in getattr(wb, "_sheets", wb.worksheets):  # in the workbook's order, charts too
            if not hasattr(ws, "iter_rows"):
                yield FileTable(ws.title, skipped="a chart, not a table")
                continue
            stream = _sheet_stream(path, wb, ws, batch_rows, limits, close=False)
            yield FileTable(ws.title, stream) if stream is not None else FileTable(ws.title, skipped="empty")
    except zipfile.BadZipFile as exc:
        raise TabularParseError(f"not a readable .xlsx workbook: {exc}") from None
    finally:
        _close(wb)


def refuse_legacy(path: Path, batch_rows: int, sheet: str | None, limits: UploadLimits) -> None:
    """A legacy .xls (OLE2) workbook is recognised only to be refused with what to do instead."""
    raise TabularParseError("legacy .xls is not supported; save as .xlsx")


def _load(path: Path) -> Any:
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
    return wb


def open_sheet(path: Path, sheet: str | None, batch_rows: int, limits: UploadLimits) -> ShapedStream:
    """The sheet's batches read here (in this process); opening errors raise now."""
    wb = _load(path)
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
        stream = _sheet_stream(path, wb, ws, batch_rows, limits, close=True)
        if stream is None:
            raise TabularParseError(f"sheet {ws.title!r} is empty: no header row")
        return stream
    except zipfile.BadZipFile as exc:
        _close(wb)
        raise TabularParseError(f"not a readable .xlsx workbook: {exc}") from None
    except BaseException:
        _close(wb)
        raise


def _sheet_stream(path: Path, wb: Any, ws: Any, batch_rows: int, limits: UploadLimits,
                  close: bool) -> ShapedStream | None:
    """The sheet as a stream (its header found now), or None when it has no rows."""
    # Some writers store a wrong <dimension>; trusting it would silently
    # cut rows, so read until the real end of the sheet data.
    ws.reset_dimensions()
    rows = _bounded(ws.iter_rows(values_only=True), limits)
    found = find_header(ws.title, rows, _last_filled,
                        lambda: merged_ranges(path, getattr(ws, "_worksheet_path", None), limits.tick))
    if found is None:
        if close:
            _close(wb)
        return None
    layout, data = found
    facts = SourceFacts(layout.describe(), reading=layout.reading())
    return ShapedStream(None, _stream(wb if close else None, data, layout, facts, batch_rows), facts)


# ------------------------------------------------- the parse in a bounded child process
# openpyxl holds every shared string as a Python object before the first row (measured: 128 MiB
# of short strings took ~1 GB and 40 s), which nothing in-process can bound or interrupt. So the
# parse runs in a child with RLIMIT_AS (offload.upload_max_memory_bytes), killed at the deadline
# or on cancel; it writes frames to a file next to the upload, read back here once it succeeded:
# per sheet "S" (its name), then "B" (a batch as an Arrow IPC stream: batches may differ in type)
# or "K" (skipped: why), then "E" (its layout, as JSON).

CHILD_LIMIT, CHILD_PARSE, CHILD_MEMORY = 3, 4, 5
FRAME = struct.Struct("<cQ")


def _in_child(path: Path, sheet: str | None, every: bool, batch_rows: int,
              limits: UploadLimits) -> list[FileTable]:
    out = path.with_name(path.name + ".batches.tmp")  # a temp name the sweeper knows (offload.artifacts.tempfiles)
    spec = {"path": str(path), "out": str(out), "sheet": sheet, "all": every, "batch_rows": batch_rows,
            "limits": {"unpacked_bytes": limits.unpacked_bytes, "zip_ratio": limits.zip_ratio, "rows": limits.rows,
                       "columns": limits.columns, "cell_bytes": limits.cell_bytes,
                       "seconds": max(0.0, limits.deadline - time.monotonic()) if limits.deadline else limits.seconds}}
    root = str(Path(__file__).resolve().parents[4])  # the directory holding the datadesk package
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": root}  # not the app's secrets

    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        cpu = int(limits.seconds) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

    proc = subprocess.Popen([sys.executable, "-m", "datadesk.offload.readers.excel.child", json.dumps(spec)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            preexec_fn=bound, start_new_session=True)
    try:
        while proc.poll() is None:
            limits.tick()  # past the deadline or cancelled: the child is killed below
            time.sleep(0.05)
        message = (proc.stdout.read() if proc.stdout else b"").decode("utf-8", "replace").strip()
        if proc.returncode == CHILD_LIMIT:
            raise LimitExceeded(message)
        if proc.returncode == CHILD_PARSE:
            raise TabularParseError(message)
        if proc.returncode != 0:  # MemoryError, or killed by the kernel when the limit hit elsewhere
            raise LimitExceeded(f"reading the workbook needed more than {human(limits.memory_bytes)} of memory "
                                "(offload.upload_max_memory_bytes); save a smaller file or export the sheet as CSV")
        tables = _frames(out, limits)
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.unlink(missing_ok=True)
        raise
    finally:
        if proc.stdout:
            proc.stdout.close()
    return tables


def _frames(out: Path, limits: UploadLimits) -> list[FileTable]:
    """The sheets the child wrote to `out`: their batches are read from it as each is streamed;
    `out` is removed once the last sheet's stream ends."""
    sheets: list[tuple[str, str | None, dict[str, Any], list[tuple[int, int]]]] = []
    with open(out, "rb") as fh:
        while head := fh.read(FRAME.size):
            kind, n = FRAME.unpack(head)
            at = fh.tell()
            if kind == b"B":
                sheets[-1][3].append((at, n))
                fh.seek(n, 1)
                continue
            value = json.loads(fh.read(n))
            if kind == b"S":
                sheets.append((value, None, {}, []))
            elif kind == b"K":
                sheets[-1] = (sheets[-1][0], value, {}, [])
            elif kind == b"E":
                sheets[-1] = (sheets[-1][0], None, value, sheets[-1][3])
    remaining = [i for i, s in enumerate(sheets) if s[1] is None]
    if not remaining:
        out.unlink(missing_ok=True)
    tables = []
    for i, (name, skipped, layout, frames) in enumerate(sheets):
        if skipped is not None:
            tables.append(FileTable(name, skipped=skipped))
            continue
        facts = SourceFacts(layout.get("shape", f"Excel sheet {name!r}"), reading=layout.get("reading"))
        last = i == remaining[-1]
        tables.append(FileTable(name, ShapedStream(None, _read_back(out, frames, limits, last), facts)))
    return tables


def _read_back(out: Path, frames: list[tuple[int, int]], limits: UploadLimits, last: bool) -> Iterator[pa.RecordBatch]:
    try:
        with open(out, "rb") as fh:
            for at, n in frames:
                fh.seek(at)
                yield from pa.ipc.open_stream(pa.py_buffer(fh.read(n)))
                if limits.check is not None:
                    limits.check()
    finally:
        if last:
            out.unlink(missing_ok=True)


def _bounded(rows: Iterator[tuple[Any, ...]], limits: UploadLimits) -> Iterator[tuple[Any, ...]]:
    """The sheet's rows (empty ones included, as openpyxl fills gaps), stopped at the limits."""
    max_rows = min(limits.rows, EXCEL_MAX_ROWS)
    max_cols = min(limits.columns, EXCEL_MAX_COLUMNS)
    cap = limits.cell_bytes // 4  # a str of n chars is at most 4n UTF-8 bytes; checked exactly below
    for n, row in enumerate(rows, 1):
        if n % _TICK_ROWS == 0:
            limits.tick()
        if n > max_rows:
            raise limits.refuse_rows(max_rows)
        if len(row) > max_cols:
            width = _last_filled(row)
            if width > max_cols:
                raise limits.refuse_columns(width)
            row = row[:width]
        for i, v in enumerate(row):
            if type(v) is str and len(v) > cap and len(v.encode("utf-8", "surrogatepass")) > limits.cell_bytes:
                raise limits.refuse_cell(f"the cell in row {n}, column {i + 1}")
        yield row


def _stream(wb: Any, rows: Iterator[tuple[Any, ...]], layout: SheetLayout, facts: SourceFacts,
            batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The data rows in batches; the last row is held back until the end, where a totals row is
    left out (and said in `facts`). `wb` is closed at the end when given."""
    header = layout.header
    try:
        buf: list[tuple[Any, ...]] = []
        width = len(header)
        emitted = False
        held: tuple[Any, ...] | None = None
        for row in rows:
            filled = _last_filled(row)
            if not filled:
                continue
            if held is not None:
                buf.append(held)
                width = max(width, len(held))
            held = row[:filled]
            if len(buf) >= batch_rows:
                yield _to_batch(header, width, buf)
                emitted = True
                buf, width = [], len(header)
        if held is not None:
            if is_totals_row(held):
                layout.totals = list(held)
                facts.shape, facts.reading = layout.describe(), layout.reading()
            else:
                buf.append(held)
                width = max(width, len(held))
        if buf or not emitted:
            yield _to_batch(header, width, buf)
    except zipfile.BadZipFile as exc:
        raise TabularParseError(f"not a readable .xlsx workbook: {exc}") from None
    finally:
        if wb is not None:
            _close(wb)


def _close(wb: Any) -> None:
    wb.close()
    wb._datadesk_fh.close()


def _to_batch(header: list[Any], width: int, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    # Cells right of the header are data too: they get `column_N` names
    # (the same position always gets the same name) rather than being lost.
    names = [str(h) if h is not None else None for h in header] + [None] * (width - len(header))
    return rows_to_batch(names, rows)
