"""`Artifacts` conformance: the embedded store (metadata files, SQLite ledger) and the cluster
store (rows in PostgreSQL, data in SeaweedFS), one suite; then what only the cluster set has
(two hosts with their own homes and caches, a host's home deleted, the store down)."""

from __future__ import annotations

import hashlib
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import msgspec
import pytest

from datadesk.cluster.objects.artifacts import PgArtifactStore
from datadesk.cluster.objects.blobs import S3Blobs
from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.offload.artifacts.quota import ArtifactQuota
from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id, regular_file
from datadesk.settings import OffloadSettings
from datadesk.store.interfaces.artifacts import ArtifactNotFound, Artifacts
from datadesk.store.interfaces.blobs import BlobUnavailable, thread_prefix
from datadesk.store.interfaces.threads import LogClosed
from datadesk.store.layout import Layout
from datadesk.store.threads import Thread, ThreadStore

pytestmark = pytest.mark.cluster

WS, USER = "demo", "ann"


@dataclass
class Host:
    """One app host: its own home (threads' folders, blob cache) and artifact store."""

    layout: Layout
    store: Any
    threads: ThreadStore


@dataclass
class World:
    kind: str
    make_host: Callable[[str], Host]
    db: Any = None

    def thread(self, host: Host, owner: str = USER) -> Thread:
        thread = host.threads.create(WS, owner)
        if self.db is not None:  # the cluster's thread row (what the epoch check reads)
            with self.db.connection() as conn:
                conn.execute("INSERT INTO threads (id, workspace, owner, epoch, meta, created, updated) "
                             "VALUES (%s, %s, %s, 0, '{}', 0, 0)", (thread.id, WS, owner))
        return thread

    def clear(self, host: Host, thread: Thread) -> None:
        host.threads.clear(thread)
        if self.db is not None:
            with self.db.connection() as conn:
                conn.execute("UPDATE threads SET epoch = epoch + 1 WHERE id = %s", (thread.id,))
        host.store.forget_thread(thread)


def s3_blobs(s3, cache: Path, endpoint: str | None = None) -> S3Blobs:
    return S3Blobs(s3.url, endpoint or s3.endpoint, cache, 64 << 20, region=s3.region,
                   access_key=s3.access_key, secret_key=s3.secret_key)


@pytest.fixture(params=["embedded", "cluster"])
def world(request, tmp_path) -> World:
    if request.param == "embedded":
        def embedded(name: str) -> Host:
            layout = Layout(tmp_path / "home")  # one home: the embedded set has one host
            return Host(layout, ArtifactStore(layout), ThreadStore(layout))

        return World("embedded", embedded)
    db = request.getfixturevalue("cluster_db")
    s3 = request.getfixturevalue("s3")

    def cluster(name: str) -> Host:
        layout = Layout(tmp_path / f"home-{name}")
        return Host(layout, PgArtifactStore(db, s3_blobs(s3, layout.home / "cache" / "blobs"), layout),
                    ThreadStore(layout))

    return World("cluster", cluster, db)


def origin(thread: Thread, owner: str = USER) -> ArtifactOrigin:
    return ArtifactOrigin(source="tool", user=owner, thread=thread.id, workspace=WS, tool="sql", arguments="{}")


def write_result(store: Any, thread: Thread, data: bytes, epoch: int | None = None, kind: str = "result",
                 used: float | None = None, aid: str | None = None, existing: Artifact | None = None) -> Artifact:
    """What the pipeline does: the data file into the thread's artifacts folder, then `save`."""
    aid = aid or new_artifact_id()
    thread.artifacts_dir.mkdir(parents=True, exist_ok=True)
    (thread.artifacts_dir / f"{aid}.txt").write_bytes(data)
    now = time.time()
    art = Artifact(id=aid, kind=kind, format="text", file=f"{aid}.txt", origin=origin(thread),
                   created=existing.created if existing else (used or now), last_used=used or now,
                   bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                   requeried_at=now if existing else None)
    store.save(thread, art, epoch)
    return art


def read(store: Any, thread: Thread, art: Artifact) -> bytes:
    path = store.data_path(thread, art)
    assert regular_file(path), path
    return path.read_bytes()


