"""`MemoryDocs` conformance: every rule of `MemoryStore` on both storages (files; PostgreSQL),
the audit, an update that raises storing nothing, two stores (two hosts) writing one user's
memory at once without a lost update, and isolation between users and workspaces."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest

from datadesk.domain.memory import Provenance, text_hash
from datadesk.memory.store import (
    DuplicateFact,
    FactNotFound,
    FactStateError,
    FileMemoryDocs,
    MemoryInputError,
    MemoryStore,
)
from datadesk.settings import MemorySettings
from datadesk.store.interfaces.memory import AuditEvent, MemoryDocs, MemoryStoreError
from datadesk.store.layout import Layout
from tests.cluster import sets
from tests.unit.test_memory import DAY, UID, WS, Clock  # the unit rules' user, day and clock

pytestmark = pytest.mark.cluster


class Hosts(sets.Hosts):
    """Makes `MemoryStore`s of one storage set; each `store()` is another host (cluster: its own pool)."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        super().__init__(kind, request, tmp_path)
        self.home = tmp_path / "var"
        self.layout = Layout(self.home)

    def docs(self, new_host: bool = False) -> MemoryDocs:
        if self.kind == "embedded":
            return FileMemoryDocs(self.layout)
        from datadesk.cluster.memory import build_memory_docs

        return build_memory_docs(self.database("host-b", max_size=6) if new_host else self.db)

    def store(self, settings: MemorySettings | None = None, clock=None, new_host: bool = False,
              threads=None) -> MemoryStore:
        kw = {"clock": clock} if clock is not None else {}
        return MemoryStore(self.layout, settings or MemorySettings(), docs=self.docs(new_host), threads=threads, **kw)

    def corrupt(self, ws: str, uid: str) -> None:
        """Make the stored document unreadable (a wrong type in it)."""
        if self.kind == "embedded":
            path = self.layout.user_dir(ws, uid) / "memory.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('{"facts": 5}')
            return
        with self.db.connection() as conn:
            conn.execute("INSERT INTO memory_docs (workspace, user_id, doc) VALUES (%s, %s, '{\"facts\": 5}')"
                         " ON CONFLICT (workspace, user_id) DO UPDATE SET doc = excluded.doc", (ws, uid))

    def stored_text(self, ws: str, uid: str) -> str:
        """Everything stored for the user (document and audit), as text."""
        if self.kind == "embedded":
            udir = self.layout.user_dir(ws, uid)
            return "".join(p.read_text() for p in (udir / "memory.json", udir / "memory.audit.jsonl") if p.exists())
        with self.db.connection() as conn:
            doc = conn.execute("SELECT coalesce(string_agg(doc::text, ''), '') AS t FROM memory_docs"
                               " WHERE workspace = %s AND user_id = %s", (ws, uid)).fetchone()["t"]
            audit = conn.execute("SELECT coalesce(string_agg(a::text, ''), '') AS t FROM memory_audit a"
                                 " WHERE workspace = %s AND user_id = %s", (ws, uid)).fetchone()["t"]
        return doc + audit


hosts = sets.hosts_fixture(Hosts)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(hosts: Hosts, clock: Clock) -> MemoryStore:
    return hosts.store(clock=clock)


def events(store: MemoryStore, ws: str = WS, uid: str = UID) -> list[AuditEvent]:
    return store.audit(ws, uid)


# -- the protocol itself -------------------------------------------------------------------
def test_read_of_an_unknown_user_is_empty_and_stores_nothing(hosts: Hosts) -> None:
    docs = hosts.docs()
    doc = docs.read(WS, "nobody")
    assert doc.facts == [] and doc.enabled and doc.deleted == []
    assert docs.audit(WS, "nobody") == []
    assert hosts.stored_text(WS, "nobody") == ""


