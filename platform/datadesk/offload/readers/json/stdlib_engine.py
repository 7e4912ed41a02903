"""Tabular JSON files (uploads) -> Arrow record batches, streaming one element at a time with the
standard library's decoder: an error names its line and column.

Big arrays are walked with `JSONDecoder.raw_decode(text, pos)` element by
element (runs of objects decoded by msgspec about 1 MB at a time), so memory
holds one batch of rows, never the whole decoded list.
"""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path
from typing import Any, Iterator

import msgspec
import pyarrow as pa

from datadesk.offload.readers.columns import records_to_batch, rows_to_batch
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.limits import UploadLimits
from datadesk.offload.readers.text.file import decode_file

_WS = re.compile(r"[ \t\n\r]*")
# Module-level so tests can count decoding steps (streaming check).
_DECODER = json.JSONDecoder()
_MISSING = object()


def read_file(path: Path, batch_rows: int, sheet: str | None,
              limits: UploadLimits) -> tuple[None, Iterator[pa.RecordBatch]]:
    """The reader of a JSON file: UTF-8 (a BOM allowed), else the byte and line that is not."""
    data = path.read_bytes()
    text = decode_file(data, 3 if data.startswith(codecs.BOM_UTF8) else 0)
    return None, json_batches(text, batch_rows)


def read_streaming_file(path: Path, batch_rows: int, sheet: str | None,
                        limits: UploadLimits) -> tuple[None, Iterator[pa.RecordBatch]] | None:
    """The first reader of a JSON file: an array of objects or NDJSON, the shapes that stream
    element by element here (`read_file`); None for any other JSON (an envelope, a dict of
    column lists, arrays of arrays ...), read whole by the readers of a tool's text instead."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    text = head.decode("utf-8", "ignore").lstrip("\ufeff")
    pos = _WS.match(text).end()
    ch = text[pos:pos + 1]
    if ch == "[":
        nxt = _WS.match(text, pos + 1).end()
        if text[nxt:nxt + 1] not in ("{", "]", ""):
            return None
    elif ch == "{":
        line_end = text.find("\n", pos)
        if line_end < 0:
            return None
        try:
            first = msgspec.json.decode(text[pos:line_end])
        except msgspec.DecodeError:
            return None  # an object over several lines: not NDJSON
        nxt = _WS.match(text, line_end).end()
        if not isinstance(first, dict) or text[nxt:nxt + 1] != "{":
            return None
    else:
        return None
    return read_file(path, batch_rows, sheet, limits)


def json_batches(text: str, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Yield record batches of tabular JSON, streaming element by element.

    Accepted shapes: an array of objects; `{"columns": [...], "rows"|"data":
    [[...], ...]}`; an object whose single key holds an array of objects;
    newline-delimited objects. Anything else (a scalar, an array of scalars,
    an arbitrary object) raises TabularParseError saying why. Element
    errors found mid-stream are raised when reached.
    """
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    start = 1 if text.startswith("\ufeff") else 0
    pos = _WS.match(text, start).end()
    if pos >= len(text):
        raise TabularParseError("no JSON: the text is empty")
    ch = text[pos]
    if ch == "[":
        yield from _record_batches(_array_records(text, pos, "the top-level array"), batch_rows)
    elif ch == "{":
        yield from _object_batches(text, pos, batch_rows)
    else:
        value, _ = _decode(text, pos)
        raise TabularParseError(f"JSON is a single {_kind(value)}, not a table")


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line} column {pos - text.rfind(chr(10), 0, pos)} (char {pos})"


