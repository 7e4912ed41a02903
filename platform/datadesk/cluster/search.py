"""`PgSearch`: full-text search over the `records` table in PostgreSQL (`state.search`).

One object is both the `SearchIndex` the API asks and the `SearchIndexer` the thread store
tells about appends, clears and deletes. Tables (migration 0005_memory_search.sql):

- `search_entries(thread_id, seq, owner, workspace, role, ts, text, tsv)`: the searchable
  text of each record (`store.search.record_text`, as the embedded FTS5 index takes it) and
  its `tsvector` (a generated column, GIN-indexed);
- `search_marks(thread_id, owner, workspace, epoch, seq)`: how far each thread is indexed.

Both are derived from `threads` / `records` (migration 0004), never the truth:

- `indexed_append` indexes a record when it directly follows the thread's mark, in one
  statement; anything else (a record whose indexing a crash lost, a thread made before the
  index) is found by `sync`, which every search runs first: a thread whose records go past
  its mark is indexed from there, and one whose epoch moved (a clear whose reset was lost)
  is rebuilt. Each batch commits with its mark, so an interrupted sync resumes.
- A branch marker (an edited question, a regenerated answer: domain/branches.py), when it is
  indexed on either path, deletes the entries of the earlier branch it leaves behind: search
  finds the active branch only (as the embedded index does).
- Titles are not copied: they are searched in `threads.meta` directly (always current).
- A delete drops the thread's entries and mark; what a lost delete leaves is invisible (a
  search joins `threads`) and swept by the owner's next search.

Tokens: like FTS5's unicode61, punctuation separates words (`orders.amount` is `orders` and
`amount`; PostgreSQL's own parser would keep it one token), the 'simple' configuration folds
case and stems nothing. Unlike the embedded index, diacritics are kept (`café` is not `cafe`).
Queries follow `store.search.query_terms` (the user's text never reaches tsquery syntax),
run under `statement_timeout` (`SearchTooCostly` past it), and are limited to the owner's
threads in the named workspaces, checked against `threads` too. Snippets are cut here, with
the same tokens, so a highlight always marks a word the index matched.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import msgspec
import psycopg

from datadesk.cluster.database import Database, DatabaseError
from datadesk.domain.branches import abandoned_stretch
from datadesk.domain.records import Record
from datadesk.domain.snippet_text import readable_spans
from datadesk.store.interfaces.search import BadSearchQuery, SearchHit, SearchTooCostly
from datadesk.store.search import MAX_LIMIT, PER_THREAD_HITS, QUERY_DEADLINE_S, query_terms, record_text

log = logging.getLogger(__name__)

SYNC_BATCH = 500  # records indexed per transaction while catching up
SYNC_BUDGET_S = 2.0  # catching up before one search stops here; the next search goes on
SNIPPET_TOKENS = 14  # words around the best match (FTS5's snippet of the embedded index)
TSV = "to_tsvector('simple', regexp_replace({}, '[[:punct:]]+', ' ', 'g'))"  # as the generated column

_TOKEN = re.compile(r"[^\W_]+")  # a word as the index sees it: letters and digits, punctuation splits

# an append directly after the mark: the mark moves and the text goes in, as one statement;
# only for a record this connection sees committed (an append inside a caller's open
# transaction may still roll back: `sync` takes it once it is there)
_COMMITTED = "EXISTS (SELECT 1 FROM records r WHERE r.thread_id = %(tid)s AND r.seq = %(seq)s)"
_APPEND_FIRST = """
WITH moved AS (
  INSERT INTO search_marks (thread_id, owner, workspace, epoch, seq)
  SELECT id, owner, workspace, epoch, 1 FROM threads WHERE id = %(tid)s AND {committed}
  ON CONFLICT (thread_id) DO UPDATE SET seq = 1
  WHERE search_marks.seq = 0 AND search_marks.epoch = excluded.epoch
  RETURNING owner, workspace)
INSERT INTO search_entries (thread_id, seq, owner, workspace, role, ts, text)
SELECT %(tid)s, 1, owner, workspace, %(role)s, %(ts)s, %(text)s FROM moved WHERE %(text)s <> ''
ON CONFLICT DO NOTHING""".format(committed=_COMMITTED)
_APPEND_NEXT = """
WITH moved AS (
  UPDATE search_marks m SET seq = %(seq)s FROM threads t
  WHERE m.thread_id = %(tid)s AND t.id = m.thread_id AND m.seq = %(seq)s - 1 AND m.epoch = t.epoch
    AND {committed}
  RETURNING m.owner, m.workspace)
