"""Full-text search over one user's threads: a SQLite FTS5 index per user and workspace.

`users/<uid>/search.sqlite` holds one row per indexed record (and one per thread title,
`seq` 0) and an external-content FTS5 table over their text. It is a derived cache of the
logs, never the truth:

- appends: `Thread.append` calls `indexed_append`, which adds the record when it directly
  follows what the index holds (cheap, one small transaction);
- everything else (a thread made before the index, a rename, an append whose hook did not
  run, a clear) is found at search time by `ThreadSearch.sync`: each thread's log size and
  meta time are compared with what the index saw, and only new records are read (from the
  tail of the log);
- clear drops the thread's records (the title stays), delete drops the thread;
- a branch (an edited question, a regenerated answer: domain/branches.py) withdraws the
  earlier branch: when its marker record is indexed, on either path above, the rows between
  its `rewinds_to` and itself are deleted. Search finds the active branch only, so a hit
  never jumps into an abandoned stretch; the earlier branches stay listed and readable
  (`GET .../branches`), they are just not searched.

The hit, the errors and the protocols are in `store/interfaces/search.py` (re-exported here); the
cluster set's PostgreSQL index is `cluster/search.py`.

Per-user isolation is structural: a user's index holds only that user's threads, and a
search opens only the indexes of the caller's own folders. A query's cost is bounded: at
most `MAX_QUERY_CHARS` and `MAX_TERMS` terms, built into an FTS5 expression here (the user's
text never reaches FTS5 syntax), a row limit, and a deadline enforced by SQLite's progress
handler. A bad query is a `BadSearchQuery` naming what is wrong (API: 400).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import msgspec

from datadesk.domain.branches import abandoned_stretch
from datadesk.domain.ids import check_id
from datadesk.domain.records import Record
from datadesk.domain.snippet_text import readable_snippet
from datadesk.store.interfaces.search import BadSearchQuery, SearchHit, SearchTooCostly

log = logging.getLogger(__name__)

INDEX_FILE = "search.sqlite"
MAX_QUERY_CHARS = 200
MAX_TERMS = 8
MAX_LIMIT = 50
MAX_RECORD_CHARS = 20_000  # indexed text per record (a huge tool result is searchable by its head)
PER_THREAD_HITS = 3  # a thread shows at most this many matches
QUERY_DEADLINE_S = 2.0
_OPEN_INDEXES = 32  # connections kept open per process
SCHEMA_VERSION = 1  # 1: the active branch only (an earlier branch's records are withdrawn)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs(
  id INTEGER PRIMARY KEY, thread TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL,
  ts REAL NOT NULL DEFAULT 0, body TEXT NOT NULL, UNIQUE(thread, seq));
CREATE VIRTUAL TABLE IF NOT EXISTS docs_fts USING fts5(
  body, content='docs', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER IF NOT EXISTS docs_ai AFTER INSERT ON docs BEGIN
  INSERT INTO docs_fts(rowid, body) VALUES (new.id, new.body); END;
CREATE TRIGGER IF NOT EXISTS docs_ad AFTER DELETE ON docs BEGIN
  INSERT INTO docs_fts(docs_fts, rowid, body) VALUES ('delete', old.id, old.body); END;
CREATE TABLE IF NOT EXISTS threads(
  thread TEXT PRIMARY KEY, epoch INTEGER NOT NULL, seq INTEGER NOT NULL,
  log_size INTEGER NOT NULL, meta_mtime INTEGER NOT NULL, title TEXT NOT NULL,
  updated REAL NOT NULL DEFAULT 0);
"""


class IndexedThread(Protocol):
    """What the index needs of a thread (store.threads.Thread): its folder, meta and log."""

    dir: Path
    meta: Any
    log: Any


# -- the query --------------------------------------------------------------------------
_TOKEN = re.compile(r'"([^"]*)"|(\S+)')
_WORD = re.compile(r"\w+", re.UNICODE)


def query_terms(text: str) -> list[tuple[list[str], bool]]:
    """The terms of a user's search text, each (words, is_prefix): every term must occur (AND),
    `"a b"` is a phrase, `word*` a prefix, and the last word is a prefix (search as you type).
    The text is reduced to words here, so no syntax of the user's reaches an engine; both
    indexes (FTS5 here, PostgreSQL in cluster/search.py) build their query from these terms."""
    q = " ".join(str(text or "").split())
    if not q:
        raise BadSearchQuery("search query is empty: type a word to search for")
    if len(q) > MAX_QUERY_CHARS:
        raise BadSearchQuery(f"search query is too long ({len(q)} chars; limit {MAX_QUERY_CHARS})")
    if q.count('"') % 2:
        raise BadSearchQuery("search query has an unbalanced double quote: close the phrase with \"")
    terms: list[tuple[list[str], bool]] = []
    bare_last = False  # the last term is a plain word: searched as a prefix
    for phrase, word in _TOKEN.findall(q):
        words = _WORD.findall(phrase if phrase else word)
        if not words:
            continue
        prefix = (not phrase) and word.endswith("*")
        terms.append((words, prefix))
        bare_last = not phrase and not prefix and len(words) == 1 and len(words[0]) >= 3
    if not terms:
        raise BadSearchQuery(f"search query {q[:60]!r} has no words to search for (letters or digits)")
    if len(terms) > MAX_TERMS:
        raise BadSearchQuery(f"search query has {len(terms)} terms; at most {MAX_TERMS}")
    if bare_last:
        terms[-1] = (terms[-1][0], True)
    return terms


