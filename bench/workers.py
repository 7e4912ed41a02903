"""Benchmark: turns per second and platform overhead with 1 and 2 app workers.

    python bench/workers.py [--tiny] [--threads N] [--turns N] [--delay S]

For each worker count, a real `datadesk serve --workers N` subprocess on
127.0.0.1, the real OpenAI client against the fake model server
(tests/fakes/tool_loop.py: every turn is one `python` tool call, then the
answer; `--delay` seconds before each streamed event stand for the model's
latency) and the local sandbox. `--threads` threads each get two warm-up turns
(the kernel starts, both workers' code paths warm up), then `--turns` measured turns, all threads at once, one
client per thread, each message on a new connection (so the workers share the
load).

Overhead: the turn's wall time at the client minus the fake model's own time
(measured inside the fake server for that turn's requests). What is left is
DataDesk plus the python cell itself (a counter: well under a millisecond of
kernel work): HTTP, auth, locks, log appends, context building, the OpenAI
client, the kernel table, attaching to another worker's kernel, the kernel
round trip, SSE, and the waiting for a CPU under load. The `exec` column is the
python tool's measured execution (request to idle, as the worker's event loop
sees it, so it grows when the worker is busy).

Prints a table and writes JSON to bench/results/workers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

import httpx  # noqa: E402

from datadesk.store.layout import Layout  # noqa: E402
from datadesk.store.users import UserStore  # noqa: E402
from datadesk.store.workspaces import ensure_demo_workspace  # noqa: E402
from tests.conftest import parse_sse  # noqa: E402
from tests.fakes.tool_loop import ToolLoopServer  # noqa: E402
from tests.integration.test_workers import serve_workers  # noqa: E402


def toml(run_dir: str, threads: int) -> str:
    kernels = threads + 8  # one per thread, plus the pools
    return f"""
[chat]
max_turns_per_user = {threads + 5}
[sandbox]
backend = "local"
pool_size = 1
run_dir = "{run_dir}"
max_kernels_per_user = {kernels}
max_kernels = {kernels}
memory_mb = 512
[summary]
enabled = false
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def one_turn(base: str, token: str, tid: str, text: str, fake: ToolLoopServer) -> dict[str, Any]:
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection: any worker may take it
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=300,
                                 limits=limits) as c:
        t0 = time.perf_counter()
        r = await c.post(f"/api/threads/{tid}/messages", json={"content": text})
        wall = time.perf_counter() - t0
    events = parse_sse(r.text) if r.status_code == 200 else []
    ok = bool(events) and events[-1][0] == "done" and events[-1][1].get("status") == "ok"
    exec_s = sum((d.get("meta") or {}).get("duration_ms", 0.0) for e, d in events if e == "tool.finished") / 1000
    model_s = fake.model_seconds.get(text, 0.0)
    return {"status": r.status_code, "ok": ok, "wall": wall, "model": model_s, "exec": exec_s,
            "overhead": wall - model_s}


async def drive(base: str, token: str, tids: list[str], turns: int, fake: ToolLoopServer,
                tag: str) -> tuple[list[dict[str, Any]], float]:
    async def thread_loop(tid: str) -> list[dict[str, Any]]:
        return [await one_turn(base, token, tid, f"{tag} {tid} turn {i}", fake) for i in range(turns)]

    t0 = time.perf_counter()
    per_thread = await asyncio.gather(*(thread_loop(t) for t in tids))
    return [r for rows in per_thread for r in rows], time.perf_counter() - t0


def run(workers: int, threads: int, turns: int, delay: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ddbw-") as tmp:
        home = Path(tmp) / "var"
        layout = Layout(home)
        ensure_demo_workspace(layout)
        _, token = UserStore(layout).add("bench", ["demo"], ["code_execution"])
        run_dir = tempfile.mkdtemp(prefix="ddb-", dir="/tmp")
        with ToolLoopServer(delay_s=delay) as fake, \
                serve_workers(home, fake, workers, toml(run_dir, threads), log_name=f"serve-{workers}.log") as (base, log):
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
                tids = [c.post("/api/threads", json={"title": f"b{i}"}).json()["id"] for i in range(threads)]
            # two warm-up turns per thread: every kernel started, both workers' code paths warm
            warm, warm_s = asyncio.run(drive(base, token, tids, 2, fake, "warm"))
            rows, elapsed = asyncio.run(drive(base, token, tids, turns, fake, "measured"))
            attaches = log.read_text().count("attached to kernel")
    bad = [r for r in warm + rows if not r["ok"]]
    if bad:
        raise SystemExit(f"{len(bad)} turns failed with {workers} worker(s): {bad[:3]}")
    over = [r["overhead"] * 1000 for r in rows]
    return {
        "workers": workers, "threads": threads, "turns": len(rows), "model_delay_s": delay,
        "turns_per_s": round(len(rows) / elapsed, 2),
        "overhead_ms_p50": round(statistics.median(over), 1),
        "overhead_ms_p95": round(pct(over, 0.95), 1),
        "wall_ms_p50": round(statistics.median(r["wall"] * 1000 for r in rows), 1),
        "wall_ms_p95": round(pct([r["wall"] * 1000 for r in rows], 0.95), 1),
        "model_ms_p50": round(statistics.median(r["model"] * 1000 for r in rows), 1),
        "exec_ms_p50": round(statistics.median(r["exec"] * 1000 for r in rows), 2),
        "warmup_s": round(warm_s, 2),
        "attaches": attaches,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--threads", type=int, default=50)
    ap.add_argument("--turns", type=int, default=4, help="measured turns per thread")
    ap.add_argument("--delay", type=float, default=0.05, help="seconds before each streamed model event")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "workers.json")
    args = ap.parse_args()
    threads, turns, delay = (4, 2, 0.01) if args.tiny else (args.threads, args.turns, args.delay)
    rows = [run(w, threads, turns, delay) for w in (1, 2)]
    print(f"\nTurns with the local sandbox and the fake model ({threads} threads at once, one python call "
          f"per turn, {delay:g} s per model event)")
    print(f"{'workers':>8}{'turns':>7}{'turns/s':>9}{'overhead p50':>14}{'p95 ms':>8}{'wall p50':>10}"
          f"{'p95 ms':>8}{'model p50':>11}{'exec p50':>10}{'attaches':>10}")
    for r in rows:
        print(f"{r['workers']:>8}{r['turns']:>7}{r['turns_per_s']:>9}{r['overhead_ms_p50']:>14}"
              f"{r['overhead_ms_p95']:>8}{r['wall_ms_p50']:>10}{r['wall_ms_p95']:>8}{r['model_ms_p50']:>11}"
              f"{r['exec_ms_p50']:>10}{r['attaches']:>10}")
    ratio = rows[1]["turns_per_s"] / max(rows[0]["turns_per_s"], 1e-9)
    print(f"\n2 workers vs 1: {ratio:.2f}x turns per second")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tiny": args.tiny, "rows": rows, "speedup": round(ratio, 3),
                                    "python": sys.version.split()[0]}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
