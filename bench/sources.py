"""Benchmark: a result from an analyst's database offloaded to a Parquet artifact (issue 16).

    python bench/sources.py [--tiny] [--rows N] [--small N] [--only pg,maria,sqlite]

An N x 8 result (bigint, int, numeric(12,2), double, timestamp with time zone, date, boolean,
text) is read from a real PostgreSQL 15, a real MariaDB (both started by tests/dbkit.py under a
temp dir, stopped by PID) and a SQLite file, three ways, each in a fresh process:

  ours    `sql_query(sql, source=...)` through the real tool registry and the real offload
          pipeline (`Runtime.offload.process`): driver batches -> normalised types -> ParquetSink;
  arrow   the driver's whole result as one Arrow table, then `pq.write_table` (zstd):
          PostgreSQL `fetch_arrow_table` (ADBC); MariaDB and SQLite the same driver's rows
          (asyncmy / sqlite3) fetched whole and converted once;
  pandas  `pandas.read_sql` + `DataFrame.to_parquet`, the usual way (psycopg, pymysql, sqlite3).

For each: wall time, its ratio to `arrow` (goal: ours <= 1.2x on PostgreSQL) and the speed-up
over `pandas`, and peak memory growth (ru_maxrss after minus RSS after setup; each case is a
grandchild of a small trampoline so a parent's peak does not leak into it). Memory is also
measured at a second, smaller size (`--small`, default N/4): ours should not grow with N.

Prints a table and writes JSON to bench/results/sources.json (`--only pg`: sources_pg.json;
`--tiny`: sources_tiny.json, 20,000 and 5,000 rows, the CI smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
_TRAMPOLINE = "import subprocess, sys; sys.exit(subprocess.run([sys.executable] + sys.argv[1:]).returncode)"
COLS = "id, customer_id, amount, ratio, ts, day, paid, note"
GOAL_RATIO = 1.2


def _paths() -> None:
    sys.path.insert(0, str(ROOT / "platform"))
    sys.path.insert(0, str(ROOT))


# ============================================================ data (parent)

def load_pg(srv: Any, table: str, rows: int) -> None:
    from tests.dbkit import pg_superuser

    pg_superuser(srv, f"""DROP TABLE IF EXISTS {table};
CREATE TABLE {table} AS SELECT g::bigint AS id, (1 + g % 5000)::int AS customer_id,
  ((g % 100000) / 100.0)::numeric(12,2) AS amount, g / 7.0::double precision AS ratio,
  timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second' AS ts, date '2020-01-01' + (g % 1500) AS day,
  g % 3 = 0 AS paid, 'customer_' || lpad((g % 50000)::text, 5, '0') AS note FROM generate_series(1, {rows}) g;
ALTER TABLE {table} OWNER TO owner; ANALYZE {table};""")


def load_maria(srv: Any, table: str, rows: int) -> None:
    from tests.dbkit import maria_root

    maria_root(srv, f"""USE sales; DROP TABLE IF EXISTS {table};
CREATE TABLE {table} (id bigint PRIMARY KEY, customer_id int, amount decimal(12,2), ratio double,
  ts timestamp(6) NULL, day date, paid boolean, note varchar(32)) ENGINE=InnoDB;
SET SESSION time_zone = '+00:00';
INSERT INTO {table} SELECT seq, 1 + seq % 5000, (seq % 100000) / 100.0, seq / 7.0,
  TIMESTAMP '2024-01-01 00:00:00' + INTERVAL seq SECOND, DATE '2020-01-01' + INTERVAL (seq % 1500) DAY,
  seq % 3 = 0, CONCAT('customer_', LPAD(seq % 50000, 5, '0')) FROM seq_1_to_{rows};""")


def load_sqlite(path: Path, table: str, rows: int) -> None:
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript(f"""DROP TABLE IF EXISTS {table};
CREATE TABLE {table} (id INTEGER, customer_id INTEGER, amount REAL, ratio REAL, ts TEXT, day TEXT, paid INTEGER,
  note TEXT);
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
INSERT INTO {table} SELECT n, 1 + n % 5000, (n % 100000) / 100.0, n / 7.0, datetime(1704067200 + n, 'unixepoch'),
  date('2020-01-01', '+' || (n % 1500) || ' days'), n % 3 = 0, 'customer_' || substr('00000' || (n % 50000), -5)
