"""Search across a user's threads (store/search.py, GET /api/search) and paging earlier records
(GET /api/threads/{tid}?before=): the real app over a real data dir, SQLite FTS5 on disk."""

from __future__ import annotations

import time

import httpx

from datadesk.domain.records import Record, ToolCall
from datadesk.llm.scripted import ScriptedModel
from datadesk.store.search import INDEX_FILE
from tests.conftest import serve_app


def _fill(h, owner: str, title: str, texts: list[str]):
    thread = h.rt.threads.create("demo", owner, title)
    for text in texts:
        thread.append(lambda seq, t=text: Record(seq=seq, role="user" if seq % 2 else "assistant", ts=time.time(),
                                                 content=t))
    return thread


def test_search_finds_old_threads_with_snippet_and_stays_current(harness_factory) -> None:
    h = harness_factory(ScriptedModel([]))
    old = _fill(h, "alice", "Heating study", [f"filler message number {i}" for i in range(40)]
                + ["the Speicherstadt loft shows a ventilation fault at night"]
                + [f"more filler {i}" for i in range(20)])
    _fill(h, "alice", "Other", ["nothing relevant here"])
    _fill(h, "bob", "Bob's", ["ventilation of bob's building"])
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
        r = c.get("/api/search", params={"q": "ventilation"})
        assert r.status_code == 200, r.text
        [hit] = r.json()["results"]  # bob's thread is not alice's
        assert hit["thread"] == old.id and hit["seq"] == 41 and hit["title"] == "Heating study"
        s, e = hit["highlights"][0]
        assert hit["snippet"][s:e].lower() == "ventilation"
        # a prefix as typed, a phrase, and the title
        assert c.get("/api/search", params={"q": "speichers"}).json()["results"][0]["seq"] == 41
        assert c.get("/api/search", params={"q": '"fault at night"'}).json()["results"][0]["seq"] == 41
        assert c.get("/api/search", params={"q": "heating"}).json()["results"][0]["seq"] == 0
        # appended after the index exists (the append hook) and through a tool call's SQL
        old.append(lambda seq: Record(seq=seq, role="assistant", ts=time.time(), content="",
                                      tool_calls=[ToolCall(id="c1", name="sql_query",
                                                           arguments='{"sql": "SELECT zonnepanelen FROM x"}')]))
        assert [x["seq"] for x in c.get("/api/search", params={"q": "zonnepanelen"}).json()["results"]] == [62]
        # rename: the new title is found
        assert c.patch(f"/api/threads/{old.id}", json={"title": "Ventilatie report"}).status_code == 200
        assert any(x["seq"] == 0 for x in c.get("/api/search", params={"q": "ventilatie"}).json()["results"])
        # clear forgets the records (the title stays); delete forgets the thread
        assert c.post(f"/api/threads/{old.id}/clear").status_code == 200
        assert c.get("/api/search", params={"q": "speicherstadt"}).json()["results"] == []
        assert c.get("/api/search", params={"q": "ventilatie"}).json()["results"]
        assert c.delete(f"/api/threads/{old.id}").status_code == 204
        assert c.get("/api/search", params={"q": "ventilatie"}).json()["results"] == []
        # bob sees only his own thread
        bob = c.get("/api/search", params={"q": "ventilation"}, headers=h.auth("bob")).json()["results"]
        assert [x["title"] for x in bob] == ["Bob's"]
    if h.rt.cluster is None:  # the embedded set's index: FTS5 on disk in the user's folder
        assert (h.rt.layout.user_dir("demo", "alice") / INDEX_FILE).is_file()


def test_a_bad_query_is_a_400_naming_it(harness_factory) -> None:
    h = harness_factory(ScriptedModel([]))
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
        for q, words in [("", "empty"), ('"open phrase', "unbalanced"), ("x" * 300, "too long"),
                         ("!!! ???", "no words"), (" ".join(f"w{i}" for i in range(12)), "terms")]:
            r = c.get("/api/search", params={"q": q})
            assert r.status_code == 400 and words in r.json()["error"], (q, r.text)
        r = c.get("/api/search", params={"q": "ok", "limit": 500})
        assert r.status_code == 400 and "limit" in r.json()["error"]
        # FTS5 syntax typed by the user is just words
        assert c.get("/api/search", params={"q": "NEAR(a b) OR body:x AND -y"}).status_code == 200


def test_thread_pages_earlier_records(harness_factory) -> None:
    h = harness_factory(ScriptedModel([]))
    thread = _fill(h, "alice", "Long", [f"message {i}" for i in range(1, 701)])
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
        newest = c.get(f"/api/threads/{thread.id}", params={"limit": 500}).json()
        assert newest["has_more"] and newest["records"][0]["seq"] == 201
        earlier = c.get(f"/api/threads/{thread.id}", params={"limit": 500, "before": 201}).json()
        assert [r["seq"] for r in earlier["records"]] == list(range(1, 201)) and not earlier["has_more"]
        page = c.get(f"/api/threads/{thread.id}", params={"limit": 50, "before": 201}).json()
        assert [r["seq"] for r in page["records"]] == list(range(151, 201)) and page["has_more"]
        assert c.get(f"/api/threads/{thread.id}", params={"before": 0}).status_code == 400


def test_a_damaged_index_is_rebuilt_from_the_logs(harness_factory) -> None:
    h = harness_factory(ScriptedModel([]))
    thread = _fill(h, "alice", "Notes", ["the albatross count"])
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
        assert c.get("/api/search", params={"q": "albatross"}).json()["results"]
        path = h.rt.layout.user_dir("demo", "alice") / INDEX_FILE
        from datadesk.store import search

        search._indexes.pop(str(path)).close()  # as a fresh process would find it
        for suffix in ("-wal", "-shm"):
            (path.parent / (path.name + suffix)).unlink(missing_ok=True)
        path.write_bytes(b"not a database" * 100)
        r = c.get("/api/search", params={"q": "albatross"})
        assert r.status_code == 200 and r.json()["results"][0]["thread"] == thread.id


def test_an_index_from_before_branch_withdrawal_is_rebuilt_once(tmp_path) -> None:
    """An index written before SCHEMA_VERSION may hold an earlier branch's records: opened by
    this version it is emptied once (the next search rebuilds it from the logs), never again."""
    import sqlite3

    from datadesk.store.search import SCHEMA_VERSION, SearchIndex

    path = tmp_path / INDEX_FILE
    old = SearchIndex(path)
    old.add_records("t1", [Record(seq=1, role="user", ts=1.0, content="abandoned skua")])
    old.conn.execute("PRAGMA user_version=0")
    old.close()
    idx = SearchIndex(path)
    assert idx.conn.execute("SELECT count(*) FROM docs").fetchone()[0] == 0
    assert idx.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    idx.add_records("t1", [Record(seq=1, role="user", ts=1.0, content="kept tern")])
    idx.close()
    again = SearchIndex(path)
    assert again.conn.execute("SELECT count(*) FROM docs").fetchone()[0] == 1
    again.close()
    assert sqlite3.connect(str(path)).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
