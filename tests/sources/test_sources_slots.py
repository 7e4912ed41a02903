"""Issue 27 for every configured source (PostgreSQL, MariaDB, SQLite; the warehouse is in
tests/unit/test_fair_admission.py): the `sql_query` tool's query slot is given back once the
source's last row was read, before the stream is closed, and a stream closed early or a
statement that fails frees it too."""

from __future__ import annotations

import asyncio
import json

import pytest

from datadesk.llm.scripted import ScriptedModel
from tests.conftest import make_harness
from tests.dbkit import ROWS
from tests.sandbox_kit import ctx

pytestmark = pytest.mark.databases

SQL = {"sales": "SELECT id, amount FROM orders", "shop": "SELECT id, amount FROM orders",
       "local": "SELECT id, amount FROM orders"}


@pytest.fixture(autouse=True)
def _streamed_under_the_slot(monkeypatch):
    """These follow a result streamed to its reader under the slot; one read whole within
    tools.sql.HOLD_BYTES frees its slot at once (tests/unit/test_fair_admission.py)."""
    monkeypatch.setattr("datadesk.tools.sql.HOLD_BYTES", 0)


@pytest.mark.parametrize("source", ["sales", "shop", "local"])
def test_the_slot_is_free_once_the_last_row_is_read(sources_home, pg, maria, source) -> None:
    h = make_harness(sources_home, ScriptedModel())
    slots = h.rt.query_slots
    c = ctx(h.rt)

    async def call(sql: str):
        return await h.rt.tools.run("sql_query", json.dumps({"sql": sql, "source": source}), c)

    async def scenario() -> None:
        result = await call(SQL[source])
        assert result.table is not None and slots.running("alice") == 1
        # read in a worker thread, as the offload writer's read-ahead does (a driver may run its own loop)
        rows = await asyncio.to_thread(lambda: sum(batch.num_rows for batch in result.table))
        assert rows == ROWS and slots.running() == 0  # read to its end, not closed yet: free
        await asyncio.to_thread(result.table.close)
        early = await call(SQL[source])
        assert slots.running() == 1
        await asyncio.to_thread(early.table.close)  # never read to its end
        assert slots.running() == 0
        bad = await call("SELECT * FROM no_such_table")
        assert bad.is_error and slots.running() == 0

    try:
        asyncio.run(scenario())
    finally:
        h.rt.sources.close()
