"""`LockService` conformance on both sets (lock files; PostgreSQL session advisory locks): one
holder at a time across two instances (two processes or hosts), no reentry, waits and
timeouts, bad names, and a holder that dies: its lock is free at once, and on the cluster set
a holder whose connection was killed (`pg_terminate_backend`) finds its leases lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from datadesk.store.interfaces.locks import BadLockName, LockService, LockTimeout
from tests.cluster import sets

pytestmark = pytest.mark.cluster


class Hosts(sets.Hosts):
    """Makes `LockService`s of one set; each `service()` is another process or host."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        super().__init__(kind, request, tmp_path)
        self.lock_dir = tmp_path / "locks"

    def service(self) -> LockService:
        if self.kind == "embedded":
            from datadesk.store.locks import FileLocks

            return self.closing(FileLocks(self.lock_dir))
        from datadesk.cluster.locks import build_locks

        return self.closing(build_locks(self.database("locks-host", max_size=2)))


hosts = sets.hosts_fixture(Hosts)


def test_one_holder_at_a_time_across_instances_and_no_reentry(hosts) -> None:
    a, b = hosts.service(), hosts.service()
    lease = a.try_acquire("summary:t1")
    assert lease is not None and lease.name == "summary:t1" and not lease.lost and lease.check()
    assert b.try_acquire("summary:t1") is None
    assert a.try_acquire("summary:t1") is None  # not reentrant, like two flocks
    other = b.try_acquire("summary:t2")  # names are independent
    assert other is not None
    lease.release()
    lease.release()  # idempotent
    assert not lease.check()
    with b.try_acquire("summary:t1") as again:
        assert again is not None and a.try_acquire("summary:t1") is None
    assert a.try_acquire("summary:t1") is not None  # the with block released it
    other.release()


def test_acquire_waits_for_a_release_and_times_out(hosts) -> None:
    a, b = hosts.service(), hosts.service()
    held = a.acquire("sweep", timeout_s=1)
    started = time.monotonic()
    with pytest.raises(LockTimeout, match="'sweep' is still held"):
        b.acquire("sweep", timeout_s=0.3)
    assert 0.25 <= time.monotonic() - started < 2
    threading.Timer(0.3, held.release).start()
    started = time.monotonic()
    got = b.acquire("sweep", timeout_s=5)
    assert 0.2 <= time.monotonic() - started < 2.5
    got.release()


@pytest.mark.parametrize("name", ["", "../etc/passwd", "a/b", " x", "x" * 201, "-x", "naïve"])
def test_bad_names_are_refused_by_name(hosts, name) -> None:
    svc = hosts.service()
    with pytest.raises(BadLockName, match="not a lock name"):
        svc.try_acquire(name)


def test_concurrent_tries_from_two_instances_give_one_holder(hosts) -> None:
    services = [hosts.service(), hosts.service()]
    winners: list = []
    barrier = threading.Barrier(16)

    def one(i: int) -> None:
        barrier.wait()
        lease = services[i % 2].try_acquire("reaper")
        if lease is not None:
            winners.append(lease)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_close_releases_every_lease(hosts) -> None:
    a, b = hosts.service(), hosts.service()
    assert a.try_acquire("x1") and a.try_acquire("x2")
    a.close()
    assert b.try_acquire("x1") is not None and b.try_acquire("x2") is not None


HOLD = """
import sys, time
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from datadesk.store.locks import FileLocks
lease = FileLocks(sys.argv[1]).try_acquire("held")
print("held" if lease else "busy", flush=True)
time.sleep(60)
"""


def test_a_dead_holder_frees_its_lock(hosts) -> None:
    """Embedded: the process is SIGKILLed. Cluster: its connection is killed by the server
    (`pg_terminate_backend`), as when its host goes; its leases report themselves lost."""
    b = hosts.service()
    if hosts.kind == "embedded":
        with sets.process(HOLD, str(hosts.lock_dir)) as proc:
            assert proc.stdout.readline().strip() == "held"
            assert b.try_acquire("held") is None
            sets.kill(proc)
        assert b.try_acquire("held") is not None
        return
    a = hosts.service()
    lease = a.try_acquire("held")
    assert lease is not None and b.try_acquire("held") is None
    pid = a._conn.info.backend_pid
    with hosts.db.connection() as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s) AS ok", (pid,)).fetchone()["ok"]
    deadline = time.monotonic() + 5
    got = None
    while got is None and time.monotonic() < deadline:
        got = b.try_acquire("held")
        time.sleep(0.01)
    assert got is not None, "the killed holder's lock was not freed"
    assert not lease.check() and lease.lost  # the holder learns it at its next look
    lease.release()  # nothing to release: no error
    assert a.try_acquire("held") is None  # a new connection, and b holds it now
    assert a.try_acquire("other") is not None
