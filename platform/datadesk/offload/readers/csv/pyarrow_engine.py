"""Streaming CSV/TSV -> Arrow record batches (pyarrow.csv.open_csv).

pyarrow infers column types from the first block only and fails on a later
value that does not fit (an `x` after 100k integers). We then restart the
read with that column forced to string and skip the rows already handed
out, so the caller sees every row exactly once; the earlier batches keep the
old type and the sink unifies the two (int64 + string -> string).
"""

from __future__ import annotations

import codecs
import csv
import re
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from datadesk.offload.readers.base import Rest
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.errors import LimitExceeded, TabularParseError
from datadesk.offload.readers.limits import UploadLimits, human

Source = str | bytes | Path

# pyarrow's wording; some versions put "Row #N: " before "CSV conversion".
_CONVERSION_RE = re.compile(r"In CSV column #(\d+): (?:Row #\d+: )?CSV conversion error to ([^:]+): (.*)", re.S)
_COLUMNS_RE = re.compile(r"Expected (\d+) columns, got (\d+)")
_CHUNK = 1 << 20


def csv_batches(source: Source, delimiter: str = ",", *, block_size: int = 1 << 20,
                limits: UploadLimits | None = None, header: bool = True) -> Iterator[pa.RecordBatch]:
    """Yield record batches of a CSV/TSV with inferred types, streaming.

    `source` is CSV text (str), raw bytes, or a file path. Raises
    TabularParseError for an empty file, a row with the wrong number of
    columns (naming its line) and non-UTF-8 input (naming the byte offset).
    Batch sizes follow pyarrow's blocks (`block_size` bytes of input). `header=False`: the
    first record is data and the columns are column_1, column_2, ...
    `limits` bound rows, columns, seconds and cell size: a record (line) may be
    at most 4 cells' worth of bytes, so pyarrow never holds more than that.
    """
    if isinstance(source, str):
        source = source.encode("utf-8")
    limits = limits if limits is not None else UploadLimits().started()
    max_block = max(block_size, 4 * limits.cell_bytes)
    opener = _opener(source)
    _check_bom(opener)
    forced: set[str] = set()
    names: list[str] | None = None  # set when the header needs renaming
    yielded = 0
    while True:
        try:
            reader = _open(opener, delimiter, block_size, forced, names, header)
        except pa.ArrowInvalid as exc:
            if _straddles(exc):
                block_size = _grow(block_size, max_block, limits, yielded)
                continue
            raise _translate(exc, source, delimiter) from None
        found = reader.schema.names
        if len(found) > limits.columns:
            raise limits.refuse_columns(len(found))
        if names is None and not header:
            names = [f"column_{i + 1}" for i in range(len(found))]
            continue  # reopen with our names: the first record is data
        if names is None and found != unique_names(found):
            names = unique_names(found)
            continue  # reopen with clean names: Parquet needs unique ones
        if any(pa.types.is_binary(f.type) for f in reader.schema):
            # pyarrow quietly types invalid UTF-8 text as binary.
            raise _encoding_error(source)
        skip, restart = yielded, False
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except pa.ArrowInvalid as exc:
                restart = True
                if _straddles(exc):
                    # One record is longer than a block (huge quoted field).
                    block_size = _grow(block_size, max_block, limits, yielded)
                    break
                column = _conflicting_column(exc, reader.schema)
                if column is None or column in forced:
                    raise _translate(exc, source, delimiter) from None
                forced.add(column)
                break
            if skip:
                if batch.num_rows <= skip:
                    skip -= batch.num_rows
                    continue
                batch, skip = batch.slice(skip), 0
            if batch.num_rows:
                yielded += batch.num_rows
                _check_batch(batch, limits, yielded)
                yield batch
        if restart:
            continue
        if yielded == 0:
            # Header only: still hand out the columns so a schema is known.
            yield pa.RecordBatch.from_arrays(
                [pa.array([], type=f.type) for f in reader.schema], schema=reader.schema)
        return


def _grow(block_size: int, max_block: int, limits: UploadLimits, yielded: int) -> int:
    """The next block size for a record longer than a block, or LimitExceeded past the cap."""
    if block_size >= max_block:
        raise LimitExceeded(
            f"a CSV record after row {yielded:,} is longer than {human(max_block)} (4 cells of the "
            f"{human(limits.cell_bytes)} cell limit, offload.upload_max_cell_bytes); a cell that big "
            "is not table data")
    return min(block_size * 4, max_block)


def _check_batch(batch: pa.RecordBatch, limits: UploadLimits, rows: int) -> None:
    limits.tick()
    if rows > limits.rows:
        raise limits.refuse_rows()
    for name, col in zip(batch.schema.names, batch.columns):
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            longest = pc.max(pc.binary_length(col)).as_py()
            if longest is not None and longest > limits.cell_bytes:
                raise limits.refuse_cell(f"a cell of column {name!r} (before row {rows + 1:,})")


def _opener(source: bytes | Path) -> Callable[[], pa.NativeFile]:
    if isinstance(source, bytes):
        return lambda: pa.BufferReader(source)
    path = str(source)
    return lambda: pa.OSFile(path, "rb")


