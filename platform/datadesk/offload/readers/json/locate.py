"""Tabular JSON at the speed of pyarrow: where the rows are, and their batches.

`locate(text)` finds the rows of any common JSON shape without building Python
objects for them: an array of objects or of arrays (with or without a header
row), `{columns, rows}` (columns as names or `{name, type}`), an envelope
`{data|rows|results|items|records|...: [...], <metadata>}` (one level deep too),
a dict of column lists, NDJSON. An array of objects (top level or in an envelope)
is read whole by pyarrow's multithreaded JSON reader with no Python object per row
(`shapes_fast`), flat arrays of values by its CSV reader (`shapes_fastrows`), each
only where that is exact. Otherwise msgspec splits the rows into raw JSON slices;
objects are re-joined as NDJSON and parsed by pyarrow's multithreaded JSON
reader, chunk by chunk (memory holds one chunk); arrays of values are decoded
by msgspec and turned into columns. Strings that are dates or timestamps are
typed by pyarrow casts (`shapes_types`). A chunk pyarrow cannot read exactly
(a type change mid-chunk, integers past 2^53, `{}` values) is read again by the
exact Python path (`columns.records_to_batch`), so no value is ever lost.
"""

from __future__ import annotations

import contextlib
import gc
import io
from dataclasses import dataclass, field
from typing import Any, Iterator

import msgspec
import pyarrow as pa
import pyarrow.json as pajson

from datadesk.offload.readers.columns import TabularParseError, records_to_batch, unique_names, _has_empty_struct, _nesting
from datadesk.offload.readers.json import pieces as shapes_fast
from datadesk.offload.readers.json import pyarrow_csv_engine as shapes_fastrows
from datadesk.offload.readers.casts import python_column, sql_cast, typed_table_strings

CHUNK_ROWS = 131_072  # rows per chunk handed to pyarrow (one chunk in memory at a time)
_BLOCK = 1 << 20
ROW_KEYS = ("rows", "data", "results", "result", "items", "records", "values", "entries", "objects",
            "hits", "list", "content", "table", "rowset", "resultset", "output")
_ENC = msgspec.json.Encoder()
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_OBJ = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()
_MAX_SAFE = 2 ** 53


@dataclass
class JsonRows:
    """Where the rows of a JSON document are, and everything beside them."""

    kind: str  # "records" | "arrays" | "columnar"
    rows: list[Any]  # raw rows (msgspec.Raw), or for "columnar" the decoded column lists
    shape: str  # what the model is told it was: "JSON array of objects", ...
    names: list[str] | None = None
    types: list[Any] | None = None  # SQL type names the source gave per column
    envelope: dict[str, Any] = field(default_factory=dict)  # the other keys, decoded (small ones)
    path: str = ""  # the key(s) holding the rows: "data", "result.items"
    ndjson: bytes | None = None  # NDJSON: the text itself, read by pyarrow as it is
    stream: shapes_fast.Records | None = None  # an array of objects streamed by pyarrow (`shapes_fast`)
    raw: Any = None  # the JSON text of the array of rows (for `shapes_fastrows`)
    skipped: int = 0  # rows of `raw` left out (a header row)


def _head(raw: Any) -> bytes:
    return bytes(memoryview(raw)[:1]) if len(raw) else b""


def _decode(data: Any, decoder: msgspec.json.Decoder = _ANY) -> Any:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise TabularParseError(f"invalid JSON: {exc}") from None


def locate(text: Any, header_rows: bool = True) -> JsonRows:
    """The rows of a tabular JSON document (TabularParseError naming why when there are none).

    `header_rows=False`: an array of arrays never has a header row (a Python repr)."""
    if isinstance(text, str):
        body: Any = text.lstrip()
        first = body[:1]
    else:  # bytes or an Arrow buffer: no copy
        body = memoryview(text)
        first = bytes(body[:256]).lstrip()[:1]
    if first in ("[", b"["):
        stream = shapes_fast.open_records(body, _exact)  # an array of objects, streamed by pyarrow
        if stream is not None:
            return JsonRows("records", [], "JSON array of objects", stream=stream, raw=body)
        found = _from_array(_decode(body, _RAWS), "JSON array", header_rows=header_rows)
        found.raw = body
        return found
    if first not in ("{", b"{"):
        raise TabularParseError("not JSON: the text does not start with '[' or '{'")
    try:
        obj = _OBJ.decode(body)
    except msgspec.DecodeError:
        return _ndjson(body)
    return _from_object(obj, "")


def _ndjson(body: str | bytes) -> JsonRows:
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    head = [ln for ln in data[:1 << 16].splitlines() if ln.strip()][:3]
    for i, line in enumerate(head):
        if line.lstrip()[:1] != b"{":
            raise TabularParseError(f"newline-delimited JSON: line {i + 1} is not an object")
    return JsonRows("records", [], "newline-delimited JSON (NDJSON)", ndjson=data)


