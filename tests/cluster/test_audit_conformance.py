"""The audit trail on both sets (day files under <home>/audit; the `audit_events` table): entries
read back newest first with their fields, every filter, cursor paging that neither skips nor
repeats, retention by whole days, several workers or hosts appending at once, a log that cannot
be written never failing its caller, and secrets kept out."""

from __future__ import annotations

import json
import logging

import pytest

from datadesk.audit import AuditFilter, AuditTrail
from datadesk.audit.dayfiles import DayFiles
from tests.cluster import sets

pytestmark = pytest.mark.cluster

DAY = 86400.0
NOW = 1_800_000_000.0  # a fixed "now" (2027-01-15): the tests set the clock


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        self.t += 0.001  # every entry its own time
        return self.t


class Hosts(sets.Hosts):
    """Makes `AuditTrail`s of one set; `trail(new_host=True)` is another worker or host."""

    def __init__(self, kind, request, tmp_path) -> None:
        super().__init__(kind, request, tmp_path)
        self.home = tmp_path

    def trail(self, clock=None, retention_days: int = 0, new_host: bool = False) -> AuditTrail:
        clock = clock or Clock()
        if self.kind == "embedded":
            return AuditTrail(DayFiles(self.home / "audit"), retention_days, host="h", clock=clock)
        from datadesk.cluster.audit import AuditTable

        db = self.database("host-b", max_size=4) if new_host else self.db
        return AuditTrail(AuditTable(db), retention_days, host="h", clock=clock)


hosts = sets.hosts_fixture(Hosts)


def _fill(trail: AuditTrail, n: int) -> None:
    for i in range(n):
        trail.record("query" if i % 2 else "download", user=f"u{i % 3}", outcome="error" if i % 5 == 0 else "ok",
                     workspace="sales", source="warehouse" if i % 2 else None, sql=f"SELECT {i}", rows=i)


def _all(trail: AuditTrail, flt: AuditFilter = AuditFilter(), limit: int = 7) -> list:
    out, cursor, pages = [], None, 0
    while True:
        page = trail.page(flt, cursor, limit)
        out.extend(page.entries)
        pages += 1
        assert len(page.entries) <= limit and pages < 1000
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def test_an_entry_reads_back_with_every_field(hosts) -> None:
    trail = hosts.trail()
    trail.record("query", user="alice", workspace="sales", thread="t1", source="crm", sql="SELECT 1", rows=1,
                 bytes=10, duration_ms=2.5, client="127.0.0.1")
    trail.record("sign_in", user="bob", outcome="refused", detail="bad code")
    newest, older = trail.page(AuditFilter()).entries
    assert (newest.action, newest.user, newest.outcome, newest.detail) == ("sign_in", "bob", "refused", "bad code")
    got = {k: v for k, v in older.public().items() if v is not None}
    assert got == {"ts": pytest.approx(NOW + 0.001), "action": "query", "user": "alice", "outcome": "ok",
                   "workspace": "sales", "thread": "t1", "source": "crm", "sql": "SELECT 1", "rows": 1,
                   "bytes": 10, "duration_ms": 2.5, "client": "127.0.0.1", "host": "h",
                   "time": "2027-01-15T08:00:00.001Z"}, got


def test_paging_newest_first_neither_skips_nor_repeats(hosts) -> None:
    trail = hosts.trail()
    _fill(trail, 60)
    got = _all(trail)
    assert [e.rows for e in got] == list(range(59, -1, -1))


@pytest.mark.parametrize("flt, want", [
    (AuditFilter(user="u1"), lambda i: i % 3 == 1),
    (AuditFilter(source="warehouse"), lambda i: i % 2 == 1),
    (AuditFilter(action="download"), lambda i: i % 2 == 0),
    (AuditFilter(outcome="error"), lambda i: i % 5 == 0),
    (AuditFilter(outcome="ok", user="u2"), lambda i: i % 5 != 0 and i % 3 == 2),
    (AuditFilter(since=NOW + 0.0105, until=NOW + 0.0305), lambda i: 10 <= i < 30),
    (AuditFilter(user="nobody"), lambda i: False),
])
def test_each_filter_returns_exactly_its_entries(hosts, flt, want) -> None:
    trail = hosts.trail()
    _fill(trail, 40)
    assert [e.rows for e in _all(trail, flt, limit=4)] == [i for i in range(39, -1, -1) if want(i)]


