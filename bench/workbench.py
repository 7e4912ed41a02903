"""Benchmark: finding and keeping work (issue 19, item 3).

    python bench/workbench.py [--tiny]

1. Search (store/search.py, SQLite FTS5): 100 threads of 200 records each (user questions,
   answers, SQL calls and ~2,000-char tool results; words from a Zipf-like vocabulary of 5,000
   terms) written through `Thread.append`. Reported:
   the first search (it indexes every thread: the catch-up a new index or an old data dir pays
   once), then warm query latency p50/p95/max over a rare word, a common word, a prefix, a
   phrase and a two-word query, and a search right after one more append (the append hook
   plus the sync check of 100 threads).
2. Export (threads/export.py, threads/notebook.py, api/controllers/export.py): a 50-turn thread (each turn: a
   question, an SQL call with an offloaded Parquet result, a python call with its output and a
   PNG chart, an answer) exported to Markdown, HTML, the notebook and the zip; p50/max of the
   wall time of each, reading the log and the artifacts included.

`--tiny`: 10 threads of 50 records, a 10-turn thread, fewer runs (< 20 s).
Prints tables and writes JSON to bench/results/workbench.json (workbench-tiny.json with --tiny).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from datadesk.api.controllers.export import thread_html  # noqa: E402
from datadesk.threads.export import ThreadDocument  # noqa: E402
from datadesk.threads.notebook import notebook_for, write_bundle  # noqa: E402
from datadesk.domain.artifacts import ArtifactOrigin  # noqa: E402
from datadesk.domain.records import Record, ToolCall, record_meta, ToolRecordMeta, ArtifactRef, OutputFile  # noqa: E402
from datadesk.offload.artifacts.store import ArtifactStore  # noqa: E402
from datadesk.store.layout import Layout  # noqa: E402
from datadesk.store.search import ThreadSearch  # noqa: E402
from datadesk.store.threads import Thread, ThreadStore  # noqa: E402

WORDS = ("energy consumption building heating cooling ventilation meter holiday weekday weekend "
         "temperature occupancy kilowatt report anomaly baseline forecast tariff peak demand").split()


def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs) * 1000, 2), "p95": round(xs[int(0.95 * (len(xs) - 1))] * 1000, 2),
            "max": round(xs[-1] * 1000, 2), "runs": len(xs)}


# text drawn from a Zipf-like vocabulary (the domain words most frequent, then 5,000 others), so
# a "common word" is in most records and a rare one in a few, as in real threads
_VOCAB = WORDS + [f"term{k}" for k in range(5_000)]
_WEIGHTS = [1.0 / (rank + 1) for rank in range(len(_VOCAB))]
_RNG = random.Random(19)


def _text(i: int, n: int) -> str:
    return " ".join(_RNG.choices(_VOCAB, weights=_WEIGHTS, k=n)) + f" item{i}"


def fill_threads(store: ThreadStore, threads: int, records: int) -> None:
    for t in range(threads):
        thread = store.create("demo", "analyst", f"Analysis {t}: {WORDS[t % len(WORDS)]}")
        for i in range(records):
            role = ("user", "assistant", "tool")[i % 3]
            content = _text(t * records + i, 12 if role != "tool" else 300)
            if t == threads // 2 and i == records // 3:
                content += " the quokka anomaly of building B07"
            calls = [ToolCall(id=f"c{i}", name="sql_query", arguments=json.dumps({"sql": f"SELECT {i}"}))] \
                if role == "assistant" else None
            thread.append(lambda seq, r=role, c=content, k=calls, i=i: Record(
                seq=seq, role=r, ts=time.time(), content=c, tool_calls=k,
                tool_call_id=f"c{i - 1}" if r == "tool" else None, name="sql_query" if r == "tool" else None))


def bench_search(home: Path, threads: int, records: int, runs: int) -> dict:
    layout = Layout(home)
    store = ThreadStore(layout)
    t0 = time.perf_counter()
    fill_threads(store, threads, records)
    fill_s = time.perf_counter() - t0
    finder = ThreadSearch(layout, Thread.at)
    t0 = time.perf_counter()
    first = finder.search("analyst", ["demo"], "quokka")
    cold_s = time.perf_counter() - t0
    assert first and first[0].snippet, first
    queries = {"rare word": "quokka", "common word": WORDS[0], "prefix": "ventil", "phrase": '"heating cooling"',
               "two words": "tariff anomaly"}
    warm = {}
    for name, q in queries.items():
        xs = []
        for _ in range(runs):
            t0 = time.perf_counter()
            finder.search("analyst", ["demo"], q, limit=20)
            xs.append(time.perf_counter() - t0)
        warm[name] = _ms(xs)
    thread = next(iter(store.folders("demo", "analyst")))
    xs = []
    for i in range(max(3, runs // 4)):
        thread.append(lambda seq, i=i: Record(seq=seq, role="user", ts=time.time(), content=f"wombat{i} question"))
        t0 = time.perf_counter()
        hits = finder.search("analyst", ["demo"], f"wombat{i}")
        xs.append(time.perf_counter() - t0)
        assert hits, i
    index_bytes = (layout.user_dir("demo", "analyst") / "search.sqlite").stat().st_size
    return {"threads": threads, "records_per_thread": records, "fill_s": round(fill_s, 2),
            "first_search_indexing_s": round(cold_s, 3), "warm": warm, "after_append": _ms(xs),
            "index_mb": round(index_bytes / 1e6, 1)}


def _chart_png(i: int) -> bytes:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.plot(range(30), [((k * (i + 3)) % 17) for k in range(30)])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def fill_analysis(home: Path, turns: int):
    layout = Layout(home)
    thread = ThreadStore(layout).create("demo", "analyst", "Fifty-turn analysis")
    arts = ArtifactStore(layout)
    origin = ArtifactOrigin(source="tool", user="analyst", thread=thread.id, workspace="demo", tool="sql_query")
    table = pa.table({"day": [f"2024-01-{d % 28 + 1:02d}" for d in range(2000)], "kwh": [float(d) for d in range(2000)]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    png = _chart_png(1)

    def add(**kw):
        return thread.append(lambda seq: Record(seq=seq, ts=time.time(), **kw))

    for t in range(turns):
        add(role="user", content=f"Question {t}: daily kWh of building B{t % 20 + 1:02d}?")
        sql = f"SELECT day, kwh FROM readings WHERE building_id = 'B{t % 20 + 1:02d}'"
        add(role="assistant", content="", tool_calls=[ToolCall(id=f"s{t}", name="sql_query", arguments=json.dumps({"sql": sql}))])
        a = arts.save_bytes(thread, buf.getvalue(), "parquet", "result", "application/vnd.apache.parquet", origin)
        add(role="tool", tool_call_id=f"s{t}", name="sql_query", content=f"[Result saved as artifact {a.id}]\n" + _text(t, 200),
            meta=record_meta(ToolRecordMeta(artifact=ArtifactRef(id=a.id, status="ready", rows=2000, columns=2,
                                                                 bytes=a.bytes, format="parquet", path=a.sandbox_path))))
        code = f'import pandas as pd\ndf = pd.read_parquet("{a.sandbox_path}")\nprint(df["kwh"].sum())\n'
        add(role="assistant", content="", tool_calls=[ToolCall(id=f"p{t}", name="python", arguments=json.dumps({"code": code}))])
        img = arts.save_bytes(thread, png, "png", "deliverable", "image/png", origin)
        add(role="tool", tool_call_id=f"p{t}", name="python",
            content=f"status: ok (0.10 s)\nstdout:\n{1999000.0 + t}\n\nimage: artifact {img.id} (PNG)",
            meta=record_meta(ToolRecordMeta(status="ok", images=[img.id], artifacts=[OutputFile.of(img)])))
        add(role="assistant", content=f"## Turn {t}\n\nThe total is **{1999000 + t:,} kWh**.\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    return thread, arts


def bench_export(home: Path, turns: int, runs: int) -> dict:
    thread, arts = fill_analysis(home, turns)
    out_dir = Path(tempfile.mkdtemp())
    formats = {
        "md": lambda: ThreadDocument.read(thread, arts).to_markdown(),
        "html": lambda: thread_html(ThreadDocument.read(thread, arts)),
        "ipynb": lambda: json.dumps(notebook_for(ThreadDocument.read(thread, arts))),
        "zip": lambda: write_bundle(ThreadDocument.read(thread, arts), out_dir / "bundle.zip"),
    }
    result = {"turns": turns, "records": sum(1 for _ in thread.log)}
    for name, fn in formats.items():
        xs = []
        size = 0
        for _ in range(runs):
            t0 = time.perf_counter()
            value = fn()
            xs.append(time.perf_counter() - t0)
            size = len(value) if isinstance(value, str) else (out_dir / "bundle.zip").stat().st_size
        result[name] = {**_ms(xs), "mb": round(size / 1e6, 2)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="10 threads of 50 records, a 10-turn thread (< 20 s)")
    args = ap.parse_args()
    threads, records, runs = (10, 50, 10) if args.tiny else (100, 200, 40)
    turns, export_runs = (10, 2) if args.tiny else (50, 5)
    with tempfile.TemporaryDirectory() as tmp:
        search = bench_search(Path(tmp) / "search", threads, records, runs)
        export = bench_export(Path(tmp) / "export", turns, export_runs)
    print(f"\nSearch: {threads} threads x {records} records (indexing on the first search: "
          f"{search['first_search_indexing_s']} s, index {search['index_mb']} MB)")
    print(f"{'query':<16}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
    for name, r in {**search["warm"], "after an append": search["after_append"]}.items():
        print(f"{name:<16}{r['p50']:>10}{r['p95']:>10}{r['max']:>10}")
    print(f"\nExport: a {turns}-turn thread ({export['records']} records, {turns} charts, {turns} Parquet results)")
    print(f"{'format':<8}{'p50 ms':>10}{'max ms':>10}{'size MB':>10}")
    for name in ("md", "html", "ipynb", "zip"):
        r = export[name]
        print(f"{name:<8}{r['p50']:>10}{r['max']:>10}{r['mb']:>10}")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / ("workbench-tiny.json" if args.tiny else "workbench.json")
    path.write_text(json.dumps({"tiny": args.tiny, "search": search, "export": export}, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
