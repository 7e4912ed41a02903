"""The direct HTML of a plain pipe table (api/table_html.py) is exactly what markdown-it and the
sanitizer make of it, for previews of real data and for random tables; a table it cannot render
plainly is left to markdown-it."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from datadesk.api.render import _NUMBER_CELL, markdown_html, model_img_src, sanitize, tool_html
from datadesk.api.table_html import plain_table_html
from datadesk.offload.preview import table_rows


def both(lines: list[str]) -> tuple[str | None, str]:
    plain = plain_table_html(lines, _NUMBER_CELL)
    return (None if plain is None else sanitize(plain, img_src=model_img_src())), markdown_html("\n".join(lines))


def test_previews_of_real_columns_render_as_markdown_it_renders_them():
    table = pa.table({
        "id": pa.array([1, 2, None, -4], pa.int64()),
        "kwh": pa.array([1.5, -0.25, 1e-9, float("nan")], pa.float64()),
        "price": pa.array([decimal.Decimal("1.20"), None, decimal.Decimal("-3"), decimal.Decimal("0")],
                          pa.decimal128(10, 2)),
        "ts": pa.array([dt.datetime(2025, 1, 1, 0, 0), dt.datetime(2025, 6, 30, 23, 59, 59, 5), None,
                        dt.datetime(1999, 12, 31)], pa.timestamp("us")),
        "day": pa.array([dt.date(2025, 1, 1), None, dt.date(2024, 2, 29), dt.date(2000, 1, 1)]),
        "name": pa.array(["Amsterdam Noord", "Zürich", "O'Brien (HQ)", "B-02/3"]),
        "ok": pa.array([True, False, None, True]),
        "n": pa.array([1, 22, 333, -4444]),
    })
    lines = table_rows(table, 20, 8, 60).splitlines()
    plain, markdown = both(lines)
    assert plain is not None and plain == markdown
    assert '<td class="dd-al-right">-4444</td>' in plain and "<td>Zürich</td>" in plain
    assert "<td>null</td>" in plain  # a column with a null is not a column of numbers, for either


def test_cells_with_markdown_or_html_are_left_to_markdown_it():
    for cell in ("**bold**", "_em_", "a _b_", "x__", "__init__", "`code`", "<b>x</b>", "&amp;", "[a](http://x)", "a\\|b", "~~s~~", "!x"):
        lines = ["| a | b |", "|---|---|", f"| {cell} | 1 |"]
        assert plain_table_html(lines, _NUMBER_CELL) is None, cell
    assert plain_table_html(["| a | b |", "|:--|--:|", "| 1 | 2 |"], _NUMBER_CELL) is None  # alignment
    assert plain_table_html(["| a | b |", "|---|---|", "| 1 | 2 | 3 |"], _NUMBER_CELL) is None  # widths


PLAIN = st.text(alphabet="abcXYZ019 .,:;+-/%#@?=()'\"$€−^{}éü_", max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5).flatmap(lambda w: st.tuples(
    st.lists(PLAIN, min_size=w, max_size=w),
    st.lists(st.lists(PLAIN, min_size=w, max_size=w), max_size=6))))
def test_random_plain_tables_render_as_markdown_it_renders_them(table):
    header, rows = table
    if any(not h.strip() for h in header):  # an empty header cell is fine for both, but keep it readable
        header = [h if h.strip() else "c" for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    plain, markdown = both(lines)
    if plain is not None:
        assert plain == markdown, lines


def test_an_offloaded_preview_card_is_the_same_as_before():
    table = pa.table({"building_id": ["B01", "B02"], "kwh": [1.25, 3.5]})
    preview = table_rows(table, 20, 8, 60)
    content = ("[Result saved as artifact a1: the full data is NOT in this message.]\nrows: 2 | columns: 2\n"
               f"preview (first 2 of 2 rows):\n{preview}\nNOTICE: this is a preview of 2 rows, NOT the full data.")
    out = tool_html(content)
    assert out.startswith('<div class="preview-table">' + markdown_html(preview) + "</div>")
    assert plain_table_html(preview.splitlines(), _NUMBER_CELL) is not None  # `building_id` is plain
