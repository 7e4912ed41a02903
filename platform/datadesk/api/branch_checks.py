"""Checks of an edit or a regenerate (issue 31, item 3): the question it names, on the newest
branch, and the meta of the new user record (the format: domain/branches.py)."""

from __future__ import annotations

from typing import Any

from litestar.exceptions import ClientException, NotFoundException

from datadesk.domain.branches import active_newest_first
from datadesk.domain.records import Record


def branch_meta(handle: Any, seq: int, kind: str) -> tuple[Record, dict[str, Any]]:
    """The question at user record `seq` of the active branch and the new user record's meta
    (`kind`, `rewinds_to`: the active record before it, `branch_of`). 4xx with a clear message
    for an unknown seq, a record that is not the user's question, or one of an earlier branch."""
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ClientException(f"seq must be a positive integer, got {seq!r}")
    found = [r for r in handle.log.since(seq, seq) if r.seq == seq]
    if not found:
        raise NotFoundException(f"no record #{seq} in thread {handle.id}")
    rec = found[0]
    if rec.role != "user" or (rec.meta or {}).get("kind") == "upload":
        raise ClientException(f"record #{seq} is not a question (it is a {rec.role} record): "
                              "only the user's own questions can be edited or regenerated")
    before, on_active = 0, False
    for r in active_newest_first(handle.log.newest_first()):
        if r.seq == seq:
            on_active = True
        elif r.seq < seq:
            before = r.seq
            break
    if not on_active:
        raise ClientException(f"record #{seq} belongs to an earlier branch: continue on the newest branch")
    return rec, {"kind": kind, "rewinds_to": before, "branch_of": seq}


def last_question(handle: Any) -> int:
    """The seq of the active branch's last question (400 when the thread has none)."""
    for r in active_newest_first(handle.log.newest_first()):
        if r.role == "user" and (r.meta or {}).get("kind") != "upload":
            return r.seq
    raise ClientException("the thread has no question to regenerate")
