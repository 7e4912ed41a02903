"""Benchmark: the Python sandbox (docker backend by default).

    python bench/sandbox.py [--tiny] [--runs N] [--backend docker|local] [--rows N] [--cpus C]

Measured, each as median and p95 over `--runs` runs (30; `--tiny`: 3 runs and
100,000 rows):

1. Warm execute overhead of `1+1` on a warm kernel, at three layers:
   (a) the backend alone (`backend.execute`), (b) the registry
   (`KernelRegistry.execute`: session lookup, lock, data-link sync, liveness),
   (c) the python tool (`rt.tools.run("python", ...)`: plus the re-query check,
   result formatting and /outputs collection). (c) runs back to back (the
   liveness cache of the docker backend stays fresh) and again with a pause
   longer than that cache between calls, as between the turns of a real chat.
2. First execution on a new thread: with the pool (pool_size=1; a ready pooled
   kernel before each run, then the first `1+1` of a new thread through the
   tool), once as it runs in production (the pool refill starts during the
   execution) and once with the refill held back until after it; and without
   the pool (pool_size=0: includes the container start).
3. Memory of an idle kernel, bare and after `import pandas, duckdb`: docker
   stats (usage minus inactive file cache, as `docker stats` shows it), or the
   kernel's RSS for the local backend.
4. A GROUP BY over N rows (10,000,000) of Parquet with DuckDB in the kernel:
   the file is written into the thread's artifacts dir on the host, so the
   kernel reads it at /data through the data links. The first query is
   reported apart from the median of the rest.

5. Recovery (bench/sandbox_recovery.py): deadline -> working kernel on the interrupt and the
   restart path, cancel -> cell stopped, and the delay of live output (print -> tool.progress).
   `--only recovery` runs just this part.

Each timed row also gets a breakdown: time spent, within the measured call
only (not in the background pool-refill task), in the liveness checks (and how
many hit the docker API), data-link sync, /outputs collection, the ZMQ round
trip and the container start.

Prints a table and writes JSON to bench/results/sandbox.json. Removes every
container it started.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import functools
import json
import logging
import math
import os
import platform as _platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

import msgspec  # noqa: E402

from datadesk.composition import Runtime  # noqa: E402
from datadesk.llm.scripted import ScriptedModel  # noqa: E402
from datadesk.settings import Settings  # noqa: E402
from datadesk.store.threads import Thread  # noqa: E402
from datadesk.tools.registry import ToolContext, ToolResult  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from sandbox_recovery import bench_recovery  # noqa: E402

GOAL_WARM_MS = 15.0
GOAL_POOL_FIRST_MS = 300.0
GOAL_IDLE_MIB = 100.0
ANALYST_IMPORTS = ("import scipy.stats, statsmodels.api, sklearn.linear_model, seaborn, tabulate, openpyxl, altair\n"
                   "import gc; gc.collect(); None")
COLD_FIRST_REFERENCE_MS = 1200.0  # what a first execution without the pool costs, roughly

KEY_WS, KEY_USER = "demo", "bench"


# --------------------------------------------------------------------------- stats

def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (p95 of 3 samples is the largest)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def summarize(xs: list[float]) -> dict[str, Any]:
    return {"runs": len(xs), "median": statistics.median(xs), "p95": pct(xs, 0.95),
            "min": min(xs), "max": max(xs), "first": xs[0], "samples": [round(x, 3) for x in xs]}


# --------------------------------------------------------------------------- probe

class Probe:
    """Adds up, per measured run, the time spent in the parts of an execution.

    Only calls made from the measuring task count: the pool-refill task the
    registry starts during a first execution runs the same code (is_alive,
    container start) concurrently and must not be attributed to it.
    """

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.ms: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list[Callable[[], None]] = []

    def _mine(self) -> bool:
        try:
            return self.task is not None and asyncio.current_task() is self.task
        except RuntimeError:  # not on the event loop thread
            return False

    def add(self, label: str, ms: float) -> None:
        self.ms[label] += ms
        self.calls[label] += 1

    def begin(self) -> None:
        self.ms.clear()
        self.calls.clear()
        self.task = asyncio.current_task()

    def end(self) -> dict[str, tuple[float, int]]:
        self.task = None
        return {k: (self.ms[k], self.calls[k]) for k in self.ms}

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, new)
        self._undo.append(lambda: setattr(owner, name, old))

    def wrap_async(self, owner: Any, name: str, label: str | Callable[..., str]) -> None:
        orig = getattr(owner, name)
        probe = self

        @functools.wraps(orig)
        async def wrapper(*a: Any, **kw: Any) -> Any:
            if not probe._mine():
                return await orig(*a, **kw)
            lab = label(*a, **kw) if callable(label) else label
            t0 = time.perf_counter()
            try:
                return await orig(*a, **kw)
            finally:
                probe.add(lab, (time.perf_counter() - t0) * 1000)

        self._patch(owner, name, wrapper)

    def install(self, backend: str) -> None:
        from datadesk.tools.requery import RequeryService
        from datadesk.sandbox.messaging import KernelChannel
        from datadesk.sandbox.registry import KernelRegistry

        if backend == "docker":
            from datadesk.sandbox.backends.docker.container import ALIVE_CACHE_S, DockerKernel as kernel_cls

            def alive_label(self_: Any) -> str:
                stale = (self_._container is not None
                         and time.monotonic() - self_._alive[0] >= ALIVE_CACHE_S)
                return "is_alive: docker inspect" if stale else "is_alive: cached"
        else:
            from datadesk.sandbox.backends.local.process import LocalKernel as kernel_cls

            def alive_label(self_: Any) -> str:
                return "is_alive"

        self.wrap_async(kernel_cls, "is_alive", alive_label)
        self.wrap_async(kernel_cls, "execute", "backend.execute")
        self.wrap_async(KernelChannel, "run", "zmq round trip (KernelChannel.run)")
        self.wrap_async(KernelRegistry, "_launch", "kernel start (_launch)")
        self.wrap_async(KernelRegistry, "_take", "take from pool / start (_take)")
        self.wrap_async(RequeryService, "ensure_available", "re-query check")
        from datadesk.sandbox.base import Kernel

        # the thread's files into the kernel's /data before each call (data-link sync)
        self.wrap_async(Kernel, "receive_files", "receive files (/data links)")

        # the local kernel reads /outputs with the base class's method
        self.wrap_async(kernel_cls if "read_outputs" in kernel_cls.__dict__ else Kernel, "read_outputs",
                        "collect /outputs")

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()


def breakdown(profiles: list[dict[str, tuple[float, int]]]) -> dict[str, dict[str, float]]:
    """Median ms per run of each part (0 in runs where it did not occur), and calls per run."""
    labels = sorted({k for p in profiles for k in p})
    out: dict[str, dict[str, float]] = {}
    n = max(1, len(profiles))
    for lab in labels:
        ms = [p.get(lab, (0.0, 0))[0] for p in profiles]
        calls = sum(p.get(lab, (0.0, 0))[1] for p in profiles)
        out[lab] = {"median_ms": round(statistics.median(ms), 3), "p95_ms": round(pct(ms, 0.95), 3),
                    "calls_per_run": round(calls / n, 2)}
    return out


def check_two(res: ToolResult) -> None:
    assert not res.is_error and "result:\n2" in res.content, res.content


# --------------------------------------------------------------------------- runtime

class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.backend = args.backend
        self.probe = Probe()
        self.rows: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="dd-bench-"))
        self.run_dirs: list[str] = []
        self.homes: list[Path] = []

    def make_rt(self, name: str, **sandbox: Any) -> Runtime:
        home = self.tmp / name
        home.mkdir(parents=True, exist_ok=True)
        self.homes.append(home)
        run_dir = tempfile.mkdtemp(prefix="ddr-")
        self.run_dirs.append(run_dir)
        sb = {"backend": self.backend, "run_dir": run_dir, "pool_size": 0, "memory_mb": 512,
              "cpus": self.args.cpus, "exec_timeout_s": 60, "start_timeout_s": 60,
              "reap_interval_s": 3600, **sandbox}
        settings = msgspec.convert({"home": str(home), "sandbox": sb}, Settings, dec_hook=lambda t, o: Path(o))
        return Runtime(settings=settings, model=ScriptedModel())

    @staticmethod
    def ctx(rt: Runtime, tid: str) -> ToolContext:
        tdir = rt.layout.thread_dir(KEY_WS, KEY_USER, tid)
        (tdir / "artifacts").mkdir(parents=True, exist_ok=True)
        return ToolContext(thread=Thread(tdir), workspace=KEY_WS, user=KEY_USER,
                           permissions=frozenset({"code_execution"}), call_id="bench")

    @staticmethod
    async def py(rt: Runtime, c: ToolContext, code: str) -> ToolResult:
        return await rt.tools.run("python", json.dumps({"code": code}), c)

    async def start(self, rt: Runtime) -> None:
        await rt.start()
        ok, why = rt.kernels.health()
        if not ok:
            await rt.stop()
            raise SystemExit(f"the {self.backend} sandbox is unavailable: {why}")

    def sweep(self) -> None:
        """Remove containers of this benchmark's data dirs (normally none: rt.stop removed them)."""
        if self.backend != "docker":
            return
        from datadesk.sandbox.backends.docker.container import DockerSandbox
        from datadesk.settings import SandboxSettings

        for home in self.homes:
            n = DockerSandbox(SandboxSettings(backend="docker"), home).remove_orphans()
            if n:
                print(f"warning: removed {n} container(s) left by {home.name}", file=sys.stderr)

    def cleanup(self) -> None:
        self.sweep()
        for d in self.run_dirs:
            shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    async def timed(self, fn: Callable[[], Awaitable[Any]], check: Callable[[Any], None]) -> tuple[float, dict]:
        self.probe.begin()
        t0 = time.perf_counter()
        try:
            out = await fn()
        finally:
            ms = (time.perf_counter() - t0) * 1000
            prof = self.probe.end()
        check(out)
        return ms, prof

    def row(self, group: str, name: str, values: list[float], unit: str, goal: float | None = None,
            profiles: list[dict] | None = None, note: str = "", show_first: bool = False) -> dict[str, Any]:
        r = {"group": group, "name": name, "unit": unit, **summarize(values), "goal": goal,
             "meets_goal": None if goal is None else statistics.median(values) <= goal,
             "show_first": show_first, "note": note}
        if profiles:
            r["breakdown"] = breakdown(profiles)
        self.rows.append(r)
        return r

    # ------------------------------------------------------------------ 1. warm overhead
    async def bench_warm(self) -> None:
        runs = self.args.runs
        rt = self.make_rt("warm")
        await self.start(rt)
        try:
            c = self.ctx(rt, "warm")
            key = (KEY_WS, KEY_USER, "warm")
            for _ in range(5):  # start the kernel and warm every layer
                res = await self.py(rt, c, "1+1")
                assert not res.is_error, res.content
            backend = rt.kernels.sessions[key].kernel
            data = c.thread.artifacts_dir  # what the python tool links into /data

            def ok_backend(r: Any) -> None:
                assert r.status == "ok" and r.result == "2", r

            def ok_registry(ex: Any) -> None:
                assert ex.result.status == "ok" and ex.result.result == "2", ex.result

            a, b, t, pa, pb, pt = [], [], [], [], [], []
            for _ in range(runs):  # interleaved, so drift hits all three alike
                ms, p = await self.timed(lambda: backend.execute("1+1", 10), ok_backend)
                a.append(ms); pa.append(p)
                ms, p = await self.timed(lambda: rt.kernels.execute(key, "1+1", 10, artifacts_dir=data), ok_registry)
                b.append(ms); pb.append(p)
                ms, p = await self.timed(lambda: self.py(rt, c, "1+1"), check_two)
                t.append(ms); pt.append(p)
            grp = "1. warm execute of 1+1"
            self.row(grp, "(a) backend.execute", a, "ms", GOAL_WARM_MS, pa)
            self.row(grp, "(b) KernelRegistry.execute", b, "ms", GOAL_WARM_MS, pb)
            self.row(grp, "(c) python tool, back to back", t, "ms", GOAL_WARM_MS, pt)

            gap_s = 1.2
            if self.backend == "docker":
                from datadesk.sandbox.backends.docker.container import ALIVE_CACHE_S
                gap_s = ALIVE_CACHE_S + 0.2
            g, pg = [], []
            for _ in range(runs):
                await asyncio.sleep(gap_s)
                ms, p = await self.timed(lambda: self.py(rt, c, "1+1"), check_two)
                g.append(ms); pg.append(p)
            self.row(grp, f"(c') python tool, {gap_s:g} s apart", g, "ms", GOAL_WARM_MS, pg,
                     note="as in a chat: the model thinks between calls, so the liveness cache is stale")
        finally:
            await rt.stop()

    # ------------------------------------------------------------------ 2. first execution
    async def _wait_pool(self, rt: Runtime, timeout_s: float = 120) -> None:
        reg = rt.kernels
        deadline = time.monotonic() + timeout_s
        while not (reg.pool and reg._starting == 0):
            if time.monotonic() > deadline:
                raise SystemExit("the pool did not get a ready kernel in time (see the log above)")
            await asyncio.sleep(0.05)

    async def bench_pool(self, defer_refill: bool) -> tuple[list[float], list[dict]]:
        runs = self.args.runs
        rt = self.make_rt("pool-deferred" if defer_refill else "pool", pool_size=1)
        await self.start(rt)
        reg = rt.kernels
        times, profs = [], []
        try:
            for i in range(runs):
                await self._wait_pool(rt)
                await asyncio.sleep(0.3)  # let the host settle after the container start
                pooled = reg.pool[0].placement.kernel_id
                c = self.ctx(rt, f"p{i}")
                key = (KEY_WS, KEY_USER, c.thread.id)
                if defer_refill:
                    reg._fill_pool = lambda: None  # type: ignore[method-assign]
                try:
                    ms, p = await self.timed(lambda: self.py(rt, c, "1+1"), check_two)
                finally:
                    if defer_refill:
                        del reg._fill_pool
                        reg._fill_pool()
                assert reg.sessions[key].placement.kernel_id == pooled, "the pooled kernel was not used"
                times.append(ms); profs.append(p)
                await reg.shutdown_thread(key)
            # rt.stop() cancels a refill that is still starting, and a container being created
            # in a worker thread then outlives it (swept below): let the refill finish first
            await self._wait_pool(rt)
        finally:
            await rt.stop()
        return times, profs

    async def bench_cold_and_memory(self) -> None:
        runs = self.args.runs
        rt = self.make_rt("cold", pool_size=0)
        await self.start(rt)
        reg = rt.kernels
        times, profs, bare, loaded, raw, analyst = [], [], [], [], [], []
        try:
            for i in range(runs):
                c = self.ctx(rt, f"c{i}")
                key = (KEY_WS, KEY_USER, c.thread.id)
                ms, p = await self.timed(lambda: self.py(rt, c, "1+1"), check_two)
                times.append(ms); profs.append(p)
                backend = reg.sessions[key].kernel
                await asyncio.sleep(0.5)
                m0 = await asyncio.to_thread(self.kernel_memory, backend)
                res = await self.py(rt, c, "import pandas, duckdb\nimport gc; gc.collect(); None")
                assert not res.is_error, res.content
                await asyncio.sleep(0.5)
                m1 = await asyncio.to_thread(self.kernel_memory, backend)
                bare.append(m0["mib"]); loaded.append(m1["mib"]); raw.append({"bare": m0, "loaded": m1})
                if self.backend == "docker":  # the image's analyst packages (imported on demand only)
                    res = await self.py(rt, c, ANALYST_IMPORTS)
                    assert not res.is_error, res.content
                    await asyncio.sleep(0.5)
                    analyst.append((await asyncio.to_thread(self.kernel_memory, backend))["mib"])
                await reg.shutdown_thread(key)
        finally:
            await rt.stop()
        self.row("2. first execution on a new thread", "without pool (pool_size=0, " + ("container" if self.backend == "docker" else "kernel") + " start)",
                 times, "ms", None, profs, note=f"reference ~{COLD_FIRST_REFERENCE_MS / 1000:g} s")
        how = ("docker stats: usage - inactive_file" if self.backend == "docker"
               else "kernel RSS (VmRSS, incl. shared library pages: not comparable to docker stats)")
        grp = "3. idle kernel memory"
        self.row(grp, "bare kernel", bare, "MiB", None, note=how)
        self.row(grp, "after import pandas, duckdb", loaded, "MiB", GOAL_IDLE_MIB, note=how)
        if analyst:
            self.row(grp, "after the analyst packages too", analyst, "MiB", None, note=ANALYST_IMPORTS.split("\n")[0])
        self.info["memory_samples"] = raw[:3]

    def kernel_memory(self, backend: Any) -> dict[str, Any]:
        if self.backend != "docker":
            pid = backend.pid
            fields = {}
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile"):
                    fields[k] = int(v.split()[0]) / 1024
            return {"mib": fields["VmRSS"], **{k: round(v, 1) for k, v in fields.items()}}
        container = backend._container
        try:
            stats = container.stats(stream=False, one_shot=True)
        except Exception:  # an engine without one-shot stats
            stats = container.stats(stream=False)
        return docker_memory(stats)

    # ------------------------------------------------------------------ 4. aggregation
    async def bench_aggregate(self) -> None:
        import duckdb

        runs, rows = self.args.runs, self.args.rows
        rt = self.make_rt("agg", memory_mb=2048)
        await self.start(rt)
        try:
            c = self.ctx(rt, "agg")
            key = (KEY_WS, KEY_USER, "agg")
            name = f"bench{rows}.parquet"
            path = c.thread.artifacts_dir / name
            t0 = time.perf_counter()
            con = duckdb.connect()
            con.execute(f"""COPY (SELECT i AS id, (i % 1000)::INTEGER AS g, random() AS v,
                                  TIMESTAMP '2024-01-01' + to_seconds(i) AS ts
                           FROM range({rows}) t(i)) TO '{path}' (FORMAT parquet)""")
            con.close()
            write_s = time.perf_counter() - t0
            self.info["parquet"] = {"rows": rows, "bytes": path.stat().st_size, "host_write_s": round(write_s, 2)}

            t0 = time.perf_counter()
            ex = await rt.kernels.execute(key, "import duckdb, os, time\n"
                                               "(duckdb.__version__, os.cpu_count(), "
                                               "duckdb.sql(\"SELECT current_setting('threads')\").fetchall()[0][0])",
                                          60, artifacts_dir=path.parent)
            assert ex.result.status == "ok", ex.result
            self.info["kernel_duckdb"] = dict(zip(("version", "cpu_count", "threads"),
                                                  ast.literal_eval(ex.result.result)))
            self.info["kernel_start_and_import_s"] = round(time.perf_counter() - t0, 2)

            sql = f"SELECT g, count(*), sum(v), avg(v) FROM '/data/{name}' GROUP BY g"
            code = (f"_t = time.perf_counter()\n_r = duckdb.sql(\"{sql}\").fetchall()\n"
                    "(round((time.perf_counter() - _t) * 1000, 3), len(_r), sum(x[1] for x in _r))")
            wall, inner = [], []
            for _ in range(runs + 1):
                t0 = time.perf_counter()
                ex = await rt.kernels.execute(key, code, 300, artifacts_dir=path.parent)
                ms = (time.perf_counter() - t0) * 1000
                assert ex.result.status == "ok", (ex.result.error, ex.result.note, ex.result.stderr)
                kms, groups, count = ast.literal_eval(ex.result.result)
                assert groups == 1000 and count == rows, (groups, count)
                wall.append(ms); inner.append(kms)
        finally:
            await rt.stop()
        grp = f"4. GROUP BY over {rows:,} Parquet rows"
        note = "first run apart; median/p95 over the rest"
        for label, xs in (("end to end (registry)", wall), ("inside the kernel", inner)):
            r = self.row(grp, label, xs[1:], "ms", None, note=note, show_first=True)
            r["first"] = xs[0]
            r["samples"] = [round(x, 3) for x in xs]

    # ------------------------------------------------------------------ main
    async def run(self) -> None:
        self.probe.install(self.backend)
        try:
            phases: list[tuple[str, Callable[[], Awaitable[None]]]] = [
                ("warm overhead", self.bench_warm),
                ("first execution with the pool", self._pool_rows),
                ("first execution without the pool, memory", self.bench_cold_and_memory),
                ("aggregation", self.bench_aggregate),
                ("recovery and live output", functools.partial(bench_recovery, self)),
            ]
            if self.args.only:
                phases = [p for p in phases if self.args.only in p[0]]
            for label, fn in phases:
                t0 = time.perf_counter()
                print(f"... {label}", file=sys.stderr, flush=True)
                await fn()
                self.info.setdefault("phase_s", {})[label] = round(time.perf_counter() - t0, 1)
        finally:
            self.probe.uninstall()

    async def _pool_rows(self) -> None:
        grp = "2. first execution on a new thread"
        t, p = await self.bench_pool(defer_refill=False)
        self.row(grp, "with pool (pool_size=1), refill racing", t, "ms", GOAL_POOL_FIRST_MS, p,
                 note="as in production: the replacement kernel starts during the execution")
        t, p = await self.bench_pool(defer_refill=True)
        self.row(grp, "with pool, refill held back (diagnostic)", t, "ms", GOAL_POOL_FIRST_MS, p,
                 note="the same, with the replacement started only after the execution")


