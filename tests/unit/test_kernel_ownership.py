"""Kernel ownership across app workers, with real processes and real local kernels: liveness,
heartbeats, the on-disk table, attaching to another worker's kernel, caps counted across
workers, the orphan rule when a worker dies, and one host-wide reaper round."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from datadesk.sandbox.backends import build_kernel_registry
from datadesk.sandbox.kerneltable import KernelRecord, KernelTable
from datadesk.sandbox.ownership import (
    Heartbeat, owner_alive, pid_alive, proc_start, this_worker, try_lock, workers_dir,
)
from datadesk.sandbox.sessions import SeenOutputs
from datadesk.settings import Settings
from datadesk.store.layout import Layout

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}"}


# -- liveness, heartbeats, the table ------------------------------------------------------

def test_pid_alive_knows_a_reused_pid_and_a_dead_one() -> None:
    me = os.getpid()
    assert pid_alive(me) and pid_alive(me, proc_start(me))
    assert not pid_alive(me, (proc_start(me) or 0) + 1)  # same number, another process
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid) and not pid_alive(None) and not pid_alive(0)


def test_this_worker_is_this_process_and_a_fork_makes_its_own() -> None:
    """Turn claims and event files record `this_worker().pid_start` on the event loop once per
    turn each: read once per process, and again in a forked child."""
    mine = this_worker()
    assert mine.pid == os.getpid() and mine.pid_start is not None and mine.pid_start == proc_start(os.getpid())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own pid and start time, not the cached parent's
        try:
            child = this_worker()
            ok = child.pid == os.getpid() and child.pid_start == proc_start(os.getpid()) and child.id != mine.id
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert got == b"1"
    assert this_worker() is mine


def test_owner_alive_needs_a_fresh_heartbeat_and_a_live_pid(tmp_path: Path) -> None:
    assert owner_alive(tmp_path, this_worker().id, 1)  # ourselves, always
    assert not owner_alive(tmp_path, "w1-abcdef", 60)  # no heartbeat at all
    assert not owner_alive(tmp_path, "gone-host:1", 60) and not owner_alive(tmp_path, "../../etc", 60)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        d = workers_dir(tmp_path)
        d.mkdir(parents=True)
        info = {"id": "w7-live", "pid": sleeper.pid, "host": this_worker().host,
                "pid_start": proc_start(sleeper.pid), "started": time.time()}
        (d / "w7-live.json").write_text(json.dumps(info))
        assert owner_alive(tmp_path, "w7-live", 60)
        old = time.time() - 120
        os.utime(d / "w7-live.json", (old, old))
        assert not owner_alive(tmp_path, "w7-live", 60)  # heartbeat stale
        os.utime(d / "w7-live.json")
        sleeper.kill()
        sleeper.wait()
        assert not owner_alive(tmp_path, "w7-live", 60)  # fresh heartbeat, but the pid is dead
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_heartbeat_is_touched_while_running_and_removed_at_stop(tmp_path: Path) -> None:
    async def body() -> tuple[float, float, bool]:
        hb = Heartbeat(tmp_path, 0.05)
        hb.start()
        first = hb.path.stat().st_mtime
        for _ in range(500):  # until the heartbeat is touched again (at most ~5 s)
            if hb.path.stat().st_mtime > first:
                break
            await asyncio.sleep(0.01)
        later = hb.path.stat().st_mtime
        await hb.stop()
        return first, later, hb.path.exists()

    first, later, exists = asyncio.run(body())
    assert later > first and not exists


def test_kernel_table_records_and_counts(tmp_path: Path) -> None:
    table = KernelTable(tmp_path)
    table.save(KernelRecord(workspace="demo", user="u", thread="t1", kernel_id="k1", owner="w1-a", last_used=5))
    table.save(KernelRecord(workspace="demo", user="u", thread="t2", notice="reclaimed", had_kernel=True))
    table.save_pool(KernelRecord(kernel_id="k3", owner="w1-a"))
    (table.dir / "s-garbage.json").write_text("{not json")
    assert table.load(("demo", "u", "t1")).kernel_id == "k1"
    assert table.load(("demo", "u", "t2")).kernel_id is None and table.load(("demo", "u", "t9")) is None
    assert sorted(r.kernel_id for r in table.kernels()) == ["k1", "k3"]  # kernels only, pool included
    with pytest.raises(ValueError):
        table.save(KernelRecord(kernel_id="k4"))  # a session record needs its key
    with try_lock(table.key_lock(("demo", "u", "t1"))) as got, try_lock(table.key_lock(("demo", "u", "t1"))) as again:
        assert got and not again  # the lock file excludes a second holder, in this process too


def test_seen_outputs_are_shared_through_the_slot(tmp_path: Path) -> None:
    a = SeenOutputs(tmp_path / "seen.json")
    a["chart.png"] = (10, 123)
    b = SeenOutputs(tmp_path / "seen.json")  # another worker attaching later
    assert b == {"chart.png": (10, 123)}
    b["report.csv"] = (5, 7)
    a.reload()
    assert a == {"chart.png": (10, 123), "report.csv": (5, 7)}


# -- two workers, real local kernels ------------------------------------------------------

WORKER = """
    import asyncio, json, sys
    from pathlib import Path
    import msgspec
    from datadesk.sandbox.backends import build_kernel_registry
    from datadesk.settings import Settings
    from datadesk.store.layout import Layout

    async def main():
        settings = msgspec.json.decode(sys.argv[1].encode(), type=Settings, dec_hook=lambda t, o: Path(o))
        reg = build_kernel_registry(settings, Layout(settings.home))
        await reg.start()
        print(json.dumps({"worker": reg.worker.id}), flush=True)
        loop = asyncio.get_running_loop()
        tasks = set()

        async def run(cmd):
            try:
                key = ("demo", cmd.get("user", "u"), cmd["tid"])
                ex = await reg.execute(key, cmd["code"], 30, artifacts_dir=None)
                session = reg.sessions.get(key)  # the kernel that ran it (none after it died)
                out = {"status": ex.result.status, "result": ex.result.result, "notices": ex.notices,
                       "attached": bool(session and session.kernel.attached),
                       "pid": session.kernel.pid if session else None}
            except Exception as exc:
                out = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps({"tid": cmd["tid"], **out}), flush=True)

        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or line.strip() == "quit":
                break
            t = asyncio.create_task(run(json.loads(line)))
            tasks.add(t)
        await asyncio.gather(*tasks)
        await reg.stop()
        print(json.dumps({"stopped": True}), flush=True)

    asyncio.run(main())
