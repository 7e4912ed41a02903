"""One reader for every door (issue 26): every shape of the corpus (`tests/fixtures/shapes.py`)
comes in through the three doors of the real app, and the three artifacts hold the same table:

  (a) a tool's result: a read-only MCP-like tool returns the text; the scripted model calls it in
      a real turn, and the offload pipeline writes the artifact;
  (b) an upload: the text as a file posted to `/api/threads/{tid}/uploads`;
  (c) a paste: the text as a message too long for the model (`context.max_message_tokens` is
      small here), staged as a file by `Attachments.message_text`.

Each artifact is downloaded through the API as Parquet and compared: the same column names in
the same order, the same types, exactly `expected(n)["rows"]` rows and the corpus sums (id,
amount, price, paid; the last day and time). A shape a source says it cut is partial (by the
source) through every door. Doors that legitimately differ would say so here; none does for
text: the source's `columnTypes` are in the text, read by the same reader in every door (hints
only a tool has, an MCP outputSchema's formats, are not part of a text).
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.doors import DOORS, door_app, through
from tests.fixtures.shapes import POSITIONAL, SHAPES, TRUNCATED, expected

N = 50
LARGE = 20_000  # the fast shapes once more at a size of many batches
FAST = ("json_records", "ndjson", "json_columns_rows", "csv_header", "tsv", "markdown")
NAMES = ["id", "amount", "price", "name", "day", "ts", "paid"]


@pytest.fixture
def app(harness_factory):
    with door_app(harness_factory) as app:
        yield app


def check_corpus(shape: str, table: pa.Table, n: int) -> None:
    """The rows and sums every shape of the corpus holds (`expected(n)`)."""
    want = expected(n)
    prefix = POSITIONAL.get(shape)
    col = lambda name: table[f"{prefix}{NAMES.index(name) + 1}" if prefix else name]  # noqa: E731
    assert table.num_rows == want["rows"]
    if prefix is None:  # the source's column order (a shape may carry more: json_nested's `geo`)
        assert [c for c in table.column_names if c in NAMES] == NAMES, table.column_names
    assert pc.sum(col("id")).as_py() == want["sum_id"]
    assert pc.sum(col("amount")).as_py() == want["sum_amount"]
    price = col("price")
    if pa.types.is_decimal(price.type):
        assert pc.sum(price).as_py() == want["sum_price"]
    else:  # a JSON string, a text cell or a float: the same digits
        assert sum((Decimal(str(v)) for v in price.to_pylist()), Decimal(0)) == want["sum_price"]
    assert pc.sum(col("paid").cast(pa.int64())).as_py() == want["paid"]
    assert pc.max(col("day")).as_py() == want["max_day"]
    assert pc.max(col("ts")).as_py() == want["max_ts"]


def same_table(shape: str, n: int, app, text: str | None = None) -> dict[str, dict]:
    text = text if text is not None else SHAPES[shape](n)
    got = {door: through(door, text, app)[:2] for door in DOORS}
    tool_schema = got["tool"][1].schema
    for door, (art, table) in got.items():
        assert table.schema.names == tool_schema.names, (door, table.schema.names, tool_schema.names)
        assert table.schema.types == tool_schema.types, (door, table.schema, tool_schema)
        assert art["rows"] == table.num_rows == n, (door, art["rows"], table.num_rows)
        check_corpus(shape, table, n)
    return {door: art for door, (art, _) in got.items()}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_is_the_same_table_through_every_door(shape: str, app) -> None:
    arts = same_table(shape, N, app)
    assert all(a["status"] == "ready" for a in arts.values()), {d: a["status"] for d, a in arts.items()}


@pytest.mark.parametrize("shape", FAST)
def test_the_fast_shapes_at_many_batches(shape: str, app) -> None:
    same_table(shape, LARGE, app)


@pytest.mark.parametrize("shape", sorted(TRUNCATED))
def test_a_source_that_cut_its_result_is_partial_through_every_door(shape: str, app) -> None:
    arts = same_table(shape, N, app, TRUNCATED[shape](N, truncated=True))
    for door, art in arts.items():
        assert art["status"] == "partial" and art["partial_by"] == "source", (door, art)
