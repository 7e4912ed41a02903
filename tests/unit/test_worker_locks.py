"""Cross-process safety with real processes: turn locks (one per thread, N per user, cancel and
clear from another worker), memory writes, summary jobs and the artifact sweeper."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from filelock import FileLock

from datadesk.chat.turns import TooManyTurns, TurnConflict, TurnRegistry

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}"}


def child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=ENV, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def expect(proc: subprocess.Popen, want: str) -> str:
    line = proc.stdout.readline().strip()
    assert line == want, f"child said {line!r}, expected {want!r}; stderr: {proc.stderr.read() if not line else ''}"
    return line


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


# A worker holding turns on some threads until they are cancelled (or it is killed).
TURN_HOLDER = """
    import asyncio, sys
    from pathlib import Path
    from datadesk.chat.turns import TurnRegistry

    async def main():
        reg = TurnRegistry(int(sys.argv[2]), lock_dir=Path(sys.argv[1]))
        turns = []
        for tid in sys.argv[3:]:
            turn = reg.reserve(tid, "u1")
            async def run(tid=tid):
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    print("cancelled " + tid, flush=True)
                    raise
            turn.task = asyncio.create_task(run())
            turn.task.add_done_callback(lambda _t, turn=turn: reg.release(turn))
            turns.append(turn)
        print("ready", flush=True)
        await asyncio.gather(*[t.task for t in turns], return_exceptions=True)
        print("done", flush=True)

    asyncio.run(main())
"""

# A worker trying to start one turn; prints ok / conflict / too-many.
TURN_TRY = """
    import asyncio, sys
    from pathlib import Path
    from datadesk.chat.turns import TooManyTurns, TurnConflict, TurnRegistry

    async def main():
        reg = TurnRegistry(2, lock_dir=Path(sys.argv[1]))
        try:
            reg.release(reg.reserve(sys.argv[2], sys.argv[3]))
            print("ok", flush=True)
        except TurnConflict:
            print("conflict", flush=True)
        except TooManyTurns:
            print("too-many", flush=True)

    asyncio.run(main())
"""


def try_turn(lock_dir: Path, tid: str, user: str = "u1") -> str:
    proc = child(TURN_TRY, str(lock_dir), tid, user)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert out.strip(), err
    return out.strip()


def test_one_turn_per_thread_and_user_slots_hold_across_processes(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    holder = child(TURN_HOLDER, str(locks), "2", "ta", "tb")
    try:
        expect(holder, "ready")

        async def here() -> None:
            reg = TurnRegistry(2, lock_dir=locks)
            with pytest.raises(TurnConflict):
                reg.reserve("ta", "u1")  # the other worker runs a turn on ta
            with pytest.raises(TooManyTurns):
                reg.reserve("tc", "u1")  # u1 has 2 turns (its limit) in the other worker
            other = reg.reserve("tc", "u2")  # another user is not affected
            reg.release(other)
            assert reg.running("ta") and not reg.running("tc")

        asyncio.run(here())
        assert try_turn(locks, "ta") == "conflict"
        # the worker dies without releasing anything: the OS drops its locks, its marker is stale
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)

        async def after() -> None:
            reg = TurnRegistry(2, lock_dir=locks)
            assert not reg.running("ta")
            a, b = reg.reserve("ta", "u1"), reg.reserve("tb", "u1")
            reg.release(a)
            reg.release(b)

        asyncio.run(after())
    finally:
        stop(holder)


def test_cancel_from_another_worker_stops_the_turn_where_it_runs(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    holder = child(TURN_HOLDER, str(locks), "2", "ta", "tb")
    try:
        expect(holder, "ready")

        async def here() -> tuple[bool, bool, bool]:
            reg = TurnRegistry(2, lock_dir=locks)
            cancelled = await reg.cancel("ta")
            # only the named thread's turn stopped; nothing runs there any more
            return cancelled, reg.running("ta"), reg.running("tb")

        cancelled, ta_running, tb_running = asyncio.run(here())
        assert cancelled and not ta_running and tb_running
        expect(holder, "cancelled ta")
        assert try_turn(locks, "ta") == "ok"

        async def nothing() -> bool:
            return await TurnRegistry(2, lock_dir=locks).cancel("tz")  # no turn there

        assert asyncio.run(nothing()) is False
    finally:
        stop(holder)


def test_clear_holds_the_thread_so_no_worker_starts_a_turn_meanwhile(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    holder = child(TURN_HOLDER, str(locks), "2", "ta")
    try:
        expect(holder, "ready")

        async def clear() -> list[str]:
            reg = TurnRegistry(2, lock_dir=locks)
            seen = []
            async with reg.exclusive("ta"):  # cancels the other worker's turn, then holds the thread
                seen.append(await asyncio.to_thread(try_turn, locks, "ta"))
                with pytest.raises(TurnConflict):
                    reg.reserve("ta", "u9")
            seen.append(await asyncio.to_thread(try_turn, locks, "ta"))
            async with reg.exclusive("ta", deleting=True):
                pass
            return seen

        assert asyncio.run(clear()) == ["conflict", "ok"]
        expect(holder, "cancelled ta")
        assert not any(p.name.startswith("t-ta.") for p in locks.iterdir())  # a deleted thread leaves no lock
    finally:
        stop(holder)


MEMORY_WRITER = """
    import sys
    from pathlib import Path
    from datadesk.memory.store import MemoryStore
    from datadesk.settings import MemorySettings
    from datadesk.store.layout import Layout

    store = MemoryStore(Layout(Path(sys.argv[1])), MemorySettings(max_active=1000, max_total_chars=1_000_000))
    for i in range(int(sys.argv[3])):
        store.remember("demo", "u1", f"writer {sys.argv[2]} fact number {i}", source="panel", user_asked=True)
    print("ok", flush=True)
