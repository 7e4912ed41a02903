"""How the last summary refresh of a thread went: the thread's `summary.status` document.

The summary itself keeps the previous version when a refresh fails (DESIGN section 8), so
the failure would leave no trace but a log line. This small record says it: `ok`, or
`failed` with the reason (shown to the user in the context inspector and the chat, and
to the model when history had to leave the window unsummarised). Written through the
`Thread` (`summary.status.json` in the embedded set, a row in the cluster set), only while
the thread is still in the job's epoch (a clear removes it with the summary).
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import msgspec

from datadesk.store.interfaces.threads import SUMMARY_STATUS, Thread

log = logging.getLogger(__name__)

REASON_CHARS = 400  # a reason is for people: bounded


class SummaryStatus(msgspec.Struct, kw_only=True):
    """The outcome of the latest refresh attempt of a thread's summary."""

    state: Literal["ok", "failed"]
    reason: str = ""  # why it failed (the summarizer's or the model's error, never model output)
    attempted_through: int = 0  # the seq the refresh was asked to cover
    epoch: int = 0
    at: float = 0.0
    # back-off (summary/service.py): failures in a row, no new attempt before this seq, and the
    # summarizer settings they were made with (a change resets the back-off)
    failures: int = 0
    next_try_seq: int = 0
    fingerprint: str = ""

    def backing_off(self, upto_seq: int, fingerprint: str) -> bool:
        """True when a refresh through `upto_seq` falls inside the back-off window."""
        return (self.state == "failed" and self.next_try_seq > 0 and upto_seq < self.next_try_seq
                and self.fingerprint == fingerprint)


_decoder = msgspec.json.Decoder(SummaryStatus)


class SummaryStatusStore:
    """Reads and writes the `summary.status` document of a thread."""

    def load(self, thread: Thread, epoch: int | None) -> SummaryStatus | None:
        """The status of `epoch` (None: none yet, unreadable, or from before a clear)."""
        raw = thread.read_doc(SUMMARY_STATUS)
        if raw is None:
            return None
        try:
            status = _decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring an unreadable summary status of %s: %s", thread.id, exc)
            return None
        return status if status.epoch == epoch else None

    def record(self, thread: Thread, epoch: int, state: Literal["ok", "failed"], upto_seq: int,
               reason: str = "", *, failures: int = 0, next_try_seq: int = 0, fingerprint: str = "") -> bool:
        """Store the outcome; False when the thread was cleared or deleted meanwhile. With
        `next_try_seq`, the reason says that summaries are paused and until when."""
        reason = " ".join(reason.split())
        paused = (f"; summaries paused after {failures} failures, next try after record #{next_try_seq - 1}"
                  if next_try_seq else "")
        if len(reason) + len(paused) > REASON_CHARS:
            reason = reason[: max(0, REASON_CHARS - 1 - len(paused))].rstrip() + "…"
        status = SummaryStatus(state=state, reason=reason + paused, attempted_through=upto_seq, epoch=epoch,
                               at=time.time(), failures=failures, next_try_seq=next_try_seq,
                               fingerprint=fingerprint)
        try:
            written = thread.write_doc(SUMMARY_STATUS, status, epoch)
        except OSError as exc:
            log.info("summary status of %s not written: %s", thread.id, exc)
            return False
        if not written:
            log.info("summary status of %s not written: the thread was cleared or deleted", thread.id)
        return written
