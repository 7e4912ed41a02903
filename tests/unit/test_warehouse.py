"""Warehouse behaviour: the demo data, result shapes, truncation, timeouts, streaming."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from datadesk.store.demo import WAREHOUSE_FILE, create_demo_warehouse, demo_workspace_prompt
from datadesk.sources.errors import SQLError, SQLRefused, SQLTimeout
from datadesk.sources.query import QueryResult, jsonable
from datadesk.sources.warehouse import Warehouse

READINGS_ROWS = 20 * 397 * 24  # 2024 is a leap year: 366 + 31 days, hourly
CHECKSUM_SQL = """
SELECT count(*), sum(round(kwh * 100)::BIGINT), sum(round(temperature_c * 10)::BIGINT),
       sum(occupancy), count(kwh), min(ts), max(ts)
  FROM readings
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, float]:
    data_dir = tmp_path_factory.mktemp("ws") / "data"
    started = time.perf_counter()
    db = create_demo_warehouse(data_dir)
    return db, time.perf_counter() - started


@pytest.fixture(scope="module")
def wh(built) -> Warehouse:
    db, _ = built
    return Warehouse(db, db.parent, timeout_s=10, max_rows=1000)


# -- the demo data -------------------------------------------------------------


@pytest.mark.serial  # measures the build (< 5 s)
def test_demo_build_is_fast_and_leaves_no_temp_files(built):
    db, seconds = built
    assert seconds < 5
    assert sorted(p.name for p in db.parent.iterdir()) == [WAREHOUSE_FILE]


def test_demo_row_counts(wh):
    counts = {t: wh.query_sync(f"SELECT count(*) FROM {t}").rows[0][0]
              for t in ("buildings", "readings", "holidays")}
    assert counts == {"buildings": 20, "readings": READINGS_ROWS, "holidays": 13}
    ids = wh.query_sync("SELECT building_id FROM buildings ORDER BY 1").rows
    assert [r[0] for r in ids] == [f"B{i:02d}" for i in range(1, 21)]


def test_demo_is_deterministic(built, wh, tmp_path):
    db, _ = built
    wh.close()  # its warm connections hold the file's instance, opened with the lockdown's settings
    again = create_demo_warehouse(tmp_path / "data")
    sums = []
    for path in (db, again):
        with duckdb.connect(str(path), read_only=True) as con:
            sums.append(con.execute(CHECKSUM_SQL).fetchone())
            sums.append(con.execute("SELECT * FROM buildings ORDER BY 1").fetchall())
    assert sums[0] == sums[2] and sums[1] == sums[3]
    assert sums[0][0] == READINGS_ROWS


def test_demo_rebuild_replaces_the_file(tmp_path):
    first = create_demo_warehouse(tmp_path)
    second = create_demo_warehouse(tmp_path)
    assert first == second and [p.name for p in tmp_path.iterdir()] == [WAREHOUSE_FILE]


def test_demo_patterns_are_plausible(wh):
    # Occupied weekday daytime uses more than nights; weekends and holidays are empty.
    rows = wh.query_sync("""
        SELECT
          avg(kwh) FILTER (WHERE isodow(ts) <= 5 AND hour(ts) = 11) AS day,
          avg(kwh) FILTER (WHERE hour(ts) = 3) AS night,
          max(occupancy) FILTER (WHERE isodow(ts) >= 6 OR hour(ts) < 5
                                 OR ts::DATE IN (SELECT date FROM holidays)) AS off_hours_people,
          avg(temperature_c) FILTER (WHERE month(ts) = 1) AS jan,
          avg(temperature_c) FILTER (WHERE month(ts) = 7) AS jul
        FROM readings""").rows[0]
    day, night, off_people, jan, jul = rows
    assert day > 1.5 * night
    assert off_people == 0
    assert jan < 5 < 15 < jul


def test_demo_prompt_names_the_tables():
    prompt = demo_workspace_prompt()
    for word in ("buildings", "readings", "holidays", "kwh"):
        assert word in prompt


# -- result shape ----------------------------------------------------------------


