"""Readers of every door: a tool's result, an upload, a pasted table (DESIGN section 6).

`ORDER` below is the one place that says what is tried, in which order: read it top to bottom.
Each line is one attempt: the door it serves, the format, the sniff that says whether the input
looks like it, and the readers that read it, tried in order, with the exact reader last.

- A file (an upload; a paste once staged, sniffed as the file it becomes): `sniff_file` answers
  the format of the first line of the FILE door whose sniff says yes (magic numbers first, then
  the text's beginning; never the name), and `file_batches` reads it with that line's readers:
  the first that does not answer None. A text in a shape only a tool's text has (Markdown,
  HTML, vertical records, a Python repr, a JSON envelope, JSON in prose ...) is read whole (at
  most `offload.upload_max_text_bytes`) by `tool_text_file`: the TOOL lines below, as for a
  tool's result, so that every door reads a shape the same way. What streams stays streaming:
  CSV/TSV by pyarrow, a JSON array of objects (or NDJSON) element by element.
- A tool's text (and its structured content, as JSON): `parse_text` takes the first line of the
  TOOL door whose sniff says yes and whose locate finds rows (a locate that refuses, e.g. text
  that starts like JSON but is not, hands on to the next line). Its readers are then tried in
  order on what the locate found: the first that does not answer None reads it, and what they
  all refuse goes to the exact reader, which names what it cannot read. A reader that took the
  input but refuses a later piece hands that piece and the rest to `Rest`: the attempt again
  from its first reader, or its exact reader (each reader's docstring says which).

    parse_text(text, hints)  -> ShapedStream | None    a tool's text (None: not a table)
    result_stream(result)    -> its own stream, its structured content, or its text
    sniff_file(path)         -> a FILE format of ORDER ("parquet", "xlsx", "json", "csv", "drawn table" ...)
                                or "unknown"
    detect_text(text)        -> a format of TEXT_TABLES, or "text"   (a paste, sniffed as a file)
    file_batches(path, fmt)  -> (schema when known up front, batches: a ShapedStream for a tool's shape)
    file_tables(path, fmt)   -> every table of it (`FileTable`: one per sheet of a workbook)
    TABULAR, TEXT_TABLES     -> the FILE formats read as tables; those of them read from text

Never `eval`. Errors are `TabularParseError` naming the place (line, byte, sheet); past an
upload's limits, `LimitExceeded` naming the limit.
"""

from __future__ import annotations

import json as stdlib_json  # (`json` here is the package readers/json/)
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec
import pyarrow as pa

from datadesk.domain.sources import SourceHints
from datadesk.domain.tools import TabularStream, ToolResult
from datadesk.offload.readers import parquet, sniff
from datadesk.offload.readers.base import FileTable, ShapedStream, SourceFacts
from datadesk.offload.readers.casts import sql_cast
from datadesk.offload.readers.csv import pyarrow_engine as csv_engine
from datadesk.offload.readers.csv.dialect import ReadChoices
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.excel import openpyxl_engine
from datadesk.offload.readers.html import pyarrow_engine as html_pyarrow
from datadesk.offload.readers.html import stdlib_engine as html_engine
from datadesk.offload.readers.json import exact as json_exact
from datadesk.offload.readers.json import pyarrow_csv_engine as json_csv
from datadesk.offload.readers.json import pyarrow_engine as json_pyarrow
from datadesk.offload.readers.json import stdlib_engine
from datadesk.offload.readers.json.locate import CHUNK_ROWS, JsonRows
from datadesk.offload.readers.limits import UploadLimits
from datadesk.offload.readers.pyrepr import exact as repr_exact
from datadesk.offload.readers.pyrepr import json_engine as repr_json
from datadesk.offload.readers.pyrepr import pyarrow_csv_engine as repr_csv
from datadesk.offload.readers.text import pyarrow_engine as drawn_engine
from datadesk.offload.readers.text import vertical
from datadesk.offload.readers.text.file import read_text

BATCH_ROWS = 131_072
TOOL, FILE = "tool", "file"  # a tool's text; a file's bytes (an upload, a paste once staged)


