"""Bombs against the whole app (issue 15, issue 24): while user A's bomb runs, measure
`/api/health` latency (p50/p99), user B's turn latency (a small SQL query), B's plain API requests
(the slowest one), A's time to refusal, how many of A's requests got 429 and the app's peak RSS. The app runs in a child process (uvicorn, the real API, a scripted model that runs the
SQL a message names), so its RSS is its own. Prints a table, writes bench/results/bombs.json.

    python bench/bombs.py [--only sql_cross_join] [--tiny]

A full run writes bench/results/bombs.json; `--only` / `--tiny` write bombs-partial.json.

To add a bomb: a function `(client, base, headers_a) -> str` (what A got back) in BOMBS; it may
return `(str, {"a_429": n})` to report the requests of A that were refused with 429.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "bombs.json"
CEILING_MB = 2048  # limits.app_memory_mb (default): the app's RSS must stay under it

APP = r"""
import json, sys
from pathlib import Path
import msgspec, uvicorn
from datadesk.api.app import create_app
from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel, ScriptStep, tool_step
from datadesk.settings import Settings
from datadesk.store.demo import create_demo_warehouse
from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from datadesk.store.workspaces import ensure_demo_workspace

home, port, root, a_threads = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
layout = Layout(home)
create_demo_warehouse(layout.workspace_data_dir("demo"))
ensure_demo_workspace(layout)
sys.path.insert(0, root)
from tests.fakes.mcp_bombs import mcp_bomb_config  # the fake MCP server, with a 300 MB answer
MCP = mcp_bomb_config(home)

def step(messages, tools):
    last = messages[-1]
    if last.get("role") == "tool":
        return "done: " + str(last.get("content"))[:300]
    text = last.get("content") if isinstance(last.get("content"), str) else ""
    if text.startswith("answer:"):  # a giant streamed Markdown table (bench/render_stream.py's shape)
        rows, i = ["| id | name | value | note |", "|---:|---|---:|---|"], 0
        size, want = 60, int(text.split(":", 1)[1]) * 1024  # a running total: the fake model costs nothing
        while size < want:
            rows.append(f"| {i} | sensor-{i % 97} | {i * 3.25:.2f} | reading number {i} of the day |")
            size += len(rows[-1]) + 1
            i += 1
        return ScriptStep(text="Here are all rows:\n\n" + "\n".join(rows) + "\n\nThat is all.\n", delay_s=0.0005)
    if text.startswith("mcp:"):
        return tool_step(*MCP)
    if "run:" in text:
        return tool_step("sql_query", {"sql": text.split("run:", 1)[1].strip()})
    return "ok"

settings = msgspec.convert({"home": str(home), "sandbox": {"backend": "none"}, "summary": {"enabled": False}},
                           Settings, dec_hook=lambda t, o: Path(o))
rt = Runtime(settings=settings, model=ScriptedModel(then=step, chunk_size=256))
users = UserStore(rt.layout)
tokens = {name: users.add(name, ["demo"], [])[1] for name in ("usera", "userb")}
for i in range(a_threads):  # a user with history: listing their threads reads each one's files
    rt.threads.create("demo", "usera", f"analysis {i}")
