"""The printed tables of bench/offload.py (parent side): cases, goals, breakdown, inline cost."""

from __future__ import annotations

import os
from typing import Any

from offload_shapes import REPR_GOAL_ROWS_S

GOAL_RATIO = 1.15  # issue 17: the DuckDB path at most 1.15x pq.write_table of the same table
GOAL_RATIO_ROWS = 1_000_000  # the ratio goals are about large results
GOAL_MCP_RATIO = 3.0  # ... and MCP JSON text at most 3x
GOAL_TOKENS = 2_000


def _fmt_int(n: float | int) -> str:
    return f"{round(n):,}"


def cpu_snapshot() -> tuple[float, float, float]:
    """(machine busy CPU s, this process's children's CPU s, wall s) now."""
    import resource
    import time

    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    busy = (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, ru.ru_utime + ru.ru_stime, time.monotonic()


def others_share(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """Share of the machine's CPUs that other processes used between two snapshots: read and
    write overlap only where a second CPU is free."""
    wall = (b[2] - a[2]) * (os.cpu_count() or 1)
    return round(max(0.0, (b[0] - a[0]) - (b[1] - a[1])) / wall, 2) if wall > 0 else 0.0


def print_cases(rows: int, repeat: int, mcp_repeat: int, prep: dict, base: dict, cases: list[dict],
                load: dict[str, list[float]]) -> None:
    zstd_s, default_s = base["zstd"]["s"], base["default"]["s"]
    print(f"\nOffload of a {rows:,}-row x {len(prep['types'])}-column result "
          f"({base['arrow_mb']} MB in Arrow); median of {repeat} fresh process(es) ({mcp_repeat} for MCP); "
          f"{os.cpu_count()} CPUs, DuckDB threads {prep['duckdb_threads']}; load average (1/5/15 min) "
          f"{load['before']} before, {load['after']} after; other processes used "
          f"{load['others_cpu_share_in_duckdb_rounds']:.0%} of the CPUs during the DuckDB rounds")
    print(f"baseline pq.write_table of the same Arrow table (median of {len(base['zstd']['rounds_s'])} rounds "
          f"between the DuckDB runs): {base['sink_compression']} {zstd_s:.3f} s ({base['zstd']['file_mb']} MB), "
          f"default settings {default_s:.3f} s ({base['default']['file_mb']} MB), "
          f"{base['sink_compression']} + 65,536-row groups {base['zstd_rg65536']['s']:.3f} s")
    hdr = (f"{'case':<22}{'wall s':>8}{'tool s':>8}{'x zstd':>8}{'x dflt':>8}{'peak MB':>9}{'arrow MB':>10}"
           f"{'file MB':>9}{'tokens':>8}{'inline tokens':>15}")
    print(hdr)
    print("-" * len(hdr))
    for c in cases:
        print(f"{c['label']:<22}{c['wall_s']:>8.3f}{c['tool_s']:>8.3f}{c['ratio_vs_write_table_zstd']:>8.2f}"
              f"{c['ratio_vs_write_table_default']:>8.2f}{c['memory']['peak_growth_mb']:>9.1f}"
              f"{c['memory']['arrow_pool_max_mb']:>10.1f}{c['file_mb']:>9.1f}{c['tokens']:>8}"
              f"{_fmt_int(c['inline_tokens_estimate']):>15}")
    print(f"{'write_table (zstd)':<22}{zstd_s:>8.3f}{'':>8}{1.0:>8.2f}{zstd_s / default_s:>8.2f}"
          f"{base['memory']['peak_growth_mb']:>9.1f}{base['memory']['arrow_pool_max_mb']:>10.1f}"
          f"{base['zstd']['file_mb']:>9.1f}")
    print("  peak MB = ru_maxrss - RSS after setup (fresh process); arrow MB = pyarrow pool max_memory"
          f"{'' if cases[0]['memory']['peak_reset'] else '; RSS high-water mark could not be reset'}")
    print(f"  DuckDB runs: {cases[0]['all_wall_s']} s; write_table rounds: {base['zstd']['rounds_s']} s; "
          f"CPU s (all threads) of the median run: DuckDB {cases[0]['cpu_s']}, MCP {cases[1]['cpu_s']}")


def print_goals(goals: dict[str, Any], cases: list[dict], shapes: dict[str, Any]) -> None:
    d, m = cases
    ok = lambda v: "OK" if v else "MISSED"  # noqa: E731
    note = "" if goals["ratio_goal_applies"] else " (the goals are for 1,000,000+ rows; at this size fixed costs dominate)"
    rate = shapes["repr_rows_per_s"]
    print(f"\nGoals{note}:")
    print(f"  DuckDB path {d['ratio_vs_write_table_zstd']:.2f}x write_table <= {GOAL_RATIO}: {ok(goals['ratio_ok'])}"
          f" (best run / best baseline round: {d['ratio_best_vs_write_table_zstd']:.2f}x)")
    print(f"  MCP JSON text {m['ratio_vs_write_table_zstd']:.2f}x write_table <= {GOAL_MCP_RATIO}: {ok(goals['mcp_ok'])}"
          f" (best / best: {m['ratio_best_vs_write_table_zstd']:.2f}x)")
    print(f"  Python repr ({shapes['repr_shape']}) {_fmt_int(rate) if rate else 'n/a'} rows/s (parse + write) "
          f">= {REPR_GOAL_ROWS_S:,}: {ok(goals['repr_ok'])}")
    print(f"  tokens {d['tokens']} / {m['tokens']} <= {GOAL_TOKENS:,}: {ok(goals['tokens_ok'])}; "
          f"shapes with exact rows and sums: {shapes['shapes_ok']} of {shapes['shapes']}")


def print_rest(brk: dict[str, Any], tok: dict[str, Any], table: str) -> None:
    print(f"\nWhere the DuckDB case's time goes (one process): DuckDB read alone {brk['duckdb_read_s']:.3f} s "
          f"({brk['batches']} batches), ParquetSink alone {brk['sink_s']:.3f} s, sha256 {brk['sha256_s']:.3f} s, "
          f"pipeline.write_table {brk['write_table_s']:.3f} s, preview {brk['preview_s']:.3f} s; "
          f"DuckDB's own COPY TO parquet {brk['duckdb_copy_s']:.3f} s ({brk['duckdb_copy_mb']} MB)")
    print("\nInline cost (sql tool's compact JSON, 20,000-row sample scaled linearly)")
    print(f"{'result':<28}{'rows':>10}{'tokens/row':>12}{'est. tokens':>14}")
    for label, t in ((f"this result ({table})", tok["wide"]), ("demo readings", tok["readings"]),
                     ("MCP JSON text as is", tok["mcp_text"])):
        print(f"{label:<28}{t['total_rows']:>10,}{t['tokens_per_row']:>12}{_fmt_int(t['estimated_tokens']):>14}")


def goals_of(rows: int, cases: list[dict], shapes: dict[str, Any]) -> dict[str, Any]:
    d, m = cases
    applies = rows >= GOAL_RATIO_ROWS
    return {"ratio_vs_write_table_zstd_max": GOAL_RATIO, "mcp_ratio_max": GOAL_MCP_RATIO,
            "repr_rows_per_s_min": REPR_GOAL_ROWS_S, "tokens_max": GOAL_TOKENS, "ratio_goal_applies": applies,
            "ratio_ok": d["ratio_vs_write_table_zstd"] <= GOAL_RATIO,
            "mcp_ok": m["ratio_vs_write_table_zstd"] <= GOAL_MCP_RATIO, "repr_ok": shapes["repr_ok"],
            "tokens_ok": all(c["tokens"] <= GOAL_TOKENS for c in cases)}
