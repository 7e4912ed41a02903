"""Benchmark: the app CPU one streamed answer costs, per 1,000 deltas, and per re-attached follower.

    python bench/streaming.py [--tiny] [--runs 1000:20,5000:5] [--followers 1,5] [--reps 1]

Two real `datadesk serve` processes on 127.0.0.1 sharing one data directory (worker A runs the
turns, worker B is "another worker": a follower there reads the thread's events.jsonl), sandbox
off, summaries off, the real OpenAI client against the fake OpenAI-compatible server
(tests/fakes/openai_server.py) in a third process, so that its CPU is not counted. The fake
streams an answer of D deltas of ~4 characters of Markdown (paragraphs, a list, a small table),
one every `delta_ms` ms (`--runs D:delta_ms,...`; 20 ms is 50 tokens/s).

Each case is one turn: the POST stream reads it to `done`; k followers (`GET
/api/threads/{tid}/events`, from the start of the turn) attach when the first event arrives, in
worker A ("same") or B ("other"), and read to `done`; every client checks that its text is the
whole answer. App CPU is utime+stime (/proc/<pid>/stat) of both server process trees over the
case, minus what the two idle servers burn over the same wall time (measured first). Reported:
ms of app CPU per 1,000 deltas with no follower (the whole turn, so its fixed cost too), the
marginal ms per delta between the two answer sizes, and the extra ms per 1,000 deltas per
follower: (case with k followers - case with none) / k.

Prints a table and writes JSON to bench/results/streaming.json. Inserts its own repo root and
platform/ first on sys.path and PYTHONPATH, so a copy of the repo (a git worktree of an older
commit) measures its own code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bench.proctree import tree_cpu  # noqa: E402



# -- the fake model, in its own process -------------------------------------------------
def answer_text(deltas: int) -> str:
    """Markdown of about 4 * `deltas` characters: paragraphs, a list, a small table, repeated."""
    unit = ("Revenue grew in **every region** last quarter, led by the north.\n\n"
            "- north: up 12%\n- south: up 7%\n- west: flat\n\n"
            "| region | q3 | q4 |\n|---|---:|---:|\n| north | 1.2 | 1.4 |\n| south | 0.9 | 1.0 |\n\n"
            "The `west` stayed where it was; see the table above.\n\n")
    out, want = [], 4 * deltas
    while sum(map(len, out)) < want:
        out.append(unit)
    return "".join(out)[:want]


def fake_llm_main() -> None:
    """`--fake-llm`: serve a user message `stream D MS` with D deltas, MS ms apart; print the
    base URL, then run until stdin closes."""
    from tests.fakes.openai_server import FakeOpenAIServer, FakeReply

    def respond(req: dict[str, Any]) -> FakeReply:
        users = [m for m in req.get("messages", []) if m.get("role") == "user"]
        m = re.search(r"stream (\d+) ([\d.]+)", str(users[-1].get("content") if users else ""))
        deltas, ms = (int(m.group(1)), float(m.group(2))) if m else (10, 0.0)
        return FakeReply(text=answer_text(deltas), chunks=deltas, delay_s=ms / 1000)

    server = FakeOpenAIServer(models=None)
    server.responder = respond
    server.start()
    print(server.base_url, flush=True)
    sys.stdin.read()
    server.stop()


# -- processes and their CPU --------------------------------------------------------------
def start_fake(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--fake-llm"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


# -- clients --------------------------------------------------------------------------------
class Reader:
    """One SSE client of the turn: its text, events, `html` refreshes and the last `html`."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.events = self.html = 0
        self.completed_html = ""
        self.done = False
        self.first = threading.Event()
        self.error: str | None = None

    def read(self, client: Any, method: str, url: str, **kw: Any) -> None:
        try:
            with client.stream(method, url, **kw) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"{method} {url}: {resp.status_code}")
                event, data = "message", []
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip(" "))
                    elif not line and data:
                        self._event(event, json.loads("\n".join(data)))
                        event, data = "message", []
        except Exception as exc:  # reported by the case
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.first.set()

    def _event(self, event: str, data: dict[str, Any]) -> None:
        self.events += 1
        self.first.set()
        if event == "message.delta":
            self.text.append(data.get("text", ""))
            self.html += "html" in data
        elif event == "message.completed":
            self.completed_html = data.get("html", "")
        elif event == "done":
            self.done = True