FROM g;""")
    con.commit()
    con.close()


# ============================================================ child side

def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _ours(info: dict[str, Any], kind: str, table: str, out: Path) -> dict[str, Any]:
    import asyncio

    import msgspec

    from datadesk.composition import Runtime
    from datadesk.llm.scripted import ScriptedModel
    from datadesk.offload.pipeline import OffloadCapability
    from datadesk.settings import Settings
    from tests.sandbox_kit import ctx

    home = Path(info["home"])
    settings = msgspec.convert({"home": str(home), "sandbox": {"backend": "none"}}, Settings,
                               dec_hook=lambda t, o: Path(o))
    rt = Runtime(settings=settings, model=ScriptedModel())
    c = ctx(rt, user="bench", tid=f"t{os.getpid()}")
    source = {"pg": "pg", "maria": "maria", "sqlite": "lite"}[kind]
    args = json.dumps({"sql": f"SELECT {COLS} FROM {table}", "source": source})

    async def go():
        result = await rt.tools.run("sql_query", args, c)
        return await rt.offload.process(rt.tools.get("sql_query").spec, result, c.thread,
                                        c.origin("tool", "sql_query", args), OffloadCapability(True))
    base = _rss()
    _peak_reset()
    t0 = time.perf_counter()
    outcome = asyncio.run(go())
    wall = time.perf_counter() - t0
    art = outcome.artifact
    if art is None:
        raise SystemExit(f"no artifact: {outcome.result.content[:500]}")
    rt.sources.close()
    return {"wall_s": wall, "peak_mb": (_maxrss() - base) / 2**20, "rows": art.rows}


def _fetch_whole(info: dict[str, Any], kind: str, table: str):
    """The whole result as one Arrow table, with the driver our source uses."""
    import pyarrow as pa

    sql = f"SELECT {COLS} FROM {table}"
    if kind == "pg":
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(info["pg_uri"]) as con, con.cursor() as cur:
            cur.execute(sql)
            tbl = cur.fetch_arrow_table()
        from datadesk.sources.normalize import Normalizer
        norm = Normalizer(tbl.schema)  # numeric arrives as text: the same decimal the artifact has
        return pa.Table.from_batches([norm(b) for b in tbl.to_batches()], schema=norm.schema)
    if kind == "maria":
        import asyncio

        import asyncmy

        from datadesk.sources.engines.rowbatches import mysql_field, rows_to_batch

        async def go():
            con = await asyncmy.connect(**info["my_args"])
            async with con.cursor() as cur:
                await cur.execute(sql)
                fields = [mysql_field(f.name, f.type_code, f.flags, f.length, f.scale, f.charsetnr)[0]
                          for f in cur._result.fields]
                rows = await cur.fetchall()
            con.close()
            return pa.Table.from_batches([rows_to_batch(rows, pa.schema(fields))])
        return asyncio.run(go())
    import sqlite3

    from datadesk.sources.engines.rowbatches import sqlite_batch, sqlite_schema

    con = sqlite3.connect(info["sqlite"])
    cur = con.execute(sql)
    rows = cur.fetchall()
    schema, _ = sqlite_schema([d[0] for d in cur.description], rows[:65_536])
    return pa.Table.from_batches([sqlite_batch(rows, schema)])


def _arrow(info: dict[str, Any], kind: str, table: str, out: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    base = _rss()
    _peak_reset()
    t0 = time.perf_counter()
    tbl = _fetch_whole(info, kind, table)
    pq.write_table(tbl, out, compression="zstd")
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "peak_mb": (_maxrss() - base) / 2**20, "rows": tbl.num_rows}


def _pandas(info: dict[str, Any], kind: str, table: str, out: Path) -> dict[str, Any]:
    import warnings

    import pandas as pd

    warnings.simplefilter("ignore")  # pandas asks for SQLAlchemy with a plain DB-API connection
    sql = f"SELECT {COLS} FROM {table}"
    if kind == "pg":
        import psycopg
        con = psycopg.connect(info["pg_uri"])
    elif kind == "maria":
        import pymysql
        a = info["my_args"]
        con = pymysql.connect(host=a["host"], port=a["port"], user=a["user"], password=a["password"], database=a["db"])
    else:
        import sqlite3
        con = sqlite3.connect(info["sqlite"])
    base = _rss()
    _peak_reset()
    t0 = time.perf_counter()
    df = pd.read_sql(sql, con)
    df.to_parquet(out)
    wall = time.perf_counter() - t0
    con.close()
    return {"wall_s": wall, "peak_mb": (_maxrss() - base) / 2**20, "rows": len(df)}


def child(args: argparse.Namespace) -> None:
    _paths()
    info = json.loads(Path(args.info).read_text())
    # the secrets reach the child through its environment, as the app reads them
    fn = {"ours": _ours, "arrow": _arrow, "pandas": _pandas}[args.method]
    out = Path(tempfile.mkdtemp(prefix="bench-src-")) / "out.parquet"
    try:
        res = fn(info, args.kind, args.table, out)
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    print("RESULT " + json.dumps(res))


# ============================================================ parent side

def run_case(info_path: Path, kind: str, method: str, table: str) -> dict[str, Any]:
    cmd = [sys.executable, "-c", _TRAMPOLINE, str(Path(__file__).resolve()), "--child", "--info", str(info_path),
           "--kind", kind, "--method", method, "--table", table]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{kind}/{method} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def _setup(work: Path, kinds: list[str], sizes: dict[str, int]) -> tuple[dict[str, Any], list[Any]]:
    from tests.dbkit import start_mariadb, start_postgres

    servers, info = [], {"home": str(work / "home"), "sqlite": str(work / "home/workspaces/demo/data/bench.sqlite")}
    wdir = Path(info["home"]) / "workspaces" / "demo"
    (wdir / "data").mkdir(parents=True)
    toml = ['name = "bench"\n']
    if "pg" in kinds:
        pg = start_postgres(work / "pg")
        servers.append(pg)
        for table, rows in sizes.items():
            load_pg(pg, table, rows)
        os.environ["BENCH_PG_PASSWORD"] = pg.password
        info["pg_uri"] = pg.url(with_password=True)
        toml.append(f'[sources.pg]\nurl = "{pg.url()}"\npassword = "${{env:BENCH_PG_PASSWORD}}"\ntimeout_s = 600\n')
    if "maria" in kinds:
        my = start_mariadb(work / "my")
        servers.append(my)
        for table, rows in sizes.items():
            load_maria(my, table, rows)
        os.environ["BENCH_MY_PASSWORD"] = my.password
        info["my_args"] = {"host": "127.0.0.1", "port": my.port, "user": my.user, "password": my.password, "db": "sales"}
        toml.append(f'[sources.maria]\nurl = "{my.url()}"\npassword = "${{env:BENCH_MY_PASSWORD}}"\ntimeout_s = 600\n')
    if "sqlite" in kinds:
        for table, rows in sizes.items():
            load_sqlite(Path(info["sqlite"]), table, rows)
        toml.append('[sources.lite]\nurl = "sqlite:///data/bench.sqlite"\ntimeout_s = 600\n')
    (wdir / "workspace.toml").write_text("\n".join(toml))
    return info, servers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=0, help="the second size for memory (default rows/4)")
    ap.add_argument("--only", default="pg,maria,sqlite")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--info"), ap.add_argument("--kind"), ap.add_argument("--method"), ap.add_argument("--table")
    args = ap.parse_args()
    if args.child:
        return child(args)
    _paths()
    rows = 20_000 if args.tiny else args.rows
    small = 5_000 if args.tiny else (args.small or rows // 4)
    kinds = [k for k in args.only.split(",") if k]
    sizes = {"big": rows, "small": small}
    work = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    work.chmod(0o755)
    results: dict[str, Any] = {"rows": rows, "small_rows": small, "columns": 8, "cases": {}}
    servers: list[Any] = []
    try:
        info, servers = _setup(work, kinds, sizes)
        info_path = work / "info.json"
        info_path.write_text(json.dumps(info))
        info_path.chmod(0o600)
        for kind in kinds:
            case = {m: run_case(info_path, kind, m, "big") for m in ("arrow", "ours", "pandas")}
            case["ours_small"] = run_case(info_path, kind, "ours", "small")
            case["arrow_small"] = run_case(info_path, kind, "arrow", "small")
            case["ratio_vs_arrow"] = case["ours"]["wall_s"] / case["arrow"]["wall_s"]
            case["speedup_vs_pandas"] = case["pandas"]["wall_s"] / case["ours"]["wall_s"]
            results["cases"][kind] = case
    finally:
        for srv in servers:
            srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "sources" + ("" if set(kinds) == {"pg", "maria", "sqlite"} else "_" + "_".join(kinds))
    out = RESULTS / (name + ("_tiny" if args.tiny else "") + ".json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


def print_table(results: dict[str, Any]) -> None:
    n, s = results["rows"], results["small_rows"]
    print(f"\n{n:,} x 8 from each database (memory also at {s:,} rows)\n")
    head = (f"{'source':<8} {'ours s':>8} {'arrow s':>8} {'ratio':>6} {'pandas s':>9} {'speed-up':>9} "
            f"{'ours MB':>8} {'@small':>7} {'arrow MB':>9} {'@small':>7} {'pandas MB':>10}")
    print(head)
    print("-" * len(head))
    for kind, c in results["cases"].items():
        print(f"{kind:<8} {c['ours']['wall_s']:>8.2f} {c['arrow']['wall_s']:>8.2f} {c['ratio_vs_arrow']:>5.2f}x "
              f"{c['pandas']['wall_s']:>9.2f} {c['speedup_vs_pandas']:>8.1f}x {c['ours']['peak_mb']:>8.0f} "
              f"{c['ours_small']['peak_mb']:>7.0f} {c['arrow']['peak_mb']:>9.0f} {c['arrow_small']['peak_mb']:>7.0f} "
              f"{c['pandas']['peak_mb']:>10.0f}")
    pg = results["cases"].get("pg")
    if pg:
        verdict = "meets" if pg["ratio_vs_arrow"] <= GOAL_RATIO else "misses"
        print(f"\nPostgreSQL: ours / (fetch_arrow_table + write_table) = {pg['ratio_vs_arrow']:.2f}x "
              f"({verdict} the {GOAL_RATIO}x goal)")


if __name__ == "__main__":
    main()
