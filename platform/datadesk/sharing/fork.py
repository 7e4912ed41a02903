"""Copy a thread into another user's chats: "Copy into my chats" of a shared thread (issue 32).

The copy is a new thread of the reader's own, independent of the original:

- every record of the log, every branch, in order (seqs renumbered from 1 by the new log);
- every available artifact, its data file copied (not linked) under a new artifact id, its
  origin now the reader's thread; the records' references to the old ids (tool results'
  artifact refs, `/data/<aid>.parquet` in code and notices, chart ids) are rewritten to the
  new ones, so the copy's charts, grid and downloads read the copy's files;
- the report page (its pinned items and notes), its artifact ids rewritten the same way;
- nothing else: the owner's summary, task state, memory, context manifests, uploads' kept
  originals and kernel stay theirs. The reader's first turn starts a kernel of their own.

Expired artifacts (tombstones) have no data to copy; their references are left as they are
and show as "no longer available" in the copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from datadesk.domain.artifacts import Artifact
from datadesk.domain.records import Record
from datadesk.offload.artifacts.store import new_artifact_id, regular_file
from datadesk.store.interfaces.threads import REPORT
from datadesk.store.tempnames import temp_prefix

MAX_TITLE_CHARS = 200


class ThreadFork:
    """Copies a thread (records and artifacts) into a new thread of another user (module doc)."""

    def __init__(self, threads: Any, artifacts: Any) -> None:
        self.threads = threads
        self.artifacts = artifacts

    def copy(self, source: Any, workspace: str, user_id: str, title: str) -> Any:
        """A new thread of `user_id` in `workspace` holding a copy of `source` (module doc). When
        the copy fails (the error passes through, its own status in the API), the half-made
        thread is deleted."""
        target = self.threads.create(workspace, user_id, title[:MAX_TITLE_CHARS] or "Copy")
        try:
            renamed = self._copy_artifacts(source, target, user_id)
            epoch = target.meta.epoch if target.meta is not None else None
            for rec in source:
                copied = _renamed_record(rec, renamed)
                target.append(lambda seq, c=copied: msgspec.structs.replace(c, seq=seq), epoch)
            target.end_turn()
            self._copy_report(source, target, renamed, epoch)
            self.threads.touch(target, title=title[:MAX_TITLE_CHARS] or "Copy")
        except BaseException:  # a full disk, the store down: no half-made copy stays behind
            self.artifacts.forget_thread(target)
            self.threads.delete(target)
            raise
        return target

    def _copy_artifacts(self, source: Any, target: Any, user_id: str) -> dict[str, str]:
        """Copy each available artifact's data under a new id; returns {old id: new id}."""
        renamed: dict[str, str] = {}
        for art in self.artifacts.list(source):
            if not art.available:
                continue
            path = self.artifacts.data_path(source, art)
            if not regular_file(path):
                continue  # swept meanwhile: left as the original's tombstone would be
            new_id = new_artifact_id()
            file = new_id + Path(art.file).suffix
            _copy_file(path, Path(target.artifacts_dir) / file)
            now = time.time()
            origin = msgspec.structs.replace(art.origin, user=user_id, thread=target.id,
                                             workspace=target.workspace)
            copy: Artifact = msgspec.structs.replace(art, id=new_id, file=file, origin=origin, created=now,
                                                    last_used=now, original=None, original_bytes=0)
            self.artifacts.save(target, copy, target.meta.epoch if target.meta is not None else None)
            renamed[art.id] = new_id
        return renamed


    @staticmethod
    def _copy_report(source: Any, target: Any, renamed: dict[str, str], epoch: int | None) -> None:
        """The report page (its pinned items and notes), pointing at the copy's artifacts."""
        raw = source.read_doc(REPORT)
        if raw is None:
            return
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        for old, new in renamed.items():
            text = text.replace(old, new)
        target.write_doc(REPORT, msgspec.json.decode(text.encode("utf-8")), epoch)


def _renamed_record(rec: Record, renamed: dict[str, str]) -> Record:
    """`rec` with every artifact id of `renamed` replaced by its new id (ids are random and long
    enough that a plain text replace touches nothing else)."""
    if not renamed:
        return rec
    raw = msgspec.json.encode(rec).decode("utf-8")
    for old, new in renamed.items():
        raw = raw.replace(old, new)
    return msgspec.json.decode(raw.encode("utf-8"), type=Record)


def _copy_file(src: Path, dst: Path) -> None:
    """`src` copied to `dst` through a temp file renamed over it (never a half-written file)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(dst.name), suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
