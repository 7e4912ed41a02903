"""Every way a cell can go wrong ends with a working kernel: each case is followed by
`print(6*7)` in the same thread, which must answer 42 (within a 10 s execution limit).

Real kernels on both backends (local ipykernel subprocesses, Docker containers). One runtime
per backend is shared by the cases, each on its own thread.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from tests.integration.test_sandbox import make_rt
from tests.sandbox_kit import ctx, py

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(scope="module", params=BACKENDS)
def box(request, tmp_path_factory, demo_warehouse_dir):
    """(runtime, backend, run): `run(coro)` on the runtime's own event loop."""
    backend = request.param
    home = tmp_path_factory.mktemp(f"recovery-{backend}") / "var"
    home.mkdir(parents=True)
    rt = make_rt(home, backend, exec_timeout_s=20, memory_mb=256, pids_limit=64)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(rt.start())
    yield rt, backend, loop.run_until_complete
    loop.run_until_complete(rt.stop())
    loop.close()


def answers_42(rt, c) -> None:
    async def ask():
        return await asyncio.wait_for(py(rt, c, "print(6*7)", timeout_s=10), 60)
    return ask()


def check_42(r) -> None:
    assert not r.is_error and "42" in r.content, r.content


def test_infinite_loop_past_the_deadline_is_interrupted(box) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="loop")
    run(py(rt, c, "kept = 41"))
    r = run(py(rt, c, "print('spinning', flush=True)\nwhile True:\n    pass", timeout_s=1.5))
    assert r.is_error and "TIMEOUT" in r.content and "spinning" in r.content
    assert "still there" in r.content  # the interrupt worked: variables kept
    check_42(run(answers_42(rt, c)))
    assert "42" in run(py(rt, c, "kept + 1")).content


def test_loop_that_ignores_the_interrupt_is_restarted_and_the_model_is_told(box) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="deaf")
    run(py(rt, c, "lost = 1"))
    r = run(py(rt, c, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
                timeout_s=1.5))
    assert r.is_error and "TIMEOUT" in r.content
    assert "restarted" in r.content and "variables, imports and loaded data are gone" in r.content, r.content
    check_42(run(answers_42(rt, c)))
    assert "NameError" in run(py(rt, c, "lost")).content


def test_cell_wedged_in_c_code_is_restarted(box) -> None:
    """Catastrophic backtracking holds the GIL inside the regex engine: not even the kernel's
    control thread can take the interrupt, so the kernel is restarted after the grace."""
    rt, backend, run = box
    c = ctx(rt, tid="wedged")
    r = run(py(rt, c, "import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')", timeout_s=1.5))
    assert r.is_error and "TIMEOUT" in r.content and "restarted" in r.content, r.content
    check_42(run(answers_42(rt, c)))


def test_cancel_during_an_infinite_loop_stops_the_cell(box) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="stop")
    run(py(rt, c, "kept = 41"))

    async def stop_it():
        task = asyncio.create_task(py(rt, c, "while True:\n    pass", timeout_s=60))
        await asyncio.sleep(1.5)  # the cell is running
        task.cancel()  # what Stop does to the turn's task
        with pytest.raises(asyncio.CancelledError):
            await task
        return await asyncio.wait_for(py(rt, c, "print(6*7)", timeout_s=10), 60)

    check_42(run(stop_it()))
    assert "42" in run(py(rt, c, "kept + 1")).content  # interrupted, not restarted


def test_cancel_during_a_deaf_loop_restarts_the_kernel(box) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="stopdeaf")
    run(py(rt, c, "lost = 1"))

    async def stop_it():
        task = asyncio.create_task(py(rt, c, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                             "while True:\n    pass", timeout_s=60))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await asyncio.wait_for(py(rt, c, "print(6*7)", timeout_s=10), 60)

    r = run(stop_it())
    check_42(r)
    assert "a new Python kernel was started" in r.content and "did not stop when its call was cancelled" in r.content


def test_fork_bomb_with_sleeping_children(box) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="fork")
    if backend == "local":
        # no pids limit here: a bounded number of sleeping children, to check they die with a restart
        code = ("import os, time\npids = []\nfor i in range(30):\n    pid = os.fork()\n    if pid == 0:\n"
                "        time.sleep(600); os._exit(0)\n    pids.append(pid)\nprint('children', pids, flush=True)\n"
                "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass")
    else:
        code = ("import os, time\npids = []\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n"
                "        time.sleep(600); os._exit(0)\n    pids.append(pid)")
    r = run(py(rt, c, code, timeout_s=5))
    assert r.is_error, r.content
    children = [int(p) for p in re.findall(r"\d+", r.content.split("children", 1)[1].split("]")[0])] \
        if backend == "local" else []
    check_42(run(answers_42(rt, c)))
    if backend == "local":
        assert children and not [p for p in children if _alive(p)]  # the restart took them along
    r = run(py(rt, c, "import subprocess\nprint(subprocess.run(['echo', 'forked'], capture_output=True).stdout)",
               timeout_s=10))
    assert "forked" in r.content, r.content  # the kernel can fork again


