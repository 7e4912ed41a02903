"""Benchmark: a team's busy morning on one host -- N analysts at once against `datadesk serve`.

    python bench/scale.py [--tiny] [--users 1,10,30,60] [--workers 1,2] [--rounds 3] [--turns 3]

Each configuration (users x workers) gets a fresh data directory and a real `datadesk serve
--workers W` subprocess on 127.0.0.1 with the defaults (local sandbox, summaries on), one
account and one thread per user. The model is our own fake OpenAI-compatible server in a
**separate process** (`--fake-model`), so its work is not the app's: each request waits
`--first-delay` (0.3 s), then streams at `--token-rate` (50 tokens/s). A turn is what an
analyst's question costs: the model calls `sql_query` with a 50,000-row query of the demo
warehouse (so the result is offloaded to a Parquet artifact), then streams a ~50-token
Markdown answer. Every user runs `--turns` turns one after the other; all users start
within the first second.

Measured per configuration and round (rounds interleave: every configuration once, then
again), medians over the rounds are printed:
- turns/min over the measured window (first turn start to last turn end);
- turn latency and **platform overhead** p50/p95: the client's wall time of the turn minus
  the fake model's own time for that turn's requests (measured inside the fake);
- app CPU-seconds per turn: utime+stime of the server's whole process tree (the workers,
  kernels, and children already reaped) from /proc, over the window, per turn; and the share
  of the machine's cores it used;
- peak RSS of the process tree (sampled every 0.25 s);
- `/api/health` latency p50/p99/max (a probe every 100 ms on its own connection);
- event-loop lag p99/max per worker, from the `loop` histogram `/api/health` reports
  (its counts at the end of the window minus those at its start);
- tool calls refused or failed (a `tool.finished` that is an error, or a turn that did not
  end `ok`).

Prints a table and writes JSON to bench/results/scale.json (`--tiny`: scale-tiny.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

import httpx  # noqa: E402

from bench.proctree import host_cpu, main_threads_cpu, tree_cpu, tree_rss  # noqa: E402
from tests.serving import serving  # noqa: E402

SQL = "SELECT * FROM readings ORDER BY building_id, ts LIMIT 50000"
SUMMARY_MARK = "running summary of a data-analysis chat thread"
WORDS = ("The", "**consumption**", "of", "the", "buildings", "rose", "in", "January;", "see", "the",
         "`readings`", "artifact", "for", "every", "hour.\n\n-", "heat", "pumps", "use", "more", "when", "it", "is",
         "cold,\n-", "offices", "in", "Amsterdam", "less.\n\n")


# -- the fake model (its own process) --------------------------------------------------------

def answer_tokens(n: int) -> list[str]:
    return [(WORDS[i % len(WORDS)] + ("" if WORDS[i % len(WORDS)].endswith("\n") else " ")) for i in range(n)]


def fake_model_main(args: argparse.Namespace) -> int:
    from tests.fakes.openai_server import FakeOpenAIServer

    class ScaleModel(FakeOpenAIServer):
        """SQL call, then the streamed answer; the time of each request kept under its user text."""

        def __init__(self) -> None:
            super().__init__(models=None)
            self.seconds: dict[str, float] = {}
            self.calls = 0

        async def _dispatch(self, method: str, path: str, headers: dict[str, str], raw: bytes, w: Any) -> bool:
            if method == "GET" and path.startswith("/stats"):
                body = json.dumps({"seconds": self.seconds, "calls": self.calls}).encode()
                await self._send(w, 200, body, "application/json", {})
                return True
            return await super()._dispatch(method, path, headers, raw, w)

        async def _answer(self, reply: Any, req: dict[str, Any], w: Any) -> bool:
            t0 = time.perf_counter()
            messages = req.get("messages") or []
            system = str(messages[0].get("content", "")) if messages else ""
            user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
            key = "(summary)" if SUMMARY_MARK in system else user
            self.calls += 1
            try:
                await self._stream(w, messages, key == "(summary)", req)
            finally:
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
            return True

        async def _stream(self, w: Any, messages: list[dict[str, Any]], summary: bool, req: dict[str, Any]) -> None:
            cid = f"chatcmpl-scale-{self.calls}"

            def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": req.get("model", "fake"),
                        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
                data = f"data: {json.dumps(body)}\n\n".encode()
                return f"{len(data):x}\r\n".encode() + data + b"\r\n"

            if summary:  # the summarizer's own request: a short valid summary, at once
                from tests.unit.test_summary import faithful

                pieces: list[dict[str, Any]] = [{"content": faithful(messages, [])}]
                finish = "stop"
            elif messages and messages[-1].get("role") == "tool":
                pieces = [{"content": t} for t in answer_tokens(args.answer_tokens)]
                finish = "stop"
            else:
                arg = json.dumps({"sql": SQL})
                parts = [arg[i:i + 16] for i in range(0, len(arg), 16)]  # ~4 tokens a piece
                pieces = [{"tool_calls": [{"index": 0, "id": f"call_{cid}", "type": "function",
                                           "function": {"name": "sql_query", "arguments": ""}}]}]
                pieces += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in parts]
                finish = "tool_calls"
            head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            w.write(head.encode())
            if not summary:
                await asyncio.sleep(args.first_delay)
            w.write(chunk({"role": "assistant", "content": ""}))
            for piece in pieces:
                if not summary:
                    await asyncio.sleep(1 / args.token_rate)
                w.write(chunk(piece))
                await w.drain()
            w.write(chunk({}, finish))
            usage = {"prompt_tokens": 1000, "completion_tokens": len(pieces), "total_tokens": 1000 + len(pieces)}
            data = json.dumps({"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                               "model": req.get("model", "fake"), "choices": [], "usage": usage})
            body = f"data: {data}\n\n".encode()
            w.write(f"{len(body):x}\r\n".encode() + body + b"\r\n")
            done = b"data: [DONE]\n\n"
            w.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
            await w.drain()

    server = ScaleModel().start()
    Path(args.ready_file).write_text(str(server.port))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


@contextmanager
def fake_model(args: argparse.Namespace) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ddscale-fake-") as tmp:
        ready = Path(tmp) / "port"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--fake-model", "--ready-file", str(ready),
               "--first-delay", str(args.first_delay), "--token-rate", str(args.token_rate),
               "--answer-tokens", str(args.answer_tokens)]
        proc = subprocess.Popen(cmd, cwd=ROOT)
        try:
            deadline = time.time() + 30
            while not ready.exists() or not ready.read_text():
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the fake model did not start")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{ready.read_text()}"
        finally:
            proc.terminate()
            proc.wait(10)


def control_main(args: argparse.Namespace) -> int:
    """`--control-server`: a bare asyncio HTTP responder (no framework, no work) that answers every
    request with a small JSON 200. Probed beside `/api/health`, its latency is what the loaded
    host alone costs a process that does nothing: the floor under the app's figure."""
    body = b'{"status":"ok"}'
    reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def run() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        Path(args.ready_file).write_text(str(server.sockets[0].getsockname()[1]))
        async with server:
            await server.serve_forever()

    asyncio.run(run())
    return 0


