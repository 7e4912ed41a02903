"""The cost of sniffing a delimited file's dialect (issue 26): `sniff_dialect` over a 64 KiB
sample of each dialect, and `plan_file` (dialect, header line, totals line) on a whole file.
Prints a table, writes bench/results/csv_sniff.json. Goal: a sniff well under 50 ms (clevercsv
took 0.46-0.64 s on such a sample, DuckDB's `sniff_csv` 28-75 ms).

    python bench/csv_sniff.py [--tiny] [--rows N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

from datadesk.offload.readers.csv.dialect import sniff_dialect  # noqa: E402
from datadesk.offload.readers.csv.plan import plan_file  # noqa: E402

GOAL_S = 0.05
SAMPLE = 64 * 1024


def _text(dialect: str, rows: int) -> str:
    if dialect == "eu":
        body = "".join(f"r{i % 7};{i:,}.{i % 100:02d};{i};\"n; {i}\"\n".replace(",", ".", 1) for i in range(rows))
        return "Sales report 2024\n\nregion;amount;qty;note\n" + body + "Total;1,0;0;\n"
    delim = {"comma": ",", "tab": "\t", "pipe": "|"}[dialect]
    body = "".join(delim.join([f"r{i % 7}", f"{i * 0.25}", str(i), f"n {i}"]) + "\n" for i in range(rows))
    return delim.join(["region", "amount", "qty", "note"]) + "\n" + body


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="20,000-row files, 5 repeats (CI smoke run)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the whole file plan_file reads")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "csv_sniff.json")
    a = ap.parse_args()
    rows, repeat = (20_000, 5) if a.tiny else (a.rows, 20)
    out = {"tiny": a.tiny, "rows": rows, "goal_s": GOAL_S, "dialects": {}}
    print(f"{'dialect':<8}{'sniff 64 KiB ms':>17}{'plan_file ms':>14}{'file MB':>9}  delimiter")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("comma", "eu", "tab", "pipe"):
            text = _text(name, rows)
            sample = text[:SAMPLE]
            found = sniff_dialect(sample, False)
            sniff_s = _median(lambda: sniff_dialect(sample, False), repeat)
            path = Path(tmp) / f"{name}.csv"
            path.write_text(text)
            plan_s = _median(lambda: plan_file(path), repeat)
            mb = path.stat().st_size / 1e6
            out["dialects"][name] = {"sniff_s": round(sniff_s, 5), "plan_file_s": round(plan_s, 5),
                                     "file_mb": round(mb, 1), "delimiter": found.delimiter if found else None}
            print(f"{name:<8}{sniff_s * 1e3:>17.2f}{plan_s * 1e3:>14.2f}{mb:>9.1f}  {found.delimiter if found else None!r}")
    worst = max(d["sniff_s"] for d in out["dialects"].values())
    out["ok"] = worst < GOAL_S and all(d["delimiter"] for d in out["dialects"].values())
    print(f"\nslowest sniff {worst * 1e3:.2f} ms < {GOAL_S * 1e3:.0f} ms: {'OK' if out['ok'] else 'MISSED'}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
