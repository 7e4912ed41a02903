"""The kernel table and worker heartbeats (store/interfaces/kernels.py) on both sets: the embedded files
(sandbox/kerneltable.py, sandbox/ownership.py) and PostgreSQL (cluster/kernels.py).

"Two instances" are two workers of one host on the embedded set (one home) and two hosts on
the cluster set (separate homes, their own pools and lock connections, one database). The
registry tests run two real `KernelRegistry`s, each in its own thread and event loop, over a
fake backend whose kernels only count themselves."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgspec
import pytest

from datadesk.sandbox.base import (
    ExecutionResult, Kernel, KernelLimitReached, KernelLocator, KernelPlacement, SandboxBackend,
)
from datadesk.sandbox.kerneltable import KernelRecord, KernelTable
from datadesk.sandbox.ownership import Heartbeat, Worker, hostname, proc_start, try_lock
from datadesk.sandbox.registry import KernelRegistry
from datadesk.sandbox.sessions import ORPHAN_NOTICE
from datadesk.settings import SandboxSettings
from datadesk.store.interfaces.kernels import KernelCapReached, KernelCaps
from datadesk.store.interfaces.kernels import KernelTable as KernelTableProtocol
from datadesk.store.interfaces.kernels import WorkerRegistry

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}"}


def _worker(name: str, host: str | None = None, pid: int | None = None) -> Worker:
    pid = os.getpid() if pid is None else pid
    return Worker(id=f"w{pid}-{name}", pid=pid, host=host or hostname(), pid_start=proc_start(pid))


@dataclass
class KernelSet:
    """One set under test: `instance()` is another worker (embedded) or host (cluster)."""

    kind: str
    root: Path
    db_url: str = ""
    _closers: list[Callable[[], None]] = field(default_factory=list)
    _n: int = 0

    def home(self) -> Path:
        if self.kind == "embedded":
            return self.root / "home"  # the workers of one host share the data directory
        self._n += 1
        return self.root / f"home-{self._n}"  # hosts share nothing on disk

    def _db(self):
        from datadesk.cluster.database import Database

        db = Database(self.db_url, max_size=6)
        self._closers.append(db.close)
        return db

    def table(self) -> KernelTableProtocol:
        if self.kind == "embedded":
            return KernelTable(self.home())
        from datadesk.cluster.kernels import PgKernelTable

        table = PgKernelTable(self._db())
        self._closers.insert(0, table.locks.close)
        return table

    def workers(self, worker: Worker, interval_s: float = 0.1, home: Path | None = None) -> WorkerRegistry:
        home = home or self.home()
        if self.kind == "embedded":
            return Heartbeat(home, interval_s, worker)
        from datadesk.cluster.kernels import PgWorkers

        return PgWorkers(self._db(), home, interval_s, worker)

    def age_heartbeat(self, workers: WorkerRegistry, seconds: float) -> None:
        """Make `workers`' last beat `seconds` old (as if it had stopped beating then)."""
        if self.kind == "embedded":
            old = time.time() - seconds
            os.utime(workers.path, (old, old))
            return
        with workers.db.connection() as conn:
            conn.execute("UPDATE workers SET last_seen = now() - make_interval(secs => %s) WHERE id = %s",
                         (seconds, workers.worker.id))

    def corrupt_a_record(self, table: KernelTableProtocol) -> None:
        if self.kind == "embedded":
            (table.dir / "s-garbage.json").write_text("{not json")
            return
        with table.db.connection() as conn:
            conn.execute("INSERT INTO kernels (key_hash, workspace, user_id, thread_id, kernel_id, record)"
                         " VALUES ('bad', 'demo', 'u', 'tx', 'kx', '{\"started_at\": \"soon\"}')")

    def close(self) -> None:
        for close in self._closers:
            close()


@pytest.fixture(params=["embedded", "cluster"])
def kset(request, tmp_path):
    if request.param == "cluster":
        db = request.getfixturevalue("cluster_db")  # migrated; instances open their own pools on it
        s = KernelSet("cluster", tmp_path, db_url=db.url)
    else:
        s = KernelSet("embedded", tmp_path)
    yield s
    s.close()


def _session(thread: str, user: str = "u", kernel: str | None = "k1", **kw: Any) -> KernelRecord:
    return KernelRecord(workspace="demo", user=user, thread=thread, kernel_id=kernel, owner="w1-a", **kw)