(home / "tokens.json").write_text(json.dumps(tokens))
uvicorn.run(create_app(rt), host="127.0.0.1", port=port, log_level="warning")
"""


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def turn(client: httpx.Client, base: str, headers: dict[str, str], content: str) -> str:
    tid = client.post(f"{base}/api/threads", json={}, headers=headers).json()["id"]
    r = client.post(f"{base}/api/threads/{tid}/messages", json={"content": content}, headers=headers,
                    timeout=600)
    return r.text


def sql_cross_join(client: httpx.Client, base: str, headers: dict[str, str]) -> str:
    """A cross join that grows a list of 400 M entries (GBs unbounded: the issue saw 6 GB in 22 s)."""
    body = turn(client, base, headers, "run: SELECT list(a.range) FROM range(20000) a, range(20000) b")
    return _tool_preview(body)


def sql_cross_join_x4(client: httpx.Client, base: str, headers: dict[str, str]) -> str:
    """Four cross joins at once from A (four threads): A's own turn and query slots refuse the
    extra ones, so the app's memory never holds more than one of A's queries."""
    results: list[str] = []

    def one() -> None:
        with httpx.Client() as own:
            try:
                results.append(sql_cross_join(own, base, headers)[:70])
            except httpx.HTTPError as exc:
                results.append(f"http error {exc!r}"[:70])

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return " || ".join(sorted(results))


def _answer(kb: int) -> Callable[[httpx.Client, str, dict[str, str]], str]:
    """A `kb` KB streamed Markdown answer (a table of thousands of rows and more): rendered in
    bounded pieces off the event loop, and past the per-block cap shown as plain text, instead of
    stalling the loop for everyone."""
    def bomb(client: httpx.Client, base: str, headers: dict[str, str]) -> str:
        tid = client.post(f"{base}/api/threads", json={}, headers=headers).json()["id"]
        deltas, done = 0, False
        with client.stream("POST", f"{base}/api/threads/{tid}/messages", json={"content": f"answer:{kb}"},
                           headers=headers, timeout=600) as r:
            for line in r.iter_lines():
                deltas += line.startswith("event: message.delta")
                done = done or line.startswith("event: done")
        return f"completed={done}, {deltas} deltas streamed"
    return bomb


def api_flood_1000(client: httpx.Client, base: str, headers: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """1,000 API requests from A (its thread list, mostly, with /api/me and a thread), 100 at a
    time: A's request budget and in-flight cap refuse most of them with 429 and Retry-After."""
    tid = client.get(f"{base}/api/threads", headers=headers).json()[0]["id"]
    paths = ["/api/threads"] * 8 + ["/api/me", f"/api/threads/{tid}"]

    async def flood() -> dict[int | str, int]:
        statuses: dict[int | str, int] = {}
        gate = asyncio.Semaphore(100)
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=600) as own:
            async def one(i: int) -> None:
                async with gate:
                    try:
                        r = await own.get(base + paths[i % len(paths)], headers=headers)
                        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    except httpx.HTTPError as exc:  # named in the table: a refusal must be an answer
                        statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
            await asyncio.gather(*(one(i) for i in range(1000)))
        return statuses

    t0 = time.monotonic()
    statuses = asyncio.run(flood())
    wall = time.monotonic() - t0
    got = ", ".join(f"{n} x {code}" for code, n in sorted(statuses.items(), key=str))
    return f"{got} in {wall:.1f} s", {"a_429": statuses.get(429, 0)}


def mcp_result_300mb(client: httpx.Client, base: str, headers: dict[str, str]) -> str:
    """An MCP server (over stdio) that answers with a 300 MB result: spooled to disk past 8 MB,
    refused past limits.mcp_result_max_mb (256 MB) while it streams, never held whole."""
    return _tool_preview(turn(client, base, headers, "mcp: big"))


def _tool_preview(sse: str) -> str:
    for block in sse.replace("\r\n", "\n").split("\n\n"):
        if "event: tool.finished" in block:
            data = "\n".join(line[5:].lstrip(" ") for line in block.splitlines() if line.startswith("data:"))
            return str(json.loads(data).get("preview", ""))[:160]
    return "no tool ran: " + sse.strip()[:140]  # e.g. the turn was refused (429: limits of turns)


def _upload_bomb(build: Callable[[Path], Path], name: str) -> Callable[[httpx.Client, str, dict[str, str]], str]:
    """A file built by bench/upload_bombs.py, uploaded by A: what came back (status, error)."""
    def bomb(client: httpx.Client, base: str, headers: dict[str, str]) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            path = build(Path(tmp) / name)
            tid = client.post(f"{base}/api/threads", json={}, headers=headers).json()["id"]
            with open(path, "rb") as fh:
                r = client.post(f"{base}/api/threads/{tid}/uploads", files={"file": (name, fh)},
                                headers=headers, timeout=600)
            return f"{r.status_code} {r.text[:140]}"
    return bomb


def _upload_bombs() -> dict[str, Callable[[httpx.Client, str, dict[str, str]], str]]:
    sys.path.insert(0, str(ROOT / "bench"))
    import upload_bombs as ub  # the builders (issue 15, uploads)
    return {
        "xlsx_shared_strings_1gib": _upload_bomb(lambda p: ub.shared_strings_bomb(p, 1024**3), "ss.xlsx"),
        "xlsx_shared_strings_80mib": _upload_bomb(lambda p: ub.small_strings(p, 80 << 20), "ss80.xlsx"),
        "xlsx_sheet_bomb": _upload_bomb(lambda p: ub.xlsx(p, ub.sheet_xml(
            [(1, [ub.inline("A1", "n")]), (2, [ub.num("A2", 1)]), (60_000_000, [ub.num("A60000000", 2)])])),
            "rows.xlsx"),
        "csv_190mb_cell": _upload_bomb(lambda p: ub.one_cell_csv(p, 181), "cell.csv"),  # 190 MB: under the upload cap
        "zip_50_levels": _upload_bomb(lambda p: ub.nested_zip(p, 50), "nested.zip"),
    }


BOMBS: dict[str, Callable[[httpx.Client, str, dict[str, str]], str]] = {
    "sql_cross_join": sql_cross_join,
    "sql_cross_join_x4": sql_cross_join_x4,
    **_upload_bombs(),
    "answer_300kb": _answer(300),
    "answer_312kb": _answer(312),
    "mcp_result_300mb": mcp_result_300mb,
    "api_flood_1000": api_flood_1000,
}
A_THREADS = {"api_flood_1000": 300}  # threads A holds before its bomb (default: none)


