"""`Shares` conformance: the storage of shares on both sets (files; PostgreSQL): add and get
within the reader's workspaces only, the owner's list newest first (of one thread), revoke kept
once and only by the owner, a clashing id refused, and two hosts seeing one another's changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from datadesk.domain.ids import InvalidId
from datadesk.domain.shares import Share, new_share_id
from datadesk.store.interfaces.shares import Shares, ShareStoreError
from datadesk.store.layout import Layout
from datadesk.store.shares import FileShares
from tests.cluster import sets

pytestmark = pytest.mark.cluster


class Hosts(sets.Hosts):
    """Makes `Shares` of one set; `shares(new_host=True)` is another host (cluster: its own pool)."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        super().__init__(kind, request, tmp_path)
        self.layout = Layout(tmp_path / "var")

    def shares(self, new_host: bool = False) -> Shares:
        if self.kind == "embedded":
            return FileShares(self.layout)
        from datadesk.cluster.shares import build_shares

        return build_shares(self.database("host-b", max_size=2) if new_host else self.db)


hosts = sets.hosts_fixture(Hosts)


def share(ws: str = "demo", owner: str = "alice", thread: str = "t1", created: float = 100.0) -> Share:
    return Share(id=new_share_id(), workspace=ws, owner=owner, thread=thread, created=created, title="Readings")


def test_add_get_within_the_readers_workspaces(hosts) -> None:
    store = hosts.shares()
    assert isinstance(store, Shares)
    s = share()
    store.add(s)
    assert store.get(s.id, ["demo"]) == s
    assert store.get(s.id, ["sales", "demo"]) == s
    assert store.get(s.id, ["sales"]) is None  # another workspace's share: not found at all
    assert store.get(s.id, []) is None
    assert store.get(new_share_id(), ["demo"]) is None
    with pytest.raises(InvalidId, match="share"):
        store.get("../x", ["demo"])
    with pytest.raises(ShareStoreError, match="exists already"):
        store.add(s)


def test_owner_list_and_revoke(hosts) -> None:
    store = hosts.shares()
    a, b, c = share(created=1.0), share(thread="t2", created=2.0), share(ws="sales", created=3.0)
    other = share(owner="bob", created=4.0)
    for s in (a, b, c, other):
        store.add(s)
    assert [s.id for s in store.of_owner("alice", ["demo", "sales"])] == [c.id, b.id, a.id]
    assert [s.id for s in store.of_owner("alice", ["demo"])] == [b.id, a.id]
    assert [s.id for s in store.of_owner("alice", ["demo"], thread="t1")] == [a.id]
    assert store.revoke(a.id, "bob", 50.0) is None  # only the owner revokes
    first = store.revoke(a.id, "alice", 50.0)
    assert first is not None and first.revoked == 50.0 and not first.active
    assert store.revoke(a.id, "alice", 60.0).revoked == 50.0  # revoking twice keeps the first time
    assert store.get(a.id, ["demo"]).revoked == 50.0  # kept, marked: the caller refuses it
    assert store.revoke(new_share_id(), "alice", 1.0) is None


def test_two_hosts_see_each_others_changes(hosts) -> None:
    one, two = hosts.shares(), hosts.shares(new_host=True)
    s = share()
    one.add(s)
    assert two.get(s.id, ["demo"]) == s
    two.revoke(s.id, "alice", 7.0)
    assert one.get(s.id, ["demo"]).revoked == 7.0
    assert [x.id for x in one.of_owner("alice", ["demo"])] == [s.id]


def test_migrate_copies_the_homes_shares(tmp_path, cluster_db) -> None:
    """`datadesk migrate` (migration/shares.py): the home's shares into the table, once; a rerun
    writes nothing; a revoke in the home is carried over while the home is the truth."""
    from datadesk.cluster.migration.report import Report
    from datadesk.cluster.migration.shares import copy_shares
    from datadesk.cluster.shares import PgShares

    layout = Layout(tmp_path / "var")
    files = FileShares(layout)
    a, b = share(), share(ws="sales", created=2.0)
    files.add(a)
    files.add(b)
    (layout.workspace_dir("demo") / "shares" / f"{new_share_id()}.json").write_text("{not json")
    report = Report(home=str(layout.home), database="test", storage="none")
    copy_shares(layout, cluster_db, report, fill=False)
    rows = PgShares(cluster_db)
    assert rows.get(a.id, ["demo"]) == a and rows.get(b.id, ["sales"]) == b
    assert report.counts["shares"] == 2 and report.written["shares"] == 2
    assert any("unreadable" in n for n in report.notes)
    files.revoke(a.id, "alice", 9.0)
    again = Report(home=str(layout.home), database="test", storage="none")
    copy_shares(layout, cluster_db, again, fill=False)
    assert again.written["shares"] == 1 and rows.get(a.id, ["demo"]).revoked == 9.0
    third = Report(home=str(layout.home), database="test", storage="none")
    copy_shares(layout, cluster_db, third, fill=True)
    assert third.written["shares"] == 0 and third.kept == []
