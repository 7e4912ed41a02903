"""Search conformance: both sets (FTS5 files; PostgreSQL full text) find the same hits with
the same shape, keep users and workspaces apart, forget what a clear or a delete removed,
refuse bad queries with the same words, handle unicode, and catch up with records whose
indexing a crash lost (an append committed, its index update never run)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from datadesk.domain.records import Record, ToolCall
from datadesk.store.interfaces.search import BadSearchQuery, SearchHit, SearchIndex, SearchTooCostly
from datadesk.store.layout import Layout

pytestmark = pytest.mark.cluster

WS = "demo"


class SearchSet:
    """One set's threads (the thread store with its indexer) and its `SearchIndex`."""

    def __init__(self, kind: str, home: Path, request) -> None:
        self.kind = kind
        self.layout = Layout(home)
        if kind == "embedded":
            from datadesk.store.search import ThreadSearch
            from datadesk.store.threads import Thread, ThreadStore

            self.threads = ThreadStore(self.layout)
            self.index: SearchIndex = ThreadSearch(self.layout, Thread.at)
        else:
            from datadesk.cluster.search import build_search
            from datadesk.cluster.threads import PgThreadStore

            self.db = request.getfixturevalue("cluster_db")
            self.index = build_search(self.db)
            self.threads = PgThreadStore(self.db, self.layout, search=self.index)

    def create(self, owner: str, title: str, texts: list[str], ws: str = WS):
        thread = self.threads.create(ws, owner, title)
        for text in texts:
            self.add(thread, text)
        return thread

    def add(self, thread, text: str, role: str | None = None) -> Record:
        return thread.append(lambda seq: Record(seq=seq, role=role or ("user" if seq % 2 else "assistant"),
                                                ts=time.time(), content=text))

    def add_unindexed(self, thread, text: str) -> Record:
        """An append whose index update never ran (the process died between the two)."""
        make = lambda seq: Record(seq=seq, role="user", ts=time.time(), content=text)  # noqa: E731
        if self.kind == "embedded":
            return thread.log.append(make)  # the log alone, without Thread.append's hook
        search, self.threads.search = self.threads.search, None
        try:
            return thread.append(make)
        finally:
            self.threads.search = search

    def clear_unindexed(self, thread) -> None:
        """A clear whose index reset never ran."""
        if self.kind == "embedded":
            from datadesk.store import threads as mod

            saved, mod.indexed_reset = mod.indexed_reset, lambda *a, **k: None
            try:
                self.threads.clear(thread)
            finally:
                mod.indexed_reset = saved
            return
        search, self.threads.search = self.threads.search, None
        try:
            self.threads.clear(thread)
        finally:
            self.threads.search = search

    def delete_unindexed(self, thread) -> None:
        """A delete whose index reset never ran."""
        if self.kind == "embedded":
            from datadesk.store import threads as mod

            saved, mod.indexed_reset = mod.indexed_reset, lambda *a, **k: None
            try:
                self.threads.delete(thread)
            finally:
                mod.indexed_reset = saved
            return
        search, self.threads.search = self.threads.search, None
        try:
            self.threads.delete(thread)
        finally:
            self.threads.search = search

    def search(self, owner: str, text: str, limit: int = 20, workspaces: list[str] | None = None) -> list[SearchHit]:
        return self.index.search(owner, workspaces or [WS], text, limit)


@pytest.fixture(params=["embedded", "cluster"])
def s(request, tmp_path: Path) -> SearchSet:
    return SearchSet(request.param, tmp_path / "var", request)