@contextmanager
def control_server() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ddscale-control-") as tmp:
        ready = Path(tmp) / "port"
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--control-server",
                                 "--ready-file", str(ready)], cwd=ROOT)
        try:
            deadline = time.time() + 30
            while not ready.exists() or not ready.read_text():
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the control server did not start")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{ready.read_text()}"
        finally:
            proc.terminate()
            proc.wait(10)


# -- the app and its process tree --------------------------------------------------------------

@contextmanager
def serve(home: Path, model_url: str, workers: int, extra_toml: str = "") -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    run_dir = tempfile.mkdtemp(prefix="ddsc-", dir="/tmp")  # kernel sockets: a short path
    config = home / "datadesk.toml"
    config.write_text(f'[sandbox]\nrun_dir = "{run_dir}"\n{extra_toml}\n')
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}", "DATADESK_HOME": str(home),
           "DATADESK_CONFIG": str(config), "DATADESK_LLM_BASE_URL": f"{model_url}/v1",
           "DATADESK_LLM_API_KEY": "sk-bench", "DATADESK_LLM_MODEL": "fake-model"}
    log = Path(os.environ.get("DATADESK_SCALE_LOG_DIR", str(home.parent))) / f"serve-{workers}.log"
    with serving(home, env, log, workers, ("--allow-unsafe-local-sandbox",), heartbeats=workers) as served:
        yield served


