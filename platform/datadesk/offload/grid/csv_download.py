"""Tables as CSV downloads: the grid's `rows.csv` and an artifact's `download?format=csv`.

Every column gets a way to be written, chosen from the Arrow schema before the first byte goes
out (`CSVEncoder`):

- text (string, large/view strings, dictionary-encoded text such as a DuckDB ENUM) is written
  as text, and a cell that starts with `=`, `+`, `-`, `@`, TAB or CR gets a leading `'`
  (OWASP's CSV-injection rule: a spreadsheet would run such a cell as a formula), unless the
  request asks `formulas=keep`. The header's column names follow the same rule. Typed columns
  (numbers, decimals, booleans, dates, times) are never touched: a negative NUMBER is not a
  formula, and `'-5` in a numeric column would turn it into text. A number stored as text is a
  text cell and is escaped like any other.
- STRUCT, LIST and MAP columns are written as JSON text (`{"x": 1}`, `[1, 2]`; a MAP as an
  object, decimals as numbers, dates as ISO text).
- binary is written as `0x` + hex, as the grid shows it (raw bytes need not be UTF-8).
- timestamps and times in their shortest exact form (`2024-01-13 04:00:00`, `04:00:00.5`):
  sub-second digits only where a cell has them (pyarrow would write `.000000` everywhere).
- anything pyarrow's CSV writer does not take (intervals, unions...) as text.

`parquet_csv` checks what it can before streaming: it opens the file, plans the columns and
encodes the first batch, so a failure there is an error status, never an empty 200. A failure
later (a damaged row group) is logged and raised out of the stream, so the server aborts the
response instead of ending it cleanly: the client sees the download was cut.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

CSV_BATCH_ROWS = 65_536
FORMULA_START = r"^([=+\-@\t\r])"  # OWASP: cells a spreadsheet reads as a formula or DDE call
FORMULA_PARAM = "formulas"

Convert = Callable[[pa.Array], pa.Array]


class CSVError(RuntimeError):
    """A table could not be written as CSV; the message names the file or column and why."""


def keep_formulas(values: Sequence[str]) -> bool:
    """The `formulas` query parameter: `keep` writes cells as they are, `escape` (the default)
    prefixes formula-like text cells with `'`. ValueError naming the parameter otherwise."""
    if not values or list(values) == [""]:
        return False
    if len(values) > 1 or values[0] not in ("keep", "escape"):
        shown = ", ".join(repr(v[:20]) for v in values)
        raise ValueError(f"{FORMULA_PARAM}: {shown} is not keep or escape (keep: write cells starting with "
                         "=, +, -, @, TAB or CR as they are; escape, the default: prefix them with ')")
    return values[0] == "keep"


def escape_formulas(arr: pa.Array) -> pa.Array:
    """A text array with `'` before every cell a spreadsheet would take for a formula."""
    return pc.replace_substring_regex(arr, pattern=FORMULA_START, replacement=r"'\1", max_replacements=1)


def _json_cell(value: Any) -> Any:
    # msgspec writes dicts, lists, decimals, dates and bytes itself; anything else as its text
    return str(value)


_JSON = msgspec.json.Encoder(enc_hook=_json_cell, decimal_format="number")


def _plain(value: Any) -> Any:
    """`value` with every dict key as text (a MAP's keys may be floats or dates, which JSON lacks)."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else _JSON.encode(k).decode().strip('"'): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _json_text(value: Any) -> str:
    try:
        return _JSON.encode(value).decode()
    except (TypeError, ValueError, OverflowError):  # a key JSON has no form for
        return _JSON.encode(_plain(value)).decode()


def _as_json(arr: pa.Array) -> pa.Array:
    values = arr.to_pylist(maps_as_pydicts="lossy")  # a MAP as an object, not a list of pairs
    return pa.array([None if v is None else _json_text(v) for v in values], pa.string())


def _as_hex(arr: pa.Array) -> pa.Array:
    return pa.array([None if v is None else "0x" + v.hex() for v in arr.to_pylist()], pa.string())


def _interval_text(v: Any) -> str:
    seconds = format(Decimal(v.nanoseconds).scaleb(-9).normalize(), "f")  # exact, never 1e+06
    return f"P{v.months}M{v.days}DT{seconds}S"  # ISO 8601: months, days, then the time part


def _as_text(arr: pa.Array) -> pa.Array:
    if pa.types.is_interval(arr.type):
        return pa.array([None if v is None else _interval_text(v) for v in arr.to_pylist()], pa.string())
    try:
        return pc.cast(arr, pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return pa.array([None if v is None else str(v) for v in arr.to_pylist()], pa.string())


def _short_time(arr: pa.Array) -> pa.Array:
    """Timestamps and times in their shortest exact form: `2024-01-13 04:00:00`, not
    `.000000`; sub-second digits only when a cell has them, without trailing zeros (`.5`)."""
    text = pc.cast(arr, pa.string())
    text = pc.replace_substring_regex(text, pattern=r"\.0+(Z?)$", replacement=r"\1")
    return pc.replace_substring_regex(text, pattern=r"(\.\d*?[1-9])0+(Z?)$", replacement=r"\1\2")


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_binary(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_binary_view(t))


def _is_nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t) or pa.types.is_union(t)  # struct, list kinds, map; unions as JSON


def _writable(t: pa.DataType) -> bool:
    """Whether pyarrow's CSV writer takes the type as it is (it casts every column to text; an
    empty table alone would not show a missing cast)."""
    try:
        pacsv.write_csv(pa.table({"c": pa.array([], t)}), pa.BufferOutputStream())
        pc.cast(pa.array([], t), pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True


def converter(t: pa.DataType) -> tuple[Convert | None, bool]:
    """How a column of type `t` is written: (conversion or None for as-is, whether its cells are
    text and get the formula rule)."""
    if isinstance(t, pa.ExtensionType):
        inner, text = converter(t.storage_type)
        return (lambda a: inner(a.storage) if inner else a.storage), text
    if pa.types.is_dictionary(t):
        inner, text = converter(t.value_type)
        return (lambda a: (inner or (lambda x: x))(a.dictionary_decode())), text
    if _is_text(t):
        return ((lambda a: a) if pa.types.is_string(t) else (lambda a: pc.cast(a, pa.string()))), True
    if _is_binary(t):
        return _as_hex, True
    if _is_nested(t):
        return _as_json, True
    if pa.types.is_timestamp(t) or pa.types.is_time(t):
        return _short_time, False
    if _writable(t):
        return None, False
    return _as_text, True


class CSVEncoder:
    """Batches of one schema as CSV bytes, the header with the first (see the module docstring)."""

    def __init__(self, schema: pa.Schema, keep_formulas: bool = False) -> None:
        self.keep = keep_formulas
        self.plan = [converter(f.type) for f in schema]
        names = pa.array([f.name for f in schema], pa.string())
        self.names = names.to_pylist() if keep_formulas else escape_formulas(names).to_pylist()
        self.schema = schema
        self._header = True

    def _column(self, arr: pa.Array, plan: tuple[Convert | None, bool]) -> pa.Array:
        convert, text = plan
        out = convert(arr) if convert is not None else arr
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        return escape_formulas(out) if text and not self.keep else out

    def encode(self, batch: pa.RecordBatch) -> bytes:
        """One batch as CSV (with the header when it is the first thing encoded)."""
        arrays = [self._column(batch.column(i), plan) for i, plan in enumerate(self.plan)]
        table = pa.Table.from_arrays(arrays, names=self.names)
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink, write_options=pacsv.WriteOptions(include_header=self._header))
        self._header = False
        return sink.getvalue().to_pybytes()

    def header(self) -> bytes:
        """The header line alone (a table without rows), or b"" when it already went out."""
        return self.encode(pa.RecordBatch.from_pylist([], schema=self.schema)) if self._header else b""


def one_line(exc: BaseException) -> str:
    """An error's text on one line, at most 300 characters (Arrow's span several)."""
    return " ".join(str(exc).split())[:300]


def stream(first: bytes, rest: Iterable[pa.RecordBatch], encoder: CSVEncoder, what: str, done_rows: int = 0,
           explain: Callable[[Exception], str] = one_line) -> Iterator[bytes]:
    """`first` (what was encoded before the response started; may be empty), then the other
    batches, then the header alone when no row came. A failure is logged naming `what` (and
    `explain(exc)`) and raised as CSVError, so the server aborts the response instead of
    ending it: the client sees the download was cut, never a short file that looks whole."""
    if first:
        yield first
    rows = done_rows
    try:
        for batch in rest:
            chunk = encoder.encode(batch)
            rows += batch.num_rows
            yield chunk
        tail = encoder.header()  # no rows at all: still the header
    except Exception as exc:  # whatever broke, the client must see a cut download
        message = explain(exc)
        log.error("the CSV download of %s was cut after %d rows: %s", what, rows, message)
        raise CSVError(f"the CSV download of {what} was cut after {rows} rows: {message}") from exc
    if tail:
        yield tail


def parquet_csv(path: Path | str, what: str, keep: bool = False) -> Iterator[bytes]:
    """A Parquet file as CSV chunks. Opening it, planning its columns and encoding the first
    batch happen now (CSVError naming why); the rest streams, cut on a later failure."""
    try:
        pf = pq.ParquetFile(path)
        encoder = CSVEncoder(pf.schema_arrow, keep)
        batches = pf.iter_batches(batch_size=CSV_BATCH_ROWS)
        batch = next(batches, None)
        first = encoder.encode(batch) if batch is not None else encoder.header()
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise CSVError(f"{what} could not be written as CSV: {one_line(exc)}") from None
    return stream(first, batches, encoder, what, batch.num_rows if batch is not None else 0)