def test_update_stores_the_doc_and_its_events_together(hosts: Hosts) -> None:
    docs = hosts.docs()
    with docs.update(WS, UID) as (doc, evs):
        doc.enabled = False
        evs.append(AuditEvent(ts=1.0, event="created", fact="f1", status="active", kind="fact", source="user"))
        evs.append(AuditEvent(ts=2.0, event="deleted", fact="f1", reason="history limit"))
    assert docs.read(WS, UID).enabled is False
    assert docs.audit(WS, UID) == [
        AuditEvent(ts=1.0, event="created", fact="f1", status="active", kind="fact", source="user"),
        AuditEvent(ts=2.0, event="deleted", fact="f1", reason="history limit")]


def test_an_update_that_raises_stores_nothing(hosts: Hosts) -> None:
    docs = hosts.docs()
    with pytest.raises(RuntimeError, match="boom"):
        with docs.update(WS, UID) as (doc, evs):
            doc.enabled = False
            evs.append(AuditEvent(ts=1.0, event="created", fact="f1"))
            raise RuntimeError("boom")
    assert docs.read(WS, UID).enabled is True and docs.audit(WS, UID) == []


def test_an_unreadable_document_is_a_clear_error(hosts: Hosts) -> None:
    hosts.corrupt(WS, UID)
    store = hosts.store()
    with pytest.raises(MemoryStoreError, match="unreadable"):
        store.facts(WS, UID)
    with pytest.raises(MemoryStoreError):
        store.remember(WS, UID, "Reports in English")


# -- the rules, through MemoryStore -----------------------------------------------------------
def test_remember_and_read_back_from_another_host(hosts: Hosts, store: MemoryStore, clock: Clock) -> None:
    f = store.remember(WS, UID, "Reports in English", kind="preference", importance=4,
                       provenance=Provenance(user_seq=7, thread="t1"))
    assert f.status == "active" and f.created == f.confirmed == clock.t
    other = hosts.store(new_host=True)
    got = other.get(WS, UID, f.id)
    assert got.text == "Reports in English" and got.provenance.user_seq == 7 and got.kind == "preference"
    assert other.block(WS, UID) == f"- [{f.id}] (preference) Reports in English"


def test_duplicates_secrets_and_bad_fields_are_refused(store: MemoryStore) -> None:
    f = store.remember(WS, UID, "Reports in English")
    with pytest.raises(DuplicateFact, match=f.id):
        store.remember(WS, UID, "  reports IN english. ")
    with pytest.raises(MemoryInputError, match="secrets"):
        store.remember(WS, UID, "my key is AKIAIOSFODNN7EXAMPLE")
    with pytest.raises(MemoryInputError, match="importance"):
        store.remember(WS, UID, "Another fact", importance=9)
    assert [x.id for x in store.facts(WS, UID)] == [f.id]
    assert [e.event for e in events(store)] == ["created"]  # refused writes leave no audit


def test_candidate_confirm_and_conflict_resolve(store: MemoryStore) -> None:
    cand = store.remember(WS, UID, "Meters report hourly", provenance=Provenance(after_tool_output=True))
    assert cand.status == "candidate"
    assert store.active(WS, UID) == []
    assert store.confirm(WS, UID, cand.id).status == "active"
    old = store.remember(WS, UID, "Reports are in English")
    new = store.remember(WS, UID, "Reports are in Chinese")
    assert new.status == "conflict" and new.conflicts_with == old.id
    with pytest.raises(FactStateError, match="conflict"):
        store.confirm(WS, UID, new.id)
    store.resolve(WS, UID, new.id, "new")
    st = {f.id: f.status for f in store.facts(WS, UID)}
    assert st[new.id] == "active" and st[old.id] == "superseded"
    assert [e.event for e in events(store)] == ["created", "confirmed", "created", "created", "resolved",
                                                "superseded"]


def test_forget_edit_and_state_errors(store: MemoryStore) -> None:
    f = store.remember(WS, UID, "Project Zephyr is led by Ines")
    assert store.edit(WS, UID, f.id, "Project Zephyr is led by Ines Duval").text.endswith("Duval")
    assert store.forget(WS, UID, f.id, "left").status == "forgotten"
    assert store.active(WS, UID) == []
    with pytest.raises(FactStateError):
        store.edit(WS, UID, f.id, "Project Zephyr is led by Bob")
    with pytest.raises(FactNotFound):
        store.forget(WS, UID, "f-nope")
    assert [e.event for e in events(store)] == ["created", "edited", "forgotten"]


