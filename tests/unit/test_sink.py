"""offload.parquet.writer.ParquetSink: typed, atomic, ceiling-bounded Parquet writing."""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadesk.offload.parquet.schema import display_type

from datadesk.offload.parquet.writer import ParquetSink
from datadesk.offload.readers.csv.pyarrow_engine import csv_batches
from datadesk.offload.readers.json.stdlib_engine import json_batches

UTC = dt.timezone.utc


def _write(path: Path, batches, ceiling: int = 1 << 30, schema=None, **kw):
    with ParquetSink(path, ceiling, **kw) as sink:
        if schema is not None:
            sink.add_schema(schema)
        for b in batches:
            if not sink.add(b):
                break
        return sink.close()


def _leftovers(d: Path, final: str = "out.parquet") -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != final)


def test_type_fidelity_round_trip(tmp_path: Path):
    recs = [
        {"i": 1, "f": 1.25, "b": True, "s": "x", "d": "2024-01-05", "t": "2024-01-05T10:00:00",
         "tz": "2024-01-05T10:00:00+02:00", "n": None, "nested": {"a": [1, 2], "b": "q"}},
        {"i": -5, "f": None, "b": False, "s": None, "d": "2023-12-31", "t": "2024-01-06T11:30:15.25",
         "tz": "2024-01-05T23:59:59Z", "n": None, "nested": None},
    ]
    res = _write(tmp_path / "out.parquet", json_batches(json.dumps(recs)))
    table = pq.read_table(tmp_path / "out.parquet")
    types = {f.name: f.type for f in table.schema}
    assert types["i"] == pa.int64() and types["f"] == pa.float64() and types["b"] == pa.bool_()
    assert types["s"] == pa.string() and types["d"] == pa.date32() and types["n"] == pa.null()
    assert types["t"] == pa.timestamp("us") and types["tz"] == pa.timestamp("us", tz="UTC")
    rows = table.to_pylist()
    assert rows[0]["d"] == dt.date(2024, 1, 5) and rows[1]["t"] == dt.datetime(2024, 1, 6, 11, 30, 15, 250000)
    assert rows[0]["tz"] == dt.datetime(2024, 1, 5, 8, 0, tzinfo=UTC)
    assert rows[0]["nested"] == {"a": [1, 2], "b": "q"} and rows[1]["f"] is None
    assert (res.rows, res.columns, res.partial) == (2, 9, False)
    data = (tmp_path / "out.parquet").read_bytes()
    assert res.bytes == len(data) and res.sha256 == hashlib.sha256(data).hexdigest()
    assert res.schema.equals(table.schema)
    assert _leftovers(tmp_path) == []


def test_ragged_records_across_batches_unify(tmp_path: Path):
    # "v" is null, then int, then float, then str; "late" appears at the end;
    # "obj" widens its struct. Tiny batches and row groups force spills.
    recs = ([{"k": i, "v": None} for i in range(4)] + [{"k": i, "v": i} for i in range(4, 8)]
            + [{"k": 8, "v": 8.5}, {"k": 9, "v": "nine", "obj": {"a": 1}}]
            + [{"k": 10, "obj": {"b": "x"}, "late": True}])
    res = _write(tmp_path / "out.parquet", json_batches(json.dumps(recs), batch_rows=2), row_group_rows=2)
    table = pq.read_table(tmp_path / "out.parquet")
    assert res.rows == table.num_rows == 11
    assert table.column_names == ["k", "v", "obj", "late"]
    assert table.schema.field("v").type == pa.string()
    assert table.column("v").to_pylist() == [None] * 4 + ["4", "5", "6", "7", "8.5", "nine", None]
    assert table.column("k").to_pylist() == list(range(11))
    assert table.column("obj").to_pylist()[-2:] == [{"a": 1, "b": None}, {"a": None, "b": "x"}]
    assert table.column("late").to_pylist() == [None] * 10 + [True]
    assert _leftovers(tmp_path) == []