def test_save_load_list_find(world: World) -> None:
    host = world.make_host("a")
    assert isinstance(host.store, Artifacts)
    thread = world.thread(host)
    first = write_result(host.store, thread, b"rows,1\n")
    chart = host.store.save_bytes(thread, b"\x89PNG....", "png", "deliverable", "image/png", origin(thread))
    assert host.store.load(thread, first.id) == first
    assert [a.id for a in host.store.list(thread)] == [first.id, chart.id]
    assert read(host.store, thread, first) == b"rows,1\n"
    assert read(host.store, thread, chart) == b"\x89PNG...."
    found_thread, found = host.store.find(chart.id, USER, [WS])
    assert found == chart and found_thread.id == thread.id
    with pytest.raises(ArtifactNotFound):
        host.store.find(chart.id, "bob", [WS])  # another user's artifact is not found
    with pytest.raises(ArtifactNotFound):
        host.store.find(chart.id, USER, ["other"])
    with pytest.raises(ArtifactNotFound):
        host.store.load(thread, "a-missing")
    assert {(ws, u, a.id) for ws, u, _, a in host.store.walk()} == {(WS, USER, first.id), (WS, USER, chart.id)}


def test_touch_expire_discard(world: World) -> None:
    host = world.make_host("a")
    thread = world.thread(host)
    art = write_result(host.store, thread, b"x" * 100, used=time.time() - 100)
    other = write_result(host.store, thread, b"y" * 100)
    host.store.touch(thread, [art.id])
    assert host.store.load(thread, art.id).last_used > time.time() - 50
    gone = host.store.expire(thread, art.id)
    assert gone is not None and gone.status == "expired" and gone.expired_at
    tomb = host.store.load(thread, art.id)  # the tombstone stays
    assert tomb.status == "expired" and not tomb.available
    assert not regular_file(host.store.data_path(thread, tomb))
    assert host.store.expire(thread, "a-missing") is None
    host.store.discard(thread, other)
    with pytest.raises(ArtifactNotFound):
        host.store.load(thread, other.id)
    assert [a.id for a in host.store.list(thread)] == [art.id]


def test_a_write_from_before_a_clear_is_refused(world: World) -> None:
    host = world.make_host("a")
    thread = world.thread(host)
    epoch = thread.epoch
    kept = write_result(host.store, thread, b"before", epoch=epoch)
    world.clear(host, thread)
    assert host.store.list(thread) == []
    with pytest.raises(ArtifactNotFound):
        host.store.load(thread, kept.id)
    with pytest.raises(LogClosed):
        write_result(host.store, thread, b"late", epoch=epoch, aid="a-late")
    with pytest.raises(ArtifactNotFound):
        host.store.load(thread, "a-late")
    assert not (thread.artifacts_dir / "a-late.txt").exists()


def test_new_data_under_the_same_id_is_read_everywhere(world: World) -> None:
    a, b = world.make_host("a"), world.make_host("b")
    thread = world.thread(a)
    art = write_result(a.store, thread, b"version 1")
    b_thread, _ = b.store.find(art.id, USER, [WS])
    assert read(b.store, b_thread, b.store.load(b_thread, art.id)) == b"version 1"  # b caches it
    a.store.expire(thread, art.id)
    restored = write_result(a.store, thread, b"version 2!", aid=art.id, existing=art)
    assert restored.file == art.file  # the same sandbox path
    assert read(b.store, b_thread, b.store.load(b_thread, art.id)) == b"version 2!"


def test_quota_totals_and_eviction(world: World) -> None:
    host = world.make_host("a")
    thread = world.thread(host)
    quota = ArtifactQuota(OffloadSettings(thread_max_count=2, deliverable_user_max_bytes=1000), host.store)
    quota.start()
    now = time.time()
    arts = [write_result(host.store, thread, bytes([n]) * 50, used=now - 100 + n) for n in range(3)]
    evicted = quota.after_create(arts[-1])
    assert [e.artifact for e in evicted] == [arts[0].id]
    assert host.store.load(thread, arts[0].id).status == "expired"
    assert [host.store.load(thread, a.id).status for a in arts[1:]] == ["ready", "ready"]
    totals, _ = host.store.ledger.read([f"t:{WS}/{USER}/{thread.id}", f"u:{USER}", "*"])
    assert totals[f"t:{WS}/{USER}/{thread.id}"].count == 2
    assert totals[f"u:{USER}"].bytes == 100
    host.store.save_bytes(thread, b"d" * 600, "png", "deliverable", "image/png", origin(thread))
    assert quota.deliverable_bytes(USER) == 600
    with pytest.raises(Exception, match="saved outputs"):
        quota.check_deliverable(USER, 500)
    assert quota.sweep_round(0.0) is not None  # one sweep (the lock and its marker)
    assert quota.enforce(wait=True) == []


def test_kernel_files_are_the_available_data(world: World) -> None:
    host = world.make_host("a")
    thread = world.thread(host)
    keep = write_result(host.store, thread, b"keep")
    gone = write_result(host.store, thread, b"gone")
    host.store.expire(thread, gone.id)
    folder = host.store.kernel_files(thread)
    assert (folder / keep.file).read_bytes() == b"keep"
    assert not (folder / gone.file).exists()


