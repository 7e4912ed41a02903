"""Streaming CSV/TSV -> Arrow record batches (pyarrow.csv.open_csv).

pyarrow infers column types from the first block only and fails on a later
value that does not fit (an `x` after 100k integers). We then restart the
read with that column forced to string and skip the rows already handed
out, so the caller sees every row exactly once; the earlier batches keep the
old type and the sink unifies the two (int64 + string -> string).

A file is read in its dialect (`dialect.py`: delimiter, quote, decimal comma, thousands
separator) and encoding (`encoding.py`; pyarrow's streaming transcoder), from its header line to
before a totals line (`Span`; `plan_file` works them out from the file's head and tail).
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from datadesk.offload.readers.base import Rest, ShapedStream, SourceFacts
from datadesk.offload.readers.casts import local_numbers
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.csv import encoding as enc
from datadesk.offload.readers.csv.dialect import Dialect, ReadChoices
from datadesk.offload.readers.csv.plan import Span, plan_file
from datadesk.offload.readers.errors import LimitExceeded, TabularParseError
from datadesk.offload.readers.limits import UploadLimits, human

Source = str | bytes | Path

# pyarrow's wording; some versions put "Row #N: " before "CSV conversion".
_CONVERSION_RE = re.compile(r"In CSV column #(\d+): (?:Row #\d+: )?CSV conversion error to ([^:]+): (.*)", re.S)
_COLUMNS_RE = re.compile(r"Expected (\d+) columns, got (\d+)")
_CHUNK = 1 << 20


def csv_batches(source: Source, delimiter: str = ",", *, block_size: int = 1 << 20,
                limits: UploadLimits | None = None, header: bool = True, dialect: Dialect | None = None,
                span: Span | None = None) -> Iterator[pa.RecordBatch]:
    """Yield record batches of a CSV/TSV with inferred types, streaming.

    `source` is CSV text (str), raw bytes, or a file path. Raises
    TabularParseError for an empty file, a row with the wrong number of
    columns (naming its line) and non-UTF-8 input (naming the byte offset).
    Batch sizes follow pyarrow's blocks (`block_size` bytes of input). `header=False`: the
    first record is data and the columns are column_1, column_2, ...
    `limits` bound rows, columns, seconds and cell size: a record (line) may be
    at most 4 cells' worth of bytes, so pyarrow never holds more than that.
    `dialect` (its delimiter, quote, decimal and thousands separators and header override the
    arguments) and `span` (which bytes, in which encoding) come from `plan_file` / `plan_text`.
    """
    if isinstance(source, str):
        source = source.encode("utf-8")
    if dialect is not None:
        delimiter, header = dialect.delimiter, dialect.header
    span = span or Span()
    limits = limits if limits is not None else UploadLimits().started()
    max_block = max(block_size, 4 * limits.cell_bytes)
    opener = _opener(source, span)
    if span.encoding == "utf-8":
        _check_bom(opener)
    forced: set[str] = set()
    names: list[str] | None = None  # set when the header needs renaming
    yielded = 0
    while True:
        try:
            reader = _open(opener, delimiter, block_size, forced, names, header, dialect, span.encoding)
        except pa.ArrowInvalid as exc:
            if _straddles(exc):
                block_size = _grow(block_size, max_block, limits, yielded)
                continue
            raise _translate(exc, source, delimiter, span) from None
        except UnicodeDecodeError:
            raise _decode_error(source, span) from None
        renamed = _checked_names(reader.schema, names, header, limits, source, span)
        if renamed is not None:
            names = renamed
            continue  # reopen with these names
        skip, restart = yielded, False
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except UnicodeDecodeError:
                raise _decode_error(source, span) from None
            except pa.ArrowInvalid as exc:
                restart = True
                if _straddles(exc):
                    # One record is longer than a block (huge quoted field).
                    block_size = _grow(block_size, max_block, limits, yielded)
                    break
                column = _conflicting_column(exc, reader.schema)
                if column is None or column in forced:
                    raise _translate(exc, source, delimiter, span) from None
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
                yield _numbers(batch, dialect)
        if restart:
            continue
        if yielded == 0:
            # Header only: still hand out the columns so a schema is known.
            yield pa.RecordBatch.from_arrays(
                [pa.array([], type=f.type) for f in reader.schema], schema=reader.schema)
        return


def _checked_names(schema: pa.Schema, names: list[str] | None, header: bool, limits: UploadLimits,
                   source: bytes | Path, span: Span) -> list[str] | None:
    """The names to reopen with (None: read on): column_1... when the first record is data,
    clean unique names when the header repeats one (Parquet needs unique ones). Refuses too many
    columns and text that is not in the span's encoding (pyarrow quietly types it as binary)."""
    found = schema.names
    if len(found) > limits.columns:
        raise limits.refuse_columns(len(found))
    if names is None and not header:
        return [f"column_{i + 1}" for i in range(len(found))]
    if names is None and found != unique_names(found):
        return unique_names(found)
    if any(pa.types.is_binary(f.type) for f in schema):
        raise _encoding_error(source, span)
    return None


