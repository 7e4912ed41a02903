"""The grid's warm databases (offload/grid/databases.py): reused per file version, as locked
down as a fresh one, bounded in number and idle time, never closed under a running cursor; a
query past the deadline is interrupted and the database goes on serving."""

from __future__ import annotations

import os
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.offload.grid.databases import GridDatabases
from datadesk.offload.grid.pages import GridLimit, GridReader
from datadesk.sources.sqllimits import SQLLimits


def _table(path: Path, n: int = 10) -> Path:
    pq.write_table(pa.table({"x": list(range(n))}), path)
    return path


@pytest.fixture
def limits(tmp_path) -> SQLLimits:
    return SQLLimits(tmp_root=tmp_path / "sql")


def test_one_database_per_file_version_reused(tmp_path, limits) -> None:
    dbs = GridDatabases(limits)
    a = _table(tmp_path / "a.parquet")
    for _ in range(3):
        with dbs.cursor(a) as con:
            assert con.execute("SELECT count(*) FROM read_parquet(?)", [str(a)]).fetchall() == [(10,)]
    assert len(dbs._dbs) == 1
    _table(a, 20)  # the file rewritten (a re-run query): a fresh database
    os.utime(a, ns=(time.time_ns(), time.time_ns() + 10**9))
    with dbs.cursor(a) as con:
        assert con.execute("SELECT count(*) FROM read_parquet(?)", [str(a)]).fetchall() == [(20,)]
    assert len(dbs._dbs) == 2


@pytest.mark.security
def test_a_warm_database_stays_locked_down(tmp_path, limits) -> None:
    dbs = GridDatabases(limits)
    a, other = _table(tmp_path / "a.parquet"), _table(tmp_path / "other.parquet")
    with dbs.cursor(a):
        pass
    with dbs.cursor(a) as con:
        with pytest.raises(duckdb.Error):
            con.execute("SELECT * FROM read_parquet(?)", [str(other)]).fetchall()
        for stmt in ["SET enable_external_access=true", f"SET allowed_paths=['{other}']", "SET memory_limit='8GB'"]:
            with pytest.raises(duckdb.Error):
                con.execute(stmt)
        assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] != "8.0 GiB"


def closed(entry) -> bool:
    try:
        entry.db.execute("SELECT 1")
    except duckdb.ConnectionException:
        return True
    return False


def test_bounded_in_number_and_idle_time(tmp_path, limits) -> None:
    dbs = GridDatabases(limits, size=2, idle_s=3600)
    files = [_table(tmp_path / f"t{i}.parquet") for i in range(3)]
    made = []
    for f in files:
        with dbs.cursor(f):
            made.append(next(reversed(dbs._dbs.values())))
    assert len(dbs._dbs) == 2 and closed(made[0]) and not closed(made[1]) and not closed(made[2])
    dbs.idle_s = 0.0
    with dbs.cursor(files[0]):
        pass
    assert len(dbs._dbs) == 0 and all(closed(e) for e in made)


def test_a_database_in_use_is_closed_only_after_its_cursor_returns(tmp_path, limits) -> None:
    dbs = GridDatabases(limits, size=1, idle_s=3600)
    a, b = _table(tmp_path / "a.parquet"), _table(tmp_path / "b.parquet")
    with dbs.cursor(a) as con:
        first = next(iter(dbs._dbs.values()))
        with dbs.cursor(b):
            pass  # a is evicted (size 1) while its cursor runs
        assert first.retired and not closed(first)
        assert con.execute("SELECT count(*) FROM read_parquet(?)", [str(a)]).fetchall() == [(10,)]
    assert closed(first) and list(dbs._dbs) and all(k[0] == str(b) for k in dbs._dbs)


def test_a_query_past_the_deadline_is_interrupted_and_the_database_serves_on(tmp_path, limits) -> None:
    reader = GridReader(limits, timeout_s=0.2)
    a = _table(tmp_path / "a.parquet")
    slow = "SELECT count(*) FROM range(10000000000) t(i) WHERE i % 7 = 3"
    with pytest.raises(GridLimit, match="longer than 0.2 s"):
        reader.query(a, lambda con: con.execute(slow).fetchall())
    assert reader.query(a, lambda con: con.execute("SELECT count(*) FROM read_parquet(?)", [str(a)]).fetchall()) \
        == [(10,)]
    assert len(reader.databases._dbs) == 1