def test_widening_without_spill(tmp_path: Path):
    batches = [pa.record_batch({"a": pa.nulls(2)}), pa.record_batch({"a": [1, 2]}),
               pa.record_batch({"a": [1.5, None], "b": ["x", "y"]})]
    _write(tmp_path / "out.parquet", batches)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("a").type == pa.float64()
    assert table.column("a").to_pylist() == [None, None, 1.0, 2.0, 1.5, None]
    assert table.column("b").to_pylist() == [None] * 4 + ["x", "y"]


def test_csv_conflict_through_sink(tmp_path: Path):
    data = ("n\n" + "".join(f"{i}\n" for i in range(150_000)) + "tail\n").encode()
    res = _write(tmp_path / "out.parquet", csv_batches(data, block_size=65_536))
    table = pq.read_table(tmp_path / "out.parquet")
    assert res.rows == table.num_rows == 150_001
    assert table.schema.field("n").type == pa.string()
    assert table.column("n")[149_999].as_py() == "149999" and table.column("n")[-1].as_py() == "tail"


def test_byte_ceiling_is_partial_with_exact_rows(tmp_path: Path):
    def batches():
        for i in range(50):
            yield pa.record_batch({"id": pa.array(range(i * 5000, (i + 1) * 5000)),
                                   "s": pa.array([f"value {j * 7919 % 100003}" for j in range(5000)])})

    with ParquetSink(tmp_path / "out.parquet", 200_000, row_group_rows=5000) as sink:
        accepted = [sink.add(b) for b in batches()]
        res = sink.close()
    assert accepted[0] is True and accepted[-1] is False
    table = pq.read_table(tmp_path / "out.parquet")
    assert res.partial and res.rows == table.num_rows and 0 < res.rows < 250_000
    assert table.column("id").to_pylist() == list(range(res.rows))  # an exact prefix
    assert res.bytes == (tmp_path / "out.parquet").stat().st_size <= 200_000
    assert _leftovers(tmp_path) == []


def test_ceiling_smaller_than_first_batch(tmp_path: Path):
    codes = [(i * 0x9E3779B97F4A7C15) % (1 << 62) for i in range(100_000)]  # hash-like: they do not compress
    res = _write(tmp_path / "out.parquet", [pa.record_batch({"x": codes})], ceiling=20_000)
    assert res.partial and 0 < res.rows < 100_000
    assert pq.read_table(tmp_path / "out.parquet").num_rows == res.rows


def test_byte_ceiling_across_a_type_change(tmp_path: Path):
    def batches():
        for i in range(40):
            vals = range(i * 2000, (i + 1) * 2000)
            yield pa.record_batch({"v": [str(v) if i >= 5 else v for v in vals]})

    res = _write(tmp_path / "out.parquet", batches(), ceiling=60_000, row_group_rows=2000)
    table = pq.read_table(tmp_path / "out.parquet")
    assert res.partial and res.rows == table.num_rows > 10_000
    assert table.schema.field("v").type == pa.string()
    assert table.column("v").to_pylist() == [str(v) for v in range(res.rows)]
    assert _leftovers(tmp_path) == []


def test_empty_result_with_schema(tmp_path: Path):
    schema = pa.schema([("a", pa.int64()), ("b", pa.timestamp("us"))])
    res = _write(tmp_path / "out.parquet", [], schema=schema)
    table = pq.read_table(tmp_path / "out.parquet")
    assert res.rows == 0 and table.num_rows == 0 and table.schema.equals(schema)
    # Zero-row batches count as schema too.
    res = _write(tmp_path / "out.parquet", [pa.RecordBatch.from_pylist([], schema=schema)])
    assert res.rows == 0 and res.columns == 2


def test_nothing_at_all_raises_and_leaves_nothing(tmp_path: Path):
    with pytest.raises(ValueError, match="no batches and no schema"):
        _write(tmp_path / "out.parquet", [])
    assert list(tmp_path.iterdir()) == []


