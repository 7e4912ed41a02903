"""Tables written as a Python repr of a list of tuples (what some MCP servers return, e.g.
`str(cursor.fetchall())`): `[(1, 'a', Decimal('1.5'), datetime.date(2024, 1, 1), None), ...]`.

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
import re
import uuid
from typing import Any, Iterator

import pyarrow as pa

from datadesk.offload.columns import TabularParseError, rows_to_batch

_TOKEN = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[()\[\]]""", re.S)
_CALLS = {
    "Decimal": lambda *a: float(decimal.Decimal(*a)),
    "datetime.date": dt.date, "datetime.datetime": dt.datetime, "datetime.time": dt.time,
    "datetime.timedelta": dt.timedelta, "UUID": lambda s: str(uuid.UUID(s)),
}


def looks_like_repr_rows(text: str) -> bool:
    head = text.lstrip()[:2]
    return head == "[(" or head == "[]"


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
    if cls is ast.Call and not node.keywords:  # type: ignore[attr-defined]
        fn = _CALLS.get(_call_name(node.func) or "")  # type: ignore[attr-defined]
        if fn is not None:
            return fn(*[_value(a) for a in node.args])  # type: ignore[attr-defined]
    if cls is ast.Tuple or cls is ast.List:
        return [_value(e) for e in node.elts]  # type: ignore[attr-defined]
    if cls is ast.UnaryOp and isinstance(node.op, ast.USub) and type(node.operand) is ast.Constant:  # type: ignore[attr-defined]
        return -node.operand.value  # type: ignore[attr-defined]
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


def repr_batches(text: str, batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
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
