"""Python reprs of tables read by pyarrow's CSV reader: no Python object per value.

For the common reprs (every string single-quoted, without backslashes or double quotes):
the text is split once on the quote; the parts between the strings (numbers, None/True/
False, calls, brackets) are joined and rewritten with C-speed `str.replace` (the strings
are never touched), `), (` becomes a line break and `, ` a comma; each string gets a mark
inside its quotes (so `'00123'` stays text); calls become tagged CSV fields
(`datetime.date(2024, 1, 2)` -> `\x01d2024-1-2`, `Decimal('1.50')` -> `\x01D'1.50'`) that
`resolve` types vectorised. Rows of dicts become `key,value,...` rows whose key columns
must be constant (`dict_batches`); after the first chunk each known `'key': ` is replaced by
its number before the split, so keys cost no string objects. Rows of dicts are first read
column by column where they can be (`columns`, which needs no rewrite at all).

Chunk by chunk (issue 17: memory bounded by the chunk, not the result): `CHUNK_BYTES` of
text at a time, cut between two rows (outside any string: an even number of quotes), each
chunk converted and read on its own; a column keeps the type it had first where the cast is
lossless (decimals widen to 18, then 38 digits, once), else the sink unifies as for JSON.

Anything else returns None and the next readers of `ORDER` take it (the JSON rewrite, the
exact `ast` reader), which are exact for every repr this module refuses (a string with a quote in it, a call it does not know,
a one-element tuple, a name ...). A real string can never look like a tag or a mark: a
control character in a repr string is written as an escape (a backslash), which sends the
text elsewhere.
"""

from __future__ import annotations

import re
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from datadesk.offload.readahead import ReadAhead, ordered_map
from datadesk.offload.readers.base import Rest
from datadesk.offload.readers.casts import cast_for_union, json_strings, stream_typed, unify_types
from datadesk.offload.readers.columns import unique_names
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.pyrepr.columns import columns, comma_call, decimal_column, first_keys, list_column, time_column

_SEP = "\x00"
_STR = "\x02"  # marks a string's content in the CSV (a quoted '123' stays the text "123")
_ALLOWED = b"0123456789,.-+eE \n\x00\x01DuzthdTYH'" + b"NonTruFalsif"  # outside the strings, rewritten
_NOT_LETTERS = bytes(b for b in range(256) if not chr(b).isalpha() or b > 127 or chr(b) in "eE")
_DT = re.compile(r"datetime\.datetime\((\d+), (\d+), (\d+), (\d+), (\d+)(?:, (\d+))?(?:, (\d+))?"
                 r"(, tzinfo=datetime\.timezone\.utc)?\)")
_DATE = re.compile(r"datetime\.date\((\d+), (\d+), (\d+)\)")
_TIME = re.compile(r"datetime\.time\((\d+), (\d+)(?:, (\d+))?(?:, (\d+))?\)")


def _dt(m: re.Match) -> str:
    g = m.groups()
    return f"\x01{'z' if g[7] else 't'}{g[0]} {g[1]} {g[2]} {g[3]} {g[4]} {g[5] or 0} {g[6] or 0}"


def _call_fields(others: str) -> str:
    """Dates, datetimes and times as tagged fields whose parts are spaces (`\x01d2024-1-2`)."""
    if "datetime.datetime(" in others:
        others = _DT.sub(_dt, others)
    if "datetime.date(" in others:
        others = _DATE.sub(lambda m: f"\x01d{m[1]}-{m[2]}-{m[3]}", others)
    if "datetime.time(" in others:
        others = _TIME.sub(lambda m: f"\x01h{m[1]} {m[2]} {m[3] or 0} {m[4] or 0}", others)
    return others


def _quoted_calls(others: str) -> str | None:
    """Rows already split into lines: every bracket left is a call's, so each date, datetime
    or time call becomes one quoted CSV field at C speed, `'\x01T2024, 1, 2, 10, 30,z'`
    (`\x01Y` dates, `\x01H` times; `,z`: UTC), no regex and no Python per value; None when
    the brackets do not pair up with those calls (the exact paths read it)."""
    if "tzinfo=datetime.timezone.utc)" in others and "datetime.time(" not in others:
        others = others.replace(", tzinfo=datetime.timezone.utc)", ",z)")
    opened = 0
    for call, tag in (("datetime.datetime(", "'\x01T"), ("datetime.date(", "'\x01Y"), ("datetime.time(", "'\x01H")):
        if call in others:
            opened += others.count(call)
            others = others.replace(call, tag)
    if others.count(")") != opened or "(" in others:
        return None
    return others.replace(")", "'")


