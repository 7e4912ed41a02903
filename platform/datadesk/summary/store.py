"""A thread's summary and its bounded revision history, written with guards.

A write is dropped (returns False) when
- the thread is gone, or its epoch is no longer the one the job started in
  (the chat was cleared while the summarizer ran), or
- the stored summary of this epoch already covers as far or farther (an older
  job that finished late must not replace a newer summary).

The check and the write happen while holding the thread (`Thread.guarded`: the
lock or row that appends and clear take), so a clear cannot interleave. The
replaced version is appended to the thread's summary revisions, which keep only
the newest `revisions_kept` lines. Both are the `Thread`'s documents
(store/interfaces/threads.py): `summary.json` and `summary.revisions.jsonl` in the embedded
set, each replaced atomically; rows in the cluster set.
"""

from __future__ import annotations

import logging

import msgspec

from datadesk.store.interfaces.threads import SUMMARY, SUMMARY_REVISIONS, LogClosed, Thread
from datadesk.summary.model import ThreadSummary

log = logging.getLogger(__name__)

_decoder = msgspec.json.Decoder(ThreadSummary)
_encoder = msgspec.json.Encoder()


class SummaryStore:
    """Reads and writes the summary of a thread (its documents are the `Thread`'s)."""

    def __init__(self, revisions_kept: int = 10) -> None:
        self.revisions_kept = max(0, int(revisions_kept))

    def load(self, thread: Thread) -> ThreadSummary | None:
        """The stored summary, or None (none yet, or unreadable: logged, treated as none)."""
        raw = thread.read_doc(SUMMARY)
        if raw is None:
            return None
        try:
            return _decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring an unreadable summary of thread %s: %s", thread.id, exc)
            return None

    def load_current(self, thread: Thread, epoch: int | None) -> ThreadSummary | None:
        """The stored summary if it belongs to `epoch`, else None."""
        summary = self.load(thread)
        return summary if summary is not None and summary.epoch == epoch else None

    def write(self, thread: Thread, summary: ThreadSummary, expected_epoch: int) -> bool:
        """Store `summary` unless a guard drops it; True when written."""
        if summary.epoch != expected_epoch:
            log.warning("summary dropped: made for epoch %s, expected %s", summary.epoch, expected_epoch)
            return False
        try:
            with thread.guarded(expected_epoch):
                previous = self.load(thread)
                if previous is not None and previous.epoch != expected_epoch:
                    previous = None  # left over from before a clear: not a revision of this chat
                if previous is not None and previous.covers_through_seq >= summary.covers_through_seq:
                    log.info("summary dropped for %s: the stored one covers #%d, this one #%d",
                             thread.id, previous.covers_through_seq, summary.covers_through_seq)
                    return False
                if previous is not None:  # joins the hold: one step with the write below
                    thread.append_line(SUMMARY_REVISIONS, _encoder.encode(previous), expected_epoch,
                                       keep=self.revisions_kept)
                return thread.write_doc(SUMMARY, summary, expected_epoch)
        except LogClosed as exc:
            log.info("summary dropped: %s (the job started in epoch %s)", exc, expected_epoch)
            return False

    def revisions(self, thread: Thread) -> list[ThreadSummary]:
        """Earlier versions, oldest first (unreadable lines skipped)."""
        out: list[ThreadSummary] = []
        for raw in thread.lines(SUMMARY_REVISIONS):
            try:
                out.append(_decoder.decode(raw))
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("skipping an unreadable summary revision in %s", thread.id)
        return out