# -- records ----------------------------------------------------------------------------------

def test_session_and_pool_records_round_trip_between_instances(kset):
    a, b = kset.table(), kset.table()
    assert isinstance(a, KernelTableProtocol)
    a.save(_session("t1", kernel="k1", last_used=5.0, pid=42, pid_start=7, data_dir="/d", host="h"))
    a.save(_session("t2", kernel=None, notice="reclaimed", had_kernel=True))
    a.save_pool(KernelRecord(kernel_id="k3", owner="w1-a"))
    got = b.load(("demo", "u", "t1"))
    assert got is not None and (got.kernel_id, got.last_used, got.pid, got.pid_start, got.data_dir) == \
        ("k1", 5.0, 42, 7, "/d")
    assert got.locator == KernelLocator(pid=42, pid_start=7)
    gone = b.load(("demo", "u", "t2"))
    assert gone.kernel_id is None and gone.notice == "reclaimed" and gone.had_kernel
    assert b.load(("demo", "u", "t9")) is None and b.load(("demo", "other", "t1")) is None
    assert sorted(r.thread for r in b.sessions()) == ["t1", "t2"]
    assert [r.kernel_id for r in b.pooled()] == ["k3"]
    assert [r.kernel_id for r in b.kernels()] == ["k1", "k3"]  # sessions with a kernel, then the pool
    a.save(msgspec.structs.replace(got, last_used=9.0))  # replaced, not added
    assert b.load(("demo", "u", "t1")).last_used == 9.0 and len(list(b.sessions())) == 2
    b.remove(("demo", "u", "t1"))
    b.remove_pool("k3")
    b.remove(("demo", "u", "nothing"))  # removing what is not there is fine
    b.remove_pool("nothing")
    assert a.load(("demo", "u", "t1")) is None and not list(a.pooled()) and a.kernels() == []


def test_bad_records_are_refused_on_write_and_skipped_on_read(kset):
    table = kset.table()
    with pytest.raises(ValueError, match="workspace, user and thread"):
        table.save(KernelRecord(kernel_id="k4"))
    table.save(_session("t1"))
    kset.corrupt_a_record(table)
    assert [r.thread for r in table.sessions()] == ["t1"] and [r.kernel_id for r in table.kernels()] == ["k1"]


# -- caps -------------------------------------------------------------------------------------

def test_reserve_counts_every_other_record_against_the_caps(kset):
    a, b = kset.table(), kset.table()
    caps = KernelCaps(per_user=2, total=3)
    a.reserve(_session("t1", kernel="k1"), caps)
    b.reserve(_session("t2", kernel="k2"), caps)
    with pytest.raises(KernelCapReached) as info:
        a.reserve(_session("t3", kernel="k3"), caps)
    assert (info.value.scope, info.value.count, info.value.limit) == ("user", 2, 2)
    assert b.load(("demo", "u", "t3")) is None  # nothing written when refused
    b.reserve(_session("t1", kernel="k1b", last_used=3.0), caps)  # its own record does not count
    b.reserve(_session("t3", kernel=None, notice="gone"), caps)  # no kernel: never refused
    b.reserve(KernelRecord(kernel_id="p1", owner="w1-a"), caps)  # a pool kernel: the total only
    with pytest.raises(KernelCapReached) as info:
        a.reserve(_session("t1", user="v", kernel="k9"), caps)
    assert (info.value.scope, info.value.count) == ("total", 3)
    with pytest.raises(KernelCapReached):
        a.reserve(KernelRecord(kernel_id="p2"), caps)
    a.reserve(KernelRecord(kernel_id="p1", owner="w2-b"), caps)  # the pool kernel's own record
    assert sorted(r.kernel_id for r in b.kernels()) == ["k1b", "k2", "p1"]


