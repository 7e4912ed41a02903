"""Offloading a 5,000,000-row query streams: the app's peak memory stays far below the data's size.

The real `sql_query` tool and the real offload pipeline (`Runtime.offload.process`)
write a 5M-row x 5-column DuckDB result (BIGINT, DOUBLE, VARCHAR, TIMESTAMP,
INTEGER) to a Parquet artifact in a fresh process. That process reports its
peak RSS growth over the RSS it had after setup (imports, runtime, tokenizer),
the rows in the Parquet file and the size the data takes in Arrow memory.

Measured on a 2-vCPU dev box (Linux, Python 3.11, pyarrow 26, DuckDB 2.0.1):
the data is 601 MB in Arrow (165 MB Parquet uncompressed, a 95 MB zstd
file); peak RSS growth 198-209 MB over six runs, of which pyarrow's pool
peaked at 9 MB: the rest is DuckDB (opening the file, scan state, buffers)
and the allocator. The offload takes 2-2.5 s, the whole test ~8 s. A
pipeline that collected the result before writing it (checked by patching
TabularStream to list() its batches) peaks at 723 MB growth and fails.
BOUND_MB = 300 leaves ~45% headroom and is half the data's size.

DuckDB runs one thread per core by default, each with its own scan state:
with 1/2/4/8/16 threads the same offload grew 174/203/256/295/355 MB. The
probe pins the warehouse connection to DUCKDB_THREADS = 2 so the bound
holds on any machine.

Why a trampoline: Linux carries a parent's peak RSS into a child's
`ru_maxrss` across fork+exec, so the measured process is started by a tiny
interpreter rather than by pytest (whose own RSS would show up as the
child's peak). Where the kernel allows it, the probe also resets its RSS
high-water mark after setup (/proc/self/clear_refs), so the peak is the
offload's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = 5_000_000
BOUND_MB = 300
DUCKDB_THREADS = 2

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for RSS (Linux only)")

# Runs argv[1:] as a child of a small interpreter (see the module docstring).
TRAMPOLINE = "import subprocess, sys; sys.exit(subprocess.run([sys.executable] + sys.argv[1:]).returncode)"

PROBE = r'''
import asyncio, json, os, resource, sys, time
from pathlib import Path

mode, home, rows = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
WS = "big"

if mode == "build":
    import duckdb
    data = home / "workspaces" / WS / "data"
    data.mkdir(parents=True)
    (home / "workspaces" / WS / "workspace.toml").write_text('name = "Big"\nwarehouse = "data/warehouse.duckdb"\n')
    con = duckdb.connect(str(data / "warehouse.duckdb"))
    con.execute(f"""
        CREATE TABLE orders AS SELECT
            i::BIGINT                                            AS id,
            (i % 100000) / 100.0 + i * 1e-7                      AS amount,
            'Standing order ' || (i % 500)::VARCHAR
                || ': deliver to the loading dock before noon, invoice to accounts payable' AS note,
            TIMESTAMP '2024-01-01 00:00:00' + to_seconds(i * 3)  AS created_at,
            (i % 1000)::INTEGER                                  AS qty
        FROM range({rows}) t(i)""")
    con.close()
    sys.exit(0)


def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


import pyarrow as pa
import pyarrow.parquet as pq

from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel
from datadesk.llm.tokens import count_tokens
from datadesk.offload.pipeline import OffloadCapability
from datadesk.settings import Settings
from datadesk.sources import warehouse
from datadesk.store.threads import Thread
from datadesk.tools.registry import ToolContext
from tests.fakes.sandbox import FakeSandbox

# DuckDB runs one thread per core by default and each holds scan state
# (~10-15 MB here): pin the count so the bound means the same on any machine.
assert isinstance(getattr(warehouse, "_CONNECT_CONFIG", None), dict), "warehouse._CONNECT_CONFIG moved: update the probe"
warehouse._CONNECT_CONFIG["threads"] = int(sys.argv[4])

rt = Runtime(settings=Settings(home=home), model=ScriptedModel([]))
FakeSandbox(rt)
tdir = home / f"thread-{os.getpid()}"
tdir.mkdir()
ctx = ToolContext(thread=Thread(tdir), workspace=WS, user="alice", permissions=frozenset({"code_execution"}),
                  call_id="c1")
count_tokens("load the encoder")  # part of the app, loaded once
arguments = json.dumps({"sql": "SELECT * FROM orders"})

setup_rss = rss()
try:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the RSS high-water mark: the peak below is the offload's
    reset = True
except OSError:
    reset = False


async def offload():
    result = await rt.tools.run("sql_query", arguments, ctx)
    return await rt.offload.process(rt.tools.get("sql_query").spec, result, ctx.thread,
                                    ctx.origin("tool", "sql_query", arguments), OffloadCapability(True))

t0 = time.perf_counter()
outcome = asyncio.run(offload())
seconds = time.perf_counter() - t0
peak = maxrss()
pool_peak = pa.default_memory_pool().max_memory()
art = outcome.artifact
if art is None:
    print("RESULT " + json.dumps({"error": outcome.result.content[:2000]}))
    sys.exit(0)
pf = pq.ParquetFile(tdir / "artifacts" / art.file)
meta = pf.metadata
# The data's in-memory Arrow size: read back one row group at a time.
arrow_bytes = sum(pf.read_row_group(i).nbytes for i in range(meta.num_row_groups))
print("RESULT " + json.dumps({
    "rows": meta.num_rows, "artifact_rows": art.rows, "status": art.status,
    "arrow_bytes": arrow_bytes,
    "parquet_uncompressed_bytes": sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)),
    "file_bytes": art.bytes, "setup_rss": setup_rss, "peak_rss": peak, "growth": peak - setup_rss,
    "pool_peak": pool_peak, "peak_reset": reset, "seconds": seconds,
    "tokens": count_tokens(outcome.result.content), "duckdb_threads": warehouse._CONNECT_CONFIG["threads"],
}))
'''


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)])}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_offloading_5m_rows_keeps_peak_memory_far_below_the_data(tmp_path: Path) -> None:
    probe = tmp_path / "offload_probe.py"
    probe.write_text(PROBE)
    home = tmp_path / "var"
    built = _run([sys.executable, str(probe), "build", str(home), str(ROWS)], tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]

    proc = _run([sys.executable, "-c", TRAMPOLINE, str(probe), "measure", str(home), str(ROWS),
                 str(DUCKDB_THREADS)], tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-3000:])
    res = json.loads(lines[-1][len("RESULT "):])
    assert "error" not in res, res["error"]

    mb = 1_000_000
    report = (f"rows {res['rows']:,}, Arrow {res['arrow_bytes'] / mb:.0f} MB, peak growth "
              f"{res['growth'] / mb:.0f} MB (bound {BOUND_MB} MB), pyarrow pool peak {res['pool_peak'] / mb:.0f} MB, "
              f"offload {res['seconds']:.1f} s, high-water reset {res['peak_reset']}")
    print(report)
    assert res["rows"] == res["artifact_rows"] == ROWS and res["status"] == "ready", report
    assert res["tokens"] < 2_000, report
    # The bound must mean something: the data itself is well above it.
    assert res["arrow_bytes"] > 1.5 * BOUND_MB * mb, report
    assert res["growth"] < BOUND_MB * mb, report
