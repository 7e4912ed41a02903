"""Benchmark: a giant streamed Markdown answer (a table of thousands of rows) vs other users' health.

    python bench/render_stream.py [--sizes 64,128,300] [--legacy] [--chunk 256] [--delay-ms 0.5]

The real app under uvicorn on 127.0.0.1 (sandbox off), the scripted model streaming the answer in
256-char deltas 0.5 ms apart (`--chunk`, `--delay-ms`: a real model is slower), one client reading the SSE stream while another polls
`/api/health` every 20 ms. Reported per answer size: the stream's wall time, the number of live
`html` refreshes, and health latency p50 / p99 / max. `--legacy` also runs the renderer this
replaced (the whole text re-rendered on the event loop every 0.25 s), each stream capped at
60 s (the issue saw 2.4 s health stalls at 64 KB and no end at 128 KB).

Prints a table and writes JSON to bench/results/render_stream.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from datadesk.api import event_stream  # noqa: E402
from datadesk.api.render import markdown_html  # noqa: E402
from datadesk.composition import Runtime  # noqa: E402
from datadesk.llm.scripted import ScriptedModel, ScriptStep  # noqa: E402
from datadesk.settings import SandboxSettings, Settings, SummarySettings  # noqa: E402
from datadesk.store.layout import Layout  # noqa: E402
from datadesk.store.workspaces import ensure_demo_workspace  # noqa: E402
from bench.turn_overhead import served  # noqa: E402


def big_table(min_chars: int) -> str:
    rows = ["| id | name | value | note |", "|---:|---|---:|---|"]
    size, i = 60, 0
    while size < min_chars:
        rows.append(f"| {i} | sensor-{i % 97} | {i * 3.25:.2f} | reading number {i} of the day |")
        size += len(rows[-1]) + 1
        i += 1
    return "Here are all rows:\n\n" + "\n".join(rows) + "\n\nThat is all.\n"


class LegacyRendering:
    """The renderer before issue 15: the whole text, on the event loop, every 0.25 s."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.at = 0.0

    async def events(self, ev: Any, send: bool = True) -> list[tuple[str, dict[str, Any]]]:
        data = ev.data
        if ev.type == "message.delta":
            self.text.append(str(data.get("text", "")))
            if time.monotonic() - self.at >= event_stream.HTML_EVERY_S:
                self.at = time.monotonic()
                data = {**data, "html": markdown_html("".join(self.text), limit=1 << 30)}
        elif ev.type == "message.completed":
            data = {**data, "html": markdown_html(str(data.get("content") or ""), limit=1 << 30)}
        return [(ev.type, data)]


def run_one(home: Path, kb: int, legacy: bool, chunk: int, delay_ms: float) -> dict[str, Any]:
    answer = big_table(kb * 1024)
    model = ScriptedModel([ScriptStep(text=answer, delay_s=delay_ms / 1000)], chunk_size=chunk)
    rt = Runtime(settings=Settings(home=home, sandbox=SandboxSettings(backend="none"),
                                   summary=SummarySettings(enabled=False)), model=model)
    name = f"r{kb}{'l' if legacy else ''}"
    _, token = rt.users.add(name, ["demo"], [])
    from datadesk.api.app import create_app

    original = event_stream.TurnRendering
    if legacy:
        event_stream.TurnRendering = LegacyRendering  # type: ignore[misc,assignment]
    health: list[float] = []
    done = threading.Event()
    result: dict[str, Any] = {"chunk": chunk, "delay_ms": delay_ms, "answer_kb": round(len(answer) / 1024), "renderer": "legacy" if legacy else "bounded"}
    try:
        with served(create_app(rt)) as base:
            def poll() -> None:
                with httpx.Client(base_url=base, timeout=120) as c:
                    while not done.is_set():
                        t = time.perf_counter()
                        c.get("/api/health")
                        health.append(time.perf_counter() - t)
                        time.sleep(0.02)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            t0 = time.perf_counter()
            refreshes, complete = 0, False
            try:
                with httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=60),
                                  headers={"Authorization": f"Bearer {token}"}) as c:
                    tid = c.post("/api/threads", json={"title": "big"}).json()["id"]
                    with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "all rows"}) as r:
                        for line in r.iter_lines():
                            if line.startswith("data:") and '"html"' in line:
                                refreshes += 1
                            if line.startswith("event: done"):
                                complete = True
                            if time.perf_counter() - t0 > 60:
                                break
            except httpx.TimeoutException:
                pass
            result.update(stream_s=round(time.perf_counter() - t0, 2), completed=complete, html_refreshes=refreshes)
            done.set()
            poller.join(120)
    finally:
        event_stream.TurnRendering = original  # type: ignore[misc]
    hs = sorted(health)
    result.update(health_calls=len(hs), health_p50_ms=round(statistics.median(hs) * 1000, 1),
                  health_p99_ms=round(hs[min(len(hs) - 1, int(len(hs) * 0.99))] * 1000, 1),
                  health_max_ms=round(hs[-1] * 1000, 1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,128,300", help="answer sizes in KB")
    ap.add_argument("--legacy", action="store_true", help="also run the old renderer at each size (capped at 60 s)")
    ap.add_argument("--chunk", type=int, default=256, help="chars per model delta")
    ap.add_argument("--delay-ms", type=float, default=0.5, help="pause before each delta")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "render_stream.json")
    args = ap.parse_args()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "var"
        ensure_demo_workspace(Layout(home))
        for kb in [int(s) for s in args.sizes.split(",")]:
            rows.append(run_one(home, kb, False, args.chunk, args.delay_ms))
            if args.legacy:
                rows.append(run_one(home, kb, True, args.chunk, args.delay_ms))
    cols = ["renderer", "chunk", "delay_ms", "answer_kb", "completed", "stream_s", "html_refreshes", "health_calls",
            "health_p50_ms", "health_p99_ms", "health_max_ms"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