_ROWS = {"(": ("[(", ")]", "), ("), "[": ("[[", "]]", "], ["), "{": ("[{", "}]", "}, {")}  # a row's brackets


def _csv_text(text: str, dicts: bool = False, keys: list[str] | None = None, column: bool = False,
              row: str = "(") -> bytes | None:
    """The CSV for a plain repr of tuples (strings untouched), or None: not for this path.

    `dicts`: a list of dicts; each row becomes `key,value,key,value...` (see `dict_batches`).
    `keys`: the keys every row should have, in order: each `'key': ` becomes its number
    (`1,value,2,value...`), so the keys are never split out as strings (the caller checks the
    numbers). Exact: with no quote inside a string, `'key': ` can only be that key.
    `column`: `[(v, v, ...)]` is one column's values, one per line. `row`: `(` tuples, `[` lists."""
    stripped = text.strip()
    start, end, row_break = _ROWS["{" if dicts else row]
    if not (stripped.startswith(start) and stripped.endswith(end)) or ",)" in stripped \
            or '"' in stripped or "\\" in stripped or _SEP in stripped or "\x01" in stripped or _STR in stripped:
        return None  # (a one-element tuple is written "(1,)": the exact path reads it)
    for i, key in enumerate(keys or ()):  # the number zero-padded to the key's length: an in-place replace
        old, lead = ("{'" if i == 0 else ", '") + key + "': ", "{" if i == 0 else ", "
        stripped = stripped.replace(old, lead + str(i + 1).zfill(len(old) - len(lead) - 2) + ": ")
    parts = stripped[2:-2].split("'")
    if len(parts) % 2 == 0:
        return None
    others = _SEP.join(parts[0::2])  # everything but the strings: the rewrites cannot touch a string
    for call, tag in (("Decimal(", "\x01D"), ("UUID(", "\x01u")):
        if call in others:  # the tag sits before the quoted digits: `\x01D'1.50'`, one CSV field
            others = others.replace(call + _SEP + ")", tag + _SEP)
    if column:
        others = _call_fields(others).replace(", ", "\n")
    else:
        others = others.replace(row_break, "\n")
        if "datetime." in others and (others := _quoted_calls(others)) is None:
            return None
        others = others.replace(", ", ",")
    if dicts:
        others = others.replace(": ", ",")
    # one pass: only numbers, separators, tags and the letters of None/True/False/nan/inf are
    # left outside the strings (a name or an object's repr sends the text to the exact paths)
    raw = others.encode("utf-8", "replace")
    letters = len(raw.translate(None, _NOT_LETTERS))
    words = sum(len(w.replace(b"e", b"")) * raw.count(w) for w in (b"None", b"True", b"False", b"nan", b"inf")) \
        + raw.count(b"\x01") + raw.count(b",z'")  # (e and E are not counted: exponents)
    if raw.translate(None, _ALLOWED) or letters != words:
        return None  # a call, a nested tuple, a name this path does not rewrite: the exact paths
    parts[0::2] = others.split(_SEP)
    if len(parts) > 1:  # every string starts with _STR inside its quotes: pyarrow never types it
        strings = _SEP.join(parts[1::2])
        parts[1::2] = (_STR + strings.replace(_SEP, _SEP + _STR)).split(_SEP)
    return "'".join(parts).encode("utf-8")  # (the joined str is freed at once: one copy alive)


CHUNK_BYTES = 4 << 20  # the text converted and parsed at a time: memory holds one chunk, not the result


def tuple_batches(text: str, batch_rows: int, rest: Rest | None) -> Iterator[pa.RecordBatch] | None:
    """Typed batches of `[(...), (...)]`, `[[...], [...]]` or `((...), (...))` (columns col_1 ...),
    or None: not for this path.

    Read chunk by chunk (`CHUNK_BYTES` of text at a time, cut between two rows); a later
    chunk this path refuses, and the rest after it, go to `rest.again` (the repr attempt from
    its first reader, which hands it on to the readers after this one)."""
    return _chunked(text, batch_rows, "(", rest) or _chunked(text, batch_rows, "[", rest)