def test_exception_in_block_aborts(tmp_path: Path):
    with pytest.raises(RuntimeError):
        with ParquetSink(tmp_path / "out.parquet", 1 << 30, row_group_rows=1) as sink:
            sink.add(pa.record_batch({"a": [1, 2]}))
            sink.add(pa.record_batch({"a": ["x"]}))  # a spill part exists too
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with ParquetSink(tmp_path / "out.parquet", 1 << 30, row_group_rows=1) as sink:
        sink.add(pa.record_batch({"a": [1, 2]}))  # leaving without close() = abort
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="closed"):
        sink.add(pa.record_batch({"a": [1]}))


def test_disk_full_mid_way_leaves_nothing(tmp_path: Path, monkeypatch):
    real = pq.ParquetWriter.write_table
    calls = {"n": 0}

    def failing(self, table, row_group_size=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, table, row_group_size=row_group_size)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    sink = ParquetSink(tmp_path / "out.parquet", 1 << 30, row_group_rows=2)
    with pytest.raises(OSError) as info:
        for i in range(10):
            sink.add(pa.record_batch({"a": [i, i]}))
    assert info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        sink.close()


def test_failure_during_close_rewrite_leaves_nothing(tmp_path: Path, monkeypatch):
    sink = ParquetSink(tmp_path / "out.parquet", 1 << 30, row_group_rows=1)
    sink.add(pa.record_batch({"a": [1]}))
    sink.add(pa.record_batch({"a": ["x"]}))
    monkeypatch.setattr(pq.ParquetWriter, "write_batch",
                        lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(OSError):
        sink.close()
    assert list(tmp_path.iterdir()) == []


def test_unwritable_directory(tmp_path: Path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:  # root ignores directory permissions
        ro.chmod(0o555)
        try:
            with pytest.raises(PermissionError):
                _write(ro / "out.parquet", [pa.record_batch({"a": [1]})])
            assert list(ro.iterdir()) == []
        finally:
            ro.chmod(0o755)
    import datadesk.offload.parquet.writer as sink_mod

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(sink_mod.tempfile, "mkdtemp", denied)
    with pytest.raises(PermissionError):
        _write(ro / "out.parquet", [pa.record_batch({"a": [1]})])
    assert list(ro.iterdir()) == []


def test_duplicate_names_and_rows_property(tmp_path: Path):
    batch = pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    with ParquetSink(tmp_path / "out.parquet", 1 << 30) as sink:
        sink.add(batch)
        assert sink.rows == 1
        res = sink.close()
    assert res.schema.names == ["a", "a_2"]


def test_display_type():
    assert display_type(pa.int64()) == "int64"
    assert display_type(pa.date32()) == "date32"
    assert display_type(pa.list_(pa.int64())) == "list<int64>"
    assert display_type(pa.dictionary(pa.int32(), pa.string())) == "dictionary<string>"
    assert display_type(pa.timestamp("us", tz="UTC")) == "timestamp[us, tz=UTC]"
    wide = pa.struct([("a", pa.int64()), ("b", pa.list_(pa.struct([("x", pa.string())])))]
                     + [(f"f{i}", pa.string()) for i in range(12)])
    shown = display_type(wide)
    assert len(shown) <= 60 and shown.startswith("struct<a: int64, b: list<") and shown.endswith(">")
    assert "…+" in shown
    deep = pa.list_(pa.list_(pa.list_(pa.struct([("very_long_field_name_" + "x" * 40, pa.int64())]))))
    assert len(display_type(deep, max_len=30)) <= 30


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                    st.floats(allow_nan=False), st.text(max_size=5),
                    st.sampled_from(["2024-01-05", "2024-01-05T10:00:00", "2024-01-05T10:00:00Z"]))
_value = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("xyz"), inner, max_size=3)), max_leaves=6)
_records = st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "d", ""]), _value, max_size=5),
                    min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_records, batch_rows=st.integers(1, 7), row_group_rows=st.integers(1, 9))
