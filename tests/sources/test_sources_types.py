"""Source column types in the artifact (issue 24): MySQL/MariaDB BIT(1) is a boolean and BIT(n) an
unsigned integer (uint64), not the driver's big-endian bytes. The conversion on its own, then
the real MariaDB server (tests/dbkit.py) through the source and through the app's sql_query."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.sources.engines.rowbatches import bit_values, mysql_field, rows_to_batch
from tests.conftest import make_harness, parse_sse
from tests.dbkit import maria_root
from tests.fakes.sandbox import FakeSandbox

MYSQL_BIT, UNSIGNED, BINARY = 16, 32, 63
TOP = 2**64 - 1


def test_bit_fields_become_bool_and_uint64() -> None:
    assert mysql_field("flag", MYSQL_BIT, UNSIGNED, 1, 0, BINARY) == (pa.field("flag", pa.bool_()), "BIT(1)")
    assert mysql_field("mask", MYSQL_BIT, UNSIGNED, 12, 0, BINARY) == (pa.field("mask", pa.uint64()), "BIT(12)")
    assert mysql_field("wide", MYSQL_BIT, 0, 64, 0, BINARY) == (pa.field("wide", pa.uint64()), "BIT(64)")
    assert bit_values([b"\x0f\xff", b"\x00\x05", None, b"\xff" * 8, 3]) == [4095, 5, None, TOP, 3]
    schema = pa.schema([mysql_field(n, MYSQL_BIT, UNSIGNED, w, 0, BINARY)[0]
                        for n, w in (("flag", 1), ("mask", 12), ("wide", 64))])
    batch = rows_to_batch([(b"\x01", b"\x0f\xff", b"\xff" * 8), (b"\x00", b"\x00\x05", b"\x00" * 8),
                           (None, None, None)], schema)
    assert batch.schema == schema
    assert batch.to_pylist() == [{"flag": True, "mask": 4095, "wide": TOP}, {"flag": False, "mask": 5, "wide": 0},
                                 {"flag": None, "mask": None, "wide": None}]
    # TINYINT(1) (ints, not bytes) is still a boolean, and a batch of only NULLs still converts
    tiny = pa.schema([mysql_field("paid", 1, 0, 1, 0, BINARY)[0]])
    assert rows_to_batch([(1,), (0,), (None,)], tiny).column(0).to_pylist() == [True, False, None]
    assert rows_to_batch([(None, None, None)], schema).num_rows == 1


BITS_SQL = (
    "DROP TABLE IF EXISTS sales.bits;"
    "CREATE TABLE sales.bits (id INT PRIMARY KEY, flag BIT(1), mask BIT(12), wide BIT(64));"
    "INSERT INTO sales.bits SELECT seq, seq % 2, seq % 4096, seq * 1000003 FROM sales.seq_1_to_2000;"
    "INSERT INTO sales.bits VALUES (2001, b'1', b'111111111111', 0xFFFFFFFFFFFFFFFF), (2002, NULL, NULL, NULL);"
    # the analyst login may read it whatever its grants are (all of sales, or SELECT only)
    "GRANT SELECT ON sales.bits TO analyst@'127.0.0.1';"
)
QUERY = "SELECT id, flag, mask, wide FROM bits ORDER BY id"


def _truth(maria) -> list[tuple[int, int | None, int | None, int | None]]:
    out = maria_root(maria, "SELECT id, flag + 0, mask + 0, wide + 0 FROM sales.bits ORDER BY id")
    return [tuple(None if v == "NULL" else int(v) for v in line.split("\t")) for line in out.strip().splitlines()]


def _check(table: pa.Table, truth: list) -> None:
    types = {f.name: f.type for f in table.schema}
    assert types["flag"] == pa.bool_() and types["mask"] == pa.uint64() and types["wide"] == pa.uint64(), types
    got = [(r["id"], r["flag"], r["mask"], r["wide"]) for r in table.to_pylist()]
    assert got == [(i, None if f is None else bool(f), m, w) for i, f, m, w in truth]
    assert got[-2] == (2001, True, 4095, TOP) and got[-1] == (2002, None, None, None)


@pytest.mark.databases
def test_mariadb_bit_columns_are_a_boolean_and_an_unsigned_integer(sources_home: Path, maria) -> None:
    maria_root(maria, BITS_SQL)
    truth = _truth(maria)
    assert len(truth) == 2002
    h = make_harness(sources_home, ScriptedModel([tool_step("sql_query", {"sql": QUERY, "source": "shop"}), "done"]))
    try:
        with h.rt.sources.get("demo").get("shop").record_batches(QUERY, "alice") as stream:
            _check(pa.Table.from_batches(list(stream)), truth)
        # through the app: the sql_query artifact holds the same types
        FakeSandbox(h.rt)  # the python tool is there: a large result becomes an artifact
        with TestClient(h.app()) as c:
            tid = c.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "go"},
                                      headers=h.auth("alice")).text)
    finally:
        h.rt.sources.close()
    done = next(d for e, d in events if e == "tool.finished")
    assert done["ok"], done
    aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    path = h.rt.threads.get(tid, "alice", ["demo"]).dir / "artifacts" / f"{aid}.parquet"
    _check(pq.read_table(path), truth)
