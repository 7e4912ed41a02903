"""The recovery part of bench/sandbox.py: how fast a thread's kernel works again after its
deadline or a cancel, and how late live output reaches the tool card.

Measured through the python tool on a real kernel (pool_size=0, so a replaced kernel is a
real start), each over `--runs` runs (at most 10; `--tiny`: 3):

- deadline -> working kernel: a cell `while True: pass` with a 1 s limit, from the deadline
  (the moment the sandbox says "interrupting", a progress event) until a following
  `print(6*7)` has answered 42. Interrupt path: the loop stops at the interrupt (variables
  kept). Restart path: the loop ignores SIGINT, so after the grace the kernel is restarted.
- cancel -> cell stopped: the running call's task is cancelled (as Stop does); until the
  cancelled call has returned (the code was interrupted, or the kernel shut down), and
  until a following `print(6*7)` answered (a restart path includes a fresh kernel's start).
- live output latency: a cell prints its wall clock every 0.2 s for 2 s; the delay from each
  print to its progress event (includes the 0.25 s throttle).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from datadesk.tools.registry import ToolContext

LOOP = "while True:\n    pass"
DEAF_LOOP = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + LOOP
GROUP = "5. recovery (deadline, cancel) and live output"


def _watched(c: ToolContext, log: list[tuple[float, dict[str, Any]]]) -> ToolContext:
    """`c` with a progress callback that records (monotonic time, fields) of each event."""
    return ToolContext(thread=c.thread, workspace=c.workspace, user=c.user, permissions=c.permissions,
                       call_id=c.call_id, progress=lambda **f: log.append((time.monotonic(), f)))


async def _answer_42(rt: Any, c: ToolContext) -> float:
    res = await rt.tools.run("python", json.dumps({"code": "print(6*7)", "timeout_s": 10}), c)
    if res.is_error or "42" not in res.content:
        raise RuntimeError(f"the kernel did not answer after recovery: {res.content[:500]}")
    return time.monotonic()


async def deadline_run(rt: Any, c: ToolContext, code: str) -> float:
    """ms from the deadline (the "interrupting" event) to a kernel that answered 42."""
    log: list[tuple[float, dict[str, Any]]] = []
    res = await rt.tools.run("python", json.dumps({"code": code, "timeout_s": 1}), _watched(c, log))
    if "TIMEOUT" not in res.content:
        raise RuntimeError(f"expected a timeout: {res.content[:300]}")
    at = next(t for t, f in log if "interrupting" in (f.get("message") or ""))
    return (await _answer_42(rt, c) - at) * 1000


async def cancel_run(rt: Any, c: ToolContext, code: str) -> tuple[float, float]:
    """(ms from the cancel until the cancelled call returned, ms until a kernel answered 42)."""
    task = asyncio.create_task(rt.tools.run("python", json.dumps({"code": code, "timeout_s": 60}), c))
    await asyncio.sleep(1.0)  # the cell runs
    t0 = time.monotonic()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    stopped = time.monotonic()
    return (stopped - t0) * 1000, (await _answer_42(rt, c) - t0) * 1000


async def output_latency(rt: Any, c: ToolContext) -> list[float]:
    """ms from each print (the kernel's wall clock) to its progress event (ours)."""
    log: list[tuple[float, dict[str, Any]]] = []
    wall: list[tuple[float, str]] = []

    def progress(**f: Any) -> None:
        wall.append((time.time(), f.get("stdout") or ""))
        log.append((time.monotonic(), f))

    w = ToolContext(thread=c.thread, workspace=c.workspace, user=c.user, permissions=c.permissions,
                    call_id=c.call_id, progress=progress)
    code = "import time\nfor i in range(10):\n    print(f'T{time.time():.6f}', flush=True)\n    time.sleep(0.2)"
    await rt.tools.run("python", json.dumps({"code": code}), w)
    out = []
    for got, text in wall:
        for line in text.splitlines():
            if line.startswith("T"):
                out.append((got - float(line[1:])) * 1000)
    return out


async def bench_recovery(bench: Any) -> None:
    """The rows of group 5 (see the module docstring)."""
    runs = min(bench.args.runs, 10)
    rt = bench.make_rt("recovery", exec_timeout_s=60)
    await bench.start(rt)
    try:
        c = bench.ctx(rt, "recovery")
        await _answer_42(rt, c)  # the kernel is up
        rows: dict[str, list[float]] = {k: [] for k in ("dl_int", "dl_restart", "cancel_int", "cancel_int_42",
                                                        "cancel_restart", "cancel_restart_42")}
        for _ in range(runs):
            rows["dl_int"].append(await deadline_run(rt, c, LOOP))
            rows["dl_restart"].append(await deadline_run(rt, c, DEAF_LOOP))
            a, b = await cancel_run(rt, c, LOOP)
            rows["cancel_int"].append(a)
            rows["cancel_int_42"].append(b)
            a, b = await cancel_run(rt, c, DEAF_LOOP)
            rows["cancel_restart"].append(a)
            rows["cancel_restart_42"].append(b)
        latency = await output_latency(rt, c)
    finally:
        await rt.stop()
    bench.row(GROUP, "deadline -> working kernel, interrupt path", rows["dl_int"], "ms",
              note="until a following print(6*7) answered; variables kept")
    bench.row(GROUP, "deadline -> working kernel, restart path", rows["dl_restart"], "ms",
              note="the loop ignores SIGINT: the interrupt grace, then a kernel restart")
    bench.row(GROUP, "cancel -> cell stopped, interrupt path", rows["cancel_int"], "ms",
              note="until the cancelled call returned with the kernel idle")
    bench.row(GROUP, "cancel -> print(6*7) answered, interrupt path", rows["cancel_int_42"], "ms")
    bench.row(GROUP, "cancel -> cell stopped, restart path", rows["cancel_restart"], "ms",
              note="the grace, then the kernel shut down")
    bench.row(GROUP, "cancel -> print(6*7) answered, restart path", rows["cancel_restart_42"], "ms",
              note="includes a fresh kernel's start (pool_size=0)")
    bench.row(GROUP, "print -> tool.progress event (live output)", latency, "ms",
              note="includes the 0.25 s throttle of the python tool")
