"""Rows of a Python repr of dicts read column by column: one split, no rewrite of the text.

`[{'id': 0, 'name': 'a', 'day': datetime.date(2024, 1, 1), 'paid': True}, {...}]`, a query's
rows (`str([dict(r) for r in rows])`), repeats the same pieces in every row. Split once on
the quote, a chunk of such rows is a list whose every P-th item is the same key, the same
separator or the same column's value: row r's pieces are `parts[1 + r*P : 1 + (r+1)*P]`.
`columns()` learns that layout from the chunk's first row, checks it on every row with
C-speed list operations (`list.count` over a slice: each key, each fixed separator), and
types each column from its slice with pyarrow's vectorised casts:

- a string value is the quoted piece itself (no mark, no escape: the text has no `"` or `\\`);
- `Decimal('1.50')` and `UUID('...')`: the quoted piece, typed as a decimal / kept as text;
- anything else is the text between `: ` and the next `, ` or `}`: None, True/False,
  integers, floats (checked against the forms `repr` writes), `datetime.date(...)`,
  `datetime.datetime(...)` (naive or `tzinfo=datetime.timezone.utc`) and `datetime.time(...)`.

Any row that does not fit (a None where the first row had a string, another key, a nested
value, a string with a quote in it ...) makes `columns()` return None, and the caller reads
that chunk with the CSV rewrite (`shapes_reprfast`), which handles them or sends them on to
the exact paths. The Python work per chunk is one `split` and a few list slices: the
12-16 passes of `str.replace` of the CSV rewrite are what made dicts the slowest repr.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

_FORBIDDEN = ('"', "\\", "\x00", "\x01", "\x02")
_FLOAT = r"^-?(\d+(\.\d*)?([eE][-+]?\d+)?|nan|inf)$"
_CALLS = (("datetime.datetime(", "\x01T"), ("datetime.date(", "\x01Y"), ("datetime.time(", "\x01H"))


class _Column:
    """Where one column's value sits in a row's pieces, and how to read it."""

    def __init__(self, kind: str, pos: int, tail: str) -> None:
        self.kind = kind  # "scalar" (in a separator piece) | "string" | "Decimal" | "UUID"
        self.pos = pos  # the piece holding the value (relative to the row's first piece)
        self.tail = tail  # scalar: what follows the value in its piece (", " or "}, {")


def columns(piece: str, keys: list[str]) -> pa.Table | None:
    """The table of the rows `piece` (`{...}, {...}, ...`, every row with `keys` in that
    order), or None when a row does not fit the first one's layout."""
    if any(c in piece for c in _FORBIDDEN):
        return None
    parts = piece.split("'")
    if not parts or parts[0] != "{":
        return None
    plan = _layout(parts, keys)
    if plan is None:
        return None
    period, fixed, cols = plan
    parts[-1] += ", {"  # the last row ends like every other one
    rows, extra = divmod(len(parts) - 1, period)
    if extra or rows == 0:
        return None
    for pos, expected in fixed:  # every key and separator, in every row
        if parts[1 + pos::period].count(expected) != rows:
            return None
    arrays = []
    for col in cols:
        values = pa.array(parts[1 + col.pos::period], pa.string())
        typed = _typed(values, col)
        if typed is None:
            return None
        arrays.append(typed)
    return pa.Table.from_arrays(arrays, names=list(keys))


def _layout(parts: list[str], keys: list[str]) -> tuple[int, list[tuple[int, str]], list[_Column]] | None:
    """(pieces per row, (position, text) every row must have there, the columns) from row 0."""
    fixed: list[tuple[int, str]] = []
    cols: list[_Column] = []
    pos = 0  # parts[1 + pos] is the current piece
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        end = "}, {" if last else ", "
        if 2 + pos >= len(parts) or parts[1 + pos] != key:
            return None
        fixed.append((pos, key))
        sep = parts[2 + pos]
        if sep in (": ", ": Decimal(", ": UUID("):  # a quoted value follows
            kind = {": ": "string", ": Decimal(": "Decimal", ": UUID(": "UUID"}[sep]
            fixed.append((pos + 1, sep))
            cols.append(_Column(kind, pos + 2, end))
            close = (")" if kind != "string" else "") + end
            if 4 + pos > len(parts):
                return None
            after = parts[4 + pos] if 4 + pos < len(parts) else None
            if after is None or (after != close and not (last and after == close[:-3])):
                return None
            fixed.append((pos + 3, close))
            pos += 4
        else:  # the value is in this piece: ": <value>, " or ": <value>}, {"
            cols.append(_Column("scalar", pos + 1, end))
            pos += 2
    return pos, fixed, cols