def _check_bom(opener: Callable[[], pa.NativeFile]) -> None:
    with opener() as f:
        head = f.read(4)
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise TabularParseError("file is UTF-16, not UTF-8; save it as UTF-8 (CSV UTF-8)")


def _straddles(exc: Exception) -> bool:
    return "straddling object" in str(exc)


def _open(opener, delimiter, block_size, forced, names, header=True) -> pacsv.CSVStreamingReader:
    read = pacsv.ReadOptions(block_size=block_size, autogenerate_column_names=not header)
    if names is not None:
        read = pacsv.ReadOptions(block_size=block_size, column_names=names, skip_rows=1 if header else 0)
    # Quoted newlines are common in real exports (comments, addresses).
    parse = pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True)
    convert = pacsv.ConvertOptions(column_types={name: pa.string() for name in forced})
    return pacsv.open_csv(opener(), read_options=read, parse_options=parse, convert_options=convert)


def _conflicting_column(exc: Exception, schema: pa.Schema) -> str | None:
    """Column named by a type-conversion error (None: not a conversion error)."""
    m = _CONVERSION_RE.search(str(exc))
    if m is None or "invalid UTF8" in m.group(3):
        return None
    index = int(m.group(1))
    return schema.names[index] if index < len(schema.names) else None


def _translate(exc: Exception, source: bytes | Path, delimiter: str) -> TabularParseError:
    """Turn a pyarrow CSV error into a message that says where the problem is."""
    msg = str(exc)
    if "Empty CSV file" in msg:
        return TabularParseError("CSV is empty: no header row")
    if "invalid UTF8" in msg or _first_bad_utf8(source) is not None:
        return _encoding_error(source)
    m = _COLUMNS_RE.search(msg)
    if m:
        where = _find_bad_row(source, delimiter, int(m.group(1)))
        if where is not None:
            line, got, text = where
            return TabularParseError(
                f"CSV line {line}: expected {m.group(1)} columns, got {got}: {text[:200]}")
    return TabularParseError(f"CSV could not be read: {msg}")


def _encoding_error(source: bytes | Path) -> TabularParseError:
    found = _first_bad_utf8(source)
    if found is None:  # pragma: no cover - pyarrow and Python disagree
        return TabularParseError("file is not valid UTF-8; save it as UTF-8")
    offset, line, byte = found
    return TabularParseError(
        f"file is not UTF-8 at byte {offset} (line {line}, byte 0x{byte:02X}); save it as UTF-8")


def _chunks(source: bytes | Path) -> Iterator[bytes]:
    if isinstance(source, bytes):
        yield source
        return
    with open(source, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _first_bad_utf8(source: bytes | Path) -> tuple[int, int, int] | None:
    """(byte offset, line, byte value) of the first invalid UTF-8 byte, streaming."""
    base, lines, carry = 0, 1, b""
    for chunk in _chunks(source):
        data = carry + chunk
        try:
            data.decode("utf-8")
            good = len(data)
        except UnicodeDecodeError as err:
            if err.reason == "unexpected end of data" and err.end == len(data):
                good = err.start  # sequence cut by the chunk boundary
            else:
                return base + err.start, lines + data.count(b"\n", 0, err.start), data[err.start]
        lines += data.count(b"\n", 0, good)
        base, carry = base + good, data[good:]
    if carry:
        return base, lines, carry[0]
    return None


def _find_bad_row(source: bytes | Path, delimiter: str, expected: int) -> tuple[int, int, str] | None:
    """(line, field count, text) of the first record whose width differs."""
    if isinstance(source, bytes):
        lines: Iterator[str] = iter(source.decode("utf-8", "replace").splitlines(keepends=True))
        handle = None
    else:
        handle = open(source, encoding="utf-8", errors="replace", newline="")
        lines = handle
    try:
        reader = csv.reader(lines, delimiter=delimiter)
        start = 1
        for record in reader:
            if record and len(record) != expected:
                return start, len(record), delimiter.join(record)
            start = reader.line_num + 1
    except csv.Error:  # e.g. a field over csv's size limit: keep pyarrow's message
        return None
    finally:
        if handle is not None:
            handle.close()
    return None


# ------------------------------------------------------------------ as the readers of ORDER

class DelimitedText(NamedTuple):
    """CSV or TSV found in a tool's text: the text to read, its delimiter, and whether its first
    record is a header (`header.csv_has_header`)."""

    body: str
    delimiter: str
    header: bool


def delimited_batches(source: DelimitedText, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch]:
    """The reader of CSV/TSV in a tool's text (pyarrow's blocks, not `batch_rows`)."""
    return csv_batches(source.body, source.delimiter, header=source.header)


def read_csv_file(path: Path, batch_rows: int, sheet: str | None,
                  limits: UploadLimits) -> tuple[None, Iterator[pa.RecordBatch]]:
    """The reader of a CSV file: types inferred while reading, so no schema up front."""
    return None, csv_batches(path, ",", limits=limits)


def read_tsv_file(path: Path, batch_rows: int, sheet: str | None,
                  limits: UploadLimits) -> tuple[None, Iterator[pa.RecordBatch]]:
    """The reader of a TSV file."""
    return None, csv_batches(path, "\t", limits=limits)
