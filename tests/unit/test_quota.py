"""Cache eviction: count, bytes, TTL, per-user fairness; deliverables are never evicted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.llm.tokens import count_tokens
from datadesk.offload.pipeline import OffloadPipeline
from datadesk.offload.artifacts.quota import ArtifactQuota, QuotaExceeded
from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id
from datadesk.settings import OffloadSettings
from datadesk.store.layout import Layout
from datadesk.store.threads import Thread


class World:
    def __init__(self, home: Path, **limits) -> None:
        self.layout = Layout(home)
        self.settings = OffloadSettings(**limits)
        self.store = ArtifactStore(self.layout)
        self.quota = ArtifactQuota(self.settings, self.store)
        self.pipeline = OffloadPipeline(self.settings, self.store, count_tokens)

    def thread(self, user: str, tid: str, ws: str = "demo") -> Thread:
        d = self.layout.thread_dir(ws, user, tid)
        d.mkdir(parents=True, exist_ok=True)
        return Thread(d)

    def add(self, user: str, tid: str, size: int, kind: str = "result", used: float | None = None,
            enforce: bool = True):
        tdir = self.thread(user, tid)
        origin = ArtifactOrigin(source="tool" if kind == "result" else "python", user=user, thread=tid,
                                workspace="demo", tool="sql_query", arguments="{}")
        art = self.pipeline.write_text(tdir, new_artifact_id(), "x" * size, origin, kind)
        if used is not None:
            art = msgspec.structs.replace(art, last_used=used)
            self.store.save(tdir, art)
        if enforce and kind != "deliverable":
            self.quota.after_create(art)
        return art

    def status(self, user: str, tid: str) -> dict[str, str]:
        return {a.id: a.status for a in self.store.list(self.thread(user, tid))}


def test_count_limit_per_thread_evicts_lru_and_keeps_tombstones(tmp_path: Path) -> None:
    w = World(tmp_path, thread_max_count=3)
    now = time.time()
    arts = [w.add("alice", "t1", 100, used=now - 100 + i) for i in range(5)]
    status = w.status("alice", "t1")
    assert [status[a.id] for a in arts] == ["expired", "expired", "ready", "ready", "ready"]
    tomb = w.store.load(w.thread("alice", "t1"), arts[0].id)
    assert tomb.expired_at and tomb.rows is None and tomb.origin.tool == "sql_query"
    assert not (w.thread("alice", "t1").artifacts_dir / arts[0].file).exists()


def test_bytes_limit_per_user_across_threads(tmp_path: Path) -> None:
    w = World(tmp_path, user_max_bytes=2_500)
    now = time.time()
    a = w.add("alice", "t1", 1_000, used=now - 30)
    b = w.add("alice", "t2", 1_000, used=now - 20)
    c = w.add("alice", "t3", 1_000, used=now - 10)
    assert w.status("alice", "t1")[a.id] == "expired"
    assert w.status("alice", "t2")[b.id] == "ready" and w.status("alice", "t3")[c.id] == "ready"


def test_ttl(tmp_path: Path) -> None:
    w = World(tmp_path, ttl_s=60)
    old = w.add("alice", "t1", 10, used=time.time() - 3600, enforce=False)
    fresh = w.add("alice", "t1", 10)
    status = w.status("alice", "t1")
    assert status[old.id] == "expired" and status[fresh.id] == "ready"


def test_one_users_big_uploads_do_not_evict_another_users_data(tmp_path: Path) -> None:
    w = World(tmp_path, global_max_bytes=10_000)
    bob = [w.add("bob", "tb", 1_000, used=time.time() - 1_000 + i) for i in range(3)]  # older than alice's
    for _ in range(12):
        w.add("alice", "ta", 1_500)
    assert all(s == "ready" for s in w.status("bob", "tb").values()), "bob's older data was evicted"
    alice = w.status("alice", "ta")
    assert list(alice.values()).count("ready") >= 1 and "expired" in alice.values()
    total = sum(a.bytes for _, _, _, a in w.store.walk() if a.available)
    assert total <= 10_000
    assert len(bob) == 3


def test_periodic_sweep_takes_from_the_largest_user_first(tmp_path: Path) -> None:
    w = World(tmp_path)
    now = time.time()
    bob = w.add("bob", "tb", 1_000, used=now - 500, enforce=False)
    alice = [w.add("alice", "ta", 2_000, used=now - 100 + i, enforce=False) for i in range(4)]
    w.settings.global_max_bytes = 6_000
    evicted = w.quota.enforce()
    assert {e.user for e in evicted} == {"alice"}
    assert w.status("bob", "tb")[bob.id] == "ready"
    assert w.status("alice", "ta")[alice[0].id] == "expired"


def test_deliverables_are_never_evicted_but_have_their_own_quota(tmp_path: Path) -> None:
    w = World(tmp_path, thread_max_count=1, ttl_s=1, deliverable_user_max_bytes=5_000)
    chart = w.add("alice", "t1", 3_000, kind="deliverable", used=time.time() - 10_000)
    for _ in range(3):
        w.add("alice", "t1", 10)
    assert w.status("alice", "t1")[chart.id] == "ready"
    w.quota.check_deliverable("alice", 1_000)
    with pytest.raises(QuotaExceeded, match="Delete old charts"):
        w.quota.check_deliverable("alice", 3_000)


def test_periodic_sweep_runs_once_per_interval_whichever_worker_asks(tmp_path: Path) -> None:
    w = World(tmp_path, ttl_s=60)
    stale = w.add("alice", "t1", 10, used=time.time() - 3600, enforce=False)
    other_worker = ArtifactQuota(w.settings, ArtifactStore(w.layout))  # another process's view
    assert [e.artifact for e in w.quota.sweep_round(300)] == [stale.id]
    later = w.add("alice", "t1", 10, used=time.time() - 3600, enforce=False)
    assert other_worker.sweep_round(300) is None  # swept less than an interval ago: skipped
    assert w.status("alice", "t1")[later.id] == "ready"
    marker = tmp_path / ".artifact-sweep.last"
    os.utime(marker, (time.time() - 400, time.time() - 400))
    assert [e.artifact for e in other_worker.sweep_round(300)] == [later.id]


# -- what a crash left behind ----------------------------------------------------------------

def _age(path: Path, seconds: float) -> None:
    """Make `path` (and what is inside a folder) look `seconds` old."""
    then = time.time() - seconds
    for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
        os.utime(p, (then, then), follow_symlinks=False)


def test_stale_temp_files_and_orphan_data_are_swept_fresh_ones_are_not(tmp_path: Path) -> None:
    """A crash leaves a sink's temp folder, an upload or paste staging file, an atomic-write temp
    and a data file renamed in without its metadata: swept once older than the safe age, and
    never while young (being written); artifacts, their metadata and other files stay."""
    from datadesk.offload.artifacts.tempfiles import TEMP_MAX_AGE_S, sweep_temp_files

    w = World(tmp_path)
    kept = w.add("alice", "t1", 100)
    adir = w.thread("alice", "t1").artifacts_dir
    sink_dir = adir / ".a0123456789abcdef.parquet.k2j3.tmp"
    sink_dir.mkdir()
    (sink_dir / "part-x.parquet").write_bytes(b"PAR1 partial")
    stale = [sink_dir, adir / ".upload-abc.tmp", adir / ".paste-def.tmp", adir / ".a99.json.x1.tmp",
             adir / "a0123456789abcdef.parquet"]
    for p in stale[1:]:
        p.write_bytes(b"left by a crash")
    fresh = [adir / ".upload-live.tmp", adir / "afresh000000000.parquet"]
    for p in fresh:
        p.write_bytes(b"being written")
    for p in stale:
        _age(p, TEMP_MAX_AGE_S + 60)
    # a sink folder whose part file was written just now is in use, however old the folder is
    busy = adir / ".abusy00000000000.parquet.zz.tmp"
    busy.mkdir()
    (busy / "part-y.parquet").write_bytes(b"row group")
    os.utime(busy, (time.time() - 2 * TEMP_MAX_AGE_S,) * 2)
    _age(adir / kept.file, TEMP_MAX_AGE_S * 5)  # an old artifact is the quota's business, not this sweep's

    removed = sweep_temp_files(w.store)
    assert sorted(removed) == sorted(stale)
    assert all(p.exists() for p in fresh + [busy, adir / kept.file, adir / f"{kept.id}.json"])


def test_the_periodic_sweep_round_removes_crash_leftovers(tmp_path: Path) -> None:
    from datadesk.offload.artifacts.tempfiles import TEMP_MAX_AGE_S

    w = World(tmp_path)
    adir = w.thread("alice", "t1").artifacts_dir
    adir.mkdir(parents=True, exist_ok=True)
    left = adir / ".upload-crash.tmp"
    left.write_bytes(b"x")
    _age(left, TEMP_MAX_AGE_S + 1)
    assert w.quota.sweep_round(60) == []
    assert not left.exists()


def test_a_dead_writers_temp_files_go_at_once_anywhere_in_the_workspaces(tmp_path: Path) -> None:
    """Temp names carry their owner (host, pid, start time): a killed process's temp files in
    artifacts, thread and memory folders go at the next sweep whatever their age; a live
    writer's, another host's and a kernel's outputs stay (issue 25)."""
    import subprocess
    import sys
    import tempfile
    import textwrap

    from datadesk.offload.artifacts.tempfiles import sweep_temp_files
    from datadesk.store.tempnames import temp_prefix

    w = World(tmp_path)
    thread = w.thread("alice", "t1")
    adir, tdir = thread.artifacts_dir, thread.dir
    adir.mkdir(parents=True, exist_ok=True)
    outputs = tdir / "outputs"
    outputs.mkdir()
    child = textwrap.dedent(f"""
        import os, sys, tempfile
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / 'platform')!r})
        from datadesk.store.tempnames import temp_prefix
        for folder, name in [({str(adir)!r}, "upload"), ({str(tdir)!r}, "meta.json"), ({str(tdir.parent.parent)!r},
                             "memory.json"), ({str(outputs)!r}, "chart.png")]:
            fd, path = tempfile.mkstemp(prefix=temp_prefix(name), suffix=".tmp", dir=folder)
            os.write(fd, b"half written")
            print(path)
        os.mkdir(tempfile.mkdtemp(prefix=temp_prefix("a0123456789abcdef.parquet"), suffix=".tmp", dir={str(adir)!r})
                 + "/x")
        os._exit(0)
    """)
    made = [Path(p) for p in subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                            check=True).stdout.split()]
    sink_dirs = [p for p in adir.iterdir() if p.is_dir()]
    fd, name = tempfile.mkstemp(prefix=temp_prefix("upload"), suffix=".tmp", dir=adir)  # this live process's
    os.close(fd)
    live = Path(name)
    other_host = adir / ".upload.~000000-1-1~.abcd.tmp"
    other_host.write_bytes(b"someone else's")
    removed = sweep_temp_files(w.store)
    assert sorted(removed) == sorted([*made[:3], *sink_dirs])
    assert made[3].exists()  # in outputs: the kernel's files are not the app's temp files
    assert live.exists() and other_host.exists()



