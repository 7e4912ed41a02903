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