def test_hits_have_the_shape_and_highlights(s: SearchSet) -> None:
    old = s.create("alice", "Heating study", [f"filler message number {i}" for i in range(40)]
                   + ["the Speicherstadt loft shows a ventilation fault at night"]
                   + [f"more filler {i}" for i in range(20)])
    s.create("alice", "Other", ["nothing relevant here"])
    [hit] = s.search("alice", "ventilation")
    assert isinstance(hit, SearchHit)
    assert (hit.thread, hit.workspace, hit.title, hit.seq, hit.role) == (old.id, WS, "Heating study", 41, "user")
    assert hit.ts > 0 and hit.updated > 0
    s_, e = hit.highlights[0]
    assert hit.snippet[s_:e].lower() == "ventilation" and "Speicherstadt" in hit.snippet
    assert s.search("alice", "speichers")[0].seq == 41  # the last word is a prefix
    assert s.search("alice", '"fault at night"')[0].seq == 41  # a phrase
    assert s.search("alice", '"night at fault"') == []  # a phrase keeps its order
    assert s.search("alice", "ventilation loft")[0].seq == 41  # every word (AND) ...
    assert s.search("alice", "ventilation kitchen") == []  # ... must occur
    title = s.search("alice", "heating")
    assert title[0].seq == 0 and title[0].role == "title" and title[0].snippet == "Heating study"
    assert title[0].highlights == [(0, 7)]


def test_a_long_record_gives_a_short_snippet_around_the_match(s: SearchSet) -> None:
    words = [f"word{i}" for i in range(200)]
    words[120] = "albatross"
    s.create("alice", "Birds", [" ".join(words)])
    [hit] = s.search("alice", "albatross")
    assert len(hit.snippet) < 200 and "…" in hit.snippet
    a, b = hit.highlights[0]
    assert hit.snippet[a:b] == "albatross"


def test_tool_calls_and_punctuation_are_searchable(s: SearchSet) -> None:
    t = s.create("alice", "SQL", [])
    t.append(lambda seq: Record(seq=seq, role="assistant", ts=time.time(), content="",
                                tool_calls=[ToolCall(id="c1", name="sql_query",
                                                     arguments='{"sql": "SELECT zonnepanelen FROM sales.orders"}')]))
    s.add(t, "see report.csv and e-mail me")
    assert [h.seq for h in s.search("alice", "zonnepanelen")] == [1]
    assert [h.seq for h in s.search("alice", "orders")] == [1]  # `sales.orders` is two words
    assert [h.seq for h in s.search("alice", "report")] == [2]
    assert [h.seq for h in s.search("alice", '"report csv"')] == [2]


def test_at_most_three_hits_per_thread_and_the_limit(s: SearchSet) -> None:
    s.create("alice", "Many", [f"meter reading {i}" for i in range(10)])
    s.create("alice", "More", [f"meter value {i}" for i in range(10)])
    hits = s.search("alice", "meter", limit=50)
    per = {}
    for h in hits:
        per[h.thread] = per.get(h.thread, 0) + 1
    assert sorted(per.values()) == [3, 3]
    assert len(s.search("alice", "meter", limit=2)) == 2


def test_owners_and_workspaces_are_kept_apart(s: SearchSet) -> None:
    mine = s.create("alice", "Mine", ["the ventilation of my house"])
    s.create("bob", "Bob's", ["ventilation of bob's building"])
    sales = s.create("alice", "Sales", ["ventilation sales pitch"], ws="sales")
    assert [h.thread for h in s.search("alice", "ventilation")] == [mine.id]
    assert [h.title for h in s.search("bob", "ventilation")] == ["Bob's"]
    both = s.search("alice", "ventilation", workspaces=[WS, "sales"])
    assert {(h.thread, h.workspace) for h in both} == {(mine.id, WS), (sales.id, "sales")}
    assert s.search("carol", "ventilation") == []


def test_new_records_and_renames_are_found(s: SearchSet) -> None:
    t = s.create("alice", "Notes", ["the albatross count"])
    assert s.search("alice", "albatross")
    s.add(t, "a cormorant was seen too")  # after the index exists: the append hook
    assert [h.seq for h in s.search("alice", "cormorant")] == [2]
    s.threads.touch(t, title="Ventilatie report")
    assert [h.seq for h in s.search("alice", "ventilatie")] == [0]
    assert s.search("alice", "ventilatie")[0].title == "Ventilatie report"
    assert s.search("alice", "albatross")[0].title == "Ventilatie report"