def one_case(bases: dict[str, str], pids: list[int], token: str, deltas: int, delta_ms: float,
             followers: int, where: str, idle_rate: float) -> dict[str, Any]:
    import httpx

    answer = answer_text(deltas)
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx.Timeout(30, read=120)
    with httpx.Client(base_url=bases["same"], headers=headers, timeout=timeout) as c:
        tid = c.post("/api/threads", json={"title": "bench"}).json()["id"]
    clients = [httpx.Client(headers=headers, timeout=timeout) for _ in range(followers + 1)]
    poster, readers = Reader(), [Reader() for _ in range(followers)]
    cpu0, t0 = sum(tree_cpu(p) for p in pids), time.monotonic()
    threads = [threading.Thread(target=poster.read, args=(clients[0], "POST", f"{bases['same']}/api/threads/{tid}/"
                                                          "messages"), kwargs={"json": {
                                                              "content": f"stream {deltas} {delta_ms}"}})]
    threads[0].start()
    poster.first.wait(60)
    for reader, client in zip(readers, clients[1:]):
        threads.append(threading.Thread(target=reader.read, args=(client, "GET", f"{bases[where]}/api/threads/"
                                                                  f"{tid}/events")))
        threads[-1].start()
    for t in threads:
        t.join(600)
    wall = time.monotonic() - t0
    cpu = sum(tree_cpu(p) for p in pids) - cpu0 - idle_rate * wall
    for client in clients:
        client.close()
    for r in (poster, *readers):
        if r.error or not r.done or "".join(r.text) != answer:
            raise AssertionError(f"a client did not get the whole answer: error={r.error} done={r.done} "
                                 f"chars={len(''.join(r.text))}/{len(answer)}")
    return {"deltas": deltas, "delta_ms": delta_ms, "followers": followers, "where": where,
            "wall_s": round(wall, 2), "app_cpu_s": round(cpu, 4), "events": poster.events,
            "html_refreshes": poster.html, "follower_events": [r.events for r in readers],
            "completed_html_chars": len(poster.completed_html)}


