"""Benchmark: platform overhead of one turn, and tail reads of long thread logs.

    python bench/turn_overhead.py [--tiny] [--turns N] [--records N]

1. Turn overhead: full turns through the real HTTP API (in-process ASGI
   client), the real store and the scripted model. Model time (from the first
   to the last event the model yields) and tool time (the real DuckDB query)
   are measured inside and subtracted, leaving what DataDesk itself costs:
   auth, thread lookup, record appends, context building, token counting, the
   manifest, SSE encoding.
2. Tail read: newest 50 records of a 100,000-record log vs a 100-record log.
3. Re-attach (what a reload costs): a turn parked in a tool after N events, two app
   "workers" (two runtimes on one data directory, each under uvicorn on 127.0.0.1): the time
   from `GET /api/threads/{tid}/events` to the newest event, from the start of the turn and
   with `Last-Event-ID`, in the worker running the turn (memory) and in the other one (the
   thread's events.jsonl); then the latency of a live `tool.progress` event to a re-attached
   client in each, and the bytes kept for the turn. With `--browser`: the real server, the web
   UI in Chromium (Playwright) and a python cell printing every 0.2 s in the local sandbox: the
   time from `page.reload()` to the running card showing the output replayed.

Prints a table and writes JSON to bench/results/turn_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT))  # tests/clusterkit.py: the cluster set's real servers

from datadesk.composition import Runtime  # noqa: E402
from datadesk.domain.records import Record  # noqa: E402
from datadesk.llm.base import ModelDelta  # noqa: E402
from datadesk.llm.scripted import ScriptedModel, ScriptStep, tool_step  # noqa: E402
from datadesk.settings import SandboxSettings, Settings, StoreSettings, SummarySettings  # noqa: E402
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


def bench_turns(home: Path, turns: int, with_tool: bool, memory_facts: int = 0, fsync: str = "turn",
                cluster: "ClusterRun | None" = None) -> dict[str, Any]:
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
    settings = Settings(home=home, sandbox=SandboxSettings(backend="none"),
                        summary=SummarySettings(enabled=False), store=StoreSettings(fsync=fsync))
    if cluster is not None:
        cluster.apply(settings)
    rt = Runtime(settings=settings, model=model)
    name = f"bench{int(with_tool)}m{memory_facts}{fsync}"
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
            mark = cluster.statements() if cluster is not None else None
            t0 = time.perf_counter()
            resp = client.post(f"/api/threads/{tid}/messages", json={"content": f"question {i}"}, headers=headers)
            total = time.perf_counter() - t0
            if cluster is not None:
                cluster.count_turn(mark)
            assert resp.status_code == 200 and '"status":"ok"' in resp.text, resp.text[-300:]
            tool_s = 0.0
            for rec in rt.threads.get(tid, name, ["demo"]).tail(2):
                if rec.role == "tool":
                    tool_s += (rec.meta or {}).get("duration_ms", 0.0) / 1000
            totals.append(total * 1000)
            tool_ms.append(tool_s * 1000)
            overheads.append((total - model.seconds - tool_s) * 1000)
        counted = cluster.take_counts(turns) if cluster is not None else {}
    rt_stop(rt)
    return {
        "set": "cluster" if cluster is not None else "embedded",
        **counted,
        "turns": turns,
        "with_tool": with_tool,
        "memory_facts": memory_facts,
        "fsync": fsync,
        "overhead_ms_median": round(statistics.median(overheads), 2),
        "overhead_ms_p90": round(sorted(overheads)[int(0.9 * (len(overheads) - 1))], 2),
        "overhead_ms_first": round(overheads[0], 2),
        "overhead_ms_last": round(overheads[-1], 2),
        "total_ms_median": round(statistics.median(totals), 2),
        "tool_ms_median": round(statistics.median(tool_ms), 2),
    }


def rt_stop(rt: Runtime) -> None:
    """Close what the runtime holds (the cluster set's connections), as the app's shutdown does."""
    if rt.cluster is not None:
        rt.turns.close()
        rt.cluster.close()


class ClusterRun:
    """A real PostgreSQL 15 (with pg_stat_statements) and a real SeaweedFS S3 server on loopback
    (tests/clusterkit.py), a fresh database and bucket per configuration, and a count of the
    statements the app sends per turn: all of them, and without transaction control
    (BEGIN/COMMIT/ROLLBACK), from pg_stat_statements."""

    def __init__(self, root: Path) -> None:
        from tests.clusterkit import start_cluster_postgres, start_seaweedfs

        import tempfile

        self.pg_root = Path(tempfile.mkdtemp(prefix="datadesk-bench-pg-"))  # under /tmp: its user can reach it
        self.pg = start_cluster_postgres(self.pg_root)
        try:
            self.s3 = start_seaweedfs(root / "s3")
        except BaseException:
            self.pg.stop()
            raise
        self.url = ""
        self.counts: list[tuple[int, int]] = []

    def apply(self, settings: Settings) -> None:
        import os

        import msgspec

        self.url = self.pg.new_database()
        self.pg.admin("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        bucket = self.s3.new_bucket()
        os.environ.update({k: v for k, v in bucket.env().items() if k.startswith("AWS_")})
        settings.cluster = msgspec.structs.replace(settings.cluster, database_url=self.url)
        settings.storage = msgspec.structs.replace(settings.storage, url=bucket.url, endpoint=bucket.endpoint)
        settings.server = msgspec.structs.replace(settings.server, secret_key="bench-secret-" + "k" * 32)
        self.counts = []

    def statements(self) -> tuple[int, int]:
        """(all calls, calls other than transaction control) so far in this configuration's database."""
        row = self.pg.admin(
            "SELECT coalesce(sum(s.calls), 0)::bigint AS all_calls, coalesce(sum(s.calls) FILTER (WHERE NOT"
            " s.query ~* '^\\s*(begin|commit|rollback|start transaction)'), 0)::bigint AS work"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
            (self.url.rsplit("/", 1)[1],))[0]
        return int(row["all_calls"]), int(row["work"])

    def count_turn(self, mark: tuple[int, int] | None) -> None:
        now = self.statements()
        assert mark is not None
        self.counts.append((now[0] - mark[0], now[1] - mark[1]))

    def take_counts(self, turns: int) -> dict[str, Any]:
        alls = sorted(c[0] for c in self.counts)
        work = sorted(c[1] for c in self.counts)
        return {"sql_statements_per_turn_median": statistics.median(alls),
                "sql_statements_per_turn_max": alls[-1],
                "sql_statements_per_turn_without_begin_commit_median": statistics.median(work)}

    def stop(self) -> None:
        import shutil

        self.s3.stop()
        self.pg.stop()
        shutil.rmtree(self.pg_root, ignore_errors=True)


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def read_until(client: Any, url: str, want: int, last_id: str | None = None) -> tuple[float, float]:
    """(ms to the first event, ms to event `want`) of one re-attach."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    t0 = time.perf_counter()
    first = None
    with client.stream("GET", url, headers=headers) as resp:
        assert resp.status_code == 200, resp.status_code
        for line in resp.iter_lines():
            if line.startswith("id:"):
                first = first or (time.perf_counter() - t0) * 1000
                if int(line.rsplit(":", 1)[1]) >= want:
                    return first, (time.perf_counter() - t0) * 1000
    raise AssertionError("the stream ended early")


def live_latency(client: Any, url: str, last_id: str, pulse: threading.Event, reps: int) -> list[float]:
    """ms from a tool's report to its `tool.progress` at a re-attached client."""
    out = []
    with client.stream("GET", url, headers={"Last-Event-ID": last_id}) as resp:
        lines = resp.iter_lines()
        for _ in range(reps):
            pulse.set()
            for line in lines:
                if line.startswith("data:") and '"message"' in line:
                    out.append((time.perf_counter() - float(json.loads(line[5:])["message"])) * 1000)
                    break
    return out


def bench_reattach(home: Path, events: int, reps: int) -> dict[str, Any]:
    """See the module docstring (3)."""
    import httpx

    from datadesk.api.app import create_app
    from datadesk.tools.registry import ToolResult, ToolSpec

    release, parked, pulse = threading.Event(), threading.Event(), threading.Event()
    model = ScriptedModel([ScriptStep(text="x" * 8 * events, tool_calls=tool_step("park", {}).tool_calls), "released"],
                          chunk_size=8)
    settings = Settings(home=home, sandbox=SandboxSettings(backend="none"), summary=SummarySettings(enabled=False))
    rt_a, rt_b = Runtime(settings=settings, model=model), Runtime(settings=settings, model=ScriptedModel([]))

    async def park(args: Any, ctx: Any) -> ToolResult:
        parked.set()
        while not release.is_set():
            if pulse.is_set():
                pulse.clear()
                ctx.report(message=repr(time.perf_counter()))
            await asyncio.sleep(0.001)
        return ToolResult("released")

    rt_a.tools.register(ToolSpec(name="park", description="parks", parameters={"type": "object"}), park)
    name = f"reattach{events}"
    _, token = rt_a.users.add(name, ["demo"], [])
    with served(create_app(rt_a)) as base_a, served(create_app(rt_b)) as base_b, \
            httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        tid = c.post(f"{base_a}/api/threads", json={}).json()["id"]
        poster = threading.Thread(target=lambda: c.post(f"{base_a}/api/threads/{tid}/messages",
                                                        json={"content": "go"}), daemon=True)
        poster.start()
        assert parked.wait(30)
        turn = rt_a.turns.get(tid)
        time.sleep(0.5)  # the text pieces are in the file
        n = turn.journal.n
        last = f"{turn.turn_id}:{n - 1}"
        row: dict[str, Any] = {"events": n, "kept_kb": round(turn.journal.kept_bytes / 1024, 1),
                               "file_kb": round(rt_a.threads.get(tid, name, ["demo"]).events_path.stat().st_size
                                                / 1024, 1)}
        for side, base in (("same_worker", base_a), ("other_worker", base_b)):
            url = f"{base}/api/threads/{tid}/events"
            full = [read_until(c, url, n) for _ in range(reps)]
            tail = [read_until(c, url, n, last)[1] for _ in range(reps)]
            row[side] = {"from_start_first_ms": round(statistics.median(f for f, _ in full), 2),
                         "from_start_all_ms": round(statistics.median(a for _, a in full), 2),
                         "last_event_id_ms": round(statistics.median(tail), 2),
                         "live_progress_ms": round(statistics.median(
                             live_latency(c, url, f"{turn.turn_id}:{n}", pulse, max(5, reps // 2))), 2)}
            n = rt_a.turns.get(tid).journal.n
        release.set()
        poster.join(30)
    return row


def bench_browser_reload(reps: int) -> dict[str, Any]:
    """See the module docstring (3, `--browser`)."""
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, login, run_server
    from tests.fakes.openai_server import FakeOpenAIServer

    code = "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
    card = "details.tool-card[data-tool='python']"
    llm = FakeOpenAIServer().start()
    llm.add_tool_calls([{"id": "call_long", "name": "python", "arguments": {"code": code}}])
    times = []
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(tmp), llm) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page()
        login(page, srv)
        page.click("#new-thread")
        page.wait_for_selector("#messages .empty")
        page.fill("#input", "Run the long job")
        page.press("#input", "Enter")
        page.wait_for_selector(f"{card}.running .live-output", state="attached", timeout=60_000)
        for _ in range(reps):
            t0 = time.perf_counter()
            page.reload()
            page.wait_for_selector(f"{card}.running .live-output", state="attached", timeout=30_000)
            times.append((time.perf_counter() - t0) * 1000)
        page.click("#stop")
        page.wait_for_selector("#send:not([hidden])")
        browser.close()
    llm.stop()
    return {"reloads": reps, "reload_to_card_ms_median": round(statistics.median(times), 1),
            "reload_to_card_ms_max": round(max(times), 1)}


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


def bench_cluster(tmp: Path, turns: int) -> list[dict[str, Any]] | str:
    """The text turn and the sql_query turn again on the cluster set (PostgreSQL + S3), or why not."""
    from tests.clusterkit import cluster_problem

    problem = cluster_problem()
    if problem:
        return f"skipped: {problem}"
    run = ClusterRun(tmp / "cluster")
    try:
        rows = []
        for with_tool in (False, True):
            home = tmp / f"cluster-home-{int(with_tool)}"
            ensure_demo_workspace(Layout(home))
            rows.append(bench_turns(home, turns, with_tool, cluster=run))
        return rows
    finally:
        run.stop()


def print_cluster(embedded: list[dict[str, Any]], cluster: list[dict[str, Any]] | str) -> None:
    print("\nThe same turns on the cluster set (PostgreSQL + S3 on loopback) beside the embedded set")
    if isinstance(cluster, str):
        print(f"  {cluster}")
        return
    print(f"{'turn kind':<24}{'embedded ms':>12}{'cluster ms':>12}{'ratio':>7}{'SQL/turn':>10}{'max':>6}"
          f"{'w/o BEGIN/COMMIT':>18}")
    for row in cluster:
        base = next(r for r in embedded if r["with_tool"] == row["with_tool"] and r["fsync"] == "turn"
                    and not r["memory_facts"])
        kind = "sql_query" if row["with_tool"] else "text answer"
        ratio = row["overhead_ms_median"] / max(base["overhead_ms_median"], 1e-9)
        row["ratio_to_embedded"] = round(ratio, 2)
        print(f"{kind:<24}{base['overhead_ms_median']:>12}{row['overhead_ms_median']:>12}{ratio:>7.2f}"
              f"{row['sql_statements_per_turn_median']:>10}{row['sql_statements_per_turn_max']:>6}"
              f"{row['sql_statements_per_turn_without_begin_commit_median']:>18}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--browser", action="store_true", help="also time a reload of the web UI (Chromium)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "turn_overhead.json")
    args = ap.parse_args()
    turns, records, reps = (5, 2_000, 5) if args.tiny else (args.turns, args.records, 50)

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "var"
        ensure_demo_workspace(Layout(home))
        # store.fsync: the same turn with the log flushed never, once per turn (the default), per record
        turn_rows = [bench_turns(home, turns, False), *(bench_turns(home, turns, True, fsync=mode)
                                                        for mode in ("never", "turn", "record"))]
        cfg = Layout(home).workspace_config("demo")
        cfg.write_text(cfg.read_text() + "memory = true\n")  # the same turn with memory injected
        turn_rows.append(bench_turns(home, turns, False, memory_facts=20))
        cluster_rows = bench_cluster(Path(tmp), turns)
        tail_rows = bench_tail(Path(tmp), [100, records], reps)
        browser = bench_browser_reload(3 if args.tiny else 10) if args.browser else None
        reattach_rows = [bench_reattach(home, k, 5 if args.tiny else 20) for k in ((200,) if args.tiny else (200, 5_000))]

    print("\nPlatform overhead per turn (scripted model; model and tool time excluded)")
    print(f"{'turn kind':<24}{'turns':>6}{'median ms':>11}{'p90 ms':>9}{'first':>8}{'last':>8}{'tool ms':>9}")
    for r in turn_rows:
        kind = "text answer" if not r["with_tool"] else f"sql_query, fsync={r['fsync']}"
        if r["memory_facts"]:
            kind = f"text + {r['memory_facts']} memory facts"
        print(f"{kind:<24}{r['turns']:>6}{r['overhead_ms_median']:>11}{r['overhead_ms_p90']:>9}"
              f"{r['overhead_ms_first']:>8}{r['overhead_ms_last']:>8}{r['tool_ms_median']:>9}")
    print_cluster(turn_rows, cluster_rows)
    print("\nNewest 50 records of a thread log")
    print(f"{'records':>10}{'file MB':>9}{'tail(50) ms':>13}{'full read ms':>14}")
    for r in tail_rows:
        print(f"{r['records']:>10}{r['file_mb']:>9}{r['tail50_ms_median']:>13}{r['full_read_ms']:>14}")
    ratio = tail_rows[1]["tail50_ms_median"] / max(tail_rows[0]["tail50_ms_median"], 1e-9)
    print(f"\ntail(50) on {records:,} records vs 100 records: {ratio:.2f}x")
    print("\nRe-attach to a running turn (GET .../events; median ms to the first / to the newest event)")
    print(f"{'events':>7}{'kept KB':>9}{'file KB':>9}  {'worker':<13}{'first':>7}{'all':>8}{'Last-Event-ID':>15}"
          f"{'live progress':>15}")
    for r in reattach_rows:
        for side in ("same_worker", "other_worker"):
            x = r[side]
            print(f"{r['events']:>7}{r['kept_kb']:>9}{r['file_kb']:>9}  {side.replace('_', ' '):<13}"
                  f"{x['from_start_first_ms']:>7}{x['from_start_all_ms']:>8}{x['last_event_id_ms']:>15}"
                  f"{x['live_progress_ms']:>15}")
    if browser:
        print(f"\nWeb UI: reload -> running card with its output replayed: median {browser['reload_to_card_ms_median']} ms,"
              f" max {browser['reload_to_card_ms_max']} ms ({browser['reloads']} reloads)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tiny": args.tiny, "turns": turn_rows, "cluster_turns": cluster_rows,
                                    "tail": tail_rows,
                                    "tail_ratio": round(ratio, 3), "reattach": reattach_rows, "browser_reload": browser,
                                    "python": sys.version.split()[0]},
                                   indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
