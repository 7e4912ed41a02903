"""The warehouse keeps finished connections warm (sources/warehouse.py): reused only when clean,
never across a replaced file, never shared by two queries at once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import duckdb
import pytest

from datadesk.sources.errors import SQLError, SQLTimeout
from datadesk.sources.warehouse import IDLE_MAX, Warehouse


def _make(path: Path, value: int) -> None:
    tmp = path.with_suffix(".new")
    con = duckdb.connect(str(tmp))
    con.execute(f"CREATE TABLE t AS SELECT range AS i, {value} AS v FROM range(100000)")
    con.close()
    os.replace(tmp, path)


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    data = tmp_path / "data"
    data.mkdir()
    _make(data / "warehouse.duckdb", 1)
    w = Warehouse(data / "warehouse.duckdb", data, timeout_s=10)
    yield w
    w.close()


def _stream_sum(wh: Warehouse, sql: str = "SELECT v FROM t") -> int:
    with wh.record_batches(sql) as stream:
        return sum(sum(b.column(0).to_pylist()) for b in stream)


def test_a_clean_query_leaves_its_connection_for_the_next(wh):
    assert wh.query_sync("SELECT 1").rows
    assert _stream_sum(wh) == 100_000
    assert wh.query_sync("SELECT count(*) FROM t").rows[0][0] == 100_000
    assert wh.opened == 1  # one connection opened, reused twice
    # the lockdown holds on a reused connection
    with pytest.raises(SQLError):
        wh.query_sync("SELECT * FROM read_csv('/etc/passwd')")


def test_a_replaced_file_is_seen_by_the_next_query(wh, tmp_path):
    assert _stream_sum(wh) == 100_000
    _make(tmp_path / "data" / "warehouse.duckdb", 2)
    assert _stream_sum(wh) == 200_000
    assert wh.opened == 2


def test_a_timed_out_or_half_read_connection_is_not_kept(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _make(data / "warehouse.duckdb", 1)
    wh = Warehouse(data / "warehouse.duckdb", data, timeout_s=0.3)
    slow = "SELECT count(*) FROM range(10000000000) a"
    with pytest.raises(SQLTimeout):
        wh.query_sync(slow)
    assert not wh._idle
    stream = wh.record_batches("SELECT * FROM t", batch_size=1000)
    next(iter(stream))
    stream.close()  # left half read
    assert not wh._idle
    assert wh.query_sync("SELECT 42").rows[0][0] == 42
    assert len(wh._idle) == 1
    wh.close()


def test_concurrent_queries_never_share_a_connection(wh):
    seen: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(5):
                con = wh._connect()
                with lock:
                    assert id(con) not in seen, "a connection handed out twice at once"
                    seen.append(id(con))
                con.execute("SELECT sum(i) FROM t").fetchall()
                with lock:
                    seen.remove(id(con))
                wh._release(con)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(wh._idle) <= IDLE_MAX


def test_a_missing_file_is_still_reported(wh, tmp_path):
    wh.query_sync("SELECT 1")
    os.unlink(tmp_path / "data" / "warehouse.duckdb")
    with pytest.raises(SQLError, match="warehouse not found"):
        wh.query_sync("SELECT 1")


def test_an_idle_server_lets_go_of_the_file(wh, tmp_path, monkeypatch):
    """A job that writes the warehouse in place needs it to itself: the warm connections close
    once idle for IDLE_S."""
    from datadesk.sources import warehouse

    monkeypatch.setattr(warehouse, "IDLE_S", 0.2)
    wh.query_sync("SELECT 1")
    assert len(wh._idle) == 1
    time.sleep(0.6)
    assert not wh._idle
    with duckdb.connect(str(tmp_path / "data" / "warehouse.duckdb")) as con:  # read-write, in place
        con.execute("UPDATE t SET v = 3")
    assert _stream_sum(wh) == 300_000
