"""Python-repr tables (`str(cursor.fetchall())`, as mcp-server-duckdb returns them)."""

from __future__ import annotations

import datetime as dt

import pytest

from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers import repr_batches
from datadesk.offload.readers.pyrepr.exact import looks_like_repr_rows


def rows(text: str) -> list[dict]:
    return [r for b in repr_batches(text, batch_rows=3) for r in b.to_pylist()]


def test_types_quotes_and_brackets_inside_strings() -> None:
    text = ("[(0, 'a (b), [c]', Decimal('1.5'), datetime.date(2024, 1, 2), None, "
            "datetime.datetime(2024, 1, 1, 10, 0, 5), True, -3), "
            "(1, \"it's\", Decimal('-2'), datetime.date(2024, 2, 3), 'x', "
            "datetime.datetime(2024, 1, 1, 11, 0), False, 4)]")
    got = rows(text)
    assert got[0] == {"col_1": 0, "col_2": "a (b), [c]", "col_3": 1.5, "col_4": dt.date(2024, 1, 2),
                      "col_5": None, "col_6": dt.datetime(2024, 1, 1, 10, 0, 5), "col_7": True, "col_8": -3}
    assert got[1]["col_2"] == "it's" and got[1]["col_3"] == -2.0


def test_many_rows_keep_order_and_count() -> None:
    text = "[" + ", ".join(f"({i}, 'n{i}')" for i in range(2_500)) + "]"
    got = rows(text)
    assert len(got) == 2_500 and got[-1] == {"col_1": 2_499, "col_2": "n2499"}


@pytest.mark.parametrize("text,needle", [
    ("[(1, os.system('x'))]", "unsupported value"),
    ("[(1, 2), (3,)]", "ragged"),
    ("[(1, 2), (3, 4)", "cut off"),
    ("[(1, __import__('os'))]", "unsupported value"),
])
def test_anything_else_is_refused_never_evaluated(text, needle) -> None:
    with pytest.raises(TabularParseError, match=needle):
        rows(text)


def test_detection() -> None:
    assert looks_like_repr_rows("  [(1, 2)]") and not looks_like_repr_rows('[{"a": 1}]')
