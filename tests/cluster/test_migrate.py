"""`datadesk migrate` (issue 28 item 4): a file home of 52 threads and 200+ artifacts, built through
the embedded stores (a torn last line, a cleared thread, tombstones, an upload's kept original,
outputs, memory, summaries, sessions), copied into PostgreSQL and SeaweedFS; verified clean; run
again (nothing written); corrupted (a record, an object, a row) and the difference reported;
repaired; refused while a worker or a turn holds the home; and the copy served by the cluster
stores and by a cluster-mode server with an empty home of its own."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.cluster.objects.artifacts import PgArtifactStore
from datadesk.cluster.objects.blobs import S3Blobs
from datadesk.cluster.migration.copy import MIGRATED_FILE, HomeInUse, migrate_home
from datadesk.cluster.search import PgSearch
from datadesk.cluster.threads import PgThreadStore
from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.records import Record
from datadesk.memory.store import MemoryStore
from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id
from datadesk.sandbox.ownership import Heartbeat
from datadesk.settings import SettingsError, load_settings
from datadesk.store.interfaces.blobs import artifact_key
from datadesk.store.interfaces.threads import MANIFESTS, SUMMARY, SUMMARY_REVISIONS, SUMMARY_STATUS, TASK_STATE
from datadesk.store.files import write_atomic
from datadesk.store.layout import Layout
from datadesk.store.threads import Thread, ThreadStore
from datadesk.store.users import UserStore

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
THREADS = 52
PARQUET = "application/vnd.apache.parquet"


@dataclass
class Home:
    layout: Layout
    tokens: dict[str, str]
    threads: list[tuple[str, str, str]] = field(default_factory=list)  # (ws, owner, tid)
    torn: str = ""  # the thread whose log ends in a torn line
    cleared: str = ""
    outputs: str = ""
    upload: tuple[str, str] = ("", "")  # (tid, aid) of an upload with a kept original
    invitation: str = ""  # the code of an invitation still open when the home moves

    def thread(self, tid: str) -> Thread:
        ws, owner, _ = next(t for t in self.threads if t[2] == tid)
        return Thread.at(self.layout.thread_dir(ws, owner, tid))


def parquet(i: int, k: int) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"building": [i] * 3, "part": [k] * 3, "kwh": [1.5 * i, 2.5 * k, 3.0]}), out)
    return out.getvalue()


def _record(i: int, j: int):
    return lambda seq: Record(seq=seq, role="user" if j % 2 == 0 else "assistant", ts=time.time(),
                              content=f"thread {i} message {j}: revenue per building", turn_id=f"u{i}")


def build_home(root: Path) -> Home:
    layout = Layout(root)
    root.mkdir(parents=True)
    users = UserStore(layout)
    tokens = {"ann": users.add("ann", ["demo", "sales"], ["memory", "code_execution"])[1],
              "bob": users.add("bob", ["demo"])[1]}
    users.add("eve", ["demo"])
    users.revoke("eve")
    users.new_token("ann")
    users.record_login("ann")
    users.new_session("ann", 3600)
    users.new_session("bob", 3600)
    invite, _ = users.new_invitation(["sales"], ["memory"], 3600, created_by="ann")  # still open after the move
    used, _ = users.new_invitation(["demo"], [], 3600, created_by="ann")
    users.redeem_invitation(used, "dan")
    home = Home(layout, tokens)
    home.invitation = invite
    threads, arts = ThreadStore(layout), ArtifactStore(layout)
    for i in range(THREADS):
        ws, owner = (("demo", "sales")[i % 2], "ann") if i % 3 else ("demo", "bob")
        t = threads.create(ws, owner, title=f"thread {i}")
        home.threads.append((ws, owner, t.id))
        for j in range(2 + i % 5):
            t.append(_record(i, j), epoch=t.epoch)
        origin = ArtifactOrigin(source="tool", user=owner, thread=t.id, workspace=ws, tool="sql_query")
        made = [arts.save_bytes(t, parquet(i, k), "parquet", "result", PARQUET, origin, epoch=t.epoch)
                for k in range(5)]
        if i % 4 == 0:
            arts.expire(t, made[0].id)  # a tombstone
        if i % 5 == 0:
            t.write_doc(SUMMARY, {"text": f"summary of thread {i}", "upto": 2}, t.epoch)
            t.write_doc(SUMMARY_STATUS, {"ok": True}, t.epoch)
            t.write_doc(TASK_STATE, {"goal": "compare buildings", "constraints": ["kWh"]}, t.epoch)
            t.append_line(SUMMARY_REVISIONS, b'{"rev": 1}', t.epoch)
            for n in range(3):
                t.append_line(MANIFESTS, b'{"manifest": %d}' % n, t.epoch)
    _special_threads(home, threads, arts)
    memory = MemoryStore(layout)
    memory.remember("demo", "ann", "prefers kWh per square metre")
    fact = memory.remember("sales", "ann", "fiscal year starts in April")
    memory.forget("sales", "ann", fact.id)
    return home


def _special_threads(home: Home, threads: ThreadStore, arts: ArtifactStore) -> None:
    ws, owner, tid = home.threads[1]
    home.torn = tid
    with open(home.layout.thread_dir(ws, owner, tid) / "log.jsonl", "ab") as fh:
        fh.write(b'{"seq":99,"role":"user","ts":1.0,"content":"cut off by a cra')
    ws, owner, tid = home.threads[2]
    t = Thread.at(home.layout.thread_dir(ws, owner, tid))
    threads.clear(t)
    t = Thread.at(t.dir)
    t.append(_record(2, 0), epoch=t.epoch)
    home.cleared = tid
    ws, owner, tid = home.threads[4]
    t = Thread.at(home.layout.thread_dir(ws, owner, tid))
    (t.outputs_dir / "charts").mkdir(parents=True)
    (t.outputs_dir / "charts" / "kwh.png").write_bytes(b"\x89PNG fake chart " * 50)
    (t.outputs_dir / "report.html").write_text("<h1>report</h1>")
    (t.outputs_dir / "bad name.txt").write_text("a name an object key cannot hold")
    home.outputs = tid
    aid = new_artifact_id()  # an upload: its data and the uploaded CSV kept beside it
    data, csv = parquet(7, 7), b"building,kwh\n7,10.5\n"
    write_atomic(t.artifacts_dir / f"{aid}.parquet", data)
    write_atomic(t.artifacts_dir / ArtifactStore.original_name(aid, "csv"), csv)
    import hashlib

    now = time.time()
    arts.save(t, Artifact(id=aid, kind="upload", format="parquet", file=f"{aid}.parquet",
                          origin=ArtifactOrigin(source="upload", user=owner, thread=tid, workspace=ws,
                                                filename="kwh.csv"),
                          created=now, last_used=now, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                          original=ArtifactStore.original_name(aid, "csv"), original_bytes=len(csv)), t.epoch)
    home.upload = (tid, aid)


@pytest.fixture(scope="module")
def built_home(tmp_path_factory) -> Home:
    return build_home(tmp_path_factory.mktemp("migrate") / "template")


@pytest.fixture
def home(built_home, tmp_path) -> Home:
    """A fresh copy of the built home for each test (a migration writes `migrated.json` into it)."""
    root = tmp_path / "home"
    shutil.copytree(built_home.layout.home, root, symlinks=True)
    return Home(Layout(root), built_home.tokens, built_home.threads, built_home.torn, built_home.cleared,
                built_home.outputs, built_home.upload, built_home.invitation)


def blobs_of(s3, cache: Path, cache_bytes: int = 0) -> S3Blobs:
    return S3Blobs(s3.url, s3.endpoint, cache, cache_bytes, region=s3.region, access_key=s3.access_key,
                   secret_key=s3.secret_key)


def test_migrate_verify_rerun_and_read_back(home, cluster_db, s3, tmp_path):
    blobs = blobs_of(s3, tmp_path / "no-cache")
    seen: list[tuple[int, int]] = []
    started = time.monotonic()
    report = migrate_home(home.layout, cluster_db, blobs, progress=lambda stage, d, n: seen.append((d, n)))
    took = time.monotonic() - started
    assert report.counts["threads"] == THREADS and report.counts["artifacts"] >= 200, report.summary()
    assert report.counts["tombstones"] == 13 and report.counts["outputs"] == 2
    assert report.counts["users"] == 4 and report.counts["sessions"] == 2 and report.counts["memory docs"] == 2
    assert report.counts["invitations"] == 2
    assert seen[-1] == (THREADS, THREADS)
    assert any("torn last line" in n and home.torn in n for n in report.notes), report.notes
    assert any("bad name.txt" in n for n in report.notes)
    assert not report.kept and not report.differences
    print(f"\nmigrated {THREADS} threads, {report.counts['artifacts']} artifacts in {took:.2f} s")
    marker = msgspec.json.decode((home.layout.home / MIGRATED_FILE).read_bytes())
    assert marker["counts"]["threads"] == THREADS and marker["bucket"] == s3.bucket
    assert "***" in marker["database"] and cluster_db.url.split(":")[2].split("@")[0] not in marker["database"]

    check = migrate_home(home.layout, cluster_db, blobs, verify=True)
    assert check.ok, check.summary()
    assert check.counts == report.counts
    again = migrate_home(home.layout, cluster_db, blobs)
    assert not again.written and not again.kept, again.summary()
    assert migrate_home(home.layout, cluster_db, blobs, verify=True).ok
    _read_back(home, cluster_db, s3, tmp_path)
    with pytest.raises(SettingsError, match="migrated"):  # the file-mode server refuses the home
        from datadesk.composition import open_cluster

        open_cluster(load_settings(env={"DATADESK_HOME": str(home.layout.home)}), home.layout)


def _read_back(home: Home, db, s3, tmp_path: Path) -> None:
    """The copy through the cluster stores, on a host with a home of its own."""
    layout = Layout(tmp_path / "cluster-host")
    threads = PgThreadStore(db, layout)
    arts = PgArtifactStore(db, blobs_of(s3, tmp_path / "cache", 64 << 20), layout)
    files = ArtifactStore(home.layout)
    for ws, owner, tid in home.threads:
        mine = home.thread(tid)
        theirs = threads.get(tid, owner, [ws])
        assert theirs.meta == mine.meta
        assert list(theirs) == list(mine) and theirs.tail(2) == mine.tail(2)
        for name in (SUMMARY, SUMMARY_STATUS, TASK_STATE):
            want = mine.read_doc(name)
            got = theirs.read_doc(name)
            assert (got and msgspec.json.decode(got)) == (want and msgspec.json.decode(want))
        assert list(theirs.lines(MANIFESTS)) == list(mine.lines(MANIFESTS))
        assert list(theirs.lines(SUMMARY_REVISIONS)) == list(mine.lines(SUMMARY_REVISIONS))
        listed = files.list(mine)
        assert arts.list(theirs) == listed
        for art in listed:
            if art.available:
                assert arts.data_path(theirs, art).read_bytes() == files.data_path(mine, art).read_bytes()
    assert [r.seq for r in threads.get(home.torn, *_owner_ws(home, home.torn))][-1] < 99  # the torn tail stays out
    cleared = threads.get(home.cleared, *_owner_ws(home, home.cleared))
    assert cleared.epoch == 1 and [r.seq for r in cleared] == [1]
    with db.connection() as conn:  # the search index was built by the migration, not left to the first search
        indexed = conn.execute("SELECT count(*) AS n FROM search_entries").fetchone()["n"]
    assert indexed == sum(len(list(home.thread(t))) for _, _, t in home.threads)
    hits = PgSearch(db, sync_budget_s=0).search("bob", ["demo"], "revenue building", limit=50)
    assert {h.thread for h in hits} == {t for _, o, t in home.threads if o == "bob"}
    tid, aid = home.upload
    up_file, up = home.thread(tid), threads.get(tid, *_owner_ws(home, tid))
    art = arts.load(up, aid)
    assert arts.original_path(up, art).read_bytes() == files.original_path(up_file, art).read_bytes()
    from datadesk.cluster.users import PgUserStore

    joined = PgUserStore(db).redeem_invitation(home.invitation, "fay")  # the open invitation works there
    assert (joined.workspaces, joined.permissions) == (["sales"], ["memory"])


def _owner_ws(home: Home, tid: str) -> tuple[str, list[str]]:
    ws, owner, _ = next(t for t in home.threads if t[2] == tid)
    return owner, [ws]


def test_verify_names_each_corruption_and_a_fresh_run_repairs(home, cluster_db, s3, tmp_path):
    blobs = blobs_of(s3, tmp_path / "no-cache")
    assert not migrate_home(home.layout, cluster_db, blobs).differences
    ws, owner, tid = home.threads[5]
    art = next(a for a in ArtifactStore(home.layout).list(home.thread(tid)) if a.available)
    key = artifact_key(ws, owner, tid, art.file)
    blobs.put(key, b"not the parquet it was", if_absent=False)
    other = home.threads[6][2]
    with cluster_db.connection() as conn:
        conn.execute("UPDATE records SET body = %s WHERE thread_id = %s AND seq = 2",
                     (b'{"seq":2,"role":"user","ts":1.0,"content":"forged"}', tid))
        conn.execute("DELETE FROM artifacts WHERE thread_id = %s AND id = (SELECT min(id) FROM artifacts "
                     "WHERE thread_id = %s)", (other, other))
        conn.execute("UPDATE memory_docs SET doc = jsonb_set(doc, '{enabled}', 'false') WHERE user_id = 'ann' "
                     "AND workspace = 'demo'")
    check = migrate_home(home.layout, cluster_db, blobs, verify=True)
    text = "\n".join(check.differences)
    assert not check.ok and len(check.differences) == 4, text
    assert f"{tid}" in text and "records whose bytes differ (sha256): seq 2" in text
    assert f"object {key} differs" in text
    assert other in text and "is missing from the cluster database" in text
    assert "memory of user ann in workspace demo: the document differs" in text
    # once migrated, a rerun fills in only what is missing (the cluster is the truth) ...
    rerun = migrate_home(home.layout, cluster_db, blobs)
    assert rerun.written == {"artifact rows": 1} and any("memory of user ann" in k for k in rerun.kept), rerun.summary()
    assert len(migrate_home(home.layout, cluster_db, blobs, verify=True).differences) == 3
    # ... while before `migrated.json` names this database the home is the truth: all repaired
    (home.layout.home / MIGRATED_FILE).unlink()
    repair = migrate_home(home.layout, cluster_db, blobs)
    assert repair.written["records"] == 1 and repair.written["objects"] == 1, repair.summary()
    assert migrate_home(home.layout, cluster_db, blobs, verify=True).ok


def test_an_interrupted_migration_resumes(home, cluster_db, s3, tmp_path):
    blobs = blobs_of(s3, tmp_path / "no-cache")
    bad_thread = home.thread(home.threads[30][2])  # one artifact's data no longer matches its sha256
    bad = next(a for a in ArtifactStore(home.layout).list(bad_thread) if a.available)
    (bad_thread.artifacts_dir / bad.file).write_bytes(b"bit rot")

    def crash(stage: str, done: int, total: int) -> None:
        if done == 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate_home(home.layout, cluster_db, blobs, progress=crash)
    assert not (home.layout.home / MIGRATED_FILE).exists()
    resumed = migrate_home(home.layout, cluster_db, blobs)
    assert resumed.written["threads"] == THREADS - 20 and not resumed.kept, resumed.summary()
    assert any(bad.id in n and "does not match the sha256" in n for n in resumed.notes), resumed.notes
    with cluster_db.connection() as conn:
        assert conn.execute("SELECT 1 FROM artifacts WHERE id = %s", (bad.id,)).fetchone() is None
    assert migrate_home(home.layout, cluster_db, blobs, verify=True).ok


def test_a_thread_changed_in_the_cluster_is_kept(home, cluster_db, s3, tmp_path):
    blobs = blobs_of(s3, tmp_path / "no-cache")
    migrate_home(home.layout, cluster_db, blobs)
    ws, owner, tid = home.threads[7]
    theirs = PgThreadStore(cluster_db, Layout(tmp_path / "host")).get(tid, owner, [ws])
    theirs.append(lambda seq: Record(seq=seq, role="user", ts=time.time(), content="asked in the cluster"))
    (home.layout.home / MIGRATED_FILE).unlink()  # even as the truth, the home does not undo the cluster's turn
    rerun = migrate_home(home.layout, cluster_db, blobs)
    assert any(tid in k and "left as it is there" in k for k in rerun.kept), rerun.summary()
    assert [r.content for r in theirs.tail(1)] == ["asked in the cluster"]


def test_a_home_in_use_is_refused(home, cluster_db, s3, tmp_path):
    blobs = blobs_of(s3, tmp_path / "no-cache")
    beat = Heartbeat(home.layout.home, 5.0)
    beat.beat()
    with pytest.raises(HomeInUse, match=f"worker {beat.worker.id} \\(pid {os.getpid()}"):
        migrate_home(home.layout, cluster_db, blobs)
    beat.path.unlink()
    ws, owner, tid = home.threads[3]
    lock = home.layout.home / "locks" / "turns" / f"t-{tid}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from filelock import FileLock; "
                               "l = FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); time.sleep(60)",
                               str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(HomeInUse, match=f"a turn is running on thread {tid}"):
            migrate_home(home.layout, cluster_db, blobs)
    finally:
        holder.kill()
        holder.wait()
    with cluster_db.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM threads").fetchone()["n"] == 0  # nothing was copied
    assert not migrate_home(home.layout, cluster_db, blobs).differences  # free now


def test_cli_migrate_then_serve_the_copy_in_cluster_mode(home, cluster_db_url, s3, tmp_path):
    env = {**os.environ, **s3.env(), "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
           "DATADESK_HOME": str(home.layout.home)}
    env.pop("DATADESK_CLUSTER_DATABASE_URL", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "datadesk.cli", "migrate", "--database-url", cluster_db_url,
                               "--storage-url", s3.url, "--storage-endpoint", s3.endpoint, *args],
                              env=env, capture_output=True, text=True, timeout=300)

    out = cli()
    assert out.returncode == 0, out.stderr
    assert f"threads: {THREADS}/{THREADS}" in out.stdout and "migrated " in out.stdout, out.stdout
    assert cluster_db_url.split(":")[2].split("@")[0] not in out.stdout + out.stderr  # no password shown
    out = cli("--verify")
    assert out.returncode == 0 and "verify: clean" in out.stdout, out.stdout + out.stderr
    _serve_the_copy(home, cluster_db_url, s3, tmp_path, env)
    with _db(cluster_db_url) as db:
        with db.connection() as conn:
            conn.execute("DELETE FROM records WHERE thread_id = %s AND seq = 1", (home.threads[0][2],))
    out = cli("--verify")
    assert out.returncode == 1 and "records missing from the cluster: seq 1" in out.stdout, out.stdout


class _db:
    def __init__(self, url: str) -> None:
        from datadesk.cluster.database import Database

        self.db = Database(url)

    def __enter__(self):
        return self.db

    def __exit__(self, *exc) -> None:
        self.db.close()


def _serve_the_copy(home: Home, url: str, s3, tmp_path: Path, env: dict[str, str]) -> None:
    """A cluster-mode server with an empty home of its own serves the migrated threads and artifacts."""
    from tests.serving import serving

    host_home = tmp_path / "cluster-host"
    host_home.mkdir()
    host_env = {**env, "DATADESK_HOME": str(host_home), "DATADESK_CLUSTER_DATABASE_URL": url,
                "DATADESK_STORAGE_URL": s3.url, "DATADESK_STORAGE_ENDPOINT": s3.endpoint,
                "DATADESK_SECRET_KEY": "test-secret-" + "x" * 32, "DATADESK_SANDBOX_BACKEND": "local"}
    ws, owner, tid = home.threads[4]
    files = ArtifactStore(home.layout)
    mine = home.thread(tid)
    art = next(a for a in files.list(mine) if a.available and a.kind == "result")
    with serving(host_home, host_env, tmp_path / "serve.log", args=["--allow-unsafe-local-sandbox"]) as (base, _):
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {home.tokens[owner]}"},
                          timeout=60) as c:
            listed = c.get("/api/threads").json()
            assert tid in str(listed)
            got = c.get(f"/api/threads/{tid}")
            assert got.status_code == 200, got.text
            assert [r["content"] for r in got.json()["records"]] == [r.content for r in mine]
            dl = c.get(f"/api/artifacts/{art.id}/download")
            assert dl.status_code == 200, dl.text
            rows = c.get(f"/api/artifacts/{art.id}/rows", params={"limit": 5})
            assert rows.status_code == 200 and "kwh" in rows.text, rows.text
