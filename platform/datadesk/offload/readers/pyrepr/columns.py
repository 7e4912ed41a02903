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
that chunk with the CSV rewrite (`pyarrow_csv_engine`), which handles them or sends them on to
the exact paths. The Python work per chunk is one `split` and a few list slices: the
12-16 passes of `str.replace` of the CSV rewrite are what made dicts the slowest repr.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from datadesk.offload.readers.errors import TabularParseError

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


def first_keys(row: str) -> list[str] | None:
    """The keys of one row `{'k': v, ...}` in order: each quoted piece that opens the row or
    follows `, ` and is followed by `: ` (a nested dict's keys may be taken too: `columns`
    then finds the rows do not fit, and the caller reads them otherwise)."""
    if any(c in row for c in _FORBIDDEN):
        return None
    parts = row.split("'")
    keys = [parts[i] for i in range(1, len(parts) - 1, 2)
            if parts[i + 1].startswith(": ") and parts[i - 1].endswith(("{", ", "))]
    return keys if keys and len(set(keys)) == len(keys) else None


_OPENERS = {": ": "string", ": Decimal(": "Decimal", ": UUID(": "UUID"}  # what opens a quoted value


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
        kind = _OPENERS.get(sep)
        if kind is not None:  # a quoted value follows
            fixed.append((pos + 1, sep))
            cols.append(_Column(kind, pos + 2, end))
            close = (")" if kind != "string" else "") + end
            if 4 + pos >= len(parts):
                return None
            after = parts[4 + pos]
            if after != close and not (last and after == close[:-3]):  # the chunk's only row ends in "}"
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
        if not pc.all(pc.match_substring_regex(values, r"^-?\d+(\.\d+)?$")).as_py():
            return None
        return decimal_column(values)
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
    if not (pc.all(pc.starts_with(valid, call)).as_py() and pc.all(pc.ends_with(valid, ")")).as_py()):
        return None
    body = pc.utf8_slice_codeunits(text, len(call), -1)
    if tag == "\x01T":
        body = pc.replace_substring(body, ", tzinfo=datetime.timezone.utc", ",z")
    body = pc.replace_substring(body, ", ", ",")
    if not pc.all(pc.match_substring_regex(pc.drop_null(body), r"^\d+(,\d+)*(,z)?$")).as_py():
        return None  # another tzinfo, a keyword argument ...: the CSV rewrite decides
    try:
        return comma_call(text, body, tag)
    except TabularParseError:
        return None


def comma_call(col: pa.Array, body: pa.Array, tag: str) -> pa.Array:
    """`_quoted_calls`' fields (`2024,1,2,10,30,z`: the call's arguments) typed."""
    zoned = pc.sum(pc.ends_with(body, ",z").cast(pa.int64())).as_py() or 0
    if zoned not in (0, len(col) - col.null_count):
        raise TabularParseError("a Python-repr column mixes naive and UTC datetimes")
    if zoned:
        body = pc.utf8_slice_codeunits(body, 0, -2)
    if col.null_count:
        body = body.fill_null("1970,1,1")
    parts = pc.split_pattern(body, ",")
    width = {"\x01T": 7, "\x01Y": 3, "\x01H": 4}[tag]
    fields = [pc.list_slice(parts, k, k + 1, return_fixed_size_list=True).flatten().fill_null("0")
              for k in range(width)]
    pad = lambda a, w: pc.utf8_lpad(a, w, "0")  # noqa: E731
    try:
        if tag == "\x01Y":
            out = pc.binary_join_element_wise(pad(fields[0], 4), pad(fields[1], 2), pad(fields[2], 2), "-")
            out = out.cast(pa.date32())
        elif tag == "\x01H":
            out = time_column(*fields)
        else:
            y, mo, d, h, mi, s, us = fields
            text = pc.binary_join_element_wise(
                pc.binary_join_element_wise(pad(y, 4), pad(mo, 2), pad(d, 2), "-"),
                pc.binary_join_element_wise(pad(h, 2), pad(mi, 2), pad(s, 2), ":"), " ")
            out = pc.binary_join_element_wise(text, pad(us, 6), ".").cast(pa.timestamp("us"))
            out = pc.assume_timezone(out, "UTC") if zoned else out
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TabularParseError(f"a bad date or time in a Python-repr table ({exc})") from None
    return pc.if_else(pc.is_null(col), pa.scalar(None, out.type), out) if col.null_count else out


def time_column(h: pa.Array, mi: pa.Array, s: pa.Array, us: pa.Array) -> pa.Array:
    ints = [a.cast(pa.int64()) for a in (h, mi, s, us)]
    seconds = pc.add(pc.add(pc.multiply(ints[0], 3600), pc.multiply(ints[1], 60)), ints[2])
    return pc.add(pc.multiply(seconds, 1_000_000), ints[3]).cast(pa.time64("us"))


def decimal_column(strings: pa.Array) -> pa.Array:
    strings = strings.cast(pa.string())
    dot = pc.find_substring(strings, ".")
    length = pc.utf8_length(strings)
    scale = pc.max(pc.if_else(pc.greater_equal(dot, 0), pc.subtract(pc.subtract(length, dot), 1), 0)).as_py() or 0
    if pc.any(pc.match_substring(strings, "E", ignore_case=True)).as_py():
        raise TabularParseError("a Decimal in exponent form (1E+2) in a Python-repr table")
    precision = min(38, max(int(pc.max(length).as_py() or 1), scale + 1))
    return strings.cast(pa.decimal128(precision, scale))