TINY = ["sql_cross_join", "zip_50_levels", "mcp_result_300mb"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_bomb(name: str, bomb: Callable[..., str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        home, port = Path(tmp) / "var", free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "platform")}
        proc = subprocess.Popen([sys.executable, "-c", APP, str(home), str(port), str(ROOT),
                                 str(A_THREADS.get(name, 0))], env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client() as client:
                for _ in range(300):
                    try:
                        if client.get(f"{base}/api/health").status_code == 200 and (home / "tokens.json").exists():
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.1)
                tokens = json.loads((home / "tokens.json").read_text())
                ha = {"Authorization": f"Bearer {tokens['usera']}"}
                hb = {"Authorization": f"Bearer {tokens['userb']}"}
                return measure(name, bomb, client, base, ha, hb, proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def b_requests(base: str, hb: dict[str, str], done: threading.Event, took: list[float],
               refused: list[int]) -> None:
    """User B's plain API requests (thread list, profile) every 0.2 s while the bomb runs, each
    timed; on its own connection and thread, so a slow one never delays the health probe. With
    B's turns that is about 8 requests a second, within a user's default budget: an answer other
    than 200 is counted (`b_refused`), it should never happen."""
    paths = ["/api/threads", "/api/me"]
    with httpx.Client(timeout=60) as own:
        i = 0
        while not done.is_set() or not took:
            t0 = time.monotonic()
            status = own.get(base + paths[i % 2], headers=hb).status_code
            took.append(time.monotonic() - t0)
            if status != 200:
                refused.append(status)
            i += 1
            time.sleep(0.2)


def measure(name: str, bomb: Callable[..., Any], client: httpx.Client, base: str,
            ha: dict[str, str], hb: dict[str, str], pid: int) -> dict[str, Any]:
    rss_before = rss_mb(pid)
    out: dict[str, Any] = {}
    done = threading.Event()
    peak = [rss_before]
    b_api: list[float] = []
    b_refused: list[int] = []

    def run_a() -> None:
        t0 = time.monotonic()
        try:
            with httpx.Client() as own:
                got = bomb(own, base, ha)
            out["a_result"], extra = got if isinstance(got, tuple) else (got, {})
            out.update(extra)
        except Exception as exc:  # reported in the table, the run goes on
            out["a_result"] = f"bench error: {exc!r}"[:160]
        finally:
            out["a_refusal_s"] = round(time.monotonic() - t0, 2)
            done.set()

    def sample_rss() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.05)

    threads = [threading.Thread(target=run_a), threading.Thread(target=sample_rss),
               threading.Thread(target=b_requests, args=(base, hb, done, b_api, b_refused))]
    for t in threads:
        t.start()
    health: list[float] = []
    b_turns: list[float] = []
    time.sleep(0.3)  # let the bomb start
    while not done.is_set() or not b_turns:
        t0 = time.monotonic()
        client.get(f"{base}/api/health", timeout=60)
        health.append((time.monotonic() - t0) * 1000)
        if not b_turns or (done.is_set() is False and len(health) % 20 == 0):
            t0 = time.monotonic()
            turn(client, base, hb, "run: SELECT count(*) FROM buildings")
            b_turns.append(time.monotonic() - t0)
        time.sleep(0.02)
    for t in threads:
        t.join()
    health.sort()
    return {
        "bomb": name, "a_refusal_s": out.get("a_refusal_s"), "a_result": out.get("a_result"),
        "a_429": out.get("a_429"),
        "health_p50_ms": round(statistics.median(health), 1),
        "health_p99_ms": round(health[min(len(health) - 1, int(len(health) * 0.99))], 1),
        "health_samples": len(health), "b_turn_s_max": round(max(b_turns), 2),
        "b_request_s_max": round(max(b_api), 2), "b_requests": len(b_api), "b_refused": len(b_refused),
        "rss_before_mb": round(rss_before), "peak_rss_mb": round(max(peak[0], rss_mb(pid, "VmHWM"))),
        "rss_ceiling_mb": CEILING_MB,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(BOMBS))
    parser.add_argument("--tiny", action="store_true", help="CI: three quick bombs, so the bench does not rot")
    args = parser.parse_args()
    wanted = [args.only] if args.only else TINY if args.tiny else list(BOMBS)
    rows = [run_bomb(name, BOMBS[name]) for name in wanted]
    cols = ["bomb", "a_refusal_s", "a_429", "health_p50_ms", "health_p99_ms", "b_turn_s_max", "b_request_s_max",
            "b_refused", "rss_before_mb", "peak_rss_mb", "rss_ceiling_mb"]
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[c]) for c in cols))
        print("   A got:", row["a_result"])
    out = RESULTS if len(wanted) == len(BOMBS) else RESULTS.with_name("bombs-partial.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bombs": rows}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