def test_hard_delete_leaves_only_ids_and_the_hash(hosts: Hosts, store: MemoryStore) -> None:
    old = store.remember(WS, UID, "Reports are in English")
    new = store.remember(WS, UID, "Reports are in Chinese")
    store.resolve(WS, UID, new.id, "new")
    keep = store.remember(WS, UID, "Energy is in kWh")
    assert sorted(store.delete(WS, UID, new.id)) == sorted([new.id, old.id])
    assert [f.id for f in store.facts(WS, UID)] == [keep.id]
    raw = hosts.stored_text(WS, UID)
    assert "Chinese" not in raw and "English" not in raw and text_hash("Reports are in Chinese") in raw
    assert sorted(e.fact for e in events(store) if e.event == "deleted") == sorted([new.id, old.id])
    with pytest.raises(MemoryInputError, match="deleted this fact"):
        store.remember(WS, UID, "Reports are in Chinese")
    assert store.remember(WS, UID, "Reports are in Chinese", source="panel").status == "active"
    assert store.delete_all(WS, UID) and store.facts(WS, UID) == []


def test_hard_delete_redacts_summaries_through_the_thread_store(hosts: Hosts) -> None:
    class FakeThread:
        def __init__(self) -> None:
            self.summary = {"goal": "Reports are in Chinese, always"}

        def rewrite_summaries(self, transform) -> int:
            new = transform(self.summary)
            changed = new != self.summary
            self.summary = new
            return int(changed)

    class FakeThreads:
        def __init__(self) -> None:
            self.threads = {("demo", UID): [FakeThread()], ("sales", UID): [FakeThread()]}

        def folders(self, ws: str, uid: str):
            return iter(self.threads.get((ws, uid), []))

    fake = FakeThreads()
    store = hosts.store(threads=fake)
    f = store.remember(WS, UID, "Reports are in Chinese")
    store.delete(WS, UID, f.id)
    assert fake.threads[("demo", UID)][0].summary == {"goal": "[deleted memory] always"}
    assert "Chinese" in fake.threads[("sales", UID)][0].summary["goal"]  # another workspace


def test_hard_delete_redacts_the_sets_own_thread_summaries(hosts: Hosts) -> None:
    """Through the set's real thread store: its summary, revisions and task state documents."""
    if hosts.kind == "embedded":
        from datadesk.store.threads import ThreadStore

        threads = ThreadStore(hosts.layout)
    else:
        from datadesk.cluster.threads import PgThreadStore

        threads = PgThreadStore(hosts.db, hosts.layout)
    mine, other = threads.create(WS, UID, "Mine"), threads.create("sales", UID, "Other")
    for t in (mine, other):
        assert t.write_doc("summary", {"goal": "Reports are in Chinese", "n": 3}, t.epoch)
        assert t.append_line("summary.revisions", b'{"goal": "reports are in  chinese."}', t.epoch, keep=5)
    store = hosts.store(threads=threads)
    f = store.remember(WS, UID, "Reports are in Chinese")
    store.delete(WS, UID, f.id)
    assert msgspec.json.decode(mine.read_doc("summary")) == {"goal": "[deleted memory]", "n": 3}
    assert [msgspec.json.decode(x) for x in mine.lines("summary.revisions")] == [{"goal": "[deleted memory]"}]
    assert b"Chinese" in other.read_doc("summary")  # another workspace: untouched


