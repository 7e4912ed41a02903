"""`summary.json` and its bounded revision history, written with guards.

A write is dropped (returns False) when
- the thread is gone, or its epoch is no longer the one the job started in
  (the chat was cleared while the summarizer ran), or
- the stored summary of this epoch already covers as far or farther (an older
  job that finished late must not replace a newer summary).

The check and the write happen under the thread lock (the same lock appends
and clear take), so a clear cannot interleave. The replaced version is
appended to `summary.revisions.jsonl`, which keeps only the newest
`revisions_kept` lines. Every file is replaced atomically.
"""

from __future__ import annotations

import logging

import msgspec

from datadesk.store.files import write_atomic, write_json
from datadesk.store.threadlog import LogClosed
from datadesk.store.threads import Thread
from datadesk.summary.model import ThreadSummary

log = logging.getLogger(__name__)

_decoder = msgspec.json.Decoder(ThreadSummary)
_encoder = msgspec.json.Encoder()


class SummaryStore:
    """Reads and writes the summary of a thread (its files are the `Thread`'s)."""

    def __init__(self, revisions_kept: int = 10) -> None:
        self.revisions_kept = max(0, int(revisions_kept))

    def load(self, thread: Thread) -> ThreadSummary | None:
        """The stored summary, or None (none yet, or unreadable: logged, treated as none)."""
        path = thread.summary_path
        try:
            return _decoder.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring an unreadable summary %s: %s", path, exc)
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
                if previous is not None:
                    self._push_revision(thread, previous)
                write_json(thread.summary_path, summary)
                return True
        except LogClosed as exc:
            log.info("summary dropped: %s (the job started in epoch %s)", exc, expected_epoch)
            return False

    def revisions(self, thread: Thread) -> list[ThreadSummary]:
        """Earlier versions, oldest first (unreadable lines skipped)."""
        out: list[ThreadSummary] = []
        for raw in self._revision_lines(thread):
            try:
                out.append(_decoder.decode(raw))
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("skipping an unreadable summary revision in %s", thread.id)
        return out

    # -- internals ---------------------------------------------------------
    @staticmethod
    def _revision_lines(thread: Thread) -> list[bytes]:
        try:
            data = thread.summary_revisions_path.read_bytes()
        except FileNotFoundError:
            return []
        return [line for line in data.split(b"\n") if line.strip()]

    def _push_revision(self, thread: Thread, previous: ThreadSummary) -> None:
        path = thread.summary_revisions_path
        if self.revisions_kept == 0:
            path.unlink(missing_ok=True)
            return
        lines = self._revision_lines(thread) + [_encoder.encode(previous)]
        lines = lines[-self.revisions_kept:]
        write_atomic(path, b"\n".join(lines) + b"\n")
