"""What the "for readers" export keeps of an answer (threads/reader_export.py)."""

from __future__ import annotations

import pytest

from datadesk.threads.reader_export import for_readers


def test_notice_lines_and_sandbox_folders_are_left_out() -> None:
    answer = ("Total use was **1,234 kWh** (see `/outputs/report.md` and /data/art_1.parquet).\n"
              "NOTICE: this is a preview of 10 rows, NOT the full data. Do not compute totals\n"
              "> NOTICE: quoted by the model\n"
              "PARTIAL: the result hit the size ceiling; exactly 5 rows were written.\n"
              "| b | kwh |\n|---|--:|\n| B07 | 12 |")
    out = for_readers(answer)
    assert "NOTICE" not in out and "PARTIAL" not in out and "/outputs/" not in out and "/data/" not in out
    assert "`report.md`" in out and "art_1.parquet" in out and "| B07 | 12 |" in out


@pytest.mark.parametrize("kept", ["see https://example.com/data/x.csv", "ratio 3/data", "a notice: none",
                                  "dir ./outputs/x stays"])
def test_text_that_only_looks_similar_is_kept(kept: str) -> None:
    assert for_readers(kept) == kept


def test_a_chart_table_is_bounded_and_reads_named_datasets(tmp_path) -> None:
    import json

    from datadesk.threads.chart_table import MAX_COLS, chart_table

    row = {f"c{i}": "x" * 100 for i in range(12)}
    spec = {"data": {"name": "d1"}, "datasets": {"d1": [row] * 30}, "mark": "bar"}
    path = tmp_path / "a.vljson"
    path.write_text(json.dumps(spec))
    t = chart_table(path, "T")
    assert len(t.columns) == MAX_COLS and len(t.rows) == 20 and t.total_rows == 30
    assert all(len(v) <= 60 for v in t.rows[0]) and "first 20 of 30 data rows" in t.markdown()
    assert chart_table(tmp_path / "gone.vljson", None).markdown().startswith("**Chart**")
    path.write_text("{not json")
    assert chart_table(path, "T").columns == []