def test_clear_forgets_records_keeps_the_title_and_delete_forgets_all(s: SearchSet) -> None:
    t = s.create("alice", "Ventilatie", ["the Speicherstadt loft"])
    assert s.search("alice", "speicherstadt")
    s.threads.clear(t)
    assert s.search("alice", "speicherstadt") == []
    assert [h.seq for h in s.search("alice", "ventilatie")] == [0]
    s.add(t, "after the clear: kittiwake")
    assert [h.seq for h in s.search("alice", "kittiwake")] == [1]
    s.threads.delete(t)
    assert s.search("alice", "ventilatie") == [] and s.search("alice", "kittiwake") == []


def test_an_append_whose_indexing_was_lost_is_found(s: SearchSet) -> None:
    t = s.create("alice", "Crash", ["first record"])
    assert s.search("alice", "first")
    s.add_unindexed(t, "the guillemot record")  # committed, index update lost
    s.add(t, "a later puffin record")  # its hook sees a gap and leaves it to the next search
    assert [h.seq for h in s.search("alice", "guillemot")] == [2]
    assert [h.seq for h in s.search("alice", "puffin")] == [3]


def test_a_clear_whose_reset_was_lost_is_rebuilt(s: SearchSet) -> None:
    t = s.create("alice", "Cleared", ["the albatross count", "two", "three"])
    assert s.search("alice", "albatross")
    s.clear_unindexed(t)
    s.add(t, "the petrel count")
    assert s.search("alice", "albatross") == []
    assert [h.seq for h in s.search("alice", "petrel")] == [1]


def test_a_delete_whose_reset_was_lost_leaves_nothing_findable(s: SearchSet) -> None:
    gone = s.create("alice", "Gone fulmar", ["the fulmar record"])
    kept = s.create("alice", "Kept", ["another fulmar record"])
    assert len(s.search("alice", "fulmar")) == 3
    s.delete_unindexed(gone)
    assert [h.thread for h in s.search("alice", "fulmar")] == [kept.id]
    if s.kind == "cluster":  # and the leftovers were swept
        with s.db.connection() as conn:
            left = conn.execute("SELECT (SELECT count(*) FROM search_entries WHERE thread_id = %s)"
                                " + (SELECT count(*) FROM search_marks WHERE thread_id = %s) AS n",
                                (gone.id, gone.id)).fetchone()["n"]
        assert left == 0


def test_threads_made_before_the_index_are_indexed_at_the_first_search(s: SearchSet) -> None:
    t = s.create("alice", "Early", [])
    for i in range(3):
        s.add_unindexed(t, f"record {i} about shearwaters")
    assert sorted(h.seq for h in s.search("alice", "shearwaters")) == [1, 2, 3]


def _marker(s: SearchSet, thread, text: str, rewinds_to: int, branch_of: int, indexed: bool = True) -> Record:
    """A branch marker (an edit of the question at `branch_of`: domain/branches.py)."""
    make = lambda seq: Record(seq=seq, role="user", ts=time.time(), content=text,  # noqa: E731
                              meta={"kind": "edit", "rewinds_to": rewinds_to, "branch_of": branch_of})
    if indexed:
        return thread.append(make)
    search, s.threads.search = getattr(s.threads, "search", None), None
    try:
        return thread.log.append(make) if s.kind == "embedded" else thread.append(make)
    finally:
        if s.kind != "embedded":
            s.threads.search = search


