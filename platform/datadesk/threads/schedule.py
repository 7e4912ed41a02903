"""When a thread refreshes itself: a time of day or a 5-field cron expression, in a time zone.

`PUT /api/threads/{tid}/schedule` takes `{"at": "07:30"}` or `{"cron": "0 7 * * 1-5"}`, with an
optional `tz` (an IANA name such as "Europe/Berlin"; the server's time zone when absent). The
schedule is the thread's `schedule` document; threads/scheduler.py runs what is due.

Cron (the classic five fields, minute hour day-of-month month day-of-week): `*`, numbers, ranges
`a-b`, steps `*/n` and `a-b/n`, lists `a,b`; day-of-week 0-7 (0 and 7: Sunday); month and day
names are not accepted. As in cron, when both day fields are restricted a day matching either
one is due.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

_AT = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
SEARCH_DAYS = 366 * 5  # a cron that matches no day within this (e.g. 30 February) is refused
MAX_CRON_CHARS = 200


class ScheduleError(ValueError):
    """A bad schedule: `field` names the JSON field (API: 400 naming it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class RefreshSchedule(msgspec.Struct, omit_defaults=True):
    """A thread's schedule and what its last run did (the `schedule` document)."""

    owner: str
    workspace: str
    thread: str
    created: float
    at: str | None = None
    cron: str | None = None
    tz: str | None = None  # None: the server's time zone
    handled_until: float | None = None  # the last due time run (or skipped); the next is after it
    last_run: float | None = None
    last_status: str | None = None  # ok | failed
    last_changes: int | None = None
    last_error: str | None = None


class Cron:
    """A parsed 5-field cron expression."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ScheduleError("cron", "must be a cron expression of 5 fields, e.g. \"0 7 * * 1-5\"")
        if len(text) > MAX_CRON_CHARS:
            raise ScheduleError("cron", f"is too long (at most {MAX_CRON_CHARS} characters)")
        parts = text.split()
        if len(parts) != 5:
            raise ScheduleError("cron", f"has {len(parts)} fields; it needs 5 (minute hour day-of-month month "
                                        "day-of-week), e.g. \"0 7 * * 1-5\"")
        self.text = " ".join(parts)
        sets = [_field(p, *spec) for p, spec in zip(parts, _FIELDS)]
        self.minutes, self.hours, self.days, self.months, dow = sets
        self.weekdays = {d % 7 for d in dow}  # 0 = Sunday
        self.any_day, self.any_weekday = parts[2] == "*", parts[4] == "*"

    def day_matches(self, d: datetime) -> bool:
        if d.month not in self.months:
            return False
        by_dom = d.day in self.days
        by_dow = (d.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return by_dom and by_dow
        return by_dom or by_dow

    def next_after(self, after: datetime) -> datetime:
        """The first due minute strictly after `after` (an aware datetime; same zone back)."""
        start = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
        day = start.replace(hour=0, minute=0)
        for i in range(SEARCH_DAYS):
            d = day + timedelta(days=i)
            if not self.day_matches(d):
                continue
            for h in sorted(self.hours):
                for m in sorted(self.minutes):
                    # built from wall-clock fields: a day that changes its UTC offset stays right
                    t = datetime(d.year, d.month, d.day, h, m, tzinfo=after.tzinfo)
                    if t >= start:
                        return t
        raise ScheduleError("cron", f"{self.text!r} matches no time in the next {SEARCH_DAYS // 366} years")


def _field(text: str, name: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for item in text.split(","):
        rng, _, step_s = item.partition("/")
        step = _number(step_s, name, 1, hi) if step_s else 1
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a_s, _, b_s = rng.partition("-")
            a, b = _number(a_s, name, lo, hi), _number(b_s, name, lo, hi)
            if a > b:
                raise ScheduleError("cron", f"{name}: the range {rng!r} runs backwards")
        else:
            a = b = _number(rng, name, lo, hi)
            if step_s:
                b = hi
        out.update(range(a, b + 1, step))
    return out


def _number(text: str, name: str, lo: int, hi: int) -> int:
    if not text.isdigit():
        raise ScheduleError("cron", f"{name}: {text!r} is not a number (names such as MON are not accepted)")
    n = int(text)
    if not lo <= n <= hi:
        raise ScheduleError("cron", f"{name}: {n} is outside {lo}-{hi}")
    return n


def zone(name: str | None) -> tzinfo:
    """The time zone `name` (None: the server's own)."""
    if name is None:
        local = datetime.now().astimezone().tzinfo
        assert local is not None
        return local
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError("tz", f"unknown time zone {name!r} (an IANA name such as \"Europe/Berlin\")") from None


def cron_of(schedule: RefreshSchedule) -> Cron:
    """`at: "HH:MM"` is the cron `MM HH * * *`."""
    if schedule.at is not None:
        h, m = schedule.at.split(":")
        return Cron(f"{int(m)} {int(h)} * * *")
    return Cron(schedule.cron or "")


def next_due(schedule: RefreshSchedule, after: float) -> float:
    """The first due time (epoch seconds) strictly after `after`."""
    tz = zone(schedule.tz)
    return cron_of(schedule).next_after(datetime.fromtimestamp(after, tz)).timestamp()


def parse_schedule(body: Any, owner: str, workspace: str, thread: str, now: float) -> RefreshSchedule:
    """The schedule the JSON `body` asks for (ScheduleError naming the bad field)."""
    if not isinstance(body, dict):
        raise ScheduleError("body", "must be a JSON object: {\"at\": \"07:30\"} or {\"cron\": \"0 7 * * 1-5\"}")
    unknown = sorted(set(body) - {"at", "cron", "tz"})
    if unknown:
        raise ScheduleError(unknown[0], "is not a schedule field (known: at, cron, tz)")
    at, cron, tz = body.get("at"), body.get("cron"), body.get("tz")
    if (at is None) == (cron is None):
        raise ScheduleError("at", "give exactly one of `at` (a time of day, \"07:30\") or `cron`")
    if at is not None:
        if not isinstance(at, str) or not _AT.match(at.strip()):
            raise ScheduleError("at", f"{at!r} is not a time of day as HH:MM (00:00-23:59)")
        h, m = at.strip().split(":")
        at = f"{int(h):02d}:{m}"
    if tz is not None and not isinstance(tz, str):
        raise ScheduleError("tz", "must be a time zone name such as \"Europe/Berlin\"")
    zone(tz)
    sched = RefreshSchedule(owner=owner, workspace=workspace, thread=thread, created=now, at=at,
                            cron=" ".join(cron.split()) if isinstance(cron, str) else cron, tz=tz,
                            handled_until=now)
    next_due(sched, now)  # a cron that never matches is refused now, not at run time
    return sched


def describe(schedule: RefreshSchedule, now: float) -> dict[str, Any]:
    """The schedule as the API shows it, with its next due time (ISO, in its zone)."""
    out: dict[str, Any] = msgspec.to_builtins(schedule)
    due = next_due(schedule, max(now, schedule.handled_until or now))
    out["next_run"] = datetime.fromtimestamp(due, zone(schedule.tz)).isoformat(timespec="minutes")
    return out