# -- the load ---------------------------------------------------------------------------------

def parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    out, event, data = [], "message", []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line:
            if data:
                try:
                    out.append((event, json.loads("\n".join(data))))
                except ValueError:
                    pass
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    return out


async def one_turn(client: httpx.AsyncClient, tid: str, text: str) -> dict[str, Any]:
    """One turn, its SSE read as it comes: when the tool started and finished (the phases of a
    turn: the model's call, the SQL and its offload, the answer) and how it ended."""
    t0 = time.perf_counter()
    marks: dict[str, float] = {}
    chunks: list[str] = []
    try:
        async with client.stream("POST", f"/api/threads/{tid}/messages", json={"content": text}) as r:
            status = r.status_code
            async for piece in r.aiter_text():
                now = time.perf_counter()
                for name in ("tool.started", "tool.finished", "message.delta"):
                    if name not in marks and f"event: {name}" in piece:
                        marks[name] = now - t0
                chunks.append(piece)
        body = "".join(chunks)
    except httpx.HTTPError as exc:
        status, body = 0, str(exc)
    wall = time.perf_counter() - t0
    events = parse_sse(body) if status == 200 else []
    done = [d for e, d in events if e == "done"]
    ok = bool(done) and done[-1].get("status") == "ok"
    tools = [d for e, d in events if e == "tool.finished"]
    bad_tools = [d for d in tools if not d.get("ok")]
    refused = [d for d in bad_tools if "limits." in str(d.get("preview", ""))]
    offloaded = sum(1 for d in tools if (d.get("meta") or {}).get("artifact"))
    waits = [d.get("message") for e, d in events if e == "tool.progress" and "waiting" in str(d.get("message"))]
    return {"text": text, "status": status, "ok": ok, "wall": wall, "tools": len(tools), "offloaded": offloaded,
            "failed_tools": len(bad_tools), "refused": len(refused), "t_end": time.perf_counter(),
            "t_start": t0, "waited": len(waits), "waited_slot": sum("slot" in str(w) for w in waits),
            "waited_writer": sum("writer" in str(w) for w in waits), "to_tool": marks.get("tool.started"),
            "tool": (marks["tool.finished"] - marks["tool.started"]) if "tool.finished" in marks and
            "tool.started" in marks else None,
            "after_tool": (wall - marks["tool.finished"]) if "tool.finished" in marks else None,
            "error": "" if ok else f"HTTP {status}: {body[-400:]}"}


async def user_loop(base: str, token: str, tid: str, tag: str, turns: int, jitter: float) -> list[dict[str, Any]]:
    await asyncio.sleep(jitter)
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection each turn: any worker may take it
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=600,
                                 limits=limits) as c:
        return [await one_turn(c, tid, f"{tag} {tid} turn {i}: how did consumption move?") for i in range(turns)]


def probe_main(base: str, control: str | None, every: float, stop: Any, out: Any) -> None:
    """The prober's own process: `/api/health` every `every` s on one client (building one costs
    ~10 ms), a new connection each probe; its latencies never wait on the load generator's GIL.
    Right after each, the same request to the control server (`control_main`), when there is one."""
    latencies: list[float] = []
    controls: list[float] = []
    loops: list[tuple[float, dict[str, Any]]] = []
    errors = 0
    with httpx.Client(base_url=base, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = c.get("/api/health")
                latencies.append(time.perf_counter() - t0)
                loop = r.json().get("loop")
                if loop:
                    loops.append((time.perf_counter(), loop))  # CLOCK_MONOTONIC: one clock for every process
            except (httpx.HTTPError, ValueError):
                errors += 1
            if control:
                t1 = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    c.get(f"{control}/api/health")
                    controls.append(time.perf_counter() - t1)
            stop.wait(max(0.0, every - (time.perf_counter() - t0)))
    out.put((latencies, controls, loops, errors))


class Prober:
    """`/api/health` probes from a process of its own; `latencies`, `loops` (per worker pid) and
    `errors` once joined."""

    def __init__(self, base: str, control: str | None = None, every: float = 0.1) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.stop, self._out = ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=probe_main, args=(base, control, every, self.stop, self._out), daemon=True)
        self.latencies: list[float] = []
        self.controls: list[float] = []
        self.loops: dict[int, list[tuple[float, dict[str, Any]]]] = {}
        self.errors = 0

    def start(self) -> None:
        self._proc.start()

    def join(self, timeout: float) -> None:
        latencies, self.controls, loops, self.errors = self._out.get(timeout=timeout)
        self._proc.join(timeout)
        self.latencies = latencies
        for t, loop in loops:
            self.loops.setdefault(int(loop["pid"]), []).append((t, loop))


