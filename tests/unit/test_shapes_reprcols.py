"""Rows of a Python repr of dicts, and the lists of a dict of lists, read column by column
(`offload/repr_columns.py`): each case is checked against the exact `ast` path on the same
text (rows, order, values, types), with chunks small enough that the text is cut many times,
and with a check that the column reader really read the chunks it should."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.offload.readers.pyrepr import columns as repr_columns
from datadesk.offload.readers.pyrepr import pyarrow_csv_engine
from datadesk.offload.readers import repr_batches
from datadesk.offload.readers.pyrepr.exact import exact_batches
from datadesk.offload.parquet.writer import ParquetSink

UTC = dt.timezone.utc


@pytest.fixture
def read_by_columns(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Tiny chunks; counts the chunks the column reader read and those it left to the CSV rewrite."""
    monkeypatch.setattr(pyarrow_csv_engine, "CHUNK_BYTES", 400)
    seen = {"read": 0, "left": 0}
    for name, fn in (("columns", repr_columns.columns), ("list_column", repr_columns.list_column)):
        def spy(*args, _fn=fn):
            out = _fn(*args)
            seen["read" if out is not None else "left"] += 1
            return out
        monkeypatch.setattr(pyarrow_csv_engine, name, spy)
    return seen


def _written(batches, path: Path) -> pa.Table:
    with ParquetSink(path, 1 << 30) as sink:  # as the pipeline writes them (types unified)
        for batch in batches:
            sink.add(batch)
        sink.close()
    return pq.read_table(path)


def _kind(t: pa.DataType) -> str:
    """A type, decimals by their scale only: a stream widens the precision once, to 18 digits
    (`stream_typed`), where the exact path reads all values first and takes the least."""
    return f"decimal(_, {t.scale})" if pa.types.is_decimal(t) else str(t)


def _same(text: str, tmp: Path) -> pa.Table:
    fast = _written(repr_batches(text, batch_rows=9), tmp / "fast.parquet")
    exact = _written(exact_batches(text), tmp / "exact.parquet")
    assert [_kind(t) for t in fast.schema.types] == [_kind(t) for t in exact.schema.types]
    got, want = fast.to_pylist(), exact.to_pylist()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a == b, [(k, a[k], b[k]) for k in a if a[k] != b[k]]
    return fast


def _row(i: int) -> dict:
    return {"id": i, "big": 10**15 + i, "neg": -i, "x": [0.5, -0.0, 1e-05, 1.5e300, -2.0][i % 5],
            "maybe": None if i % 4 == 0 else i * 2, "ok": i % 3 == 0, "name": f"n {i}, {{x}}: ()",
            "empty": "", "iso": f"2024-03-{i % 28 + 1:02d}", "price": Decimal(f"{i}.{i % 100:02d}"),
            "u": uuid.UUID(int=i), "day": dt.date(2024, 1 + i % 12, 1 + i % 28),
            "ts": dt.datetime(2024, 1, 1, i % 24, i % 60, i % 60, (i * 7919) % 1_000_000 if i % 5 else 0),
            "utc": dt.datetime(2023, 6, 1, 12, 0, i % 60, tzinfo=UTC), "at": dt.time(i % 24, 30, i % 60),
            "none": None}


def test_every_value_kind_of_a_query_row(read_by_columns: dict[str, int], tmp_path: Path) -> None:
    table = _same(repr([_row(i) for i in range(300)]), tmp_path)
    assert read_by_columns["read"] > 20 and read_by_columns["left"] == 0
    types = dict(zip(table.column_names, map(str, table.schema.types)))
    assert types["day"] == "date32[day]" and types["utc"] == "timestamp[us, tz=UTC]" and types["iso"] == "date32[day]"
    assert types["price"].startswith("decimal128") and types["ok"] == "bool" and types["big"] == "int64"