def fts_query(text: str) -> str:
    """The FTS5 expression for a user's search text (the rules of `query_terms`)."""
    return " ".join('"' + " ".join(words) + '"' + ("*" if prefix else "") for words, prefix in query_terms(text))


# -- what a record contributes ------------------------------------------------------------
def record_text(rec: Record) -> str:
    """The searchable text of a record: the message, a tool's name and result head, and the
    arguments of the calls an answer asked for (the SQL, the code)."""
    parts = [rec.content or ""]
    if rec.role == "tool" and rec.name:
        parts.insert(0, rec.name)
    for call in rec.tool_calls or ():
        parts.append(call.name)
        try:
            args = msgspec.json.decode(call.arguments or "{}")
            parts.extend(str(v) for v in (args.values() if isinstance(args, dict) else [args]))
        except (msgspec.DecodeError, RecursionError):  # model-written: may be nested too deep
            parts.append(call.arguments or "")
    if rec.meta and rec.role == "user" and rec.meta.get("filename"):
        parts.append(str(rec.meta["filename"]))
    return "\n".join(p for p in parts if p)[:MAX_RECORD_CHARS]


# -- one index file ---------------------------------------------------------------------------
class SearchIndex:
    """The index of one user in one workspace (one SQLite file, WAL, safe across processes)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock = threading.Lock()  # one connection, used by one thread at a time
        self.conn = sqlite3.connect(str(self.path), timeout=10, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)
        self._upgrade()

    def _upgrade(self) -> None:
        """An index written before SCHEMA_VERSION held earlier branches' records: it is emptied
        once, and the next search rebuilds it from the logs (the index is a cache)."""
        if self.conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            if self.conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                self.conn.execute("DELETE FROM docs")
                self.conn.execute("DELETE FROM threads")
                self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    def state(self, tid: str) -> tuple[int, int, int, int, str] | None:
        """(epoch, seq, log_size, meta_mtime, title) as last indexed, or None."""
        row = self.conn.execute("SELECT epoch, seq, log_size, meta_mtime, title FROM threads WHERE thread=?",
                                (tid,)).fetchone()
        return tuple(row) if row else None  # type: ignore[return-value]

    def add_records(self, tid: str, records: Iterable[Record]) -> int:
        """Index records (a record already there is kept); returns the highest seq added. A branch
        marker among them withdraws the earlier branch it leaves behind (domain/branches.py): the
        rows between its `rewinds_to` and itself go, so only the active branch is found."""
        top = 0
        rows = []
        stretches = []
        for rec in records:
            top = max(top, rec.seq)
            text = record_text(rec)
            if text:
                rows.append((tid, rec.seq, rec.role, rec.ts, text))
            stretch = abandoned_stretch(rec)
            if stretch is not None:
                stretches.append((tid, *stretch))
        self.conn.executemany("INSERT OR IGNORE INTO docs(thread, seq, role, ts, body) VALUES (?,?,?,?,?)", rows)
        # after the inserts: a marker is newer than what it hides, which may be in this batch
        self.conn.executemany("DELETE FROM docs WHERE thread=? AND seq>? AND seq<?", stretches)
        return top

    def append(self, tid: str, rec: Record) -> bool:
        """Index `rec` when it directly follows what the index holds for `tid` (else the next
        search catches up from the log). True when indexed."""
        with self.lock:
            state = self.state(tid)
            if state is None or state[1] != rec.seq - 1:
                return False
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self.add_records(tid, [rec])
                self.conn.execute("UPDATE threads SET seq=? WHERE thread=? AND seq=?", (rec.seq, tid, rec.seq - 1))
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            return True

    def reset(self, tid: str, drop: bool = False) -> None:
        """Forget the thread's records (clear); with `drop` the thread too (delete)."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                if drop:
                    self.conn.execute("DELETE FROM docs WHERE thread=?", (tid,))
                    self.conn.execute("DELETE FROM threads WHERE thread=?", (tid,))
                else:
                    self.conn.execute("DELETE FROM docs WHERE thread=? AND seq>0", (tid,))
                    self.conn.execute("UPDATE threads SET seq=0, log_size=0, epoch=-1 WHERE thread=?", (tid,))
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def states(self) -> dict[str, tuple[int, int, int, int, str]]:
        """Every thread's state as last indexed (one query)."""
        with self.lock:
            rows = self.conn.execute("SELECT thread, epoch, seq, log_size, meta_mtime, title FROM threads").fetchall()
        return {r[0]: tuple(r[1:]) for r in rows}  # type: ignore[misc]

    def sync(self, thread: IndexedThread) -> None:
        """Bring one thread up to date with its log and meta (reads only what is new)."""
        tid = thread.dir.name
        log_path = thread.log.path
        try:
            meta_mtime = (thread.dir / "meta.json").stat().st_mtime_ns
        except FileNotFoundError:
            return
        try:
            size = log_path.stat().st_size
        except FileNotFoundError:
            size = 0
        with self.lock:
            state = self.state(tid)
            if state is not None and state[2] == size and state[3] == meta_mtime:
                return
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self._sync_locked(thread, tid, state, size, meta_mtime)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def _sync_locked(self, thread: IndexedThread, tid: str, state: tuple | None, size: int, meta_mtime: int) -> None:
        meta = thread.reload() if hasattr(thread, "reload") else thread.meta
        epoch, title, updated = int(meta.epoch), str(meta.title), float(meta.updated)
        seq = state[1] if state is not None else 0
        if state is None or state[0] != epoch or size < state[2]:  # new to the index, cleared or rewritten
            self.conn.execute("DELETE FROM docs WHERE thread=?", (tid,))
            seq = self.add_records(tid, iter(thread.log))
        elif size != state[2]:
            seq = max(seq, self.add_records(tid, thread.log.since(seq + 1)))
        self.conn.execute("DELETE FROM docs WHERE thread=? AND seq=0", (tid,))
        self.conn.execute("INSERT INTO docs(thread, seq, role, ts, body) VALUES (?,0,'title',?,?)",
                          (tid, float(meta.created), title))
        self.conn.execute(
            "INSERT INTO threads(thread, epoch, seq, log_size, meta_mtime, title, updated) VALUES (?,?,?,?,?,?,?) "
            "ON CONFLICT(thread) DO UPDATE SET epoch=excluded.epoch, seq=excluded.seq, log_size=excluded.log_size, "
            "meta_mtime=excluded.meta_mtime, title=excluded.title, updated=excluded.updated",
            (tid, epoch, seq, size, meta_mtime, title, updated))

    def query(self, match: str, limit: int, deadline_s: float = QUERY_DEADLINE_S) -> list[tuple]:
        """(thread, seq, role, ts, snippet, rank, title, updated) rows, best first."""
        stop = time.monotonic() + deadline_s
        with self.lock:
            self.conn.set_progress_handler(lambda: int(time.monotonic() > stop), 2_000)
            try:
                return self.conn.execute(
                    "SELECT d.thread, d.seq, d.role, d.ts, "
                    "snippet(docs_fts, 0, char(2), char(3), '…', 14), bm25(docs_fts), t.title, t.updated "
                    "FROM docs_fts JOIN docs d ON d.id = docs_fts.rowid JOIN threads t ON t.thread = d.thread "
                    "WHERE docs_fts MATCH ? ORDER BY bm25(docs_fts) LIMIT ?", (match, limit)).fetchall()
            except sqlite3.OperationalError as exc:
                if "interrupted" in str(exc):
                    raise SearchTooCostly(f"search took longer than {deadline_s:g} s: use longer or more "
                                          "specific words") from None
                raise BadSearchQuery(f"search query cannot be searched: {exc}") from None
            finally:
                self.conn.set_progress_handler(None, 0)