def dict_batches(text: str, batch_rows: int, rest: Rest | None) -> Iterator[pa.RecordBatch] | None:
    """Typed batches of `[{'k': v, ...}, ...]` whose rows all have the same keys in the same
    order (a query's rows), or `{'k': [...], ...}` (a dict of column lists), or None: not for
    this path (the JSON path reads the others)."""
    if text[:2] == "{'":
        return _dict_lists(text, batch_rows)
    return _chunked(text, batch_rows, "{", rest)


def _dict_lists(text: str, batch_rows: int) -> Iterator[pa.RecordBatch] | None:
    """`{'k': [v, ...], ...}`: each list read in `CHUNK_BYTES` pieces into one typed column (the
    text of one piece at a time, never Python objects per value), then batches of rows."""
    names, columns, pos = [], [], 1
    if '"' in text or "\\" in text:
        return None
    while text.startswith("'", pos):
        close = text.find("'", pos + 1)
        if close < 0 or not text.startswith(": [", close + 1):
            return None
        start = close + 4
        end = text.find("]", start)
        while end >= 0 and text.count("'", start, end) % 2:
            end = text.find("]", end + 1)
        col = _column(text, start, end) if end >= 0 else None
        if col is None:
            return None
        names.append(text[pos + 1:close])
        columns.append(col)
        pos = end + 3 if text.startswith(", '", end + 1) else end + 1
    if not columns or text[pos:].strip() != "}":
        return None
    if len({len(c) for c in columns}) != 1:
        raise TabularParseError("a Python-repr dict of lists: the lists differ in length")
    table = pa.Table.from_arrays(columns, names=unique_names(names))
    return iter(table.to_batches(max_chunksize=batch_rows))


