"""The artifact ledger: the quotas' totals kept as artifacts change, equal to what the files say.

Two `ArtifactStore`s on one data directory stand for two worker processes (and one test runs
real processes); the truth is always recomputed from the metadata files with `store.walk()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest

from datadesk.chat.turns import TurnRegistry
from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.users import User
from datadesk.llm.tokens import count_tokens
from datadesk.offload.artifacts.ledger import LEDGER_FILE
from datadesk.offload.artifacts.quota import ArtifactQuota, QuotaExceeded
from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id
from datadesk.offload.pipeline import OffloadPipeline
from datadesk.settings import OffloadSettings
from datadesk.store.layout import Layout
from datadesk.store.threads import Thread, ThreadStore
from datadesk.threads.lifecycle import ThreadLifecycle

PLATFORM = Path(__file__).resolve().parents[2] / "platform"


class Worker:
    """What one worker process holds over the shared data directory."""

    def __init__(self, home: Path, settings: OffloadSettings) -> None:
        self.layout = Layout(home)
        self.store = ArtifactStore(self.layout)
        self.quota = ArtifactQuota(settings, self.store)
        self.pipeline = OffloadPipeline(settings, self.store, count_tokens)
        self.threads = ThreadStore(self.layout)
        self.lifecycle = ThreadLifecycle(self.threads, TurnRegistry(3), None, self.store)


def origin(thread: Thread, user: str, source: str = "tool") -> ArtifactOrigin:
    return ArtifactOrigin(source=source, user=user, thread=thread.id, workspace="demo", tool="sql_query",
                          arguments="{}")


def truth(store: ArtifactStore) -> dict[str, tuple[int, int, int]]:
    """Totals recomputed from every metadata file: {scope: (count, stored bytes, deliverable bytes)}."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for ws, user, thread, art in store.walk():
        if not art.available:
            continue
        for scope in (f"t:{ws}/{user}/{thread.dir.name}", f"u:{user}", "*"):
            if art.is_cache:
                sums[scope][0] += 1
                sums[scope][1] += art.stored_bytes
            elif art.kind == "deliverable":
                sums[scope][2] += art.bytes
    return {k: tuple(v) for k, v in sums.items() if any(v)}


def kept(home: Path) -> dict[str, tuple[int, int, int]]:
    """The ledger's totals as stored (read with a connection of its own)."""
    conn = sqlite3.connect(str(home / LEDGER_FILE))
    try:
        rows = conn.execute("SELECT scope, count, bytes, deliverable FROM totals").fetchall()
    finally:
        conn.close()
    return {r[0]: tuple(r[1:]) for r in rows if any(r[1:])}


def test_totals_equal_a_full_recount_after_random_writes_from_two_workers(tmp_path: Path) -> None:
    """Saves, touches, expiries, discards, restores, deliverables, clears and deletes, each from
    one of two workers at random, with limits low enough that evictions happen all along."""
    settings = OffloadSettings(thread_max_count=4, user_max_bytes=6_000, global_max_count=12, ttl_s=3_600)
    workers = [Worker(tmp_path, settings), Worker(tmp_path, settings)]
    rng = random.Random(27)
    users = ["alice", "bob", "carol"]
    threads = {u: [workers[0].threads.create("demo", u) for _ in range(2)] for u in users}
    evicted = 0
    for step in range(300):
        w = rng.choice(workers)
        user = rng.choice(users)
        thread = rng.choice(threads[user])
        arts = [a for a in w.store.list(thread)]
        op = rng.choice(["result"] * 5 + ["deliverable", "touch", "expire", "discard", "restore", "clear", "delete"])
        if op == "result":
            art = w.pipeline.write_text(thread, new_artifact_id(), "x" * rng.randint(10, 1_500),
                                        origin(thread, user), "result")
            art = msgspec.structs.replace(art, last_used=time.time() - rng.uniform(0, 7_200))  # some past the TTL
            w.store.save(thread, art)
            evicted += len(w.quota.after_create(art))
        elif op == "deliverable":
            w.store.save_bytes(thread, b"p" * rng.randint(1, 500), "png", "deliverable", "image/png",
                               origin(thread, user, "python"))
        elif op == "touch" and arts:
            w.store.touch(thread, [rng.choice(arts).id])
        elif op == "expire" and arts:
            w.store.expire(thread, rng.choice(arts).id)
        elif op == "discard" and arts:
            w.store.discard(thread, rng.choice(arts))
        elif op == "restore" and (gone := [a for a in arts if a.status == "expired" and a.format == "text"]):
            old = rng.choice(gone)
            w.pipeline.write_text(thread, old.id, "restored " * rng.randint(1, 50), old.origin, old.kind, existing=old)
        elif op == "clear":
            asyncio.run(w.lifecycle.clear(thread, User(id=user, name=user, workspaces=["demo"])))
        elif op == "delete":
            asyncio.run(w.lifecycle.delete(thread, User(id=user, name=user, workspaces=["demo"])))
            threads[user].remove(thread)
            threads[user].append(w.threads.create("demo", user))
        if step % 50 == 49:
            assert kept(tmp_path) == truth(w.store), f"after step {step} ({op})"
    assert evicted > 10, "the limits were never reached: the test proves nothing"
    assert kept(tmp_path) == truth(workers[0].store)
    drift = workers[1].quota.reconcile()
    assert (drift.rows, drift.totals) == (0, 0)