_indexes: OrderedDict[str, SearchIndex] = OrderedDict()
_indexes_guard = threading.Lock()


def index_at(path: Path) -> SearchIndex:
    """The open index at `path` (opened once per process; the least recently used is closed)."""
    key = str(path)
    with _indexes_guard:
        idx = _indexes.get(key)
        if idx is not None and idx.path.exists():
            _indexes.move_to_end(key)
            return idx
        if idx is not None:  # its folder was removed under us: open afresh
            del _indexes[key]
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            idx = SearchIndex(path)
        except sqlite3.DatabaseError as exc:  # a damaged file: the index is a cache, start afresh
            log.warning("search index %s is unreadable (%s): rebuilding it", path, exc)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            idx = SearchIndex(path)
        _indexes[key] = idx
        while len(_indexes) > _OPEN_INDEXES:
            _, old = _indexes.popitem(last=False)
            old.close()
        return idx


def index_of(thread: IndexedThread) -> SearchIndex | None:
    """The index that holds `thread`; None for a folder outside `users/<uid>/threads/`, and
    while its user has never searched (the first search builds the index from the logs)."""
    if thread.dir.parent.name != "threads" or thread.meta is None:
        return None
    path = thread.dir.parent.parent / INDEX_FILE
    return index_at(path) if path.exists() else None


