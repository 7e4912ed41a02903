"""Benchmark: parsing every tabular shape of issue 17 (`offload.readers.parse_text`).

    python bench/shapes.py [--tiny] [--rows N] [--shapes a,b,...]

For each shape of tests/fixtures/shapes.py, N rows (1,000,000 by default) as the text a tool
returns: the time to parse it into typed record batches (all of them), rows/s, and the
ratio to `pyarrow.parquet.write_table` of the resulting table alone (zstd, as the sink
writes), measured in the same process right after. For the Python-repr shapes also the
exact `ast` path (`pyrepr.exact_batches`, the path all reprs took before issue 17) on
the same text, capped at 200,000 rows (it is quadratic-ish past that), and the speed-up.
The whole offload (read and write overlapped in the pipeline) is bench/offload.py's.

Prints a table and writes JSON to bench/results/shapes.json. `--tiny` (2,000 rows) is the
CI smoke run.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "platform"))

EXACT_MAX_ROWS = 200_000
REPR_SHAPES = ("repr_tuples", "repr_dicts", "repr_dict_lists")


def measure(shape: str, rows: int, tmp: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.fixtures.shapes import SHAPES
    from datadesk.offload.readers.pyrepr.exact import exact_batches
    from datadesk.offload.readers import parse_text

    text = SHAPES[shape](rows)
    gc.collect()
    t0 = time.perf_counter()
    stream = parse_text(text)
    if stream is None:
        raise SystemExit(f"{shape}: not recognised as a table")
    batches = list(stream)
    parse_s = time.perf_counter() - t0
    table = pa.Table.from_batches(batches)
    if table.num_rows != rows:
        raise SystemExit(f"{shape}: {table.num_rows} rows, not {rows}")
    t0 = time.perf_counter()
    pq.write_table(table, tmp / "w.parquet", compression="zstd")
    write_s = time.perf_counter() - t0
    out = {"shape": shape, "rows": rows, "text_mb": round(len(text.encode()) / 1e6, 1),
           "sent_as": stream.facts.shape, "parse_s": round(parse_s, 3), "rows_per_s": round(rows / parse_s),
           "write_table_s": round(write_s, 3), "parse_vs_write_table": round(parse_s / write_s, 2),
           "types": [str(t) for t in table.schema.types]}
    if shape in REPR_SHAPES:
        n = min(rows, EXACT_MAX_ROWS)
        small = SHAPES[shape](n)
        t0 = time.perf_counter()
        got = sum(b.num_rows for b in exact_batches(small))
        exact_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        sum(b.num_rows for b in parse_text(small))
        fast_s = time.perf_counter() - t0
        out.update(exact_rows=got, exact_rows_per_s=round(got / exact_s), fast_rows_per_s_same_text=round(n / fast_s),
                   speedup_vs_exact=round(exact_s / fast_s, 1))
    return out


def main() -> int:
    import tempfile

    from tests.fixtures.shapes import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    rows = 2_000 if args.tiny else args.rows
    results = []
    with tempfile.TemporaryDirectory() as d:
        for shape in args.shapes.split(","):
            res = measure(shape, rows, Path(d))
            results.append(res)
            extra = (f"  exact ast path {res['exact_rows_per_s']:>9,} rows/s -> {res['speedup_vs_exact']:>5}x"
                     if "exact_rows_per_s" in res else "")
            print(f"{shape:22} {res['text_mb']:>7} MB  parse {res['parse_s']:>7.3f} s  {res['rows_per_s']:>10,} rows/s"
                  f"  write_table {res['write_table_s']:>6.3f} s  ratio {res['parse_vs_write_table']:>6.2f}x{extra}",
                  flush=True)
    out = ROOT / "bench" / "results" / ("shapes-tiny.json" if args.tiny else "shapes.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