def test_a_branch_made_after_indexing_withdraws_the_earlier_branch(s: SearchSet) -> None:
    t = s.create("alice", "Branches", ["how many gannets", "twenty gannets counted", "which day do skuas peak",
                                       "skuas peak on Tuesday"])
    assert sorted(h.seq for h in s.search("alice", "skuas")) == [3, 4]  # indexed before the branch
    _marker(s, t, "which day do terns peak", rewinds_to=2, branch_of=3)  # the append hook
    s.add(t, "terns peak on Friday", role="assistant")
    assert s.search("alice", "skuas") == []  # only in the abandoned stretch (seq 3-4)
    assert sorted(h.seq for h in s.search("alice", "terns")) == [5, 6]
    assert sorted(h.seq for h in s.search("alice", "gannets")) == [1, 2]  # the shared part stays
    # a nested branch: regenerate the edited question's answer, then edit the first question
    _marker(s, t, "how many gannets and boobies", rewinds_to=0, branch_of=1)
    assert s.search("alice", "terns") == [] and s.search("alice", "twenty") == []
    assert [h.seq for h in s.search("alice", "boobies")] == [7]


def test_a_branch_indexed_by_catching_up_withdraws_the_earlier_branch(s: SearchSet) -> None:
    t = s.create("alice", "Catch up", ["first question about puffins", "puffins answer"])
    assert s.search("alice", "puffins")
    _marker(s, t, "first question about eiders", rewinds_to=0, branch_of=1, indexed=False)  # hook lost
    assert s.search("alice", "puffins") == []
    assert [h.seq for h in s.search("alice", "eiders")] == [3]
    fresh = s.create("alice", "Fresh", [])  # a thread the index sees for the first time, whole
    for text in ("the razorbill question", "razorbill answer"):
        s.add_unindexed(fresh, text)
    _marker(s, fresh, "the shag question", rewinds_to=0, branch_of=1, indexed=False)
    assert s.search("alice", "razorbill") == [] and [h.seq for h in s.search("alice", "shag")] == [3]


@pytest.mark.parametrize(("q", "words"), [("", "empty"), ('"open phrase', "unbalanced"), ("x" * 300, "too long"),
                                          ("!!! ???", "no words"), (" ".join(f"w{i}" for i in range(12)), "terms")])
def test_bad_queries_are_refused_naming_what_is_wrong(s: SearchSet, q: str, words: str) -> None:
    with pytest.raises(BadSearchQuery, match=words):
        s.search("alice", q)


def test_bad_limits_and_engine_syntax(s: SearchSet) -> None:
    s.create("alice", "Syntax", ["body near or and"])
    for limit in (0, 51):
        with pytest.raises(BadSearchQuery, match="limit"):
            s.search("alice", "ok", limit=limit)
    # either engine's syntax typed by the user is just words
    for q in ("NEAR(a b) OR body:x AND -y", "a & b | !c", "x:* <-> 'y'", "a\\b 'c' \"d\"", "(((x", "body:near"):
        s.search("alice", q)
    assert s.search("alice", "body:near")[0].seq == 1


def test_unicode_words(s: SearchSet) -> None:
    t = s.create("alice", "Ελληνικά", ["Müller prüft die Zählerstände", "東京 の データ", "l’été à Montréal"])
    assert [h.seq for h in s.search("alice", "zählerstände")] == [1]
    assert [h.seq for h in s.search("alice", "MÜLLER")] == [1]  # case folds
    assert [h.seq for h in s.search("alice", "東京")] == [2]
    assert [h.seq for h in s.search("alice", "montréal")] == [3]
    assert [h.seq for h in s.search("alice", "ελληνικά")] == [0]
    [hit] = s.search("alice", "zähler")  # a prefix of a word with an umlaut
    a, b = hit.highlights[0]
    assert hit.snippet[a:b] == "Zählerstände"
    s.add(t, "a NUL \x00 inside, and emoji 🦜 parrots")
    assert [h.seq for h in s.search("alice", "parrots")] == [4]