class Sampler(threading.Thread):
    def __init__(self, pid: int, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_rss = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak_rss = max(self.peak_rss, tree_rss(self.pid))
            self.stop.wait(self.every)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def lag_from_hist(first: dict[str, Any] | None, last: dict[str, Any]) -> tuple[float, float, int]:
    """p99 and max lag (ms) of the samples between two `loop` reports of one worker."""
    bounds = [float(b) if b is not None else float("inf") for b in last["lag_buckets_ms"]]
    counts = [int(c) - (int(first["lag_counts"][i]) if first else 0) for i, c in enumerate(last["lag_counts"])]
    total = sum(counts)
    if total <= 0:
        return 0.0, 0.0, 0
    need, seen = 0.99 * total, 0
    p99 = bounds[-1]
    for b, c in zip(bounds, counts):
        seen += c
        if seen >= need:
            p99 = b
            break
    return p99, float(last.get("lag_max_ms_recent", 0.0)), total


def window_lag(prober: Prober, t0: float, t1: float) -> tuple[float, float]:
    """The worst worker's p99 and max lag between t0 and t1."""
    p99s, maxes = [], []
    for reports in prober.loops.values():
        before = [r for t, r in reports if t <= t0]
        inside = [r for t, r in reports if t0 < t <= t1 + 1.0]
        if not inside:
            continue
        p99, _, _ = lag_from_hist(before[-1] if before else None, inside[-1])
        p99s.append(p99)
        maxes.append(max(float(r.get("lag_max_ms_recent", 0.0)) for r in inside))
    return (max(p99s) if p99s else float("nan")), (max(maxes) if maxes else float("nan"))


def setup_users(home: Path, n: int) -> list[str]:
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore
    from datadesk.store.workspaces import ensure_demo_workspace

    layout = Layout(home)
    ensure_demo_workspace(layout)
    store = UserStore(layout)
    return [store.add(f"analyst{i:03d}", ["demo"], ["code_execution"])[1] for i in range(n)]


def run_config(args: argparse.Namespace, model_url: str, control_url: str | None, users: int, workers: int,
               rnd: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ddscale-") as tmp:
        home = Path(tmp) / "var"
        tokens = setup_users(home, users)
        with serve(home, model_url, workers, args.toml.replace("\\n", "\n")) as (base, proc):
            tids = []
            for tok in tokens:
                r = httpx.post(f"{base}/api/threads", json={"title": "morning"},
                               headers={"Authorization": f"Bearer {tok}"}, timeout=60)
                r.raise_for_status()
                tids.append(r.json()["id"])
            tag = f"r{rnd}u{users}w{workers}"
            # one warm-up turn per user (code paths, the kernel pool, DuckDB's caches), not measured
            warm = asyncio.run(_all(base, tokens, tids, f"warm-{tag}", 1, 0.5))
            prober, sampler = Prober(base, control_url), Sampler(proc.pid)
            prober.start()
            sampler.start()
            time.sleep(1.5)  # the prober's process is up and its first loop report lies before the window
            with profiled(proc.pid, args.profile):
                cpu0 = tree_cpu(proc.pid, reaped=True)
                host0, me0, loop0 = host_cpu(), os.times(), main_threads_cpu(proc.pid)
                t0 = time.perf_counter()
                rows = asyncio.run(_all(base, tokens, tids, tag, args.turns, 1.0))
                t1 = time.perf_counter()
            cpu1 = tree_cpu(proc.pid, reaped=True)
            host1, me1, loop1 = host_cpu(), os.times(), main_threads_cpu(proc.pid)
            time.sleep(0.3)
            prober.stop.set()
            sampler.stop.set()
            prober.join(35)
            sampler.join(5)
            stats = httpx.get(f"{model_url}/stats", timeout=30).json()["seconds"]
    inside = prober.latencies
    for r in rows:
        r["model"] = stats.get(r["text"], 0.0)
        r["overhead"] = r["wall"] - r["model"]
    lag_p99, lag_max = window_lag(prober, t0, t1)
    elapsed = t1 - t0
    ok_rows = [r for r in rows if r["ok"]]
    over = [r["overhead"] for r in ok_rows]
    walls = [r["wall"] for r in ok_rows]
    return {
        "users": users, "workers": workers, "round": rnd, "turns": len(rows), "ok": len(ok_rows),
        "warmup_failed": sum(1 for r in warm if not r["ok"]),
        "turns_per_min": round(len(ok_rows) / elapsed * 60, 1),
        "wall_s_p50": round(statistics.median(walls), 3) if walls else None,
        "wall_s_p95": round(pct(walls, 0.95), 3) if walls else None,
        "overhead_s_p50": round(statistics.median(over), 3) if over else None,
        "overhead_s_p95": round(pct(over, 0.95), 3) if over else None,
        "model_s_p50": round(statistics.median(r["model"] for r in ok_rows), 3) if ok_rows else None,
        "cpu_s_per_turn": round((cpu1 - cpu0) / max(1, len(rows)), 4),
        "cpu_share": round((cpu1 - cpu0) / (elapsed * (os.cpu_count() or 1)), 3),
        "loop_cpu_s_per_turn": round((loop1 - loop0) / max(1, len(rows)), 4),
        "host_busy_share": round((host1[0] - host0[0]) / max(1e-9, host1[1] - host0[1]), 3),
        "load_client_cpu_share": round((me1.user + me1.system - me0.user - me0.system)
                                       / (elapsed * (os.cpu_count() or 1)), 3),
        "peak_rss_mb": round(sampler.peak_rss / 1e6, 1),
        "health_ms_p50": round(statistics.median(inside) * 1000, 1) if inside else None,
        "health_ms_p99": round(pct(inside, 0.99) * 1000, 1) if inside else None,
        "health_ms_max": round(max(inside) * 1000, 1) if inside else None,
        "health_probes": len(inside), "health_errors": prober.errors,
        "control_ms_p50": round(statistics.median(prober.controls) * 1000, 1) if prober.controls else None,
        "control_ms_p99": round(pct(prober.controls, 0.99) * 1000, 1) if prober.controls else None,
        "loop_lag_ms_p99": lag_p99, "loop_lag_ms_max": lag_max,
        "tool_calls": sum(r["tools"] for r in rows), "offloaded": sum(r["offloaded"] for r in rows),
        "waits_slot": sum(r["waited_slot"] for r in rows), "waits_writer": sum(r["waited_writer"] for r in rows),
        **{f"{k}_s_p50": round(statistics.median(v), 3) if (v := [r[k] for r in ok_rows if r[k] is not None]) else None
           for k in ("to_tool", "tool", "after_tool")},
        "refused": sum(r["refused"] for r in rows),
        "failed": sum(r["failed_tools"] for r in rows) + sum(1 for r in rows if not r["ok"]),
        "errors": [r["error"] for r in rows if not r["ok"]][:3],
    }


@contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy over the measured window (`--profile`), else nothing."""
    if out is None:
        yield
        return
    from bench.pyspy import recording

    with recording(pid, out):
        yield


async def _all(base: str, tokens: list[str], tids: list[str], tag: str, turns: int,
               spread: float) -> list[dict[str, Any]]:
    rng = random.Random(f"{tag}")
    per_user = await asyncio.gather(*(user_loop(base, tok, tid, tag, turns, rng.uniform(0, spread))
                                      for tok, tid in zip(tokens, tids)))
    return [r for rows in per_user for r in rows]


def median_of(rows: list[dict[str, Any]], key: str) -> Any:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return round(statistics.median(vals), 4) if vals else "-"


KEYS = ("turns_per_min", "overhead_s_p50", "overhead_s_p95", "wall_s_p50", "wall_s_p95", "cpu_s_per_turn",
        "cpu_share", "peak_rss_mb", "health_ms_p50", "health_ms_p99", "health_ms_max", "loop_lag_ms_p99",
        "loop_lag_ms_max", "control_ms_p99", "refused", "failed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--users", default="1,10,30,60")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3, help="turns per user, one after the other")
    ap.add_argument("--first-delay", type=float, default=0.3, help="seconds before a model reply's first token")
    ap.add_argument("--token-rate", type=float, default=50.0, help="tokens per second the model streams")
    ap.add_argument("--answer-tokens", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--toml", default="", help="settings added to the defaults, e.g. '[limits]\\noffload_writers = 1'")
    ap.add_argument("--profile", type=Path, default=None,
                    help="py-spy the server over each measured window into this file (one configuration)")
    ap.add_argument("--no-control", action="store_true", help="no control server beside /api/health")
    ap.add_argument("--fake-model", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--control-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ready-file", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fake_model:
        return fake_model_main(args)
    if args.control_server:
        return control_main(args)
    if args.tiny:
        args.users, args.workers, args.rounds, args.turns = "1,3", "1,2", 1, 1
    users = [int(u) for u in args.users.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    configs = [(u, w) for w in workers for u in users if not (w > 1 and u < max(users))] if not args.tiny \
        else [(u, w) for w in workers for u in users]
    out = args.out or ROOT / "bench" / "results" / ("scale-tiny.json" if args.tiny else "scale.json")
    runs: list[dict[str, Any]] = []
    with fake_model(args) as model_url, \
            (contextlib.nullcontext(None) if args.no_control else control_server()) as control_url:
        for rnd in range(args.rounds):
            for users_n, workers_n in configs:
                row = run_config(args, model_url, control_url, users_n, workers_n, rnd)
                runs.append(row)
                print(f"  round {rnd + 1}: {users_n} users / {workers_n} worker(s): "
                      + ", ".join(f"{k}={row[k]}" for k in KEYS), flush=True)
                for err in row["errors"]:
                    print(f"    failed turn: {err}", flush=True)
    table = []
    for users_n, workers_n in configs:
        mine = [r for r in runs if r["users"] == users_n and r["workers"] == workers_n]
        table.append({"users": users_n, "workers": workers_n, "rounds": len(mine),
                      **{k: median_of(mine, k) for k in KEYS},
                      "refused_all": [r["refused"] for r in mine], "failed_all": [r["failed"] for r in mine]})
    print(f"\n{args.turns} turns per user: a {SQL!r} call offloaded, then a {args.answer_tokens}-token answer; "
          f"model: {args.first_delay:g} s first delay, {args.token_rate:g} tokens/s; medians of {args.rounds} round(s)")
    head = (f"{'users/workers':>14}{'turns/min':>10}{'ovh p50':>9}{'ovh p95':>9}{'CPU/turn':>9}{'cores':>7}"
            f"{'RSS MB':>8}{'health p50':>11}{'p99':>7}{'max':>8}{'lag p99':>8}{'lag max':>8}{'ctl p99':>8}"
            f"{'refused':>8}{'failed':>7}")
    print(head)
    for t in table:
        print(f"{str(t['users']) + ' / ' + str(t['workers']):>14}{t['turns_per_min']:>10}{t['overhead_s_p50']:>9}"
              f"{t['overhead_s_p95']:>9}{t['cpu_s_per_turn']:>9}{t['cpu_share']:>7}{t['peak_rss_mb']:>8}"
              f"{t['health_ms_p50']:>11}{t['health_ms_p99']:>7}{t['health_ms_max']:>8}{t['loop_lag_ms_p99']:>8}"
              f"{t['loop_lag_ms_max']:>8}{str(t['control_ms_p99']):>8}{str(t['refused_all']):>8}"
              f"{str(t['failed_all']):>7}")
    speed = {}
    for users_n in users:
        one = next((t for t in table if t["users"] == users_n and t["workers"] == 1), None)
        two = next((t for t in table if t["users"] == users_n and t["workers"] == 2), None)
        if one and two and one["turns_per_min"]:
            speed[users_n] = round(two["turns_per_min"] / one["turns_per_min"], 2)
            print(f"2 workers vs 1 at {users_n} users: {speed[users_n]}x turns/min")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tiny": args.tiny, "turns_per_user": args.turns, "sql": SQL,
                               "first_delay_s": args.first_delay, "token_rate": args.token_rate,
                               "cpus": os.cpu_count(), "table": table, "speedup_2_workers": speed, "runs": runs},
                              indent=2))
    print(f"wrote {out}")
    if args.profile:
        from bench.pyspy import summary

        print(summary(args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