WRITER = """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from datadesk.domain.artifacts import ArtifactOrigin
    from datadesk.llm.tokens import count_tokens
    from datadesk.offload.artifacts.quota import ArtifactQuota, QuotaExceeded
    from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id
    from datadesk.offload.pipeline import OffloadPipeline
    from datadesk.settings import OffloadSettings
    from datadesk.store.layout import Layout
    from datadesk.store.threads import ThreadStore

    layout = Layout(Path(sys.argv[1]))
    settings = OffloadSettings(thread_max_count=5, global_max_count=40)
    store = ArtifactStore(layout)
    quota, pipeline = ArtifactQuota(settings, store), OffloadPipeline(settings, store, count_tokens)
    user = sys.argv[2]
    threads = [ThreadStore(layout).create("demo", user) for _ in range(3)]
    evicted = 0
    for i in range(60):
        t = threads[i % 3]
        o = ArtifactOrigin(source="tool", user=user, thread=t.id, workspace="demo", tool="sql_query", arguments="{}")
        art = pipeline.write_text(t, new_artifact_id(), "r" * (100 + i), o, "result")
        evicted += len(quota.after_create(art))
        if i % 7 == 0:
            store.touch(t, [art.id])
    print(evicted, flush=True)
"""


def test_two_real_processes_writing_at_once_keep_the_totals_right(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(tmp_path), user, str(PLATFORM)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for user in ("u1", "u2")]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(int(out))
    store = ArtifactStore(Layout(tmp_path))
    assert kept(tmp_path) == truth(store)
    assert truth(store)["*"][0] <= 40  # the global limit held across both processes
    assert all(truth(store)[f"t:{k}"][0] <= 5 for k in [s[2:] for s in truth(store) if s.startswith("t:")])
    assert sum(outs) == 2 * 60 - truth(store)["*"][0]  # every eviction reported once, by one of them


