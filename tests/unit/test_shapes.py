"""Every tabular shape of issue 17 becomes a typed table with the exact rows and sums.

Fixtures come from tests/fixtures/shapes.py (the same texts the benchmark times); each is
parsed by `offload.readers.parse_text`, written through the real ParquetSink, read back and
checked: row count, sum of ids, of amounts (exact: multiples of 0.25), of decimal prices
where the shape carries decimals, the count of `paid`, dates and zoned timestamps.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.fixtures.shapes import POSITIONAL, SHAPES, TRUNCATED, expected
from datadesk.offload.readers import parse_text
from datadesk.offload.source_cut import judge
from datadesk.offload.parquet.writer import ParquetSink

N = 2_500  # more than one chunk of the text-table readers at small batch sizes below
NAMES = ["id", "amount", "price", "name", "day", "ts", "paid"]


def written(text: str, tmp_path: Path, batch_rows: int = 1_000) -> tuple[pa.Table, object]:
    stream = parse_text(text, batch_rows=batch_rows)
    assert stream is not None, "not recognised as a table"
    path = tmp_path / "out.parquet"
    with ParquetSink(path, 1 << 30) as sink:
        for batch in stream:
            sink.add(batch)
        sink.close()
    return pq.read_table(path), stream


def column(table: pa.Table, shape: str, name: str) -> pa.ChunkedArray:
    prefix = POSITIONAL.get(shape)
    return table[f"{prefix}{NAMES.index(name) + 1}" if prefix else name]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_exact_rows_sums_and_types(shape: str, tmp_path: Path) -> None:
    want = expected(N)
    table, stream = written(SHAPES[shape](N), tmp_path)
    assert table.num_rows == want["rows"]
    if shape not in POSITIONAL:  # the source's column order
        assert [n for n in table.column_names if n in NAMES] == NAMES, table.column_names
    col = lambda name: column(table, shape, name)  # noqa: E731
    assert pa.types.is_integer(col("id").type) and pc.sum(col("id")).as_py() == want["sum_id"]
    assert pa.types.is_floating(col("amount").type) and pc.sum(col("amount")).as_py() == want["sum_amount"]
    price = col("price")
    if pa.types.is_decimal(price.type):
        assert pc.sum(price).as_py() == want["sum_price"]
    else:  # a JSON string or a text cell: the same digits, exactly
        values = price.to_pylist()
        assert sum((Decimal(str(v)) for v in values), Decimal(0)) == want["sum_price"]
    assert col("paid").type == pa.bool_() and pc.sum(col("paid").cast(pa.int64())).as_py() == want["paid"]
    assert col("day").type == pa.date32() and pc.max(col("day")).as_py() == want["max_day"]
    ts = col("ts")
    assert pa.types.is_timestamp(ts.type) and ts.type.tz == "UTC", ts.type
    assert pc.max(ts).as_py() == want["max_ts"]
    assert stream.facts.shape and not judge(stream.facts, table.num_rows).partial


@pytest.mark.parametrize("shape", ["repr_tuples", "repr_dicts", "repr_dict_lists", "json_columns_rows"])
def test_decimals_stay_decimal(shape: str, tmp_path: Path) -> None:
    table, _ = written(SHAPES[shape](N), tmp_path)
    price = column(table, shape, "price")
    assert pa.types.is_decimal(price.type) and pc.sum(price).as_py() == expected(N)["sum_price"]


@pytest.mark.parametrize("shape", sorted(TRUNCATED))
def test_truncated_by_the_source_is_said_in_its_own_words(shape: str, tmp_path: Path) -> None:
    table, stream = written(TRUNCATED[shape](N, truncated=True), tmp_path)
    assert table.num_rows == N
    verdict = judge(stream.facts, table.num_rows)
    assert verdict.partial and verdict.words and verdict.how
    said = " ".join(verdict.words)
    assert any(w in said for w in ("truncated", "has_more", "more rows", "limited", "count says")), said
    full = judge(parse_text(SHAPES[shape](N)).facts, N)
    assert not full.partial


def test_envelope_metadata_kept_and_cursor_named() -> None:
    stream = parse_text(SHAPES["json_envelope"](10) if False else TRUNCATED["json_envelope"](10, truncated=True))
    assert stream.facts.envelope == {"request_id": "r-42", "took_ms": 17, "has_more": True, "next_cursor": "c2",
                                     "total": 30}
    verdict = judge(stream.facts, 10)
    assert "next_cursor" in " ".join(verdict.words) and "c2" in verdict.how


def test_cap_from_the_tool_schema_marks_partial() -> None:
    from datadesk.domain.sources import SourceHints

    text = SHAPES["json_records"](100)
    stream = parse_text(text, SourceHints(caps={"limit": 100}))
    v = judge(stream.facts, 100, arguments="{}")
    assert v.partial and "`limit`" in v.how and "100" in " ".join(v.words)
    assert not judge(stream.facts, 100, arguments='{"limit": 500}').partial


@pytest.mark.parametrize("text", [
    "just some prose, nothing tabular", "[1, 2, 3]", '{"status": "ok"}', "", "| not | a table",
    "[(1, os.system('x'))]",
    "Dear team,\n" + "\n".join(f"Item {i}, as discussed yesterday. We agreed, finally." for i in range(30)),
    "# A page\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n" + "\n".join(f"Paragraph {i} of the article." for i in range(40)),
])
def test_not_a_table(text: str) -> None:
    assert parse_text(text) is None


def test_repr_is_never_evaluated_and_refusals_name_the_value() -> None:
    from datadesk.offload.readers.errors import TabularParseError
    from datadesk.offload.readers import repr_batches

    with pytest.raises(TabularParseError, match="unsupported value"):
        list(repr_batches("[{'a': __import__('os').system('true')}]"))
    for text in ("[(1, foo), (2, bar)]", "[{'a': foo}, {'a': bar}]"):
        with pytest.raises(TabularParseError, match="unsupported value"):
            list(repr_batches(text))


def test_mixed_zoned_and_naive_or_bad_dates_stay_text() -> None:
    text = '[{"t": "2024-01-01T00:00:00Z", "d": "2024-02-30"}, {"t": "2024-01-01T00:00:00", "d": "2024-02-01"}]'
    table = pa.Table.from_batches(list(parse_text(text)))
    assert table.schema.field("t").type == pa.string() and table.schema.field("d").type == pa.string()


def test_text_cells_with_leading_zeros_stay_text() -> None:
    table = pa.Table.from_batches(list(parse_text("| zip | n |\n|---|---|\n| 00123 | 1 |\n| 04000 | 2 |\n")))
    assert table["zip"].to_pylist() == ["00123", "04000"] and table["n"].type == pa.int64()


def test_big_integers_are_not_rounded() -> None:
    big = 2 ** 62 + 1
    table = pa.Table.from_batches(list(parse_text(f'[{{"a": {big}}}, {{"a": 1}}]')))
    assert table["a"].to_pylist() == [big, 1]


def test_ragged_text_table_names_the_line() -> None:
    from datadesk.offload.readers.errors import TabularParseError

    stream = parse_text("| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n")
    assert stream is not None
    bad = "| a | b |\n|---|---|\n| 1 | 2 |\n" + "| 5 | 6 |\n" * 3 + "| 3 |\n"
    with pytest.raises(TabularParseError, match="line 7 has 1 cells"):
        list(parse_text(bad, batch_rows=2) or [])


def test_python_repr_datetimes_with_utc_and_naive() -> None:
    text = "[(datetime.datetime(2024, 1, 1, 10, 0, 5, 120, tzinfo=datetime.timezone.utc), datetime.time(10, 30))]"
    table = pa.Table.from_batches(list(parse_text(text)))
    assert table["col_1"].to_pylist() == [dt.datetime(2024, 1, 1, 10, 0, 5, 120, tzinfo=dt.timezone.utc)]
    assert table["col_2"].to_pylist() == [dt.time(10, 30)]


@pytest.mark.parametrize("text", [
    "[(1, '00123', 'True', 'None', '', None), (2, '00456', 'False', 'x', 'y', 'z')]",
    "[{'a': 1, 'b': '00123', 'c': 'True', 'd': 'None', 'e': '', 'f': None}, "
    "{'a': 2, 'b': '00456', 'c': 'False', 'd': 'x', 'e': 'y', 'f': 'z'}]",
])
def test_repr_strings_stay_strings_whatever_they_look_like(text: str) -> None:
    table = pa.Table.from_batches(list(parse_text(text)))
    rows = [list(r.values()) for r in table.to_pylist()]
    assert rows == [[1, "00123", "True", "None", "", None], [2, "00456", "False", "x", "y", "z"]]


def test_repr_fast_paths_match_the_exact_path() -> None:
    from datadesk.offload.readers import repr_batches
    from datadesk.offload.readers.pyrepr.exact import exact_batches

    for shape in ("repr_tuples", "repr_dicts"):
        text = SHAPES[shape](300)
        fast = pa.Table.from_batches(list(repr_batches(text)))
        exact = pa.Table.from_batches(list(exact_batches(text)))
        assert fast.to_pylist() == exact.to_pylist(), shape


@pytest.mark.parametrize("text,names,first", [
    ("((1, 'a'), (2, 'b'))", ["col_1", "col_2"], {"col_1": 1, "col_2": "a"}),
    ("[[1, \"it's\"], [2, 'b']]", ["col_1", "col_2"], {"col_1": 1, "col_2": "it's"}),
    ("[(UUID('12345678-1234-5678-1234-567812345678'), 1), (UUID('12345678-1234-5678-1234-567812345679'), 2)]",
     ["col_1", "col_2"], {"col_1": "12345678-1234-5678-1234-567812345678", "col_2": 1}),
    ("{'n': [1, 2], 'p': [Decimal('1.25'), Decimal('2.5')]}", ["n", "p"], {"n": 1, "p": Decimal("1.25")}),
    ("a | b\n--|--\n1 | x\n2 | y\n", ["a", "b"], {"a": 1, "b": "x"}),
    ('{"a": 1}\n\n{"a": 2}\n', ["a"], {"a": 1}),
    ('[["name", "city"], ["ann", "oslo"], ["bob", "rome"]]', ["name", "city"], {"name": "ann", "city": "oslo"}),
    ("name,city\nann,oslo\nbob,rome\n", ["name", "city"], {"name": "ann", "city": "oslo"}),
])
def test_more_shapes(text: str, names: list[str], first: dict) -> None:
    table = pa.Table.from_batches(list(parse_text(text)))
    assert table.column_names == names and table.num_rows == 2 and table.to_pylist()[0] == first