def _decode(text: str, pos: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as err:
        raise TabularParseError(f"invalid JSON at {_where(text, err.pos)}: {err.msg}") from None
    except RecursionError:
        raise TabularParseError(f"JSON nested too deeply at {_where(text, pos)}") from None


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "boolean" if isinstance(value, bool) else "number"


FAST_CHUNK_CHARS = 1 << 20


def _fast_run(text: str, pos: int) -> tuple[list[dict], int] | None:
    """Decode a run of whole object elements starting at `pos` with msgspec (about 1 MB at a
    time): (objects, position of the ',' after the last one), or None to take the slow path.

    The run ends at a '},' boundary. A boundary that falls inside a string leaves both halves
    with an unterminated string, so such a cut never decodes: a successful decode means the
    cut was real. Anything unusual (non-objects, NaN, huge ints) falls back to the exact,
    one-element-at-a-time path with its precise error messages.
    """
    if text[pos:pos + 1] != "{":
        return None
    limit = pos + FAST_CHUNK_CHARS
    for _ in range(3):  # a '},' inside a string is no boundary: try an earlier one
        cut = text.rfind("},", pos, limit)
        if cut < 0:
            return None
        try:
            values = msgspec.json.decode("[" + text[pos:cut + 1] + "]")
        except (msgspec.DecodeError, RecursionError):
            limit = cut
            continue
        if not all(type(v) is dict for v in values):
            return None
        return values, cut + 1
    return None


def _array_items(text: str, pos: int) -> Iterator[tuple[int, Any, int]]:
    """Yield (index, value, start) of the array at text[pos] == "["; return its end.

    Decodes a bounded run of elements at a time (about 1 MB), so memory holds a run, not
    the array.
    """
    pos = _WS.match(text, pos + 1).end()
    if text.startswith("]", pos):
        return pos + 1
    index = 0
    slow_until = 0  # after a failed fast run, go element by element past that region
    while True:
        run = _fast_run(text, pos) if pos >= slow_until else None
        if run is None and pos >= slow_until:
            slow_until = pos + FAST_CHUNK_CHARS  # keeps failed attempts linear overall
        if run is not None:
            values, comma = run
            for value in values:
                yield index, value, pos
                index += 1
            pos = _WS.match(text, comma + 1).end()
            continue
        value, end = _decode(text, pos)
        yield index, value, pos
        pos = _WS.match(text, end).end()
        ch = text[pos:pos + 1]
        if ch == ",":
            pos = _WS.match(text, pos + 1).end()
            index += 1
        elif ch == "]":
            return pos + 1
        else:
            raise TabularParseError(f"invalid JSON at {_where(text, pos)}: expected ',' or ']' after element {index}")


def _expect_end(text: str, pos: int) -> None:
    pos = _WS.match(text, pos).end()
    if pos < len(text):
        raise TabularParseError(f"invalid JSON at {_where(text, pos)}: extra data after the JSON value")


def _array_records(text: str, pos: int, what: str, check_end: bool = True) -> Iterator[dict]:
    items = _array_items(text, pos)
    while True:
        try:
            index, value, start = next(items)
        except StopIteration as stop:
            end = stop.value
            break
        if not isinstance(value, dict):
            if index == 0:
                raise TabularParseError(
                    f"{what} holds {_kind(value)}s, not objects: not tabular JSON")
            raise TabularParseError(
                f"element {index} of {what} (at {_where(text, start)}) is a {_kind(value)}, "
                "not an object like the elements before it")
        yield value
    if check_end:
        _expect_end(text, end)


def _record_batches(records: Iterator[dict], batch_rows: int) -> Iterator[pa.RecordBatch]:
    buf: list[dict] = []
    total = 0
    for record in records:
        buf.append(record)
        if len(buf) >= batch_rows:
            total += len(buf)
            yield records_to_batch(buf)
            buf = []
    if buf:
        total += len(buf)
        yield records_to_batch(buf)
    # an empty array is an empty result (0 rows), not an error: the caller says so


class _Entry:
    """One top-level key of an object: where its value starts and what it is."""

    __slots__ = ("key", "start", "value", "count", "first")

    def __init__(self, key: str, start: int, value: Any = _MISSING, count: int = 0, first: str = "") -> None:
        self.key, self.start, self.value, self.count, self.first = key, start, value, count, first


def _scan_object(text: str, pos: int) -> tuple[dict[str, _Entry], int]:
    """Walk the object at text[pos] without keeping its big arrays.

    Arrays are only counted (their elements are decoded one at a time and
    dropped); the row array is decoded again when streamed. Twice the
    parsing, but memory stays at one element.
    """
    entries: dict[str, _Entry] = {}
    pos = _WS.match(text, pos + 1).end()
    if text.startswith("}", pos):
        return entries, pos + 1
    while True:
        if not text.startswith('"', pos):
            raise TabularParseError(f"invalid JSON at {_where(text, pos)}: expected a key")
        key, pos = _decode(text, pos)
        pos = _WS.match(text, pos).end()
        if not text.startswith(":", pos):
            raise TabularParseError(f"invalid JSON at {_where(text, pos)}: expected ':'")
        pos = _WS.match(text, pos + 1).end()
        if text.startswith("[", pos) and key not in ("columns", "types"):
            entry = _Entry(key, pos)
            items = _array_items(text, pos)
            while True:
                try:
                    index, value, _ = next(items)
                except StopIteration as stop:
                    pos = stop.value
                    break
                if index == 0:
                    entry.first = _kind(value)
                entry.count += 1
        else:
            value, end = _decode(text, pos)
            entry = _Entry(key, pos, value)
            pos = end
        entries[key] = entry
        pos = _WS.match(text, pos).end()
        ch = text[pos:pos + 1]
        if ch == ",":
            pos = _WS.match(text, pos + 1).end()
        elif ch == "}":
            return entries, pos + 1
        else:
            raise TabularParseError(f"invalid JSON at {_where(text, pos)}: expected ',' or '}}'")


def _object_batches(text: str, pos: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
    entries, end = _scan_object(text, pos)
    after = _WS.match(text, end).end()
    if after < len(text):  # more after the first object: newline-delimited JSON
        yield from _record_batches(_ndjson_records(text, pos), batch_rows)
        return
    columns = entries.get("columns")
    rows = entries.get("rows") or entries.get("data")
    if columns is not None and rows is not None and isinstance(columns.value, list) and rows.value is _MISSING:
        yield from _columns_rows_batches(text, columns.value, rows, batch_rows)
        return
    if len(entries) == 1:
        (entry,) = entries.values()
        if entry.value is _MISSING:  # an array
            if entry.count == 0:
                return  # an empty result: 0 rows
            if entry.first != "object":
                raise TabularParseError(f"{entry.key!r} holds an array of {entry.first}s, not objects: not tabular JSON")
            records = _array_records(text, entry.start, f"the array under {entry.key!r}", check_end=False)
            yield from _record_batches(records, batch_rows)
            return
    keys = ", ".join(list(entries)[:10]) + (", ..." if len(entries) > 10 else "")
    raise TabularParseError(
        "JSON object is not tabular: expected an array of objects, {\"columns\", \"rows\"}, "
        f"or one key holding an array of objects; found keys: {keys or '(none)'}")


def _columns_rows_batches(text: str, columns: list, rows: _Entry, batch_rows: int) -> Iterator[pa.RecordBatch]:
    names = [c.get("name") if isinstance(c, dict) else c for c in columns]
    if not names:
        raise TabularParseError("\"columns\" is empty")
    buf: list[list[Any]] = []
    emitted = False
    for index, row, start in _array_items(text, rows.start):
        if isinstance(row, dict):  # rows given as objects: place by column name
            row = [row.get(name) for name in names]
        elif not isinstance(row, list):
            raise TabularParseError(
                f"row {index} (at {_where(text, start)}) is a {_kind(row)}, not an array of values")
        if len(row) > len(names):
            raise TabularParseError(
                f"row {index} (at {_where(text, start)}) has {len(row)} values but there are {len(names)} columns")
        buf.append(row)
        if len(buf) >= batch_rows:
            yield rows_to_batch(names, buf)
            emitted = True
            buf = []
    if buf or not emitted:
        yield rows_to_batch(names, buf)  # zero rows still carry the columns


def _ndjson_records(text: str, pos: int) -> Iterator[dict]:
    while pos < len(text):
        if text[pos] != "{":
            value, _ = _decode(text, pos)
            raise TabularParseError(
                f"newline-delimited JSON: {_where(text, pos)} holds a {_kind(value)}, not an object")
        value, end = _decode(text, pos)
        yield value
        pos = _WS.match(text, end).end()