def test_a_dead_writers_temp_files_go_at_once_outside_the_workspaces_too(tmp_path: Path) -> None:
    """An atomic write beside users.json or calibration.json, of a turn marker in locks/turns or
    of a kernel record leaves a temp file when its process is killed mid-write: the sweep removes
    those of a dead owner there too, and nothing else (a live writer's, an untagged file, a
    kernel's outputs, DuckDB's spill folder)."""
    import subprocess
    import sys
    import tempfile
    import textwrap

    from datadesk.offload.artifacts.tempfiles import TEMP_MAX_AGE_S, sweep_temp_files
    from datadesk.store.tempnames import temp_prefix

    w = World(tmp_path)
    home = w.layout.home
    folders = [home, home / "locks" / "turns", home / "sandbox" / "kernels", home / "sandbox" / "workers",
               home / "run" / "kabc"]
    outputs, spill = home / "sandbox" / "slots" / "kabc" / "outputs", home / "tmp" / "sql" / "f00"
    for d in [*folders, outputs, spill]:
        d.mkdir(parents=True, exist_ok=True)
    child = textwrap.dedent(f"""
        import os, sys, tempfile
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / 'platform')!r})
        from datadesk.store.tempnames import temp_prefix
        for folder in {[str(d) for d in [*folders, outputs, spill]]!r}:
            fd, path = tempfile.mkstemp(prefix=temp_prefix("x.json"), suffix=".tmp", dir=folder)
            os.write(fd, b"half written")
            print(path)
        os._exit(0)
    """)
    made = [Path(p) for p in subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                            check=True).stdout.split()]
    fd, name = tempfile.mkstemp(prefix=temp_prefix("users.json"), suffix=".tmp", dir=home)  # a live writer's
    os.close(fd)
    untagged = home / "locks" / ".old-style.tmp"
    untagged.write_bytes(b"no owner named")
    _age(untagged, TEMP_MAX_AGE_S * 5)  # outside the workspaces age proves nothing: it stays
    removed = sweep_temp_files(w.store)
    assert sorted(removed) == sorted(made[:len(folders)])
    assert all(p.exists() for p in made[len(folders):]) and Path(name).exists() and untagged.exists()
