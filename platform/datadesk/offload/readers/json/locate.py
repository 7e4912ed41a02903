"""Tabular JSON: where the rows are, without building Python objects for them.

`locate(text)` finds the rows of any common JSON shape: an array of objects or of arrays
(with or without a header row), `{columns, rows}` (columns as names or `{name, type}`), an
envelope `{data|rows|results|items|records|...: [...], <metadata>}` (one level deep too), a
dict of column lists, NDJSON. msgspec splits the rows into raw JSON slices (`JsonRows.rows`);
an array of objects is instead opened as pieces read by pyarrow (`pieces.open_records`: its
first piece is read now), so its rows are never split in Python at all.

The rows are then read by the JSON attempt's engines, in the order `readers/__init__.py`
gives (`ORDER`): pyarrow's JSON reader in pieces, pyarrow's CSV reader for flat arrays,
pyarrow's JSON reader on NDJSON chunks, and the exact reader (`exact`) for what they refuse.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
from dataclasses import dataclass, field
from typing import Any, Iterator

import msgspec

from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.json.pieces import Records, is_exact, open_records

CHUNK_ROWS = 131_072  # rows per chunk read at a time (one chunk in memory at a time)
ROW_KEYS = ("rows", "data", "results", "result", "items", "records", "values", "entries", "objects",
            "hits", "list", "content", "table", "rowset", "resultset", "output")
RAWS = msgspec.json.Decoder(list[msgspec.Raw])
OBJ = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()


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
    stream: Records | None = None  # an array of objects streamed by pyarrow in pieces (`pieces`)
    raw: Any = None  # the JSON text of the array of rows (for `pyarrow_csv_engine`)
    skipped: int = 0  # rows of `raw` left out (a header row)
    default_name: str = "column_"  # unnamed columns are <default_name>1, ...
    strict: bool = False  # rows of arrays must all have the same length (else padded)


def _head(raw: Any) -> bytes:
    return bytes(memoryview(raw)[:1]) if len(raw) else b""


def decode(data: Any, decoder: msgspec.json.Decoder = _ANY) -> Any:
    """`data` decoded (TabularParseError naming why when it is not JSON)."""
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
    else:  # bytes, an Arrow buffer or a memory-mapped file (an MCP answer spooled to disk): no copy
        body = text if isinstance(text, mmap.mmap) else memoryview(text)
        first = bytes(body[:256]).lstrip()[:1]
    if first in ("[", b"["):
        stream = open_records(body, is_exact)  # an array of objects, streamed by pyarrow
        if stream is not None:
            return JsonRows("records", [], "JSON array of objects", stream=stream, raw=body)
        found = _from_array(decode(body, RAWS), "JSON array", header_rows=header_rows)
        found.raw = body
        return found
    if first not in ("{", b"{"):
        raise TabularParseError("not JSON: the text does not start with '[' or '{'")
    try:
        obj = OBJ.decode(body)
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
    first = decode(items[0])
    if not first or not all(isinstance(v, str) and v.strip() for v in first) or len(set(first)) != len(first):
        return None
    sample = decode(b"[" + b",".join(bytes(r) for r in items[1:51]) + b"]") if len(items) > 1 else []
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
    cols = decode(raw_columns)
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
            inner = _from_object(decode(obj[nested[0]], OBJ), f"{nested[0]}.")
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
        given = decode(obj[type_key])
        if isinstance(given, list) and (names is None or len(given) == len(names)):
            types = given
            used.add(type_key)
    stream = open_records(obj[rows_key], is_exact)  # objects, streamed by pyarrow
    if stream is not None:
        if names is not None:
            used.discard(col_key)  # objects carry their own names; the list is kept as metadata
        found = JsonRows("records", [], "JSON envelope with an array of objects", types=types,
                         envelope=_envelope(obj, used), path=f"{prefix}{rows_key}", stream=stream,
                         raw=obj[rows_key])
        found.shape = f'{found.shape} under "{prefix}{rows_key}"'
        return found
    rows = decode(obj[rows_key], RAWS)
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
    with no_gc():
        cols = {k: decode(v) for k, v in obj.items()}
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
        out[k] = decode(raw) if len(raw) <= _SMALL else f"({len(raw):,} bytes of JSON, not kept)"
    return out


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic GC off for a block that builds millions of short-lived lists (it would rescan
    them again and again)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