def docker_memory(stats: dict[str, Any]) -> dict[str, Any]:
    """Memory as `docker stats` shows it: usage minus the inactive file cache."""
    ms = stats.get("memory_stats", {})
    usage = int(ms.get("usage", 0))
    st = ms.get("stats", {}) or {}
    sub, used = 0, "none"
    for field in ("total_inactive_file", "inactive_file"):  # cgroup v1, v2
        if field in st and st[field] < usage:
            sub, used = int(st[field]), field
            break
    else:
        if "cache" in st and st["cache"] < usage:
            sub, used = int(st["cache"]), "cache"
    mib = 1024 * 1024
    return {"mib": (usage - sub) / mib, "usage_mib": round(usage / mib, 1), "subtracted": used,
            "subtracted_mib": round(sub / mib, 1), "rss_mib": round(st.get("total_rss", st.get("anon", 0)) / mib, 1),
            "cache_mib": round(st.get("total_cache", st.get("file", 0)) / mib, 1)}


# --------------------------------------------------------------------------- report

def fmt(v: float, unit: str) -> str:
    if unit == "ms":
        return f"{v:,.0f} ms" if v >= 100 else f"{v:.1f} ms"
    return f"{v:.1f} {unit}"


def print_table(b: Bench) -> None:
    a = b.args
    print(f"\nPython sandbox, backend {a.backend}: {a.runs} runs each"
          f"{' (tiny)' if a.tiny else ''}; cpus={a.cpus} per kernel, host {os.cpu_count()} CPUs")
    head = f"{'':<50}{'runs':>5}{'median':>11}{'p95':>11}{'first':>11}  {'goal':<12}"
    group = None
    for r in b.rows:
        if r["group"] != group:
            group = r["group"]
            print(f"\n{group}")
            print(head)
        goal = ""
        if r["goal"] is not None:
            goal = f"<= {fmt(r['goal'], r['unit'])} {'ok' if r['meets_goal'] else 'MISSED'}"
        first = fmt(r["first"], r["unit"]) if r["show_first"] else ""
        print(f"  {r['name']:<48}{r['runs']:>5}{fmt(r['median'], r['unit']):>11}{fmt(r['p95'], r['unit']):>11}"
              f"{first:>11}  {goal}")
        if r.get("note"):
            print(f"      ({r['note']})")
        for lab, d in (r.get("breakdown") or {}).items():
            if lab == "backend.execute" and r["name"].startswith("(a)"):
                continue
            print(f"      {lab:<44}{d['median_ms']:>9.2f} ms median{d['p95_ms']:>9.2f} ms p95"
                  f"  {d['calls_per_run']:g} call(s)/run")
    info = b.info
    if "parquet" in info:
        p = info["parquet"]
        print(f"\nParquet: {p['rows']:,} rows, {p['bytes'] / 1e6:.1f} MB, written on the host in "
              f"{p['host_write_s']} s; kernel duckdb {info['kernel_duckdb']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="3 runs and 100,000 rows (CI smoke run)")
    ap.add_argument("--runs", type=int, default=None, help="runs per measurement (default 30; tiny 3)")
    ap.add_argument("--rows", type=int, default=None, help="Parquet rows (default 10,000,000; tiny 100,000)")
    ap.add_argument("--backend", choices=["docker", "local"], default="docker")
    ap.add_argument("--cpus", type=float, default=1.0, help="CPUs per docker kernel (sandbox.cpus)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sandbox.json")
    ap.add_argument("--only", default="", help="run only the phases whose label contains this (e.g. recovery)")
    args = ap.parse_args()
    args.runs = args.runs or (3 if args.tiny else 30)
    args.rows = args.rows or (100_000 if args.tiny else 10_000_000)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    bench = Bench(args)
    t0 = time.perf_counter()
    try:
        asyncio.run(bench.run())
    finally:
        bench.cleanup()
    total_s = time.perf_counter() - t0
    print_table(bench)
    print(f"\ntotal {total_s:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "tiny": args.tiny, "backend": args.backend, "runs": args.runs, "rows": args.rows, "cpus": args.cpus,
        "goals": {"warm_ms": GOAL_WARM_MS, "pool_first_ms": GOAL_POOL_FIRST_MS, "idle_mib": GOAL_IDLE_MIB},
        "results": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in bench.rows],
        "info": bench.info, "total_s": round(total_s, 1),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": _platform.platform()},
    }, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