def _column(text: str, a: int, hi: int) -> pa.ChunkedArray | None:
    """The values of one list `text[a:hi]` (`v, v, ...`) as one typed column, or None. Pieces
    of `CHUNK_BYTES`, two at a time: read by `columns.list_column`, else by the CSV
    rewrite."""
    pieces = []
    for (a, j), col in ordered_map(lambda span: list_column(text[span[0]:span[1]]), _list_spans(text, a, hi),
                                   name="offload-repr"):
        if col is None:
            table = _read_csv(_csv_text("[(" + text[a:j] + ")]", column=True))
            if table is None or table.num_columns != 1:
                return None
            col = table.column(0).combine_chunks()
        pieces.append(resolve(col))
    if not pieces:
        return pa.chunked_array([], pa.null())
    want = unify_types([p.type for p in pieces])
    try:
        return pa.chunked_array([p if p.type == want else cast_for_union(p, want) for p in pieces], want)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def _list_spans(text: str, a: int, hi: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each piece of the list `text[a:hi]`: cut at a ", " outside strings and calls."""
    while a < hi:
        j = a + CHUNK_BYTES
        while j < hi:
            j = text.find(", ", j, hi)
            if j < 0:
                j = hi
            elif text.count("'", a, j) % 2 == 0 and text.count("(", a, j) == text.count(")", a, j):
                break
            else:
                j += 1
        j = min(j, hi)
        yield a, j
        a = j + 2


def _bounds(text: str, row: str) -> tuple[int, int] | None:
    """Where the rows are: text[lo:hi] from the first row's opening bracket to the last's closing."""
    lo, hi = 0, len(text)
    while lo < hi and text[lo].isspace():
        lo += 1
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    start, end, _ = _ROWS[row]
    if text[lo:lo + 1] == "(" and row != "{":  # a tuple of rows
        start, end = "(" + start[1], end[0] + ")"
    if not (text.startswith(start, lo) and text.endswith(end, lo, hi)) or hi - lo < 4:
        return None
    return lo + 1, hi - 1


def _cut(text: str, a: int, hi: int, row_break: str, chunk_bytes: int) -> int:
    """The end of a chunk starting at row start `a`: just after a row's closing bracket, found
    after `chunk_bytes` of text, outside any string (an even number of quotes since `a`).

    Only exact for text without double quotes and backslashes, which `_csv_text` then checks:
    a chunk it accepts has no nesting, so its cut lies between two rows."""
    j = a + chunk_bytes
    while j < hi:
        j = text.find(row_break, j, hi)
        if j < 0:
            break
        if text.count("'", a, j) % 2 == 0:
            return j + 1
        j += 1
    return hi


def _chunk_table(piece: str, dicts: bool, keys: list[str] | None = None,
                 row: str = "(") -> tuple[pa.Table, list[str], list[str] | None] | None:
    """One chunk of rows (`(...), (...)`) read by pyarrow: the table of values and its names
    (for dicts: the keys; with `keys` given, each row must have exactly those, in that order)."""
    return _csv_table(_csv_text("[" + piece + "]", dicts, keys, row=row), dicts, keys)


def _csv_table(csv: bytes | None, dicts: bool,
               keys: list[str] | None) -> tuple[pa.Table, list[str], list[str] | None] | None:
    """`_chunk_table` from the chunk's CSV (`_csv_text`, None: refused)."""
    table = _read_csv(csv)
    if table is None:
        return None
    if not dicts:
        return table, unique_names([f"col_{i + 1}" for i in range(table.num_columns)]), None
    if table.num_columns % 2:
        return None
    if keys is not None:
        if table.num_columns != 2 * len(keys):
            return None
        for i in range(len(keys)):
            numbers = table.column(2 * i)
            if not pa.types.is_integer(numbers.type) or numbers.null_count \
                    or pc.min_max(numbers).as_py() != {"min": i + 1, "max": i + 1}:
                return None  # a row with other keys, or in another order
        return table.select(list(range(1, table.num_columns, 2))), unique_names(keys), keys
    names, raw = [], []
    for i in range(0, table.num_columns, 2):
        col = table.column(i)
        if col.null_count or pc.count_distinct(col).as_py() != 1:
            return None  # rows with other keys, or in another order
        key = col[0].as_py()
        names.append(key[1:] if isinstance(key, str) and key.startswith(_STR) else str(key))
        raw.append(isinstance(key, str) and key.startswith(_STR) and "'" not in key)
    return table.select(list(range(1, table.num_columns, 2))), unique_names(names), names if all(raw) else None


def _chunked(text: str, batch_rows: int, row: str, rest: Rest | None) -> Iterator[pa.RecordBatch] | None:
    dicts = row == "{"
    bounds = _bounds(text, row)
    if bounds is None:
        return None
    lo, hi = bounds
    size = CHUNK_BYTES
    end = _cut(text, lo, hi, _ROWS[row][2], size)
    first = _chunk_table(text[lo:end], dicts, row=row)
    if first is None and dicts:  # perhaps values the CSV rewrite does not take: read by columns
        keys = first_keys(text[lo:_cut(text, lo, hi, "}, {", 0)])
        table = columns(text[lo:end], keys) if keys else None
        first = (table, unique_names(keys), keys) if table is not None else None
    if first is None:
        return None  # the first chunk is not for this path: the caller reads the whole text otherwise
    return _chunks(text, first, end, hi, batch_rows, row, size, rest)


def _chunks(text: str, first: tuple[pa.Table, list[str], list[str] | None], a: int, hi: int, batch_rows: int,
            row: str, size: int, rest: Rest | None) -> Iterator[pa.RecordBatch]:
    """The batches of every chunk, each typed like the stream's first batches where that is
    lossless (a decimal's precision, an all-None column); a chunk this path refuses (nesting,
    a quote inside a string, other keys ...) and everything after it is read by the exact
    readers (`rest.again`).

    The text of the next chunks is rewritten as CSV in a thread of its own (`_converted`,
    Python string methods) while this one has pyarrow read and type the chunk before (which
    releases the GIL): the two stages overlap."""
    dicts = row == "{"
    table, names, keys = first
    types: dict[str, pa.DataType] = {}
    with ReadAhead(_converted(text, a, hi, row, keys, size), depth=2, name="offload-repr") as ahead:
        for batch in _typed_batches(table.rename_columns(names), batch_rows):
            yield stream_typed(batch, types)
        for start, item in ahead:
            got = (item, unique_names(keys), keys) if isinstance(item, pa.Table) else _csv_table(item, dicts, keys)
            if got is None:
                if rest is None:
                    raise TabularParseError("a Python-repr table changes form part way (rows this reader cannot take)")
                for batch in rest.again("[" + text[start:hi] + "]"):
                    yield stream_typed(batch, types)
                return
            if not dicts and len(got[1]) != len(names):
                raise TabularParseError(f"ragged Python-repr table: a row has {len(got[1])} values, not {len(names)}")
            table, names = got[0], got[1]
            for batch in _typed_batches(table.rename_columns(names), batch_rows):
                yield stream_typed(batch, types)


def _converted(text: str, a: int, hi: int, row: str, keys: list[str] | None,
               size: int) -> Iterator[tuple[int, pa.Table | bytes | None]]:
    """(start, CSV or None) of each chunk after the one ending at `a`; stops after a refused one.
    Rows of dicts with known keys come as their table where `columns` reads them, two
    chunks at a time (its pyarrow casts release the GIL)."""
    dicts = row == "{"

    def read(span: tuple[int, int]) -> pa.Table | None:
        return columns(text[span[0]:span[1]], keys) if dicts and keys is not None else None

    for (start, end), table in ordered_map(read, _spans(text, a, hi, _ROWS[row][2], size), name="offload-repr"):
        if table is not None:
            yield start, table
            continue
        csv = _csv_text("[" + text[start:end] + "]", dicts, keys, row=row)
        yield start, csv
        if csv is None:
            return


def _spans(text: str, a: int, hi: int, row_break: str, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each chunk after the one ending at `a`."""
    while a < hi:
        a += 2  # the ", " between two rows
        end = _cut(text, a, hi, row_break, size)
        yield a, end
        a = end


def _read_csv(csv_text: bytes | None) -> pa.Table | None:
    if csv_text is None:
        return None
    try:
        table = pacsv.read_csv(
            pa.BufferReader(csv_text),
            read_options=pacsv.ReadOptions(autogenerate_column_names=True, block_size=4 << 20),
            parse_options=pacsv.ParseOptions(delimiter=",", quote_char="'", double_quote=False, escape_char=False,
                                             newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(null_values=["None"], true_values=["True"], false_values=["False"],
                                                 strings_can_be_null=True, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table


def _typed_batches(table: pa.Table, batch_rows: int) -> Iterator[pa.RecordBatch]:
    for batch in table.to_batches(max_chunksize=batch_rows):
        yield pa.RecordBatch.from_arrays([resolve(c) for c in batch.columns], names=batch.schema.names)


def resolve(col: pa.Array) -> pa.Array:
    """A CSV column of the fast path: tagged fields typed, other strings as text."""
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return col
    valid = col.drop_null()
    if len(valid) == 0:
        return col
    first = valid[0].as_py()
    tag = first[:2] if first[:1] == "\x01" else ""
    if not tag or not pc.all(pc.starts_with(valid, tag)).as_py():
        if pc.any(pc.starts_with(valid, "\x01")).as_py():
            raise TabularParseError("a Python-repr column mixes values of different kinds (e.g. dates and text)")
        marked = pc.starts_with(col, _STR)
        text = pc.if_else(marked, pc.utf8_slice_codeunits(col, 1), col).cast(pa.string())
        missing = pc.and_(pc.invert(marked), pc.equal(col, "nan"))  # pandas' NaN for a missing text
        if pc.any(marked).as_py() and pc.any(missing).as_py():
            text = pc.if_else(missing, pa.scalar(None, pa.string()), text)
        return json_strings(text)  # ISO dates / timestamps typed, like JSON strings; the rest text
    body = pc.utf8_slice_codeunits(col, 2)
    if tag in ("\x01T", "\x01Y", "\x01H"):
        return comma_call(col, body, tag)
    if tag in ("\x01D", "\x01u"):  # \x01D'\x021.50': the quotes and the string mark came with it
        body = pc.utf8_slice_codeunits(body, 2, -1)
        return decimal_column(body) if tag == "\x01D" else body.cast(pa.string())
    if tag == "\x01d":
        parts = pc.split_pattern(body, "-")
        y, m, d = (pc.list_element(parts, k) for k in range(3))
        return pc.binary_join_element_wise(pc.utf8_lpad(y, 4, "0"), pc.utf8_lpad(m, 2, "0"),
                                           pc.utf8_lpad(d, 2, "0"), "-").cast(pa.date32())
    parts = pc.split_pattern(body, " ")
    fields = [pc.list_element(parts, k) for k in range(7 if tag != "\x01h" else 4)]
    pad = lambda a, w: pc.utf8_lpad(a, w, "0")  # noqa: E731
    if tag == "\x01h":
        return time_column(*fields)
    y, mo, d, h, mi, s, us = fields
    text = pc.binary_join_element_wise(
        pc.binary_join_element_wise(pad(y, 4), pad(mo, 2), pad(d, 2), "-"),
        pc.binary_join_element_wise(pad(h, 2), pad(mi, 2), pad(s, 2), ":"), " ")
    ts = pc.binary_join_element_wise(text, pad(us, 6), ".").cast(pa.timestamp("us"))
    return pc.assume_timezone(ts, "UTC") if tag == "\x01z" else ts