"""


def test_memory_writes_from_several_processes_are_never_lost(tmp_path: Path) -> None:
    from datadesk.memory.store import MemoryStore
    from datadesk.store.layout import Layout

    writers = [child(MEMORY_WRITER, str(tmp_path), str(w), "25") for w in range(4)]
    try:
        for w in writers:
            out, err = w.communicate(timeout=120)
            assert out.strip() == "ok", err
    finally:
        for w in writers:
            stop(w)
    facts = MemoryStore(Layout(tmp_path)).facts("demo", "u1")
    assert len(facts) == 100 and len({f.text for f in facts}) == 100
    audit = (Layout(tmp_path).user_dir("demo", "u1") / "memory.audit.jsonl").read_text().splitlines()
    assert sum(1 for line in audit if json.loads(line)["event"] == "created") == 100


SUMMARY_JOB = """
    import asyncio, sys, time
    from pathlib import Path
    from datadesk.llm.scripted import ScriptedModel
    from datadesk.llm.tokens import count_tokens
    from datadesk.settings import SummarySettings
    from datadesk.summary.service import SummaryService
    from datadesk.summary.store import SummaryStore
    from datadesk.store.threads import Thread
    from datadesk.summary.summarizer import Summarizer
    from tests.unit.test_summary import faithful

    tdir, calls, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

    def slow(messages, tools):
        with open(calls, "a") as fh:
            fh.write(f"{mode}\\n")
        time.sleep(1.5)  # long enough for the other process to try meanwhile
        return faithful(messages, tools)

    async def main():
        settings = SummarySettings()
        svc = SummaryService(SummaryStore(), Summarizer(ScriptedModel(then=slow), settings, count_tokens), settings)
        got = await svc.refresh(Thread.at(tdir), int(sys.argv[4]), 0, synchronous=mode == "sync")
        print("covers", got.covers_through_seq if got else None, flush=True)

    asyncio.run(main())
"""


def test_a_summary_job_runs_once_across_processes(tmp_path: Path) -> None:
    from tests.unit.test_summary import chat, make_thread

    from datadesk.summary.store import SummaryStore

    tdir = make_thread(tmp_path)
    last = chat(tdir, *[(f"question {i}, constraint: exclude holidays", f"answer {i}") for i in range(6)])
    calls = tmp_path / "calls.txt"
    jobs = [child(SUMMARY_JOB, str(tdir.dir), str(calls), "bg", str(last)) for _ in range(3)]
    jobs.append(child(SUMMARY_JOB, str(tdir.dir), str(calls), "sync", str(last)))
    outs = []
    try:
        for j in jobs:
            out, err = j.communicate(timeout=120)
            outs.append(out.strip())
            assert out.strip().startswith("covers"), err
    finally:
        for j in jobs:
            stop(j)
    assert len(calls.read_text().splitlines()) == 1  # one model call for this coverage, in all four
    assert outs[-1] == f"covers {last}"  # the synchronous one waited for the job and got its result
    assert SummaryStore().load(tdir).covers_through_seq == last
    assert not (tdir.dir / "summary.revisions.jsonl").exists()  # written once: nothing was replaced


SWEEPER = """
    import sys
    from pathlib import Path
    from datadesk.offload.artifacts.quota import ArtifactQuota
    from datadesk.offload.artifacts.store import ArtifactStore
    from datadesk.settings import OffloadSettings
    from datadesk.store.layout import Layout

    quota = ArtifactQuota(OffloadSettings(thread_max_count=1), ArtifactStore(Layout(Path(sys.argv[1]))))
    print(len(quota.enforce()), flush=True)
"""


def test_one_artifact_sweep_at_a_time_on_the_host(tmp_path: Path) -> None:
    from tests.unit.test_quota import World

    world = World(tmp_path)  # no limits while the artifacts are made
    for i in range(3):
        world.add("u1", "t1", 10, used=time.time() - 100 + i, enforce=False)
    held = FileLock(str(world.quota._lock.lock_file))
    with held:  # another worker is sweeping: this round is skipped, nothing is evicted twice
        proc = child(SWEEPER, str(tmp_path))
        out, err = proc.communicate(timeout=60)
        stop(proc)
        assert out.strip() == "0", err
    proc = child(SWEEPER, str(tmp_path))
    out, err = proc.communicate(timeout=60)
    stop(proc)
    assert out.strip() == "2", err
    assert sorted(world.status("u1", "t1").values()) == ["expired", "expired", "ready"]
