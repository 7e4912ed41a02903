"""The one-pass pyarrow read of a JSON array of objects (`offload/readers/json/pieces.py`): every
separator form, values that look like separators, and whatever it cannot read exactly
going to the row-by-row path with no value changed."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from datadesk.offload.readers import json_rows
from datadesk.offload.readers.json import pyarrow_csv_engine
from datadesk.offload.readers.json.locate import locate


def _table(text: str) -> tuple[pa.Table, bool]:
    found = locate(text)
    fast = found.stream is not None
    return pa.concat_tables([pa.Table.from_batches([b]) for b in json_rows(found)],
                            promote_options="permissive"), fast


ROWS = [{"id": i, "x": i * 0.5, "name": f"n{i}", "day": "2024-01-02", "ts": "2024-01-01T00:00:00Z",
         "ok": i % 2 == 0} for i in range(50)]


@pytest.mark.parametrize("text", [
    json.dumps(ROWS, separators=(",", ":")),
    json.dumps(ROWS),
    "[\n" + ",\n".join("\t" + json.dumps(r) for r in ROWS) + "\n]",
    "[\r\n" + ",\r\n".join(json.dumps(r) for r in ROWS) + "\r\n]\r\n",
])
def test_every_separator_form_is_read_in_one_pass(text: str) -> None:
    table, fast = _table(text)
    assert fast and table.num_rows == 50 and table.column_names == ["id", "x", "name", "day", "ts", "ok"]
    assert [str(t) for t in table.schema.types] == ["int64", "double", "string", "date32[day]",
                                                    "timestamp[us, tz=UTC]", "bool"]
    assert sum(table.column("id").to_pylist()) == sum(range(50)) and table.column("name")[7].as_py() == "n7"


def test_separators_inside_values_are_never_split() -> None:
    rows = [{"a": "x},{y", "b": [{"c": 1}, {"c": 2}]}, {"a": "}, {", "b": []}, {"a": "ünï}, {", "b": None}]
    table, _ = _table(json.dumps(rows))
    assert table.num_rows == 3
    assert table.column("a").to_pylist() == ["x},{y", "}, {", "ünï}, {"]
    assert table.column("b").to_pylist()[0] == [{"c": 1}, {"c": 2}]


def test_types_hold_over_the_whole_text_beyond_the_sample() -> None:
    n = 30_000  # over a MB: the sample is the first MB only
    rows = [{"id": i, "v": i, "pad": "p" * 30} for i in range(n)]
    rows[-1]["v"] = 2.5  # an integer column that turns float after the sample
    rows[-1]["late"] = "2024-03-04T05:06:07.123456+00:00"  # a field the sample never saw
    rows[-2]["big"] = 2 ** 60 + 1  # past 2^53: must not go through a double
    text = "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]"
    table, _ = _table(text)
    assert table.num_rows == n and sum(table.column("id").to_pylist()) == n * (n - 1) // 2
    assert table.column("v").to_pylist()[-1] == 2.5 and table.column("v").to_pylist()[3] == 3
    assert table.column("big").to_pylist()[-2] == 2 ** 60 + 1
    late = table.column("late").to_pylist()[-1]
    assert str(late) in ("2024-03-04 05:06:07.123456+00:00", "2024-03-04T05:06:07.123456+00:00")


def test_non_ascii_and_bytes_input() -> None:
    rows = [{"name": f"Zoë {i} 東京", "n": i} for i in range(100)]
    text = json.dumps(rows, ensure_ascii=False)
    for source in (text, text.encode("utf-8")):
        table, fast = _table(source)
        assert fast and table.column("name").to_pylist()[99] == "Zoë 99 東京"


def test_not_json_after_the_array_is_refused_as_before() -> None:
    from datadesk.offload.readers.errors import TabularParseError

    with pytest.raises(TabularParseError, match="invalid JSON"):
        locate('[{"a": 1}, {"a": 2}] and then some prose')



def test_a_missing_comma_between_objects_is_not_a_table() -> None:
    from datadesk.offload.readers.errors import TabularParseError

    for text in ('[{"a":1}{"a":2}]', '[{"a":1},{"a":2}{"a":3}]', '[\n{"a": 1},\n{"a": 2}\n{"a": 3}\n]'):
        with pytest.raises(TabularParseError, match="invalid JSON"):
            list(json_rows(locate(text)))


def test_separators_of_several_forms_are_read_exactly() -> None:
    text = '[{"a":1},{"a":2}, {"a":3},\n{"a":4}]'  # one form is rewritten; pyarrow refuses the others
    table, _ = _table(text)
    assert table.column("a").to_pylist() == [1, 2, 3, 4]


def test_a_stream_that_stops_mid_way_goes_on_exactly_from_that_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from datadesk.offload.readers.json import pieces

    monkeypatch.setattr(pieces, "PIECE_BYTES", 64 << 10)  # many pieces: the stream breaks at a later one
    n = 40_000
    rows = [{"id": i, "name": f"n{i}", "when": "2024-01-02"} for i in range(n)]
    rows[30_000]["name"] = 7  # a number where every earlier row had text
    rows[30_001]["extra"] = {"nested": [1, 2]}
    found = locate(json.dumps(rows))
    got = list(json_rows(found))
    assert found.stream.broke and 0 < found.stream.rows < 30_000
    table = pa.concat_tables([pa.Table.from_batches([b]) for b in got], promote_options="permissive")
    assert table.num_rows == n and table.column("id").to_pylist() == list(range(n))
    assert table.column("name").to_pylist()[29_999] == "n29999" and table.column("name").to_pylist()[30_000] == "7"
    assert table.column("extra").to_pylist()[30_001] == {"nested": [1, 2]}
    assert table.column("when").to_pylist()[5] == table.column("when").to_pylist()[n - 1]


def test_a_column_whose_type_moves_on_keeps_the_fast_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from datadesk.offload.readers.json import pieces

    monkeypatch.setattr(pieces, "PIECE_BYTES", 64 << 10)
    monkeypatch.setattr(pieces, "FIRST_BYTES", 64 << 10)
    rows = [{"id": i, "price": i if i < 20_000 else i + 0.5, "day": "2024-01-02"} for i in range(30_000)]
    found = locate(json.dumps(rows))
    got = list(json_rows(found))
    assert not found.stream.broke and found.stream.rows == 30_000
    types = {str(b.schema.field("price").type) for b in got}
    assert types == {"int64", "double"} and {str(b.schema.field("day").type) for b in got} == {"date32[day]"}
    prices = [v for b in got for v in b.column("price").to_pylist()]
    assert prices[19_999] == 19_999 and prices[20_000] == 20_000.5

def test_the_stream_holds_a_few_pieces_not_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from datadesk.offload.readers.json import pieces

    monkeypatch.setattr(pieces, "PIECE_BYTES", 256 << 10)
    rows = [{"id": i, "pad": "x" * 40} for i in range(60_000)]
    found = locate(json.dumps(rows))
    sizes = [b.num_rows for b in json_rows(found)]
    assert len(sizes) > 2 and max(sizes) < 60_000 and sum(sizes) == 60_000

# ------------------------------------------------------------ arrays of arrays (pyarrow_csv_engine)

def _fast_rows(text: str) -> bool:
    return pyarrow_csv_engine.arrays_table(locate(text)) is not None


ARRAYS = [[i, i * 0.5, f"n,{i}", "2024-01-02", i % 2 == 0, None if i % 5 else "null"] for i in range(40)]


@pytest.mark.parametrize("text,names", [
    (json.dumps(ARRAYS, separators=(",", ":")), [f"column_{i}" for i in range(1, 7)]),
    (json.dumps([list("abcdef")] + ARRAYS, separators=(",", ":")), list("abcdef")),
    ('{"columns": ["a","b","c","d","e","f"], "rows": ' + json.dumps(ARRAYS, separators=(",", ":")) + "}",
     list("abcdef")),
])
def test_flat_arrays_are_read_by_the_csv_reader(text: str, names: list[str]) -> None:
    assert _fast_rows(text)
    table, _ = _table(text)
    assert table.column_names == names and table.num_rows == 40
    assert [str(t) for t in table.schema.types] == ["int64", "double", "string", "date32[day]", "bool", "string"]
    assert table.column(2).to_pylist()[3] == "n,3" and table.column(5).to_pylist()[:2] == ["null", None]
    assert sum(table.column(0).to_pylist()) == sum(range(40))


@pytest.mark.parametrize("rows", [
    [[1, 'a "quoted" \\ \u00e9'], [2, "b"]],  # JSON escapes
    [[1, "x],[y"], [2, "z"]],  # a separator inside a string
    [[1, [2, 3]], [4, [5]]],  # nested arrays
    [[1, {"a": 2}], [3, {"b": 4}]],  # objects
    [[1, "a"], [2, 3]],  # a number where the sample had text
    [[1, "a"], [2.5, "b"]] * 150,  # a float after the sample's integers
])
def test_what_csv_cannot_read_exactly_keeps_every_value(rows: list) -> None:
    for text in (json.dumps(rows), json.dumps(rows, separators=(",", ":"))):
        table, _ = _table(text)
        assert table.num_rows == len(rows)
        got = table.to_pylist()
        assert [list(r.values())[0] for r in got] == [r[0] for r in rows]
        second = [list(r.values())[1] for r in got]
        if all(isinstance(r[1], str) for r in rows):
            assert second == [r[1] for r in rows]


def test_an_envelope_of_objects_keeps_its_metadata_and_the_source_types() -> None:
    rows = [{"id": i, "price": f"{i}.50"} for i in range(30)]
    text = json.dumps({"columns": ["id", "price"], "columnTypes": ["BIGINT", "DECIMAL(10,2)"], "data": rows,
                       "next_cursor": "c2"})
    found = locate(text)
    assert found.stream is not None and found.envelope["next_cursor"] == "c2" and found.path == "data"
    table = pa.Table.from_batches(list(json_rows(found)))
    assert str(table.schema.field("price").type) == "decimal128(10, 2)" and table.num_rows == 30
