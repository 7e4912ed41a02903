"""What pandas and numpy 2 really write when a tool returns `str(df.to_dict(...))` or rows of
numpy scalars: `Timestamp('...', tz='UTC')`, `NaT`, `nan` for a missing text, `np.int64(1)`,
`np.True_` ... Each becomes a typed column with nulls where pandas meant "missing", on every
repr path (the fast ones and the exact `ast` one)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest

from datadesk.offload.readers import parse_text

UTC = dt.timezone.utc


def _rows(text: str) -> list[dict]:
    stream = parse_text(text)
    assert stream is not None, text[:200]
    return [r for b in stream for r in b.to_pylist()]


def _frame() -> pd.DataFrame:
    return pd.DataFrame({
        "a": [1, 2, 3],
        "f": [0.5, np.nan, 2.0],
        "t": pd.to_datetime(["2024-01-01 00:00:00", "2024-01-02 10:30:00.5", None], format="ISO8601"),
        "tz": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"]).tz_localize("UTC"),
        "s": ["x", None, "it's"],
        "b": [True, False, True],
    })


@pytest.mark.parametrize("orient", ["records", "list", "iterrows", "tuples"])
def test_what_pandas_writes_is_read_with_its_types_and_missing_values(orient: str) -> None:
    df = _frame()
    value = {"records": lambda: df.to_dict("records"), "list": lambda: df.to_dict("list"),
             "iterrows": lambda: [dict(r) for _, r in df.iterrows()],
             "tuples": lambda: list(df.itertuples(index=False, name=None))}[orient]()
    rows = _rows(repr(value))
    cols = list(df.columns)
    got = {c: [list(r.values())[i] for r in rows] for i, c in enumerate(cols)}
    assert got["a"] == [1, 2, 3] and got["b"] == [True, False, True]
    assert got["f"][0] == 0.5 and math.isnan(got["f"][1]) and got["f"][2] == 2.0
    assert got["t"] == [dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2, 10, 30, 0, 500000), None]
    assert [v.astimezone(UTC) for v in got["tz"]] == [dt.datetime(2024, 1, d, tzinfo=UTC) for d in (1, 2, 3)]
    assert got["s"] == ["x", None, "it's"]  # pandas' NaN for a missing text is a null, not "nan"


@pytest.mark.parametrize("text,want", [
    ("[{'a': 1, 's': 'x'}, {'a': 2, 's': nan}]", [("x",), (None,)]),  # the fast paths
    ("[(1, 'x'), (2, nan)]", [("x",), (None,)]),
    ("{'a': [1, 2], 's': ['x', nan]}", [("x",), (None,)]),
    ("[(1, 'nan'), (2, 'x')]", [("nan",), ("x",)]),  # a quoted 'nan' is text
    ("[(1, np.int64(5), np.float64(0.5), np.str_('a'), np.True_, np.datetime64('2024-01-01T00:00:00.000000'), NaT)]",
     [(5, 0.5, "a", True, dt.datetime(2024, 1, 1), None)]),
    ("[(1, Timestamp('2024-01-01 00:00:00+0100', tz='Europe/Paris'))]",
     [(dt.datetime(2023, 12, 31, 23, 0, tzinfo=UTC),)]),
])
def test_missing_values_and_numpy_scalars(text: str, want: list[tuple]) -> None:
    rows = _rows(text)
    got = [tuple(list(r.values())[1:]) for r in rows]
    got = [tuple(v.astimezone(UTC) if isinstance(v, dt.datetime) and v.tzinfo else v for v in r) for r in got]
    assert got == want


def test_a_float_column_keeps_its_nan_and_mixed_text_stays_text() -> None:
    rows = _rows("[(1, nan, 'a'), (2, 1.5, 3)]")
    assert math.isnan(rows[0]["col_2"]) and rows[1]["col_2"] == 1.5
    assert [r["col_3"] for r in rows] == ["a", "3"]