def _from_array(items: list[Any], what: str, path: str = "", envelope: dict | None = None,
                names: list[str] | None = None, types: list[Any] | None = None,
                header_rows: bool = True) -> JsonRows:
    env = envelope or {}
    if not items:
        return JsonRows("records", [], f"{what} (empty)", names=names, types=types, envelope=env, path=path)
    head = _head(items[0])
    if head == b"{":
        return JsonRows("records", items, f"{what} of objects", names=names, types=types, envelope=env, path=path)
    if head == b"[":
        if names is not None:
            return JsonRows("arrays", items, f"{what} of arrays with a column list", names=names, types=types,
                            envelope=env, path=path)
        header = _header_row(items) if header_rows else None
        if header is not None:
            return JsonRows("arrays", items[1:], f"{what} of arrays with a header row", names=header,
                            envelope=env, path=path, skipped=1)
        return JsonRows("arrays", items, f"{what} of arrays (no header row)", envelope=env, path=path)
    kind = {b'"': "strings", b"n": "nulls", b"t": "booleans", b"f": "booleans"}.get(head, "numbers")
    raise TabularParseError(f"{what} holds {kind}, not objects or arrays: not tabular JSON")


def _header_row(items: list[Any]) -> list[str] | None:
    """The first row's values when it is a header: all distinct non-empty strings, above rows
    where some column is not text (or, when all is text, none of the names seen again in its
    column below)."""
    first = _decode(items[0])
    if not first or not all(isinstance(v, str) and v.strip() for v in first) or len(set(first)) != len(first):
        return None
    sample = _decode(b"[" + b",".join(bytes(r) for r in items[1:51]) + b"]") if len(items) > 1 else []
    if not sample:
        return first
    for i in range(len(first)):
        col = [r[i] for r in sample if isinstance(r, list) and i < len(r) and r[i] is not None]
        if col and not all(isinstance(v, str) for v in col):
            return first
    # all text: a header, as for CSV (and pandas, pyarrow), unless a name repeats in its column
    for i, name in enumerate(first):
        if any(isinstance(r, list) and i < len(r) and r[i] == name for r in sample):
            return None
    return first


def _column_names(raw_columns: Any) -> tuple[list[str], list[Any] | None]:
    cols = _decode(raw_columns)
    if not isinstance(cols, list) or not cols:
        raise TabularParseError('"columns" is not a non-empty list')
    names, types = [], []
    for c in cols:
        if isinstance(c, dict):
            names.append(c.get("name") or c.get("column_name") or c.get("field") or c.get("id"))
            types.append(c.get("type") or c.get("data_type") or c.get("dataType"))
        else:
            names.append(c)
            types.append(None)
    return names, (types if any(t is not None for t in types) else None)


def _from_object(obj: dict[str, Any], prefix: str) -> JsonRows:
    keys = list(obj)
    arrays = [k for k in keys if _head(obj[k]) == b"["]
    lowered = {k.lower(): k for k in keys}
    rows_key = next((lowered[k] for k in ROW_KEYS if k in lowered and lowered[k] in arrays), None)
    if rows_key is None and len(arrays) == 1 and arrays[0] not in ("columns", "columnTypes", "types"):
        rows_key = arrays[0]
    if rows_key is None:
        nested = [k for k in keys if k.lower() in ROW_KEYS and _head(obj[k]) == b"{"]
        if nested and not prefix:
            inner = _from_object(_decode(obj[nested[0]], _OBJ), f"{nested[0]}.")
            inner.envelope = {**_envelope(obj, {nested[0]}), **inner.envelope}
            return inner
        if len(arrays) >= 2 and len(arrays) == len(keys):
            return _columnar(obj, prefix)
        shown = ", ".join(keys[:10]) + (", ..." if len(keys) > 10 else "")
        raise TabularParseError(
            "JSON object is not tabular: expected an array of objects or arrays, {\"columns\", \"rows\"}, "
            f"an envelope with data/rows/results/items, or columns as lists; found keys: {shown or '(none)'}")
    names = types = None
    used = {rows_key}
    col_key = lowered.get("columns") or lowered.get("fields") or lowered.get("headers") or lowered.get("header")
    if col_key is not None and col_key != rows_key and _head(obj[col_key]) == b"[":
        names, types = _column_names(obj[col_key])
        used.add(col_key)
    type_key = lowered.get("columntypes") or lowered.get("types") or lowered.get("column_types")
    if type_key is not None and type_key not in used and _head(obj[type_key]) == b"[":
        given = _decode(obj[type_key])
        if isinstance(given, list) and (names is None or len(given) == len(names)):
            types = given
            used.add(type_key)
    stream = shapes_fast.open_records(obj[rows_key], _exact)  # objects, streamed by pyarrow
    if stream is not None:
        if names is not None:
            used.discard(col_key)  # objects carry their own names; the list is kept as metadata
        found = JsonRows("records", [], "JSON envelope with an array of objects", types=types,
                         envelope=_envelope(obj, used), path=f"{prefix}{rows_key}", stream=stream,
                         raw=obj[rows_key])
        found.shape = f'{found.shape} under "{prefix}{rows_key}"'
        return found
    rows = _decode(obj[rows_key], _RAWS)
    if names is not None and rows and _head(rows[0]) == b"{":
        names = None  # objects carry their own names; the list is kept as metadata
        used.discard(col_key)
    found = _from_array(rows, "JSON envelope with an array", f"{prefix}{rows_key}", _envelope(obj, used), names, types)
    found.raw = obj[rows_key]
    if names is not None and rows_key.lower() in ("rows", "data", "values"):
        found.shape = f"JSON object with {{columns, {rows_key}}}"
    else:
        found.shape = f'{found.shape} under "{prefix}{rows_key}"'
    return found