def test_memory_bomb(box) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="mem")
    r = run(py(rt, c, "x = bytearray(8 << 30)" if backend == "local" else "x = bytearray(1 << 30)", timeout_s=10))
    assert r.is_error and ("MemoryError" in r.content or "out of memory" in r.content), r.content
    check_42(run(answers_42(rt, c)))


@pytest.mark.parametrize("box", [pytest.param("docker", marks=pytest.mark.docker)], indirect=True)
def test_kill_pid_1(box) -> None:
    """PID 1 is the container's init only on docker: there the kernel kills its own container."""
    rt, backend, run = box
    c = ctx(rt, tid="pid1")
    run(py(rt, c, "import os\ntry:\n    os.kill(1, 9)\nexcept Exception as e:\n    print(type(e).__name__)",
           timeout_s=10))
    check_42(run(answers_42(rt, c)))


@pytest.mark.parametrize("how", ["sys.stdout.close()", "sys.stdout.close()\nsys.stderr.close()",
                                 "os.close(1)\nos.close(2)"])
def test_cell_that_closes_its_own_stdout(box, how: str) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="closed" + str(abs(hash(how)) % 1000))
    run(py(rt, c, f"import os, sys\n{how}", timeout_s=10))
    check_42(run(answers_42(rt, c)))


def test_output_of_20000_chars_is_saved_in_full(box) -> None:
    rt, backend, run = box
    c = ctx(rt, tid="full")
    r = run(py(rt, c, "print(''.join(chr(65 + i % 26) for i in range(19_999)))", timeout_s=10))
    assert not r.is_error
    art = next(a for a in r.meta.artifacts if a.file == "output.txt")
    full = (c.thread.artifacts_dir / f"{art.id}.txt").read_text()
    assert full == "".join(chr(65 + i % 26) for i in range(19_999)) + "\n"
    assert f"/data/{art.id}.txt" in r.content and "chars cut" in r.content


def test_progress_arrives_while_the_cell_runs(box) -> None:
    rt, backend, run = box
    got: list[tuple[float, dict]] = []
    c = ctx(rt, tid="progress")
    c = type(c)(thread=c.thread, workspace=c.workspace, user=c.user, permissions=c.permissions,
                call_id=c.call_id, progress=lambda **f: got.append((time.monotonic(), f)))

    async def body():
        t0 = time.monotonic()
        r = await py(rt, c, "import time, sys\nfor i in range(8):\n    print('tick', i, flush=True)\n"
                            "    print('warn', i, file=sys.stderr, flush=True)\n    time.sleep(0.25)", timeout_s=20)
        return t0, time.monotonic(), r

    t0, t1, r = run(body())
    assert not r.is_error, r.content
    early = [f for t, f in got if t < t1 - 0.3]
    assert early, got
    out = "".join(f.get("stdout") or "" for _, f in got)
    err = "".join(f.get("stderr") or "" for _, f in got)
    assert "tick 0" in out and "tick 7" in out and "warn 7" in err
    assert "tick 0" in "".join(f.get("stdout") or "" for f in early)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def test_the_turn_waits_for_the_executions_own_deadline(harness_factory) -> None:
    """The turn's tool timeout (1 s here) never cuts a python call short: the call ends at its own
    deadline with the interrupt, and the card got the live output and the interrupt message."""
    from datadesk.llm.scripted import ScriptedModel, tool_step
    from tests.conftest import parse_sse
    from tests.integration.test_sandbox import sandbox_settings

    model = ScriptedModel([
        tool_step("python", {"code": "x = 41\nprint('started', flush=True)\nwhile True:\n    pass", "timeout_s": 2},
                  call_id="call_loop"),
        tool_step("python", {"code": "print(x + 1)"}, call_id="call_after"), "done"])
    h = harness_factory(model, sandbox=sandbox_settings("local"), chat={"tool_timeout_s": 1})
    with h.client(served=True, timeout=120) as api:
        c, tid = api.client, api.tid
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "spin"}).text)
    fins = {d["call_id"]: d for e, d in events if e == "tool.finished"}
    assert "TIMEOUT" in fins["call_loop"]["preview"] and "still there" in fins["call_loop"]["preview"]
    assert "timed out after" not in fins["call_loop"]["preview"]
    assert "42" in fins["call_after"]["preview"] and fins["call_after"]["ok"]
    progress = [d for e, d in events if e == "tool.progress" and d["call_id"] == "call_loop"]
    assert any("started" in (d.get("stdout") or "") for d in progress)
    assert any("interrupting" in (d.get("message") or "") for d in progress)
