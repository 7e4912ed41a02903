"""Refresh schedules (threads/schedule.py): the cron parser, due times in a time zone, validation
naming the field; and the table comparison of a refresh (threads/refresh_compare.py)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.threads.refresh_compare import compare, describe, table_facts
from datadesk.threads.schedule import Cron, ScheduleError, next_due, parse_schedule

BERLIN = ZoneInfo("Europe/Berlin")


def _at(*args: int, tz=BERLIN) -> datetime:
    return datetime(*args, tzinfo=tz)


def test_weekday_mornings() -> None:
    cron = Cron("0 7 * * 1-5")
    assert cron.next_after(_at(2026, 12, 4, 6, 59)) == _at(2026, 12, 4, 7, 0)  # a Friday
    assert cron.next_after(_at(2026, 12, 4, 7, 0)) == _at(2026, 12, 7, 7, 0)  # strictly after: Monday
    assert Cron("*/15 9-10 * * *").next_after(_at(2026, 1, 1, 10, 50)) == _at(2026, 1, 2, 9, 0)
    assert Cron("30 8 1,15 * *").next_after(_at(2026, 1, 2)) == _at(2026, 1, 15, 8, 30)
    assert Cron("0 0 * * 7").next_after(_at(2026, 12, 3)) == _at(2026, 12, 6)  # 7 is Sunday, as 0


def test_either_day_field_matches_when_both_are_set() -> None:
    cron = Cron("0 12 13 * 5")  # the 13th, or any Friday (as cron does)
    assert cron.next_after(_at(2026, 12, 1)) == _at(2026, 12, 4, 12, 0)  # Friday 4th before the 13th
    assert cron.next_after(_at(2026, 12, 11, 13)) == _at(2026, 12, 13, 12, 0)


def test_time_of_day_keeps_the_wall_clock_across_a_dst_change() -> None:
    sched = parse_schedule({"at": "7:30", "tz": "Europe/Berlin"}, "alice", "demo", "t1",
                           _at(2026, 3, 28, 8).timestamp())
    assert sched.at == "07:30"
    first = next_due(sched, _at(2026, 3, 28, 8).timestamp())
    second = next_due(sched, first)
    assert datetime.fromtimestamp(first, BERLIN) == _at(2026, 3, 29, 7, 30)  # the day summer time starts
    assert datetime.fromtimestamp(second, BERLIN) == _at(2026, 3, 30, 7, 30)
    assert second - first == 24 * 3600  # both after the change
    utc = parse_schedule({"at": "07:30", "tz": "UTC"}, "alice", "demo", "t1", 0)
    assert next_due(utc, 0) == 7.5 * 3600


@pytest.mark.parametrize("body, field, needle", [
    ({"at": "25:00"}, "at", "HH:MM"),
    ({"at": 730}, "at", "HH:MM"),
    ({}, "at", "exactly one"),
    ({"at": "07:30", "cron": "0 7 * * *"}, "at", "exactly one"),
    ({"cron": "0 7 * *"}, "cron", "4 fields"),
    ({"cron": "61 7 * * *"}, "cron", "minute: 61 is outside 0-59"),
    ({"cron": "0 7 * * MON"}, "cron", "names such as MON"),
    ({"cron": "0 7 9-3 * *"}, "cron", "backwards"),
    ({"cron": "0 0 30 2 *"}, "cron", "matches no time"),
    ({"at": "07:30", "tz": "Mars/Olympus"}, "tz", "unknown time zone"),
    ({"at": "07:30", "every": "day"}, "every", "not a schedule field"),
    (["07:30"], "body", "JSON object"),
])
def test_bad_schedules_name_the_field(body, field, needle) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule(body, "alice", "demo", "t1", 0)
    assert err.value.field == field and needle in str(err.value) and str(err.value).startswith(f"{field}: ")


def test_compare_rows_schema_and_sums(tmp_path) -> None:
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    pq.write_table(pa.table({"city": ["a", "b"], "kwh": [1.5, 2.5], "n": [1, 2], "gone": [1, 1]}), old)
    pq.write_table(pa.table({"city": ["a"], "kwh": [1.5], "n": [1.0], "extra": ["x"]}), new)
    change = compare(table_facts(old), table_facts(new))
    assert change.changed and (change.rows_old, change.rows_new) == (2, 1)
    assert change.columns_added == ["extra"] and change.columns_removed == ["gone"]
    assert change.types_changed == {"n": ["int64", "double"]}
    assert [(s.column, s.old, s.new) for s in change.sums] == [("kwh", 4.0, 1.5), ("n", 3.0, 1.0)]
    text = describe(change)
    assert "rows 2 -> 1" in text and "columns added: extra" in text and "sum of kwh: 4 -> 1.5" in text
    same = compare(table_facts(old), table_facts(old))
    assert not same.changed and describe(same) == []
    unknown = compare(None, table_facts(new), rows_old=5)  # the old data had expired
    assert unknown.changed and unknown.rows_old == 5 and unknown.sums == []