def test_caps_supersede_the_lowest_score_and_bound_history(hosts: Hosts, clock: Clock) -> None:
    store = hosts.store(MemorySettings(max_active=2, max_inactive=2), clock=clock)
    a = store.remember(WS, UID, "Fact alpha about meters", importance=5)
    clock.t += 90 * DAY
    store.remember(WS, UID, "Fact beta about sites", importance=2)
    store.remember(WS, UID, "Fact gamma about tariffs", importance=3)
    st = {f.id: (f.status, f.reason) for f in store.facts(WS, UID)}
    assert st[a.id] == ("superseded", "capacity")
    for i in range(3):
        clock.t += 1
        store.forget(WS, UID, store.remember(WS, UID, f"Old fact number {i}").id)
    inactive = [f for f in store.facts(WS, UID) if f.status != "active"]
    assert len(inactive) == 2
    dropped = {e.fact for e in events(store) if e.reason == "history limit"}
    assert dropped and a.id in dropped  # the oldest history went first
    assert not dropped & {f.id for f in store.facts(WS, UID)}
    assert any(e.event == "superseded" and e.reason == "capacity" for e in events(store))


def test_user_switch_and_isolation(hosts: Hosts, store: MemoryStore) -> None:
    store.remember("demo", "dana", "Reports in English")
    store.set_user_enabled("demo", "dana", False)
    other = hosts.store(new_host=True)
    assert other.user_enabled("demo", "dana") is False
    assert other.facts("demo", "erin") == [] and other.facts("sales", "dana") == []
    assert other.user_enabled("sales", "dana") is True
    other.remember("sales", "dana", "Reports in English")  # another user's memory: no duplicate
    assert other.audit("demo", "erin") == [] and len(other.audit("sales", "dana")) == 1


# -- two hosts at once ------------------------------------------------------------------------
def test_two_hosts_writing_one_users_memory_lose_nothing(hosts: Hosts) -> None:
    settings = MemorySettings(max_active=1000, max_total_chars=1_000_000)
    stores = [hosts.store(settings), hosts.store(settings, new_host=True)]
    per_writer, writers = 15, 4
    errors: list[BaseException] = []

    def write(w: int) -> None:
        store = stores[w % 2]
        try:
            for i in range(per_writer):
                store.remember(WS, UID, f"writer {w} fact number {i}", source="panel")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    facts = stores[1].facts(WS, UID)
    assert len(facts) == per_writer * writers == len({f.text for f in facts})
    created = [e for e in stores[0].audit(WS, UID) if e.event == "created"]
    assert len(created) == per_writer * writers and {e.fact for e in created} == {f.id for f in facts}


def test_concurrent_first_writes_share_one_document(hosts: Hosts) -> None:
    """Two hosts making a user's very first fact at once: both land in the one document."""
    stores = [hosts.store(), hosts.store(new_host=True)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def first(i: int) -> None:
        barrier.wait()
        try:
            stores[i].remember(WS, "fresh", f"First fact from host {i} about meters")
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=first, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(stores[0].facts(WS, "fresh")) == 2


def test_the_stored_document_is_a_memory_doc(hosts: Hosts, store: MemoryStore) -> None:
    """The cluster row holds the same JSON document as `memory.json` (the migration copies it)."""
    f = store.remember(WS, UID, "Reports in English")
    doc = hosts.docs().read(WS, UID)
    assert msgspec.json.decode(msgspec.json.encode(doc))["facts"][0]["id"] == f.id


def test_a_lost_database_connection_is_a_clear_error_then_recovers(hosts: Hosts) -> None:
    if hosts.kind == "embedded":
        pytest.skip("the files have no connection to lose")
    from datadesk.cluster.database import Database, DatabaseError
    from datadesk.cluster.memory import build_memory_docs

    db = Database(hosts.url, min_size=1, max_size=1, name="doomed")
    try:
        store = MemoryStore(hosts.layout, docs=build_memory_docs(db))
        store.remember(WS, UID, "Reports in English")
        with hosts.db.connection() as conn:  # the server drops that host's session
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'doomed'")
        with pytest.raises(DatabaseError, match="memory could not reach the cluster database") as info:
            store.facts(WS, UID)
        assert "pw-" not in str(info.value)  # never the password
        assert [f.text for f in store.facts(WS, UID)] == ["Reports in English"]  # a fresh connection
    finally:
        db.close()
