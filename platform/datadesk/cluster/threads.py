"""The cluster `ThreadStore` (store/interfaces/threads.py): threads, records and per-thread documents as
PostgreSQL rows (migration 0004_threads.sql).

- `threads`: one row per thread (workspace, owner, epoch, last_seq, meta jsonb). Its row lock
  is the thread lock of every host: appends, guarded writes and clear take it `FOR UPDATE`
  and check the epoch (and an append the turn's fence) in the same transaction
  (cluster/threadrows.py).
- `records`: the log, one row per record, PK (thread_id, seq).
- `thread_docs`: JSON documents by name (summary, summary status, task state).
- `thread_lines`: bounded line sets by name (summary revisions; manifests, `manifests_kept`).

A clear bumps the epoch and deletes the records, documents and lines in one transaction; a
delete removes the row (the rest cascades). Each `PgThread` also has a per-host scratch folder
(`<home>/cache/threads/<ws>/<uid>/<tid>`) for what stays on one host; nothing durable lives only
there. The optional `search` indexer is told after each committed append and each clear.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec
import psycopg

from datadesk.cluster.database import Database, advisory_key
from datadesk.cluster.threadrows import PgRecords, current_hold, hold, reading
from datadesk.domain.ids import check_id, new_id
from datadesk.domain.records import Record, ThreadMeta
from datadesk.store.interfaces.threads import (MANIFESTS, SUMMARY, SUMMARY_REVISIONS, TASK_STATE, LogClosed, RecordIndexer,
                                    ThreadNotFound, check_document, check_line_set)
from datadesk.store.layout import Layout
from datadesk.store.threads import ThreadReads, new_thread_meta, thread_limit_reached

log = logging.getLogger(__name__)

MANIFESTS_KEPT = 1000  # manifests kept per thread (the embedded context.jsonl keeps all; rows are bounded)
_json = msgspec.json.Encoder()


def jsonb_text(value: Any) -> str:
    """`value` as JSON text PostgreSQL's jsonb accepts: jsonb has no U+0000, so a NUL in a string
    (rare: pasted binary, model output) becomes U+FFFD instead of failing the write."""
    text = _json.encode(value).decode("utf-8")
    if "\\u0000" in text:
        text = _json.encode(_without_nul(msgspec.to_builtins(value))).decode("utf-8")
    return text


def _without_nul(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.replace("\x00", "\ufffd")
    if isinstance(obj, dict):
        return {_without_nul(k): _without_nul(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_without_nul(v) for v in obj]
    return obj


def meta_of(row: dict[str, Any]) -> ThreadMeta:
    """The ThreadMeta of a `threads` row (the epoch column is the truth)."""
    return msgspec.structs.replace(msgspec.convert(row["meta"], ThreadMeta), epoch=row["epoch"])


_APPEND_LINE = (
    "INSERT INTO thread_lines (thread_id, name, n, line) SELECT t.id, %(name)s, coalesce((SELECT max(n) FROM"
    " thread_lines WHERE thread_id = %(tid)s AND name = %(name)s), 0) + 1, %(line)s FROM threads t"
    " WHERE t.id = %(tid)s AND (%(epoch)s::bigint IS NULL OR t.epoch = %(epoch)s) FOR SHARE OF t RETURNING n")


class PgThread(ThreadReads):
    """One thread as rows (see the module doc); the store/interfaces/threads.py `Thread` (the
    reads it shares with the embedded one: store/threads.py `ThreadReads`)."""

    def __init__(self, store: "PgThreadStore", meta: ThreadMeta, last_seq: int | None = None) -> None:
        self.store = store
        self.db: Database = store.db
        self.meta: ThreadMeta | None = meta
        self._id = meta.id
        self._scratch = store.scratch_dir(meta.workspace, meta.owner, meta.id)
        self.log = PgRecords(self, last_seq)

    def __repr__(self) -> str:
        return f"PgThread({self._id!r})"

    @property
    def id(self) -> str:
        return self._id

    # -- this host's folder -------------------------------------------------------
    @property
    def dir(self) -> Path:
        """This host's scratch folder of the thread, made on first use."""
        self._scratch.mkdir(parents=True, exist_ok=True)
        return self._scratch

    def exists(self) -> bool:
        return self.current_epoch() is not None

    # -- records ------------------------------------------------------------------
    def append(self, make: Callable[[int], Record], epoch: int | None = None,
               fence: int | None = None) -> Record:
        """Append `make(next_seq)` (see PgRecords.append); the search index is told once committed."""
        record = self.log.append(make, epoch=epoch, fence=fence)
        if self.store.search is not None:
            self.store.search.indexed_append(self, record)
        return record

    def end_turn(self) -> None:
        """Nothing to flush: every append was committed."""

    # -- epoch --------------------------------------------------------------------
    def current_epoch(self) -> int | None:
        with reading(self) as conn:
            row = conn.execute("SELECT epoch FROM threads WHERE id = %s", (self._id,)).fetchone()
        return row["epoch"] if row is not None else None

    @contextlib.contextmanager
    def guarded(self, epoch: int | None) -> Iterator[None]:
        """Hold the thread's row while it is in `epoch`; this thread's writes inside join the
        transaction (committed when the block ends, rolled back when it raises)."""
        with hold(self, epoch):
            yield

    # -- meta ---------------------------------------------------------------------
    def reload(self) -> ThreadMeta:
        with reading(self) as conn:
            row = conn.execute("SELECT meta, epoch FROM threads WHERE id = %s", (self._id,)).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {self._id} not found")
        self.meta = meta_of(row)
        return self.meta

    def write_meta(self, meta: ThreadMeta) -> ThreadMeta:
        """Store `meta`, except its epoch: only a clear moves that (a meta read before a clear
        cannot put the old epoch back)."""
        with reading(self) as conn:
            row = conn.execute("UPDATE threads SET meta = jsonb_set(%s::jsonb, '{epoch}', to_jsonb(epoch)), "
                               "updated = %s WHERE id = %s RETURNING meta, epoch",
                               (jsonb_text(meta), meta.updated, self._id)).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {self._id} not found")
        self.meta = meta_of(row)
        return self.meta

    # -- documents ----------------------------------------------------------------
    def read_doc(self, name: str) -> bytes | None:
        with reading(self) as conn:
            row = conn.execute("SELECT value::text AS v FROM thread_docs WHERE thread_id = %s AND name = %s",
                               (self._id, check_document(name))).fetchone()
        return row["v"].encode("utf-8") if row is not None else None

    def write_doc(self, name: str, value: Any, epoch: int | None) -> bool:
        check_document(name)
        try:
            with hold(self, epoch) as held:
                self._put_doc(held.conn, name, jsonb_text(value), held.epoch)
        except LogClosed:
            return False
        return True

    def update_doc(self, name: str, change: Callable[[bytes | None], Any], epoch: int | None) -> Any:
        check_document(name)
        with hold(self, epoch) as held:
            value = change(self.read_doc(name))
            if value is not None:
                self._put_doc(held.conn, name, jsonb_text(value), held.epoch)
            return value

    def _put_doc(self, conn: psycopg.Connection, name: str, text: str, epoch: int) -> None:
        conn.execute("INSERT INTO thread_docs (thread_id, name, value, epoch, updated) "
                     "VALUES (%s, %s, %s::jsonb, %s, %s) ON CONFLICT (thread_id, name) DO UPDATE SET value = EXCLUDED.value, epoch = EXCLUDED.epoch, "
                     "updated = EXCLUDED.updated", (self._id, name, text, epoch, time.time()))

    # -- line sets ----------------------------------------------------------------
    def append_line(self, name: str, line: bytes, epoch: int | None, keep: int | None = None) -> bool:
        """Append one line as row n = last + 1, then drop the rows older than the newest `keep`
        (None: the set's own retention: manifests `manifests_kept`, others unbounded)."""
        check_line_set(name)
        if keep is None:
            keep = self.store.manifests_kept if name == MANIFESTS else None
        if (keep is None or keep > 0) and current_hold(self) is None:
            added = self._append_line_at_once(name, line, epoch)
            if added is not None:
                if keep is not None and added > keep:  # retention: rarely, a second statement
                    with self.db.autocommit() as conn:
                        conn.execute("DELETE FROM thread_lines WHERE thread_id = %s AND name = %s AND n <= %s",
                                     (self._id, name, added - keep))
                return True
        try:
            with hold(self, epoch) as held:
                if keep is not None and keep <= 0:
                    held.conn.execute("DELETE FROM thread_lines WHERE thread_id = %s AND name = %s", (self._id, name))
                    return True
                n = held.conn.execute(
                    "INSERT INTO thread_lines (thread_id, name, n, line) SELECT %s, %s, coalesce(max(n), 0) + 1, %s "
                    "FROM thread_lines WHERE thread_id = %s AND name = %s RETURNING n",
                    (self._id, name, line.rstrip(b"\n"), self._id, name)).fetchone()["n"]
                if keep is not None and n > keep:
                    held.conn.execute("DELETE FROM thread_lines WHERE thread_id = %s AND name = %s AND n <= %s",
                                      (self._id, name, n - keep))
        except LogClosed:
            return False
        return True

    def _append_line_at_once(self, name: str, line: bytes, epoch: int | None) -> int | None:
        """One statement: the line is inserted while the thread's row is held FOR SHARE in the
        epoch (a clear waits for it, then deletes it too); returns its n, or None to take the
        hold (a line written at the same moment took the number, or the epoch moved)."""
        try:
            with self.db.autocommit() as conn:
                row = conn.execute(_APPEND_LINE, {"tid": self._id, "name": name, "line": line.rstrip(b"\n"),
                                                  "epoch": epoch}).fetchone()
        except psycopg.errors.UniqueViolation:
            return None
        return row["n"] if row is not None else None

    def lines(self, name: str, newest_first: bool = False) -> Iterator[bytes]:
        check_line_set(name)
        if newest_first:
            return self._lines_newest_first(name)
        with reading(self) as conn:
            rows = conn.execute("SELECT line FROM thread_lines WHERE thread_id = %s AND name = %s ORDER BY n",
                                (self._id, name)).fetchall()
        return iter([row["line"] for row in rows])

    def _lines_newest_first(self, name: str) -> Iterator[bytes]:
        below, page = None, 8  # callers usually want the newest readable one only
        while True:
            with reading(self) as conn:
                rows = conn.execute("SELECT n, line FROM thread_lines WHERE thread_id = %s AND name = %s "
                                    "AND (%s::bigint IS NULL OR n < %s) ORDER BY n DESC LIMIT %s",
                                    (self._id, name, below, below, page)).fetchall()
            yield from (row["line"] for row in rows)
            if len(rows) < page:
                return
            below, page = rows[-1]["n"], min(1024, page * 4)

    def rewrite_summaries(self, transform: Callable[[Any], Any]) -> int:
        """Rewrite the summary, its revisions and the task state in one hold (store/interfaces/threads.py);
        returns how many of the three changed."""
        changed = 0
        with hold(self, None) as held:
            for name in (SUMMARY, TASK_STATE):
                raw = self.read_doc(name)
                if raw is not None:
                    doc = msgspec.json.decode(raw)
                    new = transform(doc)
                    if new != doc:
                        self._put_doc(held.conn, name, jsonb_text(new), held.epoch)
                        changed += 1
            rows = held.conn.execute("SELECT n, line FROM thread_lines WHERE thread_id = %s AND name = %s",
                                     (self._id, SUMMARY_REVISIONS)).fetchall()
            touched = 0
            for row in rows:
                new_line = _rewrite_line(row["line"], transform)
                if new_line != row["line"]:
                    held.conn.execute("UPDATE thread_lines SET line = %s WHERE thread_id = %s AND name = %s AND n = %s",
                                      (new_line, self._id, SUMMARY_REVISIONS, row["n"]))
                    touched = 1
            return changed + touched


