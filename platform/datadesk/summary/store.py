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
from pathlib import Path

import msgspec

from datadesk.store.files import write_atomic, write_json
from datadesk.store.threadlog import ThreadLog, current_epoch
from datadesk.summary.model import ThreadSummary

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
REVISIONS_FILE = "summary.revisions.jsonl"

_decoder = msgspec.json.Decoder(ThreadSummary)
_encoder = msgspec.json.Encoder()


class SummaryStore:
    """Reads and writes the summary of a thread directory."""

    def __init__(self, revisions_kept: int = 10) -> None:
        self.revisions_kept = max(0, int(revisions_kept))

    def load(self, thread_dir: Path) -> ThreadSummary | None:
        """The stored summary, or None (none yet, or unreadable: logged, treated as none)."""
        path = Path(thread_dir) / SUMMARY_FILE
        try:
            return _decoder.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring an unreadable summary %s: %s", path, exc)
            return None

    def load_current(self, thread_dir: Path, epoch: int) -> ThreadSummary | None:
        """The stored summary if it belongs to `epoch`, else None."""
        summary = self.load(thread_dir)
        return summary if summary is not None and summary.epoch == epoch else None

    def write(self, thread_dir: Path, summary: ThreadSummary, expected_epoch: int) -> bool:
        """Store `summary` unless a guard drops it; True when written."""
        thread_dir = Path(thread_dir)
        # checked before taking the lock too: the lock file would recreate the directory
        if not thread_dir.is_dir():
            log.info("summary dropped: thread %s no longer exists", thread_dir.name)
            return False
        if summary.epoch != expected_epoch:
            log.warning("summary dropped: made for epoch %s, expected %s", summary.epoch, expected_epoch)
            return False
        with ThreadLog(thread_dir / "log.jsonl").lock():
            epoch = current_epoch(thread_dir)
            if epoch != expected_epoch:
                log.info("summary dropped for %s: epoch is %s, the job started in %s",
                         thread_dir.name, epoch, expected_epoch)
                return False
            previous = self.load(thread_dir)
            if previous is not None and previous.epoch != expected_epoch:
                previous = None  # left over from before a clear: not a revision of this chat
            if previous is not None and previous.covers_through_seq >= summary.covers_through_seq:
                log.info("summary dropped for %s: the stored one covers #%d, this one #%d",
                         thread_dir.name, previous.covers_through_seq, summary.covers_through_seq)
                return False
            if previous is not None:
                self._push_revision(thread_dir, previous)
            write_json(thread_dir / SUMMARY_FILE, summary)
            return True

    def revisions(self, thread_dir: Path) -> list[ThreadSummary]:
        """Earlier versions, oldest first (unreadable lines skipped)."""
        out: list[ThreadSummary] = []
        for raw in self._revision_lines(Path(thread_dir)):
            try:
                out.append(_decoder.decode(raw))
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("skipping an unreadable summary revision in %s", thread_dir)
        return out

    # -- internals ---------------------------------------------------------
    @staticmethod
    def _revision_lines(thread_dir: Path) -> list[bytes]:
        try:
            data = (thread_dir / REVISIONS_FILE).read_bytes()
        except FileNotFoundError:
            return []
        return [line for line in data.split(b"\n") if line.strip()]

    def _push_revision(self, thread_dir: Path, previous: ThreadSummary) -> None:
        path = thread_dir / REVISIONS_FILE
        if self.revisions_kept == 0:
            path.unlink(missing_ok=True)
            return
        lines = self._revision_lines(thread_dir) + [_encoder.encode(previous)]
        lines = lines[-self.revisions_kept:]
        write_atomic(path, b"\n".join(lines) + b"\n")