@dataclass(frozen=True)
class Attempt:
    """One line of `ORDER`.

    `sniff(input)`: does it look like this format (a `sniff.FileHead` for files, a
    `sniff.TextProbe` for a tool's text). `locate(probe)` (tool text): where the rows are, as
    `(source, SourceFacts)`, or a `TextProbe` of a block in prose, read by the lines above;
    TabularParseError: not this format after all. `readers`: for a tool's text
    `reader(source, batch_rows, rest) -> batches | None` (None: not for this reader), tried in
    order; for a file `reader(path, batch_rows, sheet, limits) -> (schema, batches) | None`, the
    same way.
    `exact(source, batch_rows)`: what every reader refused. `tables(path, batch_rows, limits)`
    (a file of several tables, a workbook): each table (`FileTable`), for `file_tables`."""

    door: str
    format: str
    sniff: Callable[[Any], bool]
    locate: Callable[[sniff.TextProbe], Any] | None = None
    readers: tuple[Callable[..., Any], ...] = ()
    exact: Callable[[Any, int], Iterator[pa.RecordBatch]] | None = None
    tables: Callable[..., Iterator[Any]] | None = None


def tool_text_file(path: Path, batch_rows: int, sheet: str | None,
                   limits: UploadLimits) -> tuple[None, ShapedStream]:
    """The reader of a text file in a shape a tool's text may have: its text, read whole (at most
    `limits.text_bytes`), by the TOOL lines of `ORDER`, as `parse_text` reads a tool's result.
    Unlike there, what no line reads is an error naming why (the first line that refused it)."""
    text = read_text(path, limits)
    attempt, source, facts = _open(sniff.TextProbe(text.lstrip("\ufeff")))
    return None, ShapedStream(None, limits.checked(_batches(attempt, source, batch_rows)), facts)


