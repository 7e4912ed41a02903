"""JSON rows read by pyarrow's JSON reader: two engines of the JSON attempt (`readers/__init__.py`).

- `piece_batches`: an array of objects that `locate` opened in pieces (`pieces.Records`, two
  pieces parsed at a time); where that stream stopped early (a piece pyarrow could not read
  exactly), the rows from there on go back to the JSON readers (`rest.again`), as raw rows.
- `line_batches`: raw objects (msgspec's slices, re-joined as NDJSON) and NDJSON text, parsed
  by pyarrow's multithreaded reader chunk by chunk (memory holds one chunk). A chunk pyarrow
  cannot read exactly (a type change mid-chunk, integers past 2^53, `{}` values) is read by
  the exact reader (`rest.exact`); NDJSON it cannot read whole goes back as rows.

Strings pyarrow would type as timestamps (at second precision) are read as text and typed by
our casts (`typed_table_strings`: dates, zones, microseconds); the source's SQL types, when it
named them, are applied last (`sql_typed`).
"""

from __future__ import annotations

import io
from typing import Any, Iterator

import msgspec
import pyarrow as pa
import pyarrow.json as pajson

from datadesk.offload.readers.base import Rest
from datadesk.offload.readers.casts import sql_typed, typed_table_strings
from datadesk.offload.readers.json.locate import OBJ, RAWS, JsonRows, decode
from datadesk.offload.readers.json.pieces import is_exact

_BLOCK = 1 << 20
_ENC = msgspec.json.Encoder()


def piece_batches(found: JsonRows, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch] | None:
    """The batches of an array of objects opened in pieces, or None: not opened that way."""
    if found.stream is None:
        return None
    return _pieces(found, rest)


def _pieces(found: JsonRows, rest: Rest) -> Iterator[pa.RecordBatch]:
    """The batches pyarrow reads (`pieces.Records`); where it stopped early, the rest read again
    as rows (whose exact reader says where the text is not JSON, when that was the cause)."""
    stream = found.stream
    for batch in stream.batches():
        yield sql_typed([batch], found.types)[0] if found.types is not None else batch
    if not stream.broke:
        return
    rows = decode(found.raw, RAWS)  # raises TabularParseError naming the place when not JSON
    yield from rest.again(JsonRows("records", rows[stream.rows:], found.shape, types=found.types))


def line_batches(found: JsonRows, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch] | None:
    """NDJSON text, or raw objects chunk by chunk; None: neither (arrays, a dict of lists, no rows)."""
    if found.ndjson is not None:
        return _ndjson(found, batch_rows, rest)
    if found.kind == "records" and found.rows:
        return _records(found, batch_rows, rest)
    return None


def _records(found: JsonRows, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch]:
    forced: set[str] = set()  # which fields pyarrow would type as timestamps: learnt on a sample
    forced |= _arrow_json(_ENC.encode_lines(found.rows[:200]), set(), learn=True)
    for start in range(0, len(found.rows), batch_rows):
        chunk = found.rows[start:start + batch_rows]
        out = _records_chunk(chunk, forced)
        if out is None:  # not exact in pyarrow: this chunk by the exact reader
            yield from rest.exact(JsonRows("records", chunk, found.shape, types=found.types))
            continue
        yield from (sql_typed(out, found.types) if found.types is not None else out)


def _ndjson(found: JsonRows, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch]:
    """NDJSON text read whole by pyarrow; when it cannot be, its lines as rows, read again."""
    data = found.ndjson or b""
    cut = -1
    for _ in range(200):  # the first 200 lines teach which fields pyarrow would make timestamps
        cut = data.find(b"\n", cut + 1)
        if cut < 0:
            break
    forced = _arrow_json(data[:cut] if cut > 0 else data, set(), learn=True)
    table = _arrow_json(data, forced)
    if table is not None:
        first = data[:data.find(b"\n")] if b"\n" in data else data
        yield from _source_order(table, first.strip(), forced).to_batches(max_chunksize=batch_rows)
        return
    found.rows = [msgspec.Raw(line) for line in data.splitlines() if line.strip()]  # as rows, chunk by chunk
    found.ndjson = None
    yield from rest.again(found)


def _records_chunk(chunk: list[Any], forced: set[str]) -> list[pa.RecordBatch] | None:
    """One chunk of raw objects re-joined as NDJSON and read by pyarrow (None: not exactly)."""
    data = _ENC.encode_lines(chunk)
    table = _arrow_json(data, forced, multiline=data.count(b"\n") > len(chunk))
    if table is None:
        return None
    return _source_order(table, chunk[0], forced).to_batches()


def _source_order(table: pa.Table, first_row: Any, forced: set[str]) -> pa.Table:
    """pyarrow puts the fields of an explicit schema first: back to the source's order."""
    if not forced:
        return table
    first = list(decode(first_row, OBJ))
    order = [n for n in first if n in table.column_names]
    order += [n for n in table.column_names if n not in set(order)]
    return table.select(order) if order != table.column_names else table


def _arrow_json(data: bytes, forced: set[str], learn: bool = False, multiline: bool = False) -> Any:
    """pyarrow's reader on NDJSON bytes, timestamps kept as strings (we type them ourselves);
    None when it cannot give an exact result. `learn`: only the names pyarrow types as timestamps."""
    if learn:
        try:
            table = pajson.read_json(io.BytesIO(data), parse_options=pajson.ParseOptions(newlines_in_values=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return set()
        return {f.name for f in table.schema if pa.types.is_timestamp(f.type)}
    for _ in range(3):
        schema = pa.schema([(name, pa.string()) for name in sorted(forced)]) if forced else None
        opts = pajson.ParseOptions(explicit_schema=schema, newlines_in_values=multiline)  # pretty-printed rows
        try:
            reader = pajson.open_json(io.BytesIO(data), read_options=pajson.ReadOptions(block_size=_BLOCK),
                                      parse_options=opts)
            table = reader.read_all()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            try:
                table = pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(block_size=_BLOCK),
                                         parse_options=opts)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return None
        stamped = {f.name for f in table.schema if pa.types.is_timestamp(f.type)}
        if stamped - forced:
            forced |= stamped  # pyarrow typed them at second precision: read them as text instead
            continue
        if not is_exact(table):
            return None
        return typed_table_strings(table, forced)
    return None