@pytest.mark.parametrize("change", ["string_none", "extra_key", "nested", "huge_int", "other_order", "quote"])
def test_rows_that_do_not_fit_keep_every_value(read_by_columns: dict[str, int], change: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row(i) for i in range(200)]
    late = rows[150]
    if change == "string_none":  # in every other row: chunks of several rows mix both layouts
        monkeypatch.setattr(pyarrow_csv_engine, "CHUNK_BYTES", 2000)
        for i in range(150, 170, 2):
            rows[i]["name"] = None
    elif change == "extra_key":
        late["more"] = 1
    elif change == "nested":
        late["maybe"] = [1, 2]
    elif change == "huge_int":
        late["big"] = 2**70
    elif change == "other_order":
        rows[150] = dict(reversed(list(late.items())))
    else:
        late["name"] = "it's"
    text = repr(rows)
    if change in ("nested", "other_order", "extra_key", "quote"):
        batches = list(repr_batches(text, batch_rows=9))
        assert sum(b.num_rows for b in batches) == 200
        values = [r["id"] for b in batches for r in b.to_pylist()]
        assert values == list(range(200))
        return
    _same(text, tmp_path)
    assert read_by_columns["left"] >= 1


def test_a_dict_of_lists_of_every_kind(read_by_columns: dict[str, int], tmp_path: Path) -> None:
    rows = [_row(i) for i in range(400)]
    cols = {k: [r[k] for r in rows] for k in rows[0] if k not in ("x",)}
    cols["x"] = [0.25 * i for i in range(400)]
    _same(repr(cols), tmp_path)
    assert read_by_columns["read"] > 30


def test_a_dict_of_lists_with_nones_among_strings_and_calls(read_by_columns: dict[str, int], tmp_path: Path) -> None:
    cols = {"s": [None if i % 7 == 0 else f"s{i}" for i in range(300)],
            "d": [None if i % 5 == 0 else dt.date(2020, 1, 1 + i % 28) for i in range(300)],
            "p": [Decimal("1.5") if i % 2 else None for i in range(300)]}
    _same(repr(cols), tmp_path)
    assert read_by_columns["left"] >= 1


def test_values_that_only_look_like_numbers_stay_exact() -> None:
    assert repr_columns.list_column("1, 2, 0x10") is None
    assert repr_columns.list_column("1.5, NaN") is None
    assert repr_columns.list_column("True, 1") is None
    assert repr_columns.list_column("datetime.datetime(2024, 1, 1, 0, 0, tzinfo=zoneinfo.ZoneInfo(key='X'))") is None
    assert repr_columns.list_column("99999999999999999999, 1") is None
    assert repr_columns.list_column("1, 2, None").to_pylist() == [1, 2, None]
    floats = repr_columns.list_column("1.5, inf, -inf, nan, None").to_pylist()  # repr(float("inf")) ...
    assert floats[:3] == [1.5, math.inf, -math.inf] and math.isnan(floats[3]) and floats[4] is None
    assert repr_columns.columns("{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'y'}", ["a", "b"]).to_pylist() == \
        [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert repr_columns.columns("{'a': 1, 'b': 'x'}, {'a': 2, 'c': 'y'}", ["a", "b"]) is None
    assert repr_columns.columns("{'a': 1, 'b': 'x'}, {'b': 'y', 'a': 2}", ["a", "b"]) is None


@pytest.mark.parametrize("text", [
    repr([(1, "it's", float("nan")), (2, "b", float("inf")), (3, "c", -float("inf"))]),  # the exact path
    repr([{"a": 1, "s": "it's", "x": float("nan")}, {"a": 2, "s": "b", "x": float("inf")},
          {"a": 3, "s": "c", "x": -float("inf")}]),
    repr({"a": [1, 2, 3], "s": ["it's", "b", "c"], "x": [float("nan"), float("inf"), -float("inf")]}),
    repr([(1, "a", float("nan")), (2, "b", float("inf")), (3, "c", -float("inf"))]),  # the fast paths
    repr({"a": [1, 2, 3], "s": ["a", "b", "c"], "x": [float("nan"), float("inf"), -float("inf")]}),
])
def test_nan_and_infinities_are_floats_on_every_path(text: str) -> None:
    """repr(float("nan")) is the bare name `nan` (pandas' missing values): a float, never a
    reason to keep the table as text."""
    from datadesk.offload.readers import parse_text

    stream = parse_text(text)
    assert stream is not None
    rows = [r for b in stream for r in b.to_pylist()]
    x = [r.get("x", r.get("col_3")) for r in rows]
    assert len(rows) == 3 and math.isnan(x[0]) and x[1:] == [math.inf, -math.inf]