def test_entries_of_several_days_page_across_the_days(hosts) -> None:
    clock = Clock()
    trail = hosts.trail(clock)
    for d in range(4):
        clock.t = NOW - (3 - d) * DAY
        _fill(trail, 5)
    got = _all(trail, limit=3)
    assert len(got) == 20 and [e.ts for e in got] == sorted((e.ts for e in got), reverse=True)
    day2 = _all(trail, AuditFilter(since=NOW - 2 * DAY, until=NOW - DAY), limit=2)
    assert len(day2) == 5 and all(NOW - 2 * DAY <= e.ts < NOW - DAY for e in day2), day2


def test_a_cursor_it_did_not_give_is_refused(hosts) -> None:
    trail = hosts.trail()
    _fill(trail, 3)
    with pytest.raises(ValueError, match="cursor"):
        trail.page(AuditFilter(), "../../etc/passwd", 10)


def test_retention_removes_whole_old_days_and_keeps_the_rest(hosts) -> None:
    clock = Clock()
    trail = hosts.trail(clock, retention_days=0)
    for age in (40, 31, 29, 1, 0):
        clock.t = NOW - age * DAY
        trail.record("sign_in", user=f"age{age}")
    keeper = hosts.trail(Clock(NOW), retention_days=30)
    keeper.sweep(NOW)
    assert sorted(e.user for e in _all(keeper)) == ["age0", "age1", "age29"]
    hosts.trail(Clock(NOW), retention_days=0).sweep(NOW + 1000 * DAY)  # 0: kept forever
    assert len(_all(keeper)) == 3


def test_two_workers_appending_at_once_lose_and_tear_nothing(hosts) -> None:
    import threading

    a, b = hosts.trail(), hosts.trail(new_host=True)
    big = "x" * 30_000  # longer than a pipe's atomic write: still one line each

    def work(trail, who):
        for i in range(200):
            trail.record("query", user=who, sql=f"SELECT '{big}' -- {i}" if i % 20 == 0 else f"SELECT {i}", rows=i)

    threads = [threading.Thread(target=work, args=(t, w)) for t, w in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = _all(a, limit=500)
    assert sorted((e.user, e.rows) for e in got) == sorted((w, i) for w in "ab" for i in range(200))


def test_a_log_that_cannot_be_written_never_fails_its_caller(hosts, caplog) -> None:
    if hosts.kind == "embedded":
        hosts.home.joinpath("audit").write_text("a file where the folder should be")
        trail = hosts.trail()
    else:
        trail = hosts.trail(new_host=True)
        trail.store.db.close()
    with caplog.at_level(logging.ERROR, logger="datadesk.audit.trail"):
        trail.record("query", user="alice", sql="SELECT secret_column FROM t")
    assert "could not record query by alice" in caplog.text
    assert "secret_column" not in caplog.text  # the SQL stays out of the log


def test_secrets_are_kept_out_of_the_entry(hosts, monkeypatch) -> None:
    monkeypatch.setenv("DATADESK_SECRET_KEY", "sess-secret-" + "q" * 20)
    trail = hosts.trail()
    trail.record("query", user="alice", source="crm",
                 sql="SELECT * FROM dblink('postgresql://app:Hunter2Pass@db/crm', 'x') -- sess-secret-" + "q" * 20,
                 detail="password=Tr0ub4dor&3x")
    (ev,) = trail.page(AuditFilter()).entries
    text = json.dumps(ev.public())
    for secret in ("Hunter2Pass", "Tr0ub4dor", "sess-secret-"):
        assert secret not in text, text


def test_a_cursor_deep_in_the_log_reads_on_from_there(hosts) -> None:
    trail = hosts.trail()
    _fill(trail, 300)
    first = trail.page(AuditFilter(), None, 100)
    second = trail.page(AuditFilter(), first.next_cursor, 100)
    assert [e.rows for e in second.entries] == list(range(199, 99, -1))


def test_an_entry_the_database_cannot_take_is_kept_in_the_spill_files(hosts, caplog) -> None:
    if hosts.kind == "embedded":
        pytest.skip("the embedded set's log is the day files themselves")
    from datadesk.cluster.audit import build_audit

    trail = build_audit(hosts.database("host-b", max_size=2), 30, "h", hosts.home / "audit-spill")
    trail.record("query", user="alice", sql="SELECT 1")
    trail.store.db.close()  # the database is gone for this host
    with caplog.at_level(logging.WARNING, logger="datadesk.audit.trail"):
        trail.record("query", user="alice", source="crm", sql="SELECT 2")
    assert "kept in this host's audit spill files" in caplog.text
    (spilled,) = trail.fallback.page(AuditFilter()).entries
    assert (spilled.user, spilled.source, spilled.sql) == ("alice", "crm", "SELECT 2")
    assert [e.sql for e in hosts.trail().page(AuditFilter()).entries] == ["SELECT 1"]
