"""offload/grid/csv_download.py: how each Arrow type is written to a CSV download, the formula rule on text
cells only, and the `formulas` parameter (issue 24)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.offload.grid.csv_download import CSVEncoder, CSVError, escape_formulas, keep_formulas, parquet_csv


def _write(table: pa.Table, keep: bool = False) -> list[list[str]]:
    enc = CSVEncoder(table.schema, keep)
    text = b"".join(enc.encode(b) for b in table.to_batches()).decode() or enc.header().decode()
    return list(csv.reader(io.StringIO(text, newline="")))


@pytest.mark.security
def test_every_formula_start_of_owasp_is_escaped_and_nothing_else() -> None:
    cells = ["=1", "+1", "-1", "@x", "\t1", "\r1", "a=1", " =1", "\n=1", "", "'=1", None]
    assert escape_formulas(pa.array(cells)).to_pylist() == [
        "'=1", "'+1", "'-1", "'@x", "'\t1", "'\r1", "a=1", " =1", "\n=1", "", "'=1", None]


@pytest.mark.security
def test_text_of_every_arrow_kind_is_escaped_typed_columns_never() -> None:
    n = 2
    table = pa.table({
        "s": pa.array(["=a", "b"]), "ls": pa.array(["+a", "b"], pa.large_string()),
        "sv": pa.array(["-a", "b"], pa.string_view()), "enum": pa.array(["@a", "b"]).dictionary_encode(),
        "i": pa.array([-1, 2], pa.int8()), "f": pa.array([-1.5, 2.0]),
        "d": pa.array([Decimal("-3.25")] * n, pa.decimal128(5, 2)), "b": pa.array([True, False]),
        "day": pa.array([dt.date(2024, 1, 2)] * n), "ts": pa.array([dt.datetime(2024, 1, 2, 3)] * n),
        "dur": pa.array([dt.timedelta(seconds=-5)] * n, pa.duration("s")),
    })
    rows = _write(table)
    assert rows[1] == ["'=a", "'+a", "'-a", "'@a", "-1", "-1.5", "-3.25", "true", "2024-01-02",
                       "2024-01-02 03:00:00", "-5"]  # timestamps in their shortest exact form
    assert _write(table, keep=True)[1][:4] == ["=a", "+a", "-a", "@a"]


def test_nested_binary_and_interval_columns_are_text_that_reads_back() -> None:
    table = pa.table({
        "st": pa.array([{"a": Decimal("1.50"), "t": dt.datetime(2024, 1, 1), "b": b"x"}],
                       pa.struct([("a", pa.decimal128(4, 2)), ("t", pa.timestamp("us")), ("b", pa.binary())])),
        "fixed": pa.array([[1, 2]], pa.list_(pa.int32(), 2)),
        "ll": pa.array([[["x"], []]], pa.large_list(pa.list_(pa.string()))),
        "floatkeys": pa.array([[(1.5, "a")]], pa.map_(pa.float64(), pa.string())),
        "hex": pa.array([b"\x00\xff"], pa.binary(2)),
        "iv": pa.array([pa.MonthDayNano([1, 2, 3_500_000_000])], pa.month_day_nano_interval()),
        "long": pa.array([pa.MonthDayNano([0, 0, 1_234_567_000_000_001])], pa.month_day_nano_interval()),
        "u": pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([7]), pa.array(["x"])]),
    })
    row = _write(table)[1]
    assert json.loads(row[0]) == {"a": 1.5, "t": "2024-01-01T00:00:00", "b": "eA=="}
    assert json.loads(row[1]) == [1, 2] and json.loads(row[2]) == [["x"], []]
    assert json.loads(row[3]) == {"1.5": "a"} and row[4] == "0x00ff" and row[5] == "P1M2DT3.5S"
    assert row[6] == "P0M0DT1234567.000000001S" and json.loads(row[7]) == 7


def test_the_formulas_parameter() -> None:
    assert keep_formulas([]) is False and keep_formulas([""]) is False and keep_formulas(["escape"]) is False
    assert keep_formulas(["keep"]) is True
    for bad in (["yes"], ["keep", "keep"], ["KEEP"]):
        with pytest.raises(ValueError, match="^formulas: .* is not keep or escape"):
            keep_formulas(bad)


def test_a_parquet_file_is_checked_before_the_stream(tmp_path) -> None:
    with pytest.raises(CSVError, match="artifact a1 could not be written as CSV"):
        parquet_csv(tmp_path / "missing.parquet", "artifact a1")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(CSVError, match="artifact a2 could not be written as CSV"):
        parquet_csv(tmp_path / "junk.parquet", "artifact a2")
    pq.write_table(pa.table({"=x": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    assert b"".join(parquet_csv(tmp_path / "empty.parquet", "e")) == b"\"'=x\"\n"
    assert b"".join(parquet_csv(tmp_path / "empty.parquet", "e", keep=True)) == b'"=x"\n'


def test_timestamps_and_times_in_their_shortest_exact_form() -> None:
    table = pa.table({
        "us": pa.array([dt.datetime(2024, 1, 13, 4), dt.datetime(2024, 1, 13, 4, 0, 0, 500_000), None]),
        "ns": pa.array([dt.datetime(2024, 1, 13, 4)] * 3, pa.timestamp("ns")),
        "tz": pa.array([dt.datetime(2024, 1, 13, 4), dt.datetime(2024, 1, 13, 4, 0, 0, 120), None],
                       pa.timestamp("us", tz="UTC")),
        "t": pa.array([dt.time(4, 0), dt.time(4, 0, 0, 10), None]),
    })
    rows = _write(table)
    assert rows[1] == ["2024-01-13 04:00:00", "2024-01-13 04:00:00", "2024-01-13 04:00:00Z", "04:00:00"]
    assert rows[2] == ["2024-01-13 04:00:00.5", "2024-01-13 04:00:00", "2024-01-13 04:00:00.00012Z", "04:00:00.00001"]
    assert rows[3][0] == rows[3][2] == rows[3][3] == ""