def _numbers(batch: pa.RecordBatch, dialect: Dialect | None) -> pa.RecordBatch:
    """Text columns of numbers with a thousands separator (`1.234,56`) cast to numbers; pyarrow
    reads plain ones itself (`decimal_point`)."""
    if dialect is None or not dialect.numbers_need_cast:
        return batch
    arrays, changed = [], False
    for col in batch.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            typed = local_numbers(col, dialect.decimal, dialect.thousands)
            changed = changed or typed is not col
            col = typed
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names) if changed else batch


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


def _opener(source: bytes | Path, span: Span) -> Callable[[], pa.NativeFile]:
    if isinstance(source, bytes):
        if span.whole:
            return lambda: pa.BufferReader(source)
        data = pa.py_buffer(source)
        stop = len(source) if span.end is None else span.end if span.end >= 0 else len(source) + span.end
        return lambda: pa.BufferReader(data.slice(span.start, max(0, stop - span.start)))
    path = str(source)
    if span.whole:
        return lambda: pa.OSFile(path, "rb")
    return lambda: pa.PythonFile(_SpanFile(path, span.start, span.end), mode="r")


class _SpanFile(io.RawIOBase):
    """Bytes [start, end) of a file, read as a stream (pyarrow pulls a block at a time)."""

    def __init__(self, path: str, start: int, end: int | None) -> None:
        self._fh = open(path, "rb")
        self._fh.seek(start)
        self._left = (end - start) if end is not None else None

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._left is not None:
            size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._fh.read(size)
        if self._left is not None:
            self._left -= len(data)
        return data

    def readinto(self, b) -> int:  # pragma: no cover - pyarrow calls read()
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._fh.close()
        super().close()


def _check_bom(opener: Callable[[], pa.NativeFile]) -> None:
    with opener() as f:
        head = f.read(4)
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise TabularParseError("file is UTF-16, not UTF-8; save it as UTF-8 (CSV UTF-8)")


def _straddles(exc: Exception) -> bool:
    return "straddling object" in str(exc)


def _open(opener, delimiter, block_size, forced, names, header=True, dialect: Dialect | None = None,
          encoding: str = "utf-8") -> pacsv.CSVStreamingReader:
    read = pacsv.ReadOptions(block_size=block_size, autogenerate_column_names=not header, encoding=encoding)
    if names is not None:
        read = pacsv.ReadOptions(block_size=block_size, column_names=names, skip_rows=1 if header else 0,
                                 encoding=encoding)
    # Quoted newlines are common in real exports (comments, addresses).
    quote = dialect.quote if dialect is not None else '"'
    parse = pacsv.ParseOptions(delimiter=delimiter, quote_char=quote, newlines_in_values=True)
    decimal = dialect.decimal if dialect is not None else "."
    convert = pacsv.ConvertOptions(column_types={name: pa.string() for name in forced}, decimal_point=decimal)
    return pacsv.open_csv(opener(), read_options=read, parse_options=parse, convert_options=convert)


def _conflicting_column(exc: Exception, schema: pa.Schema) -> str | None:
    """Column named by a type-conversion error (None: not a conversion error)."""
    m = _CONVERSION_RE.search(str(exc))
    if m is None or "invalid UTF8" in m.group(3):
        return None
    index = int(m.group(1))
    return schema.names[index] if index < len(schema.names) else None