def test_property_ragged_records_round_trip(tmp_path: Path, records, batch_rows, row_group_rows):
    out = tmp_path / "prop.parquet"
    res = _write(out, json_batches(json.dumps(records), batch_rows=batch_rows), row_group_rows=row_group_rows)
    table = pq.read_table(out)
    assert res.rows == table.num_rows == len(records)
    assert not res.partial
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prop.parquet"]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("stop_at", ["add", "unify"])
def test_a_check_that_raises_stops_the_write_and_removes_its_temp_files(tmp_path: Path, stop_at: str):
    """The cancel hook of a write: raised per batch, or while segments are rewritten on close."""
    calls = {"n": 0}
    closing = {"on": False}

    def check():
        calls["n"] += 1
        if (stop_at == "add" and calls["n"] == 5) or (stop_at == "unify" and closing["on"]):
            raise _Stop()

    final = tmp_path / "out.parquet"
    sink = ParquetSink(final, 1 << 30, row_group_rows=100, check=check)
    with pytest.raises(_Stop):
        with sink:
            for i in range(10):
                # a type change per batch: several segments, unified on close
                col = pa.array([str(i)] * 100) if i % 2 else pa.array([i] * 100)
                sink.add(pa.RecordBatch.from_arrays([col], names=["v"]))
            closing["on"] = True
            sink.close()
    assert list(tmp_path.iterdir()) == []


def test_narrow_integers_are_delta_encoded_and_read_back_exactly(tmp_path: Path):
    import duckdb

    n = 50_000
    ids = list(range(10**12, 10**12 + n))  # big values, narrow range
    qty = [None if i % 97 == 0 else (i * 37) % 1000 - 500 for i in range(n)]
    codes = [(i * 0x9E3779B97F4A7C15) % (1 << 63) for i in range(n)]  # hash-like
    batch = pa.record_batch({"id": pa.array(ids), "qty": pa.array(qty, pa.int32()), "code": pa.array(codes)})
    res = _write(tmp_path / "out.parquet", [batch])
    meta = pq.ParquetFile(tmp_path / "out.parquet").metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in encodings["id"] and "DELTA_BINARY_PACKED" in encodings["qty"]
    assert "DELTA_BINARY_PACKED" not in encodings["code"]
    table = pq.read_table(tmp_path / "out.parquet")
    assert res.rows == n and table.column("id").to_pylist() == ids and table.column("qty").to_pylist() == qty
    assert table.column("code").to_pylist() == codes
    got = duckdb.sql(f"SELECT sum(id), sum(qty), count(qty), max(code) FROM '{tmp_path / 'out.parquet'}'").fetchall()[0]
    assert got == (sum(ids), sum(q for q in qty if q is not None), sum(q is not None for q in qty), max(codes))


def test_delta_encoded_integers_of_every_width_keep_their_edge_values(tmp_path: Path):
    import duckdb

    n = 20_000
    cols = {"u8": pa.array([i % 256 for i in range(n)], pa.uint8()),
            "i16": pa.array([(i % 60_000) - 30_000 for i in range(n)], pa.int16()),
            "u32": pa.array([2**32 - 1 - i for i in range(n)], pa.uint32()),
            "u64": pa.array([2**64 - 1 - i for i in range(n)], pa.uint64()),
            "i64": pa.array([-2**63 + i for i in range(n)], pa.int64())}
    _write(tmp_path / "out.parquet", [pa.record_batch(cols)])
    table = pq.read_table(tmp_path / "out.parquet")
    for name, values in cols.items():
        assert table.column(name).to_pylist() == values.to_pylist(), name
    got = duckdb.sql(f"SELECT sum(u8), sum(i16), max(u32), max(u64), min(u64), min(i64) "
                     f"FROM '{tmp_path / 'out.parquet'}'").fetchall()[0]
    py = {k: v.to_pylist() for k, v in cols.items()}
    assert got == (sum(py["u8"]), sum(py["i16"]), max(py["u32"]), max(py["u64"]), min(py["u64"]), min(py["i64"]))