_QUOTED = (("string", "", ", ", ""), ("Decimal", "Decimal(", "), Decimal(", ")"), ("UUID", "UUID(", "), UUID(", ")"))


def list_column(piece: str) -> pa.Array | None:
    """The values of (a piece of) one list of a dict of lists, `v, v, ...`, typed; None when
    they are not all of one kind this reads (the caller takes the CSV rewrite)."""
    if not piece or any(c in piece for c in _FORBIDDEN):
        return None
    if "'" in piece:  # strings, Decimal('...') or UUID('...'): the quoted pieces are the values
        parts = piece.split("'")
        if len(parts) % 2 == 0:
            return None
        seps = parts[2:-1:2]
        for kind, head, sep, tail in _QUOTED:
            if parts[0] == head and parts[-1] == tail and seps.count(sep) == len(seps):
                return _typed(pa.array(parts[1::2], pa.string()), _Column(kind, 0, ""))
        return None
    if piece.endswith(")"):  # calls: each value's arguments hold ", " too
        values = pa.array(piece[:-1].split("), "), pa.string())
        return _scalar(pc.binary_join_element_wise(values, ")", ""))
    return _scalar(pa.array(piece.split(", "), pa.string()))


def _typed(values: pa.Array, col: _Column) -> pa.Array | None:
    if col.kind == "string":
        return values
    if col.kind == "UUID":
        return values if pc.all(pc.match_substring_regex(values, r"^[0-9a-f-]{36}$")).as_py() else None
    if col.kind == "Decimal":
        from datadesk.offload.shapes_reprfast import _decimal

        if not pc.all(pc.match_substring_regex(values, r"^-?\d+(\.\d+)?$")).as_py():
            return None
        return _decimal(values)
    if not (pc.all(pc.starts_with(values, ": ")).as_py() and pc.all(pc.ends_with(values, col.tail)).as_py()):
        return None
    return _scalar(pc.utf8_slice_codeunits(values, 2, -len(col.tail)))


def _scalar(text: pa.Array) -> pa.Array | None:
    """None, booleans, integers, floats or date/time calls (one kind per column), typed."""
    none = pc.equal(text, "None")
    valid = pc.filter(text, pc.invert(none))
    if len(valid) == 0:
        return pa.nulls(len(text))
    text = pc.if_else(none, pa.scalar(None, pa.string()), text)
    first = valid[0].as_py()
    for call, tag in _CALLS:
        if first.startswith(call):
            return _call(text, valid, call, tag)
    if first in ("True", "False"):
        if not pc.all(pc.is_in(valid, pa.array(["True", "False"]))).as_py():
            return None
        return pc.equal(text, "True")
    if pc.all(pc.match_substring_regex(valid, r"^-?\d+$")).as_py():
        try:
            return text.cast(pa.int64())
        except (pa.ArrowInvalid, OverflowError):
            return None  # past int64: the exact paths keep every digit
    if pc.all(pc.match_substring_regex(valid, _FLOAT)).as_py():
        return text.cast(pa.float64())
    return None


def _call(text: pa.Array, valid: pa.Array, call: str, tag: str) -> pa.Array | None:
    """`datetime.date(2024, 1, 2)` ... as the CSV rewrite's tagged fields, typed by it."""
    from datadesk.offload.columns import TabularParseError
    from datadesk.offload.shapes_reprfast import _comma_call

    if not (pc.all(pc.starts_with(valid, call)).as_py() and pc.all(pc.ends_with(valid, ")")).as_py()):
        return None
    body = pc.utf8_slice_codeunits(text, len(call), -1)
    if tag == "\x01T":
        body = pc.replace_substring(body, ", tzinfo=datetime.timezone.utc", ",z")
    body = pc.replace_substring(body, ", ", ",")
    if not pc.all(pc.match_substring_regex(pc.drop_null(body), r"^\d+(,\d+)*(,z)?$")).as_py():
        return None  # another tzinfo, a keyword argument ...: the CSV rewrite decides
    try:
        return _comma_call(text, body, tag)
    except TabularParseError:
        return None