# -- the cluster set only ---------------------------------------------------------------------
def cluster_only(world: World) -> None:
    if world.kind != "cluster":
        pytest.skip("two hosts, a store to lose: the cluster set")


def test_saved_on_one_host_read_on_another_after_its_home_is_deleted(world: World) -> None:
    cluster_only(world)
    a, b = world.make_host("a"), world.make_host("b")
    thread = world.thread(a)
    art = write_result(a.store, thread, b"id,v\n1,2\n" * 1000)
    upload = a.store.save_bytes(thread, b"\xff\xd8jpeg", "jpg", "upload", "image/jpeg", origin(thread))
    assert not (thread.artifacts_dir / art.file).exists()  # uploaded: only the cache keeps a copy
    shutil.rmtree(a.layout.home)
    b_thread, found = b.store.find(art.id, USER, [WS])
    assert found == art
    assert read(b.store, b_thread, found) == b"id,v\n1,2\n" * 1000
    assert b.store.data_path(b_thread, found).is_relative_to(b.layout.home)
    assert read(b.store, b_thread, b.store.load(b_thread, upload.id)) == b"\xff\xd8jpeg"
    assert (b.store.kernel_files(b_thread) / art.file).read_bytes() == b"id,v\n1,2\n" * 1000
    # the quota of host b counts what host a wrote
    totals, _ = b.store.ledger.read([f"u:{USER}"])
    assert totals[f"u:{USER}"].count == 2


def test_clear_removes_rows_and_objects(world: World) -> None:
    cluster_only(world)
    a = world.make_host("a")
    thread = world.thread(a)
    write_result(a.store, thread, b"one")
    a.store.save_bytes(thread, b"two", "png", "deliverable", "image/png", origin(thread))
    prefix = thread_prefix(WS, USER, thread.id)
    assert len(list(a.store.blobs.list(prefix))) == 2
    world.clear(a, thread)
    assert list(a.store.blobs.list(prefix)) == [] and a.store.list(thread) == []


def test_two_hosts_evict_once_for_one_overflow(world: World) -> None:
    cluster_only(world)
    a, b = world.make_host("a"), world.make_host("b")
    thread = world.thread(a)
    now = time.time()
    arts = [write_result(a.store, thread, bytes([n]) * 10, used=now - 100 + n) for n in range(4)]
    settings = OffloadSettings(thread_max_count=3)
    qa, qb = ArtifactQuota(settings, a.store), ArtifactQuota(settings, b.store)
    with ThreadPoolExecutor(2) as pool:  # at once: the quota transaction is one at a time cluster-wide
        evicted = [e for f in [pool.submit(q.after_create, arts[-1]) for q in (qa, qb)] for e in f.result()]
    assert [e.artifact for e in evicted] == [arts[0].id]
    statuses = [a.store.load(thread, x.id).status for x in arts]
    assert statuses == ["expired", "ready", "ready", "ready"]


def test_the_store_down_is_named_and_nothing_is_published(world: World, tmp_path: Path) -> None:
    cluster_only(world)
    a = world.make_host("a")
    thread = world.thread(a)
    art = write_result(a.store, thread, b"cached elsewhere")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down_layout = Layout(tmp_path / "home-down")
    blobs = a.store.blobs
    down = PgArtifactStore(world.db, S3Blobs(f"s3://{blobs.bucket}/{blobs.prefix}", f"http://127.0.0.1:{port}",
                                             down_layout.home / "cache", 1 << 20, access_key="k", secret_key="s"),
                           down_layout)
    d_thread, found = down.find(art.id, USER, [WS])
    with pytest.raises(BlobUnavailable, match=f"127.0.0.1:{port}"):
        down.data_path(d_thread, found)
    new = down_layout.thread_dir(WS, USER, thread.id)
    with pytest.raises(BlobUnavailable, match="unreachable"):
        write_result(down, Thread(new), b"never published", aid="a-never")
    with pytest.raises(ArtifactNotFound):
        a.store.load(thread, "a-never")  # no row says it is available


def test_metadata_is_the_embedded_json(world: World) -> None:
    cluster_only(world)
    a = world.make_host("a")
    thread = world.thread(a)
    art = write_result(a.store, thread, b"x")
    with world.db.connection() as conn:
        row = conn.execute("SELECT meta::text AS meta, live, bytes, status FROM artifacts WHERE id = %s",
                           (art.id,)).fetchone()
    assert msgspec.json.decode(row["meta"], type=Artifact) == art
    assert row["live"] and row["bytes"] == 1 and row["status"] == "ready"
