"""Benchmark cases of bench/offload.py for every tabular shape of issue 17 (run in its child process).

Each shape's text comes from `tests/fixtures/shapes.py` (the same deterministic rows in every
shape: id, amount, price, name, day, ts, paid); the text is what an MCP tool returns, and it
goes through the real tool registry and the real offload pipeline (`Runtime.offload.process`),
so the time covers detection, parsing, typing and the Parquet write. In the same process, after
the offload: `pq.write_table` of the very table that was written (read back from the artifact,
zstd as the sink writes), median of 3, which gives the shape's ratio. The artifact is checked
against `shapes.expected(n)`: row count, sum of id, sum of amount, paid count.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

SHAPE_TOOL = "mcp__shape_rows"
REPR_GOAL_ROWS_S = 200_000  # issue 17: >= 10x the 15-20k rows/s the Python-repr path parsed before
REPR_SHAPE = "repr_tuples"  # the repr the old parser knew (str(cursor.fetchall()))
REPR_SHAPES = ("repr_tuples", "repr_dicts", "repr_dict_lists")  # the goal holds for the slowest


def shape_names() -> list[str]:
    import sys

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.fixtures.shapes import SHAPES

    return list(SHAPES)


def _column(table, name: str, index: int, positional: str | None):
    names = table.column_names
    if name in names:
        return table.column(name)
    if positional is not None and f"{positional}{index + 1}" in names:
        return table.column(f"{positional}{index + 1}")
    return None


def _check(table, n: int, positional: str | None, expected: dict[str, Any]) -> dict[str, Any]:
    """Row count and column sums of the written table against what the shape holds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: dict[str, Any] = {"rows_ok": table.num_rows == n}
    wanted = (("id", 0, "sum_id", pc.sum), ("amount", 1, "sum_amount", pc.sum),
              ("paid", 6, "paid", lambda c: pc.sum(pc.cast(c, pa.int64()))))
    for name, index, key, fn in wanted:
        col = _column(table, name, index, positional)
        try:
            got = fn(col).as_py() if col is not None else None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            got = None
        out[f"{name}_ok"] = got == expected[key]
        if got != expected[key]:
            out[f"{name}_got"] = repr(got)[:80]
    out["ok"] = all(v for k, v in out.items() if k.endswith("_ok"))
    return out


async def _offload_text(rt, ctx, text: str):
    from datadesk.offload.pipeline import OffloadCapability

    t0 = time.perf_counter()
    result = await rt.tools.run(SHAPE_TOOL, "{}", ctx)
    outcome = await rt.offload.process(rt.tools.get(SHAPE_TOOL).spec, result, ctx.thread,
                                       ctx.origin("tool", SHAPE_TOOL, "{}"), OffloadCapability(True))
    return outcome, time.perf_counter() - t0


def case_shape(runtime, memory: Callable[[], Any], name: str, rows: int) -> dict[str, Any]:
    """One shape of `rows` rows through the pipeline; `runtime` is (Runtime, ToolContext),
    `memory()` starts the peak-memory measurement (bench/offload.py's _Memory)."""
    import asyncio

    import pyarrow.parquet as pq

    from tests.fixtures.shapes import POSITIONAL, SHAPES, expected
    from datadesk.tools.registry import ToolResult, ToolSpec

    rt, ctx = runtime
    t0 = time.perf_counter()
    text = SHAPES[name](rows)
    generate_s = time.perf_counter() - t0

    async def export(args, _ctx):
        return ToolResult(text)

    rt.tools.register(ToolSpec(name=SHAPE_TOOL, description="Rows in one shape (MCP stand-in).",
                               parameters={"type": "object", "properties": {}}, read_only=True,
                               offloadable=True, source="mcp"), export)
    mem = memory()
    outcome, wall = asyncio.run(_offload_text(rt, ctx, text))
    memory_report = mem.report()
    res: dict[str, Any] = {"shape": name, "rows": rows, "text_mb": round(len(text.encode()) / 1e6, 1),
                           "generate_s": round(generate_s, 2), "wall_s": round(wall, 4),
                           "rows_per_s": round(rows / wall) if wall else None, "memory": memory_report}
    art = outcome.artifact
    if art is None:
        res.update(ok=False, error=outcome.result.content[:300])
        return res
    path = ctx.thread.artifacts_dir / art.file
    table = pq.read_table(path)
    res.update(_check(table, rows, POSITIONAL.get(name), expected(rows)))
    res.update(artifact_rows=art.rows, status=art.status, file_mb=round(art.bytes / 1e6, 1),
               schema=[f"{c.name} {c.type}" for c in art.schema][:12])
    times = []
    out = Path(ctx.thread.artifacts_dir) / "baseline.parquet"
    for _ in range(3):
        t0 = time.perf_counter()
        pq.write_table(table, out, compression="zstd")
        times.append(time.perf_counter() - t0)
    out.unlink()
    res["write_table_s"] = round(statistics.median(times), 4)
    res["ratio_vs_write_table"] = round(wall / res["write_table_s"], 2)
    return res


def print_shapes(shapes: list[dict[str, Any]]) -> None:
    if not shapes:
        return
    print("\nEvery shape of issue 17 as MCP text through the pipeline (fresh process each); "
          "x write_table = wall / pq.write_table of the same table (zstd), in the same process")
    hdr = (f"{'shape':<22}{'rows':>10}{'text MB':>9}{'wall s':>9}{'rows/s':>11}{'x wt':>8}{'peak MB':>9}"
           f"{'file MB':>9}  check")
    print(hdr)
    print("-" * len(hdr))
    for s in shapes:
        if s.get("error"):
            print(f"{s['shape']:<22}{s['rows']:>10,}{s['text_mb']:>9.1f}{s['wall_s']:>9.3f}   not a table: "
                  f"{s['error'][:60]!r}")
            continue
        bad = [k[:-4] for k, v in s.items() if k.endswith("_ok") and not v]
        check = "rows and sums OK" if s["ok"] else "WRONG: " + ", ".join(bad)
        print(f"{s['shape']:<22}{s['rows']:>10,}{s['text_mb']:>9.1f}{s['wall_s']:>9.3f}{s['rows_per_s']:>11,}"
              f"{s['ratio_vs_write_table']:>8.2f}{s['memory']['peak_growth_mb']:>9.1f}{s['file_mb']:>9.1f}  {check}")


def shape_summary(shapes: list[dict[str, Any]]) -> dict[str, Any]:
    """The repr goal (rows/s of the slowest Python-repr shape: tuples, dicts, dict of lists)
    and how many shapes came out right."""
    reprs = [s for s in shapes if s["shape"] in REPR_SHAPES and not s.get("error")]
    slowest = min(reprs, key=lambda s: s.get("rows_per_s") or 0, default=None)
    rate = slowest.get("rows_per_s") if slowest else None
    return {"repr_shape": slowest["shape"] if slowest else REPR_SHAPE, "repr_rows_per_s": rate,
            "repr_goal_rows_per_s": REPR_GOAL_ROWS_S,
            "repr_ok": bool(rate and rate >= REPR_GOAL_ROWS_S and all(s.get("ok") for s in reprs)),
            "shapes_ok": sum(1 for s in shapes if s.get("ok")), "shapes": len(shapes)}