def indexed_append(thread: IndexedThread, rec: Record) -> None:
    """After an append: index the record now (best effort: the next search catches up anyway)."""
    try:
        idx = index_of(thread)
        if idx is not None:
            idx.append(thread.dir.name, rec)
    except (sqlite3.Error, OSError) as exc:
        log.warning("search index of %s not updated (%s): the next search catches up", thread.dir.name, exc)


def indexed_reset(thread: IndexedThread, drop: bool) -> None:
    """After a clear (`drop` False) or a delete: the index forgets the thread's records."""
    try:
        idx = index_of(thread)
        if idx is not None:
            idx.reset(thread.dir.name, drop=drop)
    except (sqlite3.Error, OSError) as exc:
        log.warning("search index of %s not reset (%s)", thread.dir.name, exc)


class FileSearchIndexer:
    """The embedded set's `store.interfaces.search.SearchIndexer`: the two functions above, as an object a
    thread store can hold (the cluster set's is `cluster.search.PgSearch`)."""

    def indexed_append(self, thread: IndexedThread, record: Record) -> None:
        indexed_append(thread, record)

    def indexed_reset(self, thread: IndexedThread, drop: bool) -> None:
        indexed_reset(thread, drop)


# -- searching a user's threads -------------------------------------------------------------
def _unchanged(tdir: Path, known: tuple | None) -> bool:
    """Whether the thread's log size and meta time are what the index saw."""
    if known is None:
        return False
    try:
        meta_mtime = (tdir / "meta.json").stat().st_mtime_ns
    except FileNotFoundError:
        return False
    try:
        size = (tdir / "log.jsonl").stat().st_size
    except FileNotFoundError:
        size = 0  # no record yet
    return known[2] == size and known[3] == meta_mtime


class ThreadSearch:
    """Search one user's threads across the workspaces they are a member of (the embedded
    set's `store.interfaces.search.SearchIndex`)."""

    def __init__(self, layout: Any, open_thread: Callable[[Path], IndexedThread]) -> None:
        self.layout = layout  # store.layout.Layout
        self.open_thread = open_thread  # store.threads.Thread: the owner of a thread folder

    def index(self, workspace: str, owner: str) -> SearchIndex:
        return index_at(self.layout.user_dir(workspace, owner) / INDEX_FILE)

    def sync(self, workspace: str, owner: str) -> SearchIndex:
        """The user's index of `workspace`, caught up with every thread folder."""
        idx = self.index(workspace, owner)
        known = idx.states()
        alive: set[str] = set()
        root = self.layout.threads_dir(workspace, owner)
        with contextlib.suppress(FileNotFoundError), os.scandir(root) as entries:
            for entry in entries:  # the folders ThreadStore.folders yields (links and deleted ones skipped)
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                tid = check_id(entry.name, "thread")
                alive.add(tid)
                if _unchanged(Path(entry.path), known.get(tid)):
                    continue  # two stats; the owner object is made only for a thread that changed
                try:
                    idx.sync(self.open_thread(Path(entry.path)))
                except Exception as exc:  # one unreadable thread must not stop search
                    log.warning("search: thread %s not indexed: %s", tid, exc)
        for tid in set(known) - alive:  # deleted by another process, or by hand
            idx.reset(tid, drop=True)
        return idx

    def search(self, owner: str, workspaces: list[str], text: str, limit: int = 20) -> list[SearchHit]:
        """The best matches (at most `PER_THREAD_HITS` per thread), best first."""
        match = fts_query(text)
        if not 1 <= limit <= MAX_LIMIT:
            raise BadSearchQuery(f"limit must be 1-{MAX_LIMIT}, got {limit}")
        rows: list[tuple[str, tuple]] = []
        for ws in workspaces:
            idx = self.sync(ws, owner)
            rows += [(ws, r) for r in idx.query(match, limit * PER_THREAD_HITS)]
        rows.sort(key=lambda wr: wr[1][5])
        hits: list[SearchHit] = []
        per_thread: dict[str, int] = {}
        for ws, (tid, seq, role, ts, snip, _rank, title, updated) in rows:
            if per_thread.get(tid, 0) >= PER_THREAD_HITS:
                continue
            per_thread[tid] = per_thread.get(tid, 0) + 1
            text_, spans = readable_snippet(snip)  # rendered text, not Markdown or JSON
            hits.append(SearchHit(thread=tid, workspace=ws, title=title, seq=int(seq), role=role, ts=float(ts),
                                  updated=float(updated), snippet=text_, highlights=spans))
            if len(hits) >= limit:
                break
        return hits
