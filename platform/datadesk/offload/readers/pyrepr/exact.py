"""Tables written as a Python repr of a list of tuples (what some MCP servers return, e.g.
`str(cursor.fetchall())`): `[(1, 'a', Decimal('1.5'), datetime.date(2024, 1, 1), None), ...]`.

The exact reader of the repr attempt (`readers/__init__.py`), for what the faster ones refuse.
Parsed without `eval`: a tokenizer finds each top-level tuple, and each batch of tuples
is read with `ast` on a whitelist (literals, tuples/lists, and the calls `Decimal`,
`datetime.date`, `datetime.datetime`, `datetime.time`, `datetime.timedelta`, `UUID`).
Columns are named col_1..col_n (the repr carries no names). Batch by batch: a big reply
is never turned into one huge syntax tree.
"""

from __future__ import annotations

import ast
import datetime as dt
import decimal
import math
import re
import uuid
from typing import Any, Iterator

import pyarrow as pa

from datadesk.offload.readers.columns import records_to_batch, rows_to_batch, unique_names
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.casts import python_column

_TOKEN = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[()\[\]]""", re.S)


def _timestamp(text: str, tz: str | None = None) -> dt.datetime | None:
    """pandas' `Timestamp('2024-01-01 00:00:00+0000', tz='UTC')` and numpy's
    `np.datetime64('2024-01-01T00:00:00.000000')`: the ISO text, with its offset when it has one."""
    if text == "NaT":
        return None
    value = dt.datetime.fromisoformat(text)
    if tz is not None and value.tzinfo is None:
        if tz != "UTC":
            raise ValueError(f"a naive time with tz={tz!r}")
        value = value.replace(tzinfo=dt.timezone.utc)
    return value


_NUMPY = {**{f"np.{k}": int for k in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")},
          **{f"np.{k}": float for k in ("float16", "float32", "float64")},
          "np.str_": str, "np.datetime64": _timestamp}  # numpy 2 writes its scalars as calls
_CALLS = {
    "Decimal": decimal.Decimal,
    "datetime.date": dt.date, "datetime.datetime": dt.datetime, "datetime.time": dt.time,
    "datetime.timedelta": dt.timedelta, "UUID": lambda s: str(uuid.UUID(s)),
    "datetime.timezone": dt.timezone, "Timestamp": _timestamp, **_NUMPY,
}
_KEYWORDS = {"datetime.datetime": {"tzinfo", "fold"}, "datetime.time": {"tzinfo", "fold"},
             "datetime.timedelta": {"days", "seconds", "microseconds"}, "Timestamp": {"tz"}}


def looks_like_repr_rows(text: str) -> bool:
    head = text.lstrip()[:3]
    return head[:2] in ("[(", "[]") or head == "[{'"


# bare names a repr writes for values: a float NaN / infinity (pandas' missing numbers), pandas'
# missing time, numpy 2's booleans, the UTC zone of a datetime
_NAMES = {"nan": math.nan, "inf": math.inf, "NaT": None, "np.True_": True, "np.False_": False,
          "datetime.timezone.utc": dt.timezone.utc, "timezone.utc": dt.timezone.utc}


def _call_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return None


def _value(node: ast.AST) -> Any:
    cls = type(node)
    if cls is ast.Constant:
        return node.value  # type: ignore[attr-defined]
    if cls is ast.Call:
        name = _call_name(node.func) or ""  # type: ignore[attr-defined]
        fn = _CALLS.get(name)
        kwargs = {k.arg: _value(k.value) for k in node.keywords}  # type: ignore[attr-defined]
        if fn is not None and set(kwargs) <= _KEYWORDS.get(name, set()):
            try:
                return fn(*[_value(a) for a in node.args], **kwargs)  # type: ignore[attr-defined]
            except (TypeError, ValueError, decimal.InvalidOperation) as exc:
                raise TabularParseError(f"bad value in a Python-repr table: {ast.unparse(node)[:80]} ({exc})") from None
    if cls is ast.Dict:
        keys = [_value(k) for k in node.keys]  # type: ignore[attr-defined]
        return dict(zip(keys, [_value(v) for v in node.values]))  # type: ignore[attr-defined]
    if cls is ast.Tuple or cls is ast.List:
        return [_value(e) for e in node.elts]  # type: ignore[attr-defined]
    if cls is ast.Name or cls is ast.Attribute:
        name = ast.unparse(node)
        if name in _NAMES:
            return _NAMES[name]
    if cls is ast.UnaryOp and isinstance(node.op, ast.USub):  # type: ignore[attr-defined]
        operand = node.operand  # type: ignore[attr-defined]
        if type(operand) is ast.Constant:
            return -operand.value
        if type(operand) is ast.Name and operand.id == "inf":
            return -math.inf
    raise TabularParseError(f"unsupported value in a Python-repr table: {ast.unparse(node)[:80]}")


def _tuples(text: str) -> Iterator[str]:
    depth, start = 0, None
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in "([":
            depth += 1
            if depth == 2 and tok == "(":
                start = m.start()
        elif tok in ")]":
            depth -= 1
            if depth == 1 and start is not None:
                yield text[start:m.end()]
                start = None
            elif depth < 0:
                raise TabularParseError("unbalanced brackets in a Python-repr table")
    if depth != 0:
        raise TabularParseError("the Python-repr table is cut off (unbalanced brackets)")


PARSE_CHUNK = 1_000  # tuples per ast.parse call: CPython's compile slows down on huge literals


def exact_batches(text: str, batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
    """The exact path: tuples found by a tokenizer, each batch read by `ast` on a whitelist;
    a list of dicts or a dict of lists is read whole the same way."""
    if text.lstrip()[:2] in ("[{", "({", "{'", '{"'):
        yield from _exact_dicts(text)
        return
    pending: list[str] = []
    rows: list[list[Any]] = []
    width: int | None = None

    def parse() -> None:
        nonlocal width
        try:
            tree = ast.parse("[" + ",".join(pending) + "]", mode="eval")
        except SyntaxError as exc:
            raise TabularParseError(f"not a Python-repr table: {exc.msg}") from None
        pending.clear()
        for t in tree.body.elts:  # type: ignore[attr-defined]
            row = _value(t)
            if width is None:
                width = len(row)
            elif len(row) != width:
                raise TabularParseError(f"ragged Python-repr table: a row has {len(row)} values, not {width}")
            rows.append(row)

    def batch() -> pa.RecordBatch:
        out = rows_to_batch([f"col_{i + 1}" for i in range(width or 0)], rows)
        rows.clear()
        return out

    for t in _tuples(text):
        pending.append(t)
        if len(pending) >= PARSE_CHUNK:
            parse()
            if len(rows) >= batch_rows:
                yield batch()
    if pending:
        parse()
    if rows:
        yield batch()


def _exact_dicts(text: str) -> Iterator[pa.RecordBatch]:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise TabularParseError(f"not a Python-repr table: {exc.msg}") from None
    value = _value(tree.body)
    if isinstance(value, dict):
        if not all(isinstance(v, list) for v in value.values()):
            raise TabularParseError("a Python-repr dict is a table only when each value is a list of column values")
        lengths = {len(v) for v in value.values()}
        if len(lengths) > 1:
            raise TabularParseError("a Python-repr dict of lists: the lists differ in length")
        names = unique_names(list(value))
        yield pa.RecordBatch.from_arrays([python_column(v) for v in value.values()], names=names)
        return
    if not all(isinstance(r, dict) for r in value):
        raise TabularParseError("a Python-repr list mixes dicts with other values")
    yield records_to_batch(value)