def test_types_and_iso_dates(wh):
    res = wh.query_sync("SELECT r.ts, r.ts::DATE AS d, r.kwh, r.occupancy, h.name "
                        "FROM readings r JOIN holidays h ON r.ts::DATE = h.date "
                        "WHERE r.building_id = 'B01' ORDER BY r.ts LIMIT 2")
    assert res.columns == ["ts", "d", "kwh", "occupancy", "name"]
    assert res.types == ["TIMESTAMP", "DATE", "DOUBLE", "INTEGER", "VARCHAR"]
    assert res.rows[0][:2] == ["2024-01-01T00:00:00", "2024-01-01"]
    assert res.rows[1][0] == "2024-01-01T01:00:00"
    assert isinstance(res.rows[0][2], float) and isinstance(res.rows[0][3], int)
    assert res.row_count == 2 and not res.truncated


def test_odd_values_become_json(wh):
    res = wh.query_sync("""SELECT 1.25::DECIMAL(6,2) AS dec, '\\x01\\xAB'::BLOB AS blob,
        'nan'::DOUBLE AS nan, INTERVAL 90 MINUTE AS iv, [1, 2] AS lst,
        {'a': DATE '2024-02-29'} AS st, TIME '12:30:00' AS t,
        '6f1c8f5e-7a6b-4c4e-9d7e-2a7c1f3b9d10'::UUID AS id, 170141183460469231731687303715884105727::HUGEINT AS big""")
    assert res.rows[0] == [1.25, "01ab", None, "1:30:00", [1, 2], {"a": "2024-02-29"}, "12:30:00",
                           "6f1c8f5e-7a6b-4c4e-9d7e-2a7c1f3b9d10", "170141183460469231731687303715884105727"]
    assert res.types[0] == "DECIMAL(6,2)"
    assert jsonable(float("inf")) is None


def test_truncation_at_max_rows(built):
    db, _ = built
    small = Warehouse(db, db.parent, timeout_s=10, max_rows=10)
    res = small.query_sync("SELECT * FROM readings LIMIT 25")
    assert len(res.rows) == 10 and res.truncated and res.row_count == 11
    exact = small.query_sync("SELECT * FROM readings LIMIT 10")
    assert len(exact.rows) == 10 and not exact.truncated and exact.row_count == 10


def test_query_result_to_dict(wh):
    res = wh.query_sync("SELECT 1 AS x")
    assert res.to_dict() == {"columns": ["x"], "types": ["INTEGER"], "rows": [[1]],
                             "row_count": 1, "truncated": False}
    assert isinstance(res, QueryResult)


def test_describe_lists_tables_columns_and_comments(wh):
    tables = {t.name: t for t in wh.describe()}
    assert set(tables) == {"buildings", "readings", "holidays"}
    readings = tables["readings"]
    assert readings.kind == "table" and "Hourly" in (readings.comment or "")
    cols = {c.name: c for c in readings.columns}
    assert [c.name for c in readings.columns] == ["building_id", "ts", "kwh", "temperature_c", "occupancy"]
    assert cols["ts"].type == "TIMESTAMP" and cols["kwh"].comment


# -- errors ------------------------------------------------------------------------


def test_missing_warehouse(tmp_path):
    missing = Warehouse(tmp_path / "warehouse.duckdb", tmp_path, timeout_s=1, max_rows=10)
    with pytest.raises(SQLError, match="warehouse not found"):
        missing.query_sync("SELECT 1")


@pytest.mark.parametrize("sql", ["", "   ", ";", "-- just a comment"])
def test_empty_sql(wh, sql):
    with pytest.raises(SQLError, match="empty SQL"):
        wh.query_sync(sql)


def test_parse_and_bind_errors_are_short_and_specific(wh):
    with pytest.raises(SQLError, match="syntax error") as parse:
        wh.query_sync("SELEC kwh FROM readings")
    assert not isinstance(parse.value, SQLRefused) and len(str(parse.value)) <= 500
    with pytest.raises(SQLError, match="no_such_column"):
        wh.query_sync("SELECT no_such_column FROM readings")


# -- timeouts ----------------------------------------------------------------------

SLOW = "SELECT count(*) FROM range(100000000) a, range(1000) b"


def test_timeout_sync(built):
    db, _ = built
    quick = Warehouse(db, db.parent, timeout_s=0.5, max_rows=10)
    started = time.perf_counter()
    with pytest.raises(SQLTimeout, match=r"query exceeded 0.5 s; narrow it or add a LIMIT"):
        quick.query_sync(SLOW)
    assert time.perf_counter() - started < 5
    assert quick.query_sync("SELECT 42").rows == [[42]]  # usable afterwards


