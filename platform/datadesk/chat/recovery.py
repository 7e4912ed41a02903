"""Turns cut off by a dead process are finished: when a worker starts, and before a thread's
next turn.

A turn running when its process died (SIGKILL, the OOM killer, a power cut) left its event
journal without `done`, its answer so far only in the journal, maybe tool calls without
results. chat/interrupted.py has the rule that finishes such a turn; this module finds them
and makes sure that nothing else runs or finishes the turn meanwhile:

- `CutOffTurns.finish_all` (Runtime.start, in every worker of `serve --workers N`, before it
  serves): every thread whose event file does not end with `done` (only its tail is read).
- `CutOffTurns.before_turn` (TurnRegistry.reserve, with the new turn holding the thread): the
  previous turn is finished before the new turn's journal replaces its own, so no turn is
  ever left unfinished by a restart that came too late for it (a worker that died while the
  others ran on).

A thread is finished while its turn lock is held (`TurnRegistry.idle`, timeout 0): a running
turn holds that lock in whichever worker runs it, and the OS drops it when that process
dies, so a free lock means that no live process of the host runs a turn there, and no turn
starts until the finisher is done. When several workers start at once only one gets each
lock; the journal is read again under it, so a turn another worker finished just before
(it ends with `done` now) is left alone.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Iterator

from datadesk.chat.interrupted import Finished, finish_thread
from datadesk.chat.journal import file_ended
from datadesk.chat.turns import TurnRegistry
from datadesk.domain.ids import ID_PATTERN
from datadesk.store.layout import Layout
from datadesk.store.threadlog import LogClosed
from datadesk.store.threads import Thread

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"


def thread_dirs(layout: Layout) -> Iterator[Path]:
    """Every thread folder of the data directory (`workspaces/*/users/*/threads/*`), without
    deleted ones (renamed to a dot name first), links or names that are not ids."""
    for ws in _subdirs(layout.workspaces_dir):
        for user in _subdirs(ws / "users"):
            yield from _subdirs(user / "threads")


def _subdirs(path: Path) -> Iterator[Path]:
    try:  # scandir: the entry's type comes with the listing (no stat per folder, links skipped)
        with os.scandir(path) as it:
            names = [e.name for e in it if ID_PATTERN.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for name in sorted(names):
        yield path / name


class CutOffTurns:
    """Finds the turns a dead process cut off and finishes each once (see the module doc)."""

    def __init__(self, layout: Layout, turns: TurnRegistry, fsync: str = "turn") -> None:
        self.layout = layout
        self.turns = turns
        self.fsync = fsync  # store.fsync, for the threads opened here

    def finish_all(self) -> list[Finished]:
        """Finish every cut-off turn of the data directory that no live process runs; returns
        what was done (a turn another worker holds is left to it)."""
        started = time.monotonic()
        scanned, out = 0, []
        for tdir in thread_dirs(self.layout):
            scanned += 1
            if file_ended(tdir / EVENTS_FILE) is not False:  # no journal, or its turn ended
                continue
            try:
                finished = self._finish_idle(tdir)
            except Exception:  # one thread that cannot be finished (a full disk) stops no start-up
                log.exception("could not finish the cut-off turn of thread %s", tdir.name)
                continue
            if finished is not None:
                out.append(finished)
        if out:
            log.warning("finished %d turn(s) cut off by a stopped server (%d threads looked at) in %.2f s",
                        len(out), scanned, time.monotonic() - started)
        return out

    def _finish_idle(self, tdir: Path) -> Finished | None:
        with self.turns.idle(tdir.name) as free:
            if not free:  # a turn runs there now, or another worker is finishing this one
                return None
            return self._finish(Thread.at(tdir, self.fsync))

    def before_turn(self, events_at: Path) -> None:
        """TurnRegistry's hook, with the new turn holding the thread: finish the previous turn
        first if it was cut off (its journal is about to be replaced)."""
        if file_ended(events_at) is False:
            self._finish(Thread.at(events_at.parent, self.fsync))

    def _finish(self, thread: Thread) -> Finished | None:
        if thread.meta is None:  # being created or deleted
            return None
        try:
            finished = finish_thread(thread)
        except LogClosed:  # cleared or deleted meanwhile: nothing to finish
            return None
        if finished is not None:
            self.turns.forget(thread.id, finished.turn_id)
        return finished