def _rewrite_line(line: bytes, transform: Callable[[Any], Any]) -> bytes:
    try:
        obj = msgspec.json.decode(line)
    except msgspec.DecodeError:  # not JSON: rewritten as text, as the embedded set does
        return transform(line.decode("utf-8", "replace")).encode("utf-8")
    new = transform(obj)
    return line if new == obj else _json.encode(new)


class PgThreadStore:
    """Create, find, list, clear and delete threads as rows (the store/interfaces/threads.py `ThreadStore`)."""

    def __init__(self, db: Database, layout: Layout, max_threads_per_user: int = 0,
                 search: RecordIndexer | None = None, *, manifests_kept: int = MANIFESTS_KEPT) -> None:
        self.db = db
        self.layout = layout
        self.max_threads_per_user = max_threads_per_user  # per workspace; 0: no limit
        self.search = search
        self.manifests_kept = manifests_kept

    def scratch_dir(self, workspace: str, owner: str, tid: str) -> Path:
        """This host's folder of a thread (not made here)."""
        return (self.layout.home / "cache" / "threads" / check_id(workspace, "workspace")
                / check_id(owner, "user") / check_id(tid, "thread"))

    def _thread(self, row: dict[str, Any]) -> PgThread:
        return PgThread(self, meta_of(row), row.get("last_seq"))

    def create(self, workspace: str, owner: str, title: str = "New chat", project: str | None = None) -> PgThread:
        check_id(workspace, "workspace")
        check_id(owner, "user")
        now = time.time()
        with self.db.connection() as conn:
            if self.max_threads_per_user > 0:  # count and insert as one step, across hosts
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(f"threads:{workspace}:{owner}"),))
                self._check_count(conn, workspace, owner)
            for _ in range(5):  # 64 random bits: a collision is astronomically unlikely, and checked anyway
                meta = new_thread_meta(new_id("t"), workspace, owner, title, project, now)
                row = conn.execute("INSERT INTO threads (id, workspace, owner, meta, created, updated) "
                                   "VALUES (%s, %s, %s, %s::jsonb, %s, %s) ON CONFLICT (id) DO NOTHING "
                                   "RETURNING meta, epoch",
                                   (meta.id, workspace, owner, jsonb_text(meta), now, now)).fetchone()
                if row is not None:
                    return self._thread(row)
        raise RuntimeError("could not allocate a thread id")  # pragma: no cover

    def _check_count(self, conn: psycopg.Connection, workspace: str, owner: str) -> None:
        limit = self.max_threads_per_user
        count = conn.execute("SELECT count(*) AS n FROM threads WHERE owner = %s AND workspace = %s",
                             (owner, workspace)).fetchone()["n"]
        if count >= limit:
            raise thread_limit_reached(count, workspace, limit)

    def get(self, tid: str, owner: str, workspaces: list[str]) -> PgThread:
        check_id(tid, "thread")
        with self.db.autocommit() as conn:  # one read
            row = conn.execute("SELECT meta, epoch, last_seq FROM threads WHERE id = %s AND owner = %s"
                               " AND workspace = ANY(%s)",
                               (tid, owner, list(workspaces))).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {tid} not found")
        return self._thread(row)

    def empty_chat(self, workspace: str, owner: str) -> PgThread | None:
        with self.db.connection() as conn:
            row = conn.execute(
                "SELECT meta, epoch FROM threads t WHERE owner = %s AND workspace = %s "
                "AND meta->>'title' = 'New chat' AND coalesce(meta->'project', 'null'::jsonb) = 'null'::jsonb "
                "AND NOT EXISTS (SELECT 1 FROM records r WHERE r.thread_id = t.id) "
                "ORDER BY updated DESC LIMIT 1", (owner, workspace)).fetchone()
        return self._thread(row) if row is not None else None

    def folders(self, workspace: str, owner: str) -> Iterator[PgThread]:
        with self.db.connection() as conn:
            rows = conn.execute("SELECT meta, epoch FROM threads WHERE owner = %s AND workspace = %s ORDER BY id",
                                (owner, workspace)).fetchall()
        return iter([self._thread(row) for row in rows])

    def list(self, owner: str, workspaces: list[str]) -> list[ThreadMeta]:
        with self.db.connection() as conn:
            rows = conn.execute("SELECT meta, epoch FROM threads WHERE owner = %s AND workspace = ANY(%s) "
                                "ORDER BY updated DESC", (owner, list(workspaces))).fetchall()
        return [meta_of(row) for row in rows]

    def touch(self, thread: PgThread, title: str | None = None) -> ThreadMeta:
        """Set `updated` (and the title) in one statement: no read-modify-write to lose."""
        now = time.time()
        patch: dict[str, Any] = {"updated": now} if not title else {"updated": now, "title": title}
        with self.db.autocommit() as conn:  # one statement
            row = conn.execute("UPDATE threads SET meta = meta || %s::jsonb, updated = %s WHERE id = %s "
                               "RETURNING meta, epoch", (jsonb_text(patch), now, thread.id)).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {thread.id} not found")
        thread.meta = meta_of(row)
        return thread.meta

    def clear(self, thread: PgThread) -> dict[str, int]:
        """Bump the epoch and delete the records, documents and lines in one transaction (every
        write begun before is refused after), then this host's scratch files. Memory stays."""
        removed = {"records": 0, "artifacts": 0, "bytes": 0}
        with self.db.connection() as conn:
            if conn.execute("SELECT 1 FROM threads WHERE id = %s FOR UPDATE", (thread.id,)).fetchone() is None:
                raise ThreadNotFound(f"thread {thread.id} not found")
            for table, size in (("records", "octet_length(body)"), ("thread_docs", "octet_length(value::text)"),
                                ("thread_lines", "octet_length(line)")):
                row = conn.execute(f"WITH gone AS (DELETE FROM {table} WHERE thread_id = %s RETURNING {size} AS b) "
                                   "SELECT count(*) AS n, coalesce(sum(b), 0) AS b FROM gone", (thread.id,)).fetchone()
                removed["bytes"] += int(row["b"])
                if table == "records":
                    removed["records"] = int(row["n"])
            # the artifacts' rows and objects go right after (Artifacts.forget_thread, while the
            # lifecycle still holds the thread): counted here, as the embedded clear counts its manifests
            arts = conn.execute("SELECT id, bytes FROM artifacts WHERE thread_id = %s", (thread.id,)).fetchall()
            removed["artifacts"], removed["bytes"] = len(arts), removed["bytes"] + sum(int(a["bytes"]) for a in arts)
            now = time.time()
            row = conn.execute("UPDATE threads SET epoch = epoch + 1, last_seq = 0, updated = %s, "
                               "meta = jsonb_set(meta, '{epoch}', to_jsonb(epoch + 1)) "
                               "|| jsonb_build_object('updated', %s::float8) WHERE id = %s RETURNING meta, epoch", (now, now, thread.id)).fetchone()
        thread.meta = meta_of(row)
        self._clear_scratch(thread, removed, {a["id"] for a in arts})
        if self.search is not None:
            self.search.indexed_reset(thread, drop=False)
        return removed

    @staticmethod
    def _clear_scratch(thread: PgThread, removed: dict[str, int], counted: set[str]) -> None:
        """This host's copies go too (artifacts and outputs proper are the blob store's); a
        manifest here of an artifact without a row (`counted`) counts as one removed."""
        scratch = thread._scratch
        if not scratch.is_dir():
            return
        for p in scratch.rglob("*"):
            if p.is_file() and not p.is_symlink() and p.suffix != ".lock":
                removed["bytes"] += p.stat().st_size
                if p.parent.name == "artifacts" and p.suffix == ".json" and p.stem not in counted:
                    removed["artifacts"] += 1
        for child in scratch.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            elif child.suffix != ".lock":
                child.unlink(missing_ok=True)

    def delete(self, thread: PgThread) -> None:
        """Remove the thread's row; its records, documents and lines go with it (cascade)."""
        with self.db.connection() as conn:
            conn.execute("DELETE FROM threads WHERE id = %s", (thread.id,))
        shutil.rmtree(thread._scratch, ignore_errors=True)
        if self.search is not None:
            self.search.indexed_reset(thread, drop=True)


def build_threads(db: Database, settings: Any, layout: Layout, search: RecordIndexer | None = None) -> PgThreadStore:
    """The cluster thread store the composition root wires when `cluster.database_url` is set."""
    return PgThreadStore(db, layout, settings.limits.max_threads_per_user, search=search)
