"""Python reprs are converted and parsed chunk by chunk (issue 17: memory bounded by the chunk,
not the result): tiny chunks here, so every text below is cut in many places.

Each case is checked against the exact `ast` path on the same text: rows, order, values, types."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from tests.fixtures.shapes import SHAPES
from datadesk.offload.readers.pyrepr import pyarrow_csv_engine
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers import Rest, repr_batches
from datadesk.offload.readers.pyrepr.exact import exact_batches


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyarrow_csv_engine, "CHUNK_BYTES", 300)


def _both(text: str) -> tuple[pa.Table, pa.Table, int]:
    batches = list(repr_batches(text, batch_rows=7))
    assert len({b.schema for b in batches}) <= 2  # a decimal widened once at most (as the sink unifies)
    schema = pa.unify_schemas([b.schema for b in batches], promote_options="permissive")
    fast = pa.Table.from_batches([b.cast(schema) for b in batches])
    return fast, pa.Table.from_batches(list(exact_batches(text))), len(batches)


@pytest.mark.parametrize("shape", ["repr_tuples", "repr_dicts", "repr_dict_lists"])
def test_chunks_give_the_exact_rows_and_types(shape: str) -> None:
    text = SHAPES[shape](500)
    fast, exact, n = _both(text)
    assert n > 50 or shape == "repr_dict_lists"  # really cut in many chunks (columns: in pieces)
    assert fast.num_rows == 500 and fast.to_pylist() == exact.to_pylist()
    assert pa.types.is_decimal(fast.schema.types[2]) and str(fast.schema.types[5]) == "timestamp[us, tz=UTC]"


def test_row_breaks_inside_strings_are_not_cuts() -> None:
    rows = [f"({i}, 'a), (b {'x' * (i % 40)}', '}}, {{', Decimal('{i}.5'))" for i in range(200)]
    fast, exact, _ = _both("[" + ", ".join(rows) + "]\n")
    assert fast.num_rows == 200 and fast.to_pylist() == exact.to_pylist()
    assert fast["col_2"][3].as_py() == "a), (b xxx" and fast["col_4"][199].as_py() == Decimal("199.5")


def test_decimal_precision_grows_and_nulls_come_first() -> None:
    rows = [f"({i}, None, Decimal('{i % 10}.25'))" for i in range(100)]
    rows += [f"({i}, 'late {i}', Decimal('{i * 1000}.25'))" for i in range(100, 200)]
    text = "[" + ", ".join(rows) + "]"
    batches = list(repr_batches(text, batch_rows=7))
    decimals = list(dict.fromkeys(str(b.schema.types[2]) for b in batches))
    assert len(decimals) == 2 and decimals[1] == "decimal128(18, 2)", decimals  # widened once, not per chunk
    table = pa.Table.from_batches([b.cast(batches[-1].schema) for b in batches])
    assert table.num_rows == 200 and table["col_2"].null_count == 100
    assert sum(table["col_3"].to_pylist()) == sum(Decimal(f"{i % 10}.25") for i in range(100)) + \
        sum(Decimal(f"{i * 1000}.25") for i in range(100, 200))


def test_a_later_chunk_the_fast_path_refuses_is_read_exactly() -> None:
    rows = [f"({i}, 'n{i}')" for i in range(100)] + ["(100, 'it\\'s')"] + [f"({i}, 'n{i}')" for i in range(101, 150)]
    fast, exact, _ = _both("[" + ", ".join(rows) + "]")
    assert fast.num_rows == 150 and fast.to_pylist() == exact.to_pylist() and fast["col_2"][100].as_py() == "it's"
    dicts = [f"{{'a': {i}, 'b': 'x'}}" for i in range(100)] + [f"{{'a': {i}, 'c': 'y'}}" for i in range(100, 140)]
    batches = list(repr_batches("[" + ", ".join(dicts) + "]", batch_rows=7))
    assert sum(b.num_rows for b in batches) == 140 and "c" in batches[-1].schema.names


def test_ragged_rows_across_chunks_are_an_error() -> None:
    rows = [f"({i}, 'n{i}')" for i in range(100)] + [f"({i}, 'n{i}', 3)" for i in range(100, 150)]
    with pytest.raises(TabularParseError, match="ragged"):
        list(repr_batches("[" + ", ".join(rows) + "]"))


def test_dict_of_lists_in_pieces_with_commas_and_brackets_in_strings() -> None:
    text = repr({"a": list(range(300)), "s": [f"x, ({i}" if i % 2 else f"y), {i}" for i in range(300)],
                 "d": [Decimal(f"{i}.5") for i in range(300)], "n": [None] * 150 + [1.5] * 150})
    fast, exact, _ = _both(text)
    assert fast.num_rows == 300 and fast.to_pylist() == exact.to_pylist()
    assert fast["s"][1].as_py() == "x, (1" and fast["n"].null_count == 150
    with pytest.raises(TabularParseError, match="differ in length"):
        list(repr_batches("{'a': [1, 2], 'b': [1]}"))


def test_dates_datetimes_and_times_of_every_length_and_none() -> None:
    rows = [f"({i}, datetime.datetime(2024, 1, {i % 28 + 1}, 10, {i % 60}{', 5' if i % 3 else ''}"
            f"{', 120' if i % 5 == 0 and i % 3 else ''}), {'None' if i % 7 == 0 else 'datetime.date(2024, 2, 3)'}, "
            f"datetime.time(10, {i % 60}{', 7, 9' if i % 2 else ''}))" for i in range(120)]
    fast, exact, _ = _both("[" + ", ".join(rows) + "]")
    assert fast.num_rows == 120 and fast.to_pylist() == exact.to_pylist()
    assert [str(t) for t in fast.schema.types[1:]] == ["timestamp[us]", "date32[day]", "time64[us]"]
    assert fast["col_3"].null_count == 18


@pytest.mark.parametrize("outer,inner", [("[]", "[]"), ("()", "()"), ("()", "[]")])
def test_lists_of_lists_and_tuples_of_tuples_in_chunks(outer: str, inner: str) -> None:
    rows = [f"{inner[0]}{i}, 'n{i}', Decimal('{i}.25'), datetime.date(2024, 1, {i % 28 + 1}){inner[1]}"
            for i in range(200)]
    batches = list(repr_batches(outer[0] + ", ".join(rows) + outer[1], batch_rows=7))
    assert len(batches) > 20
    schema = pa.unify_schemas([b.schema for b in batches], promote_options="permissive")
    table = pa.Table.from_batches([b.cast(schema) for b in batches])
    assert table.column_names == ["col_1", "col_2", "col_3", "col_4"] and table.num_rows == 200
    assert table["col_1"].to_pylist() == list(range(200)) and table["col_2"][199].as_py() == "n199"
    assert sum(table["col_3"].to_pylist()) == sum(Decimal(f"{i}.25") for i in range(200))
    assert str(table.schema.field("col_4").type) == "date32[day]"


def test_keys_in_another_order_in_a_later_chunk_keep_their_values() -> None:
    dicts = [f"{{'a': {i}, 'b': 'x{i}'}}" for i in range(100)] + [f"{{'b': 'y{i}', 'a': {i}}}" for i in range(100, 140)]
    batches = list(repr_batches("[" + ", ".join(dicts) + "]", batch_rows=7))
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["a"] for r in rows] == list(range(140)) and rows[120]["b"] == "y120" and rows[5]["b"] == "x5"


@pytest.fixture
def tiny_json_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from datadesk.offload.readers.pyrepr import json_engine

    monkeypatch.setattr(json_engine, "CHUNK_CHARS", 200)


def test_quotes_and_backslashes_go_to_json_in_pieces(tiny_json_chunks: None) -> None:
    from datadesk.offload.readers.pyrepr import json_engine

    names = ["O'Brien), (x", 'say "hi"), (', "back\\slash ]", "plain"]
    rows = [repr((i, names[i % 4], Decimal(f"{i}.5"), [i, i + 1] if i % 2 else None)) for i in range(150)]
    text = "[" + ", ".join(rows) + "]"
    assert json_engine.piece_batches(text, 7, Rest.of("python repr", 7)) is not None
    fast, exact, n = _both(text)
    assert n > 20 and fast.num_rows == 150 and fast.to_pylist() == exact.to_pylist()
    assert fast["col_2"][0].as_py() == "O'Brien), (x" and fast["col_2"][1].as_py() == 'say "hi"), ('
    dicts = "[" + ", ".join(repr({"a": i, "b": names[i % 4]} if i < 100 else {"a": i, "c": 1})
                            for i in range(140)) + "]"
    batches = list(repr_batches(dicts, batch_rows=7))
    assert sum(b.num_rows for b in batches) == 140 and batches[0].column("b")[0].as_py() == "O'Brien), (x"
