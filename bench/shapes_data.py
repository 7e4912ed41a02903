"""Texts of N rows in every tabular shape of issue 17, and the sums they must give.

    from bench.shapes_data import SHAPES, expected
    text = SHAPES["repr_dicts"](1_000_000)        # what a tool would return
    stream = datadesk.offload.readers.parse_text(text)  # the parse entry point

Every shape holds the same deterministic rows (row i):
    id      int        i
    amount  float      i * 0.25            (exact in binary: sums compare exactly)
    price   decimal    (i % 1000) + (i % 100) / 100, written "123.45" (Decimal where the shape has one)
    name    text       "name <i>" (in Markdown/box shapes "name_<i>")
    day     date       2024-01-01 + (i % 365) days
    ts      timestamp  2024-01-01T00:00:00Z + i seconds (with zone)
    paid    bool       i % 3 == 0
`expected(n)` gives row count, sums and counts to check a Parquet file against.
Shapes whose format has no place for a type say so in `TYPES` (e.g. JSON has no decimal:
its price is a string there, typed by the source's `columnTypes` only where it gives them).
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Callable

_DAY0 = dt.date(2024, 1, 1)
_TS0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
_DAYS = [(_DAY0 + dt.timedelta(days=k)) for k in range(365)]
_DAY_ISO = [d.isoformat() for d in _DAYS]


def _price(i: int) -> str:
    return f"{i % 1000}.{i % 100:02d}"


def _ts(i: int) -> dt.datetime:
    return _TS0 + dt.timedelta(seconds=i)


def _ts_iso(i: int) -> str:
    return _ts(i).strftime("%Y-%m-%dT%H:%M:%SZ")


def expected(n: int) -> dict:
    """What a correct Parquet file of n rows of any shape holds."""
    return {
        "rows": n,
        "sum_id": n * (n - 1) // 2,
        "sum_amount": sum(i * 0.25 for i in range(n)),
        "sum_price": sum((Decimal(_price(i)) for i in range(n)), Decimal(0)),
        "paid": sum(1 for i in range(n) if i % 3 == 0),
        "min_day": _DAY0, "max_day": _DAYS[min(n, 365) - 1] if n else None,
        "max_ts": _ts(n - 1) if n else None,
    }


def _record(i: int) -> dict:
    return {"id": i, "amount": i * 0.25, "price": _price(i), "name": f"name {i}", "day": _DAY_ISO[i % 365],
            "ts": _ts_iso(i), "paid": i % 3 == 0}


def _compact(i: int) -> str:
    return (f'{{"id":{i},"amount":{i * 0.25!r},"price":"{_price(i)}","name":"name {i}","day":"{_DAY_ISO[i % 365]}",'
            f'"ts":"{_ts_iso(i)}","paid":{"true" if i % 3 == 0 else "false"}}}')


def json_records(n: int) -> str:
    """A JSON array of objects, one per line (DuckDB's `COPY ... (FORMAT json, ARRAY true)`)."""
    return "[\n" + ",\n".join(_compact(i) for i in range(n)) + "\n]"


def json_records_compact(n: int) -> str:
    """A JSON array of objects on one line (`json.dumps(rows)` with no indent)."""
    return "[" + ",".join(_compact(i) for i in range(n)) + "]"


def json_records_pretty(n: int) -> str:
    """Pretty-printed with indent=2, inside an envelope (as mcp-csv-database returns it)."""
    return json.dumps({"status": "success", "columns": list(_record(0)), "row_count": n, "limited": False,
                       "data": [_record(i) for i in range(n)]}, indent=2)


_NAMES = ["id", "amount", "price", "name", "day", "ts", "paid"]
_TYPES = ["BIGINT", "DOUBLE", "DECIMAL(10,2)", "VARCHAR", "DATE", "TIMESTAMP WITH TIME ZONE", "BOOLEAN"]


def _array(i: int) -> str:
    return (f'[{i},{i * 0.25!r},"{_price(i)}","name {i}","{_DAY_ISO[i % 365]}","{_ts_iso(i)}",'
            f'{"true" if i % 3 == 0 else "false"}]')


def json_arrays_header(n: int) -> str:
    return "[" + json.dumps(_NAMES) + "," + ",".join(_array(i) for i in range(n)) + "]"


def json_arrays(n: int) -> str:
    """Arrays without a header row: the columns are column_1 ... column_7."""
    return "[" + ",".join(_array(i) for i in range(n)) + "]"


def json_columns_rows(n: int, truncated: bool = False) -> str:
    """`{columns, columnTypes, rows}` as mcp-server-motherduck returns it (its cap: `truncated` + warning)."""
    head = {"success": True, "columns": _NAMES, "columnTypes": _TYPES}
    tail = {"rowCount": n}
    if truncated:
        tail.update(truncated=True, warning=f"Results limited to {n:,} rows. Query returned more data.")
    body = ",".join(_array(i) for i in range(n))
    return json.dumps(head)[:-1] + ', "rows": [' + body + "], " + json.dumps(tail)[1:]


def json_envelope(n: int, truncated: bool = False) -> str:
    """`{data: [...], meta...}` with paging metadata beside the rows."""
    meta = {"request_id": "r-42", "took_ms": 17}
    if truncated:
        meta.update(has_more=True, next_cursor="c2", total=n * 3)
    return json.dumps(meta)[:-1] + ', "data": [' + ",".join(_compact(i) for i in range(n)) + "]}"


def json_nested(n: int) -> str:
    """Objects with a nested object (a struct column) one level down: `{result: {items: [...]}}`."""
    rows = ",".join(f'{{"id":{i},"amount":{i * 0.25!r},"price":"{_price(i)}","name":"name {i}",'
                    f'"day":"{_DAY_ISO[i % 365]}","ts":"{_ts_iso(i)}","paid":{"true" if i % 3 == 0 else "false"},'
                    f'"geo":{{"lat":{i % 90},"lon":{i % 180}}}}}' for i in range(n))
    return '{"result": {"items": [' + rows + '], "page": 1}}'


def ndjson(n: int) -> str:
    return "\n".join(_compact(i) for i in range(n)) + "\n"


def json_columnar(n: int) -> str:
    rows = [_record(i) for i in range(n)]
    return json.dumps({k: [r[k] for r in rows] for k in _NAMES})


def _repr_row(i: int) -> str:
    return (f"({i}, {i * 0.25!r}, Decimal('{_price(i)}'), 'name {i}', {_DAYS[i % 365]!r}, {_ts(i)!r}, "
            f"{i % 3 == 0})")


def repr_tuples(n: int) -> str:
    """`str(cursor.fetchall())` of a DB-API cursor (mcp-server-duckdb): col_1 ... col_7."""
    return "[" + ", ".join(_repr_row(i) for i in range(n)) + "]"


def repr_dicts(n: int) -> str:
    """`str([dict(row) for row in rows])` (mcp-server-sqlite); SQLite has no Decimal: price is a float there."""
    return "[" + ", ".join(
        f"{{'id': {i}, 'amount': {i * 0.25!r}, 'price': Decimal('{_price(i)}'), 'name': 'name {i}', "
        f"'day': {_DAYS[i % 365]!r}, 'ts': {_ts(i)!r}, 'paid': {i % 3 == 0}}}" for i in range(n)) + "]"


def repr_dict_lists(n: int) -> str:
    """`str(df.to_dict("list"))`."""
    cols = {"id": [i for i in range(n)], "amount": [i * 0.25 for i in range(n)],
            "price": [Decimal(_price(i)) for i in range(n)], "name": [f"name {i}" for i in range(n)],
            "day": [_DAYS[i % 365] for i in range(n)], "ts": [_ts(i) for i in range(n)],
            "paid": [i % 3 == 0 for i in range(n)]}
    return repr(cols)


def _cells(i: int) -> list[str]:
    return [str(i), repr(i * 0.25), _price(i), f"name_{i}", _DAY_ISO[i % 365], _ts_iso(i),
            "true" if i % 3 == 0 else "false"]


def csv_header(n: int) -> str:
    return ",".join(_NAMES) + "\n" + "".join(",".join(_cells(i)) + "\n" for i in range(n))


def csv_no_header(n: int) -> str:
    return "".join(",".join(_cells(i)) + "\n" for i in range(n))


def tsv(n: int) -> str:
    return "\t".join(_NAMES) + "\n" + "".join("\t".join(_cells(i)) + "\n" for i in range(n))


def markdown(n: int) -> str:
    return ("| " + " | ".join(_NAMES) + " |\n|" + "---|" * len(_NAMES) + "\n"
            + "".join("| " + " | ".join(_cells(i)) + " |\n" for i in range(n)))


def ascii_box(n: int) -> str:
    rule = "+" + "+".join("-" * 12 for _ in _NAMES) + "+"
    line = lambda cells: "|" + "|".join(f" {c:<10} " for c in cells) + "|"  # noqa: E731
    return "\n".join([rule, line(_NAMES), rule, *(line(_cells(i)) for i in range(n)), rule]) + "\n"


def psql(n: int) -> str:
    head = " " + " | ".join(f"{c:<10}" for c in _NAMES)
    rule = "-" + "-+-".join("-" * 10 for _ in _NAMES) + "-"
    body = "\n".join(" " + " | ".join(f"{c:<10}" for c in _cells(i)) for i in range(n))
    return f"{head}\n{rule}\n{body}\n({n} rows)\n"


def prose_json(n: int, truncated: bool = False) -> str:
    tail = f"Showing the first {n:,} rows; more rows are available." if truncated else f"{n:,} rows."
    return f"Here are the rows you asked for:\n{json_records(n)}\n{tail}\n"


def prose_markdown(n: int, truncated: bool = False) -> str:
    tail = f"Results truncated to {n:,} rows." if truncated else "That is all."
    return f"Query results:\n\n{markdown(n)}\n{tail}\n"


SHAPES: dict[str, Callable[[int], str]] = {
    "json_records": json_records, "json_records_compact": json_records_compact,
    "json_records_pretty": json_records_pretty, "json_arrays_header": json_arrays_header,
    "json_arrays": json_arrays, "json_columns_rows": json_columns_rows, "json_envelope": json_envelope,
    "json_nested": json_nested, "ndjson": ndjson, "json_columnar": json_columnar,
    "repr_tuples": repr_tuples, "repr_dicts": repr_dicts, "repr_dict_lists": repr_dict_lists,
    "csv_header": csv_header, "csv_no_header": csv_no_header, "tsv": tsv, "markdown": markdown,
    "ascii_box": ascii_box, "psql": psql, "prose_json": prose_json, "prose_markdown": prose_markdown,
}
# Shapes that can say the source cut them (called with truncated=True).
TRUNCATED: dict[str, Callable[..., str]] = {
    "json_columns_rows": json_columns_rows, "json_envelope": json_envelope, "prose_json": prose_json,
    "prose_markdown": prose_markdown,
}
# Column names where the shape has no header (positional) ...
POSITIONAL = {"json_arrays": "column_", "csv_no_header": "column_", "repr_tuples": "col_"}
