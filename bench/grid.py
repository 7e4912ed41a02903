"""Benchmark: the result grid's page time (issue 19, item 1).

    python bench/grid.py [--tiny]

A 1,000,000-row x 8-column Parquet file (ids, a building code, timestamps, floats with nulls,
ints, a free-text note, a flag, a category) as the offload writes them, read by the grid's own
reader (offload/grid/pages.py: a locked-down DuckDB per request, the default `limits.sql_*` bounds:
512 MB, 2 threads) and the page encoded to JSON as the endpoint sends it. Each case is timed
`runs` times, p50 / p95 / max in ms:

- first page: schema + counts (a scan) + the page, nothing cached (a new file each run)
- next page, deep page (offset 500,000): counts cached, as when paging
- sort by a float column (desc): first page, the middle (the worst case: DuckDB's top-N keeps
  half the rows), 90% in and the last page (read in the opposite order from the end)
- filters: `contains` on text, `>` on a float, `=` on the code, each with its count (cold)
- filter + sort, first page
- CSV of a filtered view (every matching row streamed)

`--tiny`: 20,000 rows, 3 runs (CI). Prints a table, writes bench/results/grid.json
(grid-tiny.json with --tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

from datadesk.offload.grid.pages import Filter, GridReader, GridView  # noqa: E402
from datadesk.sources.sqllimits import SQLLimits  # noqa: E402


def make_table(rows: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    kwh = rng.gamma(2.0, 20.0, rows)
    kwh_mask = rng.random(rows) < 0.02
    words = np.array(["ok", "late reading", "estimated", "meter swap", "holiday", "check sensor", "backfilled"])
    return pa.table({
        "id": pa.array(np.arange(rows, dtype=np.int64)),
        "building_id": pa.array([f"B{i:02d}" for i in rng.integers(1, 41, rows)]),
        "ts": pa.array(np.datetime64("2024-01-01T00:00") + (rng.integers(0, 400 * 24, rows) * 3600).astype("timedelta64[s]")),
        "kwh": pa.array(kwh, mask=kwh_mask),
        "temperature_c": pa.array(rng.normal(12, 8, rows).round(1)),
        "occupancy": pa.array(rng.integers(0, 400, rows, dtype=np.int32)),
        "note": pa.array(words[rng.integers(0, len(words), rows)].tolist()),
        "weekend": pa.array(rng.random(rows) < 2 / 7),
    })


def timed(fn, runs: int) -> dict[str, float]:
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
    return {"p50": round(statistics.median(times), 1), "p95": round(p95, 1), "max": round(times[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="20,000 rows, 3 runs (CI)")
    args = ap.parse_args()
    rows, runs = (20_000, 3) if args.tiny else (1_000_000, 15)
    enc = msgspec.json.Encoder()
    tmp = Path(tempfile.mkdtemp(prefix="grid-bench-"))
    try:
        table = make_table(rows)
        base = tmp / "t.parquet"
        pq.write_table(table, base, row_group_size=122_880)
        size_mb = base.stat().st_size / 1e6
        limits = SQLLimits(tmp_root=tmp / "sql")
        reader = GridReader(limits, timeout_s=30)
        cols = reader.columns(base)
        deep = rows // 2
        cold_files = []
        for i in range(runs):  # a fresh file per run: nothing cached
            p = tmp / f"cold{i}.parquet"
            shutil.copy(base, p)
            cold_files.append(p)

        def page(view: GridView, offset: int = 0, path: Path = base, r: GridReader | None = None) -> None:
            rd = r or reader
            enc.encode(rd.page(path, rd.columns(path), view, offset, 100))

        plain = GridView()
        by_kwh = GridView(sort=(("kwh", True),))
        page(plain)  # warms the counts of the unfiltered view
        page(by_kwh)
        contains = GridView(filters=(Filter("note", "contains", "sensor"),))
        gt = GridView(filters=(Filter("kwh", ">", "80"),))
        eq = GridView(filters=(Filter("building_id", "=", "B07"),))
        cases = {
            "first page (cold)": lambda i: page(plain, 0, cold_files[i], GridReader(limits, 30)),
            "next page": lambda i: page(plain, 100 * (i + 1)),
            f"deep page (offset {deep:,})": lambda i: page(plain, deep + 100 * i),
            "sort kwh desc, first page": lambda i: page(by_kwh),
            f"sort kwh desc, offset {deep:,}": lambda i: page(by_kwh, deep),
            f"sort kwh desc, offset {rows * 9 // 10:,}": lambda i: page(by_kwh, rows * 9 // 10),
            "sort kwh desc, last page": lambda i: page(by_kwh, rows - 100),
            "filter note contains (cold)": lambda i: page(contains, 0, cold_files[i], GridReader(limits, 30)),
            "filter kwh > 80 (cold)": lambda i: page(gt, 0, cold_files[i], GridReader(limits, 30)),
            "filter building = B07 (cold)": lambda i: page(eq, 0, cold_files[i], GridReader(limits, 30)),
            "filter + sort, first page": lambda i: page(GridView(sort=(("ts", False),), filters=eq.filters)),
            "CSV of the B07 view": lambda i: sum(len(b) for b in reader.csv(base, cols, eq)),
        }
        results = {name: timed(fn, runs) for name, fn in cases.items()}
        counts = reader.page(base, cols, eq, 0, 1)["rows"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nGrid pages of a {rows:,}-row x {len(cols)}-column Parquet file ({size_mb:.1f} MB), "
          f"100 rows a page, {runs} runs, DuckDB at 512 MB / 2 threads")
    print(f"{'case':<34}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
    for name, r in results.items():
        print(f"{name:<34}{r['p50']:>10}{r['p95']:>10}{r['max']:>10}")
    print(f"(the B07 view has {counts:,} rows; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("grid-tiny.json" if args.tiny else "grid.json")
    path.write_text(json.dumps({"tiny": args.tiny, "rows": rows, "columns": len(cols), "file_mb": round(size_mb, 1),
                                "runs": runs, "page_rows": 100, "b07_rows": counts, "cpus": os.cpu_count(),
                                "load_avg_1m": round(os.getloadavg()[0], 2), "cases": results}, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