INSERT INTO search_entries (thread_id, seq, owner, workspace, role, ts, text)
SELECT %(tid)s, %(seq)s, owner, workspace, %(role)s, %(ts)s, %(text)s FROM moved WHERE %(text)s <> ''
ON CONFLICT DO NOTHING""".format(committed=_COMMITTED)

# an earlier branch's records (domain/branches.py): what a branch marker leaves behind
_WITHDRAW = "DELETE FROM search_entries WHERE thread_id = %s AND seq > %s AND seq < %s"

# what a delete whose reset was lost left behind
_ORPHANS = """
WITH gone AS (
  DELETE FROM search_marks m WHERE m.owner = %s AND m.workspace = ANY(%s)
    AND NOT EXISTS (SELECT 1 FROM threads t WHERE t.id = m.thread_id)
  RETURNING m.thread_id)
DELETE FROM search_entries s USING gone WHERE s.thread_id = gone.thread_id"""

# threads of the owner whose index lags: no mark, another epoch, or records past the mark
_STALE = """
SELECT t.id FROM threads t LEFT JOIN search_marks m ON m.thread_id = t.id
WHERE t.owner = %s AND t.workspace = ANY(%s)
  AND (m.thread_id IS NULL OR m.epoch <> t.epoch
       OR EXISTS (SELECT 1 FROM records r WHERE r.thread_id = t.id AND r.seq > m.seq))
ORDER BY t.updated DESC"""

# the tsquery is written out (not a CTE) so the planner folds it and can use the GIN index
_TSQ = "to_tsquery('simple', %(q)s)"
_QUERY = f"""
WITH hits AS (
  (SELECT s.thread_id AS thread, s.workspace, s.seq, s.role, s.ts, ts_rank(s.tsv, {_TSQ}) AS rank, s.text
   FROM search_entries s
   JOIN threads t ON t.id = s.thread_id AND t.owner = s.owner AND t.workspace = s.workspace
   WHERE s.owner = %(owner)s AND s.workspace = ANY(%(ws)s) AND s.tsv @@ {_TSQ})
  UNION ALL
  (SELECT t.id, t.workspace, 0, 'title', t.created, ts_rank({TSV.format("t.meta->>'title'")}, {_TSQ}),
          t.meta->>'title'
   FROM threads t
   WHERE t.owner = %(owner)s AND t.workspace = ANY(%(ws)s) AND {TSV.format("t.meta->>'title'")} @@ {_TSQ})
  ORDER BY rank DESC, thread, seq LIMIT %(n)s)
SELECT h.thread, h.workspace, h.seq, h.role, h.ts, h.rank, h.text,
       coalesce(t.meta->>'title', '') AS title, t.updated