def test_timeout_async(built):
    db, _ = built
    quick = Warehouse(db, db.parent, timeout_s=0.5, max_rows=10)

    async def main():
        started = time.perf_counter()
        with pytest.raises(SQLTimeout):
            await quick.query(SLOW)
        elapsed = time.perf_counter() - started
        ok = await quick.query("SELECT count(*) FROM buildings")
        return elapsed, ok

    elapsed, ok = asyncio.run(main())
    assert elapsed < 5 and ok.rows == [[20]]


def _recording(wh: Warehouse, outcomes: list) -> None:
    """Record how each `query_sync` of `wh` ended (in its worker thread)."""
    inner = wh.query_sync

    def wrapped(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        except BaseException as exc:
            outcomes.append(type(exc).__name__)
            raise

    wh.query_sync = wrapped  # type: ignore[method-assign]


def test_a_cancelled_query_is_interrupted_and_the_next_one_answers(built):
    """Cancelling the awaiting task interrupts DuckDB (not the 300 s timeout): by the time the
    cancellation is through, the worker thread has stopped with SQLCancelled."""
    db, _ = built
    patient = Warehouse(db, db.parent, timeout_s=300, max_rows=10)
    outcomes: list[str] = []
    _recording(patient, outcomes)

    async def main():
        task = asyncio.create_task(patient.query(SLOW))
        await asyncio.sleep(0.3)  # the statement is running
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stopped = list(outcomes)
        return stopped, await patient.query("SELECT count(*) FROM buildings")

    stopped, ok = asyncio.run(main())
    assert stopped == ["SQLCancelled"] and ok.rows == [[20]]


def test_the_async_backstop_timeout_interrupts_the_statement(built, monkeypatch):
    """The wait_for backstop (engine slow to notice its deadline) cancels the statement too."""
    import datadesk.sources.warehouse as warehouse

    db, _ = built
    monkeypatch.setattr(warehouse, "_ASYNC_GRACE_S", 0.2)
    wedged = Warehouse(db, db.parent, timeout_s=0.3, max_rows=10)
    outcomes: list[str] = []
    _recording(wedged, outcomes)
    # the statement's own deadline "misses": only the backstop is left
    monkeypatch.setattr(warehouse.QueryControl, "_fire", lambda self: None)

    async def main():
        with pytest.raises(SQLTimeout):
            await wedged.query(SLOW)
        await asyncio.sleep(0.5)
        return list(outcomes), await wedged.query("SELECT 42")

    stopped, ok = asyncio.run(main())
    assert stopped == ["SQLCancelled"] and ok.rows == [[42]]


def test_a_stream_interrupted_from_another_thread_stops(wh):
    """`BatchStream.interrupt` (a cancelled offload) stops the reader with SQLCancelled."""
    from datadesk.sources.errors import SQLCancelled

    stream = wh.record_batches("SELECT range AS i FROM range(100000000)", batch_size=10_000, timeout_s=300)
    rows = 0
    with pytest.raises(SQLCancelled):
        for batch in stream:
            rows += batch.num_rows
            if rows >= 50_000:
                stream.interrupt()
    assert rows < 1_000_000
    assert wh.query_sync("SELECT 42").rows == [[42]]


# -- streaming -----------------------------------------------------------------------


def test_record_batches_stream_to_parquet(wh, tmp_path):
    out = tmp_path / "readings.parquet"
    with wh.record_batches("SELECT * FROM readings ORDER BY building_id, ts", batch_size=50_000) as stream:
        assert stream.schema.names == ["building_id", "ts", "kwh", "temperature_c", "occupancy"]
        with pq.ParquetWriter(out, stream.schema) as writer:
            sizes = []
            for batch in stream:
                sizes.append(batch.num_rows)
                writer.write_batch(batch)
    assert sum(sizes) == READINGS_ROWS and max(sizes) <= 50_000 and len(sizes) > 1
    assert pq.read_metadata(out).num_rows == READINGS_ROWS


def test_record_batches_empty_result_keeps_schema(wh):
    stream = wh.record_batches("SELECT * FROM buildings WHERE false")
    assert stream.schema.names[0] == "building_id"
    assert list(stream) == []


def test_record_batches_refuses_and_times_out(built):
    db, _ = built
    wh = Warehouse(db, db.parent, timeout_s=0.5, max_rows=10)
    with pytest.raises(SQLRefused):
        wh.record_batches(f"COPY readings TO '{db.parent}/x.parquet'")
    with pytest.raises(SQLTimeout):
        list(wh.record_batches(SLOW))


def test_parallel_streams_on_one_warehouse(wh):
    """Parallel tool calls stream from the same file at once (DuckDB shares one instance)."""
    import threading

    results, errors = [], []

    def run(sql: str) -> None:
        try:
            with wh.record_batches(sql) as stream:
                results.append(sum(b.num_rows for b in stream))
        except Exception as exc:  # collected: a thread's exception would be lost otherwise
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(q,)) for q in
               ["SELECT * FROM readings", "SELECT count(*) FROM buildings"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == [1] * 4 + [190_560] * 4


# -- resource limits (issue 15) ----------------------------------------------------

BOMB = "SELECT list(a.range) FROM range(20000) a, range(20000) b"  # 400 M list entries


@pytest.mark.security
def _own_copy(db: Path, tmp_path: Path) -> Path:
    """The demo warehouse in a folder of its own: a DuckDB instance with this test's limits."""
    import shutil

    (tmp_path / "own").mkdir()
    return Path(shutil.copy(db, tmp_path / "own" / db.name))


def test_memory_bomb_stops_at_the_limit_with_a_clear_message(built, tmp_path):
    import resource

    from datadesk.sources.errors import SQLLimit
    from datadesk.sources.sqllimits import SQLLimits

    db = _own_copy(built[0], tmp_path)  # the module's warehouses keep the shared file's instance warm
    limits = SQLLimits(memory_mb=128, threads=2, temp_mb=64, tmp_root=tmp_path / "tmp" / "sql")
    wh = Warehouse(db, db.parent, timeout_s=20, max_rows=10, limits=limits)
    with pytest.raises(SQLLimit, match=r"more than 128 MB of memory \(limits.sql_memory_mb\); filter or aggregate"):
        wh.query_sync(BOMB)
    with pytest.raises(SQLLimit, match="limits.sql_memory_mb"):
        with wh.record_batches(BOMB) as stream:
            list(stream)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 1_500_000  # KiB: loose, see bench/bombs.py
    # normal queries still work, and the spill directories are gone with their connections (the
    # last one kept warm included)
    assert wh.query_sync("SELECT count(*) FROM readings").rows == [[READINGS_ROWS]]
    wh.close()
    assert not any((tmp_path / "tmp" / "sql").glob("*"))
    assert sorted(p.name for p in db.parent.iterdir()) == [WAREHOUSE_FILE]  # nothing in the data dir


def test_limits_are_set_and_locked(built, tmp_path):
    from datadesk.sources.sqllimits import SQLLimits

    db = _own_copy(built[0], tmp_path)  # the module's warehouses keep the shared file's instance warm
    limits = SQLLimits(memory_mb=100, threads=1, temp_mb=50, tmp_root=tmp_path / "sql")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.csv").write_text("a\n1\n")
    for wh in (Warehouse(db, db.parent, timeout_s=5, limits=limits),
               Warehouse(tmp_path / "data" / "none.duckdb", tmp_path / "data", timeout_s=5, limits=limits,
                         views={"b": str(tmp_path / "data" / "b.csv")})):
        con = wh._connect()
        try:
            mem, threads, temp, temp_max = con.execute(
                "SELECT current_setting('memory_limit'), current_setting('threads'), "
                "current_setting('temp_directory'), current_setting('max_temp_directory_size')").fetchall()[0]
            assert mem.startswith(("95", "100")) and threads == 1  # DuckDB shows MiB
            assert temp.startswith(str(tmp_path / "sql")) and temp_max.startswith(("47", "50"))
            with pytest.raises(duckdb.Error, match="locked"):
                con.execute("SET memory_limit='10GB'")
        finally:
            wh._release(con)
            wh.close()
        assert not any((tmp_path / "sql").iterdir())
