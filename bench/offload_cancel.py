"""Benchmark cases of bench/offload.py for cancellation and progress (run in its child process).

- cancel to worker stopped: a call is cancelled (a) mid-write of a 50,000,000-row offload,
  once 2,000,000 rows are written, and (b) 0.5 s into a slow DuckDB statement (the
  interrupt); the time until the awaiting task is through, which is when the worker thread
  has stopped (the pipeline waits for it); nothing may be left in the artifacts folder.
- progress cost: the offload of a 10,000,000-row result without progress, with rows/bytes
  reports every 0.5 s (as shipped) and on every batch (the worst case), interleaved.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

PROGRESS_ROWS = 10_000_000
PROGRESS_SQL = f"SELECT range AS i, hash(range) AS h, 'name ' || range AS s FROM range({PROGRESS_ROWS})"
CANCEL_SQL = "SELECT range AS i, hash(range) AS h, 'name ' || range AS s FROM range(50000000)"
SLOW_SQL = "SELECT count(*) FROM range(100000000) a, range(1000) b"


async def _cancel_times(rt, ctx, repeat: int) -> dict[str, list[float]]:
    """Cancel to worker stopped: mid-write of an offload, and inside a slow statement."""
    from datadesk.offload.pipeline import OffloadCapability

    spec = rt.tools.get("sql_query").spec
    write, query = [], []
    for _ in range(repeat):
        args = json.dumps({"sql": CANCEL_SQL})
        result = await rt.tools.run("sql_query", args, ctx)
        reports: list[dict] = []
        task = asyncio.create_task(rt.offload.process(spec, result, ctx.thread, ctx.origin("tool", spec.name, args),
                                                      OffloadCapability(True), progress=lambda **f: reports.append(f)))
        while not reports or reports[-1]["rows"] < 2_000_000:
            await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # returns once the writer thread has stopped
        write.append(time.perf_counter() - t0)
        task = asyncio.create_task(rt.tools.run("sql_query", json.dumps({"sql": SLOW_SQL}), ctx))
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        query.append(time.perf_counter() - t0)
    left = [p.name for p in ctx.thread.artifacts_dir.iterdir() if p.name != ".lock"]
    if left:
        raise SystemExit(f"a cancelled call left {left}")
    return {"write": write, "query": query}


async def _progress_costs(rt, ctx, repeat: int) -> dict[str, list[float]]:
    """Offload wall time of a 10 M-row result without progress, with it as shipped, per batch."""
    from datadesk.offload.pipeline import OffloadCapability
    from datadesk.offload.worker import PROGRESS_INTERVAL_S

    spec, args = rt.tools.get("sql_query").spec, json.dumps({"sql": PROGRESS_SQL})
    times: dict[str, list[float]] = {"none": [], "every_0.5s": [], "every_batch": []}
    counts: dict[str, int] = {k: 0 for k in times}
    for _ in range(repeat):
        for mode in times:  # interleaved, so drift hits every mode alike
            rt.offload.progress_interval_s = 0.0 if mode == "every_batch" else PROGRESS_INTERVAL_S
            seen: list[int] = []
            cb = None if mode == "none" else (lambda **f: seen.append(f["rows"]))
            t0 = time.perf_counter()
            result = await rt.tools.run("sql_query", args, ctx)
            out = await rt.offload.process(spec, result, ctx.thread, ctx.origin("tool", spec.name, args),
                                           OffloadCapability(True), progress=cb)
            times[mode].append(time.perf_counter() - t0)
            counts[mode] = len(seen)
            rt.offload.store.discard(ctx.thread, out.artifact)
    rt.offload.progress_interval_s = PROGRESS_INTERVAL_S
    return {"times": times, "reports": counts}


def case_cancel(runtime, repeat: int) -> dict[str, Any]:
    """Both measurements in this process; `runtime` is (Runtime, ToolContext) of a bench home."""
    rt, ctx = runtime
    cancel = asyncio.run(_cancel_times(rt, ctx, repeat))
    progress = asyncio.run(_progress_costs(rt, ctx, max(3, repeat)))

    def summary(xs: list[float]) -> dict[str, float]:
        return {"median_s": round(statistics.median(xs), 4), "max_s": round(max(xs), 4), "n": len(xs)}

    medians = {k: statistics.median(v) for k, v in progress["times"].items()}
    return {"cancel_mid_write": summary(cancel["write"]), "cancel_in_query": summary(cancel["query"]),
            "progress": {k: {**summary(v), "reports": progress["reports"][k],
                             "overhead_pct": round((medians[k] / medians["none"] - 1) * 100, 1)}
                         for k, v in progress["times"].items()}}


def print_cancel(c: dict[str, Any]) -> None:
    print(f"\nCancel to worker stopped (nothing left behind), {c['cancel_mid_write']['n']} runs each")
    print(f"{'where':<44}{'median s':>10}{'max s':>9}")
    for label, key in (("mid-write of a 50,000,000-row offload", "cancel_mid_write"),
                       ("inside a slow DuckDB statement (interrupt)", "cancel_in_query")):
        print(f"{label:<44}{c[key]['median_s']:>10.4f}{c[key]['max_s']:>9.4f}")
    print(f"\nProgress reports on the offload of {PROGRESS_ROWS:,} rows (median wall time, tool + pipeline)")
    print(f"{'progress':<16}{'median s':>10}{'overhead':>10}{'reports':>9}")
    for k, v in c["progress"].items():
        print(f"{k:<16}{v['median_s']:>10.4f}{v['overhead_pct']:>9.1f}%{v['reports']:>9}")
