"""Python reprs of tables -> JSON text, at C speed, never `eval`.

`str(cursor.fetchall())`, `str([dict(r) for r in rows])`, `str(df.to_dict("list"))`:
lists or tuples of tuples / lists / dicts, and dicts of lists, with `Decimal`,
`datetime.date`, `datetime.datetime` (naive or UTC), `datetime.time`, `UUID`
calls, `None` / `True` / `False`.

How: one `re.split` separates the string literals from the rest; the rest is
rewritten with plain `str.replace` (brackets, keywords) and the calls become
tagged JSON arrays (`datetime.date(2024, 1, 2)` -> `[-987654321001, 2024, 1, 2]`,
`Decimal('1.50')` -> `["\\u0001D", "1.50"]`); the strings are requoted in bulk.
What is left must be JSON punctuation, numbers and null/true/false: anything else
(a name, a call we do not know, a keyword argument) raises `ReprUnsupported` and
the next reader takes it (in the end the exact, `ast`-based one, `exact`, which names
the value). The JSON is read by the JSON attempt's readers (`rest.json`); the tags are
turned into typed Arrow columns by `resolve_tags`, vectorised.

Two readers of the repr attempt (`readers/__init__.py`): `piece_batches` converts and reads
the text `CHUNK_CHARS` at a time; `whole_batches` all at once (`dict_json` for dicts, with
pyarrow's string kernels), for what the pieces cannot cut.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
import uuid
from decimal import Decimal, InvalidOperation
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datadesk.offload.readers.base import Rest
from datadesk.offload.readers.casts import python_column, stream_typed
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.json.locate import JsonRows, locate
from datadesk.offload.readers.pyrepr.columns import decimal_column

DATE, DATETIME, TIME, UTC = -987654321001, -987654321002, -987654321003, -987654321010
_TAG_INTS = (DATE, DATETIME, TIME)
_SEP = "\x00"
_STRING = re.compile(r"""('[^'\\\n]*(?:\\.[^'\\\n]*)*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*")""")
_REWRITES = (
    ("datetime.datetime(", f"[{DATETIME},"), ("datetime.date(", f"[{DATE},"), ("datetime.time(", f"[{TIME},"),
    ("Decimal(", '["\\u0001D",'), ("UUID(", '["\\u0001u",'),
    (", tzinfo=datetime.timezone.utc)", f", {UTC})"), ("tzinfo=datetime.timezone.utc", str(UTC)),
    ("(", "["), (")", "]"), ("None", "null"), ("True", "true"), ("False", "false"),
)


class ReprUnsupported(ValueError):
    """The fast conversion cannot be exact for this text: use the ast-based path."""


def to_json(text: str) -> tuple[str, bool]:
    """The JSON text for a Python repr table, and whether it holds tags to resolve.

    msgspec's strict JSON decoder is the final check: a name, a call we do not rewrite,
    a set, a non-string key, `nan` ... all leave invalid JSON, and the caller then takes
    the exact path (which names the value it refuses)."""
    if _SEP in text:
        raise ReprUnsupported("NUL character")
    if '"' not in text and "\\" not in text:
        # the common case: every string is 'plain', so the odd pieces of a split on the
        # quote are exactly the strings' contents (valid JSON string contents as they are)
        parts = text.split("'")
        if len(parts) % 2 == 0:
            raise ReprUnsupported("unbalanced quotes")
        quote = '"'
        strings = None
    else:
        parts = _STRING.split(text)
        quote = ""
        strings = [_json_string(x) for x in parts[1::2]]
    others = _SEP.join(parts[0::2])
    tagged = any(call in others for call in ("datetime.", "Decimal(", "UUID("))
    for old, new in _REWRITES:
        if old in others:
            others = others.replace(old, new)
    if ",]" in others:
        others = others.replace(",]", "]")  # a one-element tuple: (1,)
    parts[0::2] = others.split(_SEP)
    if strings is not None:
        parts[1::2] = strings
    return quote.join(parts), tagged


CHUNK_CHARS = 4 << 20  # text converted at a time by `json_chunks`
_ROW_BREAKS = {"(": "), (", "[": "], [", "{": "}, {"}


def locate_rewritten(json_text: Any) -> JsonRows:
    """The rows of JSON rewritten from a Python repr: never a header row (a repr has none),
    unnamed columns col_1, col_2 ..., and rows of one length (a ragged repr is refused)."""
    found = locate(json_text, header_rows=False)
    found.default_name, found.strict = "col_", True
    return found


def piece_batches(text: str, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch] | None:
    """A list or tuple of rows (tuples, lists or dicts) converted by `to_json` and read by the
    JSON readers `CHUNK_CHARS` of text at a time (memory holds one piece, not the result); None
    when the text is not such a list or its first piece cannot be converted. A later piece
    that cannot be, and everything after it, goes to the exact reader (`rest.exact`)."""
    lo, hi = 0, len(text)
    while lo < hi and text[lo].isspace():
        lo += 1
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    if hi - lo < 4 or text[lo] + text[hi - 1] not in ("[]", "()") or text[lo + 1] not in _ROW_BREAKS:
        return None
    row_break = _ROW_BREAKS[text[lo + 1]]

    def read(a: int, end: int) -> list[pa.RecordBatch]:
        return [resolve_tags(b) for b in rest.json(locate_rewritten(to_json("[" + text[a:end] + "]")[0]))]

    a, end = lo + 1, _piece_end(text, lo + 1, hi - 1, row_break)
    try:
        first = read(a, end)
    except (ReprUnsupported, TabularParseError):
        return None

    def chunks(batches: list[pa.RecordBatch], a: int, end: int) -> Iterator[pa.RecordBatch]:
        types: dict[str, pa.DataType] = {}
        while True:
            yield from (stream_typed(b, types) for b in batches)
            if end >= hi - 1:
                return
            a = end + 2
            end = _piece_end(text, a, hi - 1, row_break)
            try:
                batches = read(a, end)
            except (ReprUnsupported, TabularParseError):
                yield from (stream_typed(b, types) for b in rest.exact("[" + text[a:hi - 1] + "]"))
                return
    return chunks(first, a, end)


def whole_batches(text: str, batch_rows: int, rest: Rest) -> Iterator[pa.RecordBatch] | None:
    """The whole text converted to JSON at once (`dict_json` for dicts, else `to_json`) and read
    by the JSON readers; None when it cannot be (the exact reader takes it)."""
    try:
        data = dict_json(text) if text.lstrip()[:2] in ("[{", "{'") else None
        found = locate_rewritten(data if data is not None else to_json(text)[0])
        if found.ndjson is not None:  # not one JSON value (a `nan`, a name ...): never NDJSON
            raise ReprUnsupported("the converted text is not one JSON value")
    except (ReprUnsupported, TabularParseError):
        return None
    return (resolve_tags(batch) for batch in rest.json(found))


def dict_json(text: str) -> pa.Buffer | None:
    """JSON bytes for `[{'k': v, ...}, ...]` / `{'k': [...]}` with `to_json`'s tags, or None.

    The rewrites run over every piece at once; the strings' pieces are then taken back as
    they were (a parity mask), so no string is ever changed."""
    if '"' in text or "\\" in text or "\x01" in text:
        return None
    lists = pc.split_pattern(pa.array([text], pa.large_string()), "'")
    pieces = lists.values
    if len(pieces) % 2 == 0:
        return None
    rewritten = pieces
    for old, new in _REWRITES:
        if old in text:
            rewritten = pc.replace_substring(rewritten, old, new)
    if ",)" in text:
        rewritten = pc.replace_substring(rewritten, ",]", "]")
    parity = pa.array(np.arange(len(pieces)) % 2 == 0)
    return _join_pieces(pc.if_else(parity, rewritten, pieces), '"')


def _buffer(one: pa.Array) -> pa.Buffer:
    _, offsets, data = one.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[one.offset:one.offset + 2]
    return data.slice(int(bounds[0]), int(bounds[1] - bounds[0])) if data is not None else pa.py_buffer(b"")


def _join_pieces(pieces: pa.Array, quote: str = "'") -> pa.Buffer:
    lists = pa.LargeListArray.from_arrays(pa.array([0, len(pieces)], pa.int64()), pieces)
    return _buffer(pc.binary_join(lists, pa.scalar(quote, pa.large_string())))


def _piece_end(text: str, a: int, hi: int, row_break: str) -> int:
    """Just after a row's closing bracket, after `CHUNK_CHARS`: a cut where every quote outside
    the strings is paired and every bracket closed (so between two top-level rows)."""
    j = a + CHUNK_CHARS
    while j < hi:
        j = text.find(row_break, j, hi)
        if j < 0:
            break
        others = "".join(_STRING.split(text[a:j + 1])[0::2])
        if "'" not in others and '"' not in others and all(
                others.count(o) == others.count(c) for o, c in ("()", "[]", "{}")):
            return j + 1
        j += 1
    return hi


def _json_string(literal: str) -> str:
    if "\\" not in literal:
        if literal[0] == '"':
            return literal
        return '"' + literal[1:-1].replace('"', '\\"') + '"'
    try:
        value = ast.literal_eval(literal)  # a single string literal: never code
    except (ValueError, SyntaxError):
        raise ReprUnsupported(f"bad string literal {literal[:40]!r}") from None
    if not isinstance(value, str):
        raise ReprUnsupported("bytes literal")
    return json.dumps(value, ensure_ascii=False)


# ------------------------------------------------------------------ tag columns

def resolve_tags(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Turn tagged columns (dates, datetimes, times, Decimals, UUIDs) into typed ones."""
    arrays = []
    changed = False
    for col in batch.columns:
        typed = _resolve_column(col)
        changed = changed or typed is not col
        arrays.append(typed)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names) if changed else batch


def _first_list(col: pa.Array) -> Any:
    valid = col.drop_null() if col.null_count else col
    return valid[0].as_py() if len(valid) else None


def _resolve_column(col: pa.Array) -> pa.Array:
    t = col.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return col
    first = _first_list(col)
    if not first:
        return col
    tag = first[0]
    if tag not in _TAG_INTS and tag not in ("\x01D", "\x01u"):
        return col
    try:
        if tag == "\x01u" and pa.types.is_string(t.value_type):
            return _element(col, 1)
        if tag == "\x01D" and pa.types.is_string(t.value_type):
            return decimal_column(_element(col, 1))  # an exponent form raises: the exact path below
        if tag in _TAG_INTS and pa.types.is_integer(t.value_type):
            return _temporal(col, tag)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError, OverflowError):
        pass
    return python_column([_python_value(v) for v in col.to_pylist()])  # exact, per value


def _element(col: pa.Array, k: int, default: Any = None) -> pa.Array:
    """Element k of each list, aligned with the rows (`default` where a list is shorter)."""
    out = pc.list_slice(col, k, k + 1, return_fixed_size_list=True).values
    if default is not None:
        out = out.fill_null(default)
        if col.null_count:
            out = pc.if_else(pc.is_null(col), pa.scalar(None, out.type), out)
    return out


def _pad(a: pa.Array, width: int) -> pa.Array:
    return pc.utf8_lpad(a.cast(pa.string()), width, "0")


def _temporal(col: pa.Array, tag: int) -> pa.Array:
    if tag == DATE:
        y, m, d = (_element(col, k) for k in (1, 2, 3))
        return pc.binary_join_element_wise(_pad(y, 4), _pad(m, 2), _pad(d, 2), "-").cast(pa.date32())
    fields = [_element(col, k) for k in range(1, 10)]
    # the UTC tag is negative, every field is not: where it is found the datetime is zoned
    zoned = pc.or_kleene(pc.equal(fields[5], UTC), pc.or_kleene(pc.equal(fields[6], UTC),
                                                                pc.equal(fields[7], UTC)))
    zoned = pc.or_kleene(zoned, pc.equal(fields[8], UTC)).fill_null(False)
    zoned_count = pc.sum(zoned.cast(pa.int64())).as_py() or 0
    if zoned_count not in (0, len(col) - col.null_count):
        raise ValueError("mixed naive and UTC datetimes")
    parts = [pc.if_else(pc.equal(f, UTC).fill_null(False), 0, f).fill_null(0) for f in fields[:7]]
    if tag == TIME:
        h, mi, sec, us = parts[:4]
        seconds = pc.add(pc.add(pc.multiply(h, 3600), pc.multiply(mi, 60)), sec)
        out = pc.add(pc.multiply(seconds, 1_000_000), us).cast(pa.time64("us"))
        return pc.if_else(pc.is_null(col), pa.scalar(None, out.type), out) if col.null_count else out
    y, mo, d, h, mi, sec, us = parts
    text = pc.binary_join_element_wise(
        pc.binary_join_element_wise(_pad(y, 4), _pad(mo, 2), _pad(d, 2), "-"),
        pc.binary_join_element_wise(_pad(h, 2), _pad(mi, 2), _pad(sec, 2), ":"), " ")
    text = pc.binary_join_element_wise(text, _pad(us, 6), ".")
    if col.null_count:
        text = pc.if_else(pc.is_null(col), pa.scalar(None, pa.string()), text)
    naive = text.cast(pa.timestamp("us"))
    return pc.assume_timezone(naive, "UTC") if zoned_count else naive


def _python_value(v: Any) -> Any:
    """One tagged value -> its Python object (the exact, slow path)."""
    if type(v) is not list or not v:
        return v
    tag = v[0]
    try:
        if tag == DATE:
            return dt.date(*v[1:4])
        if tag == DATETIME:
            if v[-1] == UTC:
                return dt.datetime(*v[1:-1], tzinfo=dt.timezone.utc)
            return dt.datetime(*v[1:])
        if tag == TIME:
            return dt.time(*v[1:])
        if tag == "\x01D":
            return Decimal(v[1])
        if tag == "\x01u":
            return str(uuid.UUID(v[1]))
    except (TypeError, ValueError, InvalidOperation):
        return json.dumps(v)
    return [_python_value(x) for x in v]