def _translate(exc: Exception, source: bytes | Path, delimiter: str, span: Span | None = None) -> TabularParseError:
    """Turn a pyarrow CSV error into a message that says where the problem is."""
    span = span or Span()
    msg = str(exc)
    if "Empty CSV file" in msg:
        return TabularParseError("CSV is empty: no header row")
    if span.encoding == "utf-8" and ("invalid UTF8" in msg or _first_bad_utf8(source) is not None):
        return _encoding_error(source, span)
    m = _COLUMNS_RE.search(msg)
    if m:
        where = _find_bad_row(source, delimiter, int(m.group(1)), span)
        if where is not None:
            line, got, text = where
            return TabularParseError(
                f"CSV line {line}: expected {m.group(1)} columns, got {got}: {text[:200]}")
    return TabularParseError(f"CSV could not be read: {msg}")


def _encoding_error(source: bytes | Path, span: Span | None = None) -> TabularParseError:
    found = _first_bad_utf8(source)
    if found is None:  # pragma: no cover - pyarrow and Python disagree
        return TabularParseError("file is not valid UTF-8; save it as UTF-8")
    offset, line, byte = found
    hint = "save it as UTF-8" if span is None or span.whole else "re-import it with its encoding (e.g. cp1252)"
    return TabularParseError(
        f"file is not UTF-8 at byte {offset} (line {line}, byte 0x{byte:02X}); {hint}")


def _decode_error(source: bytes | Path, span: Span) -> TabularParseError:
    """The place a file is not in the encoding it was read in (pyarrow's transcoder refused it)."""
    found = enc.first_bad_byte(source, span.encoding, span.start) if isinstance(source, Path) else None
    where = f" at byte {found[0]} (line {found[1] + span.lines_before})" if found else ""
    return TabularParseError(f"file is not {span.encoding}{where}; re-import it with another encoding "
                             "(utf-8, cp1252, utf-16)")


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


def _find_bad_row(source: bytes | Path, delimiter: str, expected: int,
                  span: Span | None = None) -> tuple[int, int, str] | None:
    """(line, field count, text) of the first record whose width differs."""
    span = span or Span()
    if isinstance(source, bytes):
        stop = len(source) if span.end is None else span.end if span.end >= 0 else len(source) + span.end
        text = source[span.start:stop].decode(span.encoding, "replace")
        lines: Iterator[str] = iter(text.splitlines(keepends=True))
        handle = None
    else:
        raw = open(source, "rb")
        raw.seek(span.start)
        handle = io.TextIOWrapper(raw, encoding=span.encoding, errors="replace", newline="")
        lines = handle
    try:
        reader = csv.reader(lines, delimiter=delimiter)
        start = 1
        for record in reader:
            if record and len(record) != expected:
                return start + span.lines_before, len(record), delimiter.join(record)
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
    record is a header (`header.csv_has_header`); `dialect` and `span` from `plan_text`."""

    body: str
    delimiter: str
    header: bool
    dialect: Dialect | None = None
    span: Span | None = None


def delimited_batches(source: DelimitedText, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch]:
    """The reader of CSV/TSV in a tool's text (pyarrow's blocks, not `batch_rows`)."""
    return csv_batches(source.body, source.delimiter, header=source.header, dialect=source.dialect,
                       span=source.span)


def _read_file(path: Path, delimiter: str, limits: UploadLimits,
               choices: ReadChoices | None) -> tuple[None, ShapedStream]:
    dialect, span = plan_file(path, delimiter, choices)
    facts = SourceFacts(dialect.describe(), reading=dialect.reading())
    return None, ShapedStream(None, csv_batches(path, limits=limits, dialect=dialect, span=span), facts)


def read_csv_file(path: Path, batch_rows: int, sheet: str | None, limits: UploadLimits,
                  choices: ReadChoices | None = None) -> tuple[None, ShapedStream]:
    """The reader of a CSV file (any delimiter but tab): types inferred while reading, so no
    schema up front; its dialect sniffed (or as `choices` say: a re-import), and said in the
    stream's facts (its shape: the delimiter, decimal comma, what was left out)."""
    return _read_file(path, ",", limits, choices)


def read_tsv_file(path: Path, batch_rows: int, sheet: str | None, limits: UploadLimits,
                  choices: ReadChoices | None = None) -> tuple[None, ShapedStream]:
    """The reader of a TSV file."""
    return _read_file(path, "\t", limits, choices)
