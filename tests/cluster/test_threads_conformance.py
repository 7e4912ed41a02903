"""The `ThreadStore` / `Thread` protocols (store/interfaces/threads.py) on both sets: the embedded folders
(store/threads.py) and the PostgreSQL rows (cluster/threads.py).

"Two hosts" are two stores: on the embedded set two `ThreadStore`s on one home (two processes
of one host), on the cluster set two `PgThreadStore`s with their own pools and their own homes
on one database.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import msgspec
import pytest

from datadesk.context.manifest import last_manifest
from datadesk.context.taskstate import TaskStateError, TaskStateStore
from datadesk.domain.records import Record
from datadesk.store.interfaces.threads import (MANIFESTS, SUMMARY, SUMMARY_REVISIONS, SUMMARY_STATUS, TASK_STATE, LogClosed,
                                    RecordLog, Thread, ThreadNotFound, ThreadStore, TooManyThreads, TurnFenced,
                                    UnknownDocument)
from datadesk.store.layout import Layout
from datadesk.summary.model import ThreadSummary
from datadesk.summary.status import SummaryStatusStore
from datadesk.summary.store import SummaryStore

pytestmark = pytest.mark.cluster


class ThreadSet:
    """One set under test: `store(host, max_threads)` opens a store as that host sees it."""

    def __init__(self, kind: str, open_store: Callable[[str, int], ThreadStore], db: Any = None) -> None:
        self.kind, self.db = kind, db
        self._open = open_store

    def store(self, host: str = "a", max_threads: int = 0) -> ThreadStore:
        return self._open(host, max_threads)


@pytest.fixture(params=["embedded", "cluster"])
def tset(request, tmp_path: Path):
    if request.param == "embedded":
        from datadesk.store.threads import ThreadStore as FileThreads

        yield ThreadSet("embedded", lambda host, limit: FileThreads(Layout(tmp_path / "home"), limit))
        return
    from datadesk.cluster.database import Database
    from datadesk.cluster.threads import PgThreadStore

    db = request.getfixturevalue("cluster_db")
    url = request.getfixturevalue("cluster_db_url")
    pools: dict[str, Any] = {"a": db}

    def open_store(host: str, limit: int) -> PgThreadStore:
        if host not in pools:  # another host: its own pool (its own connections) on the same database
            pools[host] = Database(url, max_size=12)
        return PgThreadStore(pools[host], Layout(tmp_path / f"home-{host}"), limit)

    yield ThreadSet("cluster", open_store, db)
    for host, pool in pools.items():
        if host != "a":
            pool.close()


def rec(content: str, role: str = "user") -> Callable[[int], Record]:
    return lambda seq: Record(seq=seq, role=role, ts=time.time(), content=content)


def summary(epoch: int, covers: int, goal: str = "g") -> ThreadSummary:
    return ThreadSummary(goal=goal, epoch=epoch, covers_through_seq=covers, created=time.time(), model="m")


# -- create, get, list ------------------------------------------------------------------------


def test_create_get_list_are_isolated_by_owner_and_workspace(tset: ThreadSet) -> None:
    store = tset.store()
    assert isinstance(store, ThreadStore)
    a1 = store.create("ws1", "alice", "first")
    a2 = store.create("ws2", "alice", "second", project="p")
    b1 = store.create("ws1", "bob")
    assert isinstance(a1, Thread) and isinstance(a1.log, RecordLog)
    assert (a1.workspace, a1.epoch, a1.meta.owner, a1.meta.title) == ("ws1", 0, "alice", "first")
    got = store.get(a2.id, "alice", ["ws1", "ws2"])
    assert (got.id, got.meta.project, got.workspace) == (a2.id, "p", "ws2")
    for tid, owner, wss in ((a1.id, "bob", ["ws1"]), (a2.id, "alice", ["ws1"]), (b1.id, "alice", ["ws1", "ws2"])):
        with pytest.raises(ThreadNotFound):
            store.get(tid, owner, wss)
    store.touch(a1, title="renamed")
    assert [m.id for m in store.list("alice", ["ws1", "ws2"])] == [a1.id, a2.id]  # newest `updated` first
    assert [m.title for m in store.list("alice", ["ws1"])] == ["renamed"]
    assert [m.id for m in store.list("bob", ["ws1", "ws2"])] == [b1.id]
    assert [t.id for t in store.folders("ws1", "alice")] == [a1.id]
    other_host = tset.store("b")
    assert other_host.get(a1.id, "alice", ["ws1"]).meta.title == "renamed"


def test_the_thread_limit_is_per_user_and_workspace(tset: ThreadSet) -> None:
    store = tset.store(max_threads=2)
    store.create("ws", "alice")
    store.create("ws", "alice")
    with pytest.raises(TooManyThreads, match="at most 2"):
        store.create("ws", "alice")
    store.create("ws", "bob")
    store.create("other", "alice")


def test_empty_chat_is_the_newest_untitled_thread_without_records(tset: ThreadSet) -> None:
    store = tset.store()
    assert store.empty_chat("ws", "alice") is None
    used = store.create("ws", "alice")
    used.append(rec("hello"), epoch=used.epoch)
    store.create("ws", "alice", "titled")
    store.create("ws", "alice", project="p")
    empty = store.create("ws", "alice")
    assert store.empty_chat("ws", "alice").id == empty.id
    assert store.empty_chat("ws", "bob") is None


# -- records ---------------------------------------------------------------------------------


def test_records_append_and_read_back_in_every_order(tset: ThreadSet) -> None:
    thread = tset.store().create("ws", "alice")
    for i in range(1, 301):
        made = thread.append(rec(f"m{i}", "user" if i % 2 else "assistant"), epoch=thread.epoch)
        assert made.seq == i
    assert [r.seq for r in thread.tail(3)] == [298, 299, 300]
    assert [r.seq for r in thread.log.tail(1)] == [300]
    assert thread.tail(0) == []
    assert [r.seq for r in thread.since(295)] == [295, 296, 297, 298, 299, 300]
    assert [r.seq for r in thread.since(10, 12)] == [10, 11, 12]
    assert [r.seq for r in thread] == list(range(1, 301))
    newest = thread.newest_first()
    assert [next(newest).seq for _ in range(3)] == [300, 299, 298]
    assert [r.seq for r in thread.newest_first()] == list(range(300, 0, -1))
    assert [r.content for r in thread.find(lambda r: r.content.startswith("m1"), limit=2)] == ["m199", "m198"]
    assert thread.find(lambda r: r.content == "nope") == []
    with pytest.raises(ValueError, match="does not follow"):
        thread.append(lambda seq: Record(seq=3, role="user", ts=0.0, content="x"))
    reopened = tset.store("b").get(thread.id, "alice", ["ws"])
    assert [r.content for r in reopened.tail(2)] == ["m299", "m300"]


def test_two_hosts_appending_at_once_get_contiguous_unique_seqs(tset: ThreadSet) -> None:
    hosts = [tset.store("a"), tset.store("b")]
    tid = hosts[0].create("ws", "alice").id
    threads = [h.get(tid, "alice", ["ws"]) for h in hosts]
    errors: list[BaseException] = []

    def writer(thread: Thread, name: str) -> None:
        try:
            for i in range(25):
                thread.append(rec(f"{name}-{i}"), epoch=0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(threads[i % 2], f"w{i}")) for i in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    seqs = [r.seq for r in threads[1]]
    assert seqs == list(range(1, 151))
    contents = [r.content for r in threads[0]]
    assert len(set(contents)) == 150
    for i in range(6):  # each writer's records in its own order
        mine = [c for c in contents if c.startswith(f"w{i}-")]
        assert mine == [f"w{i}-{n}" for n in range(25)]


# -- epochs and clear ---------------------------------------------------------------------------


def test_a_clear_refuses_every_write_begun_before_it_and_keeps_nothing(tset: ThreadSet) -> None:
    store = tset.store()
    thread = store.create("ws", "alice")
    epoch = thread.epoch
    for i in range(3):
        thread.append(rec(f"r{i}"), epoch=epoch)
    assert thread.write_doc(SUMMARY, {"goal": "g"}, epoch)
    assert thread.append_line(MANIFESTS, b'{"step": 1}', epoch)
    removed = tset.store("b").clear(tset.store("b").get(thread.id, "alice", ["ws"]))  # by the other host
    assert removed["records"] == 3 and removed["bytes"] > 0
    assert thread.cleared_since(epoch) and thread.current_epoch() == epoch + 1
    with pytest.raises(LogClosed, match="was cleared"):
        thread.append(rec("late"), epoch=epoch)
    with pytest.raises(LogClosed):
        with thread.guarded(epoch):
            pass
    with pytest.raises(LogClosed):
        thread.update_doc(TASK_STATE, lambda old: {"x": 1}, epoch)
    assert not thread.write_doc(SUMMARY, {"goal": "late"}, epoch)
    assert not thread.append_line(MANIFESTS, b'{"step": 2}', epoch)
    assert list(thread) == [] and thread.read_doc(SUMMARY) is None and list(thread.lines(MANIFESTS)) == []
    assert thread.read_doc(TASK_STATE) is None
    new_epoch = thread.reload().epoch
    assert new_epoch == epoch + 1 and not thread.cleared_since(new_epoch)
    assert thread.append(rec("after"), epoch=new_epoch).seq == 1  # a cleared log starts again at 1
    assert thread.write_doc(SUMMARY, {"goal": "new"}, new_epoch)
    assert [r.content for r in thread] == ["after"]


def test_delete_removes_the_thread_and_refuses_later_writes(tset: ThreadSet) -> None:
    store = tset.store()
    thread = store.create("ws", "alice")
    thread.append(rec("x"), epoch=thread.epoch)
    thread.write_doc(SUMMARY, {"goal": "g"}, thread.epoch)
    keep = store.create("ws", "alice")
    store.delete(thread)
    with pytest.raises(ThreadNotFound):
        store.get(thread.id, "alice", ["ws"])
    assert [m.id for m in store.list("alice", ["ws"])] == [keep.id]
    assert not thread.exists() and thread.current_epoch() is None
    with pytest.raises(LogClosed):
        thread.append(rec("late"), epoch=0)
    assert not thread.write_doc(SUMMARY, {"goal": "late"}, 0)
    with pytest.raises(ThreadNotFound):
        thread.reload()


# -- documents and line sets --------------------------------------------------------------------


def test_documents_read_write_and_update(tset: ThreadSet) -> None:
    thread = tset.store().create("ws", "alice")
    e = thread.epoch
    assert thread.read_doc(SUMMARY_STATUS) is None
    assert thread.write_doc(SUMMARY_STATUS, {"state": "ok", "text": "naïve ✓"}, e)
    assert msgspec.json.decode(thread.read_doc(SUMMARY_STATUS)) == {"state": "ok", "text": "naïve ✓"}
    assert thread.update_doc(TASK_STATE, lambda old: {"n": 1} if old is None else None, e) == {"n": 1}
    bump = lambda old: {"n": msgspec.json.decode(old)["n"] + 1}  # noqa: E731
    assert thread.update_doc(TASK_STATE, bump, e) == {"n": 2}
    assert thread.update_doc(TASK_STATE, lambda old: None, e) is None  # None: left as it is
    with pytest.raises(ZeroDivisionError):
        thread.update_doc(TASK_STATE, lambda old: 1 / 0, e)
    assert msgspec.json.decode(thread.read_doc(TASK_STATE)) == {"n": 2}
    assert tset.store("b").get(thread.id, "alice", ["ws"]).read_doc(TASK_STATE) is not None
    for bad in ("meta", "../x", "summary.json"):
        with pytest.raises(UnknownDocument):
            thread.read_doc(bad)
        with pytest.raises(UnknownDocument):
            thread.append_line(bad, b"{}", e)


def test_concurrent_updates_of_a_document_lose_nothing(tset: ThreadSet) -> None:
    hosts = [tset.store("a"), tset.store("b")]
    tid = hosts[0].create("ws", "alice").id
    threads = [h.get(tid, "alice", ["ws"]) for h in hosts]
    threads[0].write_doc(TASK_STATE, {"n": 0}, 0)
    inc = lambda old: {"n": msgspec.json.decode(old)["n"] + 1}  # noqa: E731
    workers = [threading.Thread(target=lambda t=threads[i % 2]: [t.update_doc(TASK_STATE, inc, 0) for _ in range(20)])
               for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert msgspec.json.decode(threads[1].read_doc(TASK_STATE)) == {"n": 80}


def test_line_sets_append_bounded_and_read_both_ways(tset: ThreadSet) -> None:
    thread = tset.store().create("ws", "alice")
    e = thread.epoch
    for i in range(6):
        assert thread.append_line(SUMMARY_REVISIONS, b'{"i": %d}' % i, e, keep=4)
    assert [msgspec.json.decode(x)["i"] for x in thread.lines(SUMMARY_REVISIONS)] == [2, 3, 4, 5]
    assert [msgspec.json.decode(x)["i"] for x in thread.lines(SUMMARY_REVISIONS, newest_first=True)] == [5, 4, 3, 2]
    assert thread.append_line(SUMMARY_REVISIONS, b'{"i": 6}', e, keep=0)
    assert list(thread.lines(SUMMARY_REVISIONS)) == []
    for i in range(40):
        thread.append_line(MANIFESTS, b'{"i": %d}\n' % i, e)
    newest = thread.lines(MANIFESTS, newest_first=True)
    assert [msgspec.json.decode(next(newest))["i"] for _ in range(2)] == [39, 38]
    assert [msgspec.json.decode(x)["i"] for x in thread.lines(MANIFESTS, newest_first=True)] == list(range(39, -1, -1))
    assert len(list(thread.lines(MANIFESTS))) == 40


def test_manifest_retention_of_the_cluster_set(tset: ThreadSet) -> None:
    if tset.kind == "embedded":
        pytest.skip("the embedded context.jsonl keeps every manifest, as it always did")
    store = tset.store()
    store.manifests_kept = 5
    thread = store.create("ws", "alice")
    for i in range(12):
        thread.append_line(MANIFESTS, b'{"i": %d}' % i, thread.epoch)
    assert [msgspec.json.decode(x)["i"] for x in thread.lines(MANIFESTS)] == [7, 8, 9, 10, 11]


def test_writes_inside_guarded_join_the_hold(tset: ThreadSet) -> None:
    thread = tset.store().create("ws", "alice")
    e = thread.epoch
    with thread.guarded(e):
        assert thread.read_doc(SUMMARY) is None
        assert thread.write_doc(SUMMARY, {"goal": "g"}, e)
        assert thread.append_line(SUMMARY_REVISIONS, b"{}", e, keep=3)
        thread.append(rec("inside"), epoch=e)
        assert thread.read_doc(SUMMARY) is not None  # its own write, seen inside the hold
        assert [r.content for r in thread.tail(1)] == ["inside"]
    assert [r.content for r in thread] == ["inside"]
    if tset.kind == "cluster":  # one transaction: an error inside undoes every write of the hold
        with pytest.raises(RuntimeError):
            with thread.guarded(e):
                thread.write_doc(SUMMARY, {"goal": "undone"}, e)
                thread.append(rec("undone"), epoch=e)
                raise RuntimeError("boom")
        assert msgspec.json.decode(thread.read_doc(SUMMARY)) == {"goal": "g"}
        assert [r.content for r in thread] == ["inside"]
        assert thread.append(rec("next"), epoch=e).seq == 2


def test_a_clear_waits_for_a_guarded_write_of_another_host(tset: ThreadSet) -> None:
    a, b = tset.store("a"), tset.store("b")
    thread = a.create("ws", "alice")
    e = thread.epoch
    cleared = threading.Event()
    other = b.get(thread.id, "alice", ["ws"])
    with thread.guarded(e):
        clearer = threading.Thread(target=lambda: (b.clear(other), cleared.set()))
        clearer.start()
        time.sleep(0.3)
        assert not cleared.is_set()  # the clear waits for the hold
        thread.write_doc(SUMMARY, {"goal": "g"}, e)
    clearer.join(10)
    assert cleared.is_set()
    assert thread.read_doc(SUMMARY) is None  # the write came first, the clear removed it


def test_summaries_are_rewritten_in_one_step(tset: ThreadSet) -> None:
    thread = tset.store().create("ws", "alice")
    e = thread.epoch
    thread.write_doc(SUMMARY, {"goal": "secret plan", "n": 1}, e)
    thread.append_line(SUMMARY_REVISIONS, b'{"goal": "secret plan"}', e, keep=5)
    thread.append_line(SUMMARY_REVISIONS, b'{"goal": "other"}', e, keep=5)
    thread.write_doc(TASK_STATE, {"items": ["keep"]}, e)

    def redact(v: Any) -> Any:
        if isinstance(v, str):
            return v.replace("secret plan", "[x]")
        return {k: (x.replace("secret plan", "[x]") if isinstance(x, str) else x) for k, x in v.items()}

    assert thread.rewrite_summaries(redact) == 2
    assert msgspec.json.decode(thread.read_doc(SUMMARY)) == {"goal": "[x]", "n": 1}
    assert [msgspec.json.decode(x)["goal"] for x in thread.lines(SUMMARY_REVISIONS)] == ["[x]", "other"]
    assert thread.rewrite_summaries(lambda v: v) == 0


# -- the stores built on the documents ----------------------------------------------------------


def test_summary_status_task_state_and_manifests_through_their_stores(tset: ThreadSet) -> None:
    from datadesk.context.manifest import ContextManifest, append_manifest

    store = tset.store()
    thread = store.create("ws", "alice")
    e = thread.epoch
    summaries = SummaryStore(revisions_kept=2)
    for covers in (3, 5, 7, 9):
        assert summaries.write(thread, summary(e, covers), e)
    assert not summaries.write(thread, summary(e, 4), e)  # older than the stored one
    assert summaries.load_current(thread, e).covers_through_seq == 9
    assert [s.covers_through_seq for s in summaries.revisions(thread)] == [5, 7]
    status = SummaryStatusStore()
    assert status.record(thread, e, "failed", 9, reason="model  down")
    assert status.load(thread, e).reason == "model down"
    tasks = TaskStateStore()
    item = tasks.note(thread, e, "use EUR", "constraint", "user", user_seq=1)
    assert [i.text for i in tasks.load(thread, e).constraints()] == ["use EUR"]
    tasks.withdraw(thread, e, item.id, "user")
    assert tasks.load(thread, e).constraints() == []
    fields = dict(ts=0.0, turn_id="u1", step=1, model="m", profile="p", rules_version="1", budget_tokens=1,
                  limit_tokens=1, level=0.1, water="ok", regions={}, first_seq=1, last_seq=1, included=[],
                  trimmed_through_seq=0, compacted=[], capped=[], images=[], tools=[], calibration=1.0,
                  estimated_tokens=1, estimated_raw_tokens=1, messages=1)
    assert append_manifest(thread, ContextManifest(**fields), e)
    assert append_manifest(thread, ContextManifest(**{**fields, "step": 2}), e)
    assert last_manifest(thread).step == 2
    store.clear(thread)
    assert summaries.load(thread) is None and status.load(thread, e) is None and last_manifest(thread) is None
    assert not summaries.write(thread, summary(e, 11), e)
    assert not status.record(thread, e, "ok", 11)
    with pytest.raises(TaskStateError, match="not changed"):
        tasks.note(thread, e, "late", "constraint", "user")


# -- the cluster set only: fences, meta, the cap across hosts, the indexer ------------------------


def _cluster_only(tset: ThreadSet) -> None:
    if tset.kind == "embedded":
        pytest.skip("the embedded set has one writer per thread through its file locks")


def _running_turn(db: Any, thread_id: str, fence: int) -> None:
    """A `turns` row (migration 0006, the turn directory's) of a turn running under `fence`."""
    with db.connection() as conn:
        conn.execute("INSERT INTO turns (thread_id, turn_id, user_id, owner, backend_pid, lock_key, fence, "
                     "lease_until, state) VALUES (%s, 'u1', 'alice', 'hostA:1', 1, 1, %s, now() + interval '10 s', "
                     "'running')", (thread_id, fence))


def test_an_append_carrying_a_lost_fence_is_refused(tset: ThreadSet) -> None:
    thread = tset.store().create("ws", "alice")
    if tset.kind == "embedded":
        assert thread.append(rec("fenced"), epoch=thread.epoch, fence=7).seq == 1  # ignored there
        return
    _running_turn(tset.db, thread.id, 7)
    assert thread.append(rec("mine"), epoch=thread.epoch, fence=7).seq == 1
    with tset.db.connection() as conn:  # another host takes the thread over: a new fence
        conn.execute("UPDATE turns SET turn_id = 'u2', fence = 8 WHERE thread_id = %s", (thread.id,))
    with pytest.raises(TurnFenced, match="fence 7"):
        thread.append(rec("zombie"), epoch=thread.epoch, fence=7)
    with pytest.raises(LogClosed):  # a TurnFenced is a LogClosed: callers that stop on one stop on both
        with thread.guarded(thread.epoch):
            thread.append(rec("zombie"), epoch=thread.epoch, fence=7)
    assert [r.content for r in thread] == ["mine"]
    assert thread.append(rec("new turn"), epoch=thread.epoch, fence=8).seq == 2


def test_a_stale_meta_cannot_put_an_old_epoch_back(tset: ThreadSet) -> None:
    _cluster_only(tset)
    store = tset.store()
    thread = store.create("ws", "alice")
    stale = thread.reload()
    store.clear(store.get(thread.id, "alice", ["ws"]))
    written = thread.write_meta(msgspec.structs.replace(stale, title="renamed"))
    assert (written.title, written.epoch) == ("renamed", 1)
    assert store.list("alice", ["ws"])[0].epoch == 1


def test_the_thread_limit_holds_across_hosts(tset: ThreadSet) -> None:
    _cluster_only(tset)
    hosts = [tset.store("a", 5), tset.store("b", 5)]
    made, refused = [], []

    def create(store: ThreadStore) -> None:
        try:
            made.append(store.create("ws", "alice"))
        except TooManyThreads:
            refused.append(1)

    workers = [threading.Thread(target=create, args=(hosts[i % 2],)) for i in range(12)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert (len(made), len(refused)) == (5, 7)


def test_the_indexer_hears_commits_and_resets_and_nul_is_kept_out_of_jsonb(tset: ThreadSet) -> None:
    _cluster_only(tset)
    heard: list[tuple[str, Any]] = []

    class Indexer:
        def indexed_append(self, thread: Any, record: Record) -> None:
            heard.append(("append", record.seq))

        def indexed_reset(self, thread: Any, drop: bool) -> None:
            heard.append(("reset", drop))

    store = tset.store()
    store.search = Indexer()
    thread = store.create("ws", "alice", "a\x00b")
    thread.append(rec("hello\x00world"), epoch=0)
    with pytest.raises(LogClosed):
        thread.append(rec("late"), epoch=5)
    assert thread.write_doc(SUMMARY, {"goal": "x\x00y"}, 0)
    assert msgspec.json.decode(thread.read_doc(SUMMARY)) == {"goal": "x\ufffdy"}
    assert thread.tail(1)[0].content == "hello\x00world"  # records keep their exact bytes
    store.clear(thread)
    store.delete(thread)
    assert heard == [("append", 1), ("reset", False), ("reset", True)]
    assert not thread.dir.joinpath("artifacts").exists()


def test_scratch_folders_are_per_host_and_cleared(tset: ThreadSet, tmp_path: Path) -> None:
    _cluster_only(tset)
    a, b = tset.store("a"), tset.store("b")
    thread = a.create("ws", "alice")
    assert thread.dir == tmp_path / "home-a" / "cache" / "threads" / "ws" / "alice" / thread.id
    thread.artifacts_dir.mkdir()
    (thread.artifacts_dir / "a1.json").write_text("{}")
    (thread.outputs_dir).mkdir()
    (thread.outputs_dir / "chart.png").write_bytes(b"x" * 10)
    on_b = b.get(thread.id, "alice", ["ws"])
    assert on_b.dir != thread.dir and not (on_b.artifacts_dir / "a1.json").exists()
    removed = a.clear(thread)
    assert removed["artifacts"] == 1 and removed["bytes"] >= 12
    assert not thread.artifacts_dir.exists() and not thread.outputs_dir.exists()


_DIES_HOLDING = r"""
import os, signal, sys, time
from pathlib import Path
from datadesk.domain.records import Record
from datadesk.store.layout import Layout
kind, where, tid = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "embedded":
    from datadesk.store.threads import ThreadStore
    store = ThreadStore(Layout(Path(where)))
else:
    from datadesk.cluster.database import Database
    from datadesk.cluster.threads import PgThreadStore
    store = PgThreadStore(Database(where), Layout(Path(sys.argv[4])))
thread = store.get(tid, "alice", ["ws"])
with thread.guarded(0):
    thread.append(lambda seq: Record(seq=seq, role="user", ts=time.time(), content="dying"), epoch=0)
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_host_killed_while_holding_a_thread_leaves_it_writable(tset: ThreadSet, tmp_path: Path) -> None:
    """SIGKILL inside a hold: the OS (a flock) or the server (the connection) lets go at once; the
    cluster set loses the uncommitted append, and seqs go on contiguous either way."""
    import subprocess
    import sys

    store = tset.store("a")
    thread = store.create("ws", "alice")
    thread.append(rec("kept"), epoch=0)
    if tset.kind == "embedded":
        args = ["embedded", str(tmp_path / "home"), thread.id]
    else:
        args = ["cluster", tset.db.url, thread.id, str(tmp_path / "home-dying")]
    proc = subprocess.run([sys.executable, "-c", _DIES_HOLDING, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9 and "holding" in proc.stdout, proc.stderr
    started = time.monotonic()
    made = thread.append(rec("after"), epoch=0)
    assert time.monotonic() - started < 5
    contents = [r.content for r in thread]
    if tset.kind == "cluster":
        assert contents == ["kept", "after"] and made.seq == 2  # the dead host's append was never committed
    else:
        assert contents == ["kept", "dying", "after"] and made.seq == 3  # a file append is not undone
    assert [r.seq for r in thread] == list(range(1, made.seq + 1))
