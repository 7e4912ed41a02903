"""Branches of a thread: an edited question or a regenerated answer (issue 31, item 3).

The log stays append-only. Editing the question at user record S, or regenerating its answer,
appends ONE new user record whose `meta` says where the thread continues from:

    {"seq": 9, "role": "user", "content": "<new text>", ...,
     "meta": {"kind": "edit" | "regenerate", "rewinds_to": 4, "branch_of": 5}}

`rewinds_to` is the last record the new branch shares with the old one (S - 1); `branch_of` is
S. Every record with `rewinds_to < seq < <the marker's seq>` belongs to the earlier branch: kept
on disk, listed and viewable, never part of the active history.

The active history is read from the tail: newest first, a kept marker hides the records between
its `rewinds_to` and itself; a marker inside an abandoned stretch is abandoned with it (so nested
branches resolve). A tail slice of the log filters exactly: a marker is always newer than the
records it hides.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from datadesk.domain.records import Record

BRANCH_KINDS = frozenset({"edit", "regenerate"})


def rewinds_to(rec: Record) -> int | None:
    """The seq a branch marker rewinds to (None: not a marker)."""
    meta = rec.meta
    if rec.role != "user" or not meta or meta.get("kind") not in BRANCH_KINDS:
        return None
    value = meta.get("rewinds_to")
    return value if isinstance(value, int) else None


def marked_newest_first(newest_first: Iterable[Record]) -> Iterator[tuple[Record, bool]]:
    """Every record, newest first, with whether it is on the active branch (False: an earlier
    branch's record); stop early to read less."""
    hide_above: int | None = None
    for rec in newest_first:
        if hide_above is not None and rec.seq > hide_above:
            yield rec, False  # an earlier branch's record
            continue
        hide_above = None
        yield rec, True
        cut = rewinds_to(rec)
        if cut is not None:
            hide_above = cut


def active_newest_first(newest_first: Iterable[Record]) -> Iterator[Record]:
    """The records of the active branch, newest first (stop early to read less)."""
    return (rec for rec, active in marked_newest_first(newest_first) if active)


def abandoned_stretch(rec: Record) -> tuple[int, int] | None:
    """The seqs a branch marker leaves behind, as the open range (rewinds_to, marker seq): every
    record strictly between the two belongs to an earlier branch. None: not a marker."""
    cut = rewinds_to(rec)
    return None if cut is None else (cut, rec.seq)


def active_records(records: list[Record]) -> list[Record]:
    """The active branch of a run of records (oldest first, e.g. a tail slice), oldest first."""
    return list(active_newest_first(reversed(records)))[::-1]


def abandoned_since(records: list[Record], covers: int) -> bool:
    """Whether an active marker among `records` (the records after `covers`, a summary's
    coverage) rewinds to before `covers`: the summary holds an earlier branch's records."""
    return any((cut := rewinds_to(r)) is not None and cut < covers for r in active_records(records))


def branch_points(records: list[Record]) -> list[dict[str, Any]]:
    """Every branch point of a whole log (oldest first): where it forks (`at`: the shared last
    seq), and its branches in the order made: first user seq, last seq (head), the question,
    whether it is on the active path. Reads the whole log: for listing, never per turn."""
    markers = [(r.seq, cut) for r in records if (cut := rewinds_to(r)) is not None]
    if not markers:
        return []
    last = records[-1].seq
    active = {r.seq for r in active_records(records)}
    by_seq = {r.seq: r for r in records}
    out = []
    for at in sorted({cut for _, cut in markers}):
        firsts = [next((r.seq for r in records if r.seq > at and r.role == "user"), None)]
        firsts += [seq for seq, cut in markers if cut == at]
        branches = []
        for first in [f for f in firsts if f is not None]:
            head = next((m - 1 for m, cut in markers if m > first and cut < first), last)
            rec = by_seq[first]
            branches.append({"seq": first, "head": head, "content": rec.content[:200],
                             "kind": (rec.meta or {}).get("kind", "original") if rewinds_to(rec) is not None
                             else "original", "active": first in active})
        out.append({"at": at, "branches": branches})
    return out


def branch_records(records: list[Record], first: int) -> list[Record] | None:
    """The records of the branch that starts at user record `first` as it stood at its head
    (its own later edits resolved), from `first` on; None when no branch starts there."""
    for point in branch_points(records):
        for b in point["branches"]:
            if b["seq"] == first:
                upto = [r for r in records if r.seq <= b["head"]]
                return [r for r in active_records(upto) if r.seq >= first]
    return None
