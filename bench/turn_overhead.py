"""Benchmark: platform overhead of one turn, and tail reads of long thread logs.

    python bench/turn_overhead.py [--tiny] [--turns N] [--records N]

1. Turn overhead: full turns through the real HTTP API (in-process ASGI
   client), the real store and the scripted model. Model time (from the first
   to the last event the model yields) and tool time (the real DuckDB query)
   are measured inside and subtracted, leaving what DataDesk itself costs:
   auth, thread lookup, record appends, context building, token counting, the
   manifest, SSE encoding.
2. Tail read: newest 50 records of a 100,000-record log vs a 100-record log.

Prints a table and writes JSON to bench/results/turn_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

from datadesk.chat.runtime import Runtime  # noqa: E402
from datadesk.domain.records import Record  # noqa: E402
from datadesk.llm.base import ModelDelta  # noqa: E402
from datadesk.llm.scripted import ScriptedModel, tool_step  # noqa: E402
from datadesk.settings import SandboxSettings, Settings, SummarySettings  # noqa: E402
from datadesk.store.layout import Layout  # noqa: E402
from datadesk.store.threadlog import ThreadLog  # noqa: E402
from datadesk.store.workspaces import ensure_demo_workspace  # noqa: E402


class TimedModel:
    """Wraps a model and adds up the time spent inside its stream."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner, self.name, self.is_demo = inner, inner.name, inner.is_demo
        self.seconds = 0.0

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]):
        gen = self.inner.stream(messages, tools)
        while True:
            t0 = time.perf_counter()
            try:
                ev = await gen.__anext__()
            except StopAsyncIteration:
                self.seconds += time.perf_counter() - t0
                return
            self.seconds += time.perf_counter() - t0
            yield ev


def bench_turns(home: Path, turns: int, with_tool: bool, memory_facts: int = 0) -> dict[str, Any]:
    from litestar.testing import TestClient

    from datadesk.api.app import create_app

    answer = "The answer is 42. " * 20
    steps: list[Any] = []
    for _ in range(turns):
        if with_tool:
            steps.append(tool_step("sql_query", {"sql": "SELECT building_id, sum(kwh) FROM readings "
                                                        "GROUP BY 1 ORDER BY 2 DESC LIMIT 5"}))
        steps.append(answer)
    model = TimedModel(ScriptedModel(steps, chunk_size=16, max_recorded=2))
    rt = Runtime(settings=Settings(home=home, sandbox=SandboxSettings(backend="none"),
                                 summary=SummarySettings(enabled=False)), model=model)
    name = f"bench{int(with_tool)}m{memory_facts}"
    _, token = rt.users.add(name, ["demo"], ["memory"] if memory_facts else [])
    for i in range(memory_facts):  # active facts, injected into every request
        rt.memory.remember("demo", name, f"Preference {i}: report totals of building B{i:02d} in MWh",
                           kind="preference", source="panel", user_asked=True)
    headers = {"Authorization": f"Bearer {token}"}
    totals, overheads, tool_ms = [], [], []
    with TestClient(create_app(rt)) as client:
        tid = client.post("/api/threads", json={}, headers=headers).json()["id"]
        for i in range(turns):
            model.seconds = 0.0
            t0 = time.perf_counter()
            resp = client.post(f"/api/threads/{tid}/messages", json={"content": f"question {i}"}, headers=headers)
            total = time.perf_counter() - t0
            assert resp.status_code == 200 and '"status":"ok"' in resp.text, resp.text[-300:]
            tool_s = 0.0
            for rec in ThreadLog(rt.threads.get(tid, name, ["demo"]).dir / "log.jsonl").tail(2):
                if rec.role == "tool":
                    tool_s += (rec.meta or {}).get("duration_ms", 0.0) / 1000
            totals.append(total * 1000)
            tool_ms.append(tool_s * 1000)
            overheads.append((total - model.seconds - tool_s) * 1000)
    return {
        "turns": turns,
        "with_tool": with_tool,
        "memory_facts": memory_facts,
        "overhead_ms_median": round(statistics.median(overheads), 2),
        "overhead_ms_p90": round(sorted(overheads)[int(0.9 * (len(overheads) - 1))], 2),
        "overhead_ms_first": round(overheads[0], 2),
        "overhead_ms_last": round(overheads[-1], 2),
        "total_ms_median": round(statistics.median(totals), 2),
        "tool_ms_median": round(statistics.median(tool_ms), 2),
    }


def make_log(path: Path, n: int) -> None:
    enc = __import__("msgspec").json.Encoder()
    with open(path, "wb") as fh:
        for i in range(1, n + 1):
            role = ("user", "assistant", "tool")[i % 3]
            fh.write(enc.encode(Record(seq=i, role=role, ts=1.7e9 + i, content="x" * 400,
                                       tool_call_id="c" if role == "tool" else None)) + b"\n")


def bench_tail(tmp: Path, sizes: list[int], reps: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        path = tmp / f"log{n}.jsonl"
        make_log(path, n)
        log = ThreadLog(path)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            got = log.tail(50)
            times.append((time.perf_counter() - t0) * 1000)
            assert len(got) == 50 and got[-1].seq == n
        t0 = time.perf_counter()
        full = sum(1 for _ in log)
        full_ms = (time.perf_counter() - t0) * 1000
        assert full == n
        rows.append({"records": n, "file_mb": round(path.stat().st_size / 1e6, 2),
                     "tail50_ms_median": round(statistics.median(times), 3),
                     "full_read_ms": round(full_ms, 1)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "turn_overhead.json")
    args = ap.parse_args()
    turns, records, reps = (5, 2_000, 5) if args.tiny else (args.turns, args.records, 50)

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "var"
        ensure_demo_workspace(Layout(home))
        turn_rows = [bench_turns(home, turns, False), bench_turns(home, turns, True)]
        cfg = Layout(home).workspace_config("demo")
        cfg.write_text(cfg.read_text() + "memory = true\n")  # the same turn with memory injected
        turn_rows.append(bench_turns(home, turns, False, memory_facts=20))
        tail_rows = bench_tail(Path(tmp), [100, records], reps)

    print("\nPlatform overhead per turn (scripted model; model and tool time excluded)")
    print(f"{'turn kind':<22}{'turns':>6}{'median ms':>11}{'p90 ms':>9}{'first':>8}{'last':>8}{'tool ms':>9}")
    for r in turn_rows:
        kind = "text answer" if not r["with_tool"] else "sql_query + answer"
        if r["memory_facts"]:
            kind = f"text + {r['memory_facts']} memory facts"
        print(f"{kind:<22}{r['turns']:>6}{r['overhead_ms_median']:>11}{r['overhead_ms_p90']:>9}"
              f"{r['overhead_ms_first']:>8}{r['overhead_ms_last']:>8}{r['tool_ms_median']:>9}")
    print("\nNewest 50 records of a thread log")
    print(f"{'records':>10}{'file MB':>9}{'tail(50) ms':>13}{'full read ms':>14}")
    for r in tail_rows:
        print(f"{r['records']:>10}{r['file_mb']:>9}{r['tail50_ms_median']:>13}{r['full_read_ms']:>14}")
    ratio = tail_rows[1]["tail50_ms_median"] / max(tail_rows[0]["tail50_ms_median"], 1e-9)
    print(f"\ntail(50) on {records:,} records vs 100 records: {ratio:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tiny": args.tiny, "turns": turn_rows, "tail": tail_rows,
                                    "tail_ratio": round(ratio, 3), "python": sys.version.split()[0]},
                                   indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
