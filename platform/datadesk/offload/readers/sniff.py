"""Raw data -> Arrow record batches with real types, streaming (DESIGN section 6).

Entry points: `detect_text` / `sniff_file` say what something is (by content,
never by name); `json_batches`, `csv_batches` and `file_batches` turn it into
record batches; `rows_to_batch` / `records_to_batch` hold the shared
per-column type inference. Errors are `TabularParseError` with a message
that names the place (line, byte offset, sheet).
"""

from __future__ import annotations

import codecs
import csv
import io
import re
import zipfile
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from datadesk.offload.readers.columns import (TabularParseError, UploadLimits, cell_text, infer_array,
                                      records_to_batch, rows_to_batch, unique_names)
from datadesk.offload.readers.csv.pyarrow_engine import csv_batches
from datadesk.offload.readers.excel.openpyxl_engine import xlsx_batches
from datadesk.offload.readers.json.stdlib_engine import json_batches

__all__ = [
    "TabularParseError", "cell_text", "csv_batches", "detect_text", "file_batches",
    "infer_array", "json_batches", "records_to_batch", "rows_to_batch", "sniff_file",
    "unique_names", "xlsx_batches",
]

_SNIFF_CHARS = 64 * 1024
_SNIFF_LINES = 20
_WS = re.compile(r"[ \t\n\r]*")


# --------------------------------------------------------------------- sniffing

def detect_text(text: str) -> str:
    """Classify text by its beginning: "json", "tsv", "csv" or "text".

    Looks at a bounded prefix only (64 KiB, first 20 records), never the
    whole text.
    """
    return _detect(text[:_SNIFF_CHARS], complete=len(text) <= _SNIFF_CHARS)


def _detect(prefix: str, complete: bool) -> str:
    prefix = prefix.lstrip("\ufeff")
    pos = _WS.match(prefix).end()
    if prefix[pos:pos + 1] in ("[", "{"):
        return "json"
    if not complete:  # the last line may be cut short
        cut = prefix.rfind("\n")
        prefix = prefix[:cut] if cut > 0 else prefix
    for delimiter, kind in (("\t", "tsv"), (",", "csv")):
        if delimiter not in prefix:
            continue
        try:
            records = [r for r in csv.reader(io.StringIO(prefix), delimiter=delimiter) if r]
        except csv.Error:
            continue
        sample = records[:_SNIFF_LINES]
        # Most records as wide as the header: a table, even if one row is ragged
        # (reading it then names the bad line instead of calling it "not a table").
        if len(sample) >= 2 and len(sample[0]) >= 2:
            same = sum(1 for r in sample if len(r) == len(sample[0]))
            if same == len(sample) or (len(sample) >= 3 and same >= min(len(sample) - 1, 0.8 * len(sample))):
                return kind
    return "text"


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "xls"),  # OLE2: legacy Excel
)


def sniff_file(path: Path) -> str:
    """Say what a file is by its bytes (the name is ignored).

    One of "parquet", "xlsx", "xls", "png", "jpeg", "gif", "webp", "json",
    "csv", "tsv" or "unknown" (binary, or text that is not a table).
    """
    with open(path, "rb") as f:
        head = f.read(_SNIFF_CHARS)
        size = f.seek(0, 2)
        tail = b""
        if size >= 8:
            f.seek(size - 4)
            tail = f.read(4)
    if size >= 12 and head[:4] == b"PAR1" and tail == b"PAR1":
        return "parquet"
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as zf:
                return "xlsx" if "xl/workbook.xml" in zf.namelist() else "unknown"
        except (zipfile.BadZipFile, OSError):
            return "unknown"
    text = _text_prefix(head, complete=size <= len(head))
    if text is None:
        return "unknown"
    kind = _detect(text, complete=size <= len(head))
    return kind if kind in ("json", "csv", "tsv") else "unknown"


def _text_prefix(head: bytes, complete: bool) -> str | None:
    """Decode a file head for sniffing, or None when it looks binary."""
    if head.startswith(codecs.BOM_UTF8):
        head = head[3:]
    if b"\x00" in head:
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if not complete and err.reason == "unexpected end of data" and err.end == len(head):
            text = head[:err.start].decode("utf-8", "replace")
        else:
            # Probably a legacy 8-bit CSV: sniff it anyway; reading it will
            # then fail with a precise "not UTF-8 at byte N".
            text = head.decode("latin-1")
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r")
    if controls > len(text) // 100:
        return None
    return text


# ------------------------------------------------------------------------ files

def file_batches(path: Path, fmt: str, batch_rows: int = 65_536, *, sheet: str | None = None,
                 limits: UploadLimits | None = None) -> tuple[pa.Schema | None, Iterator[pa.RecordBatch]]:
    """Open a file of a sniffed format: (schema when known up front, batches).

    Parquet gives its schema (so an empty file still has columns); the
    others infer types while reading and return None. Errors that can be
    seen on opening (bad workbook, empty sheet, non-UTF-8 JSON) raise now.
    `limits` (rows, columns, cell size, seconds, unpacked size) raise LimitExceeded.
    """
    path = Path(path)
    limits = limits if limits is not None else UploadLimits().started()
    if fmt == "parquet":
        try:
            pf = pq.ParquetFile(path)
            schema = pf.schema_arrow
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TabularParseError(f"not a readable Parquet file: {exc}") from None
        if len(schema) > limits.columns:
            raise limits.refuse_columns(len(schema))
        if pf.metadata.num_rows > limits.rows:
            raise limits.refuse_rows()
        return schema, _parquet_batches(pf, batch_rows, limits)
    if fmt in ("csv", "tsv"):
        return None, csv_batches(path, "\t" if fmt == "tsv" else ",", limits=limits)
    if fmt == "json":
        data = path.read_bytes()
        bom = 3 if data.startswith(codecs.BOM_UTF8) else 0
        try:
            text = data[bom:].decode("utf-8")
        except UnicodeDecodeError as err:
            at = bom + err.start
            line = data.count(b"\n", 0, at) + 1
            raise TabularParseError(f"file is not UTF-8 at byte {at} (line {line}, byte 0x{data[at]:02X}); "
                                    "save it as UTF-8") from None
        return None, json_batches(text, batch_rows)
    if fmt == "xlsx":
        return None, xlsx_batches(path, sheet, batch_rows, limits)
    if fmt == "xls":
        raise TabularParseError("legacy .xls is not supported; save as .xlsx")
    raise TabularParseError(f"{fmt!r} is not a tabular format")


def _parquet_batches(pf: pq.ParquetFile, batch_rows: int, limits: UploadLimits) -> Iterator[pa.RecordBatch]:
    rows = 0
    try:
        for batch in pf.iter_batches(batch_size=batch_rows):
            rows += batch.num_rows
            limits.tick()
            yield batch
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, TabularParseError):
            raise
        raise TabularParseError(f"the Parquet file is damaged after row {rows:,}: {exc}") from None
    finally:
        pf.close()