def median_case(reps: int, *args: Any) -> dict[str, Any]:
    rows = [one_case(*args) for _ in range(reps)]
    out = dict(rows[len(rows) // 2])
    out["app_cpu_s"] = round(statistics.median(r["app_cpu_s"] for r in rows), 4)
    out["app_cpu_s_all"] = [r["app_cpu_s"] for r in rows]
    return out


def idle_rate_s(pids: list[int], seconds: float) -> float:
    """CPU-seconds per wall second the idle servers burn (timers, heartbeats)."""
    cpu0, t0 = sum(tree_cpu(p) for p in pids), time.monotonic()
    time.sleep(seconds)
    return (sum(tree_cpu(p) for p in pids) - cpu0) / (time.monotonic() - t0)


# -- the run ------------------------------------------------------------------------------------
@contextlib.contextmanager
def servers(tmp: Path, extra_toml: str = "") -> Iterator[tuple[dict[str, str], list[int], str]]:
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore
    from datadesk.store.workspaces import ensure_demo_workspace
    from tests.conftest import free_port
    from tests.serving import start_serve, stop_serve

    home = tmp / "var"
    home.mkdir()
    (home / "datadesk.toml").write_text('[sandbox]\nbackend = "none"\n[summary]\nenabled = false\n'
                                        "[chat]\nmax_turns_per_user = 4\n" + extra_toml)
    ensure_demo_workspace(Layout(home))
    _, token = UserStore(Layout(home)).add("bench", ["demo"], [])
    path = os.pathsep.join([str(ROOT / "platform"), str(ROOT)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DATADESK_"))}
    env.update(PYTHONPATH=path, PYTHONUNBUFFERED="1", DATADESK_HOME=str(home),
               DATADESK_CONFIG=str(home / "datadesk.toml"))
    fake, base_url = start_fake(env)
    env.update(DATADESK_LLM_BASE_URL=base_url, DATADESK_LLM_API_KEY="sk-bench", DATADESK_LLM_MODEL="fake-model")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        bases = {}
        for where in ("same", "other"):
            port = free_port()
            procs.append(start_serve(home, env, port, tmp / f"serve-{where}.log"))
            bases[where] = f"http://127.0.0.1:{port}"
        yield bases, [p.pid for p in procs], token
    finally:
        for p in procs:
            stop_serve(p, 30)
        assert fake.stdin is not None
        fake.stdin.close()
        fake.wait(30)


def run(runs: list[tuple[int, float]], followers: list[int], reps: int, extra_toml: str = "") -> dict[str, Any]:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        with servers(Path(tmp), extra_toml) as (bases, pids, token):
            one_case(bases, pids, token, 50, 10.0, 1, "other", 0.0)  # warm up both workers (0.5 s: B attaches in time)
            idle = idle_rate_s(pids, 3.0)
            for deltas, ms in runs:
                base = median_case(reps, bases, pids, token, deltas, ms, 0, "same", idle)
                cases.append(base)
                for where in ("same", "other"):
                    for k in followers:
                        row = median_case(reps, bases, pids, token, deltas, ms, k, where, idle)
                        row["per_follower_ms_per_1000"] = round(
                            (row["app_cpu_s"] - base["app_cpu_s"]) / k / deltas * 1e6, 1)
                        cases.append(row)
    summary = []
    for deltas, ms in runs:
        mine = [c for c in cases if c["deltas"] == deltas and c["delta_ms"] == ms]
        base = mine[0]
        summary.append({"deltas": deltas, "delta_ms": ms, "events_sent": base["events"],
                        "html_refreshes": base["html_refreshes"],
                        "ms_per_1000_deltas": round(base["app_cpu_s"] / deltas * 1e6, 1),
                        **{f"follower_{c['where']}_{c['followers']}_ms_per_1000": c["per_follower_ms_per_1000"]
                           for c in mine[1:]}})
    if len(runs) >= 2:
        (d1, _), (d2, _) = runs[0], runs[1]
        c1 = next(c for c in cases if c["deltas"] == d1 and c["followers"] == 0)
        c2 = next(c for c in cases if c["deltas"] == d2 and c["followers"] == 0)
        marginal = round((c2["app_cpu_s"] - c1["app_cpu_s"]) / (d2 - d1) * 1000, 3) if d2 != d1 else None
    else:
        marginal = None
    return {"idle_cpu_s_per_s": round(idle, 4), "cases": cases, "summary": summary,
            "marginal_ms_per_delta": marginal}


def print_table(result: dict[str, Any], followers: list[int]) -> None:
    print("\nApp CPU of one streamed answer (both servers, idle subtracted)")
    cols = ["deltas", "delta ms", "events", "html", "ms/1000 deltas"]
    cols += [f"+{w} x{k}" for w in ("same", "other") for k in followers]
    print("".join(f"{c:>15}" for c in cols))
    for s in result["summary"]:
        vals = [s["deltas"], s["delta_ms"], s["events_sent"], s["html_refreshes"], s["ms_per_1000_deltas"]]
        vals += [s.get(f"follower_{w}_{k}_ms_per_1000") for w in ("same", "other") for k in followers]
        print("".join(f"{v!s:>15}" for v in vals))
    print("(+where xk: extra ms of app CPU per 1,000 deltas per follower, k followers in the same / other worker)")
    if result["marginal_ms_per_delta"] is not None:
        print(f"marginal app CPU per delta between the two sizes: {result['marginal_ms_per_delta']} ms")
    print(f"idle servers: {result['idle_cpu_s_per_s'] * 1000:.1f} ms CPU per s (subtracted)")


def main() -> int:
    if "--fake-llm" in sys.argv:
        fake_llm_main()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--runs", default="1000:20,5000:5", help="answers as DELTAS:MS_BETWEEN_DELTAS,...")
    ap.add_argument("--followers", default="1,5", help="follower counts")
    ap.add_argument("--reps", type=int, default=1, help="turns per case (the median counts)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "streaming.json")
    ap.add_argument("--toml", default="", help="settings added to the defaults, e.g. '[llm]\\nhttp_client = \"httpx\"'")
    args = ap.parse_args()
    if args.tiny:
        runs, followers = [(200, 5.0), (400, 5.0)], [1]
    else:
        runs = [(int(d), float(ms)) for d, ms in (part.split(":") for part in args.runs.split(","))]
        followers = [int(k) for k in args.followers.split(",")]
    result = run(runs, followers, 1 if args.tiny else args.reps, args.toml.replace("\\n", "\n"))
    print_table(result, followers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tiny": args.tiny, **result, "python": sys.version.split()[0],
                                    "code": str(ROOT)}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