ORDER: tuple[Attempt, ...] = (
    # ---- a file: by its bytes, never by its name; the first whose sniff says yes
    Attempt(FILE, "parquet", sniff.is_parquet, readers=(parquet.read_file,)),
    Attempt(FILE, "xlsx", sniff.is_workbook, readers=(openpyxl_engine.read_file,),  # one sheet
            tables=openpyxl_engine.read_sheets),                                    # every sheet
    Attempt(FILE, "xls", sniff.magic(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"),  # OLE2, legacy Excel:
            readers=(openpyxl_engine.refuse_legacy,)),                     # refused, saying what to do
    Attempt(FILE, "png", sniff.magic(b"\x89PNG\r\n\x1a\n")),  # images: kept as they are (vision models)
    Attempt(FILE, "jpeg", sniff.magic(b"\xff\xd8\xff")),
    Attempt(FILE, "gif", sniff.magic(b"GIF87a", b"GIF89a")),
    Attempt(FILE, "webp", sniff.is_webp),
    Attempt(FILE, "python repr", sniff.is_repr_text, readers=(tool_text_file,)),  # before JSON: `[(`, `[{'`
    Attempt(FILE, "json", sniff.is_json,
            readers=(stdlib_engine.read_streaming_file,  # an array of objects, NDJSON: element by element
                     tool_text_file)),                   # an envelope, column lists ...: as a tool's text
    Attempt(FILE, "html table", sniff.is_html_text, readers=(tool_text_file,)),
    Attempt(FILE, "vertical records", sniff.is_vertical_text, readers=(tool_text_file,)),
    Attempt(FILE, "drawn table", sniff.is_drawn_text, readers=(tool_text_file,)),  # before CSV: `| a, b |`
    Attempt(FILE, "value in prose", sniff.is_value_in_prose_text, readers=(tool_text_file,)),  # JSON, a repr
    Attempt(FILE, "tsv", sniff.is_tsv, readers=(csv_engine.read_tsv_file,)),   # pyarrow's streaming CSV
    Attempt(FILE, "csv", sniff.is_csv, readers=(csv_engine.read_csv_file,)),
    Attempt(FILE, "text table", sniff.is_text_table, readers=(tool_text_file,)),  # any other: CSV after prose
    # ---- a tool's text: the first whose sniff says yes and whose locate finds rows
    Attempt(TOOL, "python repr", sniff.is_python_repr, sniff.locate_repr,
            readers=(repr_csv.tuple_batches,    # rows of tuples or lists, rewritten as CSV for pyarrow
                     repr_csv.dict_batches,     # rows of dicts / a dict of lists: by column, else as CSV
                     repr_json.piece_batches,   # quotes, backslashes, nesting: as JSON, piece by piece
                     repr_json.whole_batches),  # ... or all at once
            exact=repr_exact.exact_batches),    # `ast` on a whitelist of literals and calls
    Attempt(TOOL, "json", sniff.is_json_value, sniff.locate_json,
            readers=(json_pyarrow.piece_batches,  # an array of objects: pyarrow, pieces on two threads
                     json_csv.array_batches,      # rows of flat arrays: pyarrow's CSV reader
                     json_pyarrow.line_batches),  # objects chunk by chunk, NDJSON: pyarrow
            exact=json_exact.batches),            # msgspec's values, typed column by column
    Attempt(TOOL, "html table", sniff.has_html_table, sniff.locate_html,
            readers=(html_pyarrow.plain_batches,  # only table tags, no spans: cut by one regex, typed by pyarrow
                     html_engine.table_batches)),  # any other: `html.parser`, fed in pieces
    Attempt(TOOL, "vertical records", sniff.has_vertical_records, sniff.locate_vertical,  # \G, \x, `1. row`
            readers=(vertical.record_batches,)),
    Attempt(TOOL, "value in prose", sniff.has_value_in_prose, sniff.value_block),  # read by the two above
    Attempt(TOOL, "csv text", sniff.has_delimited_table, sniff.locate_delimited,
            readers=(csv_engine.delimited_batches,)),
    Attempt(TOOL, "drawn table", sniff.has_drawn_table, sniff.locate_drawn,  # Markdown, boxes, psql, fixed
            readers=(drawn_engine.drawn_batches,)),
)


def _attempt(door: str, fmt: str) -> Attempt:
    return next(a for a in ORDER if a.door == door and a.format == fmt)


class Rest:
    """Where a reader of `attempt` hands what it refuses part way (see `base.Rest`)."""

    def __init__(self, attempt: Attempt, batch_rows: int) -> None:
        self.attempt, self.batch_rows = attempt, batch_rows

    @classmethod
    def of(cls, fmt: str, batch_rows: int) -> "Rest":
        """The rest of the tool-text attempt for `fmt`."""
        return cls(_attempt(TOOL, fmt), batch_rows)

    def again(self, source: Any) -> Iterator[pa.RecordBatch]:
        return _batches(self.attempt, source, self.batch_rows)

    def exact(self, source: Any) -> Iterator[pa.RecordBatch]:
        return self.attempt.exact(source, self.batch_rows)

    def json(self, found: JsonRows) -> Iterator[pa.RecordBatch]:
        return _batches(_JSON, found, self.batch_rows)


_TOOL = tuple(a for a in ORDER if a.door == TOOL)
_JSON = _attempt(TOOL, "json")


def _batches(attempt: Attempt, source: Any, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """`source` read by `attempt`: its first reader that takes it, else its exact reader."""
    rest = Rest(attempt, batch_rows)
    for read in attempt.readers:
        batches = read(source, batch_rows, rest)
        if batches is not None:
            yield from batches
            return
    yield from attempt.exact(source, batch_rows)


def _open(probe: sniff.TextProbe, attempts: tuple[Attempt, ...] = _TOOL) -> tuple[Attempt, Any, SourceFacts]:
    """The first of `attempts` whose sniff says yes and whose locate finds rows in `probe`; when
    none does, TabularParseError with the first refusal (the likeliest reading: "invalid JSON ...")."""
    refused: TabularParseError | None = None
    for i, attempt in enumerate(attempts):
        if not attempt.sniff(probe):
            continue
        try:
            found = attempt.locate(probe)
            if isinstance(found, sniff.TextProbe):  # a block in prose: read by the attempts above
                return _open(found, attempts[:i])
        except TabularParseError as exc:
            refused = refused or exc
            continue
        return (attempt, *found)
    raise refused or TabularParseError("no table found in the text")


# ------------------------------------------------------------------ a tool's text

def parse_text(text: str, hints: SourceHints | None = None, batch_rows: int = BATCH_ROWS) -> ShapedStream | None:
    """The table in `text`, whatever its shape, or None when there is none.

    The first batch is read now (a parse error there means "not a table"); the rest streams.
    Errors further on raise TabularParseError naming the place."""
    try:
        attempt, source, facts = _open(sniff.TextProbe(text.lstrip("\ufeff")))
    except TabularParseError:
        return None
    facts.hints = hints
    gen = _batches(attempt, source, batch_rows)
    try:
        first = next(gen)
    except StopIteration:
        return ShapedStream(None, iter(()), facts)
    except TabularParseError:
        return None
    if first.num_columns == 0:
        return None
    return ShapedStream(first.schema, _chain(first, gen, hints), facts)


def repr_batches(text: str, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Typed batches of a Python-repr table, by the readers of its line of `ORDER`."""
    return _batches(_attempt(TOOL, "python repr"), text, batch_rows)


def json_rows(found: JsonRows, batch_rows: int = CHUNK_ROWS) -> Iterator[pa.RecordBatch]:
    """Typed batches of the rows `json.locate.locate` found, by the JSON readers of `ORDER`."""
    return _batches(_JSON, found, batch_rows)


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], hints: SourceHints | None) -> Iterator[pa.RecordBatch]:
    formats = hints.column_formats if hints is not None else None
    yield _formatted(first, formats)
    for batch in rest:
        yield _formatted(batch, formats)


def _formatted(batch: pa.RecordBatch, formats: dict[str, str] | None) -> pa.RecordBatch:
    if not formats:
        return batch
    sql = {"date": "DATE", "date-time": "TIMESTAMP WITH TIME ZONE", "integer": "BIGINT", "number": "DOUBLE",
           "boolean": "BOOLEAN"}
    arrays = [sql_cast(col, sql.get(formats.get(name, ""))) if formats.get(name) in sql else col
              for name, col in zip(batch.schema.names, batch.columns)]
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def result_stream(result: ToolResult, batch_rows: int = BATCH_ROWS) -> TabularStream | None:
    """The table of a tool result: its own stream, its structured content, or its text."""
    if result.table is not None:
        return result.table
    hints = result.source
    structured = hints.structured if hints is not None else None
    if structured is not None:
        table = _structured(structured, hints, batch_rows)
        if table is not None:
            return table
    return parse_text(result.content, hints, batch_rows)


def _structured(value: Any, hints: SourceHints, batch_rows: int) -> ShapedStream | None:
    if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), str):
        return parse_text(next(iter(value.values())), hints, batch_rows)  # {"result": "<the text>"}
    if not isinstance(value, (dict, list)):
        return None
    try:
        data = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError):
        data = stdlib_json.dumps(value, default=str).encode()
    table = parse_text(data.decode("utf-8"), hints, batch_rows)
    if table is not None:
        table.facts.shape = f"structured content: {table.facts.shape}"
    return table


# ------------------------------------------------------------------------- files

def sniff_file(path: Path) -> str:
    """What a file is by its bytes (the name is ignored): the format of the first FILE line of
    `ORDER` whose sniff says yes, or "unknown" (binary, or text that is not a table)."""
    head = sniff.FileHead.of_file(path)
    return next((a.format for a in ORDER if a.door == FILE and a.sniff(head)), "unknown")


def detect_text(text: str) -> str:
    """A pasted text sniffed as the file it would be saved as: a format of `TEXT_TABLES` ("json",
    "python repr", "drawn table", "html table", "csv" ...) or "text" (no table in it).

    Looks at a bounded prefix only (64 KiB, first 20 records), never the whole text."""
    head = sniff.FileHead.of_text(text)
    fmt = next((a.format for a in ORDER if a.door == FILE and a.sniff(head)), "text")
    return fmt if fmt in TEXT_TABLES else "text"


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
    for attempt in ORDER:
        if attempt.door == FILE and attempt.format == fmt:
            for read in attempt.readers:
                opened = read(path, batch_rows, sheet, limits)
                if opened is not None:
                    return opened
    raise TabularParseError(f"{fmt!r} is not a tabular format")


def file_tables(path: Path, fmt: str, batch_rows: int = 65_536, *, limits: UploadLimits | None = None,
                choices: ReadChoices | None = None) -> Iterator[FileTable]:
    """Every table of a file of a sniffed format, in order: one per sheet of a workbook (an empty
    sheet or a chart comes with `skipped` saying so), else the one `file_batches` reads. Each
    table's stream must be read before the next table is asked for. `choices` (a CSV/TSV
    re-import): the delimiter, decimal separator, header row or encoding the user set."""
    path = Path(path)
    limits = limits if limits is not None else UploadLimits().started()
    attempt = next((a for a in ORDER if a.door == FILE and a.format == fmt), None)
    if attempt is not None and attempt.tables is not None:
        yield from attempt.tables(path, batch_rows, limits)
        return
    if choices is not None:
        if fmt not in ("csv", "tsv"):
            raise TabularParseError(f"reading options apply to CSV and TSV files, not to {fmt}")
        schema, batches = attempt.readers[0](path, batch_rows, None, limits, choices)
    else:
        schema, batches = file_batches(path, fmt, batch_rows, limits=limits)
    yield FileTable(None, batches if isinstance(batches, TabularStream) else TabularStream(schema, batches))


# The FILE formats read as tables (the legacy .xls is refused, saying what to do), and those
# of them read from text: what a paste may be.
TABULAR = tuple(a.format for a in ORDER if a.door == FILE and a.readers and a.format != "xls")
TEXT_TABLES = tuple(f for f in TABULAR if f not in ("parquet", "xlsx"))