"""


def settings_for(home: Path, **sandbox: Any) -> Settings:
    return msgspec.convert({"home": str(home), "sandbox": {
        "backend": "local", "pool_size": 0, "run_dir": tempfile.mkdtemp(prefix="ddo-"), "memory_mb": 512,
        "heartbeat_s": 0.2, "owner_stale_s": 10, "reap_interval_s": 3600, **sandbox}}, Settings,
        dec_hook=lambda t, o: Path(o))


class Worker:
    """Another app worker: a process with its own KernelRegistry over the same data dir."""

    def __init__(self, settings: Settings) -> None:
        code = textwrap.dedent(WORKER)
        self.proc = subprocess.Popen([sys.executable, "-c", code, msgspec.json.encode(settings, enc_hook=str).decode()],
                                     env=ENV, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.id = self.read()["worker"]

    def read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        assert line, "the worker process ended"
        return json.loads(line)

    def run(self, tid: str, code: str, user: str = "u") -> None:
        self.proc.stdin.write(json.dumps({"tid": tid, "code": code, "user": user}) + "\n")
        self.proc.stdin.flush()

    def execute(self, tid: str, code: str, user: str = "u") -> dict[str, Any]:
        self.run(tid, code, user)
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for s in (self.proc.stdin, self.proc.stdout):
            s.close()


def here(settings: Settings, body):
    async def main():
        reg = build_kernel_registry(settings, Layout(settings.home))
        await reg.start()
        try:
            return await body(reg)
        finally:
            await reg.stop()
    return asyncio.run(main())


def test_a_kernel_started_by_one_worker_is_used_by_the_other(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    other = Worker(settings)
    try:
        started = other.execute("t1", "x = 41\nimport os\nos.getpid()")
        assert started["status"] == "ok" and not started["notices"] and not started["attached"]
        rec = KernelTable(tmp_path).load(("demo", "u", "t1"))
        assert rec.owner == other.id and rec.pid == started["pid"] and rec.pid_start == proc_start(rec.pid)
        before = rec.last_used

        async def body(reg):
            ex = await reg.execute(("demo", "u", "t1"), "x + 1", artifacts_dir=None)
            kernel = reg.sessions[("demo", "u", "t1")].kernel  # the kernel that ran it
            return ex.result.result, ex.notices, kernel.attached, kernel.pid

        result, notices, attached, pid = here(settings, body)
        assert result == "42" and notices == [] and attached and pid == started["pid"]
        after = KernelTable(tmp_path).load(("demo", "u", "t1"))
        assert after.owner == other.id and after.last_used > before  # still theirs, used by us
        assert pid_alive(pid)  # our stop let go of the connection; the owner's kernel runs on
        back = other.execute("t1", "x")
        assert back["result"] == "41" and not back["notices"]
    finally:
        other.close()
    assert not pid_alive(started["pid"])  # the owner ended its kernel when it stopped
    rec = KernelTable(tmp_path).load(("demo", "u", "t1"))
    assert rec.kernel_id is None and "stopped with the server worker" in rec.notice


def test_a_dead_workers_kernel_is_an_orphan_ended_and_replaced_with_the_notice(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    other = Worker(settings)
    try:
        started = other.execute("t1", "x = 1")
        pid = KernelTable(tmp_path).load(("demo", "u", "t1")).pid
        other.proc.send_signal(signal.SIGKILL)  # the worker crashes; its kernel (own session) lives on
        other.proc.wait(10)
        assert started["status"] == "ok" and pid_alive(pid)

        async def body(reg):
            ex = await reg.execute(("demo", "u", "t1"), "'x' in globals()", artifacts_dir=None)
            return ex.result.result, ex.notices, reg.sessions[("demo", "u", "t1")].kernel.attached

        result, notices, attached = here(settings, body)
        assert result == "False" and not attached
        assert len(notices) == 1 and "stopped with the server worker that ran it" in notices[0]
        assert not pid_alive(pid)  # the orphan was ended, not left running
    finally:
        other.close()


def test_caps_count_every_workers_kernels_and_busy_ones_are_never_reclaimed(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, max_kernels_per_user=2)
    other = Worker(settings)
    try:
        assert other.execute("t1", "a = 1")["status"] == "ok"
        assert other.execute("t2", "b = 2")["status"] == "ok"
        other.run("t2", "import time; time.sleep(4); 'slept'")  # t2 busy in the other worker
        time.sleep(1.0)

        async def body(reg):
            # the user's 2 kernels live in the other worker: t1 (idle) is reclaimed, t2 (busy) kept
            first = await reg.execute(("demo", "u", "t3"), "3", artifacts_dir=None)
            table = KernelTable(tmp_path)
            t1, t2 = table.load(("demo", "u", "t1")), table.load(("demo", "u", "t2"))
            return first.result.result, t1, t2

        result, t1, t2 = here(settings, body)
        assert result == "3"
        assert t1.kernel_id is None and "kernel limit was reached" in t1.notice
        assert t2.kernel_id is not None
        assert other.read()["result"] == "'slept'"  # the busy execution finished undisturbed
        again = other.execute("t1", "a")
        assert again["status"] == "error" and "kernel limit was reached" in again["notices"][0]
    finally:
        other.close()


def test_one_worker_per_round_does_the_host_wide_reaping(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, idle_timeout_s=30)
    other = Worker(settings)
    try:
        assert other.execute("t1", "1")["status"] == "ok"

        async def body(reg):
            later = time.time() + 60  # the kernel has been idle for a minute by then
            with try_lock(reg.home / "sandbox" / "reaper.lock") as got:  # another worker holds this round
                assert got
                skipped = await reg.reap_once(later)
            done = await reg.reap_once(later)
            return skipped, done

        skipped, done = here(settings, body)
        assert skipped == [] and done == [(("demo", "u", "t1"), "idle for more than 0.5 min")]
        rec = KernelTable(tmp_path).load(("demo", "u", "t1"))
        assert rec.kernel_id is None and "reclaimed: idle" in rec.notice
        again = other.execute("t1", "2")  # the owner's connection is let go; a fresh kernel, with the notice
        assert again["result"] == "2" and "reclaimed: idle for more than 0.5 min" in again["notices"][0]
    finally:
        other.close()
