"""The active-history reader of a branched thread (domain/branches.py): nested edits, regenerate,
reading from the tail, and the branch listing."""

from __future__ import annotations

from datadesk.domain.branches import (abandoned_since, active_newest_first, active_records, branch_points,
                                      branch_records)
from datadesk.domain.records import Record
from datadesk.store.threadlog import ThreadLog


def _u(seq: int, text: str, rewinds_to: int | None = None, branch_of: int | None = None,
       kind: str = "edit") -> Record:
    meta = None if rewinds_to is None else {"kind": kind, "rewinds_to": rewinds_to, "branch_of": branch_of}
    return Record(seq=seq, role="user", ts=float(seq), content=text, meta=meta)


def _a(seq: int, text: str) -> Record:
    return Record(seq=seq, role="assistant", ts=float(seq), content=text)


def nested_log() -> list[Record]:
    """q1 a1 | q2 a2 q3 a3 | edit q2 -> q2' a2' | edit q2' -> q2'' a2'' q4 a4 | regenerate q4 -> a4'"""
    return [
        _u(1, "q1"), _a(2, "a1"),
        _u(3, "q2"), _a(4, "a2"), _u(5, "q3"), _a(6, "a3"),
        _u(7, "q2'", rewinds_to=2, branch_of=3), _a(8, "a2'"),
        _u(9, "q2''", rewinds_to=2, branch_of=7), _a(10, "a2''"), _u(11, "q4"), _a(12, "a4"),
        _u(13, "q4", rewinds_to=10, branch_of=11, kind="regenerate"), _a(14, "a4'"),
    ]


def test_active_history_skips_every_abandoned_branch() -> None:
    active = active_records(nested_log())
    assert [r.content for r in active] == ["q1", "a1", "q2''", "a2''", "q4", "a4'"]
    assert [r.seq for r in active] == [1, 2, 9, 10, 13, 14]


def test_a_tail_slice_filters_exactly_and_stops_early() -> None:
    log = nested_log()
    for n in range(1, len(log) + 1):  # every tail slice: the active records within it
        want = [r.seq for r in active_records(log) if r.seq >= log[-n].seq]
        assert [r.seq for r in active_records(log[-n:])] == want
    read = []

    def newest_first():
        for r in reversed(log):
            read.append(r.seq)
            yield r
    it = active_newest_first(newest_first())
    assert [next(it).seq for _ in range(2)] == [14, 13]
    assert read == [14, 13]  # lazily: nothing older was read


def test_a_marker_inside_an_abandoned_branch_is_abandoned_with_it() -> None:
    log = [_u(1, "q1"), _a(2, "a1"), _u(3, "q1 bis", rewinds_to=0, branch_of=1), _a(4, "b"),
           _u(5, "q1 ter", rewinds_to=0, branch_of=3), _a(6, "c"), _u(7, "q2"), _a(8, "d")]
    # a nested edit on the abandoned stretch (seq 3's rewinds_to=0) does not resurrect records
    assert [r.seq for r in active_records(log)] == [5, 6, 7, 8]


def test_branch_points_list_every_branch_with_its_head() -> None:
    points = branch_points(nested_log())
    assert [p["at"] for p in points] == [2, 10]
    first = points[0]["branches"]
    assert [(b["seq"], b["head"], b["content"], b["active"]) for b in first] == [
        (3, 6, "q2", False), (7, 8, "q2'", False), (9, 14, "q2''", True)]
    assert [b["kind"] for b in first] == ["original", "edit", "edit"]
    second = points[1]["branches"]
    assert [(b["seq"], b["head"], b["active"], b["kind"]) for b in second] == [
        (11, 12, False, "original"), (13, 14, True, "regenerate")]


def test_an_earlier_branch_reads_as_it_stood() -> None:
    log = nested_log()
    assert [r.content for r in branch_records(log, 3)] == ["q2", "a2", "q3", "a3"]
    assert [r.content for r in branch_records(log, 7)] == ["q2'", "a2'"]
    assert [r.content for r in branch_records(log, 11)] == ["q4", "a4"]
    assert branch_records(log, 5) is None  # no branch starts at q3


def test_a_summary_covering_an_abandoned_record_is_stale() -> None:
    log = nested_log()
    # a summary through #6 (q3/a3 of the first branch): the edit at #7 rewinds to #2
    assert abandoned_since([r for r in log if r.seq > 6], 6)
    assert not abandoned_since([r for r in log if r.seq > 2], 2)  # through the branch point: fine
    assert not abandoned_since([_u(3, "q"), _a(4, "a")], 2)  # no branch at all


def test_the_thread_log_on_disk_reads_the_active_branch_from_its_tail(tmp_path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    for rec in nested_log():
        log.append(lambda seq, rec=rec: Record(seq=seq, role=rec.role, ts=rec.ts, content=rec.content,
                                               meta=rec.meta))
    assert [r.seq for r in log] == list(range(1, 15))  # append-only: every record kept
    assert [r.content for r in active_records(log.tail(4))] == ["q4", "a4'"]
    assert [r.seq for r in active_records(list(log))] == [1, 2, 9, 10, 13, 14]