FROM hits h JOIN threads t ON t.id = h.thread ORDER BY h.rank DESC, h.thread, h.seq"""


def ts_query(text: str) -> tuple[str, list[tuple[list[str], bool]]]:
    """The tsquery text for a user's search (and its terms): terms ANDed, a phrase's words
    `<->`-joined, a prefix term `:*`. Each word holds only letters, digits and `_` (the
    terms' own rule), quoted as a lexeme, so no tsquery syntax of the user's is parsed."""
    terms = query_terms(text)
    parts = []
    for words, prefix in terms:
        lexemes = [f"'{w}'" for w in words]
        if prefix:
            lexemes[-1] += ":*"
        parts.append(lexemes[0] if len(lexemes) == 1 else "(" + " <-> ".join(lexemes) + ")")
    return " & ".join(parts), terms


class PgSearch:
    """The cluster set's search: `SearchIndex` and `SearchIndexer` over PostgreSQL."""

    def __init__(self, db: Database, deadline_s: float = QUERY_DEADLINE_S,
                 sync_budget_s: float = SYNC_BUDGET_S) -> None:
        self.db = db
        self.deadline_s = deadline_s
        self.sync_budget_s = sync_budget_s

    # -- SearchIndexer: told by the thread store ----------------------------------------
    def indexed_append(self, thread: Any, record: Record) -> None:
        """Index `record` when it directly follows the thread's mark (else `sync` catches up)."""
        text = _clean(record_text(record))
        args = {"tid": _thread_id(thread), "seq": record.seq, "role": record.role, "ts": float(record.ts),
                "text": text}
        stretch = abandoned_stretch(record)
        try:
            with self.db.autocommit() as conn:  # one statement (two for a branch marker)
                conn.execute(_APPEND_FIRST if record.seq == 1 else _APPEND_NEXT, args)
                if stretch is not None:  # the earlier branch it leaves is no longer searched
                    conn.execute(_WITHDRAW, (args["tid"], *stretch))
        except psycopg.Error as exc:
            log.warning("search index of %s not updated (%s): the next search catches up", args["tid"], exc)

    def indexed_reset(self, thread: Any, drop: bool) -> None:
        """After a clear: the thread's entries go and its mark restarts in the new epoch; after a
        delete (`drop`): entries and mark go."""
        tid = _thread_id(thread)
        try:
            with self.db.connection() as conn:
                if drop:
                    conn.execute("DELETE FROM search_marks WHERE thread_id = %s", (tid,))
                else:  # the mark first: its row lock orders this after a sync of the thread
                    conn.execute("UPDATE search_marks m SET seq = 0, epoch = t.epoch FROM threads t"
                                 " WHERE m.thread_id = %s AND t.id = m.thread_id", (tid,))
                conn.execute("DELETE FROM search_entries WHERE thread_id = %s", (tid,))
        except psycopg.Error as exc:
            log.warning("search index of %s not reset (%s): the next search rebuilds it", tid, exc)

    # -- catching up ------------------------------------------------------------------------
    def sync(self, workspace: str | list[str], owner: str) -> int:
        """Index what the owner's threads in `workspace` (one or a list) hold past their marks;
        returns the records read. Stops after `sync_budget_s`; the next call goes on."""
        workspaces = [workspace] if isinstance(workspace, str) else list(workspace)
        stop = time.monotonic() + self.sync_budget_s
        with self.db.connection() as conn:
            conn.execute(_ORPHANS, (owner, workspaces))
            stale = [r["id"] for r in conn.execute(_STALE, (owner, workspaces)).fetchall()]
        done = 0
        for tid in stale:
            while True:
                n, more = self._sync_batch(tid)
                done += n
                if not more or time.monotonic() > stop:
                    break
            if time.monotonic() > stop:
                log.info("search: catching up %s's threads goes on at the next search (%d read)", owner, done)
                break
        return done

    def _sync_batch(self, tid: str) -> tuple[int, bool]:
        """Index up to `SYNC_BATCH` records of `tid` past its mark, in one transaction under the
        mark's row lock. Returns (records read, whether more may follow)."""
        with self.db.connection() as conn:
            conn.execute("INSERT INTO search_marks (thread_id, owner, workspace, epoch, seq)"
                         " SELECT id, owner, workspace, epoch, 0 FROM threads WHERE id = %s"
                         " ON CONFLICT DO NOTHING", (tid,))
            mark = conn.execute("SELECT m.seq, m.epoch, t.epoch AS thread_epoch, m.owner, m.workspace"
                                " FROM search_marks m JOIN threads t ON t.id = m.thread_id"
                                " WHERE m.thread_id = %s FOR UPDATE OF m", (tid,)).fetchone()
            if mark is None:  # deleted meanwhile
                return 0, False
            seq = mark["seq"]
            if mark["epoch"] != mark["thread_epoch"]:  # cleared, and the reset was lost: rebuild
                conn.execute("DELETE FROM search_entries WHERE thread_id = %s", (tid,))
                seq = 0
            rows = conn.execute("SELECT seq, body FROM records WHERE thread_id = %s AND seq > %s"
                                " ORDER BY seq LIMIT %s", (tid, seq, SYNC_BATCH)).fetchall()
            entries, stretches = [], []
            for row in rows:
                seq = max(seq, int(row["seq"]))
                rec = _record(tid, row["body"])
                text = _clean(record_text(rec)) if rec is not None else ""
                if rec is not None and text:
                    entries.append((tid, rec.seq, mark["owner"], mark["workspace"], rec.role, float(rec.ts), text))
                if rec is not None and (stretch := abandoned_stretch(rec)) is not None:
                    stretches.append((tid, *stretch))
            with conn.cursor() as cur:
                if entries:
                    cur.executemany("INSERT INTO search_entries (thread_id, seq, owner, workspace, role, ts, text)"
                                    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", entries)
                if stretches:  # after the inserts: what a marker hides may be in this batch
                    cur.executemany(_WITHDRAW, stretches)
            conn.execute("UPDATE search_marks SET seq = %s, epoch = %s WHERE thread_id = %s",
                         (seq, mark["thread_epoch"], tid))
        return len(rows), len(rows) == SYNC_BATCH

    # -- SearchIndex: asked by the API ------------------------------------------------------
    def search(self, owner: str, workspaces: list[str], text: str, limit: int = 20) -> list[SearchHit]:
        """The best matches (at most `PER_THREAD_HITS` per thread), best first."""
        query, terms = ts_query(text)
        if not 1 <= limit <= MAX_LIMIT:
            raise BadSearchQuery(f"limit must be 1-{MAX_LIMIT}, got {limit}")
        if not workspaces:
            return []
        try:
            self.sync(workspaces, owner)
            rows = self._query(owner, workspaces, query, limit * PER_THREAD_HITS)
        except psycopg.OperationalError as exc:
            raise DatabaseError(f"search could not reach the cluster database {self.db.where}: {exc}") from exc
        hits: list[SearchHit] = []
        per_thread: dict[str, int] = {}
        for r in rows:
            if per_thread.get(r["thread"], 0) >= PER_THREAD_HITS:
                continue
            per_thread[r["thread"]] = per_thread.get(r["thread"], 0) + 1
            snippet, spans = readable_spans(*snippet_of(r["text"] or "", terms))  # rendered text
            hits.append(SearchHit(thread=r["thread"], workspace=r["workspace"], title=r["title"], seq=int(r["seq"]),
                                  role=r["role"], ts=float(r["ts"]), updated=float(r["updated"]),
                                  snippet=snippet, highlights=spans))
            if len(hits) >= limit:
                break
        return hits

    def _query(self, owner: str, workspaces: list[str], query: str, n: int) -> list[dict]:
        with self.db.connection() as conn:
            conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(self.deadline_s * 1000)}ms",))
            try:
                # never prepared: a generic plan cannot see the query's words, and scans
                return conn.execute(_QUERY, {"q": query, "owner": owner, "ws": workspaces, "n": n},
                                    prepare=False).fetchall()
            except psycopg.errors.QueryCanceled:
                raise SearchTooCostly(f"search took longer than {self.deadline_s:g} s: use longer or more "
                                      "specific words") from None
            except (psycopg.errors.SyntaxError, psycopg.errors.DataException) as exc:
                raise BadSearchQuery(f"search query cannot be searched: {exc}") from None


# -- records and snippets -----------------------------------------------------------------------
def _thread_id(thread: Any) -> str:
    return str(thread if isinstance(thread, str) else thread.id)


def _clean(text: str) -> str:
    return text.replace("\x00", "")  # a PostgreSQL text holds no NUL


def _record(tid: str, body: Any) -> Record | None:
    """A stored record (today's JSON line), or None when unreadable (logged)."""
    try:
        raw = bytes(body) if isinstance(body, (bytes, bytearray, memoryview)) else msgspec.json.encode(body)
        return msgspec.json.decode(raw, type=Record)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("search: a record of thread %s is unreadable, not indexed: %s", tid, exc)
        return None


def snippet_of(text: str, terms: list[tuple[list[str], bool]],
               width: int = SNIPPET_TOKENS) -> tuple[str, list[tuple[int, int]]]:
    """The `width` words of `text` around its best match, "…" where cut, and the [start, end)
    offsets of the matched words in it. Words are the index's (`_TOKEN`), matched like the
    query: whole words, or prefixes for a prefix term."""
    exact: set[str] = set()
    prefixes: list[str] = []
    for words, prefix in terms:
        parts = [p.lower() for w in words for p in _TOKEN.findall(w)]
        if prefix and parts:
            prefixes.append(parts.pop())
        exact.update(parts)
    tokens = [(m.start(), m.end()) for m in _TOKEN.finditer(text)]
    hit = [(text[a:b].lower() in exact) or any(text[a:b].lower().startswith(p) for p in prefixes)
           for a, b in tokens]
    if not tokens:
        return text, []
    first = _best_window(hit, width)
    last = min(len(tokens), first + width)
    start = 0 if first == 0 else tokens[first][0]
    end = len(text) if last == len(tokens) else tokens[last - 1][1]
    lead = "" if start == 0 else "…"
    shift = len(lead) - start
    spans = [(a + shift, b + shift) for (a, b), h in zip(tokens[first:last], hit[first:last]) if h]
    return lead + text[start:end] + ("" if end == len(text) else "…"), spans


def _best_window(hit: list[bool], width: int) -> int:
    """The first token of the `width`-token window holding the most matches (earliest on ties),
    starting a little before the first match so it reads in context."""
    if len(hit) <= width:
        return 0
    best, best_at, inside = -1, 0, 0
    for i, h in enumerate(hit):
        inside += h
        if i >= width:
            inside -= hit[i - width]
        if i >= width - 1 and inside > best:
            best, best_at = inside, i - width + 1
    lead_in = min(3, width // 4)
    first_match = next((i for i in range(best_at, len(hit)) if hit[i]), best_at)
    return max(0, min(best_at, first_match - lead_in))


def build_search(db: Database) -> PgSearch:
    """The cluster set's search: give it to the thread store as its indexer, and to the API."""
    return PgSearch(db)