def test_concurrent_appends_from_two_hosts_are_all_found(s: SearchSet, request) -> None:
    """Two writers (cluster: two pools, two hosts) append to one thread while searches run."""
    t = s.create("alice", "Busy", ["start"])
    stores = [s.threads]
    if s.kind == "cluster":
        from datadesk.cluster.database import Database
        from datadesk.cluster.search import build_search
        from datadesk.cluster.threads import PgThreadStore

        db_b = Database(request.getfixturevalue("cluster_db_url"), max_size=4, name="host-b")
        request.addfinalizer(db_b.close)
        stores.append(PgThreadStore(db_b, s.layout, search=build_search(db_b)))
    else:
        from datadesk.store.threads import ThreadStore

        stores.append(ThreadStore(s.layout))
    errors: list[BaseException] = []

    def write(w: int) -> None:
        thread = stores[w % 2].get(t.id, "alice", [WS])
        try:
            for i in range(10):
                s.add(thread, f"writer{w} note{i} skua")
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    workers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    for _ in range(5):
        s.search("alice", "skua")
    for w in workers:
        w.join(timeout=120)
    assert not errors, errors
    for w in range(4):
        for i in (0, 9):
            assert len(s.search("alice", f"writer{w} note{i}")) == 1, (w, i)


def test_a_query_past_its_deadline_is_too_costly(s: SearchSet) -> None:
    s.create("alice", "Deadline", ["some words here"])
    if s.kind == "embedded":
        from datadesk.store import search as mod

        idx = s.index.sync(WS, "alice")
        tid = next(iter(idx.states()))
        idx.conn.executemany("INSERT INTO docs(thread, seq, role, ts, body) VALUES (?, ?, 'user', 0, ?)",
                             [(tid, i, "words " + "filler " * 20) for i in range(100, 5100)])
        with pytest.raises(SearchTooCostly, match="longer than"):
            idx.query(mod.fts_query("words"), 10, deadline_s=-1)
        return
    from datadesk.cluster.search import PgSearch

    slow = PgSearch(s.db, deadline_s=0.001)
    with s.db.connection() as conn:  # enough rows that the query cannot finish in 1 ms
        conn.execute("INSERT INTO search_entries (thread_id, seq, owner, workspace, role, ts, text)"
                     " SELECT %s, g, 'alice', %s, 'user', 0, 'words ' || repeat('filler ', 200) || g"
                     " FROM generate_series(100, 30099) g", (s.threads.folders(WS, "alice").__next__().id, WS))
        conn.execute("UPDATE search_marks SET seq = 1000000")
    with pytest.raises(SearchTooCostly, match="longer than"):
        slow.search("alice", [WS], "words")


def test_search_holds_what_the_thread_holds_after_a_failed_guarded_write(s: SearchSet) -> None:
    """An append inside `guarded` whose block then fails: the cluster set rolls the record back
    (the index must not keep its text), the embedded log keeps it (the index finds it)."""
    t = s.create("alice", "Guarded", ["first record"])
    assert s.search("alice", "first")
    with pytest.raises(RuntimeError, match="after the append"):
        with t.guarded(t.epoch):
            s.add(t, "the phalarope record")
            raise RuntimeError("after the append")
    s.add(t, "the next jaeger record")
    kept = {r.seq: r.content for r in t}
    assert [h.seq for h in s.search("alice", "phalarope")] == [seq for seq, c in kept.items() if "phalarope" in c]
    assert [h.seq for h in s.search("alice", "jaeger")] == [seq for seq, c in kept.items() if "jaeger" in c]


def test_a_lost_database_connection_is_a_clear_error_then_recovers(s: SearchSet, request) -> None:
    if s.kind == "embedded":
        pytest.skip("the files have no connection to lose")
    from datadesk.cluster.database import Database, DatabaseError
    from datadesk.cluster.search import build_search

    s.create("alice", "Lost", ["the storm petrel record"])
    db = Database(request.getfixturevalue("cluster_db_url"), min_size=1, max_size=1, name="doomed")
    try:
        index = build_search(db)
        assert index.search("alice", [WS], "petrel")
        with s.db.connection() as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'doomed'")
        with pytest.raises(DatabaseError, match="search could not reach the cluster database"):
            index.search("alice", [WS], "petrel")
        assert index.search("alice", [WS], "petrel")
        index.indexed_append(next(s.threads.folders(WS, "alice")), Record(seq=9, role="user", ts=0, content="x"))
    finally:
        db.close()
