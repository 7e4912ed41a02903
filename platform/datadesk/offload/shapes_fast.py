"""A JSON array of objects read by pyarrow's multithreaded JSON reader in one pass.

The array's separators between objects (`},\\n`, `},{`, `}, {`) are rewritten in
place of the same length (`} \\n`, `}\\n{`, `}\\n {`) in the one copy `bytes.replace`
makes, so every object is one line of NDJSON between the outer brackets, which
are left out by a zero-copy slice. No Python object per row is built.

Why this never changes a value: a JSON string cannot hold a raw newline, so a
separator pattern found inside a string (or inside a nested array of objects)
becomes a line that is not a whole JSON object, and pyarrow refuses it: the
caller then takes the exact row-by-row path. The column types are learnt once
from a sample (the first MB) and enforced on the whole text (`explicit_schema`),
so every block gets the same types; fields the sample did not have are inferred.
Strings pyarrow would read as timestamps are read as text and typed by our own
casts (`typed_table_strings`: dates, zones, microseconds).
"""

from __future__ import annotations

from typing import Any, Callable

import io

import pyarrow as pa
import pyarrow.json as pajson

from datadesk.offload.shapes_types import typed_table_strings

_SAMPLE = 1 << 20
_HEAD = 1 << 16
_BLOCK = 1 << 20
# separator between two objects -> the same length with a newline in it (checked in this order)
_SEPS = ((b"},\n", b"} \n"), (b"},\r\n", b"} \r\n"), (b"},{", b"}\n{"), (b"}, {", b"}\n {"))
_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


def read_records(body: Any, exact: Callable[[pa.Table], bool]) -> pa.Table | None:
    """The array of objects `body` (str, bytes or a buffer) as one typed table, or None when it
    cannot be read exactly this way (the caller then reads it row by row)."""
    if isinstance(body, str) and not body.isascii():
        body = body.encode("utf-8")  # slices by byte offset below; an ASCII str is sliced as it is
    elif not isinstance(body, (str, bytes)):
        body = bytes(body)  # an Arrow buffer or a memoryview
    text = isinstance(body, str)
    start, end = body.find("[" if text else b"[") + 1, body.rfind("]" if text else b"]")
    if start <= 0 or end < start or _piece(body[start:start + 256]).lstrip()[:1] != b"{" \
            or _piece(body[end + 1:]).strip():
        return None
    head = _piece(body[start:start + _HEAD])
    rule = next((r for r in _SEPS if r[0] in head), None)
    if rule is None and end - start > _HEAD:
        return None  # one huge object, or pretty-printed: the exact path
    sep, new = rule if rule is not None else (b"\0", b"\0")
    if text:
        sep, new = sep.decode(), new.decode()  # type: ignore[assignment]
    cut = body.rfind(sep, start, min(end, start + _SAMPLE)) if end - start > _SAMPLE else -1
    sample = _read(TextBlocks(body, start, cut + 1 if cut > 0 else end, sep, new), None)
    if sample is None or sample.num_rows == 0:
        return None
    forced = {f.name for f in sample.schema if pa.types.is_timestamp(f.type)}
    kept = [f for f in sample.schema if _enforced(f.type)]
    for schema in (kept, [f for f in kept if f.name in forced]):  # the second: pyarrow infers the rest
        for _ in range(2):
            fields = [pa.field(f.name, pa.string()) if f.name in forced else f for f in schema]
            fields += [pa.field(n, pa.string()) for n in sorted(forced - {f.name for f in schema})]
            table = _read(TextBlocks(body, start, end, sep, new), pa.schema(fields))
            if table is None:
                break
            stamped = {f.name for f in table.schema if pa.types.is_timestamp(f.type)}
            if stamped - forced:  # a field the sample lacked: pyarrow typed it at second precision
                forced |= stamped
                continue
            if not exact(table):
                return None
            order = [n for n in sample.column_names if n in table.column_names]
            order += [n for n in table.column_names if n not in set(order)]
            if order != table.column_names:
                table = table.select(order)
            return typed_table_strings(table, forced)
    return None


def _piece(part: Any) -> bytes:
    return part.encode("utf-8") if isinstance(part, str) else bytes(part)


class TextBlocks(io.RawIOBase):
    """`body[start:end]` as a readable stream of UTF-8 bytes, each separator rewritten as it is
    read: pyarrow parses one block while the next is prepared (no copy of the whole text)."""

    def __init__(self, body: Any, start: int, end: int, sep: Any, new: Any) -> None:
        super().__init__()
        self.body, self.pos, self.end, self.sep, self.new = body, start, end, sep, new
        self.carry = body[:0]
        self.keep = len(sep) - 1

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        if self.pos >= self.end and not self.carry:
            return b""
        stop = self.end if n is None or n < 0 else min(self.end, self.pos + max(n - len(self.carry), self.keep + 1))
        part = (self.carry + self.body[self.pos:stop]).replace(self.sep, self.new)
        self.pos = stop
        if stop < self.end and self.keep:  # a separator may straddle the cut: its start waits
            part, self.carry = part[:-self.keep], part[-self.keep:]
        else:
            self.carry = self.body[:0]
        return part.encode("utf-8") if isinstance(part, str) else part


def _enforced(t: pa.DataType) -> bool:
    """Types worth enforcing on the whole text (nested and all-null fields are left to inference)."""
    return not (pa.types.is_null(t) or pa.types.is_nested(t))


def _read(blocks: TextBlocks, schema: pa.Schema | None, block: int = _BLOCK) -> pa.Table | None:
    opts = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer",
                               newlines_in_values=False)
    try:
        return pajson.read_json(pa.PythonFile(blocks, mode="r"), read_options=pajson.ReadOptions(block_size=block,
                                use_threads=True), parse_options=opts)
    except _ERRORS:
        return None