def test_the_sweep_corrects_drift_and_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A crash between a metadata file and its row, a file removed outside the app and totals
    edited by hand: the next sweep makes the ledger say what the files say, in one log line."""
    w = Worker(tmp_path, OffloadSettings())
    thread = w.threads.create("demo", "alice")
    arts = [w.pipeline.write_text(thread, new_artifact_id(), "x" * 100, origin(thread, "alice"), "result")
            for _ in range(3)]
    w.quota.after_create(arts[-1])
    # a crash after the metadata file was written, before its row: the file is there, no row
    lost = msgspec.structs.replace(arts[0], id=new_artifact_id(), file="lost.txt")
    (thread.artifacts_dir / "lost.txt").write_bytes(b"y" * 100)
    (thread.artifacts_dir / f"{lost.id}.json").write_bytes(msgspec.json.encode(lost))
    # removed outside the app: a row without a file
    (thread.artifacts_dir / f"{arts[1].id}.json").unlink()
    conn = sqlite3.connect(str(tmp_path / LEDGER_FILE))
    with conn:
        conn.execute("UPDATE totals SET bytes = bytes + 12345 WHERE scope = 'u:alice'")
    conn.close()
    assert kept(tmp_path) != truth(w.store)
    caplog.set_level(logging.INFO, logger="datadesk.offload.artifacts.quota")
    assert w.quota.sweep_round(60) == []
    assert kept(tmp_path) == truth(w.store)
    said = [r.getMessage() for r in caplog.records if "ledger corrected" in r.getMessage()]
    assert len(said) == 1 and "1 rows missing, 1 stale, 0 changed, 1 totals wrong" in said[0]
    caplog.clear()
    os.utime(tmp_path / ".artifact-sweep.last", (0, 0))
    w.quota.sweep_round(60)  # nothing differs now: nothing said
    assert not [r for r in caplog.records if "ledger corrected" in r.getMessage()]


def test_a_write_made_while_the_sweep_reads_is_not_undone_by_it(tmp_path: Path) -> None:
    """The sweep's view of the files is older than the rows written after it began (a new artifact,
    one evicted meanwhile): those rows stay as they are, neither removed nor brought back."""
    w = Worker(tmp_path, OffloadSettings())
    thread = w.threads.create("demo", "alice")
    old = w.pipeline.write_text(thread, new_artifact_id(), "old", origin(thread, "alice"), "result")
    started = time.time_ns()
    rows = list(w.store.counted_rows())  # the sweep read the files: `old` ready, nothing else
    art = w.pipeline.write_text(thread, new_artifact_id(), "new", origin(thread, "alice"), "result")
    w.store.expire(thread, old.id)
    drift = w.store.ledger.reconcile(rows, started)
    assert drift.rows == 0
    assert kept(tmp_path)[f"t:demo/alice/{thread.id}"][0] == 1 == truth(w.store)["*"][0]
    assert {a.id: a.status for a in w.store.list(thread)} == {old.id: "expired", art.id: "ready"}


def test_a_limit_passed_evicts_the_least_recently_used_whoever_wrote_it(tmp_path: Path) -> None:
    """The ledger holds what the other worker wrote: the oldest goes, the new one stays, and two
    workers enforcing the same overflow at once evict it once."""
    settings = OffloadSettings(thread_max_count=3)
    a, b = Worker(tmp_path, settings), Worker(tmp_path, settings)
    thread = a.threads.create("demo", "alice")
    now = time.time()
    arts = []
    for i in range(6):
        art = a.pipeline.write_text(thread, new_artifact_id(), "x" * 10, origin(thread, "alice"), "result")
        art = msgspec.structs.replace(art, last_used=now - 100 + i)
        a.store.save(thread, art)
        arts.append(art)
    results: list[list] = []
    go = threading.Barrier(2)

    def run(w: Worker, art: Artifact) -> None:
        go.wait()
        results.append(w.quota.after_create(art))

    runners = [threading.Thread(target=run, args=(a, arts[5])), threading.Thread(target=run, args=(b, arts[4]))]
    for t in runners:
        t.start()
    for t in runners:
        t.join()
    gone = sorted(e.artifact for r in results for e in r)
    assert gone == sorted(x.id for x in arts[:3])
    status = {x.id: x.status for x in a.store.list(thread)}
    assert [status[x.id] for x in arts] == ["expired"] * 3 + ["ready"] * 3
    assert kept(tmp_path) == truth(a.store)


def test_a_data_directory_from_before_the_ledger_is_counted_at_first_use(tmp_path: Path) -> None:
    """Artifacts whose metadata no ledger ever saw (an upgrade), then a damaged ledger file: the
    first quota call builds it from the files, and the limits hold."""
    w = Worker(tmp_path, OffloadSettings(thread_max_count=3))
    thread = w.threads.create("demo", "alice")
    now = time.time()
    old = []
    for i in range(4):
        aid = new_artifact_id()
        art = Artifact(id=aid, kind="result", format="text", file=f"{aid}.txt", origin=origin(thread, "alice"),
                       created=now - 50 + i, last_used=now - 50 + i, bytes=10)
        (thread.artifacts_dir / art.file).parent.mkdir(parents=True, exist_ok=True)
        (thread.artifacts_dir / art.file).write_bytes(b"x" * 10)
        (thread.artifacts_dir / f"{aid}.json").write_bytes(msgspec.json.encode(art))
        old.append(art)
    assert not (tmp_path / LEDGER_FILE).exists()
    new = Worker(tmp_path, OffloadSettings(thread_max_count=3))
    art = new.pipeline.write_text(thread, new_artifact_id(), "new", origin(thread, "alice"), "result")
    assert sorted(e.artifact for e in new.quota.after_create(art)) == sorted(x.id for x in old[:2])
    assert kept(tmp_path) == truth(new.store)

    new.store.ledger.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / LEDGER_FILE}{suffix}").unlink(missing_ok=True)
    (tmp_path / LEDGER_FILE).write_bytes(b"not a database at all" * 100)
    later = Worker(tmp_path, OffloadSettings(thread_max_count=3))
    art2 = later.pipeline.write_text(thread, new_artifact_id(), "newer", origin(thread, "alice"), "result")
    assert [e.artifact for e in later.quota.after_create(art2)] == [old[2].id]
    assert kept(tmp_path) == truth(later.store)


def test_a_ledger_that_cannot_be_written_never_fails_or_loses_an_artifact(tmp_path: Path) -> None:
    """Another process holds the ledger's write lock past the wait: the artifact is saved all the
    same (a warning), the quota call gives up without evicting, and the next sweep counts it."""
    w = Worker(tmp_path, OffloadSettings(thread_max_count=1))
    thread = w.threads.create("demo", "alice")
    first = w.pipeline.write_text(thread, new_artifact_id(), "first", origin(thread, "alice"), "result")
    w.quota.after_create(first)
    w.store.ledger.close()
    w.store.ledger.busy_timeout_s = 0.05
    blocker = sqlite3.connect(str(tmp_path / LEDGER_FILE), isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        art = w.pipeline.write_text(thread, new_artifact_id(), "second", origin(thread, "alice"), "result")
        assert w.quota.after_create(art) == []
        assert {a.id for a in w.store.list(thread)} == {first.id, art.id}
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert kept(tmp_path)["*"][0] == 1  # the second one's row was not written
    evicted = w.quota.sweep_round(60)
    assert [e.artifact for e in evicted] == [first.id]  # counted now, and the limit holds
    assert kept(tmp_path) == truth(w.store)


def test_deliverables_count_for_their_user_across_workers_and_workspaces(tmp_path: Path) -> None:
    settings = OffloadSettings(deliverable_user_max_bytes=5_000)
    a, b = Worker(tmp_path, settings), Worker(tmp_path, settings)
    t1, t2 = a.threads.create("demo", "alice"), a.threads.create("other", "alice")
    a.store.save_bytes(t1, b"c" * 2_000, "png", "deliverable", "image/png", origin(t1, "alice", "python"))
    chart = a.store.save_bytes(t2, b"c" * 2_000, "png", "deliverable", "image/png", origin(t2, "alice", "python"))
    assert b.quota.deliverable_bytes("alice") == 4_000 and b.quota.deliverable_bytes("bob") == 0
    b.quota.check_deliverable("alice", 1_000)
    with pytest.raises(QuotaExceeded, match="Delete old charts"):
        b.quota.check_deliverable("alice", 2_000)
    a.store.discard(t2, chart)
    assert b.quota.deliverable_bytes("alice") == 2_000


def test_rows_of_a_user_removed_outside_the_app_never_cost_anyone_an_artifact(tmp_path: Path) -> None:
    """`datadesk users delete` removes a user's folders without telling the ledger: until the
    next sweep their rows are there, and a global overflow that reaches them drops them instead
    of evicting another user's data in their place, and recreates none of their folders."""
    import shutil

    w = Worker(tmp_path, OffloadSettings(global_max_count=3))
    bob = w.threads.create("demo", "bob")
    for _ in range(3):
        art = w.pipeline.write_text(bob, new_artifact_id(), "b" * 100, origin(bob, "bob"), "result")
        assert w.quota.after_create(art) == []
    shutil.rmtree(w.layout.user_dir("demo", "bob"))
    alice = w.threads.create("demo", "alice")
    first = w.pipeline.write_text(alice, new_artifact_id(), "a", origin(alice, "alice"), "result")
    assert w.quota.after_create(first) == []  # the count was 4 with bob's rows: theirs went, not alice's
    second = w.pipeline.write_text(alice, new_artifact_id(), "a", origin(alice, "alice"), "result")
    assert w.quota.after_create(second) == []
    assert [a.status for a in w.store.list(alice)] == ["ready", "ready"]
    assert not w.layout.user_dir("demo", "bob").exists()
    assert kept(tmp_path) == truth(w.store)
