"""Benchmark: a large MCP answer (1,000,000 rows x 10 columns) from a real stdio MCP server, through
the real MCP client and the real offload pipeline, into a Parquet artifact (issue 26).

    python bench/mcp_large.py [--tiny] [--rows N] [--limit-mb MB] [--out PATH]

The fake server (tests/fakes/mcp_server.py, tool `table`) writes its answer, a JSON array of
objects in one text content, piece by piece, so the server's own memory is no part of the
measure. Each case runs in a fresh child process (its RSS is its own): it starts the app's
`Runtime` (sandbox off), connects the server, calls `fake__table`, runs the result through
`Runtime.offload.process`, then checks the artifact's row count and the sum of its `id` column.

Measured per case: the answer's size (the JSON-RPC line, as the server reports it), wall time of
the call and of the offload, the child's peak RSS above its RSS before the call (VmHWM, reset
through /proc/self/clear_refs, and sampled VmRSS), and the peak of its private memory
(RssAnon, sampled every 5 ms; file pages of a spooled answer are page cache, not this), and
whether the answer was spooled to disk (a temp file seen in the thread's artifacts folder).

Prints a table and writes bench/results/mcp_large.json (`--tiny`: mcp_large-tiny.json). The
numbers before issue 26 (the answer held in memory, which needed the limit raised past it) come
from a checkout of that time: `PYTHONPATH=<that checkout>/platform python bench/mcp_large.py
--limit-mb 1024 --out bench/results/mcp_large-before.json`. Measured on a shared 2-CPU machine
(load about 7): before, 16.7 s and peak RSS +699 MB (+592 MB private); after, 13.1 s and
+189 MB (+96 MB private; the rest is page cache of the mapped files, dropped as they are read).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


# ------------------------------------------------------------------------------ the child
def _status_kb() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon"):
                out[key] = int(value.split()[0])
    return out


class Sampler:
    """Peak VmRSS and RssAnon over a block, sampled; VmHWM read at the end."""

    def __init__(self) -> None:
        self.start = self.peak = {}
        self._stop = threading.Event()
        self.spooled = False
        self.watch: Path | None = None

    def __enter__(self) -> "Sampler":
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
        except OSError:
            pass
        self.start = _status_kb()
        self.peak = dict(self.start)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            now = _status_kb()
            for k, v in now.items():
                self.peak[k] = max(self.peak.get(k, 0), v)
            if self.watch is not None and not self.spooled and self.watch.is_dir():
                self.spooled = any(p.name.startswith(".mcp-") for p in self.watch.iterdir())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        end = _status_kb()
        self.peak["VmHWM"] = max(self.peak.get("VmHWM", 0), end.get("VmHWM", 0))

    def growth_mb(self, key: str) -> float:
        base = self.start.get("VmRSS" if key == "VmHWM" else key, 0)
        return round((self.peak.get(key, 0) - base) / 1024, 1)


async def child(rows: int, limit_mb: int, home: Path) -> dict[str, Any]:
    import logging

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from datadesk.composition import Runtime
    from datadesk.llm.scripted import ScriptedModel
    from datadesk.offload.pipeline import OffloadCapability
    from datadesk.settings import LimitsSettings, SandboxSettings, Settings
    from datadesk.store.threads import Thread
    from datadesk.tools.mcp.manager import MCPServerConfig
    from datadesk.tools.registry import ToolContext

    sizes: list[int] = []

    class Sizes(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if msg.startswith("table: ") and msg.endswith(" bytes"):
                sizes.append(int(msg.split()[1]))

    logging.getLogger("datadesk.mcp.fake").addHandler(Sizes())
    logging.getLogger("datadesk.mcp.fake").setLevel(logging.INFO)
    settings = Settings(home=home, sandbox=SandboxSettings(backend="none"),
                        limits=LimitsSettings(mcp_result_max_mb=limit_mb))
    rt = Runtime(settings=settings, model=ScriptedModel())
    fake = [sys.executable, str(ROOT / "tests" / "fakes" / "mcp_server.py")]
    await rt.mcp.start_workspace("demo", {"fake": MCPServerConfig(command=fake, timeout_s=600)}, home)
    tdir = home / "thread"
    tdir.mkdir(parents=True, exist_ok=True)
    c = ToolContext(thread=Thread(tdir), workspace="demo", user="ann", permissions=frozenset({"code_execution"}),
                    call_id="c1")
    args = json.dumps({"n": rows})
    out: dict[str, Any] = {"rows": rows, "limit_mb": limit_mb}
    try:
        # a warm-up of 20,000 rows first: the lazy imports and first allocations are not the answer's
        warm = await rt.tools.run("fake__table", json.dumps({"n": 20_000}), c)
        wspec = rt.tools.get("fake__table", "demo").spec
        await rt.offload.process(wspec, warm, c.thread, c.origin("tool", "fake__table", "{}"), OffloadCapability(True))
        for p in c.thread.artifacts_dir.iterdir():
            p.unlink()
        sizes.clear()
        with Sampler() as s:
            s.watch = c.thread.artifacts_dir
            t0 = time.perf_counter()
            result = await rt.tools.run("fake__table", args, c)
            t1 = time.perf_counter()
            spec = rt.tools.get("fake__table", "demo").spec
            outcome = await rt.offload.process(spec, result, c.thread, c.origin("tool", "fake__table", args),
                                               OffloadCapability(True))
            t2 = time.perf_counter()
        for _ in range(40):  # the server's stderr line with the answer's size
            if sizes:
                break
            await asyncio.sleep(0.05)
        out.update(call_s=round(t1 - t0, 2), offload_s=round(t2 - t1, 2), total_s=round(t2 - t0, 2),
                   peak_rss_growth_mb=s.growth_mb("VmHWM"), peak_anon_growth_mb=s.growth_mb("RssAnon"),
                   spooled=s.spooled, answer_mb=round(sizes[-1] / 2**20, 1) if sizes else None)
        art = outcome.artifact
        if art is None:
            out.update(outcome="refused" if outcome.result.is_error else "no artifact",
                       message=outcome.result.content[:160])
        else:
            table = pq.read_table(c.thread.artifacts_dir / art.file, columns=["id"])
            out.update(outcome="artifact", artifact_rows=art.rows,
                       ok=art.rows == rows and pc.sum(table["id"]).as_py() == rows * (rows - 1) // 2)
        left = [p.name for p in c.thread.artifacts_dir.iterdir() if p.name.startswith(".")]
        out["temp_files_left"] = len(left)
    finally:
        await rt.mcp.stop()
    return out


# ----------------------------------------------------------------------------- the parent
def run_case(rows: int, limit_mb: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mcp-large-") as tmp:
        proc = subprocess.run([sys.executable, __file__, "--child", "--rows", str(rows), "--limit-mb", str(limit_mb),
                               "--home", tmp], capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"the child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(cases: list[dict[str, Any]]) -> None:
    cols = [("rows", "rows", "{:,}"), ("answer MB", "answer_mb", "{}"), ("limit MB", "limit_mb", "{}"),
            ("outcome", "outcome", "{}"), ("spooled", "spooled", "{}"), ("call s", "call_s", "{}"),
            ("offload s", "offload_s", "{}"), ("total s", "total_s", "{}"),
            ("peak RSS +MB", "peak_rss_growth_mb", "{}"), ("peak anon +MB", "peak_anon_growth_mb", "{}"),
            ("exact", "ok", "{}")]
    cells = [[fmt.format(c[k]) if c.get(k) is not None else "-" for _, k, fmt in cols] for c in cases]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, (h, _, _) in enumerate(cols)]
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="CI: 20,000 rows, so the bench does not rot")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--limit-mb", type=int, default=None, help="limits.mcp_result_max_mb (default: the setting's)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.rows, args.limit_mb, args.home))))
        return 0
    from datadesk.settings import LimitsSettings

    rows = args.rows or (20_000 if args.tiny else 1_000_000)
    limit = args.limit_mb or LimitsSettings().mcp_result_max_mb
    started = time.perf_counter()
    load_before = os.getloadavg()
    cases = [run_case(rows, limit)]
    print_table(cases)
    out = args.out or RESULTS / ("mcp_large-tiny.json" if args.tiny else "mcp_large.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    load = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    out.write_text(json.dumps({"tiny": args.tiny, "cpus": os.cpu_count(), "loadavg": load, "cases": cases,
                               "bench_s": round(time.perf_counter() - started, 1)}, indent=2) + "\n")
    print(f"wrote {out}")
    bad = [c for c in cases if c.get("outcome") == "artifact" and not c.get("ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