def test_caps_hold_when_two_instances_reserve_at_once(kset):
    """50 trials: 8 threads on two instances reserve kernels for one user at once; the user's
    cap (3) or the total (5, other users' kernels included) is never passed."""
    tables = [kset.table(), kset.table()]
    caps = KernelCaps(per_user=3, total=5)
    for trial in range(50):
        for rec in tables[0].sessions():
            tables[0].remove(rec.key)
        if trial % 2:  # every other trial, the total is what binds: 3 kernels of others already
            for i in range(3):
                tables[0].reserve(_session(f"o{i}", user=f"other{i}", kernel=f"ko{i}"), caps)
        barrier = threading.Barrier(8)
        won: list[str] = []

        def one(table, n: int) -> None:
            barrier.wait()
            try:
                table.reserve(_session(f"t{trial}-{n}", kernel=f"k{trial}-{n}"), caps)
                won.append(f"t{trial}-{n}")
            except KernelCapReached:
                pass

        threads = [threading.Thread(target=one, args=(tables[n % 2], n)) for n in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        mine = [r for r in tables[1].kernels() if r.user == "u"]
        expected = 2 if trial % 2 else 3
        assert len(won) == len(mine) == expected, (trial, won)
        assert len(tables[0].kernels()) <= caps.total


# -- locks ------------------------------------------------------------------------------------

def test_locks_exclude_other_holders_in_this_process_too(kset):
    a, b = kset.table(), kset.table()
    key = ("demo", "u", "t1")
    with try_lock(a.key_lock(key)) as got, try_lock(b.key_lock(key)) as other, \
            try_lock(a.key_lock(key)) as again, try_lock(b.key_lock(("demo", "u", "t2"))) as t2:
        assert got and not other and not again and t2
    with try_lock(b.key_lock(key)) as got:  # released
        assert got
    for make in ("create_lock", "reaper_lock"):
        first, second = getattr(a, make)(), getattr(b, make)()
        assert first.try_acquire() and not second.try_acquire() and not first.try_acquire()
        first.release()
        first.release()  # a second release does nothing
        assert second.try_acquire()
        second.release()


HOLDER = """
    import sys, time
    from pathlib import Path
    kind, where = sys.argv[1], sys.argv[2]
    if kind == "embedded":
        from datadesk.sandbox.kerneltable import KernelTable
        table = KernelTable(Path(where))
    else:
        from datadesk.cluster.database import Database
        from datadesk.cluster.kernels import PgKernelTable
        table = PgKernelTable(Database(where, max_size=1))
    lock = table.key_lock(("demo", "u", "t1"))
    assert lock.try_acquire()
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_lock_dies_with_its_holder(kset):
    table = kset.table()
    where = str(table.dir.parent.parent) if kset.kind == "embedded" else kset.db_url
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), kset.kind, where], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        lock = table.key_lock(("demo", "u", "t1"))
        assert not lock.try_acquire()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        started = time.monotonic()
        while not lock.try_acquire():  # the OS drops the flock; the server the session's locks
            assert time.monotonic() - started < 10, "the dead holder's lock was never freed"
            time.sleep(0.02)
        lock.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_a_lock_goes_with_a_terminated_connection(kset):
    """The server ends the holder's session (a host lost, an admin's kill): its locks go."""
    if kset.kind != "cluster":
        pytest.skip("a database session is the cluster set's holder")
    a, b = kset.table(), kset.table()
    key = ("demo", "u", "t1")
    held = a.key_lock(key)
    assert held.try_acquire() and not b.key_lock(key).try_acquire()
    with b.db.connection() as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
    lock = b.key_lock(key)
    deadline = time.monotonic() + 10  # pg_terminate_backend only signals: the backend exits a moment later
    while not lock.try_acquire():
        assert time.monotonic() < deadline, "the terminated holder's lock was not freed"
        time.sleep(0.05)
    lock.release()
    held.release()  # the lost lease lets go quietly


# -- heartbeats -------------------------------------------------------------------------------

def test_a_worker_that_stops_beating_is_dead_after_stale_s(kset):
    async def body() -> None:
        a = kset.workers(_worker("a", host="host-a"), interval_s=0.05)
        b = kset.workers(_worker("b"))
        assert isinstance(a, WorkerRegistry)
        a.start()
        try:
            await asyncio.sleep(0.2)
            assert b.owner_alive(a.worker.id, 2.0)
            a._task.cancel()  # the worker hangs or vanishes without removing its heartbeat
            await asyncio.sleep(0.3)
            assert b.owner_alive(a.worker.id, 2.0)  # not stale yet
            await asyncio.sleep(2.0)
            assert not b.owner_alive(a.worker.id, 2.0)
            a.beat()  # it came back
            assert b.owner_alive(a.worker.id, 2.0)
        finally:
            await a.stop()
        assert not b.owner_alive(a.worker.id, 60)  # a stopped worker removed its heartbeat

    asyncio.run(body())


def test_liveness_by_pid_only_on_this_host(kset):
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    here_dead = kset.workers(_worker("x", pid=done.pid))
    there = kset.workers(_worker("y", host="elsewhere", pid=done.pid))
    me = kset.workers(_worker("me"))
    for w in (here_dead, there, me):
        w.beat()
    assert not me.owner_alive(here_dead.worker.id, 60)  # fresh heartbeat, but its pid is gone
    assert me.owner_alive(there.worker.id, 60)  # another host's pid means nothing here
    assert me.owner_alive(me.worker.id, 0) and not me.owner_alive("w1-unknown", 60)
    assert not me.owner_alive(None, 60) and not me.owner_alive("../../etc", 60)
    kset.age_heartbeat(there, 120)
    assert not me.owner_alive(there.worker.id, 60)
    assert sorted(me.remove_dead(60)) == sorted([here_dead.worker.id, there.worker.id])
    assert me.remove_dead(60) == [] and me.owner_alive(me.worker.id, 60)


# -- two registries (two workers / two hosts) ---------------------------------------------------

class FakeCloud:
    """Where the fake kernels run: which are alive, and the most alive at once."""

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.alive: set[str] = set()
        self.peak = 0

    def start(self, kid: str) -> None:
        with self.mu:
            self.alive.add(kid)
            self.peak = max(self.peak, len(self.alive))

    def stop(self, kid: str) -> None:
        with self.mu:
            self.alive.discard(kid)


class FakeKernel(Kernel):
    def __init__(self, placement: KernelPlacement, cloud: FakeCloud, attached: bool = False) -> None:
        self.placement, self.cloud, self._attached = placement, cloud, attached
        self.started_at = 0.0

    async def start(self) -> None:
        self.cloud.start(self.placement.kernel_id)

    async def execute(self, code, timeout_s, *, on_output=None, on_status=None) -> ExecutionResult:
        await asyncio.sleep(float(code))
        return ExecutionResult(status="ok")

    async def probe(self, timeout_s: float) -> ExecutionResult | None:
        return ExecutionResult(status="ok")

    async def interrupt(self) -> None:
        pass

    async def restart(self) -> None:
        pass

    async def shutdown(self) -> None:
        self.cloud.stop(self.placement.kernel_id)

    async def is_alive(self) -> bool:
        return self.placement.kernel_id in self.cloud.alive


class FakeBackend(SandboxBackend):
    name = "fake"

    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud = cloud

    def kernel(self, placement: KernelPlacement) -> Kernel:
        return FakeKernel(placement, self.cloud)

    async def attach(self, placement, locator, connect=True) -> Kernel:
        return FakeKernel(placement, self.cloud, attached=True)


def _registry(kset: KernelSet, cloud: FakeCloud, name: str, **settings: Any) -> KernelRegistry:
    s = SandboxSettings(backend="local", pool_size=0, reap_interval_s=3600, heartbeat_s=0.1, owner_stale_s=1.0,
                        run_dir=str(kset.root / "run"), **settings)
    host = hostname() if kset.kind == "embedded" else f"host-{name}"
    workers = kset.workers(_worker(name, host=host))
    return KernelRegistry(s, workers.home, FakeBackend(cloud), table=kset.table(), workers=workers)


def _in_own_loop(reg: KernelRegistry, body, results: list, barrier: threading.Barrier) -> threading.Thread:
    async def main() -> None:
        await reg.start()
        try:
            barrier.wait()
            results.extend(await body(reg))
        finally:
            await reg.stop()

    return threading.Thread(target=asyncio.run, args=(main(),))


def test_two_registries_never_pass_the_users_kernel_cap(kset):
    """Two workers (hosts) at once, 10 rounds of 3 executions each on new threads of one user,
    each holding its kernel a moment: never more than the cap's kernels run at once, and the
    executions refused are refused with the cap's message."""
    cloud = FakeCloud()
    regs = [_registry(kset, cloud, n, max_kernels_per_user=2, max_kernels=20) for n in ("a", "b")]
    results: list[str] = []

    async def rounds(reg: KernelRegistry) -> list[str]:
        out = []
        for r in range(10):
            async def one(i: int) -> str:
                try:
                    await reg.execute(("demo", "u", f"{reg.worker.id}-{r}-{i}"), "0.05", artifacts_dir=None)
                    return "ok"
                except KernelLimitReached as exc:
                    assert "limit 2" in str(exc)
                    return "refused"
            out += await asyncio.gather(*(one(i) for i in range(3)))
        return out

    barrier = threading.Barrier(2)
    threads = [_in_own_loop(reg, rounds, results, barrier) for reg in regs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert len(results) == 60 and cloud.peak <= 2, (cloud.peak, results.count("ok"))
    # without reclaiming, only the first round's 2 could ever run: more means idle kernels of
    # either worker were reclaimed to make room (how often depends on timing)
    assert results.count("ok") > 2
    assert not cloud.alive  # both stopped: every kernel ended


def test_the_other_workers_reaper_ends_a_dead_workers_kernels(kset):
    cloud = FakeCloud()
    a, b = (_registry(kset, cloud, n) for n in ("a", "b"))
    key = ("demo", "u", "t1")

    async def body() -> None:
        await a.start()
        await b.start()
        try:
            await a.execute(key, "0", artifacts_dir=None)
            assert b.table.load(key).owner == a.worker.id and len(cloud.alive) == 1
            assert await b.reap_once() == []  # a lives: its kernel stays
            a.workers._task.cancel()  # a hangs (or its host is gone): its heartbeat stops
            kset.age_heartbeat(a.workers, 5)
            assert await b.reap_once() == [(key, "its worker is gone")]
            rec = b.table.load(key)
            assert rec.kernel_id is None and rec.notice == ORPHAN_NOTICE and not cloud.alive
            assert a.worker.id not in [r.owner for r in b.table.kernels()]
            report = await b.execute(key, "0", artifacts_dir=None)  # a fresh kernel, and the model is told why
            assert report.notices and "stopped with the server worker" in report.notices[0]
        finally:
            await b.stop()
            await a.stop()

    asyncio.run(body())


def test_a_host_bound_kernel_of_another_host_is_treated_as_reclaimed(kset):
    """A docker or local kernel lives on the host that started it: another host (cluster set)
    cannot reach it, so the thread gets a fresh kernel and the model is told why; another worker
    of the same host (embedded set) attaches to it."""
    cloud = FakeCloud()
    a, b = (_registry(kset, cloud, n) for n in ("a", "b"))
    key = ("demo", "u", "t-bound")

    async def body() -> None:
        await a.start()
        await b.start()
        try:
            await a.execute(key, "0", artifacts_dir=None)
            first = b.table.load(key).kernel_id
            report = await b.execute(key, "0", artifacts_dir=None)
            if kset.kind == "cluster":
                assert report.notices and "ran on another server (host-a)" in report.notices[0], report.notices
                assert b.table.load(key).kernel_id != first and b.table.load(key).owner == b.worker.id
            else:
                assert not report.notices and b.table.load(key).kernel_id == first
        finally:
            await b.stop()
            await a.stop()

    asyncio.run(body())


class SharedBackend(FakeBackend):
    """Kernels any host reaches (as the gateway's): they outlive the worker that started them."""

    shared_across_hosts = True


def test_a_kernel_any_host_reaches_is_adopted_when_its_worker_is_gone(kset):
    cloud = FakeCloud()
    a, b = (_registry(kset, cloud, n) for n in ("a", "b"))
    b.backend = a.backend = SharedBackend(cloud)
    key = ("demo", "u", "t-shared")

    async def body() -> None:
        await a.start()
        await b.start()
        try:
            await a.execute(key, "0", artifacts_dir=None)
            first = b.table.load(key).kernel_id
            a.workers._task.cancel()  # a's host is gone; its kernel is not
            kset.age_heartbeat(a.workers, 5)
            assert await b.reap_once() == []  # not an orphan: no reaper ends it
            report = await b.execute(key, "0", artifacts_dir=None)
            rec = b.table.load(key)
            assert not report.notices and rec.kernel_id == first and rec.owner == b.worker.id, (report.notices, rec)
            assert len(cloud.alive) == 1
        finally:
            await b.stop()
            await a.stop()

    asyncio.run(body())
