"""offload.readers (sniff_file, detect_text, file_batches) and the readers they pick: content sniffing
and raw data -> typed Arrow batches."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import openpyxl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.offload.readers.json import stdlib_engine
from datadesk.offload.readers import detect_text, file_batches, sniff_file
from datadesk.offload.readers.columns import records_to_batch, rows_to_batch, unique_names
from datadesk.offload.readers.csv.pyarrow_engine import csv_batches
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.json.stdlib_engine import json_batches


def _table(batches) -> pa.Table:
    batches = list(batches)
    return pa.Table.from_batches(batches) if len(batches) == 1 else pa.concat_tables(
        [pa.Table.from_batches([b]) for b in batches], promote_options="permissive")


# ----------------------------------------------------------------- detect_text

@pytest.mark.parametrize("text,kind", [
    ('  [{"a": 1}]', "json"),
    ('\n{"a": 1}\n{"a": 2}', "json"),
    ("a,b,c\n1,2,3\n4,5,6\n", "csv"),
    ('a,b\n"x, y",2\n"multi\nline",3\n', "csv"),
    ("a\tb\n1\t2\n", "tsv"),
    ("hello world\nthis is prose, with a comma\nno table here\n", "text"),
    ("single,line", "text"),
    ("", "text"),
])
def test_detect_text(text, kind):
    assert detect_text(text) == kind


def test_detect_text_reads_only_a_prefix():
    # A CSV head followed by megabytes of garbage: the verdict comes from the head.
    text = "a,b\n" + "1,2\n" * 30 + "x" * 5_000_000
    assert detect_text(text) == "csv"


# ------------------------------------------------------------------ conversion

def test_records_to_batch_types_and_missing_keys():
    rb = records_to_batch([
        {"i": 1, "f": 1.5, "b": True, "s": "x", "d": "2024-01-05", "t": "2024-01-05T10:00:00"},
        {"i": None, "f": 2, "z": "2024-01-05T10:00:00.5Z"},
    ])
    assert rb.schema.names == ["i", "f", "b", "s", "d", "t", "z"]
    types = {f.name: f.type for f in rb.schema}
    assert types == {"i": pa.int64(), "f": pa.float64(), "b": pa.bool_(), "s": pa.string(),
                     "d": pa.date32(), "t": pa.timestamp("us"), "z": pa.timestamp("us", tz="UTC")}
    assert rb.column("s").to_pylist() == ["x", None]


@pytest.mark.parametrize("values,expected_type,expected", [
    ([1, "a", None], pa.string(), ["1", "a", None]),
    ([1, True], pa.string(), ["1", "true"]),
    ([1.5, True], pa.string(), ["1.5", "true"]),
    ([2**70, 1], pa.string(), [str(2**70), "1"]),
    ([{"a": 1}, 5], pa.string(), ['{"a": 1}', "5"]),
    ([{}, {}], pa.string(), ["{}", "{}"]),  # Parquet cannot store struct<>
    (["2024-01-05", "2024-02-30"], pa.string(), ["2024-01-05", "2024-02-30"]),
    (["2024-01-05T10:00:00Z", "2024-01-05T10:00:00"], pa.string(), None),  # zoned + naive
    (["2024-01-05", "not a date"], pa.string(), None),
    ([None, None], pa.null(), [None, None]),
    ([1, 2.5], pa.float64(), [1.0, 2.5]),
    ([[1, 2], [3]], pa.list_(pa.int64()), [[1, 2], [3]]),
])
def test_column_inference_never_loses_values(values, expected_type, expected):
    rb = rows_to_batch(["c"], [[v] for v in values])
    assert rb.num_rows == len(values)
    assert rb.schema.field("c").type == expected_type
    if expected is not None:
        assert rb.column("c").to_pylist() == expected


def test_unique_names():
    assert unique_names(["col", "col", "", None, "col_2", " x "]) == ["col", "col_2", "column_3", "column_4",
                                                                    "col_2_2", "x"]
    rb = rows_to_batch(["a", "a", ""], [[1, 2, 3], [4]])
    assert rb.schema.names == ["a", "a_2", "column_3"]
    assert rb.column("column_3").to_pylist() == [3, None]
    with pytest.raises(TabularParseError, match="row 1 has 2 values but there are 1 columns"):
        rows_to_batch(["a"], [[1, 2]])


# ------------------------------------------------------------------------ JSON

def test_array_of_objects_ragged_across_batches():
    recs = [{"a": i} if i % 2 else {"a": i, "b": f"s{i}"} for i in range(10)]
    batches = list(json_batches(json.dumps(recs), batch_rows=3))
    assert [b.num_rows for b in batches] == [3, 3, 3, 1]
    assert sum(b.num_rows for b in batches) == 10
    assert batches[-1].schema.names == ["a"]  # the last batch simply lacks "b"


def test_five_hundred_columns():
    recs = [{f"c{j}": i * j for j in range(500)} for i in range(20)]
    (rb,) = json_batches(json.dumps(recs))
    assert rb.num_columns == 500 and rb.num_rows == 20
    assert rb.column("c499").to_pylist()[3] == 3 * 499


def _nested(depth: int):
    value: object = {"leaf": 1}
    for i in range(depth):
        value = {"k": value, "l": [i]}
    return value


def test_deeply_nested_json(tmp_path: Path):
    (shallow,) = json_batches(json.dumps([{"x": _nested(5)}]))
    assert pa.types.is_struct(shallow.schema.field("x").type)
    # Past Parquet's depth limit the value is kept as JSON text: still readable.
    (deep,) = json_batches(json.dumps([{"x": _nested(60)}, {"x": None}]))
    assert deep.schema.field("x").type == pa.string()
    assert json.loads(deep.column("x")[0].as_py()) == _nested(60)
    pq.write_table(pa.Table.from_batches([deep]), tmp_path / "d.parquet")
    assert pq.read_table(tmp_path / "d.parquet").num_rows == 2


@pytest.mark.parametrize("doc", [
    {"columns": ["a", "b"], "rows": [[1, "x"], [2, "y"], [3]]},
    {"columns": ["a", "b"], "types": ["int", "str"], "data": [[1, "x"], [2, "y"], [3, None]]},
    {"data": [[1, "x"], [2, "y"], [3, None]], "columns": [{"name": "a"}, {"name": "b"}]},
])
def test_columns_and_rows(doc):
    batches = list(json_batches(json.dumps(doc), batch_rows=2))
    table = _table(batches)
    assert table.column_names == ["a", "b"]
    assert table.column("a").to_pylist() == [1, 2, 3]
    assert table.column("b").to_pylist() == ["x", "y", None]


def test_columns_and_rows_without_rows_keeps_columns():
    (rb,) = json_batches('{"columns": ["a", "b"], "rows": []}')
    assert rb.num_rows == 0 and rb.schema.names == ["a", "b"]


@pytest.mark.parametrize("key", ["items", "results"])
def test_single_key_wrapper(key):
    text = json.dumps({key: [{"a": 1}, {"a": 2, "b": True}]})
    table = _table(json_batches(text))
    assert table.num_rows == 2 and table.column("b").to_pylist() == [None, True]


def test_ndjson():
    text = '{"a": 1, "n": {"x": [1, 2]}}\n\n{"a": 2}\n{"b": "z"}\n'
    table = _table(json_batches(text, batch_rows=2))
    assert table.num_rows == 3
    assert table.column("a").to_pylist() == [1, 2, None]
    with pytest.raises(TabularParseError, match="line 2"):
        list(json_batches('{"a": 1}\n[1, 2]\n'))
    with pytest.raises(TabularParseError, match="line 3"):
        list(json_batches('{"a": 1}\n{"a": 2}\n{"a": oops}\n'))


@pytest.mark.parametrize("text,match", [
    ("[this is not json", r"invalid JSON at line 1 column 2"),
    ('[{"a": 1},\n {"a": 2},]', r"invalid JSON at line 2"),
    ('[{"a": 1}] trailing', r"extra data"),
    ("[1, 2, 3]", r"numbers, not objects: not tabular"),
    ('["a", "b"]', r"strings, not objects"),
    ("[[1, 2], [3, 4]]", r"arrays, not objects"),
    ('[{"a": 1}, 7]', r"element 1 .* is a number"),
    ('{"items": [1, 2]}', r"numbers, not objects"),
    ('{"a": 1, "b": [{"x": 1}]}', r"not tabular.*found keys: a, b"),
    ('{"a": 1}', r"not tabular"),
    ("42", r"single number, not a table"),
    ('"text"', r"single string"),
    ("   ", r"empty"),
    ('{"a": [1, 2}', r"invalid JSON"),
])
def test_json_errors(text, match):
    with pytest.raises(TabularParseError, match=match):
        list(json_batches(text))


def test_json_array_is_streamed(monkeypatch):
    """The first batch comes out after one bounded run (~1 MB) is decoded, not the whole array."""
    decoded = {"chars": 0, "calls": 0}
    real = stdlib_engine.msgspec.json.decode

    def counting(buf, *a, **kw):
        decoded["chars"] += len(buf)
        decoded["calls"] += 1
        return real(buf, *a, **kw)

    monkeypatch.setattr(stdlib_engine.msgspec.json, "decode", counting)
    text = "[" + ",".join('{"i": %d, "s": "v%d"}' % (i, i) for i in range(200_000)) + "]"
    assert len(text) > 3 * stdlib_engine.FAST_CHUNK_CHARS
    gen = json_batches(text, batch_rows=1000)
    first = next(gen)
    assert first.num_rows == 1000
    assert decoded["chars"] <= stdlib_engine.FAST_CHUNK_CHARS + 2  # one run, not the whole text
    rest = sum(b.num_rows for b in gen)
    assert first.num_rows + rest == 200_000
    assert decoded["calls"] >= 3 and decoded["chars"] <= len(text) + 2 * decoded["calls"]


def test_fast_runs_never_split_inside_strings():
    """'},' inside string values must not become a cut: values come back exactly."""
    tricky = [{"i": i, "s": 'a"},{"b' * (i % 3), "t": "},"} for i in range(60_000)]
    text = json.dumps(tricky)
    got = [r for b in json_batches(text, batch_rows=7_000) for r in b.to_pylist()]
    assert [(r["i"], r["s"], r["t"]) for r in got] == [(r["i"], r["s"], r["t"]) for r in tricky]


# ------------------------------------------------------------------------- CSV

def test_csv_types_and_str_input():
    rb = _table(csv_batches("a,b,c,d\n1,x,2.5,2024-01-05\n2,,3,2024-01-06\n"))
    assert [f.type for f in rb.schema] == [pa.int64(), pa.string(), pa.float64(), pa.date32()]
    assert rb.num_rows == 2


def test_csv_type_conflict_after_first_block():
    # 200k ints (> one 1 MiB block) then a string: pyarrow fails mid-stream;
    # the reader restarts with the column as string and skips what it gave.
    lines = ["n,v"] + [f"{i},{i % 10}" for i in range(200_000)] + ["oops,1", "7,2"]
    data = ("\n".join(lines) + "\n").encode()
    batches = list(csv_batches(data))
    total = sum(b.num_rows for b in batches)
    assert total == 200_002
    assert batches[0].schema.field("n").type == pa.int64()
    assert batches[-1].schema.field("n").type == pa.string()
    values = [v for b in batches for v in b.column("n").to_pylist()]
    assert values[:3] == [0, 1, 2] and values[-2:] == ["oops", "7"]
    assert [str(v) for v in values[:200_000]] == [str(i) for i in range(200_000)]
    # Small blocks: several restarts' worth of skipping, still exact.
    small = list(csv_batches(data[:200_000] + b"x,y\n", block_size=16_384))
    expected_rows = data[:200_000].count(b"\n")
    assert sum(b.num_rows for b in small) == expected_rows


def test_csv_record_longer_than_a_block():
    data = b'a,b\n1,"' + b"x\n" * 500 + b'"\n2,short\n'
    table = _table(csv_batches(data, block_size=64))
    assert table.column("a").to_pylist() == [1, 2]
    assert table.column("b")[0].as_py() == "x\n" * 500


def test_csv_bad_row_names_the_line():
    data = b'a,b\n1,"two\nlines"\n3,4\n5,6,7\n8,9\n'
    with pytest.raises(TabularParseError, match=r"CSV line 5: expected 2 columns, got 3: 5,6,7"):
        list(csv_batches(data))


def test_csv_not_utf8_names_the_byte(tmp_path: Path):
    data = "a,b\n1,caf\xe9\n".encode("latin-1")
    with pytest.raises(TabularParseError, match=r"not UTF-8 at byte 9 \(line 2, byte 0xE9\)"):
        list(csv_batches(data))
    p = tmp_path / "latin.csv"
    p.write_bytes(b"a,b\n" + b"1,x\n" * 50_000 + b"2,caf\xe9\n")
    with pytest.raises(TabularParseError, match=r"not UTF-8 at byte 200009 \(line 50002"):
        list(csv_batches(p, block_size=65_536))
    with pytest.raises(TabularParseError, match="UTF-16"):
        list(csv_batches("a,b\n1,2\n".encode("utf-16")))


def test_csv_header_names_and_header_only():
    (rb,) = csv_batches(b"a,a,\n1,2,3\n")
    assert rb.schema.names == ["a", "a_2", "column_3"]
    (empty,) = csv_batches(b"x,y\n")
    assert empty.num_rows == 0 and empty.schema.names == ["x", "y"]
    with pytest.raises(TabularParseError, match="empty"):
        list(csv_batches(b""))


# ----------------------------------------------------------------------- Excel

def _workbook(path: Path) -> None:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sales"
    ws.append([None])  # a blank first row: the header is the first non-empty one
    ws.append(["id", "amount", "ok", "when", "name", "id"])
    ws.append([1, 2.5, True, dt.datetime(2024, 1, 5, 10, 30), "a", 10])
    ws.append([2, 3, False, dt.datetime(2024, 1, 6), None, 11])
    ws.append([])
    ws.append([3, None, None, None, "c", 12, "extra"])
    other = wb.create_sheet("Other")
    other.append(["k"])
    other.append(["v"])
    wb.create_sheet("Blank")
    wb.save(path)


def test_xlsx(tmp_path: Path):
    path = tmp_path / "book.bin"  # the name does not matter
    _workbook(path)
    assert sniff_file(path) == "xlsx"
    schema, batches = file_batches(path, "xlsx", batch_rows=2)
    assert schema is None
    table = _table(batches)
    assert table.num_rows == 3
    assert table.column_names == ["id", "amount", "ok", "when", "name", "id_2", "column_7"]
    assert table.schema.field("id").type == pa.int64()
    assert table.schema.field("amount").type == pa.float64()
    assert table.schema.field("ok").type == pa.bool_()
    assert pa.types.is_timestamp(table.schema.field("when").type)
    assert table.column("when")[0].as_py() == dt.datetime(2024, 1, 5, 10, 30)
    assert table.column("column_7").to_pylist() == [None, None, "extra"]
    _, other = file_batches(path, "xlsx", sheet="Other")
    assert _table(other).to_pylist() == [{"k": "v"}]
    with pytest.raises(TabularParseError, match="sheet 'Blank' is empty"):
        file_batches(path, "xlsx", sheet="Blank")
    with pytest.raises(TabularParseError, match="no sheet named 'Nope'; sheets: Sales, Other, Blank"):
        file_batches(path, "xlsx", sheet="Nope")


# ------------------------------------------------------------- sniff / files

def _write_samples(d: Path) -> dict[str, Path]:
    files = {}
    files["parquet"] = d / "a"
    pq.write_table(pa.table({"x": [1, 2]}), files["parquet"])
    files["xlsx"] = d / "b"
    wb = openpyxl.Workbook()
    wb.active.append(["h"])
    wb.active.append([1])
    wb.save(files["xlsx"])
    blobs = {
        "png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 30,
        "jpeg": b"\xff\xd8\xff\xe0" + b"\x00" * 30,
        "gif": b"GIF89a" + b"\x00" * 30,
        "webp": b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 20,
        "xls": b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 30,
        "json": b'\xef\xbb\xbf[{"a": 1}]',
        "csv": b"a,b\n1,2\n3,4\n",
        "tsv": b"a\tb\n1\t2\n",
        "csv_latin1": "name,city\nJosé,Zürich\nAnaïs,Genève\n".encode("latin-1"),
        "unknown": bytes(range(256)) * 8,
    }
    for kind, blob in blobs.items():
        files[kind] = d / f"f_{kind}.dat"
        files[kind].write_bytes(blob)
    files["zip"] = d / "z"
    import zipfile
    with zipfile.ZipFile(files["zip"], "w") as zf:
        zf.writestr("hello.txt", "hi")
    files["prose"] = d / "p"
    files["prose"].write_text("Just some words.\nNothing tabular.\n")
    return files


def test_sniff_file(tmp_path: Path):
    files = _write_samples(tmp_path)
    for kind, path in files.items():
        expected = {"zip": "unknown", "prose": "unknown", "csv_latin1": "csv"}.get(kind, kind)
        assert sniff_file(path) == expected, kind


def test_file_batches_formats(tmp_path: Path):
    files = _write_samples(tmp_path)
    schema, batches = file_batches(files["parquet"], "parquet")
    assert schema.names == ["x"] and _table(batches).column("x").to_pylist() == [1, 2]
    assert _table(file_batches(files["csv"], "csv")[1]).num_rows == 2
    assert _table(file_batches(files["tsv"], "tsv")[1]).column_names == ["a", "b"]
    assert _table(file_batches(files["json"], "json")[1]).to_pylist() == [{"a": 1}]
    with pytest.raises(TabularParseError, match=r"legacy \.xls is not supported; save as \.xlsx"):
        file_batches(files["xls"], "xls")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'[{"a": "caf\xe9"}]')
    with pytest.raises(TabularParseError, match=r"not UTF-8 at byte 11 \(line 1, byte 0xE9\)"):
        file_batches(bad, "json")
    with pytest.raises(TabularParseError, match="not a tabular format"):
        file_batches(files["png"], "png")


def test_csv_from_path_and_bytesio_equivalent(tmp_path: Path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    assert _table(csv_batches(p)).equals(_table(csv_batches(io.BytesIO(p.read_bytes()).getvalue())))


@pytest.mark.parametrize("text", ["[]", '{"items": []}', " [ ] "])
def test_empty_json_arrays_are_empty_results_not_errors(text):
    assert list(json_batches(text)) == []