def _columnar(obj: dict[str, Any], prefix: str) -> JsonRows:
    with _no_gc():
        cols = {k: _decode(v) for k, v in obj.items()}
    lengths = {len(v) for v in cols.values()}
    if len(lengths) != 1:
        raise TabularParseError("JSON object of lists: the lists differ in length "
                                f"({', '.join(f'{k}: {len(v)}' for k, v in list(cols.items())[:6])})")
    return JsonRows("columnar", list(cols.values()), "JSON object of column lists", names=list(cols))


_SMALL = 4096


def _envelope(obj: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """The other keys of the object, decoded when small (a big value is summarised)."""
    out: dict[str, Any] = {}
    for k, raw in obj.items():
        if k in used:
            continue
        out[k] = _decode(raw) if len(raw) <= _SMALL else f"({len(raw):,} bytes of JSON, not kept)"
    return out


# ---------------------------------------------------------------------- batches

def batches(found: JsonRows, batch_rows: int = CHUNK_ROWS, default_name: str = "column_",
            strict: bool = False) -> Iterator[pa.RecordBatch]:
    """Record batches of the located rows, typed (see the module docstring).

    Unnamed columns are `<default_name>1`, ...; `strict`: rows of arrays must all have the
    same length (else short rows are padded with nulls)."""
    if found.kind == "columnar":
        names = unique_names(found.names or [])
        with _no_gc():
            arrays = [python_column(c) for c in found.rows]
        yield pa.RecordBatch.from_arrays(arrays, names=names)
        return
    if found.ndjson is not None:
        yield from _ndjson_batches(found, batch_rows)
        return
    if found.stream is not None:
        yield from _streamed(found, batch_rows)
        return
    if not found.rows:
        if found.names:
            yield pa.RecordBatch.from_arrays([pa.nulls(0) for _ in found.names], names=unique_names(found.names))
        return
    fast = _fast_arrays(found, default_name) if found.kind == "arrays" else None
    if fast is not None:
        out = fast.to_batches(max_chunksize=batch_rows)
        yield from (_apply_types(out, found.types) if found.types is not None else out)
        return
    forced: set[str] = set()
    if found.kind == "records":  # which fields pyarrow would type as timestamps: learn it on a sample
        sample = _arrow_json(_ENC.encode_lines(found.rows[:200]), set(), learn=True)
        forced |= sample
    for start in range(0, len(found.rows), batch_rows):
        chunk = found.rows[start:start + batch_rows]
        if found.kind == "records":
            out = _records_chunk(chunk, forced)
        else:
            out = _arrays_chunk(chunk, found.names, start, default_name, strict)
        if found.types is not None:
            out = _apply_types(out, found.types)
        yield from out


def _streamed(found: JsonRows, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The batches pyarrow reads (`shapes_fast.Records`); where it stopped early, the rest
    from the exact path (which says where the text is not JSON, when that was the cause)."""
    stream = found.stream
    for batch in stream.batches():
        yield _apply_types([batch], found.types)[0] if found.types is not None else batch
    if not stream.broke:
        return
    rows = _decode(found.raw, _RAWS)  # raises TabularParseError naming the place when not JSON
    rest = JsonRows("records", rows[stream.rows:], found.shape, types=found.types)
    yield from batches(rest, batch_rows)


def _fast_arrays(found: JsonRows, default_name: str) -> pa.Table | None:
    """Rows of flat arrays read by pyarrow's CSV reader (`shapes_fastrows`), or None."""
    if found.raw is None or not found.rows:
        return None
    with _no_gc():
        sample = _decode(b"[" + b",".join(bytes(r) for r in found.rows[:200]) + b"]")
    if not all(isinstance(r, list) for r in sample):
        return None
    width = len(found.names) if found.names is not None else len(sample[0])
    if width == 0 or any(len(r) != width for r in sample):
        return None  # ragged rows: the exact path pads them (or refuses them when strict)
    kinds = shapes_fastrows.column_kinds(sample, width)
    if kinds is None:
        return None
    names = unique_names(found.names if found.names is not None else [f"{default_name}{i + 1}" for i in range(width)])
    return shapes_fastrows.read_rows(found.raw, len(found.rows) + found.skipped, bool(found.skipped), kinds, names)


def _ndjson_batches(found: JsonRows, batch_rows: int) -> Iterator[pa.RecordBatch]:
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
    found.rows = [msgspec.Raw(line) for line in data.splitlines() if line.strip()]  # the exact path
    found.ndjson = None
    yield from batches(found, batch_rows)


def _apply_types(out: list[pa.RecordBatch], types: list[Any]) -> list[pa.RecordBatch]:
    fixed = []
    for b in out:
        arrays = [sql_cast(col, t) if i < len(types) else col for i, (col, t) in
                  enumerate(zip(b.columns, list(types) + [None] * (b.num_columns - len(types))))]
        fixed.append(pa.RecordBatch.from_arrays(arrays, names=b.schema.names))
    return fixed


def _records_chunk(chunk: list[Any], forced: set[str]) -> list[pa.RecordBatch]:
    data = _ENC.encode_lines(chunk)
    table = _arrow_json(data, forced, multiline=data.count(b"\n") > len(chunk))
    if table is None:
        with _no_gc():
            return [records_to_batch(_decode(b"[" + b",".join(bytes(r) for r in chunk) + b"]"))]
    return _source_order(table, chunk[0], forced).to_batches()


def _source_order(table: pa.Table, first_row: Any, forced: set[str]) -> pa.Table:
    """pyarrow puts the fields of an explicit schema first: back to the source's order."""
    if not forced:
        return table
    first = list(_decode(first_row, _OBJ))
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
        if not _exact(table):
            return None
        return typed_table_strings(table, forced)
    return None


def _exact(table: pa.Table) -> bool:
    """False when pyarrow's result could differ from the JSON (big integers read as doubles,
    `{}` values, nesting Parquet cannot hold, duplicate names)."""
    import pyarrow.compute as pc

    if len(set(table.column_names)) != table.num_columns:
        return False
    for col in table.columns:
        t = col.type
        if _has_empty_struct(t) or _nesting(t) > 32:
            return False
        if pa.types.is_floating(t) and col.length() - col.null_count:
            top = pc.max(pc.abs(col)).as_py()
            if top is not None and top >= _MAX_SAFE:
                return False
    return True


def _arrays_chunk(chunk: list[Any], names: list[str] | None, start: int, default_name: str,
                  strict: bool) -> list[pa.RecordBatch]:
    with _no_gc():  # millions of short-lived lists: the cyclic GC would rescan them again and again
        rows = _decode(b"[" + b",".join(bytes(r) for r in chunk) + b"]")
        return [rows_batch(rows, names, start, default_name, strict)]


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def rows_batch(rows: list[Any], names: list[str] | None, start: int = 0, default_name: str = "column_",
               strict: bool = False) -> pa.RecordBatch:
    """Positional rows (lists or tuples) -> a typed batch; short rows are padded with nulls."""
    lengths = set(map(len, rows)) if set(map(type, rows)) <= {list, tuple} else None
    if lengths is None:
        bad = next(i for i, r in enumerate(rows) if not isinstance(r, (list, tuple)))
        raise TabularParseError(f"row {start + bad + 1} is not an array of values like the rows before it")
    width = len(names) if names is not None else max(lengths, default=0)
    if max(lengths, default=0) > width:
        bad = next(i for i, r in enumerate(rows) if len(r) > width)
        raise TabularParseError(f"row {start + bad + 1} has {len(rows[bad])} values but there are {width} columns")
    if lengths != {width} and strict:
        bad = next(i for i, r in enumerate(rows) if len(r) != width)
        raise TabularParseError(f"ragged rows: row {start + bad + 1} has {len(rows[bad])} values, not {width}")
    if lengths != {width}:
        rows = [list(r) + [None] * (width - len(r)) for r in rows]
    cols = list(zip(*rows)) if rows else [() for _ in range(width)]
    names = unique_names(names if names is not None else [f"{default_name}{i + 1}" for i in range(width)])
    if not names:
        raise TabularParseError("no columns")
    return pa.RecordBatch.from_arrays([python_column(list(c)) for c in cols], names=names)
