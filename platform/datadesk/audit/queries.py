"""The audit entry of one `sql_query` call (tools/sql.py): written exactly once, however the call
ends -- answered inline, streamed to its end by the offload writer, refused before it ran, failed,
timed out or cancelled -- so a running query cannot skip it.

The entry is written when the source's work is over: at once for a result read whole, and for a
streamed one when its last batch was read (in the reader's thread) or the stream was closed
before that (the call stopped, the writer gave up). `rows` and `bytes` count what the source
returned (Arrow bytes), never the rows themselves.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import pyarrow as pa

    from datadesk.audit.trail import AuditTrail

# an error's class (or a base of it) -> (outcome, detail words); the first name found in its MRO wins.
# Details are words of ours, never the engine's message (it may quote a value of the data).
_OUTCOMES = {
    "CancelledError": ("cancelled", "the call was stopped"),
    "SQLCancelled": ("cancelled", "the call was stopped"),
    "SQLRefused": ("refused", "not one read-only statement"),
    "SourceRefused": ("refused", "the source's login may write"),
    "SourceBusy": ("refused", "no free session of the source"),
    "Busy": ("refused", "no query slot free"),
    "SQLTimeout": ("error", "timed out"),
    "TimeoutError": ("error", "timed out"),
    "SQLLimit": ("error", "stopped at a memory or temp space limit"),
    "SourceDown": ("error", "the source cannot be reached"),
    "SQLError": ("error", "the statement failed"),
}


def outcome_of(exc: BaseException, before_run: bool = False) -> tuple[str, str]:
    """The outcome and detail words an entry records for `exc`."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _OUTCOMES:
            outcome, detail = _OUTCOMES[cls.__name__]
            if before_run and outcome == "error":  # unknown source, a statement the check rejects
                return "refused", "rejected before it ran"
            return outcome, detail
    return ("refused", "rejected before it ran") if before_run else ("error", type(exc).__name__)


class QueryEntry:
    """The one audit entry of one query call; every method may be called from any thread and
    only the first `done` writes. A None `trail` records nothing (a registry without audit)."""

    def __init__(self, trail: "AuditTrail | None", user: str, workspace: str, thread: str, source: str,
                 sql: str) -> None:
        self.trail = trail
        self.who = (user, workspace, thread)
        self.source = source
        self.sql = sql
        self.started = time.perf_counter()
        self.rows = 0
        self.bytes = 0
        self._lock = threading.Lock()
        self._done = False

    def done(self, outcome: str = "ok", detail: str | None = None, rows: int | None = None,
             nbytes: int | None = None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        if self.trail is None:
            return
        user, workspace, thread = self.who
        self.trail.record("query", user=user, outcome=outcome, workspace=workspace, thread=thread,
                          source=self.source, sql=self.sql, rows=self.rows if rows is None else rows,
                          bytes=self.bytes if nbytes is None else nbytes,
                          duration_ms=(time.perf_counter() - self.started) * 1000, detail=detail)

    def failed(self, exc: BaseException, before_run: bool = False) -> None:
        outcome, detail = outcome_of(exc, before_run)
        self.done(outcome, detail)

    def refused(self, detail: str) -> None:
        self.done("refused", detail, 0, 0)

    def counting(self, batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        """`batches`, counted; the entry written when the last one was read or reading failed."""
        try:
            for batch in batches:
                self.rows += batch.num_rows
                self.bytes += batch.nbytes
                yield batch
        except BaseException as exc:  # GeneratorExit too: the reader stopped before the end
            if isinstance(exc, GeneratorExit):
                self.closed()
            else:
                self.failed(exc)
            raise
        self.done("ok")

    def closed(self) -> None:
        """The stream was closed: an entry not written yet was stopped before its end."""
        self.done("cancelled", "closed before its end")
